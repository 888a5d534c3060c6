"""Preflight's decisions for the Ubuntu 20.04 and 22.04 servers the lab cannot boot, from what
their tools print: /etc/os-release (through pyinfra's LinuxDistribution), `uname -r`
(KernelVersion) and `mokutil --sb-state` (SecureBootState); and the database password and
Determined download rules preflight's cluster file must pass."""

import re
import shlex
import subprocess
from pathlib import Path

import pytest
from pyinfra.facts.server import KernelVersion, LinuxDistribution

from deploy.cluster import ClusterError, load_cluster
from deploy.cluster.keys import specs
from deploy.cluster.model import Preflight
from deploy.cluster.rules import DB_PASSWORD_CHARACTERS
from deploy.facts.system import DiskFreeGB, SecureBootState, secure_boot_state
from roles.node.preflight import (
    certified_warning,
    os_label,
    os_problems,
    secure_boot_problem,
    secure_boot_warning,
)
from tests.lab.pins import mirror_paths
from tests.lab.spec import lab_password
from tests.unit.test_cluster import MINIMAL

REPO = Path(__file__).resolve().parents[2]
ALLOWED = dict(specs(Preflight)["allowed_os"].default)
CERTIFIED = specs(Preflight)["certified_kernels"].default

# /etc/os-release and /etc/lsb-release as Ubuntu's base-files ships them (20.04.6, 22.04.4),
# in the shape LinuxDistribution's command prints: file name, content, "---".
OS_RELEASE = {
    "20.04": """\
NAME="Ubuntu"
VERSION="20.04.6 LTS (Focal Fossa)"
ID=ubuntu
ID_LIKE=debian
PRETTY_NAME="Ubuntu 20.04.6 LTS"
VERSION_ID="20.04"
HOME_URL="https://www.ubuntu.com/"
SUPPORT_URL="https://help.ubuntu.com/"
BUG_REPORT_URL="https://bugs.launchpad.net/ubuntu/"
PRIVACY_POLICY_URL="https://www.ubuntu.com/legal/terms-and-policies/privacy-policy"
VERSION_CODENAME=focal
UBUNTU_CODENAME=focal""",
    "22.04": """\
PRETTY_NAME="Ubuntu 22.04.4 LTS"
NAME="Ubuntu"
VERSION_ID="22.04"
VERSION="22.04.4 LTS (Jammy Jellyfish)"
VERSION_CODENAME=jammy
ID=ubuntu
ID_LIKE=debian
HOME_URL="https://www.ubuntu.com/"
SUPPORT_URL="https://help.ubuntu.com/"
BUG_REPORT_URL="https://bugs.launchpad.net/ubuntu/"
PRIVACY_POLICY_URL="https://www.ubuntu.com/legal/terms-and-policies/privacy-policy"
UBUNTU_CODENAME=jammy""",
}
LSB_RELEASE = {
    release: f"DISTRIB_ID=Ubuntu\nDISTRIB_RELEASE={release}\nDISTRIB_CODENAME={code}\n"
    f'DISTRIB_DESCRIPTION="Ubuntu {release}.{point} LTS"'
    for release, code, point in (("20.04", "focal", 6), ("22.04", "jammy", 4))
}


def label_of(release: str) -> str:
    output = f"/etc/lsb-release\n{LSB_RELEASE[release]}\n---\n/etc/os-release\n{OS_RELEASE[release]}\n---\n"
    return os_label(LinuxDistribution().process(output.splitlines()))


def kernel_of(uname_r: str) -> str:
    fact = KernelVersion()
    return fact.process([uname_r]) if hasattr(fact, "process") else uname_r


@pytest.mark.parametrize(
    "release, uname_r",
    [
        ("20.04", "5.4.0-100-generic"),
        ("20.04", "5.4.0-200-generic"),  # a later GA build from unattended-upgrades
        ("22.04", "5.15.0-100-generic"),
        ("22.04", "5.15.0-119-generic"),
    ],
)
def test_default_accepts_each_releases_ga_kernel_series(release, uname_r):
    label = label_of(release)
    assert label == f"Ubuntu {release}"
    assert os_problems(label, kernel_of(uname_r), ALLOWED) == []


@pytest.mark.parametrize(
    "release, uname_r, series",
    [
        # The HWE kernels: MLNX_OFED 5.8's Ubuntu 20.04 build is listed for its GA kernel only.
        ("20.04", "5.15.0-67-generic", "5.4.0-*-generic"),
        ("22.04", "6.5.0-35-generic", "5.15.0-*-generic"),
        # Another flavour of the right series: not the -generic kernel the stack is built for.
        ("22.04", "5.15.0-1056-aws", "5.15.0-*-generic"),
        ("20.04", "5.4.0-100-lowlatency", "5.4.0-*-generic"),
    ],
)
def test_default_refuses_other_series_and_flavours(release, uname_r, series):
    assert os_problems(label_of(release), kernel_of(uname_r), ALLOWED) == [
        f"kernel {uname_r} is not allowed on Ubuntu {release} (allowed: {series})"
    ]


def test_certified_build_is_silent_and_another_build_warns():
    assert certified_warning("5.4.0-100-generic", CERTIFIED) is None
    assert certified_warning("5.15.0-100-generic", CERTIFIED) is None
    warning = certified_warning("5.15.0-119-generic", CERTIFIED)
    assert warning is not None
    assert warning.startswith(
        "kernel 5.15.0-119-generic is not a build this cluster was certified on "
        "(5.4.0-100-generic, 5.15.0-100-generic): deploying anyway"
    )
    assert "preflight.certified_kernels" in warning
    assert certified_warning("5.15.0-119-generic", ()) is None  # [] turns it off
    assert certified_warning("5.15.0-119-generic", ("5.15.0-1*-generic",)) is None


# mokutil --sb-state, as src/mokutil.c (sb_state_internal, main) prints it, stderr folded in.
MOKUTIL = {
    "on": (["SecureBoot enabled"], "enabled"),
    "on, validation off in shim": (
        ["SecureBoot enabled", "SecureBoot validation is disabled in shim"],
        "disabled",
    ),
    "off": (["SecureBoot disabled"], "disabled"),
    "setup mode": (["SecureBoot disabled", "Platform is in Setup Mode"], "disabled"),
    "BIOS boot": (["EFI variables are not supported on this system"], "disabled"),
    "no SecureBoot variable": (["This system doesn't support Secure Boot"], "disabled"),
    "undecided": (["Cannot determine secure boot state."], "unknown"),
    # Without mokutil: the fact's own fallbacks.
    "no mokutil, no EFI": (["dtfact: no EFI"], "disabled"),
    "no mokutil, efivars on": (["dtfact: efivars 1 0"], "enabled"),
    "no mokutil, efivars setup mode": (["dtfact: efivars 1 1"], "disabled"),
    "no mokutil, efivars off": (["dtfact: efivars 0 0"], "disabled"),
    "no mokutil, no SecureBoot variable": (["dtfact: efivars - -"], "unknown"),
}


@pytest.mark.parametrize("case", MOKUTIL, ids=list(MOKUTIL))
def test_secure_boot_state_from_mokutil(case):
    lines, state = MOKUTIL[case]
    assert SecureBootState().process(lines) == (state, "; ".join(lines))


def test_fact_command_reads_efivars_like_mokutil(tmp_path):
    """The fallback's od reads the byte after efivarfs' 4 attribute bytes."""
    command = SecureBootState().command()
    efivars = tmp_path / "efivars"
    efivars.mkdir()
    guid = "8be4df61-93ca-11d2-aa0d-00e098032b8c"
    (efivars / f"SecureBoot-{guid}").write_bytes(b"\x06\x00\x00\x00\x01")
    (efivars / f"SetupMode-{guid}").write_bytes(b"\x06\x00\x00\x00\x00")
    fake = (
        command.replace("command -v mokutil", "command -v no-such-mokutil-dtlab")
        .replace("/sys/firmware/efi/efivars", str(efivars))
        .replace("/sys/firmware/efi", str(tmp_path))
    )
    out = subprocess.run(["sh", "-c", fake], capture_output=True, text=True, check=True).stdout
    assert secure_boot_state(out.splitlines()) == ("enabled", "dtfact: efivars 1 0")


def test_secure_boot_on_is_refused_with_both_ways_out():
    problem = secure_boot_problem("enabled", "SecureBoot enabled", "refuse")
    assert problem is not None
    assert problem.startswith("Secure Boot is on (SecureBoot enabled): ")
    assert "Key was rejected by service" in problem
    assert "turn Secure Boot off in the firmware setup" in problem
    assert "enrol a Machine Owner Key" in problem and "preflight.secure_boot: signed_modules" in problem
    assert secure_boot_problem("enabled", "SecureBoot enabled", "signed_modules") is None
    assert secure_boot_problem("disabled", "SecureBoot disabled", "refuse") is None


def test_unknown_secure_boot_only_warns():
    said = "Cannot determine secure boot state."
    assert secure_boot_problem("unknown", said, "refuse") is None
    warning = secure_boot_warning("unknown", said, "refuse")
    assert warning is not None and warning.startswith(f"Secure Boot state unknown ({said}): if it is on,")
    assert secure_boot_warning("unknown", said, "signed_modules") is None
    assert secure_boot_warning("disabled", "SecureBoot disabled", "refuse") is None


# --- database password: what Determined's master can carry in its URL -------------------------


def _cluster_with_db_password(tmp_path, monkeypatch, password: str):
    # The smallest valid file, as the cluster tests keep it.
    monkeypatch.setenv("DTTEST_ACCESS_KEY", "minio-unit")
    monkeypatch.setenv("DTTEST_SECRET_KEY", "Unit-Secret-9")
    monkeypatch.setenv("DTTEST_ADMIN_PASSWORD", "Unit-Admin-1")
    monkeypatch.setenv("DTTEST_DB_PASSWORD", password)
    path = tmp_path / "cluster.yaml"
    path.write_text(MINIMAL)
    return path


@pytest.mark.parametrize(
    "password",
    [
        "k3/Z9+aQ==",  # openssl rand -base64: '/' ends the authority
        "pass?word1",  # '?' starts the query
        "pass#word1",  # '#' starts the fragment
        "pass%2Fword",  # decoded into another password
        "pass%zzword",  # "invalid URL escape"
        "pass word1",  # net/url: invalid userinfo
        'pass"word1',
        "pass\\word1",
        "passwörd1",
    ],
)
def test_db_password_the_url_cannot_carry_is_refused(tmp_path, monkeypatch, password):
    path = _cluster_with_db_password(tmp_path, monkeypatch, password)
    with pytest.raises(ClusterError) as e:
        load_cluster(path)
    (problem,) = e.value.problems
    assert problem.startswith(f"{path}: database.password: {{env: DTTEST_DB_PASSWORD}}: holds a character")
    assert "openssl rand -hex 24" in problem
    assert password not in problem


@pytest.mark.parametrize("password", ["db'pass:$PATH!(x)*;=@&~1", "a" * 48, "the lab's"])
def test_db_password_the_url_carries_is_allowed(tmp_path, monkeypatch, password):
    if password == "the lab's":
        password = lab_password()  # tests/lab/spec.py ensure_secrets writes these
    cluster = load_cluster(_cluster_with_db_password(tmp_path, monkeypatch, password))
    assert cluster.database.password.value == password


def test_allowed_characters_are_go_userinfo_minus_percent():
    # net/url's validUserinfo: ALPHA DIGIT - . _ : ~ ! $ & ' ( ) * + , ; = % @; '%' is decoded.
    assert set(DB_PASSWORD_CHARACTERS) == set(
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._:~!$&'()*+,;=@"
    )


# --- the Determined download: GitHub's release path, tag v<version> ----------------------------


GITHUB_ASSET = "determined-ai/determined/releases/download/v0.38.0/determined-{kind}_0.38.0_linux_amd64.deb"


def test_prod_template_names_the_real_release_asset():
    text = (REPO / "inventories/prod/cluster.yaml").read_text()
    for kind in ("master", "agent"):
        url = re.search(rf"determined_{kind}:\n    url: (\S+)", text).group(1)
        assert url.format(version="0.38.0") == "https://github.com/" + GITHUB_ASSET.format(kind=kind)


def test_lab_mirror_serves_the_same_path_as_the_release_server():
    paths = mirror_paths(REPO / "inventories/lab/cluster.yaml")
    for kind in ("master", "agent"):
        assert paths[f"determined_{kind}"] == GITHUB_ASSET.format(kind=kind)


def test_the_disk_path_reaches_df_quoted():
    """preflight.disk_path is checked for a safe character set, and quoted where it reaches the
    shell all the same (one rule failing must not be enough)."""
    command = DiskFreeGB().command("/data/my disk;id")
    assert command == "df -Pk -- '/data/my disk;id' | tail -n 1"
    assert shlex.split(command)[:4] == ["df", "-Pk", "--", "/data/my disk;id"]
