"""The spine: site.yml deploys sglang.service onto a fresh systemd test node over SSH.

testinfra reads the node's real state; idempotence is read from ansible-runner's stats. (That
the node serves again after a reboot, without Ansible, is test_faults.py's reboot test.)
"""

import json

import expected

SERVICE = "sglang.service"


def _main_pid(host):
    return int(host.check_output(f"systemctl show --property=MainPID --value {SERVICE}"))


def _proc_strings(host, pid, name):
    """/proc/PID/cmdline or environ: NUL-terminated strings."""
    return host.file(f"/proc/{pid}/{name}").content_string.split("\0")[:-1]


def _server_info(host):
    return json.loads(host.check_output("curl -sf http://127.0.0.1:30000/server_info"))


def test_first_converge_succeeded_and_changed_the_node(converged_node):
    assert converged_node.first_run.rc == 0
    assert converged_node.first_run.changed > 0


def test_unit_is_rendered_from_the_variables(host):
    unit = host.file(f"/etc/systemd/system/{SERVICE}")
    assert unit.exists and unit.user == "root" and unit.mode == 0o644
    exec_line = expected.systemd_exec_line(expected.exec_argv())
    assert f"ExecStart={exec_line}\n" in unit.content_string
    for line in ("User=sglang", "Restart=on-failure", "LimitNOFILE=65536", "TimeoutStartSec=120",
                 "After=network-online.target nvidia-persistenced.service nvidia-fabricmanager.service"):
        assert line in unit.content_string.splitlines()


def test_service_is_enabled_and_running(host):
    service = host.service("sglang")
    assert service.is_enabled
    assert service.is_running


def test_server_runs_as_the_service_user_with_the_intended_argv(host):
    pid = _main_pid(host)
    status = host.file(f"/proc/{pid}/status").content_string
    uid = next(line.split()[1] for line in status.splitlines() if line.startswith("Uid:"))
    assert host.user("sglang").uid == int(uid) != 0
    assert _proc_strings(host, pid, "cmdline") == expected.exec_argv()


def test_server_environment_comes_from_the_environment_file(host):
    pid = _main_pid(host)
    environ = _proc_strings(host, pid, "environ")
    for name, value in expected.testnode_vars()["sglang_service_environment"].items():
        assert f"{name}={value}" in environ
    env_file = host.file("/etc/sglang/sglang.env")
    assert env_file.user == "root" and env_file.mode == 0o644
    secrets = host.file("/etc/sglang/sglang.secrets.env")
    assert secrets.user == "root" and secrets.mode == 0o600


def test_sglang_parser_resolved_spec_v2_with_topk_1(host):
    info = _server_info(host)
    assert info["double"] is True  # the test node runs the clearly named double
    assert info["argv"] == expected.server_argv()
    assert info["spec_v2"] is True
    resolved = info["server_args"]
    assert resolved["speculative_algorithm"] == "EAGLE3"
    assert resolved["speculative_eagle_topk"] == 1
    assert resolved["speculative_num_draft_tokens"] == resolved["speculative_num_steps"] + 1 == 4
    assert resolved["tp_size"] == 8
    assert info["user"] == "sglang"


def test_listens_on_loopback_only(host, converged_node):
    assert host.socket("tcp://127.0.0.1:30000").is_listening
    assert not host.socket("tcp://0.0.0.0:30000").is_listening
    assert not host.socket(f"tcp://{converged_node.node.ip}:30000").is_listening


def test_health_answers_200(host):
    assert host.check_output("curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:30000/health") == "200"


def test_second_converge_changes_nothing(converged_node):
    # the second run on this node's state: the one that proved the worker's converged snapshot
    # (conftest's converged_snapshot), on the node booted from it, as this one is
    second = converged_node.second_run
    assert second.rc == 0, second.stdout[-4000:]
    assert second.changed == 0, second.changed_tasks()

