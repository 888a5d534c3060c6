"""deploy/topology.py: `nvidia-smi topo -m` parsing, NVLink domains, agent plans.

The matrices under topology_data/ are real layouts (see each file's header for where it
comes from); the stand-in tests run the lab's nvidia-smi stand-in and the pyinfra fact
through pyinfra's own @local connector, so a drift in either shows up here.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pyinfra.api.exceptions import FactProcessError

from deploy.facts.gpu import GpuMigModes, GpuTopology
from deploy.topology import (
    NO_DEVICES,
    OK,
    UNAVAILABLE,
    AgentSpec,
    Observed,
    TopologyError,
    agent_plan,
    domains,
    largest_trial_slots,
    nvlink_count,
    observe,
    parse_cpu_list,
    parse_mig_modes,
    parse_topo,
    summary_lines,
)

REPO = Path(__file__).resolve().parents[2]
DATA = Path(__file__).resolve().parent / "topology_data"
STANDIN = REPO / "tests" / "lab" / "standins" / "nvidia" / "nvidia_smi.py"
DRIVER = "515.65.01"

pytest_plugins = ["pytester"]


def load(name: str) -> str:
    """A data file without its leading `#` comment block: exactly what nvidia-smi printed."""
    lines = (DATA / name).read_text().splitlines(keepends=True)
    while lines and lines[0].startswith("#"):
        lines.pop(0)
    return "".join(lines)


def parsed(name: str):
    return parse_topo(load(name))


QUAD = [(0, 1, 2, 3), (4, 5, 6, 7)]

# file -> (GPU indices, NIC RDMA devices in column order, domains)
CASES = {
    "dgx_a100_nvswitch.txt": (range(8), [f"mlx5_{i}" for i in range(10)], [tuple(range(8))]),
    "hgx_h100_nv18_nic_legend.txt": (
        range(8),
        [f"mlx5_{i}" for i in range(8)] + ["mlx5_bond_0"],
        [tuple(range(8))],
    ),
    "dgx1_v100_hybrid_cube_mesh.txt": (range(8), ["mlx5_0", "mlx5_2", "mlx5_1", "mlx5_3"], QUAD),
    "dgx2_v100_nvswitch.txt": (range(16), [f"mlx5_{i}" for i in range(10)], [tuple(range(16))]),
    "h100_4x_nv6.txt": (range(4), [f"mlx5_{i}" for i in range(4)], [(0, 1, 2, 3)]),
    "article_4gpu_nv2_nv1.txt": (range(4), ["mlx5_0"], [(0, 1, 2, 3)]),
    "article_4gpu_nv2_sys.txt": (range(4), ["mlx5_0"], [(0, 1), (2, 3)]),
    "pcie_4x_t4.txt": (range(4), ["mlx5_0"], [(0, 1), (2, 3)]),
    "pcie_8x_rtx4090.txt": (range(8), ["mlx5_0", "mlx5_1"], QUAD),
    "pcie_8x_cpu_affinity_only.txt": (range(8), ["mlx4_0"], QUAD),
    "single_gpu.txt": (range(1), [], [(0,)]),
    "lab_standin_default.txt": (range(8), ["mlx5_0"], QUAD),
}


def test_every_data_file_has_a_case_and_a_source_header():
    files = {p.name for p in DATA.glob("*.txt")}
    assert files == set(CASES) | {"no_devices.txt"}
    for name in files:
        header = (DATA / name).read_text().split("\n", 1)[0]
        assert header.startswith("# "), f"{name}: needs a header comment saying its source"


@pytest.mark.parametrize("name", sorted(CASES))
def test_parse_and_domains(name):
    gpus, nics, expected = CASES[name]
    topo = parsed(name)
    assert topo.status == OK and topo.detail is None
    assert topo.gpu_indices == tuple(gpus)
    assert [n.device for n in topo.nics] == nics
    assert domains(topo) == expected


def test_dgx_a100_links_and_affinity():
    topo = parsed("dgx_a100_nvswitch.txt")
    gpu0, gpu4 = topo.gpus[0], topo.gpus[4]
    assert (gpu0.cpu_affinity, gpu0.numa_affinity, gpu0.gpu_numa_id) == ("48-63,176-191", "3", None)
    assert gpu4.numa_affinity == "7"
    assert gpu0.cpus == frozenset(range(48, 64)) | frozenset(range(176, 192))
    assert topo.link(0, 7) == "NV12" and topo.nvlinks(0, 7) == 12
    assert topo.link(3, 3) == "X" and topo.nvlinks(3, 3) == 0
    assert topo.nic_link(0, "mlx5_0") == "PXB"
    assert topo.nic_link(0, "mlx5_4") == "SYS"
    assert topo.nic_link(4, "mlx5_6") == "PXB"


def test_nic_legend_maps_columns_to_rdma_devices():
    topo = parsed("hgx_h100_nv18_nic_legend.txt")
    assert [(n.column, n.device) for n in topo.nics][-2:] == [("NIC7", "mlx5_7"), ("NIC8", "mlx5_bond_0")]
    assert topo.nic_link(4, "mlx5_4") == "PIX"
    assert topo.nic_link(0, "mlx5_bond_0") == "NODE"
    # "0<TAB><TAB>N/A": the empty cell before GPU NUMA ID must not shift the columns
    assert [(g.numa_affinity, g.gpu_numa_id) for g in topo.gpus][3:5] == [("0", None), ("1", None)]
    assert topo.gpus[4].cpu_affinity == "56-111,168-223"


def test_columns_without_nic_legend_keep_their_names():
    topo = parsed("dgx1_v100_hybrid_cube_mesh.txt")
    assert [n.column for n in topo.nics] == [n.device for n in topo.nics]
    assert topo.nic_link(2, "mlx5_1") == "PIX"


def test_dgx1_nvlink_counts_and_missing_numa_column():
    topo = parsed("dgx1_v100_hybrid_cube_mesh.txt")
    assert [topo.nvlinks(0, g) for g in range(8)] == [0, 1, 1, 2, 2, 0, 0, 0]
    assert topo.link(0, 5) == "SYS"
    for g in topo.gpus:  # every V100 has six NVLinks
        assert sum(topo.nvlinks(g.index, h) for h in range(8)) == 6
    assert {g.numa_affinity for g in topo.gpus} == {None}
    assert topo.gpus[7].cpu_affinity == "20-39,60-79"


def test_why_not_components_of_the_best_link_class():
    # The simpler rule "connected components over NV2 edges" chains DGX-1's NV2 links into
    # one ring of eight, although GPU0 has no direct link to GPU5, 6 or 7.
    topo = parsed("dgx1_v100_hybrid_cube_mesh.txt")
    best = max(topo.nvlinks(a, b) for a, b in itertools.combinations(range(8), 2))
    reach, frontier = {0}, [0]
    while frontier:
        g = frontier.pop()
        for h in range(8):
            if h not in reach and topo.nvlinks(g, h) >= best:
                reach.add(h)
                frontier.append(h)
    assert best == 2 and reach == set(range(8))
    assert domains(topo) == QUAD


def test_comma_cpu_lists_and_numa_per_gpu():
    topo = parsed("h100_4x_nv6.txt")
    assert topo.gpus[0].cpus == frozenset({6, 14, 22, 30})
    assert [g.numa_affinity for g in topo.gpus] == ["3", "1", "7", "5"]


def test_single_gpu_has_no_nics():
    topo = parsed("single_gpu.txt")
    assert topo.nics == () and topo.columns == ("GPU0",)
    assert agent_plan("ws", domains(topo), "per_domain") == [AgentSpec("ws-0", "0", 1)]


def test_no_devices():
    topo = parsed("no_devices.txt")
    assert (topo.status, topo.gpus, topo.detail) == (NO_DEVICES, (), None)
    assert domains(topo) == []


NO_DRIVER = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running."
)


@pytest.mark.parametrize(
    "text, detail",
    [
        ("", "nvidia-smi printed nothing (not installed?)"),
        (NO_DRIVER + "\n\n", NO_DRIVER),
        (
            "Failed to initialize NVML: Driver/library version mismatch\n",
            "Failed to initialize NVML: Driver/library version mismatch",
        ),
    ],
)
def test_unavailable(text, detail):
    topo = parse_topo(text)
    assert (topo.status, topo.detail, topo.gpus) == (UNAVAILABLE, detail, ())
    assert domains(topo) == []


# ------------------------------------------------------------------ tolerance of the format


def _same(a, b):
    return (a.gpus, a.nics, a.columns, a.matrix) == (b.gpus, b.nics, b.columns, b.matrix)


def test_tabs_and_spaces_read_the_same():
    text = load("hgx_h100_nv18_nic_legend.txt")
    assert "\t" in text
    assert _same(parse_topo(text.expandtabs(8)), parse_topo(text))


def test_ansi_underlined_header_crlf_and_preamble():
    text = load("dgx_a100_nvswitch.txt")
    header, rest = text.split("\n", 1)
    # nvidia-smi underlines the header on a terminal; a pty turns \n into \r\n
    noisy = (f"WARNING: infoROM is corrupted at gpu 0000:4E:00.0\n\x1b[4m{header}\x1b[0m\n{rest}").replace(
        "\n", "\r\n"
    )
    assert _same(parse_topo(noisy), parse_topo(text))


def test_legacy_soc_label_reads_as_sys():
    text = "\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tSOC\t0-11\nGPU1\tSOC\t X \t12-23\n"
    topo = parse_topo(text)
    assert topo.link(0, 1) == "SYS"
    assert domains(topo) == [(0,), (1,)]  # no NUMA column: by CPU affinity


BAD = {
    "unknown label": ("\tGPU0\tGPU1\nGPU0\t X \tNVX\nGPU1\tNVX\t X \n", "unknown link label 'NVX'"),
    "asymmetric": ("\tGPU0\tGPU1\nGPU0\t X \tNV2\nGPU1\tNV1\t X \n", "not symmetric"),
    "cut short": ("\tGPU0\tGPU1\nGPU0\t X \tNV2\n", "no matrix row for GPU1"),
    "short row": ("\tGPU0\tGPU1\nGPU0\t X \nGPU1\tNV2\t X \n", "row GPU0 has 1 link cells"),
    "second row": ("\tGPU0\nGPU0\t X \nGPU0\t X \n", "a second row for GPU0"),
    "X off diagonal": ("\tGPU0\tGPU1\nGPU0\t X \t X \nGPU1\t X \t X \n", "X off the diagonal"),
    "no X on diagonal": ("\tGPU0\tGPU1\nGPU0\tSYS\tSYS\nGPU1\tSYS\tSYS\n", "expected X"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_malformed_matrix_is_an_error(case):
    text, message = BAD[case]
    with pytest.raises(TopologyError, match=message):
        parse_topo(text)


def test_small_helpers():
    assert nvlink_count("NV18") == 18 and nvlink_count("NV1") == 1
    assert nvlink_count("PIX") == 0 and nvlink_count("X") == 0
    assert parse_cpu_list("0-2,8") == frozenset({0, 1, 2, 8})
    assert parse_cpu_list("N/A") is None


# ------------------------------------------------------------------ the grouping rule


def matrix_text(n, links, affinity=None, numa=None):
    """A tab-separated topo -m for n GPUs; links {(a, b): label}, unlisted pairs SYS."""
    titles = ["CPU Affinity", "NUMA Affinity"]
    lines = ["\t" + "\t".join([f"GPU{i}" for i in range(n)] + titles)]
    for a in range(n):
        cells = [" X " if a == b else links.get((min(a, b), max(a, b)), "SYS") for b in range(n)]
        extra = [(affinity or {}).get(a, "N/A"), (numa or {}).get(a, "N/A")]
        lines.append(f"GPU{a}\t" + "\t".join(cells + extra))
    return "\n".join(lines) + "\n"


def test_bridged_pairs_and_pcie_leftovers():
    # 0-1 joined by an NVLink bridge; 2 and 3 PCIe only, 2 on NUMA 0 and 3 on NUMA 1
    text = matrix_text(
        4, {(0, 1): "NV4", (0, 2): "PHB", (1, 2): "PHB"}, numa={0: "0", 1: "0", 2: "0", 3: "1"}
    )
    assert domains(parse_topo(text)) == [(0, 1), (2,), (3,)]
    # the leftovers share a NUMA node: one PCIe domain for them
    text = matrix_text(4, {(0, 1): "NV4", (2, 3): "PIX"}, numa={0: "0", 1: "0", 2: "1", 3: "1"})
    assert domains(parse_topo(text)) == [(0, 1), (2, 3)]


def test_four_bridged_pairs():
    text = matrix_text(
        8,
        {(0, 1): "NV4", (2, 3): "NV4", (4, 5): "NV4", (6, 7): "NV4"},
        numa={g: str(g // 4) for g in range(8)},
    )
    assert domains(parse_topo(text)) == [(0, 1), (2, 3), (4, 5), (6, 7)]


def test_stronger_link_wins_a_tie():
    # a chain 0 -NV1- 1 -NV4- 2: both pairs are cliques of two; the NV4 pair is kept
    text = matrix_text(3, {(0, 1): "NV1", (1, 2): "NV4"})
    assert domains(parse_topo(text)) == [(0,), (1, 2)]
    text = matrix_text(3, {(0, 1): "NV4", (1, 2): "NV1"})
    assert domains(parse_topo(text)) == [(0, 1), (2,)]


def test_ring_without_triangles():
    text = matrix_text(4, {(0, 1): "NV2", (1, 2): "NV2", (2, 3): "NV2", (0, 3): "NV2"})
    assert domains(parse_topo(text)) == [(0, 1), (2, 3)]


def test_pcie_grouping_falls_back_to_cpu_sets_then_one_domain():
    # NUMA N/A: group by CPU set; "0-3" and "0,1,2,3" are the same set
    text = matrix_text(4, {}, affinity={0: "0-3", 1: "0,1,2,3", 2: "4-7", 3: "4-7"})
    assert domains(parse_topo(text)) == [(0, 1), (2, 3)]
    # nothing known about locality: the node is one domain
    assert domains(parse_topo(matrix_text(4, {}))) == [(0, 1, 2, 3)]


def test_nvlink_beats_numa():
    # all-to-all NVLink across two NUMA nodes stays one domain
    text = matrix_text(
        4, {p: "NV6" for p in itertools.combinations(range(4), 2)}, numa={0: "0", 1: "0", 2: "1", 3: "1"}
    )
    assert domains(parse_topo(text)) == [(0, 1, 2, 3)]


# ------------------------------------------------------------------ plans and trial size


def test_agent_plan_per_node_and_per_domain():
    assert agent_plan("gpu1", QUAD, "per_node") == [AgentSpec("gpu1", "0,1,2,3,4,5,6,7", 8)]
    assert agent_plan("gpu1", QUAD, "per_domain") == [
        AgentSpec("gpu1-0", "0,1,2,3", 4),
        AgentSpec("gpu1-1", "4,5,6,7", 4),
    ]
    # ids follow the domains' order by first GPU, whatever order they come in
    assert [a.agent_id + ":" + a.visible_gpus for a in agent_plan("n", [(6, 7), (0, 1)], "per_domain")] == [
        "n-0:0,1",
        "n-1:6,7",
    ]


@pytest.mark.parametrize(
    "domains_, layout, message",
    [
        (QUAD, "per_gpu", "agent_layout 'per_gpu' is not one of per_node, per_domain"),
        ([], "per_node", "no GPUs"),
        ([(0, 1), ()], "per_domain", "no GPUs"),
        ([(0, 1), (1, 2)], "per_domain", "a GPU is in two domains"),
    ],
)
def test_agent_plan_errors(domains_, layout, message):
    with pytest.raises(ValueError, match=message):
        agent_plan("gpu1", domains_, layout)


def test_largest_trial_slots_is_min_of_each_nodes_largest_domain():
    by_node = {
        "a100": domains(parsed("dgx_a100_nvswitch.txt")),  # 8
        "dgx1": domains(parsed("dgx1_v100_hybrid_cube_mesh.txt")),  # 4, 4
    }
    assert largest_trial_slots(by_node) == 4
    assert largest_trial_slots({"a100": by_node["a100"]}) == 8
    assert largest_trial_slots({"n": [(0,), (1, 2)], "m": [(0, 1, 2)]}) == 2


def test_largest_trial_slots_errors():
    with pytest.raises(ValueError, match="no agent nodes"):
        largest_trial_slots({})
    with pytest.raises(ValueError, match="no GPU domains on gpu2"):
        largest_trial_slots({"gpu1": QUAD, "gpu2": []})


# ------------------------------------------------------------------ pyinfra facts


def test_fact_commands_never_fail():
    assert GpuTopology().command() == "nvidia-smi topo -m 2>/dev/null || true"
    assert GpuMigModes().command().endswith("2>/dev/null || true")


def test_fact_process_and_default():
    fact = GpuTopology()
    topo = fact.process(load("dgx1_v100_hybrid_cube_mesh.txt").splitlines())
    assert domains(topo) == QUAD
    assert fact.default().status == UNAVAILABLE
    assert fact.process(["No devices were found"]).status == NO_DEVICES
    with pytest.raises(FactProcessError, match="nvidia-smi topo -m: .*not symmetric"):
        fact.process(BAD["asymmetric"][0].splitlines())


def test_mig_modes():
    lines = ["0, Enabled", "1, Disabled", "2, [N/A]", "Failed to initialize NVML: Unknown Error"]
    assert parse_mig_modes(lines) == {0: "Enabled", 1: "Disabled", 2: "N/A"}
    assert GpuMigModes().process([]) == {}


def test_to_json():
    data = parsed("h100_4x_nv6.txt").to_json()
    assert json.loads(json.dumps(data)) == data
    assert data["domains"] == [[0, 1, 2, 3]]
    assert data["nics"]["NIC2"] == "mlx5_2"
    assert data["matrix"]["GPU0"]["NIC0"] == "PIX"


# ------------------------------------------------------------------ the lab's stand-in


@pytest.fixture
def standin(tmp_path):
    """The lab's nvidia-smi as the lab installs it (placeholders rendered), on PATH."""
    bin_dir, run_dir, etc_dir = tmp_path / "bin", tmp_path / "run", tmp_path / "etc"
    for d in (bin_dir, run_dir, etc_dir):
        d.mkdir()
    script = STANDIN.read_text().replace("@DRIVER_VERSION@", DRIVER).replace("@CUDA_VERSION@", "11.7")
    exe = bin_dir / "nvidia-smi"
    exe.write_text(script.replace("#!/usr/bin/python3", f"#!{sys.executable}", 1))
    exe.chmod(0o755)
    (run_dir / "loaded-version").write_text(DRIVER + "\n")
    env = dict(
        os.environ,
        PATH=f"{bin_dir}:{os.environ['PATH']}",
        DTLAB_STANDIN_RUN_DIR=str(run_dir),
        DTLAB_STANDIN_ETC_DIR=str(etc_dir),
        DTLAB_STANDIN_HOSTNAME="lab-gpu1",
        PYTHONPATH=str(REPO),
    )

    class Standin:
        def run(self, *args):
            return subprocess.run(
                ["nvidia-smi", *args], env=env, capture_output=True, text=True, timeout=30, check=False
            )

        def set_topology(self, topology):
            (etc_dir / "gpu-topology.json").write_text(json.dumps(topology))

        def unload_driver(self):
            (run_dir / "loaded-version").unlink()

    s = Standin()
    s.env, s.cwd = env, tmp_path
    return s


def test_standin_default_output_is_the_stored_vector(standin):
    out = standin.run("topo", "-m")
    assert out.returncode == 0
    assert out.stdout == load("lab_standin_default.txt")


def _as_standin_json(topo):
    """A parsed Topology in the stand-in's gpu-topology.json format."""
    return {
        "gpus": [
            {
                "name": "Tesla V100-SXM2-32GB",
                "cpu_affinity": g.cpu_affinity or "N/A",
                "numa_affinity": g.numa_affinity or "N/A",
            }
            for g in topo.gpus
        ],
        "nics": [n.device for n in topo.nics],
        "matrix": [list(row) for row in topo.matrix],
    }


@pytest.mark.parametrize(
    "name", ["dgx1_v100_hybrid_cube_mesh.txt", "pcie_4x_t4.txt", "dgx_a100_nvswitch.txt"]
)
def test_standin_renders_real_layouts_the_parser_reads_back(standin, name):
    topo = parsed(name)
    standin.set_topology(_as_standin_json(topo))
    back = parse_topo(standin.run("topo", "-m").stdout)
    assert back.matrix == topo.matrix
    assert [(g.index, g.cpu_affinity) for g in back.gpus] == [(g.index, g.cpu_affinity) for g in topo.gpus]
    assert domains(back) == CASES[name][2]


def test_standin_without_gpus_and_without_driver(standin):
    standin.set_topology({"gpus": []})
    out = standin.run("topo", "-m")
    assert out.returncode == 6
    assert parse_topo(out.stdout).status == NO_DEVICES
    standin.unload_driver()
    topo = parse_topo(standin.run("topo", "-m").stdout)
    assert topo.status == UNAVAILABLE and topo.detail.startswith("NVIDIA-SMI has failed")


def test_facts_through_pyinfra_local_connector(standin):
    # The real fact pipeline: pyinfra runs the command in a shell, hands process() the
    # lines, and prints the fact's to_json() as JSON.
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pyinfra",
            "@local",
            "fact",
            "deploy.facts.gpu.GpuTopology",
            "deploy.facts.gpu.GpuMigModes",
        ],
        env=standin.env,
        cwd=standin.cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr + out.stdout
    # pyinfra 3.10 prints its whole report, fact JSON included, on stderr
    blocks = (out.stdout + out.stderr).split("--> Fact data for: ")[1:]
    assert len(blocks) == 2, out.stderr
    facts = {}
    for block in blocks:
        name, _, rest = block.partition("\n")
        facts[name.strip()] = json.loads(rest[: rest.rindex("}") + 1])["@local"]
    assert facts["deploy.facts.gpu.GpuTopology"]["domains"] == [list(d) for d in QUAD]
    assert facts["deploy.facts.gpu.GpuMigModes"] == {str(i): "Disabled" for i in range(8)}


@pytest.mark.parametrize(
    "preset, expected",
    [
        ("a100-2x4", [(0, 1, 2, 3), (4, 5, 6, 7)]),
        ("a100-nvswitch-8", [(0, 1, 2, 3, 4, 5, 6, 7)]),
    ],
)
def test_lab_hardware_presets_give_their_domains(standin, preset, expected):
    from tests.lab.hardware import PRESETS

    standin.set_topology(PRESETS[preset]())
    out = standin.run("topo", "-m")
    assert out.returncode == 0, out.stderr
    assert [tuple(d) for d in domains(parse_topo(out.stdout))] == expected


# --- the NVLink lines `python -m tests.verify` prints after its matrix ------------------------

DOCS_EXAMPLE = [
    "--> NVLink domains (GPUs each): gpu1 4+4 (per_domain), gpu2 8 (per_domain), gpu3 4+4 (per_node)",
    "--> largest slots_per_trial inside one NVLink domain on every agent node: 4",
    "    not enforced on gpu3 (agent_layout per_node: one agent offers all its GPUs, a trial "
    "may span domains)",
]


def test_observe_keeps_domains_or_says_why_there_are_none():
    seen = observe("per_domain", parsed("lab_standin_default.txt"))
    assert seen == Observed("per_domain", tuple(QUAD), None)
    none = observe("per_node", parse_topo("NVIDIA-SMI has failed because it couldn't communicate"))
    assert none.domains == () and none.detail.startswith("NVIDIA-SMI has failed")


def test_summary_lines_as_in_the_docs():
    observed = {
        "gpu1": Observed("per_domain", tuple(QUAD)),
        "gpu2": Observed("per_domain", (tuple(range(8)),)),
        "gpu3": Observed("per_node", tuple(QUAD)),
    }
    assert summary_lines(observed, ["gpu1", "gpu2", "gpu3"]) == DOCS_EXAMPLE
    assert summary_lines({}, ["gpu1"]) == []


def test_summary_lines_name_the_nodes_not_read():
    observed = {
        "gpu1": Observed("per_domain", tuple(QUAD)),
        "gpu2": Observed("per_domain", (), "nvidia-smi printed nothing (not installed?)"),
    }
    assert summary_lines(observed, ["gpu1", "gpu2", "gpu3"]) == [
        "--> NVLink domains (GPUs each): gpu1 4+4 (per_domain), gpu2 none (nvidia-smi printed "
        "nothing (not installed?)) (per_domain)",
        "--> largest slots_per_trial inside one NVLink domain on the 1 agent nodes read "
        "(not read: gpu2, gpu3): 4",
    ]
    unread = {"gpu2": Observed("per_node", (), "no matrix")}
    assert summary_lines(unread, ["gpu2"])[1] == (
        "--> largest slots_per_trial inside one NVLink domain: unknown (no agent node's topology was read)"
    )


def test_nvlink_lines_from_verify_properties_in_any_order():
    """What the topology checks record (tests/verify/test_topology_agents.py report_domains)
    arrives at verify's controller in any order, from any worker, twice per node."""
    from tests.verify.matrix import nvlink_lines

    def noted(node, layout):
        return json.dumps({"node": node, "layout": layout})

    def read(node, layout, found):
        return json.dumps({"node": node, "layout": layout, "domains": found, "detail": None})

    values = [
        noted("gpu3", "per_node"),
        read("gpu3", "per_node", QUAD),
        noted("gpu1", "per_domain"),
        noted("gpu2", "per_domain"),
        read("gpu2", "per_domain", [list(range(8))]),
        read("gpu1", "per_domain", QUAD),
        noted("gpu1", "per_domain"),  # a second check whose SSH failed before reading
        read("gpu1", "per_domain", QUAD),
    ]
    for order in (values, values[::-1]):
        assert nvlink_lines(order) == DOCS_EXAMPLE
    assert nvlink_lines(values + [noted("gpu4", "per_domain")])[1].endswith("(not read: gpu4): 4")
    assert nvlink_lines([]) == []


CHECK_RECORDING_DOMAINS = """
import json
import pytest

QUAD = [[0, 1, 2, 3], [4, 5, 6, 7]]
NODES = {"gpu1": ("per_domain", QUAD), "gpu2": ("per_domain", [list(range(8))]), "gpu3": ("per_node", QUAD)}


@pytest.mark.parametrize("name", sorted(NODES))
def test_agent_configs(name, record_property):
    layout, found = NODES[name]
    record_property("verify.nvlink", json.dumps({"node": name, "layout": layout}))
    record_property(
        "verify.nvlink", json.dumps({"node": name, "layout": layout, "domains": found, "detail": None})
    )
"""


@pytest.mark.parametrize("workers", [[], ["-n", "2"]])
def test_verify_prints_the_nvlink_lines_after_its_matrix(pytester, workers):
    """The properties travel from xdist workers to the controller, which prints the lines."""
    pytester.makepyfile(test_fake=CHECK_RECORDING_DOMAINS)
    # The warning: this module imported the plugin before the inner run could rewrite it.
    result = pytester.runpytest(
        "-p",
        "tests.verify.matrix",
        "-p",
        "no:cacheprovider",
        "-W",
        "ignore::pytest.PytestAssertRewriteWarning",
        *workers,
    )
    assert result.ret == pytest.ExitCode.OK
    out = result.stdout.lines
    start = out.index(DOCS_EXAMPLE[0])
    assert out[start : start + 3] == DOCS_EXAMPLE
    assert any("verify matrix" in line for line in out[:start])
    md = (pytester.path / "reports" / "verify-matrix.md").read_text()
    assert "## NVLink domains\n\n```\n" + "\n".join(DOCS_EXAMPLE) + "\n```\n" in md
