"""The driver's pin set is its whole dependency graph, as the stand-in NVIDIA repo has it, and
apt itself resolves the pinned install only with that whole set pinned.

The stand-in repo's packages carry the relations of Ubuntu's nvidia-graphics-drivers-<branch>
packaging, which NVIDIA's repo is built from (tests/lab/standins/nvidia/build.py; docs/lab.md,
"Stand-ins"), plus newer builds of the same branch (515.86.01, 515.105.01) as NVIDIA's repo has
them. The set is derived here from the built .debs' control fields (the repo's Packages
index), never from a second list: deploy/pins.py must equal what the graph says.

The apt tests run the real apt-get (`install -s`, a simulation) in a throw-away root
(-o Dir=...) against a file:// flat repo of those .debs; nothing is installed anywhere.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from deploy.pins import (
    CONTAINER_TOOLKIT_VERSION,
    PinSet,
    container_toolkit_pins,
    driver_pins,
)
from roles.apt.pinsets import render_preferences
from tests.lab import aptrepo, debs
from tests.lab.standins.nvidia import build as nvidia

pytestmark = pytest.mark.skipif(
    any(shutil.which(t) is None for t in ("gcc", "dpkg", "apt-get")),
    reason="needs gcc (the stand-ins' libraries), dpkg and apt-get",
)

DRIVER = "515.65.01"
NEWEST_515 = "515.105.01"
# What deploy/pins.py pinned before the whole graph was: cuda-drivers-515 and seven packages.
EIGHT_PINS = (
    "cuda-drivers-515",
    "nvidia-driver-515",
    "nvidia-dkms-515",
    "libnvidia-compute-515",
    "nvidia-compute-utils-515",
    "nvidia-utils-515",
    "nvidia-kernel-source-515",
    "nvidia-modprobe",
)


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    """NVIDIA's packages from the lab's builder, as one flat repo with NVIDIA's origin."""
    pool = tmp_path_factory.mktemp("nvidia-repo")
    ctx = SimpleNamespace(cuda_pool=pool, build_deb=debs.build_deb)
    for branch, version, cuda_version in nvidia.DRIVER_RELEASES:
        nvidia.build_driver_release(ctx, branch, version, cuda_version)
    nvidia.build_container_toolkit(ctx)
    (pool / "Packages").write_text(aptrepo.packages_index(pool))
    (pool / "Release").write_text("Origin: NVIDIA\nLabel: NVIDIA CUDA\nArchitectures: amd64 all\n")
    return pool


# --- the graph --------------------------------------------------------------------------------


def index(repo: Path) -> dict[str, dict[str, dict[str, str]]]:
    """Packages -> package -> version -> control fields."""
    out: dict[str, dict[str, dict[str, str]]] = {}
    for stanza in (repo / "Packages").read_text().strip().split("\n\n"):
        fields = {}
        for line in stanza.splitlines():
            if not line.startswith(" "):
                key, _, value = line.partition(": ")
                fields[key] = value
        out.setdefault(fields["Package"], {})[fields["Version"]] = fields
    return out


_RELATION = re.compile(
    r"^(?P<name>[a-z0-9][a-z0-9+.-]+)(?::\w+)?(?: \((?P<op><<|<=|=|>=|>>) (?P<ver>\S+)\))?$"
)


def relations(field: str) -> dict[str, list[tuple[str, str]]]:
    """A Depends field -> package -> [(op, version)], the constraints ANDed per package (as in
    control.in's `P (<= V-1), P (>= V)`). No alternatives (`|`) in the driver's graph."""
    out: dict[str, list[tuple[str, str]]] = {}
    for part in filter(None, (p.strip() for p in field.split(","))):
        assert "|" not in part, part
        m = _RELATION.match(part)
        assert m, f"cannot read the relation {part!r}"
        out.setdefault(m["name"], [])
        if m["op"]:
            out[m["name"]].append((m["op"], m["ver"]))
    return out


def satisfies(version: str, op: str, wanted: str) -> bool:
    dpkg_op = {"<<": "lt", "<=": "le", "=": "eq", ">=": "ge", ">>": "gt"}[op]
    return (
        subprocess.run(["dpkg", "--compare-versions", version, dpkg_op, wanted], check=False).returncode == 0
    )


def upstream(version: str) -> str:
    return version.rsplit("-", 1)[0]


def graph(packages, root: tuple[str, str], upstream_version: str) -> set[tuple[str, str]]:
    """Everything `root` Depends on, transitively, that the repo has at `upstream_version` (the
    driver's own builds): for each relation, the one such build that satisfies it."""
    seen = {root}
    todo = [root]
    while todo:
        name, version = todo.pop()
        for dep, constraints in relations(packages[name][version].get("Depends", "")).items():
            builds = [
                v
                for v in packages.get(dep, {})
                if upstream(v) == upstream_version and all(satisfies(v, op, w) for op, w in constraints)
            ]
            if not builds:
                continue  # not one of the driver's packages (python3, ...)
            assert len(builds) == 1, f"{name} {version}: {dep} matches {builds}"
            if (dep, builds[0]) not in seen:
                seen.add((dep, builds[0]))
                todo.append((dep, builds[0]))
    return seen


@pytest.mark.parametrize("version", [v for b, v, _ in nvidia.DRIVER_RELEASES])
def test_driver_pins_are_the_whole_graph_under_cuda_drivers(repo, version):
    packages = index(repo)
    pins = driver_pins(version)
    meta = pins.packages[0]
    assert meta[0].startswith("cuda-drivers-")
    assert set(pins.packages) == graph(packages, meta, version)


def test_the_graph_has_nvidias_shapes(repo):
    # The relations that make a half-pinned set unresolvable, and the ones that do not.
    packages = index(repo)
    driver = relations(packages["nvidia-driver-515"][f"{DRIVER}-0ubuntu1"]["Depends"])
    assert driver["libnvidia-gl-515"] == [("=", f"{DRIVER}-0ubuntu1")]
    assert driver["nvidia-dkms-515"] == [("<=", f"{DRIVER}-1"), (">=", DRIVER)]
    assert "libnvidia-common-515" not in driver  # only through libnvidia-gl, unversioned
    gl = relations(packages["libnvidia-gl-515"][f"{DRIVER}-0ubuntu1"]["Depends"])
    assert gl == {"libnvidia-common-515": []}
    assert packages["libnvidia-common-515"][f"{DRIVER}-0ubuntu1"]["Architecture"] == "all"
    assert "nvidia-settings" in packages["nvidia-driver-515"][f"{DRIVER}-0ubuntu1"]["Recommends"]
    # Every package of the set also has the branch's newer builds: apt's candidates unpinned.
    for name, _ in driver_pins(DRIVER).packages[1:]:
        assert f"{NEWEST_515}-0ubuntu1" in packages[name], name
    assert f"{NEWEST_515}-1" in packages["nvidia-fabricmanager-515"]


def test_container_toolkit_pins_are_its_whole_graph(repo):
    packages = index(repo)
    pins = container_toolkit_pins()
    root = ("nvidia-container-toolkit", CONTAINER_TOOLKIT_VERSION)
    assert set(pins.packages) == graph(packages, root, upstream(CONTAINER_TOOLKIT_VERSION))


# --- apt itself -------------------------------------------------------------------------------


@pytest.fixture
def apt(repo, tmp_path):
    """apt-get in a root of its own whose one source is the stand-in repo; returns
    run(pinset, *args) -> CompletedProcess, the pin set's preferences written first."""
    root = tmp_path / "root"
    for d in (
        "etc/apt/preferences.d",
        "etc/apt/sources.list.d",
        "etc/apt/apt.conf.d",
        "var/lib/apt/lists/partial",
        "var/cache/apt/archives/partial",
        "var/lib/dpkg",
    ):
        (root / d).mkdir(parents=True)
    # A node has python3 (the stand-ins' nvidia-smi and nvidia-container-cli run on it).
    (root / "var/lib/dpkg/status").write_text(
        "Package: python3\nStatus: install ok installed\nPriority: optional\nSection: python\n"
        "Architecture: amd64\nVersion: 3.11.2-1+b1\nMaintainer: Debian Python Team\n"
        "Description: interactive high-level object-oriented language\n"
    )
    (root / "etc/apt/sources.list").write_text(f"deb [trusted=yes] file:{repo}/ /\n")
    opts = [
        f"-o=Dir={root}",
        f"-o=Dir::State::status={root}/var/lib/dpkg/status",
        "-o=Debug::NoLocking=1",
        "-o=APT::Architecture=amd64",
        "-o=APT::Sandbox::User=" + os.environ.get("USER", "root"),
    ]
    env = {**os.environ, "LC_ALL": "C"}
    subprocess.run(["apt-get", *opts, "update"], check=True, capture_output=True, env=env)

    def run(pinset: PinSet, *args: str) -> subprocess.CompletedProcess:
        pref = root / "etc/apt/preferences.d" / f"{pinset.name}.pref"
        pref.write_text(render_preferences(pinset))
        return subprocess.run(
            ["apt-get", *opts, "install", "-s", "-y", *args, *pinset.install_args()],
            capture_output=True,
            text=True,
            env=env,
            check=False,
        )

    return run


def installs(out: str) -> dict[str, str]:
    """`Inst pkg (version repo [arch])` lines of a simulation -> package -> version."""
    return dict(re.findall(r"^Inst (\S+) \((\S+) ", out, re.MULTILINE))


def test_eight_pins_leave_apt_with_held_broken_packages(apt):
    full = driver_pins(DRIVER)
    eight = PinSet(name=full.name, packages=tuple(p for p in full.packages if p[0] in EIGHT_PINS))
    assert len(eight.packages) == 8
    proc = apt(eight, "--no-install-recommends")
    assert proc.returncode == 100, proc.stdout + proc.stderr
    out = proc.stdout + proc.stderr
    assert (
        f"Depends: libnvidia-gl-515 (= {DRIVER}-0ubuntu1) but {NEWEST_515}-0ubuntu1 is to be installed" in out
    ), out
    assert "E: Unable to correct problems, you have held broken packages." in out, out


def test_the_whole_set_resolves_at_the_pin_without_recommends(apt):
    pins = driver_pins(DRIVER)
    assert not pins.recommends
    proc = apt(pins, "--no-install-recommends")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert installs(proc.stdout) == pins.as_dict()


def test_recommends_would_bring_nvidia_settings_from_outside_the_pin(apt):
    # Why the driver is installed with --no-install-recommends: nvidia-settings is unversioned,
    # so apt takes the repo's newest build, another branch's.
    proc = apt(driver_pins(DRIVER))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    newest = max((v for b, v, _ in nvidia.DRIVER_RELEASES), key=lambda v: tuple(map(int, v.split("."))))
    assert installs(proc.stdout)["nvidia-settings"] == f"{newest}-0ubuntu1"


def test_container_toolkit_pins_resolve(apt):
    pins = container_toolkit_pins()
    proc = apt(pins)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert installs(proc.stdout) == pins.as_dict()
