"""Unit integrity (issue 19): no value can inject into or break the systemd unit, every override
of the service is drift, and no bad unit on disk can strand the node. (That a rollback leaves no
false drift is test_faults.py's rollback test, which already makes one.)

A converged node of this file alone (conftest's converged_node, restored from the worker's
converged snapshot); the tests run in file order and each leaves the node converged and
healthy, with the fingerprint taken when the file got the node.
"""

from __future__ import annotations

import types

import expected
import node_state
import pytest
from ansible_run import run_playbook

FOREIGN_DROPINS = {
    # what an operator (or an attacker with root) writes by hand
    "/etc/systemd/system/sglang.service.d/zz.conf": "[Service]\nUser=root\nEnvironment=NCCL_P2P_DISABLE=1\n",
    # what `systemctl set-property --runtime` writes
    "/run/systemd/system.control/sglang.service.d/50-CPUWeight.conf": "[Service]\nCPUWeight=50\n",
}


def _server_args(**changes):
    args = dict(expected.testnode_vars()["sglang_server_args"])
    args.update(changes)
    return {"sglang_server_args": args}


@pytest.fixture(scope="module")
def node(converged_node):
    made = converged_node.node
    node_state.wait_healthy(made, 60)
    paths = node_state.managed_paths(made)
    baseline = node_state.fingerprint(made, paths)
    assert baseline["process_runs_as"] == ["sglang", "sglang"]
    return types.SimpleNamespace(node=made, inventory=made.inventory, name=made.name, paths=paths, baseline=baseline)


def _site(node, **kwargs):
    return run_playbook("site.yml", node.inventory, **kwargs)


def _unit_property(node, name):
    return node_state.ssh(node.node, f"systemctl show --property={name} --value {node_state.SERVICE}").strip()


def _assert_untouched(node, result, pid):
    assert node_state.host_changed(result, node.name) == 0, result.changed_tasks()
    assert node_state.main_pid(node.node) == pid, "the running server was restarted"
    assert _unit_property(node, "LoadState") == "loaded"
    after = node_state.fingerprint(node.node, node.paths)
    assert after == node.baseline, node_state.differences(node.baseline, after)


# id -> (extra vars carrying a control character, the variable the refusal must name)
INJECTIONS = {
    "newline-in-a-server-argument": (
        _server_args(served_model_name="m\nExecStartPre=+/bin/touch /injected"),
        "sglang_server_args.served_model_name: control character \\n at position 2",
    ),
    "newline-in-a-unit-bound-role-variable": (
        {"sglang_service_device_allow": ["char-nvidia-frontend rw", "char-nvidia-uvm rw\nExecStartPre=+/bin/touch /injected"]},
        "sglang_service_device_allow[1]: control character \\n at position 19",
    ),
    "carriage-return-in-the-config-folder": (
        {"sglang_config_dir": "/etc/sglang\rx"},
        "sglang_config_dir: control character \\r at position 12",
    ),
}


def test_control_characters_are_refused_each_named_before_any_change(node):
    # One run with every case at once (a run costs a minute of the CI's 2 cores): the check reads
    # every role variable, so one refusal must name each of them.
    extravars = {name: value for variables, _ in INJECTIONS.values() for name, value in variables.items()}
    assert len(extravars) == len(INJECTIONS)  # the cases set distinct variables
    pid = node_state.main_pid(node.node)

    result = _site(node, extravars=extravars)

    assert result.rc != 0, f"site.yml accepted {extravars}"
    messages = node_state.failure_messages(result)
    for case, (_, message) in INJECTIONS.items():
        assert any(message in m for m in messages), (case, messages)
    _assert_untouched(node, result, pid)
    assert node.node.ssh("test -e /injected").returncode != 0


def test_a_model_folder_the_service_user_cannot_read_is_refused_naming_it(node):
    node_state.ssh(node.node, "rm -rf /srv/locked && cp -a /srv/models /srv/locked && chmod 0700 /srv/locked")
    pid = node_state.main_pid(node.node)

    result = _site(node, extravars={"sglang_model_path": "/srv/locked/target"})

    assert result.rc != 0, "site.yml deployed a model folder its user cannot read"
    assert any(
        "sglang_server_args.model_path: the service user sglang cannot read /srv/locked/target" in m
        for m in node_state.failure_messages(result)
    ), node_state.failure_messages(result)
    _assert_untouched(node, result, pid)


def test_a_unit_systemd_refuses_is_never_installed_and_systemd_says_why(node):
    pid = node_state.main_pid(node.node)
    launcher = ["/opt/absent/bin/python", "/opt/sglang-test-double/sglang_server_double.py"]

    result = _site(node, extravars={"sglang_service_launcher": launcher})

    assert result.rc != 0, "site.yml installed a unit whose program does not exist"
    messages = "\n".join(node_state.failure_messages(result))
    assert "systemd-analyze verify" in messages and "/opt/absent/bin/python" in messages, messages
    _assert_untouched(node, result, pid)


def test_a_unit_broken_by_hand_is_repaired_by_one_run(node):
    # unbalanced quoting: systemd drops ExecStart= and refuses to load the unit
    node_state.ssh(
        node.node,
        f"sed -i 's|^ExecStart=\\(.*\\)$|ExecStart=\\1 \"unbalanced|' {node_state.UNIT} && systemctl daemon-reload",
    )
    assert _unit_property(node, "LoadState") == "bad-setting"

    repair = _site(node)

    assert repair.rc == 0, node_state.failure_messages(repair) or repair.stdout[-4000:]
    node_state.wait_healthy(node.node, 60)
    assert _unit_property(node, "LoadState") == "loaded"
    repaired = node_state.fingerprint(node.node, node.paths)
    assert not node_state.differences(node.baseline, repaired), node_state.differences(node.baseline, repaired)


def test_a_unit_edited_without_daemon_reload_is_reloaded_and_repaired(node):
    node_state.ssh(node.node, f"sed -i 's/^RestartSec=.*/RestartSec=1/' {node_state.UNIT}")
    assert _unit_property(node, "NeedDaemonReload") == "yes"

    repair = _site(node)

    assert repair.rc == 0, node_state.failure_messages(repair) or repair.stdout[-4000:]
    node_state.wait_healthy(node.node, 60)
    assert _unit_property(node, "NeedDaemonReload") == "no"
    assert _unit_property(node, "RestartUSec") == "10s"
    repaired = node_state.fingerprint(node.node, node.paths)
    assert not node_state.differences(node.baseline, repaired), node_state.differences(node.baseline, repaired)


def test_foreign_dropins_are_drift_and_site_yml_removes_them(node):
    for path, text in FOREIGN_DROPINS.items():
        node_state.ssh(node.node, f"mkdir -p {path.rsplit('/', 1)[0]} && printf '%s' '{text}' > {path}")
    old_pid = node_state.main_pid(node.node)
    node_state.ssh(node.node, "systemctl daemon-reload && systemctl restart --no-block sglang.service")
    pid, _ = node_state.wait_healthy(node.node, 60, other_than_pid=old_pid)
    assert node_state.fingerprint(node.node, node.paths)["process_runs_as"] == ["root", "sglang"]
    assert node_state.process_environ(node.node, pid).get("NCCL_P2P_DISABLE") == "1"

    scan = run_playbook("playbooks/drift.yml", node.inventory)

    assert scan.rc != 0, "drift.yml exited 0 with foreign drop-ins in place"
    report = "\n".join(m for m in node_state.failure_messages(scan) if " drifted: " in m)
    for path in FOREIGN_DROPINS:
        assert path in report, f"{path} not in the drift report:\n{report}"
    assert node_state.main_pid(node.node) == pid, "the drift scan restarted the server"

    repair = _site(node)

    assert repair.rc == 0, node_state.failure_messages(repair) or repair.stdout[-4000:]
    for path in FOREIGN_DROPINS:
        assert node.node.ssh(f"test -e {path}").returncode != 0, f"{path} is still there"
    new_pid, _ = node_state.wait_healthy(node.node, 60)
    assert new_pid != pid
    assert _unit_property(node, "DropInPaths") == ""
    assert "NCCL_P2P_DISABLE" not in node_state.process_environ(node.node, new_pid)
    repaired = node_state.fingerprint(node.node, node.paths)
    assert repaired["process_runs_as"] == ["sglang", "sglang"]
    assert not node_state.differences(node.baseline, repaired), node_state.differences(node.baseline, repaired)

    again = _site(node)
    assert again.rc == 0, node_state.failure_messages(again)
    assert again.changed == 0, again.changed_tasks()
    assert node_state.main_pid(node.node) == new_pid

