"""The node base on the lab: preflight, /etc/hosts, IPoIB, firewall, idempotency."""

import time

from deploy.iptables import foreign_rules

from .conftest import run_verify
from .paths import LOGS


def test_full_deploy_then_verify_green(deployed):
    verify = run_verify("-n", "4")
    assert verify.returncode == 0, verify.stdout[-6000:]


def test_second_deploy_changes_nothing(deployed, deploy):
    again = deploy()
    assert again.returncode == 0, again.stderr[-4000:]
    assert again.results["totals"]["success"] == 0, again.changed_operations()
    assert again.results["totals"]["error"] == 0


def test_hosts_lines_outside_the_block_survive(deployed, deploy, lab_ssh, lab):
    node = lab.agents[1]
    lab_ssh(node.hostname, "echo '192.0.2.99 printer.example' >> /etc/hosts")
    run = deploy(limit=node.hostname)
    assert run.returncode == 0, run.stderr[-3000:]
    hosts = lab_ssh(node.hostname, "cat /etc/hosts").stdout
    assert "192.0.2.99 printer.example" in hosts
    assert f"{node.address}\t{node.hostname}" in hosts


def test_firewall_cleared_and_stays_clear_after_reboot(deployed, deploy, lab_ssh, lab):
    node = lab.agents[-1].hostname
    lab_ssh(
        node,
        "DEBIAN_FRONTEND=noninteractive apt-get install -y -q ufw && ufw allow 22/tcp && ufw --force enable",
    )
    assert int(lab_ssh(node, "iptables -S | wc -l").stdout) > 3
    run = deploy(limit=node)
    assert run.returncode == 0, run.stderr[-3000:]
    assert foreign_rules(lab_ssh(node, "iptables-save").stdout.splitlines()) == []
    # A reboot must rebuild ib0 from the node's own config (the lab wipes it like a real one).
    before = lab_ssh(node, "cat /proc/sys/kernel/random/boot_id").stdout
    lab_ssh(node, "systemctl reboot", check=False)
    deadline = time.monotonic() + 180
    probe = None
    while time.monotonic() < deadline:
        probe = lab_ssh(
            node,
            "timeout 30 systemctl is-system-running --wait; cat /proc/sys/kernel/random/boot_id",
            check=False,
            timeout=60,
        )
        if probe.returncode == 0 and probe.stdout and before not in probe.stdout:
            break
        time.sleep(2)
    else:
        console = (LOGS / f"{node}.console.log").read_text(errors="replace")[-3000:]
        raise AssertionError(
            f"{node} did not come back from its reboot: last probe "
            f"{probe.returncode if probe else '-'} {probe.stderr if probe else ''}"
            f"\n--- console ---\n{console}"
        )
    for tool in ("iptables", "ip6tables"):
        assert foreign_rules(lab_ssh(node, f"{tool}-save").stdout.splitlines()) == []
    ib0 = lab_ssh(node, "ip -br addr show ib0").stdout.split()
    assert ib0[1] == "UP" and ib0[2] == f"{lab.node(node).ipoib_address}/24"


def test_preflight_names_the_process_on_the_master_port(deployed, deploy, lab_ssh, lab):
    port = lab.master_port
    master = lab.master_node.hostname
    lab_ssh(
        master,
        "systemctl stop determined-master 2>/dev/null; "
        f"systemd-run --unit=slurmctld python3 -m http.server {port}",
    )
    try:
        time.sleep(1)
        run = deploy(limit=master)
        output = run.stdout + run.stderr
        assert run.returncode != 0
        assert f"port {port} is already in use by python3" in output
        assert "unit slurmctld.service" in output
    finally:
        lab_ssh(master, "systemctl stop slurmctld", check=False)
    run = deploy(limit=master)
    assert run.returncode == 0, run.stderr[-3000:]
