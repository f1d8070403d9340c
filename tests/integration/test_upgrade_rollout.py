"""playbooks/upgrade.yml's rollout (issue 36, items 3-5) on one converged node without gateways
(the canonical single node, conftest's converged_node): the candidate and the current release are
measured on that node one after the other, with SGLang 0.5.9's real bench_serving.

The server is the TEST DOUBLE (tests/double/sglang_server_double.py), started by each release's
own interpreter; its pace per release comes from the test inventory's
sglang_test_double_step_seconds_by_version (SGLANG_DOUBLE_STEP_SECONDS_BY_VERSION), so that 0.5.23
is ten times slower than 0.5.9 in one test and ten times faster in the next. 0.5.9 is not in
that mapping and keeps the double's default pace: the node's current configuration is the
converged snapshot's, so the upgrade needs no converge first and going back restores exactly
it. The wheelhouse holds the real wheels of both releases; the report, the patches and the
parser run against them.
In order: a slower release is measured, rolled back with no pip, recorded, and leaves nothing a
drift scan finds; a canary that never gets healthy is rolled back and nothing else changes; a
faster release is promoted, recorded, and runs from its own venv beside the one it replaced.
"""

from __future__ import annotations

import json

import expected
import node_state
import pytest
import yaml

from ansible_run import run_playbook
from parser_venv import upgrade_sources
from model_fixtures import tiny_tokenizer

VARS = expected.testnode_vars()
CURRENT = VARS["sglang_version"]
TARGET = "0.5.23"
VENVS = VARS["sglang_venvs_dir"]
RECORD = VARS["sglang_releases_record"]
HISTORY = VARS["sglang_upgrade_history"]
WAY_BACK = f"{HISTORY.rsplit('/', 1)[0]}/way-back"  # roles/sglang_upgrade/vars/main.yml
# 0.5.9's bench_serving, in a venv of its own that sees the serving venv's packages (site.addsitedir): the
# serving venv stays as site.yml made it (its packages are part of what production_v2.md records).
CLIENT = "/opt/bench-client"
TOKENIZER = "/srv/bench-tokenizer"
# seconds per decode step of the double under 0.5.23: a tenth and ten times its default pace (0.002,
# tests/double/double_generate.py), which 0.5.9 keeps
FAST, SLOW = 0.0002, 0.02


@pytest.fixture(scope="module")
def node(converged_node, tmp_path_factory):
    node = converged_node.node
    site_packages = f"{VENVS}/{CURRENT}/lib/python3.11/site-packages"
    for command in (
        f"python3 -m venv {CLIENT}",
        # addsitedir, not a bare path: the serving venv's own .pth files (the torchvision shim) must run too
        f"echo 'import site; site.addsitedir(\"{site_packages}\")' > {CLIENT}/lib/python3.11/site-packages/sglang-serving.pth",
        f"{CLIENT}/bin/pip install -q --no-deps --no-index --find-links /srv/wheelhouse -r /srv/wheelhouse/bench-requirements.txt",
        f"{CLIENT}/bin/python -c 'import sglang.bench_serving'",
        f"mkdir -p {TOKENIZER}",
    ):
        node_state.ssh(node, command)
    for name, content in tiny_tokenizer().items():
        node.ssh(f"cat > {TOKENIZER}/{name} <<'EOF'\n{content}\nEOF", check=True)
    node.folder = tmp_path_factory.mktemp("upgrade")
    return node


def _inventory(node, target_pace):
    """The node's inventory with the double's pace for the target in its environment (the current
    release is not in the mapping: its servers keep the environment they were converged with)."""
    inventory = yaml.safe_load(node.inventory.read_text())
    for variables in inventory["all"]["children"]["sglang_nodes"]["hosts"].values():
        variables["sglang_test_double_step_seconds_by_version"] = {TARGET: target_pace}
        variables["sglang_service_environment"] = {
            **VARS["sglang_service_environment"],
            "SGLANG_DOUBLE_STEP_SECONDS_BY_VERSION": (
                "{% for release, seconds in sglang_test_double_step_seconds_by_version.items() %}"
                "{{ release }}={{ seconds }}{{ '' if loop.last else ',' }}{% endfor %}"),
        }
    path = node.folder / f"inventory-{target_pace}.yml"
    path.write_text(yaml.safe_dump(inventory))
    return path


def _upgrade(node, inventory, **extravars):
    return run_playbook("playbooks/upgrade.yml", inventory, extravars={
        "sglang_version": TARGET,
        **upgrade_sources(TARGET),
        "sglang_upgrade_report_dir": str(node.folder / "reports"),
        "sglang_upgrade_gate_concurrency_levels": [4],
        "sglang_upgrade_gate_repetitions": 2,
        "sglang_benchmark_command": [f"{CLIENT}/bin/python", "-m", "sglang.bench_serving"],
        "sglang_benchmark_tokenizer": TOKENIZER,
        "sglang_benchmark_random_input_len": 32,
        "sglang_benchmark_random_output_len": 32,
        "sglang_benchmark_num_prompts": 8,
        **extravars,
    })


def _running_release(node):
    pid = node_state.main_pid(node)
    python = node_state.ssh(node, f"tr '\\0' '\\n' < /proc/{pid}/cmdline | head -n 1").strip()
    return python, node_state.ssh(node, f"{python} -c 'import importlib.metadata as m; print(m.version(\"sglang\"))'").strip()


def _pip_ran(result):
    return [e for e in result.events
            if e.get("event") == "runner_on_ok" and e["event_data"].get("task") == "Run pip install"]


def _history(node):
    result = node.ssh(f"cat {HISTORY}")
    return json.loads(result.stdout) if result.returncode == 0 else []


def test_a_slower_release_is_measured_rolled_back_with_no_pip_and_leaves_no_drift(node):
    inventory = _inventory(node, SLOW)
    # the first upgrade of this node: the canary keeps its way back in this very run
    assert node.ssh(f"test -e {WAY_BACK}").returncode != 0
    result = _upgrade(node, inventory)

    assert result.rc != 0
    (message,) = [m for m in result.failure_messages() if "is rolled back" in m]
    assert f"The upgrade of sglang {CURRENT} to {TARGET} is rolled back: concurrency 4: output_throughput" in message
    assert _running_release(node) == (f"{VENVS}/{CURRENT}/bin/python", CURRENT)
    # the target stays installed beside the current release: the next try needs no pip
    assert sorted(node_state.ssh(node, f"ls -1 {VENVS}").split()) == sorted([CURRENT, TARGET])
    assert json.loads(node_state.ssh(node, f"cat {RECORD}")) == {"serving": CURRENT, "previous": TARGET}
    (entry,) = _history(node)
    assert (entry["from"], entry["to"], entry["decision"]) == (CURRENT, TARGET, "rolled back")
    figures = entry["gate"]["levels"][0]["metrics"]["output_throughput"]
    assert figures["canary"] < figures["control"] and not figures["passed"]
    doc = node_state.ssh(node, "cat /root/production_v2.md")
    assert f"| {CURRENT} | {TARGET} | {node.name} |" in doc and "rolled back" in doc
    gate = json.loads((node.folder / "reports" / f"sglang-{CURRENT}-to-{TARGET}-gate.json").read_text())
    assert gate["passed"] is False and gate["repetitions"] == {"canary": 2, "control": 2}

    assert node.ssh(f"test -e {WAY_BACK}").returncode != 0, "the way back is removed once the node went back"
    # against the inventory the node was converged with before the upgrade (the one without the target's pace)
    scan = run_playbook("playbooks/drift.yml", node.inventory)
    assert scan.rc == 0 and scan.changed == 0, scan.failure_messages() or scan.changed_tasks()


def test_a_canary_that_never_gets_healthy_is_rolled_back_and_nothing_else_changes(node):
    inventory = _inventory(node, SLOW)
    before = node_state.fingerprint(node, node_state.managed_paths(node))
    history = _history(node)
    result = _upgrade(node, inventory, sglang_service_health_timeout=15, sglang_service_environment={
        **VARS["sglang_service_environment"], "SGLANG_DOUBLE_NEVER_HEALTHY": "1"})

    assert result.rc != 0
    assert any("Rolled back to the last good configuration" in m for m in result.failure_messages()), result.failure_messages()
    node_state.wait_healthy(node, 120)
    assert _running_release(node) == (f"{VENVS}/{CURRENT}/bin/python", CURRENT)
    assert json.loads(node_state.ssh(node, f"cat {RECORD}")) == {"serving": CURRENT, "previous": TARGET}
    assert _history(node) == history, "a canary that never served is no upgrade the gate judged"
    after = node_state.fingerprint(node, node_state.managed_paths(node))
    assert node_state.differences(before, after) == [], "the rollback left the node changed"
    # All that is left: the way back the canary kept before it moved (the next run takes it again).
    assert node_state.ssh(node, f"cat {WAY_BACK}/release").strip() == CURRENT


def test_a_faster_release_is_promoted_with_its_own_venv_and_recorded(node):
    inventory = _inventory(node, FAST)
    result = _upgrade(node, inventory)

    assert result.rc == 0, result.failure_messages() or result.stdout[-6000:]
    assert not _pip_ran(result), "the target's venv was kept by the rollback: no pip"
    node_state.wait_healthy(node, 120)
    assert _running_release(node) == (f"{VENVS}/{TARGET}/bin/python", TARGET)
    assert json.loads(node_state.ssh(node, f"cat {RECORD}")) == {"serving": TARGET, "previous": CURRENT}
    assert [e["decision"] for e in _history(node)] == ["rolled back", "promoted"]
    assert any(f'Set sglang_version: "{TARGET}"' in m for m in result.messages()), "the inventory's next step is not said"
    doc = node_state.ssh(node, "cat /root/production_v2.md")
    assert "| promoted | gate passed |" in doc

    # until the inventory names the target, a drift scan names the node as running another release
    scan = run_playbook("playbooks/drift.yml", inventory)
    assert scan.rc != 0
    assert any(f"runs SGLang {TARGET}, the inventory says {CURRENT}" in m for m in scan.failure_messages())
