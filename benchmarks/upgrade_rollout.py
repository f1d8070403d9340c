#!/usr/bin/env python3
"""Benchmark: what a measured upgrade costs on the test fleet, against a plain rolling restart.

Makes its own test fleet as the integration tests do (tests/testnode, state under
.cache/bench-upgrade): one node converged by site.yml and snapshotted, then three serving nodes
from that snapshot behind one gateway, with a monitor, converged together on the fleet's
inventory (tests/gateway_fleet.py: half a second per request on the server double). It installs
0.5.9's bench_serving on each node (tests/upgrade_runs.py) and then measures, with 16 clients
sending requests through the gateway all along (benchmarks/gateway_load.py):

- T_rolling: playbooks/rolling_restart.yml, every node out of the gateway, drained, restarted,
  healthy and back in, one after the other;
- T_upgrade: playbooks/upgrade.yml from 0.5.9 to 0.5.23 (the wheelhouse's real wheels; the
  double three times faster under 0.5.23, so the gate passes), from its start to every node
  promoted, split into its phases by the plays' start times: the report, the plan, the canary's
  move, the gate (bench_serving on the canary and the control, side by side, twice each), the
  promotion of the other nodes batch by batch;
- the gate's cost as a ratio to T_rolling, and T_upgrade's;
- the failed client requests of each run (the target: none).

Each run makes a fresh fleet from the snapshot.
Prints a table and writes it, with the machine, date and command, to
benchmarks/results/upgrade_rollout.md (and .json).

Usage: .venv/bin/python benchmarks/upgrade_rollout.py [--runs 1]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "benchmarks"))

# pylint: disable=wrong-import-position
from ansible_run import run_playbook  # noqa: E402
from gateway_client import DeployedGateway  # noqa: E402
from gateway_fleet import FLEET_SERVER_ENVIRONMENT, fleet_inventory  # noqa: E402
from gateway_load import LoadRun, Target  # noqa: E402
from testnodes import NodeSet  # noqa: E402
from upgrade_runs import PACE_ENVIRONMENT, TARGET, install_bench_client, upgrade  # noqa: E402

STATE = REPO / ".cache" / "bench-upgrade"
RESULTS = REPO / "benchmarks" / "results"
CLIENTS = 16
# 0.5.9 keeps the fleet's half a second per request (about 0.016 s a step over the gate's 32
# tokens); 0.5.23 is three times faster.
FAST = 0.005
# The plays of upgrade.yml that open each phase (the names as the playbook gives them).
PHASES = (
    ("report", "Report what upgrading SGLang"),
    ("plan", "Plan the rollout"),
    ("canary", "Check every node"),
    ("gate", "Gate the canary against the control node"),
    ("promotion", "Prepare the promotion"),
)


def must(result, what):
    if result.rc != 0:
        sys.exit(f"{what} failed (rc {result.rc}):\n{result.stdout[-4000:]}")
    return result


def play_starts(result):
    """(play name, start time) of each play of the run, in order."""
    return [(e["event_data"]["play"], datetime.datetime.fromisoformat(e["created"]))
            for e in result.events if e["event"] == "playbook_on_play_start"]


def phases(result):
    """Seconds of each phase of an upgrade run: from the first play opening it to the next phase."""
    starts = play_starts(result)
    end = datetime.datetime.fromisoformat(result.events[-1]["created"])
    opened = []
    for phase, prefix in PHASES:
        found = [stamp for name, stamp in starts if name.startswith(prefix)
                 and (not opened or stamp >= opened[-1][1])]
        if found:
            opened.append((phase, found[0]))
    return {phase: round(((opened[i + 1][1] if i + 1 < len(opened) else end) - stamp).total_seconds(), 1)
            for i, (phase, stamp) in enumerate(opened)}


def timed_under_load(target, playbook_run):
    load = LoadRun(target, clients=CLIENTS).start()
    started = time.monotonic()
    result = playbook_run()
    seconds = time.monotonic() - started
    return result, round(seconds, 1), load.stop()


def converged_snapshot():
    """One node converged by site.yml, snapshotted (as tests/conftest.py's converged_snapshot)."""
    shutil.rmtree(STATE, ignore_errors=True)
    directory = STATE / "converged-snapshot"
    seed = NodeSet(STATE / "seed")
    (node,) = seed.up(1)
    must(run_playbook("site.yml", node.inventory), "the seed node's converge")
    node.snapshot(directory)
    seed.down()
    return directory


def measure_once(snapshot, run):
    """A fresh fleet from the snapshot, converged; then the rolling restart and the upgrade, under load."""
    node_set = NodeSet(STATE / f"fleet-{run}")
    node_set.up(3, from_snapshot=snapshot, monitor=True, gateway=True)
    try:
        serving = [n for n in node_set.nodes() if n.group == "sglang_nodes"]
        inventory = fleet_inventory(node_set.inventory, STATE / f"fleet-{run}.yml")
        must(run_playbook("site.yml", inventory, extravars={"sglang_rollout_batch_size": len(serving)}),
             "the fleet's converge")
        installs = [threading.Thread(target=install_bench_client, args=(n,)) for n in serving]
        for install in installs:
            install.start()
        for install in installs:
            install.join()
        gateway = DeployedGateway(inventory)
        target = Target(gateway.url, "/v1/completions", gateway.api_key, gateway.ca_file)

        rolling, rolling_seconds, rolling_load = timed_under_load(
            target, lambda: run_playbook("playbooks/rolling_restart.yml", inventory))
        must(rolling, "playbooks/rolling_restart.yml")
        upgrade_inventory = fleet_inventory(node_set.inventory, STATE / f"upgrade-{run}.yml", {
            n.name: {"sglang_service_environment": {**FLEET_SERVER_ENVIRONMENT, **PACE_ENVIRONMENT},
                     "sglang_test_double_step_seconds_by_version": {TARGET: FAST}} for n in serving})
        upgraded, upgrade_seconds, upgrade_load = timed_under_load(
            target, lambda: upgrade(upgrade_inventory, STATE / f"reports-{run}"))
        must(upgraded, "playbooks/upgrade.yml")
        return {"nodes": len(serving), "rolling_seconds": rolling_seconds, "upgrade_seconds": upgrade_seconds,
                "upgrade_phases": phases(upgraded),
                "failed_requests": {"rolling": rolling_load["failed"], "upgrade": upgrade_load["failed"]},
                "ok_requests": {"rolling": rolling_load["ok"], "upgrade": upgrade_load["ok"]}}
    finally:
        node_set.down()


def report(runs, command):
    median = statistics.median
    rolling = median(r["rolling_seconds"] for r in runs)
    upgrade_total = median(r["upgrade_seconds"] for r in runs)
    phase_names = [name for name, _ in PHASES]
    phase = {name: median(r["upgrade_phases"].get(name, 0.0) for r in runs) for name in phase_names}
    failed = sum(r["failed_requests"]["rolling"] + r["failed_requests"]["upgrade"] for r in runs)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    machine = f"{platform.node()} ({os.cpu_count()} cores, {platform.platform()})"
    lines = [
        "# upgrade_rollout", "",
        f"Measured {stamp} on {machine}, load average at the end {load} (1, 5, 15 min), by", "",
        f"    {command}", "",
        f"{runs[0]['nodes']} serving nodes behind one gateway, with a monitor; 0.5.9 to {TARGET}, the gate at",
        "concurrency 4, twice on each side; 16 clients through the gateway during every run.", "",
        "| measure | seconds (median of runs) | ratio to rolling_restart.yml |", "| --- | ---: | ---: |",
        f"| playbooks/rolling_restart.yml | {rolling} | 1.00 |",
        f"| playbooks/upgrade.yml, start to every node promoted | {upgrade_total} | {upgrade_total / rolling:.2f} |",
    ]
    lines += [f"| - {name} | {phase[name]} | {phase[name] / rolling:.2f} |" for name in phase_names]
    lines += ["", "| measure | value | target | met |", "| --- | ---: | ---: | --- |",
              f"| failed client requests, every run | {failed} | 0 | {'yes' if failed == 0 else 'NO'} |",
              f"| the gate's cost / rolling_restart.yml | {phase['gate'] / rolling:.2f} | | |", ""]
    text = "\n".join(lines)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "upgrade_rollout.md").write_text(text)
    (RESULTS / "upgrade_rollout.json").write_text(json.dumps(
        {"measured": stamp, "machine": machine, "load_average_at_end": load, "command": command, "runs": runs},
        indent=2) + "\n")
    return text, failed


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--runs", type=int, default=1, help="fresh fleets measured, one after the other")
    args = parser.parse_args()
    snapshot = converged_snapshot()
    runs = [measure_once(snapshot, run) for run in range(1, args.runs + 1)]
    text, failed = report(runs, " ".join([".venv/bin/python benchmarks/upgrade_rollout.py", *sys.argv[1:]]))
    print(text)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
