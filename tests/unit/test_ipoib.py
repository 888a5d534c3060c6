"""The IPoIB role's decisions and files for the Ubuntu paths the Debian lab cannot boot.

The netplan file is checked as netplan reads it: YAML, the keys of an `ethernets:` entry that
netplan's parser knows (src/parse.c of the release the node ships; an unknown key makes
`netplan generate` fail with "unknown key"), and the feature flags `netplan info --json`
reports (each release's `netplan-feature:` markers in src/).
"""

import ipaddress
from types import SimpleNamespace

import pytest
import yaml

from deploy.facts.system import ManagedFiles, NetLinkTypes, NetplanFeatures
from roles.fabric.ipoib import (
    ARPHRD_INFINIBAND,
    HEADER,
    ib_mode,
    ifupdown_stanza,
    missing_message,
    netplan_doc,
    netplan_path,
)

# `netplan info --json` features of netplan 0.104 (Ubuntu 22.04's release version) and 0.106
# (Debian 12; Ubuntu 22.04's updates), from the `netplan-feature:` markers at those tags.
FEATURES_0_104 = [
    "activation-mode", "auth-phase2", "dbus-config", "default-routes", "dhcp-use-domains",
    "eswitch-mode", "generate-just-in-time", "generated-supplicant", "ipv6-mtu", "modems",
    "openvswitch", "sriov",
]  # fmt: skip
FEATURES_0_106 = sorted([*FEATURES_0_104, "infiniband", "regdom", "vrf", "vxlan"])
# Keys of an ethernets entry in netplan 0.104's parser (COMMON_LINK_HANDLERS and the physical
# ones) that this role writes; infiniband-mode joined them in 0.105 (canonical/netplan#283).
KEYS_0_104 = {"renderer", "dhcp4", "dhcp6", "addresses", "mtu"}
KEYS_0_106 = KEYS_0_104 | {"infiniband-mode"}

ETHER = 1  # ARPHRD_ETHER: the lab's veth stand-in


def _cluster(mode="datagram"):
    return SimpleNamespace(network=SimpleNamespace(ipoib=SimpleNamespace(mode=mode)))


def _read(doc: str, interface: str) -> dict:
    """The entry netplan builds for `interface` from the file."""
    parsed = yaml.safe_load(doc)
    assert parsed["network"]["version"] == 2
    assert list(parsed["network"]["ethernets"]) == [interface]
    return parsed["network"]["ethernets"][interface]


@pytest.mark.parametrize(
    "release, features, keys",
    [
        ("Ubuntu 20.04/22.04, netplan 0.104", FEATURES_0_104, KEYS_0_104),
        ("netplan 0.106", FEATURES_0_106, KEYS_0_106),
    ],
)
@pytest.mark.parametrize("link_type", [ARPHRD_INFINIBAND, ETHER])
def test_netplan_file_holds_only_keys_the_release_knows(release, features, keys, link_type):
    mode = ib_mode(_cluster("connected"), link_type, features)
    entry = _read(netplan_doc("ibp65s0", "10.10.1.11/24", 65520, mode), "ibp65s0")
    assert set(entry) <= keys, release
    assert entry["renderer"] == "networkd"
    assert entry["dhcp4"] is False and entry["dhcp6"] is False
    assert entry["addresses"] == ["10.10.1.11/24"]
    assert entry["mtu"] == 65520
    wanted = "connected" if link_type == ARPHRD_INFINIBAND and "infiniband" in features else None
    assert entry.get("infiniband-mode") == wanted


def test_netplan_reads_a_numeric_looking_name_as_the_name():
    # YAML 1.1 would read an unquoted 1234 as an integer; netplan's parser reads scalars, but
    # the quoted key keeps any YAML reader honest.
    assert list(yaml.safe_load(netplan_doc("1234", "10.0.0.1/24", 2044, None))["network"]["ethernets"]) == [
        "1234"
    ]


def test_netplan_file_name_sorts_after_the_installers():
    # Ubuntu's installer writes 00-installer-config.yaml / 50-cloud-init.yaml; later files win.
    assert netplan_path("ib0") == "/etc/netplan/60-gpu-cluster-ib0.yaml"


def test_ifupdown_sets_the_mode_only_on_infiniband():
    ib = ifupdown_stanza("ib0", "10.1.0.11/24", 2044, ib_mode(_cluster(), ARPHRD_INFINIBAND, None))
    assert ib.splitlines()[1:] == [
        "auto ib0",
        "iface ib0 inet static",
        "    address 10.1.0.11/24",
        "    mtu 2044",
        "    # The IPoIB driver's mode file (Documentation/infiniband/ipoib.rst), set before the MTU.",
        "    pre-up echo datagram > /sys/class/net/ib0/mode",
    ]
    veth = ifupdown_stanza("ib0", "10.1.0.11/24", 2044, ib_mode(_cluster(), ETHER, None))
    assert "mode" not in veth and veth.endswith("    mtu 2044\n")


def _node(interface="ib0"):
    return SimpleNamespace(
        hostname="gpu-node1", ipoib_interface=interface, ipoib_address=ipaddress.ip_address("10.10.1.11")
    )


def test_missing_interface_names_node_wanted_and_found():
    message = missing_message(_node(), {"lo": 772, "eno1": ETHER, "ibp65s0": 32, "ibp75s0": 32})
    assert message == (
        "gpu-node1: IPoIB interface ib0 not found; InfiniBand interfaces on this node "
        "(/sys/class/net/*/type 32): ibp65s0, ibp75s0; name the right one in cluster.yaml as "
        "ipoib_interface of node gpu-node1"
    )


def test_missing_interface_without_any_infiniband_link_asks_for_the_driver():
    assert "none (is the ib_ipoib module loaded?" in missing_message(_node(), {"lo": 772, "eno1": ETHER})


def test_every_file_starts_with_the_header_stale_files_are_found_by():
    for text in (
        netplan_doc("ib0", "10.0.0.1/24", 2044, None),
        ifupdown_stanza("ib0", "10.0.0.1/24", 2044, None),
    ):
        assert text.splitlines()[0] == HEADER
    assert ManagedFiles().process(["/etc/netplan/60-gpu-cluster-ib0.yaml", ""]) == [
        "/etc/netplan/60-gpu-cluster-ib0.yaml"
    ]


def test_link_types_from_sys_class_net():
    assert NetLinkTypes().process(["lo 772", "eth0 1", "ibp65s0 32", "garbage"]) == {
        "lo": 772,
        "eth0": 1,
        "ibp65s0": 32,
    }


def test_netplan_features_from_netplan_info():
    out = ["netplan", "{", '  "netplan.io": {', '    "website": "https://netplan.io/",']
    out += ['    "features": ["sriov", "infiniband"]', "  }", "}"]
    assert NetplanFeatures().process(out) == ["infiniband", "sriov"]
    assert NetplanFeatures().process(["netplan"]) == []  # netplan without `info --json`
    assert NetplanFeatures().process([]) is None  # no netplan: ifupdown


def _load(tmp_path, monkeypatch, text):
    from deploy.cluster import load_cluster
    from tests.unit.test_cluster import MINIMAL, write

    for name in ("DTTEST_ACCESS_KEY", "DTTEST_SECRET_KEY", "DTTEST_DB_PASSWORD", "DTTEST_ADMIN_PASSWORD"):
        monkeypatch.setenv(name, "Corpus-Secret-Value-9")
    return load_cluster(write(tmp_path, MINIMAL.replace(*text)))


def test_node_interface_defaults_to_the_clusters_and_can_be_named(tmp_path, monkeypatch):
    c = _load(
        tmp_path,
        monkeypatch,
        ("ipoib_address: 198.51.100.11,", "ipoib_address: 198.51.100.11, ipoib_interface: ibp65s0,"),
    )
    assert [(n.hostname, n.ipoib_interface) for n in c.nodes] == [("m1", "ib0"), ("a1", "ibp65s0")]
    # Each node's name on the IPoIB network (every /etc/hosts, storage.endpoint_url, verify).
    assert [n.ipoib_name for n in c.nodes] == ["m1-ib0", "a1-ibp65s0"]
    assert c.network.ipoib.mode == "datagram"


def test_endpoint_may_name_the_storage_node_by_its_own_ipoib_name(tmp_path, monkeypatch):
    c = _load(
        tmp_path,
        monkeypatch,
        ("ipoib_address: 198.51.100.10}", "ipoib_address: 198.51.100.10, ipoib_interface: ibp65s0}"),
    )
    assert c.storage_node.ipoib_interface == "ibp65s0"
    text = (
        (tmp_path / "cluster.yaml")
        .read_text()
        .replace("storage: {", "storage: {endpoint_url: 'http://m1-ibp65s0:9000', ")
    )
    (tmp_path / "cluster.yaml").write_text(text)
    from deploy.cluster import load_cluster

    assert load_cluster(tmp_path / "cluster.yaml").storage.endpoint_url == "http://m1-ibp65s0:9000"


def test_connected_mode_carries_the_large_mtu(tmp_path, monkeypatch):
    c = _load(
        tmp_path,
        monkeypatch,
        ("subnet: 198.51.100.0/24}", "subnet: 198.51.100.0/24, mtu: 65520, mode: connected}"),
    )
    assert (c.network.ipoib.mtu, c.network.ipoib.mode) == (65520, "connected")
