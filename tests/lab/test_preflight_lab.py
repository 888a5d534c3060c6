"""Preflight on the lab: Secure Boot refuses one node only; the kernel warning is visible."""

import json

from .standins.mokutil import SETTING

WAYS_OUT = "turn Secure Boot off in the firmware setup, or enrol a Machine Owner Key"


def _failed_hosts(run) -> set[str]:
    """Hosts pyinfra failed, from --json's per-operation error lists."""
    return {h for op in run.results.get("operations", []) for h in op.get("error", [])}


def test_secure_boot_on_refuses_only_that_node(deployed, deploy, lab_ssh, lab):
    node = lab.agents[0].hostname
    others = [n.hostname for n in lab.nodes if n.hostname != node]
    assert lab_ssh(node, "mokutil --sb-state").stdout.strip() == "SecureBoot disabled"
    lab_ssh(node, f"mkdir -p /etc/dtlab && echo enabled > /{SETTING}")
    try:
        assert lab_ssh(node, "mokutil --sb-state").stdout.strip() == "SecureBoot enabled"
        run = deploy()
        output = run.stdout + run.stderr
        assert run.returncode != 0
        assert f"preflight failed on {node}: Secure Boot is on (SecureBoot enabled)" in output
        assert WAYS_OUT in output and "preflight.secure_boot: signed_modules" in output
        for other in others:
            assert f"preflight failed on {other}" not in output
        assert _failed_hosts(run) == {node}, json.dumps(run.results.get("totals"))
        # The lab's kernel is not a certified build: every node says so, and goes on.
        assert "is not a build this cluster was certified on" in run.stderr
    finally:
        lab_ssh(node, f"rm -f /{SETTING}")
    again = deploy(limit=node)
    assert again.returncode == 0, again.stderr[-3000:]
