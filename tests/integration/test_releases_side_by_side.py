"""SGLang releases side by side (issue 36, item 3), on one converged node (conftest's converged_node).

The node serves SGLang 0.5.9 from its own venv. A converge onto 0.5.23 (the release the second
shipped patch set was ported to; its real wheel and parser closure are in the harness's
wheelhouse) installs it into a venv of its own beside 0.5.9 and restarts the server from it;
drift.yml with the inventory's 0.5.9 names the node as running another release; going back to
0.5.9 is a unit change and a restart with no pip, both venvs stay (the one just left is the way
back), and a venv of a release the node neither serves nor can go back to is removed.

The server is the TEST DOUBLE (tests/double/sglang_server_double.py) started by the release's
interpreter, as the real server would be; what it runs is read from the process, not the unit.
"""

from __future__ import annotations

import json

import expected
import node_state
import pytest
from ansible_run import run_playbook

VARS = expected.testnode_vars()
VENVS = VARS["sglang_venvs_dir"]
RECORD = VARS["sglang_releases_record"]
CURRENT = VARS["sglang_version"]
TARGET = "0.5.23"
# The release and its patch set: the set is chosen with the release (upgrade.yml's report refuses
# a release without one).
TARGET_VARS = {"sglang_version": TARGET, "sglang_patches_sets": [f"sglang-{TARGET}"]}
START_SECONDS = VARS["sglang_service_timeout_start_sec"]


@pytest.fixture(scope="module")
def node(converged_node):
    return converged_node.node


def _ssh(node, command):
    result = node.ssh(command)
    assert result.returncode == 0, f"{command}: {result.stderr}"
    return result.stdout.strip()


def _venvs(node):
    return sorted(_ssh(node, f"ls -1 {VENVS}").split())


def _running_release(node):
    """The sglang release of the interpreter the server's main process was started with."""
    pid = node_state.main_pid(node)
    python = _ssh(node, f"tr '\\0' '\\n' < /proc/{pid}/cmdline | head -n 1")
    return python, _ssh(node, f"{python} -c 'import importlib.metadata as m; print(m.version(\"sglang\"))'")


def _pip_ran(result):
    return [e for e in result.events
            if e.get("event") == "runner_on_ok" and e["event_data"].get("task") == "Run pip install"]


def test_a_new_release_is_installed_beside_the_serving_one_and_serves(node):
    assert _venvs(node) == [CURRENT]
    assert json.loads(_ssh(node, f"cat {RECORD}")) == {"serving": CURRENT, "previous": None}
    pid = node_state.main_pid(node)

    upgrade = run_playbook("site.yml", node.inventory, extravars=TARGET_VARS)

    assert upgrade.rc == 0, upgrade.failure_messages() or upgrade.stdout[-6000:]
    assert _pip_ran(upgrade), "the new release was not installed by pip"
    assert _venvs(node) == sorted([CURRENT, TARGET])
    node_state.wait_healthy(node, START_SECONDS)
    assert node_state.main_pid(node) != pid
    assert _running_release(node) == (f"{VENVS}/{TARGET}/bin/python", TARGET)
    assert f"{VENVS}/{TARGET}/bin/python " in _ssh(node, "systemctl show -P ExecStart sglang.service")
    assert json.loads(_ssh(node, f"cat {RECORD}")) == {"serving": TARGET, "previous": CURRENT}


def test_the_drift_scan_names_a_node_that_runs_another_release_than_the_inventory(node):
    scan = run_playbook("playbooks/drift.yml", node.inventory)

    assert scan.rc != 0
    (report,) = [m for m in scan.failure_messages() if " drifted: " in m]
    assert f"runs SGLang {TARGET}, the inventory says {CURRENT}" in report, report
    assert _running_release(node)[1] == TARGET, "the scan changed the node"


def test_going_back_is_a_restart_without_pip_and_a_release_not_kept_is_removed(node):
    # a venv of a release the record names neither as serving nor as previous
    _ssh(node, f"mkdir -p {VENVS}/0.5.8/bin")
    pid = node_state.main_pid(node)

    back = run_playbook("site.yml", node.inventory)

    assert back.rc == 0, back.failure_messages() or back.stdout[-6000:]
    assert not _pip_ran(back), "going back to the previous release ran pip"
    node_state.wait_healthy(node, START_SECONDS)
    assert node_state.main_pid(node) != pid
    assert _running_release(node) == (f"{VENVS}/{CURRENT}/bin/python", CURRENT)
    # the release just left is the way forward again, kept; 0.5.8 is neither
    assert _venvs(node) == sorted([CURRENT, TARGET])
    assert json.loads(_ssh(node, f"cat {RECORD}")) == {"serving": CURRENT, "previous": TARGET}

    again = run_playbook("site.yml", node.inventory)

    assert again.rc == 0, again.failure_messages()
    assert again.changed == 0, again.changed_tasks()
