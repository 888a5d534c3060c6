"""GPU topology of an agent node: `nvidia-smi topo -m` -> NVLink domains -> Determined agents.

Determined has no `gpu_affinity` option (the source article's key does not exist; the
experiment schema rejects unknown keys). Keeping a trial inside one NVLink domain is done at
agent level: one `determined-agent` per domain, each with `visible_gpus` set to the domain's
GPUs and as many slots as the domain has GPUs. This module supplies the pieces:

  parse_topo(text) -> Topology          the matrix, NICs and affinities of one node
  deploy.facts.gpu.GpuTopology          pyinfra fact: the same, read from a host
  domains(topology) -> [(0, 1, 2, 3), (4, 5, 6, 7)]
  largest_trial_slots({host: domains}) -> int
  agent_plan(hostname, domains, layout) -> [AgentSpec(agent_id, visible_gpus, slots)]
  observe / summary_lines             the NVLink lines `python -m deploy verify` prints

The grouping rule (docs/topology.md walks through it on real machines):

1. Two GPUs are NVLinked when their matrix cell is NV<n>. A domain is a set of GPUs in
   which EVERY pair is NVLinked directly (a clique of the NVLink graph): a collective among
   them never leaves NVLink and never relays through a third GPU.
2. Within each connected NVLink component, take the largest such clique, then the largest
   clique among the GPUs left, and so on. Ties go to the clique whose links carry the most
   NVLinks in total (the strongest link class), then to the lowest GPU indices.
   - 8x A100/H100 behind NVSwitch (NV12/NV18 between every pair): one domain of eight.
   - DGX-1 hybrid cube-mesh (V100: NV1/NV2 mixed; P100: NV1): two domains of four. The
     quads {0,1,2,3} and {4,5,6,7} are fully meshed; across them only GPU k and k+4 are
     linked. Grouping by "edges of the best class" instead would chain the NV2 links
     0-3-2-1-5-6-7-4-0 into a ring and yield one domain of eight in which most pairs have
     no direct link, which is why that simpler rule is not used.
   - Pairs joined by NVLink bridges and nothing else: one domain per pair.
3. GPUs with no NVLink at all (every GPU of a PCIe-only box) are grouped by NUMA node: by
   the NUMA Affinity column when every such GPU has one, else by the CPU set of the CPU
   Affinity column, else (neither known) all of them form one domain.
4. A single GPU is one domain. Domains are sorted tuples of GPU indices, ordered by their
   first GPU.

What `topo -m` cannot tell, and what this module assumes:
- MIG: with MIG enabled, `topo -m` still lists the physical GPUs (its rows are GPUs, never
  GPU instances), and this module reports those. MIG instances cannot use peer-to-peer
  (NVLink or PCIe), so NVLink domains mean nothing for them; `parse_mig_modes` (the
  deploy.facts.gpu.GpuMigModes fact) tells a caller
  which GPUs have MIG on, so that it can refuse a per_domain layout there.
- GPU indices are nvidia-smi's (PCI bus order), the numbering `visible_gpus` uses too.
  A container's CUDA_VISIBLE_DEVICES order is not involved.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from itertools import combinations

LAYOUTS = ("per_node", "per_domain")

# Status of a Topology: nvidia-smi printed a matrix / said it found no GPU / did not answer
# (not installed, driver not loaded, driver/library mismatch, ...).
OK = "ok"
NO_DEVICES = "no_devices"
UNAVAILABLE = "unavailable"

NO_DEVICES_MESSAGE = "No devices were found"

# SOC is what drivers before R384 printed for today's SYS.
_LINK = re.compile(r"^(?:X|SYS|SOC|NODE|PHB|PXB|PIX|NV([1-9][0-9]*))$")
_GPU_COLUMN = re.compile(r"^GPU([0-9]+)$")
_NIC_LEGEND = re.compile(r"^\s*(NIC[0-9]+):\s*(\S+)\s*$")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_CPU_LIST = re.compile(r"^[0-9]+(?:-[0-9]+)?(?:,[0-9]+(?:-[0-9]+)?)*$")
# Column titles after the device columns, in the order drivers print them.
_TRAILING_TITLES = ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")
_NOT_AVAILABLE = ("N/A", "[N/A]")


class TopologyError(ValueError):
    """nvidia-smi printed a matrix this module cannot read; the message says where."""


@dataclass(frozen=True)
class Gpu:
    index: int
    cpu_affinity: str | None = None  # as printed ("0-31,64-95"); None when N/A or absent
    numa_affinity: str | None = None  # "0"; None when N/A or absent
    gpu_numa_id: str | None = None  # newer drivers; a number only where GPU memory is a NUMA node

    @property
    def cpus(self) -> frozenset[int] | None:
        """The CPU Affinity column as a set of CPU numbers (None when not a CPU list)."""
        return parse_cpu_list(self.cpu_affinity) if self.cpu_affinity else None


@dataclass(frozen=True)
class Nic:
    column: str  # the matrix's column name: "mlx5_0", or "NIC0" on drivers with a NIC Legend
    device: str  # the RDMA device name: "mlx5_0"


@dataclass(frozen=True)
class Topology:
    status: str  # OK, NO_DEVICES or UNAVAILABLE
    gpus: tuple[Gpu, ...] = ()
    nics: tuple[Nic, ...] = ()
    columns: tuple[str, ...] = ()  # matrix column names, GPUs and NICs in printed order
    matrix: tuple[tuple[str, ...], ...] = ()  # labels, rows and columns as in `columns`
    detail: str | None = None  # why there is no matrix (UNAVAILABLE), else None

    @property
    def gpu_indices(self) -> tuple[int, ...]:
        return tuple(g.index for g in self.gpus)

    def link(self, a: int, b: int) -> str:
        """The matrix label between GPU a and GPU b ("X" for a == b)."""
        return self._cell(f"GPU{a}", f"GPU{b}")

    def nvlinks(self, a: int, b: int) -> int:
        """Number of bonded NVLinks between GPU a and GPU b (0: not NVLinked)."""
        return nvlink_count(self.link(a, b)) if a != b else 0

    def nic_link(self, gpu: int, device: str) -> str:
        """The matrix label between a GPU and a NIC named by RDMA device ("mlx5_0")."""
        for nic in self.nics:
            if nic.device == device:
                return self._cell(f"GPU{gpu}", nic.column)
        raise KeyError(f"no NIC {device!r} in the topology")

    def to_json(self) -> dict:
        """For `pyinfra INVENTORY fact deploy.facts.gpu.GpuTopology` (its JSON output)."""
        return {
            "status": self.status,
            "detail": self.detail,
            "gpus": [
                {
                    "index": g.index,
                    "cpu_affinity": g.cpu_affinity,
                    "numa_affinity": g.numa_affinity,
                    "gpu_numa_id": g.gpu_numa_id,
                }
                for g in self.gpus
            ],
            "nics": {n.column: n.device for n in self.nics},
            "matrix": {
                row: dict(zip(self.columns, cells, strict=False))
                for row, cells in zip(self.columns, self.matrix, strict=False)
            },
            "domains": [list(d) for d in domains(self)],
        }

    def _cell(self, row: str, column: str) -> str:
        try:
            return self.matrix[self.columns.index(row)][self.columns.index(column)]
        except ValueError:
            raise KeyError(
                f"no device {row if row not in self.columns else column!r} in the topology"
            ) from None


@dataclass(frozen=True)
class AgentSpec:
    agent_id: str
    visible_gpus: str  # Determined's agent.yaml `visible_gpus`: "0,1,2,3"
    slots: int


def nvlink_count(label: str) -> int:
    """ "NV12" -> 12; any other label -> 0."""
    m = _LINK.match(label)
    return int(m.group(1)) if m and m.group(1) else 0


def parse_cpu_list(text: str) -> frozenset[int] | None:
    """ "0-31,64-95" -> {0..31, 64..95}; None for N/A or anything that is not a CPU list."""
    text = text.strip()
    if not _CPU_LIST.match(text):
        return None
    cpus: set[int] = set()
    for part in text.split(","):
        first, _, last = part.partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return frozenset(cpus)


def _value(token: str | None) -> str | None:
    return None if token is None or token in _NOT_AVAILABLE else token


def _header(line: str) -> tuple[list[str], list[str]] | None:
    """A matrix header -> (device columns, trailing titles), or None if it is not one."""
    found = sorted((line.find(t), t) for t in _TRAILING_TITLES if t in line)
    columns = line[: found[0][0]].split() if found else line.split()
    # A matrix row also starts with GPU0; its cells (X, NV12, ...) tell it apart.
    if not columns or not _GPU_COLUMN.match(columns[0]) or any(_LINK.match(c) for c in columns):
        return None
    return columns, [t for _, t in found]


def parse_topo(text: str) -> Topology:
    """Read `nvidia-smi topo -m` output (tabs or spaces, with or without the legends).

    No matrix at all is not an error: "No devices were found" gives status NO_DEVICES,
    anything else (empty output, "NVIDIA-SMI has failed ...", a version mismatch) gives
    UNAVAILABLE with the first line in `detail`. A matrix that is cut short, not square,
    not symmetric or holds an unknown label raises TopologyError.
    """
    # Long: `nvidia-smi topo -m` is one table (header, rows, legend): read and checked in one pass,
    # each problem naming its row
    lines = [_ANSI.sub("", line).rstrip() for line in text.splitlines()]
    start = None
    for i, line in enumerate(lines):
        parsed = _header(line)
        if parsed:
            start = i
            columns, titles = parsed
            break
    if start is None:
        said = [line.strip() for line in lines if line.strip()]
        if any(line == NO_DEVICES_MESSAGE for line in said):
            return Topology(status=NO_DEVICES)
        detail = said[0] if said else "nvidia-smi printed nothing (not installed?)"
        return Topology(status=UNAVAILABLE, detail=detail)

    if len(set(columns)) != len(columns):
        raise TopologyError(f"header names a device twice: {' '.join(columns)}")
    gpu_columns = [c for c in columns if _GPU_COLUMN.match(c)]
    if columns[: len(gpu_columns)] != gpu_columns:
        raise TopologyError(f"header lists a NIC before a GPU: {' '.join(columns)}")

    n = len(columns)
    rows: dict[str, list[str]] = {}
    extras: dict[str, list[str]] = {}
    legend: dict[str, str] = {}
    for number, line in enumerate(lines[start + 1 :], start + 2):
        m = _NIC_LEGEND.match(line)
        if m:
            legend[m.group(1)] = m.group(2)
            continue
        tokens = line.split()
        if not tokens or tokens[0] not in columns:
            continue  # legend text, blank lines
        name = tokens[0]
        if name in rows:
            raise TopologyError(f"line {number}: a second row for {name}")
        cells = tokens[1:]
        if len(cells) < n:
            raise TopologyError(
                f"line {number}: row {name} has {len(cells)} link cells, the header has {n} devices"
            )
        for column, label in zip(columns, cells[:n], strict=False):
            if not _LINK.match(label):
                raise TopologyError(f"line {number}: {name}/{column}: unknown link label {label!r}")
        rows[name] = cells[:n]
        extras[name] = cells[n:]

    missing = [c for c in columns if c not in rows]
    if missing:
        raise TopologyError(f"no matrix row for {', '.join(missing)} (output cut short?)")
    matrix = tuple(tuple("SYS" if label == "SOC" else label for label in rows[c]) for c in columns)
    for a, b in combinations(range(n), 2):
        if matrix[a][b] != matrix[b][a]:
            raise TopologyError(
                f"matrix not symmetric: {columns[a]}/{columns[b]} is "
                f"{matrix[a][b]}, {columns[b]}/{columns[a]} is {matrix[b][a]}"
            )
    for i, c in enumerate(columns):
        if matrix[i][i] != "X":
            raise TopologyError(f"{c}/{c} is {matrix[i][i]}, expected X")
        if "X" in matrix[i][:i] + matrix[i][i + 1 :]:
            raise TopologyError(f"row {c} has X off the diagonal")

    gpus = []
    for c in gpu_columns:
        values = dict(zip(titles, extras[c], strict=False))  # a row may lack trailing N/A cells
        gpus.append(
            Gpu(
                index=int(c.removeprefix("GPU")),  # gpu_columns all match _GPU_COLUMN
                cpu_affinity=_value(values.get("CPU Affinity")),
                numa_affinity=_value(values.get("NUMA Affinity")),
                gpu_numa_id=_value(values.get("GPU NUMA ID")),
            )
        )
    nics = tuple(Nic(column=c, device=legend.get(c, c)) for c in columns[len(gpu_columns) :])
    return Topology(status=OK, gpus=tuple(gpus), nics=nics, columns=tuple(columns), matrix=matrix)


# ---------------------------------------------------------------------------- domains


def _maximal_cliques(vertices: set[int], adjacent: dict[int, set[int]]):
    """Bron-Kerbosch with pivoting; a node has at most a few dozen GPUs."""

    def expand(r: set[int], p: set[int], x: set[int]):
        if not p and not x:
            yield frozenset(r)
            return
        pivot = max(p | x, key=lambda v: len(adjacent[v] & p))
        for v in sorted(p - adjacent[pivot]):
            yield from expand(r | {v}, p & adjacent[v], x & adjacent[v])
            p = p - {v}
            x = x | {v}

    yield from expand(set(), set(vertices), set())


def _components(vertices: set[int], adjacent: dict[int, set[int]]) -> list[set[int]]:
    seen: set[int] = set()
    found = []
    for v in sorted(vertices):
        if v in seen:
            continue
        stack, part = [v], set()
        while stack:
            u = stack.pop()
            if u not in part:
                part.add(u)
                stack.extend(adjacent[u] - part)
        seen |= part
        found.append(part)
    return found


def _nvlink_domains(topology: Topology, linked: set[int]) -> list[tuple[int, ...]]:
    adjacent = {g: {h for h in linked if h != g and topology.nvlinks(g, h)} for g in linked}
    found = []
    for component in _components(linked, adjacent):
        left = set(component)
        while left:
            sub = {v: adjacent[v] & left for v in left}

            def rank(clique: frozenset[int]):
                strength = sum(topology.nvlinks(a, b) for a, b in combinations(clique, 2))
                return (-len(clique), -strength, sorted(clique))

            best = min(_maximal_cliques(left, sub), key=rank)
            found.append(tuple(sorted(best)))
            left -= best
    return found


def _locality_domains(topology: Topology, indices: list[int]) -> list[tuple[int, ...]]:
    gpus = [g for g in topology.gpus if g.index in indices]
    if all(g.numa_affinity is not None for g in gpus):
        keys: list[object] = [g.numa_affinity for g in gpus]
    elif all(g.cpus is not None for g in gpus):
        keys = [g.cpus for g in gpus]  # a set, so "0-3" and "0,1,2,3" agree
    else:
        keys = [None for g in gpus]
    groups: dict[object, list[int]] = {}
    for key, g in zip(keys, gpus, strict=False):
        groups.setdefault(key, []).append(g.index)
    return [tuple(sorted(group)) for group in groups.values()]


def domains(topology: Topology) -> list[tuple[int, ...]]:
    """NVLink domains of one node, by the rule in this module's docstring.

    [] when the topology has no GPUs (NO_DEVICES or UNAVAILABLE): the caller decides
    whether that is an error.
    """
    indices = list(topology.gpu_indices)
    linked = {g for g in indices if any(topology.nvlinks(g, h) for h in indices)}
    found = _nvlink_domains(topology, linked)
    rest = [g for g in indices if g not in linked]
    if rest:
        found += _locality_domains(topology, rest)
    return sorted(found, key=lambda d: d[0])


def largest_trial_slots(domains_by_node: dict[str, list[tuple[int, ...]]]) -> int:
    """The largest `resources.slots_per_trial` that fits inside one domain on EVERY node.

    That is min over nodes of the node's largest domain. A trial of that size can be placed
    within NVLink on whichever node the scheduler picks; a larger one may still fit on the
    bigger nodes, but only those, and it waits for them. Only a per_domain layout makes this
    a guarantee: a per_node agent offers all its GPUs as one pool, and Determined may then
    give a 4-slot trial two GPUs from each of two domains.
    """
    if not domains_by_node:
        raise ValueError("no agent nodes: nothing to size a trial against")
    empty = sorted(host for host, found in domains_by_node.items() if not found)
    if empty:
        raise ValueError(
            f"no GPU domains on {', '.join(empty)}: nvidia-smi found no GPU "
            "there (or the driver is not loaded yet)"
        )
    return min(max(len(d) for d in found) for found in domains_by_node.values())


def agent_plan(hostname: str, domains: list[tuple[int, ...]], layout: str) -> list[AgentSpec]:
    """The Determined agents to run on one node.

    per_node:   one agent, id = hostname, every GPU.
    per_domain: one agent per domain, id = f"{hostname}-{i}" (i from 0, domains in order),
                visible_gpus = that domain's GPUs, slots = its size.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"{hostname}: agent_layout {layout!r} is not one of {', '.join(LAYOUTS)}")
    if not domains or not all(domains):
        raise ValueError(f"{hostname}: no GPUs to give an agent (empty domain list)")
    every = [g for d in domains for g in d]
    if len(set(every)) != len(every):
        raise ValueError(f"{hostname}: a GPU is in two domains: {domains}")

    def spec(agent_id: str, gpus) -> AgentSpec:
        gpus = sorted(gpus)
        return AgentSpec(agent_id, ",".join(str(g) for g in gpus), len(gpus))

    if layout == "per_node":
        return [spec(hostname, every)]
    ordered = sorted(domains, key=min)
    return [spec(f"{hostname}-{i}", d) for i, d in enumerate(ordered)]


# ---------------------------------------------------------------------------- MIG


def parse_mig_modes(lines) -> dict[int, str]:
    """`--query-gpu=index,mig.mode.current --format=csv,noheader` -> {0: "Enabled", ...}.

    GPUs without MIG support print "[N/A]" (-> "N/A"); lines that are not `index, mode`
    (a driver error message) are skipped.
    """
    modes = {}
    for line in lines:
        index, sep, mode = line.partition(",")
        if sep and index.strip().isdigit() and mode.strip():
            modes[int(index)] = mode.strip().strip("[]")
    return modes


# ---------------------------------------------------------------------------- NVLink lines


@dataclass(frozen=True)
class Observed:
    """One agent node's topology as read from the node (by tests/verify)."""

    layout: str
    domains: tuple[tuple[int, ...], ...]  # () when nvidia-smi gave no matrix
    detail: str | None = None  # why there are no domains


def observe(layout: str, topology: Topology) -> Observed:
    found = tuple(domains(topology))
    detail = None if found else (topology.detail or f"nvidia-smi topo -m: {topology.status}")
    return Observed(layout, found, detail)


def summary_lines(observed: dict[str, Observed], agents: list[str]) -> list[str]:
    """Each agent node's domains and the trial size that fits, as lines to print.

    `agents`: every agent node that was to be read, so that a node whose topology could not
    be read (unreachable, or its check failed before reading) is named instead of silently
    leaving the number to the others.
    """
    if not observed:
        return []
    shown = []
    for hostname in sorted(observed):
        seen = observed[hostname]
        sizes = "+".join(str(len(d)) for d in seen.domains) or f"none ({seen.detail})"
        shown.append(f"{hostname} {sizes} ({seen.layout})")
    lines = [f"--> NVLink domains (GPUs each): {', '.join(shown)}"]
    measured = {h: list(o.domains) for h, o in observed.items() if o.domains}
    missing = sorted(set(agents) - set(measured))
    if not measured:
        lines.append(
            "--> largest slots_per_trial inside one NVLink domain: unknown (no agent "
            "node's topology was read)"
        )
        return lines
    size = largest_trial_slots(measured)
    where = (
        "every agent node"
        if not missing
        else f"the {len(measured)} agent nodes read (not read: {', '.join(missing)})"
    )
    lines.append(f"--> largest slots_per_trial inside one NVLink domain on {where}: {size}")
    split = sorted(h for h, o in observed.items() if o.layout == "per_node" and len(o.domains) > 1)
    if split:
        lines.append(
            f"    not enforced on {', '.join(split)} (agent_layout per_node: one agent "
            "offers all its GPUs, a trial may span domains)"
        )
    return lines
