"""playbooks/upgrade.yml on the gateway fleet (issue 36, items 4-5): the canary (the first node)
moves alone through site.yml's restart sequence, out of and back into the gateway; the gate
measures it and a control node (the second) side by side, under the same load. A slower release,
its first run killed while the gate measures, is reported by a drift scan as a mixed fleet, then
rolled back by the next run with no other node touched; a faster one is promoted batch by batch.
16 clients send requests through the gateway during both, and none fails.

The server is the TEST DOUBLE (tests/double/sglang_server_double.py), started by each release's
own interpreter. 0.5.9 keeps the fleet's pace (SGLANG_DOUBLE_REQUEST_SECONDS: half a second a
request, so requests are in flight whenever a node leaves); 0.5.23's pace comes from the test
inventory's sglang_test_double_step_seconds_by_version. The wheelhouse holds the real wheels of
both releases; the report, the patches and the parser run against them, and the gate's
bench_serving is 0.5.9's own (tests/upgrade_runs.py).

The fleet is conftest's gateway_fleet; this file runs after test_rolling_gateway.py, which leaves
every node on its WARMUP_2 environment, and last on the fleet: the promotion leaves the fleet on
0.5.23, which its inventory does not name.
"""

from __future__ import annotations

import threading
import time

import node_state
import pytest

from ansible_run import kill_playbook, run_playbook
from rolling_checks import (JOIN, LEAVE, WARMUP_2, Fleet, assert_each_node_left_drained_and_rejoined_in_turn,
                            assert_no_request_failed, changes_on, results_of)
from upgrade_runs import (CURRENT, GATE_RUNS, PACE_ENVIRONMENT, TARGET, VENVS, gate_record, history,
                          install_bench_client, pip_ran, release_record, running_release, start_upgrade, upgrade)

# Seconds per decode step of the double under 0.5.23. 0.5.9's half a second per request is about
# 0.016 s a step over the gate's 32 output tokens: the slower release takes three times as long,
# the faster one a thirtieth, far beyond what the gateway's load and the CPU add as noise.
SLOW, FAST = 0.05, 0.0005


@pytest.fixture(scope="module")
def fleet(gateway_fleet, tmp_path_factory):
    fleet = Fleet(gateway_fleet, tmp_path_factory.mktemp("upgrade-fleet"))
    installs = [threading.Thread(target=install_bench_client, args=(node,)) for node in fleet.nodes]
    for install in installs:
        install.start()
    for install in installs:
        install.join()
    fleet.gateway.wait_workers(fleet.urls, timeout=180)
    return fleet


def _inventory(fleet, target_pace):
    """The fleet's inventory with the double's pace for the target in every node's environment."""
    return fleet.inventory({**WARMUP_2, **PACE_ENVIRONMENT}, {
        node.name: {"sglang_test_double_step_seconds_by_version": {TARGET: target_pace}} for node in fleet.nodes})


def _env_file_sha(node):
    return node.testinfra_host().file(node_state.ENV_FILE).sha256sum


def _killed_while_the_gate_measures(inventory, reports, canary):
    """upgrade.yml killed (the playbook and its workers) once the gate measures: the canary has
    moved to the target and is back in the gateway, no decision is taken."""
    run = start_upgrade(inventory, reports)
    try:
        deadline = time.monotonic() + 900
        while canary.ssh(f"test -d {GATE_RUNS}").returncode != 0:
            assert run.poll() is None, f"upgrade.yml ended (rc {run.returncode}) before the gate measured"
            assert time.monotonic() < deadline, "the gate never started"
            time.sleep(1)
    finally:
        kill_playbook(run)


def _failures_by_host(result):
    said = {}
    for event in result.events:
        if event["event"] == "runner_on_failed":
            said.setdefault(event["event_data"]["host"], []).append(str(event["event_data"]["res"].get("msg")))
    return said


def test_a_slower_canary_killed_mid_gate_is_reported_then_rolled_back_and_no_other_node_is_touched(fleet):
    canary, control, other = fleet.nodes
    untouched = (control, other)
    pids = {node.name: node_state.main_pid(node) for node in untouched}
    env_shas = {node.name: _env_file_sha(node) for node in untouched}
    inventory = _inventory(fleet, SLOW)
    reports = fleet.folder / "reports"
    load = fleet.load()
    _killed_while_the_gate_measures(inventory, reports, canary)

    # until the next run, a drift scan reports the mixed fleet: the canary on the target, the others not
    scan = run_playbook("playbooks/drift.yml", inventory)
    said = _failures_by_host(scan)
    assert scan.rc != 0
    moved = f"runs SGLang {TARGET}, the inventory says {CURRENT}"
    assert any(moved in m for m in said.get(canary.name, [])), said
    assert not any(moved in m for node in untouched for m in said.get(node.name, [])), said

    # the next run measures the canary again (nothing the killed run measured is trusted) and rolls it back
    result = upgrade(inventory, reports)
    stats = load.stop()

    assert result.rc != 0
    (message,) = [m for m in result.failure_messages() if "is rolled back" in m]
    assert f"The upgrade of sglang {CURRENT} to {TARGET} is rolled back: concurrency 4: output_throughput" in message
    assert_no_request_failed(stats)
    # back through the one restart sequence: out of the gateway, drained, restarted, healthy, back in
    assert [r["action"] for r in results_of(result, LEAVE, canary.name)] == ["remove"]
    assert [r["action"] for r in results_of(result, JOIN, canary.name)] == ["add"]
    assert running_release(canary) == (f"{VENVS}/{CURRENT}/bin/python", CURRENT)
    assert release_record(canary) == {"serving": CURRENT, "previous": TARGET}
    # measured beside the control, under the same load
    gate = gate_record(reports)
    assert (gate["canary"], gate["control"]) == (canary.name, control.name)
    assert gate["passed"] is False and gate["repetitions"] == {"canary": 2, "control": 2}
    figures = gate["levels"][0]["metrics"]["output_throughput"]
    assert figures["canary"] < figures["control"] and not figures["passed"]
    (entry,) = history(canary)
    assert (entry["from"], entry["to"], entry["decision"]) == (CURRENT, TARGET, "rolled back")
    # no other node was taken out of the gateway, restarted or reconfigured; the third not even written to
    for node in untouched:
        assert results_of(result, LEAVE, node.name) == []
        assert running_release(node) == (f"{VENVS}/{CURRENT}/bin/python", CURRENT)
    assert {node.name: node_state.main_pid(node) for node in untouched} == pids
    assert {node.name: _env_file_sha(node) for node in untouched} == env_shas
    assert changes_on(result, other.name) == []
    assert fleet.gateway.wait_workers(fleet.urls, timeout=30)


def test_a_faster_release_is_promoted_batch_by_batch_and_drops_no_request(fleet):
    canary, *rest = fleet.nodes
    load = fleet.load()
    result = upgrade(_inventory(fleet, FAST), fleet.folder / "reports")
    stats = load.stop()

    assert result.rc == 0, result.failure_messages() or result.stdout[-6000:]
    assert_no_request_failed(stats)
    gate = gate_record(fleet.folder / "reports")
    assert gate["passed"] is True and (gate["canary"], gate["control"]) == (canary.name, rest[0].name)
    # the canary first, measured, then the others one batch each: every node out of the gateway,
    # drained, back in and healthy before the next one leaves
    assert_each_node_left_drained_and_rejoined_in_turn(fleet, result)
    # the canary's target venv was kept by its rollback; the others install it in their batch
    assert not pip_ran(result, canary.name), "the target's venv was kept by the rollback: no pip"
    assert all(pip_ran(result, node.name) for node in rest)
    for node in fleet.nodes:
        assert running_release(node) == (f"{VENVS}/{TARGET}/bin/python", TARGET), node.name
        assert release_record(node) == {"serving": TARGET, "previous": CURRENT}, node.name
        assert history(node)[-1]["decision"] == "promoted", node.name
    assert [e["decision"] for e in history(canary)] == ["rolled back", "promoted"]
    assert "| promoted | gate passed |" in node_state.ssh(canary, "cat /root/production_v2.md")
    assert any(f'Set sglang_version: "{TARGET}"' in m for m in result.messages()), "the inventory's next step is not said"
    assert fleet.gateway.wait_workers(fleet.urls, timeout=30)
