"""Task images from a site registry: sources.registry / registry_ca, images.site_ref, what the
master names and the agents pull, Docker's daemon.json merge, and the lab registry's
reproducible image build (tests/lab/registry.py) with its cluster.yaml rewrite."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import tarfile
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from deploy.cluster import ClusterError, images, load_cluster
from deploy.cluster.reader import Reader
from roles.determined import docker, task_images
from roles.determined import master as determined_master
from tests.lab import registry
from tests.unit.test_storage_roles import NASTY, write_cluster
from tests.unit.tls_material import ca_pem

DIGEST = "sha256:" + "7" * 64
GPU = f"determinedai/environments:cuda-11.3-pytorch-1.12-tf-2.11-gpu-748dda4@{DIGEST}"
CPU = f"determinedai/environments:py-3.9-pytorch-1.12-tf-2.11-cpu-748dda4@{DIGEST}"
PEM = ca_pem()
REPO = Path(__file__).resolve().parents[2]


def with_registry(registry):
    return SimpleNamespace(sources=SimpleNamespace(registry=registry))


# --- site_ref -------------------------------------------------------------------------------


def test_site_ref_without_a_registry_is_the_reference():
    assert images.site_ref(with_registry(None), GPU) == GPU
    assert images.site_ref(with_registry(None), "ubuntu:22.04") == "ubuntu:22.04"


@pytest.mark.parametrize(
    "ref, expected",
    [
        # Docker Hub, implied: the path, tag and digest stay.
        (GPU, f"reg.site:5000/{GPU}"),
        (f"docker.io/{GPU}", f"reg.site:5000/{GPU}"),
        # Docker Hub's official images live under library/.
        (f"ubuntu:22.04@{DIGEST}", f"reg.site:5000/library/ubuntu:22.04@{DIGEST}"),
        ("docker.io/ubuntu:22.04", "reg.site:5000/library/ubuntu:22.04"),
        ("index.docker.io/ubuntu", "reg.site:5000/library/ubuntu"),
        # Another registry is replaced, its path kept.
        ("nvcr.io/nvidia/pytorch:24.03-py3", "reg.site:5000/nvidia/pytorch:24.03-py3"),
        ("localhost:5000/team/img@" + DIGEST, f"reg.site:5000/team/img@{DIGEST}"),
        # Already the site's: unchanged.
        (f"reg.site:5000/{GPU}", f"reg.site:5000/{GPU}"),
        # A tag alone (the defaults, unpinned).
        (images.DEFAULT_GPU_IMAGE, f"reg.site:5000/{images.DEFAULT_GPU_IMAGE}"),
    ],
)
def test_site_ref_replaces_the_registry_only(ref, expected):
    assert images.site_ref(with_registry("reg.site:5000"), ref) == expected


def test_registry_of_follows_docker():
    # distribution/reference splitDockerDomain: '.', ':' or localhost make a registry.
    assert images.registry_of("determinedai/environments") == (None, "determinedai/environments")
    assert images.registry_of("10.77.0.1:5000/a/b") == ("10.77.0.1:5000", "a/b")
    assert images.registry_of("localhost/a") == ("localhost", "a")
    assert images.registry_of("ubuntu") == (None, "ubuntu")


# --- sources.registry, sources.registry_ca --------------------------------------------------


def check(fn, value, resolve=True):
    r = Reader("f", resolve_secrets=resolve)
    return fn(r, "sources.x", value), r.problems


@pytest.mark.parametrize(
    "value",
    ["registry.example.com", "registry.example.com:5000", "10.77.0.1:5000", "localhost", "mirror:443"],
)
def test_registry_host_accepts(value):
    assert check(images.registry_host, value) == (value, [])


@pytest.mark.parametrize(
    "value, what",
    [
        ("https://reg.example.com", "no scheme"),
        ("reg.example.com/path", "(nothing else)"),
        ("user@reg.example.com", "(nothing else)"),
        ("reg.example.com:0", "port must be from 1 to 65535"),
        ("reg.example.com:", "(nothing else)"),
        ("[::1]:5000", "(nothing else)"),
        ("999.1.1.1", "neither a hostname nor an IPv4 address"),
        ("mirror", "Docker Hub namespace"),
        ("reg example.com", "(nothing else)"),
        ("reg.example.com\n", "(nothing else)"),
        ("-reg.example.com", "(nothing else)"),
        (5000, "(nothing else)"),
    ],
)
def test_registry_host_refuses_with_one_line(value, what):
    result, problems = check(images.registry_host, value)
    assert result is None and len(problems) == 1 and what in problems[0]
    assert "\n" not in problems[0]


def test_registry_ca_file(tmp_path):
    ca = tmp_path / "ca.crt"
    ca.write_text(PEM)
    assert check(images.registry_ca_file, str(ca)) == (str(ca), [])
    # Not a secret: a world-readable CA is fine.
    ca.chmod(0o644)
    assert check(images.registry_ca_file, str(ca))[1] == []
    for value, what in [
        (str(tmp_path / "none.crt"), "does not exist"),
        (str(tmp_path), "not a regular file"),
        ("ca.crt", "absolute path"),
        (" /ca.crt", "absolute path"),
    ]:
        assert what in check(images.registry_ca_file, value)[1][0]
    (tmp_path / "key.pem").write_text("-----BEGIN PRIVATE KEY-----\n")
    assert "not a PEM certificate" in check(images.registry_ca_file, str(tmp_path / "key.pem"))[1][0]
    # The CA's key beside its certificate would be copied to every agent, readable by all.
    (tmp_path / "with-key.pem").write_text(
        PEM + "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"
    )
    (problem,) = check(images.registry_ca_file, str(tmp_path / "with-key.pem"))[1]
    assert "holds a PRIVATE KEY block: only CERTIFICATE blocks belong here" in problem, problem
    (tmp_path / "broken.pem").write_text(
        "-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n"
    )
    assert "not a CA certificate in PEM" in check(images.registry_ca_file, str(tmp_path / "broken.pem"))[1][0]
    # Read only when secrets are resolved (the lab's CA exists only once the lab is built).
    assert check(images.registry_ca_file, str(tmp_path / "none.crt"), resolve=False) == (
        str(tmp_path / "none.crt"),
        [],
    )


def cluster_from(tmp_path, monkeypatch, **sources):
    for key, value in NASTY.items():
        monkeypatch.setenv(key, value)
    path = write_cluster(tmp_path)
    doc = yaml.safe_load(path.read_text())
    doc["sources"].update(sources)
    doc["determined"]["task_image"] = {"gpu": GPU, "cpu": CPU}
    path.write_text(yaml.safe_dump(doc))
    return load_cluster(path)


def test_a_ca_needs_its_registry(tmp_path, monkeypatch):
    ca = tmp_path / "ca.crt"
    ca.write_text(PEM)
    with pytest.raises(ClusterError) as e:
        cluster_from(tmp_path, monkeypatch, registry_ca=str(ca))
    assert [p.split(": ", 1)[1] for p in e.value.problems] == [
        f"sources.registry_ca: '{ca}': a CA without sources.registry: name it"
    ]


def test_master_names_and_agents_pull_the_site_references(tmp_path, monkeypatch):
    ca = tmp_path / "ca.crt"
    ca.write_text(PEM)
    cluster = cluster_from(tmp_path, monkeypatch, registry="reg.site:5000", registry_ca=str(ca))
    tcd = yaml.safe_load(determined_master.master_yaml(cluster))["task_container_defaults"]
    assert tcd["image"] == {"cuda": f"reg.site:5000/{GPU}", "cpu": f"reg.site:5000/{CPU}"}
    assert task_images.pulled(cluster) == [f"reg.site:5000/{GPU}", f"reg.site:5000/{CPU}"]


def test_without_a_registry_the_references_are_cluster_yamls(tmp_path, monkeypatch):
    cluster = cluster_from(tmp_path, monkeypatch)
    tcd = yaml.safe_load(determined_master.master_yaml(cluster))["task_container_defaults"]
    assert tcd["image"] == {"cuda": GPU, "cpu": CPU}
    assert task_images.pulled(cluster) == [GPU, CPU]


def test_one_image_for_both_is_pulled_once():
    assert images.TaskRefs(gpu=GPU, cpu=GPU).pulled == (GPU,)
    assert task_images.pulled(SimpleNamespace(task_refs=images.TaskRefs(gpu=GPU, cpu=GPU))) == [GPU]
    assert images.TaskRefs(gpu=GPU, cpu=CPU).pulled == (GPU, CPU)  # the GPU image first


# --- daemon.json ----------------------------------------------------------------------------

# What `nvidia-ctk runtime configure --runtime=docker` writes into an empty daemon.json.
NVIDIA_CTK = """{
    "runtimes": {
        "nvidia": {
            "args": [],
            "path": "nvidia-container-runtime"
        }
    }
}""".splitlines()
MEMLOCK = {"Name": "memlock", "Hard": -1, "Soft": -1}
UNLIMITED = docker.daemon_settings(-1)


def merged(lines):
    return docker.merged(lines, UNLIMITED)


def test_daemon_json_gets_memlock_and_keeps_the_runtime():
    first = merged(NVIDIA_CTK)
    assert first is not None
    config = json.loads(first)
    assert config["runtimes"]["nvidia"]["path"] == "nvidia-container-runtime"
    assert config["default-ulimits"] == {"memlock": MEMLOCK}
    # A second deploy changes nothing; nvidia-ctk still sees its runtime.
    assert merged(first.splitlines()) is None
    assert docker.runtimes(first.splitlines()) == {"nvidia"}


def test_daemon_json_keeps_other_settings_and_ulimits():
    lines = json.dumps(
        {
            "log-driver": "journald",
            "default-ulimits": {"nofile": {"Name": "nofile", "Hard": 65536, "Soft": 65536}},
        }
    ).splitlines()
    config = json.loads(merged(lines) or "")
    assert config["log-driver"] == "journald"
    assert config["default-ulimits"]["nofile"]["Hard"] == 65536
    assert config["default-ulimits"]["memlock"] == MEMLOCK


def test_daemon_json_replaces_a_finite_memlock_and_starts_from_nothing():
    lines = ['{"default-ulimits": {"memlock": {"Name": "memlock", "Hard": 65536, "Soft": 65536}}}']
    assert json.loads(merged(lines) or "")["default-ulimits"]["memlock"] == MEMLOCK
    assert json.loads(merged(None) or "") == {"default-ulimits": {"memlock": MEMLOCK}}
    assert json.loads(merged([]) or "") == {"default-ulimits": {"memlock": MEMLOCK}}


@pytest.mark.parametrize("lines", [["{not json"], ["[1, 2]"]])
def test_daemon_json_that_is_no_object_is_refused(lines):
    with pytest.raises(ValueError):
        merged(lines)


# --- the lab registry's images --------------------------------------------------------------


@pytest.fixture
def layers_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(registry, "LAYERS", tmp_path / "layers")
    return tmp_path / "layers"


def small_rootfs(root: Path, mtime: int) -> Path:
    (root / "usr/bin").mkdir(parents=True)
    (root / "etc").mkdir()
    (root / "dev").mkdir()
    (root / "usr/bin/python3").write_text("#!/bin/sh\n")
    (root / "usr/bin/python3").chmod(0o755)
    (root / "etc/os-release").write_text("ID=debian\n")
    os.link(root / "etc/os-release", root / "usr/os-release")
    (root / "bin").symlink_to("usr/bin")
    (root / "dev/null-ish").write_text("left out")
    for path in [*root.rglob("*"), root]:
        os.utime(path, (mtime, mtime), follow_symlinks=False)
    return root


def test_layer_build_is_reproducible(tmp_path, layers_dir):
    one = small_rootfs(tmp_path / "one", 1_700_000_000)
    two = small_rootfs(tmp_path / "two", 1_800_000_000)  # other mtimes, same content
    a = registry.write_layer("a", registry.fill_rootfs(one))
    b = registry.write_layer("b", registry.fill_rootfs(two))
    assert (a.digest, a.diff_id, a.size) == (b.digest, b.diff_id, b.size)
    data = a.path.read_bytes()
    assert a.digest == "sha256:" + hashlib.sha256(data).hexdigest()
    assert a.diff_id == "sha256:" + hashlib.sha256(gzip.decompress(data)).hexdigest()
    with tarfile.open(a.path) as tar:
        members = {m.name: m for m in tar.getmembers()}
    assert "dev" in members and "dev/null-ish" not in members
    assert members["bin"].issym() and members["bin"].linkname == "usr/bin"
    assert members["usr/os-release"].islnk() or members["etc/os-release"].islnk()
    assert {m.mtime for m in members.values()} == {0} and {m.uname for m in members.values()} == {""}
    # Cached: the same key gives the same layer without building.
    assert registry.write_layer("a", lambda tar: pytest.fail("rebuilt")) == a
    # Other content, another digest.
    (two / "etc/os-release").write_text("ID=ubuntu\n")
    assert registry.write_layer("c", registry.fill_rootfs(two)).digest != a.digest


def test_rootfs_key_follows_the_files(tmp_path):
    root = small_rootfs(tmp_path / "r", 1_700_000_000)
    key = registry.rootfs_key(root)
    assert registry.rootfs_key(root) == key
    (root / "etc/os-release").write_text("ID=ubuntu\n")
    assert registry.rootfs_key(root) != key


def wheel(path: Path, files: dict[str, str]) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
    return path


def test_wheels_unpack_into_site_packages(tmp_path, layers_dir):
    w = wheel(
        tmp_path / "jp-1.0-py3-none-any.whl",
        {
            "jp/__init__.py": "",
            "jp-1.0.data/scripts/jp.py": "cli",
            "jp-1.0.data/data/share/man/man1/jp.1": "man",  # fonttools' shape
            "jp-1.0.dist-info/METADATA": "m",
        },
    )
    layer = registry.write_layer("w", registry.fill_wheels([w]))
    with tarfile.open(layer.path) as tar:
        names = tar.getnames()
    site = registry.SITE_PACKAGES
    assert f"{site}/jp/__init__.py" in names and f"{site}/jp-1.0.dist-info/METADATA" in names
    assert not any("scripts" in n for n in names)
    assert f"{registry.DATA_PREFIX}/share/man/man1/jp.1" in names
    assert "usr" in names and names.index("usr") < names.index(f"{site}/jp/__init__.py")
    again = registry.write_layer("w2", registry.fill_wheels([w]))
    assert again.digest == layer.digest


def test_manifest_and_config_are_reproducible(tmp_path, layers_dir):
    layer = registry.write_layer("a", registry.fill_rootfs(small_rootfs(tmp_path / "r", 1)))
    gpu, cpu, ngc = registry.IMAGES
    config = registry.image_config(gpu, [layer, layer])
    assert config == registry.image_config(gpu, [layer, layer])
    doc = json.loads(registry.manifest(config, [layer, layer]))
    assert doc["mediaType"] == registry.MANIFEST_TYPE and doc["schemaVersion"] == 2
    assert doc["config"]["digest"] == "sha256:" + hashlib.sha256(config).hexdigest()
    env = json.loads(config)["config"]["Env"]
    assert any(e.startswith("NVIDIA_REQUIRE_CUDA=cuda>=11.3 ") for e in env)
    assert not any(
        e.startswith("NVIDIA_") for e in json.loads(registry.image_config(cpu, [layer]))["config"]["Env"]
    )
    assert registry.image_config(ngc, [layer]) != registry.image_config(gpu, [layer])


def test_the_lab_cluster_names_the_lab_images():
    raw = yaml.safe_load((REPO / "inventories/lab/cluster.yaml").read_text())
    assert raw["sources"]["registry"] == registry.HOST
    assert raw["sources"]["registry_ca"] == str(registry.CA_CRT)
    lab_refs = {i.ref for i in registry.IMAGES}
    for key in ("gpu", "cpu"):
        assert raw["determined"]["task_image"][key].split("@")[0] in lab_refs


LAB_YAML = """\
determined:
  version: 0.38.0
  task_image:
    # a comment
    gpu: determinedai/environments:cuda-11.3-pytorch-1.12-tf-2.11-gpu-748dda4@sha256:OLD
    cpu: ubuntu:22.04@sha256:MINE

hardware:
    gpu: determinedai/environments:cuda-11.3-pytorch-1.12-tf-2.11-gpu-748dda4@sha256:OLD
"""


def test_lab_up_rewrites_only_the_task_image_lines():
    pinned = {
        "determinedai/environments:cuda-11.3-pytorch-1.12-tf-2.11-gpu-748dda4": (
            "determinedai/environments:cuda-11.3-pytorch-1.12-tf-2.11-gpu-748dda4@sha256:NEW"
        )
    }
    text, changed = registry.rewrite_task_images(LAB_YAML, pinned)
    assert changed == ["gpu"]
    assert text == LAB_YAML.replace("OLD", "NEW", 1)
    assert registry.rewrite_task_images(text, pinned) == (text, [])
    assert registry.rewrite_task_images("determined: {}\n", pinned) == ("determined: {}\n", [])


def test_the_layer_stream_hashes_what_it_writes():
    out = io.BytesIO()
    stream = registry._Hashing(out)
    stream.write(b"abc")
    assert stream.size == 3 and stream.digest == "sha256:" + hashlib.sha256(b"abc").hexdigest()


def test_daemon_json_memlock_follows_cluster_yaml():
    assert docker.daemon_settings() == {"default-ulimits": {"memlock": MEMLOCK}}
    finite = docker.daemon_settings(8388608)
    first = docker.merged(NVIDIA_CTK, finite) or ""
    assert json.loads(first)["default-ulimits"]["memlock"] == {
        "Name": "memlock",
        "Hard": 8388608,
        "Soft": 8388608,
    }
    assert docker.merged(first.splitlines(), finite) is None
    # Back to unlimited: rewritten.
    assert (
        json.loads(docker.merged(first.splitlines(), UNLIMITED) or "")["default-ulimits"]["memlock"]
        == MEMLOCK
    )


@pytest.mark.parametrize(
    "value, ok",
    [
        (-1, True),
        (65536, True),
        (8388608, True),
        (0, False),
        (-2, False),
        (4096, False),
        ("unlimited", False),
        (True, False),
    ],
)
def test_memlock_key(value, ok):
    result, problems = check(images.memlock, value)
    assert (result == value and problems == []) if ok else (result is None and len(problems) == 1)


def test_the_images_wheels_are_determineds_whole_requirement_closure():
    """Every wheel pinned for the task images is `determined` 0.38.0 or something it Requires
    (transitively, by the wheels' own METADATA as pip reads it, environment markers evaluated for
    Linux CPython 3.11), and nothing it Requires is missing: the set is pip's resolution, not a
    hand-picked subset. Read from the wheels themselves, fetched into the lab's cache."""
    from packaging.markers import default_environment
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    from tests.lab.task_wheels import WHEELS_PINNED

    assert set(WHEELS_PINNED) == set(registry.WHEELS_PINNED)
    paths = registry.fetch_wheels()  # the lab's cache (pip download, sha256-checked) once
    env = {**default_environment(), "python_version": "3.11", "sys_platform": "linux"}
    requires: dict[str, list[Requirement]] = {}
    versions: dict[str, str] = {}
    for p in paths:
        with zipfile.ZipFile(p) as z:
            meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
            text = z.read(meta).decode()
        fields = [line.split(": ", 1) for line in text.split("\n\n")[0].splitlines() if ": " in line]
        name = canonicalize_name(next(v for k, v in fields if k == "Name"))
        versions[name] = next(v for k, v in fields if k == "Version")
        requires[name] = [Requirement(v) for k, v in fields if k == "Requires-Dist"]
    seen, todo = set(), [(canonicalize_name("determined"), frozenset())]
    while todo:
        name, extras = todo.pop()
        assert name in versions, f"{name} is required but not pinned"
        if (name, extras) in seen:
            continue
        seen.add((name, extras))
        for req in requires[name]:
            wanted = [{**env, "extra": e} for e in extras] or [{**env, "extra": ""}]
            if req.marker is None or any(req.marker.evaluate(w) for w in wanted):
                dep = canonicalize_name(req.name)
                assert dep in versions, f"{name} Requires {req}: not pinned"
                assert req.specifier.contains(versions[dep], prereleases=True), (
                    name,
                    str(req),
                    versions[dep],
                )
                todo.append((dep, frozenset(req.extras)))
    assert {n for n, _ in seen} == set(versions), set(versions) - {n for n, _ in seen}
    assert versions["determined"] == "0.38.0"
