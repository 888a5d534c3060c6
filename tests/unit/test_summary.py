from deploy.summary import rerun_command, summary_lines


def test_rerun_command_replaces_any_limit():
    argv = ["/x/bin/pyinfra", "-y", "--limit", "agents", "inventories/prod.py", "deploy.py"]
    assert rerun_command(argv, "gpu-node2") == (
        "pyinfra -y inventories/prod.py deploy.py --limit gpu-node2")
    assert rerun_command(["pyinfra", "--limit=a", "inv.py", "deploy.py"], "h") == (
        "pyinfra inv.py deploy.py --limit h")


def test_summary_names_each_failed_host_with_reason_and_command():
    lines = summary_lines({"b": "unreachable: SSH connection failed", "a": "failed at 'X'"},
                          ["pyinfra", "inv.py", "deploy.py"])
    assert lines == [
        "--> 2 host(s) failed; the others finished:",
        "    a: failed at 'X'",
        "      re-run: pyinfra inv.py deploy.py --limit a",
        "    b: unreachable: SSH connection failed",
        "      re-run: pyinfra inv.py deploy.py --limit b",
    ]
    assert summary_lines({}, ["pyinfra"]) == []
