"""Faults: the server killed, the node rebooted, an Ansible run killed halfway through the
service's first deploy. A converged node of this file alone (conftest's converged_node, restored
from the worker's converged snapshot); the tests run in file order and each leaves the node
converged and healthy. (A configuration that never gets healthy, rolled back file for file with
no false drift left: test_rolling_gateway.py, on a fleet node behind the gateway, where the
rollback also has to keep the node out of rotation until it is healthy again.)
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

import node_state
import pytest
from ansible_run import run_playbook
from project_modules import REPO

VENV_BIN = REPO / ".venv" / "bin"


@pytest.fixture(scope="module")
def node(converged_node):
    node = converged_node.node
    node_state.wait_healthy(node, 60)
    return node


def _unit_property(node, name):
    return node_state.ssh(node, f"systemctl show --property={name} --value {node_state.SERVICE}").strip()


def test_killed_server_is_restarted_by_systemd_and_gets_healthy(node):
    pid, _ = node_state.wait_healthy(node, 60)
    restarts = int(_unit_property(node, "NRestarts"))

    node_state.ssh(node, f"kill -KILL {pid}")

    new_pid, waited = node_state.wait_healthy(node, 120, other_than_pid=pid)
    print(f"healthy again {waited:.1f} s after SIGKILL (pid {pid} -> {new_pid})")
    assert node.ssh(f"test -d /proc/{pid}").returncode != 0, "the killed process is still there"
    assert int(_unit_property(node, "NRestarts")) == restarts + 1


def test_rebooted_node_serves_again_without_ansible(node):
    invocation = _unit_property(node, "InvocationID")
    boot = node_state.ssh(node, "ps -o lstart= -p 1").strip()

    node.reboot()  # tests/testnode reboot: clean poweroff, boot the same rootfs

    assert node_state.ssh(node, "ps -o lstart= -p 1").strip() != boot, "the node did not reboot"
    _, waited = node_state.wait_healthy(node, 180)
    print(f"healthy {waited:.1f} s after the node answered SSH again")
    assert _unit_property(node, "InvocationID") != invocation
    assert node_state.ssh(node, "systemctl is-enabled sglang.service").strip() == "enabled"


def _start_site_yml(node):
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
        "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    command = [
        str(VENV_BIN / "ansible-playbook"),
        "-i",
        str(REPO / "inventory" / "testnode"),
        "-i",
        str(node.inventory),
        "site.yml",
    ]
    # its own process group, so that the kill takes ansible-playbook and all its workers
    return subprocess.Popen(
        command, cwd=REPO, env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )


# What a node has before sglang_service's first deploy: every earlier role converged, no unit, no
# configuration of the service, nothing running.
UNDEPLOY_THE_SERVICE = (
    f"systemctl disable --now {node_state.SERVICE} && rm -rf {node_state.UNIT} {node_state.ENV_FILE}"
    f" {node_state.SECRETS_FILE} {node_state.LAST_GOOD} && systemctl daemon-reload && systemctl reset-failed"
)


def _wait_on_the_node_for(node, path):
    """One SSH session that returns once `path` exists on the node (polled there, 0.1 s)."""
    command = f"timeout 600 sh -c 'until test -e {path}; do sleep 0.1; done'"
    return subprocess.Popen(  # pylint: disable=consider-using-with
        [str(REPO / "tests" / "testnode"), "ssh", node.name, "--", command],
        env={**os.environ, "TESTNODE_STATE_DIR": str(node.state_dir)},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )


def test_run_killed_halfway_is_finished_by_the_next_run(node):
    # The service's first deploy, killed halfway: the earlier roles are converged (as a first run
    # leaves them when it reaches sglang_service; a fresh node would spend the CI's CPU minutes
    # installing them again), the service has never been deployed.
    node_state.ssh(node, UNDEPLOY_THE_SERVICE)
    assert node.ssh(f"test -e {node_state.ENV_FILE} || systemctl is-active --quiet {node_state.SERVICE}").returncode != 0

    run = _start_site_yml(node)
    waiter = _wait_on_the_node_for(node, node_state.ENV_FILE)
    try:
        # halfway: sglang_service has just written the environment file, not yet started the server
        while waiter.poll() is None:
            assert run.poll() is None, f"site.yml ended (rc {run.returncode}) before sglang_service wrote anything"
            time.sleep(0.1)
        assert waiter.returncode == 0, "sglang_service never wrote the environment file"
    finally:
        os.killpg(run.pid, signal.SIGKILL)
        run.wait()
        waiter.kill()
        waiter.wait()
    assert node.ssh("systemctl is-active sglang.service").stdout.strip() != "active", "killed too late"

    finish = run_playbook("site.yml", node.inventory)
    assert finish.rc == 0, node_state.failure_messages(finish) or finish.stdout[-4000:]
    assert finish.changed > 0
    node_state.wait_healthy(node, 30)

    again = run_playbook("site.yml", node.inventory)
    assert again.rc == 0, node_state.failure_messages(again)
    assert again.changed == 0, again.changed_tasks()
