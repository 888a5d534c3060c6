"""deploy.cluster: the lab and prod files, defaults, the broken-file corpus, secret masking."""

from __future__ import annotations

import copy
import dataclasses
import ipaddress
import json
import os
import random
import subprocess
import sys
import tempfile
import typing
from pathlib import Path

import pytest
import yaml

from deploy import cluster as cluster_module
from deploy.cluster import ClusterError, checks, load_cluster
from deploy.secrets import REPO_ROOT
from tests.unit.tls_material import ca_pem, corpus_master_tls

REPO = Path(__file__).resolve().parents[2]
LAB = REPO / "inventories" / "lab" / "cluster.yaml"
PROD = REPO / "inventories" / "prod" / "cluster.yaml"
BROKEN = Path(__file__).parent / "broken"
PIN = "ab" * 32

# The secrets the corpus refers to (tests/unit/broken/*.yaml). The last four are broken on
# purpose: empty, too short for MinIO (2 and 7 characters), and below Determined's policy.
# Each is distinctive enough that finding it in a message means it leaked.
CORPUS_ENV = {
    "DTTEST_ACCESS_KEY": "minio-corpus",
    "DTTEST_SECRET_KEY": "Corpus-Secret-9",
    "DTTEST_DB_PASSWORD": "corpus-db-pass",
    "DTTEST_ADMIN_PASSWORD": "Corpus-Admin-1",
    "DTTEST_EMPTY": "",
    "DTTEST_TINY": "Zq",
    "DTTEST_SHORT": "short7x",
    "DTTEST_WEAK": "weakpass",
}
# Refused for their content: a line break inside, a control character.
CORPUS_ENV_BROKEN = {
    "DTTEST_NEWLINE": "Corpus-Env\nNewline-5",
    "DTTEST_CONTROL": "Corpus-Env\tTab-6",
    # Determined's database URL cannot carry it (deploy/cluster/rules.py).
    "DTTEST_URL_PASSWORD": "Corpus/Url?Pass#7",
}
# Values written straight into corpus files where a reference belongs.
CORPUS_PLAINTEXT = ["minioadmin", "hunter2", "12345678"]
# Secret files the corpus refers to by absolute path (a file in the repository is refused):
# name -> (content, mode). Only the last one is valid.
CORPUS_SECRET_DIR = Path("/tmp/dtlab-unit-corpus-secrets")
CORPUS_SECRET_FILES = {
    "world-readable": ("Corpus-File-World-1\n", 0o644),
    "group-writable": ("Corpus-File-Group-2\n", 0o620),
    "inner-newline": ("Corpus-File\nInner-3\n", 0o600),
    "control": ("Corpus-File\x1b[2J-4\n", 0o600),
    "blank-lines": ("Corpus-File-Blank-5\n\n\n", 0o600),
}

# The smallest valid file: everything else comes from defaults.
MINIMAL = """\
master_host: m1
insecure_http: true
network: {management: 192.0.2.0/24, ipoib: {subnet: 198.51.100.0/24}}
nodes:
  - {hostname: m1, address: 192.0.2.10, ipoib_address: 198.51.100.10}
  - {hostname: a1, address: 192.0.2.11, ipoib_address: 198.51.100.11, roles: [agent]}
sources:
  mofed_tarball: {url: "http://mirror.test/MLNX_OFED_LINUX-{version}-{distro}-x86_64.tgz", sha256: PIN}
  minio: {url: http://mirror.test/minio, sha256: PIN}
  determined_master: {url: "http://mirror.test/determined-master_{version}_linux_amd64.deb", sha256: PIN}
  determined_agent: {url: "http://mirror.test/determined-agent_{version}_linux_amd64.deb", sha256: PIN}
storage: {bucket: det-checkpoints, access_key: {env: DTTEST_ACCESS_KEY}, secret_key: {env: DTTEST_SECRET_KEY}}
database: {password: {env: DTTEST_DB_PASSWORD}}
determined: {admin_password: {env: DTTEST_ADMIN_PASSWORD}}
""".replace("PIN", PIN)


def _corpus_secret_files() -> None:
    """Write CORPUS_SECRET_FILES; atomic and idempotent (pytest-xdist workers run it at once)."""
    CORPUS_SECRET_DIR.mkdir(mode=0o700, exist_ok=True)
    for name, (content, mode) in CORPUS_SECRET_FILES.items():
        path = CORPUS_SECRET_DIR / name
        if path.exists() and path.read_bytes() == content.encode() and path.stat().st_mode & 0o777 == mode:
            continue
        fd, tmp = tempfile.mkstemp(dir=CORPUS_SECRET_DIR)
        with os.fdopen(fd, "wb") as f:
            f.write(content.encode())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    corpus_master_tls(CORPUS_SECRET_DIR)  # determined.tls certificates and keys (master-tls-*.yaml)


@pytest.fixture
def corpus_env(monkeypatch):
    for name, value in {**CORPUS_ENV, **CORPUS_ENV_BROKEN}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("DTTEST_UNSET", raising=False)
    _corpus_secret_files()


def write(tmp_path: Path, text: str, name: str = "cluster.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def lab_copy(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """The lab's cluster.yaml with its secrets in tmp_path instead of the lab's state."""
    secrets_dir = tmp_path / "secrets"
    secrets_dir.mkdir()
    values = {}
    for name in ("minio_access_key", "minio_secret_key", "db_password", "admin_password"):
        values[name] = f"Lab-{name}-S3cret"
        (secrets_dir / name).write_text(values[name] + "\n")
        (secrets_dir / name).chmod(0o600)
    text = LAB.read_text()
    assert text.count("/var/lib/dtlab/secrets/") == 4
    text = text.replace("/var/lib/dtlab/secrets/", f"{secrets_dir}/")
    # The lab registry's CA exists once the lab is built (tests/lab/registry.py): a stand-in.
    (tmp_path / "ca.crt").write_text(ca_pem())
    text = text.replace("/var/lib/dtlab/registry/ca.crt", str(tmp_path / "ca.crt"))
    return write(tmp_path, text), values


# --- valid files ------------------------------------------------------------------------------


def test_lab_file_loads(tmp_path):
    path, values = lab_copy(tmp_path)
    c = load_cluster(path)
    assert [n.hostname for n in c.nodes] == ["lab-master", "lab-gpu1", "lab-gpu2", "lab-gpu3"]
    assert c.master_node.roles == ("master", "storage")
    assert c.storage_node is c.master_node
    assert [a.hostname for a in c.agents] == ["lab-gpu1", "lab-gpu2", "lab-gpu3"]
    assert all(a.slots == 8 for a in c.agents)
    assert [a.agent_layout for a in c.agents] == ["per_domain", "per_domain", "per_node"]
    assert c.node("lab-gpu2").address == ipaddress.IPv4Address("10.77.0.12")
    assert c.node("lab-gpu2").ipoib_address == ipaddress.IPv4Address("10.78.0.12")
    assert c.network.management == ipaddress.IPv4Network("10.77.0.0/24")
    assert c.ssh.strict_host_key_checking is False
    assert c.preflight.allowed_os == (("Debian 12", ("6.*",)),)
    assert c.storage.endpoint_url == "http://lab-master:9000"
    # One trailing newline is not part of the secret.
    assert c.storage.access_key.value == values["minio_access_key"]
    assert c.determined.admin_password.value == values["admin_password"]
    assert c.sources.cuda_repo_for("debian", "12") == "http://10.77.0.1:8077/cuda/repos/debian12/x86_64/"


def test_lab_file_as_committed_is_valid():
    """Everything but the secret files, which exist only once the lab is built."""
    c = load_cluster(LAB, resolve_secrets=False)
    assert len(c.nodes) == 4


def test_defaults(tmp_path, corpus_env):
    c = load_cluster(write(tmp_path, MINIMAL))
    assert c.master_port == 23457
    assert (c.ssh.user, c.ssh.port, c.ssh.key_file, c.ssh.known_hosts_file) == ("root", 22, None, None)
    assert c.ssh.strict_host_key_checking is True
    assert (c.network.ipoib.interface, c.network.ipoib.mtu) == ("ib0", 2044)
    assert dict(c.preflight.allowed_os) == {
        "Ubuntu 20.04": ("5.4.0-*-generic",),
        "Ubuntu 22.04": ("5.15.0-*-generic",),
    }
    assert c.preflight.certified_kernels == ("5.4.0-100-generic", "5.15.0-100-generic")
    assert c.preflight.secure_boot == "refuse"
    assert (c.preflight.min_free_disk_gb, c.preflight.disk_path) == (50, "/")
    assert (c.versions.nvidia_driver, c.versions.cuda, c.versions.nccl, c.versions.mofed) == (
        "515.65.01",
        "11.7.1",
        "2.14.3",
        "5.8-3.0.7.0",
    )
    assert c.sources.apt_proxy is None
    assert c.sources.cuda_repo == (
        "https://developer.download.nvidia.com/compute/cuda/repos/{distro}/x86_64/"
    )
    s = c.storage
    assert (s.host, s.region, s.port, s.console_port, s.data_dir, s.prefix) == (
        "m1",
        "us-east-1",
        9000,
        9001,
        "/mnt/data",
        None,
    )
    assert s.endpoint_url == "http://m1:9000"
    assert (c.database.name, c.database.user, c.database.port) == ("determined", "determined", 5432)
    d = c.determined
    assert (d.version, d.agent_layout, d.resource_pool, d.slot_type) == (
        "0.38.0",
        "per_node",
        "default",
        "cuda",
    )
    assert c.reboot == "auto"
    m1, a1 = c.nodes
    assert (m1.roles, m1.slots, m1.agent_layout) == (("master", "storage"), None, None)
    assert (a1.roles, a1.slots, a1.agent_layout) == (("agent",), 8, "per_node")
    assert c.nodes_with("storage") == (m1,)
    assert c.sources.minio.sha256 == PIN


def test_explicit_values_override_defaults(tmp_path, corpus_env):
    text = MINIMAL.replace("roles: [agent]}", "roles: [agent], slots: 4, agent_layout: per_domain}")
    text = text.replace("storage: {bucket", "storage: {host: a1, port: 9100, prefix: runs, bucket")
    text += (
        "determined: {agent_layout: per_domain, slot_type: cpu,"
        " admin_password: {env: DTTEST_ADMIN_PASSWORD}}\n"
    )
    text = text.replace("determined: {admin_password: {env: DTTEST_ADMIN_PASSWORD}}\n", "", 1)
    c = load_cluster(write(tmp_path, text))
    assert c.node("a1").roles == ("storage", "agent")
    assert c.node("m1").roles == ("master",)
    assert (c.node("a1").slots, c.node("a1").agent_layout) == (4, "per_domain")
    assert c.storage.endpoint_url == "http://a1:9100"
    assert (c.storage.prefix, c.determined.slot_type) == ("runs", "cpu")


def test_node_layout_overrides_cluster_layout(tmp_path, corpus_env):
    text = MINIMAL.replace(
        "  - {hostname: a1, address: 192.0.2.11, ipoib_address: 198.51.100.11, roles: [agent]}\n",
        "  - {hostname: a1, address: 192.0.2.11, ipoib_address: 198.51.100.11, roles: [agent]}\n"
        "  - {hostname: a2, address: 192.0.2.12, ipoib_address: 198.51.100.12, roles: [agent],"
        " agent_layout: per_domain}\n",
    )
    c = load_cluster(write(tmp_path, text))
    assert [a.agent_layout for a in c.agents] == ["per_node", "per_domain"]


def test_source_helpers(tmp_path, corpus_env):
    src = load_cluster(write(tmp_path, MINIMAL)).sources
    assert src.cuda_repo_for("ubuntu", "20.04") == (
        "https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2004/x86_64/"
    )
    assert src.cuda_repo_for("ubuntu", "22.04").endswith("/repos/ubuntu2204/x86_64/")
    assert src.cuda_repo_for("debian", "12").endswith("/repos/debian12/x86_64/")
    assert src.mofed_url_for("ubuntu", "20.04", "5.8-3.0.7.0") == (
        "http://mirror.test/MLNX_OFED_LINUX-5.8-3.0.7.0-ubuntu20.04-x86_64.tgz"
    )
    assert src.mofed_url_for("debian", "12", "5.8-3.0.7.0").endswith("-debian12-x86_64.tgz")
    assert src.determined_url("master", "0.38.0") == (
        "http://mirror.test/determined-master_0.38.0_linux_amd64.deb"
    )
    assert src.determined_url("agent", "0.38.0").endswith("determined-agent_0.38.0_linux_amd64.deb")
    with pytest.raises(ValueError):
        src.determined_url("minio", "0.38.0")
    assert src.mofed_sha256_for("ubuntu", "20.04") == src.mofed_sha256_for("debian", "12") == PIN


def test_mofed_pins_per_distro(tmp_path, corpus_env):
    """Each distro's MLNX_OFED tarball is another file: a mixed cluster pins each."""
    per = "sha256: {ubuntu20.04: " + "b" * 64 + ", ubuntu22.04: " + "C" * 64 + "}}"
    text = MINIMAL.replace('-x86_64.tgz", sha256: ' + PIN + "}", '-x86_64.tgz", ' + per, 1)
    assert text != MINIMAL
    src = load_cluster(write(tmp_path, text)).sources
    assert src.mofed_sha256_for("ubuntu", "20.04") == "b" * 64
    assert src.mofed_sha256_for("ubuntu", "22.04") == "c" * 64
    assert src.mofed_sha256_for("debian", "12") is None  # the role fails that node, unfetched
    bad = text.replace("ubuntu22.04: ", "ubuntu2204: ", 1)
    with pytest.raises(ClusterError) as e:
        load_cluster(write(tmp_path, bad))
    assert [p.split(": ", 1)[1] for p in e.value.problems] == [
        "sources.mofed_tarball.sha256: 'ubuntu2204': keys must be distros as the file names them, "
        "like ubuntu20.04, ubuntu22.04, debian12"
    ]


def test_model_lookups(tmp_path, corpus_env):
    c = load_cluster(write(tmp_path, MINIMAL))
    assert c.nodes_with("agent") == (c.node("a1"),)
    with pytest.raises(KeyError):
        c.node("nope")
    with pytest.raises(ValueError):
        c.nodes_with("agents")
    with pytest.raises(AttributeError):
        c.master_port = 1  # type: ignore[misc]  # frozen


def tls_files(stem: str) -> list[tuple[str, str]]:
    return [("certificate", f"{stem}.crt"), ("private_key", f"{stem}.key"), ("ca_certificate", "ca.crt")]


def test_prod_without_pins_and_secrets_fails_with_exactly_these_problems(monkeypatch):
    for name in ("DET_MINIO_ACCESS_KEY", "DET_MINIO_SECRET_KEY", "DET_DB_PASSWORD", "DET_ADMIN_PASSWORD"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(REPO)
    with pytest.raises(ClusterError) as e:
        load_cluster("inventories/prod/cluster.yaml")
    f = "inventories/prod/cluster.yaml"
    pin = "not pinned: write the sha256 of the {} here (`sha256sum FILE`)"
    keyring = "not pinned: write the sha256 of that folder's cuda-keyring .deb here (`sha256sum FILE`)"
    distro_pin = "not pinned: write the sha256 of that distro's MLNX_OFED tarball here (`sha256sum FILE`)"
    assert e.value.problems == [
        f"{f}: sources.cuda_keyring.ubuntu2004: None: " + keyring,
        f"{f}: sources.cuda_keyring.ubuntu2204: None: " + keyring,
        f"{f}: sources.mofed_tarball.sha256['ubuntu20.04']: None: " + distro_pin,
        f"{f}: sources.mofed_tarball.sha256['ubuntu22.04']: None: " + distro_pin,
        f"{f}: sources.minio.sha256: None: " + pin.format("MinIO server binary"),
        f"{f}: sources.determined_master.sha256: None: " + pin.format("determined-master package"),
        f"{f}: sources.determined_agent.sha256: None: " + pin.format("determined-agent package"),
        (
            f"{f}: storage.access_key: {{env: DET_MINIO_ACCESS_KEY}}: "
            "environment variable DET_MINIO_ACCESS_KEY is not set"
        ),
        (
            f"{f}: storage.secret_key: {{env: DET_MINIO_SECRET_KEY}}: "
            "environment variable DET_MINIO_SECRET_KEY is not set"
        ),
        *(
            f"{f}: storage.tls.{key}: {{file: /etc/gpu-cluster/tls/{name}}}: the file does not exist"
            for key, name in tls_files("minio")
        ),
        (
            f"{f}: database.password: {{env: DET_DB_PASSWORD}}: "
            "environment variable DET_DB_PASSWORD is not set"
        ),
        (
            f"{f}: determined.admin_password: {{env: DET_ADMIN_PASSWORD}}: "
            "environment variable DET_ADMIN_PASSWORD is not set"
        ),
        *(
            f"{f}: determined.tls.{key}: {{file: /etc/gpu-cluster/tls/{name}}}: the file does not exist"
            for key, name in tls_files("master")
        ),
        *(
            f"{f}: determined.task_image.{kind}: '{ref}': has no digest: write "
            f"name:tag@sha256:<digest> (`docker buildx imagetools inspect {ref}` or `skopeo inspect "
            f"docker://{ref}` prints it)"
            for kind, ref in (
                ("gpu", "determinedai/environments:cuda-11.3-pytorch-1.12-tf-2.11-gpu-748dda4"),
                ("cpu", "determinedai/environments:py-3.9-pytorch-1.12-tf-2.11-cpu-748dda4"),
            )
        ),
    ]


def test_prod_is_the_articles_cluster_once_pinned(tmp_path, monkeypatch):
    monkeypatch.setenv("DET_MINIO_ACCESS_KEY", "det-minio")
    monkeypatch.setenv("DET_MINIO_SECRET_KEY", "det-minio-secret")
    monkeypatch.setenv("DET_DB_PASSWORD", "db-password")
    monkeypatch.setenv("DET_ADMIN_PASSWORD", "Admin-Passw0rd")
    from tests.unit.test_short_yaml import pinned_prod_text

    c = load_cluster(write(tmp_path, pinned_prod_text(PROD.read_text(), PIN, tmp_path / "pki")))
    assert (c.master_host, str(c.master_node.address), c.master_port) == ("gpu-master", "192.168.1.10", 23457)
    assert [(a.hostname, str(a.address), a.slots) for a in c.agents] == [
        ("gpu-node1", "192.168.1.11", 8),
        ("gpu-node2", "192.168.1.12", 8),
        ("gpu-node3", "192.168.1.13", 8),
    ]
    assert str(c.network.management) == "192.168.1.0/24"
    assert str(c.network.ipoib.subnet) == "10.10.1.0/24"
    assert c.sources.cuda_repo_for("ubuntu", "20.04") == (
        "https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2004/x86_64/"
    )
    assert c.sources.mofed_url_for("ubuntu", "20.04", c.versions.mofed) == (
        "https://content.mellanox.com/ofed/MLNX_OFED-5.8-3.0.7.0/"
        "MLNX_OFED_LINUX-5.8-3.0.7.0-ubuntu20.04-x86_64.tgz"
    )


# --- the broken-file corpus ------------------------------------------------------------------

CORPUS = sorted(BROKEN.glob("*.yaml"))


def expectations(path: Path) -> list[str]:
    expected = []
    for line in path.read_text().splitlines():
        if not line.startswith("# expect: "):
            break
        expected.append(line.removeprefix("# expect: "))
    return expected


def test_corpus_is_large_enough():
    assert len(CORPUS) >= 80
    assert all(expectations(p) for p in CORPUS), "every corpus file states what it expects"


@pytest.mark.parametrize("path", CORPUS, ids=[p.stem for p in CORPUS])
def test_broken_file(path, corpus_env, monkeypatch):
    monkeypatch.chdir(BROKEN)  # messages carry the path as given: the bare file name
    with pytest.raises(ClusterError) as e:
        load_cluster(path.name)
    problems = e.value.problems
    # In file order: by the line and column of the key (of its parent when it is missing).
    assert problems == expectations(path)
    assert str(e.value) == "\n".join(problems)


def test_corpus_never_shows_a_secret(corpus_env, monkeypatch):
    monkeypatch.chdir(BROKEN)
    secrets = [v for v in CORPUS_ENV.values() if v] + CORPUS_PLAINTEXT
    secrets += list(CORPUS_ENV_BROKEN.values()) + [c.strip() for c, _ in CORPUS_SECRET_FILES.values()]
    secrets += [part for v in CORPUS_ENV_BROKEN.values() for part in v.split()]
    for path in CORPUS:
        with pytest.raises(ClusterError) as e:
            load_cluster(path.name)
        for secret in secrets:
            assert secret not in str(e.value), (path.name, secret)


ODD_VALUES = [
    None,
    0,
    -1,
    70000,
    True,
    1.5,
    "",
    "x",
    "a1",
    "192.0.2.10",
    "192.0.2.0/24",
    "{version}",
    "http://x/{distro}/",
    [],
    ["agent"],
    {},
    {"env": "X"},
    {"a": 1},
    [{"hostname": 1}],
]


def _paths(doc, path=()):
    if path:
        yield path
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _paths(v, (*path, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from _paths(v, (*path, i))


def _no_none_left(obj, where="cluster"):
    """None only in a field whose type says `| None` (deploy/cluster/model.py: "a type is `| None`
    only where the key may stay unset after loading")."""
    if dataclasses.is_dataclass(obj):
        hints = typing.get_type_hints(type(obj))
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            optional = type(None) in typing.get_args(hints[f.name])
            assert value is not None or optional, f"{where}.{f.name} is None"
            _no_none_left(value, f"{where}.{f.name}")
    elif isinstance(obj, tuple):
        for i, item in enumerate(obj):
            _no_none_left(item, f"{where}[{i}]")


def test_odd_values_give_problems_or_a_complete_model(tmp_path, corpus_env):
    """Seeded mutations of a valid file: never an exception other than ClusterError, every
    problem one line naming the file, and a model without holes when it loads."""
    rnd = random.Random(1123)
    base = yaml.safe_load(MINIMAL)
    paths = list(_paths(base))
    path = tmp_path / "cluster.yaml"
    for _ in range(200):
        doc = copy.deepcopy(base)
        for _ in range(rnd.randint(1, 3)):
            *parents, last = rnd.choice(paths)
            node = doc
            try:
                for key in parents:
                    node = node[key]
                node[last] = copy.deepcopy(rnd.choice(ODD_VALUES))
            except (KeyError, IndexError, TypeError):
                pass  # an earlier mutation replaced a parent
        path.write_text(yaml.safe_dump(doc))
        try:
            _no_none_left(load_cluster(path))
        except ClusterError as e:
            assert e.problems
            assert all("\n" not in p and p.startswith(f"{path}: ") for p in e.problems)


def test_missing_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ClusterError) as e:
        load_cluster("nope.yaml")
    assert e.value.problems == ["nope.yaml: cannot read the file: No such file or directory"]


@pytest.mark.parametrize(
    "name, why",
    [
        ("ab", "must be 3 to 63 characters long"),
        ("a" * 64, "must be 3 to 63 characters long"),
        ("-bucket", "must start and end with a letter or a digit"),
        ("my..bucket", "must not have '..', '.-' or '-.'"),
        ("xn--bucket", "uses a prefix or suffix S3 reserves (xn--, sthree-, -s3alias, --ol-s3)"),
        ("bucket-s3alias", "uses a prefix or suffix S3 reserves (xn--, sthree-, -s3alias, --ol-s3)"),
        ("det-checkpoints", None),
        ("det.checkpoints.1", None),
    ],
)
def test_bucket_names(name, why):
    assert checks.bucket_problem(name) == why


# --- secrets ---------------------------------------------------------------------------------


def test_secrets_are_masked_everywhere(tmp_path):
    path, values = lab_copy(tmp_path)
    c = load_cluster(path)
    secret = c.storage.secret_key
    assert repr(secret) == str(secret) == f"Secret(file:{tmp_path}/secrets/minio_secret_key)"
    assert f"{secret}" == f"{secret!r}" == repr(secret)
    text = repr(c) + str(c) + str(c.to_json()) + repr(c.storage) + repr(c.database)
    for value in values.values():
        assert value not in text
    assert c.database.password.value == values["db_password"]


def test_weak_admin_password_is_reported_without_the_value(tmp_path, corpus_env, monkeypatch):
    monkeypatch.setenv("DTTEST_ADMIN_PASSWORD", "alllowercase")
    with pytest.raises(ClusterError) as e:
        load_cluster(write(tmp_path, MINIMAL))
    assert "alllowercase" not in str(e.value)
    assert e.value.problems == [
        (
            f"{tmp_path}/cluster.yaml: determined.admin_password: {{env: DTTEST_ADMIN_PASSWORD}}: "
            "the password does not meet Determined's policy: it needs an upper-case letter and a digit"
        )
    ]


def test_plain_secret_in_a_mistyped_key_is_not_echoed(tmp_path, corpus_env):
    text = MINIMAL.replace(
        "database: {password: {env: DTTEST_DB_PASSWORD}}",
        "database: {pasword: Sup3r-Secret, password: {env: DTTEST_DB_PASSWORD}}",
    )
    with pytest.raises(ClusterError) as e:
        load_cluster(write(tmp_path, text))
    assert "Sup3r-Secret" not in str(e.value)


def secret_file_problem(tmp_path: Path, target: str) -> list[str]:
    text = MINIMAL.replace("{env: DTTEST_DB_PASSWORD}", f"{{file: {target}}}")
    with pytest.raises(ClusterError) as e:
        load_cluster(write(tmp_path, text))
    return e.value.problems


def test_secret_file_inside_the_repository_is_refused(tmp_path, corpus_env):
    inside = REPO_ROOT / "deploy" / "secrets.py"
    assert secret_file_problem(tmp_path, str(inside)) == [
        (
            f"{tmp_path}/cluster.yaml: database.password: {{file: {inside}}}: "
            f"the file is inside the repository ({REPO_ROOT}): keep secrets outside git"
        )
    ]
    # A link from outside into the checkout is the same file.
    link = tmp_path / "link"
    link.symlink_to(inside)
    assert "inside the repository" in secret_file_problem(tmp_path, str(link))[0]


def secret_file(path: Path, text: str, mode: int = 0o600) -> Path:
    path.write_bytes(text.encode())
    path.chmod(mode)
    return path


def test_empty_secret_file_is_refused(tmp_path, corpus_env):
    secret_file(tmp_path / "empty", "\n")
    assert secret_file_problem(tmp_path, str(tmp_path / "empty")) == [
        (f"{tmp_path}/cluster.yaml: database.password: {{file: {tmp_path}/empty}}: the file is empty")
    ]


@pytest.mark.parametrize("ending", ["", "\n", "\n\n", "\r\n", "\r\n\r\n", "\n\r\n"])
def test_trailing_line_breaks_are_not_part_of_the_secret(tmp_path, corpus_env, ending):
    secret_file(tmp_path / "pw", "Trailing-1" + ending)
    text = MINIMAL.replace("{env: DTTEST_DB_PASSWORD}", f"{{file: {tmp_path}/pw}}")
    assert load_cluster(write(tmp_path, text)).database.password.value == "Trailing-1"


@pytest.mark.parametrize(
    "content, why",
    [
        ("in\nside\n", "the file holds a line break inside the secret (only trailing ones are dropped)"),
        ("in\r\nside", "the file holds a line break inside the secret (only trailing ones are dropped)"),
        ("tab\there", "the file holds a control character (a tab, escape or NUL, ...)"),
        ("esc\x1b[2J", "the file holds a control character (a tab, escape or NUL, ...)"),
        ("nul\x00byte", "the file holds a control character (a tab, escape or NUL, ...)"),
        ("\n\n", "the file is empty"),
    ],
)
def test_secret_file_content_is_checked_without_showing_it(tmp_path, corpus_env, content, why):
    secret_file(tmp_path / "pw", content)
    problems = secret_file_problem(tmp_path, str(tmp_path / "pw"))
    assert problems == [f"{tmp_path}/cluster.yaml: database.password: {{file: {tmp_path}/pw}}: {why}"]
    for word in ("inside", "side", "here", "byte"):
        assert word not in problems[0].split(": ", 3)[3].replace("inside the secret", "")


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660, 0o602, 0o620])
def test_secret_file_readable_or_writable_by_others_is_refused(tmp_path, corpus_env, mode):
    secret_file(tmp_path / "pw", "Mode-Secret-1\n", mode)
    assert secret_file_problem(tmp_path, str(tmp_path / "pw")) == [
        (
            f"{tmp_path}/cluster.yaml: database.password: {{file: {tmp_path}/pw}}: "
            f"the file is readable or writable by group or others (mode {mode:04o}): "
            f"chmod 600 {tmp_path}/pw"
        )
    ]


@pytest.mark.parametrize("mode", [0o600, 0o400, 0o700])
def test_secret_file_for_its_owner_only_is_accepted(tmp_path, corpus_env, mode):
    secret_file(tmp_path / "pw", "Mode-Secret-1\n", mode)
    text = MINIMAL.replace("{env: DTTEST_DB_PASSWORD}", f"{{file: {tmp_path}/pw}}")
    assert load_cluster(write(tmp_path, text)).database.password.value == "Mode-Secret-1"


def key_file_problems(tmp_path, key: str, resolve_secrets: bool = True) -> list[str]:
    text = MINIMAL + f"ssh: {{key_file: {key}}}\n"
    try:
        load_cluster(write(tmp_path, text), resolve_secrets=resolve_secrets)
    except ClusterError as e:
        return e.problems
    return []


def test_ssh_key_file_missing_or_open_to_others_is_refused(tmp_path, corpus_env):
    f = f"{tmp_path}/cluster.yaml"
    missing = tmp_path / "no-such-key"
    assert key_file_problems(tmp_path, str(missing)) == [
        f"{f}: ssh.key_file: {missing}: the file does not exist"
    ]
    assert key_file_problems(tmp_path, str(tmp_path)) == [
        f"{f}: ssh.key_file: {tmp_path}: not a regular file"
    ]
    key = tmp_path / "id_ed25519"
    key.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    for mode in (0o644, 0o640, 0o604, 0o610):
        key.chmod(mode)
        assert key_file_problems(tmp_path, str(key)) == [
            f"{f}: ssh.key_file: {key}: the file is readable or writable by group or others "
            f"(mode {mode:04o}): chmod 600 {key}"
        ]
    for mode in (0o600, 0o400):
        key.chmod(mode)
        assert key_file_problems(tmp_path, str(key)) == []
    # `experiment new` and the other readers that resolve no secret never open the file.
    assert key_file_problems(tmp_path, str(missing), resolve_secrets=False) == []
    # A key in the checkout is one `git add` away from leaking, as a TLS key or secret is.
    inside = REPO_ROOT / "pyproject.toml"
    assert key_file_problems(tmp_path, str(inside)) == [
        f"{f}: ssh.key_file: {inside}: the file is inside the repository ({REPO_ROOT}): "
        "keep secrets outside git"
    ]


@pytest.mark.parametrize(
    "value, why",
    [
        ("line\nbreak", "holds a line break inside the secret (only trailing ones are dropped)"),
        ("tab\tinside", "holds a control character (a tab, escape or NUL, ...)"),
        ("\n", "is empty"),
    ],
)
def test_env_secret_content_is_checked(tmp_path, corpus_env, monkeypatch, value, why):
    monkeypatch.setenv("DTTEST_DB_PASSWORD", value)
    with pytest.raises(ClusterError) as e:
        load_cluster(write(tmp_path, MINIMAL))
    assert e.value.problems == [
        f"{tmp_path}/cluster.yaml: database.password: {{env: DTTEST_DB_PASSWORD}}: "
        f"environment variable DTTEST_DB_PASSWORD {why}"
    ]


def test_env_secret_trailing_newline_is_dropped(tmp_path, corpus_env, monkeypatch):
    monkeypatch.setenv("DTTEST_DB_PASSWORD", "env-secret\r\n")
    assert load_cluster(write(tmp_path, MINIMAL)).database.password.value == "env-secret"


def test_unresolved_secrets_for_reference_only_tools(tmp_path, monkeypatch):
    for name in CORPUS_ENV:
        monkeypatch.delenv(name, raising=False)
    c = load_cluster(write(tmp_path, MINIMAL), resolve_secrets=False)
    assert str(c.storage.access_key.reference) == "{env: DTTEST_ACCESS_KEY}"
    with pytest.raises(RuntimeError):
        _ = c.storage.access_key.value


# --- command line ----------------------------------------------------------------------------


def test_check_command_ok(tmp_path, corpus_env, capsys):
    path = write(tmp_path, MINIMAL)
    assert cluster_module.main(["check", str(path)]) == 0
    assert capsys.readouterr().out == f"{path}: ok (2 nodes)\n"


def test_check_command_usage(capsys):
    assert cluster_module.main([]) == 2
    assert "usage: python -m deploy.cluster check FILE" in capsys.readouterr().err


def test_check_command_prints_problems_without_traceback(corpus_env):
    # A real subprocess: exit status and the absence of a traceback are what an operator sees.
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    run = subprocess.run(
        [sys.executable, "-m", "deploy.cluster", "check", "syntax-error.yaml", "slots.yaml"],
        check=False,
        cwd=BROKEN,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2
    expected = expectations(BROKEN / "syntax-error.yaml") + expectations(BROKEN / "slots.yaml")
    note, *problems = run.stderr.splitlines()  # first, the old command's alias note
    assert note.startswith("note: `python -m deploy.cluster check` is an alias")
    assert problems == expected
    assert run.stdout == ""


@pytest.mark.parametrize(
    "value, ok", [("mlx5_0:1,mlx5_1:1", True), ("^mlx5_4", True), ("mlx5_0; rm -rf /", False)]
)
def test_nccl_ib_hca_is_nccls_syntax_or_one_line_naming_it(tmp_path, corpus_env, value, ok):
    text = MINIMAL.replace("network: {", f"network: {{nccl_ib_hca: {json.dumps(value)}, ", 1)
    assert text != MINIMAL
    if ok:
        assert load_cluster(write(tmp_path, text)).network.nccl_ib_hca == value
    else:
        with pytest.raises(ClusterError) as e:
            load_cluster(write(tmp_path, text))
        assert [p for p in e.value.problems if "network.nccl_ib_hca" in p and "like mlx5_0:1" in p], (
            e.value.problems
        )


# --- network.subnet_manager ----------------------------------------------------------------------


def test_subnet_manager_names_a_declared_node(tmp_path, monkeypatch):
    for name in ("DTTEST_ACCESS_KEY", "DTTEST_SECRET_KEY", "DTTEST_DB_PASSWORD", "DTTEST_ADMIN_PASSWORD"):
        monkeypatch.setenv(name, "Passw0rd-Long-Enough")
    assert load_cluster(write(tmp_path, MINIMAL)).network.subnet_manager is None
    with_sm = MINIMAL.replace(
        "ipoib: {subnet: 198.51.100.0/24}}", "ipoib: {subnet: 198.51.100.0/24}, subnet_manager: a1}"
    )
    assert load_cluster(write(tmp_path, with_sm)).network.subnet_manager == "a1"
    path = write(tmp_path, with_sm.replace("subnet_manager: a1", "subnet_manager: a2"))
    with pytest.raises(ClusterError) as err:
        load_cluster(path)
    assert err.value.problems == [
        f"{path}: network.subnet_manager: 'a2': not the hostname of a node under nodes (the node "
        "that runs opensm)"
    ]


@pytest.mark.parametrize(
    ("agent_id", "owned"),
    [
        ("lab-gpu1", True),  # per_node
        ("lab-gpu1-0", True),  # per_domain
        ("lab-gpu1-12", True),
        ("lab-gpu1-", False),
        ("lab-gpu1-x", False),
        ("lab-gpu1-١", False),  # a digit, not an ASCII one: never an index the deploy writes
        ("lab-gpu10", False),
        ("lab-gpu", False),
        ("lab-gpu1-0-0", False),
    ],
)
def test_a_node_owns_its_agents_ids_in_both_layouts(agent_id, owned):
    node = next(n for n in load_cluster(LAB).nodes if n.hostname == "lab-gpu1")
    assert node.owns_agent(agent_id) is owned
