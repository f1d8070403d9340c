"""playbooks/upgrade.yml's rollout (issue 36, items 3-5) on one converged node without gateways
(the canonical single node, conftest's converged_node): the candidate and the current release are
measured on that node one after the other, with SGLang 0.5.9's real bench_serving.

The server is the TEST DOUBLE (tests/double/sglang_server_double.py), started by each release's
own interpreter; its pace per release comes from the test inventory's
sglang_test_double_step_seconds_by_version (SGLANG_DOUBLE_STEP_SECONDS_BY_VERSION), so that 0.5.23
is ten times slower than 0.5.9. 0.5.9 is not in that mapping and keeps the double's default
pace: the node's current configuration is the converged snapshot's, so the upgrade needs no
converge first and going back restores exactly it. The wheelhouse holds the real wheels of both
releases; the report, the patches and the parser run against them.
In order: a slower release is measured, rolled back with no pip, recorded, and leaves nothing a
drift scan finds; a canary that never gets healthy is rolled back and nothing else changes. A
faster release promoted, and the gate beside a control node, are test_upgrade_gateway.py's, on
the gateway fleet.
"""

from __future__ import annotations

import node_state
import pytest
import yaml

from ansible_run import run_playbook
from upgrade_runs import (CURRENT, PACE_ENVIRONMENT, TARGET, VARS, VENVS, WAY_BACK, gate_record, history,
                          install_bench_client, release_record, running_release, upgrade)

# seconds per decode step of the double under 0.5.23: ten times its default pace (0.002,
# tests/double/double_generate.py), which 0.5.9 keeps
SLOW = 0.02


@pytest.fixture(scope="module")
def node(converged_node, tmp_path_factory):
    node = converged_node.node
    install_bench_client(node)
    node.folder = tmp_path_factory.mktemp("upgrade")
    return node


def _inventory(node, target_pace):
    """The node's inventory with the double's pace for the target in its environment (the current
    release is not in the mapping: its servers keep the environment they were converged with)."""
    inventory = yaml.safe_load(node.inventory.read_text())
    for variables in inventory["all"]["children"]["sglang_nodes"]["hosts"].values():
        variables["sglang_test_double_step_seconds_by_version"] = {TARGET: target_pace}
        variables["sglang_service_environment"] = {**VARS["sglang_service_environment"], **PACE_ENVIRONMENT}
    path = node.folder / f"inventory-{target_pace}.yml"
    path.write_text(yaml.safe_dump(inventory))
    return path


def test_a_slower_release_is_measured_rolled_back_with_no_pip_and_leaves_no_drift(node):
    inventory = _inventory(node, SLOW)
    # the first upgrade of this node: the canary keeps its way back in this very run
    assert node.ssh(f"test -e {WAY_BACK}").returncode != 0
    result = upgrade(inventory, node.folder / "reports")

    assert result.rc != 0
    (message,) = [m for m in result.failure_messages() if "is rolled back" in m]
    assert f"The upgrade of sglang {CURRENT} to {TARGET} is rolled back: concurrency 4: output_throughput" in message
    assert running_release(node) == (f"{VENVS}/{CURRENT}/bin/python", CURRENT)
    # the target stays installed beside the current release: the next try needs no pip
    assert sorted(node_state.ssh(node, f"ls -1 {VENVS}").split()) == sorted([CURRENT, TARGET])
    assert release_record(node) == {"serving": CURRENT, "previous": TARGET}
    (entry,) = history(node)
    assert (entry["from"], entry["to"], entry["decision"]) == (CURRENT, TARGET, "rolled back")
    figures = entry["gate"]["levels"][0]["metrics"]["output_throughput"]
    assert figures["canary"] < figures["control"] and not figures["passed"]
    doc = node_state.ssh(node, "cat /root/production_v2.md")
    assert f"| {CURRENT} | {TARGET} | {node.name} |" in doc and "rolled back" in doc
    gate = gate_record(node.folder / "reports")
    assert gate["passed"] is False and gate["repetitions"] == {"canary": 2, "control": 2}
    assert not gate["control"], "without gateways the canary is its own control, measured before it moved"

    assert node.ssh(f"test -e {WAY_BACK}").returncode != 0, "the way back is removed once the node went back"
    # against the inventory the node was converged with before the upgrade (the one without the target's pace)
    scan = run_playbook("playbooks/drift.yml", node.inventory)
    assert scan.rc == 0 and scan.changed == 0, scan.failure_messages() or scan.changed_tasks()


def test_a_canary_that_never_gets_healthy_is_rolled_back_and_nothing_else_changes(node):
    inventory = _inventory(node, SLOW)
    before = node_state.fingerprint(node, node_state.managed_paths(node))
    recorded = history(node)
    result = upgrade(inventory, node.folder / "reports", sglang_service_health_timeout=15, sglang_service_environment={
        **VARS["sglang_service_environment"], "SGLANG_DOUBLE_NEVER_HEALTHY": "1"})

    assert result.rc != 0
    assert any("Rolled back to the last good configuration" in m for m in result.failure_messages()), result.failure_messages()
    node_state.wait_healthy(node, 120)
    assert running_release(node) == (f"{VENVS}/{CURRENT}/bin/python", CURRENT)
    assert release_record(node) == {"serving": CURRENT, "previous": TARGET}
    assert history(node) == recorded, "a canary that never served is no upgrade the gate judged"
    after = node_state.fingerprint(node, node_state.managed_paths(node))
    assert node_state.differences(before, after) == [], "the rollback left the node changed"
    # All that is left: the way back the canary kept before it moved (the next run takes it again).
    assert node_state.ssh(node, f"cat {WAY_BACK}/release").strip() == CURRENT
