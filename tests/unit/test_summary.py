from deploy.summary import rerun_command, summary_lines


def test_rerun_command_replaces_any_limit():
    argv = ["/x/bin/pyinfra", "-y", "--limit", "agents", "inventories/prod.py", "deploy.py"]
    assert rerun_command(argv, "gpu-node2") == ("pyinfra -y inventories/prod.py deploy.py --limit gpu-node2")
    assert rerun_command(["pyinfra", "--limit=a", "inv.py", "deploy.py"], "h") == (
        "pyinfra inv.py deploy.py --limit h"
    )


def test_summary_names_each_failed_host_with_reason_and_command():
    lines = summary_lines(
        {"b": "unreachable: SSH connection failed", "a": "failed at 'X'"}, ["pyinfra", "inv.py", "deploy.py"]
    )
    assert lines == [
        "--> 2 host(s) failed; the others finished:",
        "    a: failed at 'X'",
        "      re-run: pyinfra inv.py deploy.py --limit a",
        "    b: unreachable: SSH connection failed",
        "      re-run: pyinfra inv.py deploy.py --limit b",
    ]
    assert summary_lines({}, ["pyinfra"]) == []


def test_printed_once_after_the_final_disconnects(capsys):
    from types import SimpleNamespace

    from pyinfra.api.state import StateStage

    from deploy import summary

    class Host(SimpleNamespace):
        __hash__ = object.__hash__

    a, b = Host(name="a"), Host(name="b")
    state = SimpleNamespace(current_stage=StateStage.Execute, activated_hosts={a, b}, failed_hosts={b})
    handler = summary.FailureSummary()
    handler.reasons["b"] = "failed at 'X'"
    handler.host_disconnect(state, b)  # a reboot mid-run
    assert capsys.readouterr().err == ""
    state.current_stage = StateStage.Disconnect
    for host in (a, b, a):
        handler.host_disconnect(state, host)
    err = capsys.readouterr().err
    assert err.count("host(s) failed") == 1
    assert "    b: failed at 'X'" in err


def test_a_lost_connection_is_named_as_such():
    from types import SimpleNamespace

    from deploy import summary

    def host(name, active):
        transport = SimpleNamespace(is_active=lambda: active)
        client = SimpleNamespace(get_transport=lambda: transport)
        return SimpleNamespace(name=name, connector=SimpleNamespace(client=client))

    state = SimpleNamespace(get_op_meta=lambda op_hash: SimpleNamespace(names={"Install X"}))
    handler = summary.FailureSummary()
    handler.operation_host_error(state, host("a", active=False), "op1")
    handler.operation_host_error(state, host("b", active=True), "op1")
    assert handler.reasons == {
        "a": "SSH connection lost at 'Install X'",
        "b": "failed at 'Install X'",
    }
    # Not the SSH connector (@local, docker): never "connection lost".
    assert summary.connection_lost(SimpleNamespace(name="c", connector=SimpleNamespace())) is False


def test_rerun_command_hides_secret_option_values():
    argv = [
        "pyinfra",
        "--password",
        "hunter2",
        "--ssh-key-password=s3cret",
        "--key",
        "/home/me/.ssh/id_ed25519",
        "--data",
        "ssh_password=hunter3",
        "--data=db_token=t0k",
        "--data",
        "ssh_user=ubuntu",
        "inventories/prod.py",
        "deploy.py",
    ]
    line = rerun_command(argv, "gpu-node1")
    for secret in ("hunter2", "s3cret", "hunter3", "t0k"):
        assert secret not in line
    assert line == (
        "pyinfra --password '<hidden>' '--ssh-key-password=<hidden>' --key /home/me/.ssh/id_ed25519 "
        "--data 'ssh_password=<hidden>' '--data=db_token=<hidden>' --data ssh_user=ubuntu "
        "inventories/prod.py deploy.py --limit gpu-node1"
    )
