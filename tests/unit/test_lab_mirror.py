"""tests/lab/mirror.py and aptrepo.py: the lab mirror's layout, signatures, apt's view of it,
rebuild caching, determinism and the HTTP server's access log."""

from __future__ import annotations

import hashlib
import io
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from deploy.pins import driver_pins
from tests.lab import aptrepo, mirror

needs = pytest.mark.skipif(
    any(shutil.which(t) is None for t in ("gpg", "gpgv", "dpkg-deb", "gcc")),
    reason="needs gpg, gpgv, dpkg-deb and gcc",
)
pytestmark = needs

BASE_URL = "http://10.77.0.1:8077"
DISTROS = ("debian12", "ubuntu2004", "ubuntu2204")
OFED = "MLNX_OFED_LINUX-5.8-3.0.7.0"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("mirror")
    out = io.StringIO()
    rebuilt = mirror.build_mirror(root / "mirror", BASE_URL, root / "gpg", out=out)
    assert rebuilt
    return root, out.getvalue()


def repo(root: Path, distro: str = "debian12") -> Path:
    return root / "mirror" / "cuda" / "repos" / distro / "x86_64"


def extract(deb: Path, dest: Path) -> Path:
    subprocess.run(["dpkg-deb", "-x", str(deb), str(dest)], check=True)
    return dest


def packages(path: Path) -> dict[tuple[str, str], dict[str, str]]:
    out = {}
    for stanza in path.read_text().strip().split("\n\n"):
        fields = {}
        for line in stanza.splitlines():
            if not line.startswith(" "):
                key, _, value = line.partition(": ")
                fields[key] = value
        out[(fields["Package"], fields["Version"])] = fields
    return out


def test_layout_matches_the_vendors(built):
    root, _ = built
    m = root / "mirror"
    for distro in DISTROS:
        r = repo(root, distro)
        for name in (
            "Packages",
            "Packages.gz",
            "Release",
            "InRelease",
            "Release.gpg",
            "cuda-keyring_1.1-1_all.deb",
        ):
            assert (r / name).is_file(), f"{distro}: {name}"
    for d in ("ubuntu20.04", "ubuntu22.04", "debian12"):
        assert (m / "mofed" / f"{OFED}-{d}-x86_64.tgz").is_file()


def test_repo_has_the_pinned_and_trap_versions(built):
    root, _ = built
    index = packages(repo(root) / "Packages")
    want = [
        ("cuda-drivers-515", "515.65.01-1"),
        ("cuda-drivers-515", "515.48.07-1"),
        ("cuda-drivers", "515.65.01-1"),
        ("cuda-drivers", "520.61.05-1"),
        ("cuda-toolkit-11-7", "11.7.1-1"),
        ("cuda-nvcc-11-7", "11.7.99-1"),
        ("cuda-11-7", "11.7.1-1"),
        ("cuda-runtime-11-7", "11.7.1-1"),
        ("libnccl2", "2.14.3-1+cuda11.7"),
        ("libnccl-dev", "2.14.3-1+cuda11.7"),
        ("libnccl2", "2.13.4-1+cuda11.7"),
        ("libnccl-dev", "2.13.4-1+cuda11.7"),
        ("nvidia-container-toolkit", "1.13.5-1"),
        ("nvidia-container-toolkit-base", "1.13.5-1"),
        ("libnvidia-container-tools", "1.13.5-1"),
        ("libnvidia-container1", "1.13.5-1"),
        ("cuda-keyring", "1.1-1"),
    ]
    for sub in (
        "nvidia-driver-515",
        "nvidia-dkms-515",
        "libnvidia-compute-515",
        "nvidia-utils-515",
        "nvidia-kernel-source-515",
        "nvidia-modprobe",
    ):
        want += [(sub, f"{v}-0ubuntu1") for v in ("515.48.07", "515.65.01", "515.86.01", "515.105.01")]
    missing = [w for w in want if w not in index]
    assert not missing
    deps = index[("cuda-drivers-515", "515.65.01-1")]["Depends"]
    assert "nvidia-driver-515 (= 515.65.01-0ubuntu1)" in deps
    assert "nvidia-modprobe (= 515.65.01-0ubuntu1)" in deps
    assert index[("cuda-runtime-11-7", "11.7.1-1")]["Depends"] == "cuda-drivers (>= 515.65.01)"
    assert "cuda-drivers" not in index[("cuda-toolkit-11-7", "11.7.1-1")]["Depends"]


def test_packages_index_matches_files_and_release_matches_index(built):
    root, _ = built
    r = repo(root)
    for fields in packages(r / "Packages").values():
        data = (r / fields["Filename"]).read_bytes()
        assert fields["Filename"].startswith("./")
        assert int(fields["Size"]) == len(data)
        assert fields["SHA256"] == hashlib.sha256(data).hexdigest()
    release = (r / "Release").read_text()
    assert release.startswith("Origin: NVIDIA\nLabel: NVIDIA CUDA\n")
    assert "\nArchitectures: amd64 all\n" in release
    assert "\nDate: " in release
    sha = release.split("SHA256:\n", 1)[1]
    for name in ("Packages", "Packages.gz"):
        data = (r / name).read_bytes()
        assert f" {hashlib.sha256(data).hexdigest()} {len(data):>16} {name}" in sha


def test_signatures_verify_with_the_keyring_the_keyring_package_installs(built, tmp_path):
    root, _ = built
    for distro in DISTROS:
        r = repo(root, distro)
        files = extract(r / "cuda-keyring_1.1-1_all.deb", tmp_path / distro)
        keyring = files / "usr/share/keyrings/cuda-archive-keyring.gpg"
        inrelease = subprocess.run(
            ["gpgv", "--keyring", str(keyring), str(r / "InRelease")], capture_output=True, check=False
        )
        assert inrelease.returncode == 0, inrelease.stderr
        detached = subprocess.run(
            ["gpgv", "--keyring", str(keyring), str(r / "Release.gpg"), str(r / "Release")],
            capture_output=True,
            check=False,
        )
        assert detached.returncode == 0, detached.stderr
        sources = (files / f"etc/apt/sources.list.d/cuda-{distro}-x86_64.list").read_text()
        assert sources == (
            "deb [signed-by=/usr/share/keyrings/cuda-archive-keyring.gpg] "
            f"{BASE_URL}/cuda/repos/{distro}/x86_64/ /\n"
        )
        assert (
            "Pin: release l=NVIDIA CUDA"
            in (files / "etc/apt/preferences.d/cuda-repository-pin-600").read_text()
        )


def test_tampered_release_fails_verification(built, tmp_path):
    root, _ = built
    r = repo(root)
    keyring = tmp_path / "k.gpg"
    keyring.write_bytes(aptrepo.export_public_keyring(root / "gpg"))
    aptrepo.stop_gpg_agent(root / "gpg")
    bad = tmp_path / "InRelease"
    bad.write_text((r / "InRelease").read_text().replace("Label: NVIDIA CUDA", "Label: NVIDIA CUDB"))
    proc = subprocess.run(["gpgv", "--keyring", str(keyring), str(bad)], capture_output=True, check=False)
    assert proc.returncode != 0


def test_non_apt_artifacts_are_listed_with_sha256(built):
    root, printed = built
    m = root / "mirror"
    sums = (m / mirror.SUMS_FILE).read_text()
    assert sums in printed
    listed = {line.split("  ", 1)[1]: line.split("  ", 1)[0] for line in sums.splitlines()}
    for d in ("ubuntu20.04", "ubuntu22.04", "debian12"):
        name = f"mofed/{OFED}-{d}-x86_64.tgz"
        assert listed[name] == hashlib.sha256((m / name).read_bytes()).hexdigest()
    assert "cuda/repos/debian12/x86_64/cuda-keyring_1.1-1_all.deb" in listed
    assert not any(n.endswith(("Packages", "InRelease")) or "libnccl2" in n for n in listed)


def test_unchanged_sources_are_not_rebuilt_and_changes_are(built, tmp_path):
    root, _ = built
    m = root / "mirror"
    before = (m / mirror.SUMS_FILE).read_text()
    out = io.StringIO()
    assert mirror.build_mirror(m, BASE_URL, root / "gpg", out=out) is False
    assert "up to date" in out.getvalue() and before in out.getvalue()
    # A copy with another base URL must rebuild (the keyring's sources.list changes).
    copy = tmp_path / "mirror"
    shutil.copytree(m, copy)
    assert mirror.build_mirror(copy, "http://10.77.0.1:9999", root / "gpg", out=io.StringIO())
    new = dict(line.split("  ")[::-1] for line in (copy / mirror.SUMS_FILE).read_text().splitlines())
    old = dict(line.split("  ")[::-1] for line in before.splitlines())
    key = "cuda/repos/debian12/x86_64/cuda-keyring_1.1-1_all.deb"
    assert new[key] != old[key]
    tgz = f"mofed/{OFED}-debian12-x86_64.tgz"
    assert new[tgz] == old[tgz]  # unaffected by the URL: same bytes
    assert not (tmp_path / "mirror.staging").exists() and not (tmp_path / "mirror.old").exists()


def test_artifacts_are_deterministic_across_builds_and_keys(built, tmp_path):
    root, _ = built
    other = tmp_path / "other"
    mirror.build_mirror(other, BASE_URL, tmp_path / "gpg2", out=io.StringIO())

    def sums(m: Path) -> dict[str, str]:
        return dict(line.split("  ")[::-1] for line in (m / mirror.SUMS_FILE).read_text().splitlines())

    a, b = sums(root / "mirror"), sums(other)
    assert a.keys() == b.keys()
    for name in a:
        # The keyring .deb too: the lab key is committed (tests/lab/aptrepo.py), so it can be pinned.
        assert a[name] == b[name], name
    # The debs in the apt repo are deterministic too; only the signatures differ.
    for deb in repo(root).glob("*.deb"):
        if not deb.name.startswith("cuda-keyring"):
            assert deb.read_bytes() == (other / "cuda/repos/debian12/x86_64" / deb.name).read_bytes()


def test_optional_builders_skip_missing_modules_but_not_broken_ones(tmp_path, monkeypatch):
    pkg = tmp_path / "dtlab_fake_builders"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "good.py").write_text("def build(ctx):\n    ctx.append('good')\n")
    (pkg / "broken.py").write_text("import dtlab_no_such_dependency\n\ndef build(ctx):\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(
        mirror, "OPTIONAL_BUILDERS", ("dtlab_fake_builders.good", "dtlab_fake_builders.absent")
    )
    builders = mirror.optional_builders()
    assert len(builders) == 1
    seen = []
    builders[0](seen)
    assert seen == ["good"]
    monkeypatch.setattr(mirror, "OPTIONAL_BUILDERS", ("dtlab_fake_builders.broken",))
    with pytest.raises(ModuleNotFoundError, match="dtlab_no_such_dependency"):
        mirror.optional_builders()


@pytest.fixture
def server(built):
    root, _ = built
    srv = mirror.make_server(root / "mirror", "127.0.0.1", 0)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}", root / mirror.ACCESS_LOG
    srv.shutdown()
    srv.server_close()


def test_server_serves_files_and_logs_bytes(server, built):
    url, log = server
    root, _ = built
    start = log.read_text().count("\n") if log.exists() else 0
    name = f"/mofed/{OFED}-debian12-x86_64.tgz"
    with urllib.request.urlopen(url + name) as resp:
        body = resp.read()
    assert body == (root / "mirror" / name.lstrip("/")).read_bytes()
    head = urllib.request.Request(url + name, method="HEAD")
    with urllib.request.urlopen(head) as resp:
        assert int(resp.headers["Content-Length"]) == len(body)
        assert resp.read() == b""
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(url + "/no/such/file")
    assert err.value.code == 404
    # The server writes a request's line after the body went out: allow it a moment.
    deadline = time.monotonic() + 5
    while len(log.read_text().splitlines()[start:]) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    lines = log.read_text().splitlines()[start:]
    assert len(lines) == 3
    assert all(line.startswith("127.0.0.1 - - [") for line in lines)
    # In any order: each request's thread logs after its body went out, and on a loaded
    # machine the next request's thread can log first.
    assert sum(line.endswith(f'"GET {name} HTTP/1.1" 200 {len(body)}') for line in lines) == 1
    assert sum(line.endswith(f'"HEAD {name} HTTP/1.1" 200 0') for line in lines) == 1
    assert sum(' "GET /no/such/file HTTP/1.1" 404 ' in line for line in lines) == 1


APT_CONF = """Dir::State "{d}/state";
Dir::State::status "{d}/status";
Dir::Cache "{d}/cache";
Dir::Etc::SourceList "{d}/sources.list";
Dir::Etc::SourceParts "{d}/sources.list.d";
Dir::Etc::Preferences "{d}/preferences";
Dir::Etc::PreferencesParts "{d}/preferences.d";
Dir::Etc::Parts "{d}/apt.conf.d";
Dir::Etc::Trusted "{d}/trusted.gpg";
Dir::Etc::TrustedParts "{d}/trusted.gpg.d";
APT::Architecture "amd64";
APT::Architectures {{ "amd64"; }};
Acquire::http::Proxy "DIRECT";
Acquire::Languages "none";
Debug::NoLocking "true";
APT::Sandbox::User "root";
"""
FAKE_STATUS = (
    "Package: python3\nStatus: install ok installed\nPriority: optional\nSection: python\n"
    "Installed-Size: 1\nMaintainer: t <t@t>\nArchitecture: amd64\nVersion: 3.11.2-1+b1\n"
    "Description: stands for the node's python3\n\n"
)


@pytest.fixture
def apt(server, built, tmp_path):
    """An isolated apt configuration trusting the mirror the way cuda-keyring makes a node do."""
    if shutil.which("apt-get") is None:
        pytest.skip("needs apt-get")
    url, _ = server
    root, _ = built
    d = tmp_path / "apt"
    for sub in (
        "state/lists/partial",
        "cache/archives/partial",
        "sources.list.d",
        "preferences.d",
        "apt.conf.d",
        "trusted.gpg.d",
    ):
        (d / sub).mkdir(parents=True)
    (d / "status").write_text(FAKE_STATUS)
    files = extract(repo(root) / "cuda-keyring_1.1-1_all.deb", tmp_path / "keyring")
    keyring = files / "usr/share/keyrings/cuda-archive-keyring.gpg"
    # The sources line the keyring package installs, with the test server's URL.
    line = (files / "etc/apt/sources.list.d/cuda-debian12-x86_64.list").read_text()
    line = line.replace(BASE_URL, url).replace("/usr/share/keyrings/cuda-archive-keyring.gpg", str(keyring))
    (d / "sources.list").write_text(line)
    (d / "apt.conf").write_text(APT_CONF.format(d=d))
    env = {"APT_CONFIG": str(d / "apt.conf"), "PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"}

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["apt-get", *args], capture_output=True, text=True, env=env, check=False)

    update = run("update")
    assert update.returncode == 0, update.stdout + update.stderr
    assert "W:" not in update.stderr and "E:" not in update.stderr, update.stderr
    run.prefs = d / "preferences"  # type: ignore[attr-defined]
    return run


def installs(proc: subprocess.CompletedProcess) -> dict[str, str]:
    out = {}
    for line in proc.stdout.splitlines():
        if line.startswith("Inst "):
            _, name, rest = line.split(" ", 2)
            out[name] = rest.strip("(").split(" ", 1)[0]
    return out


def test_apt_accepts_the_signed_repo_and_origin_pins_work(apt):
    # The driver's whole package set (deploy/pins.py): with part of it pinned, apt takes the
    # branch's newest build (515.105.01) for the rest, which nvidia-driver-515 cannot use.
    driver = " ".join(p for p, _ in driver_pins("515.65.01").packages)
    apt.prefs.write_text(
        f"Package: cuda-drivers {driver}\n"
        "Pin: version 515.65.01*\nPin-Priority: 1001\n\n"
        "Package: *\nPin: release o=NVIDIA\nPin-Priority: 600\n"
    )
    proc = apt(
        "install",
        "-s",
        "cuda-drivers-515=515.65.01-1",
        "cuda-toolkit-11-7=11.7.1-1",
        "libnccl2=2.14.3-1+cuda11.7",
        "libnccl-dev=2.14.3-1+cuda11.7",
        "nvidia-container-toolkit=1.13.5-1",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    got = installs(proc)
    for sub, version in driver_pins("515.65.01").packages[1:]:
        assert got[sub] == version, sub
    assert got["cuda-nvcc-11-7"] == "11.7.99-1"
    assert got["libnccl2"] == "2.14.3-1+cuda11.7"
    assert "cuda-drivers" not in got  # the toolkit alone pulls no driver
    assert "NVIDIA CUDA" in proc.stdout  # the Release label apt matched


def test_apt_trap_unpinned_cuda_11_7_pulls_the_newest_driver(apt):
    proc = apt("install", "-s", "cuda-11-7")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    got = installs(proc)
    assert got["cuda-drivers"] == "520.61.05-1"
    assert got["nvidia-driver-520"] == "520.61.05-0ubuntu1"


def test_cli_help():
    proc = subprocess.run(
        [sys.executable, "-m", "tests.lab.mirror", "--help"],
        capture_output=True,
        text=True,
        check=False,
        cwd=Path(mirror.__file__).resolve().parents[2],
    )
    assert proc.returncode == 0 and "build" in proc.stdout and "serve" in proc.stdout
