"""A fleet of three test nodes: batched rollout gated by health, and a rolling restart.

The middle node is given a configuration whose server never gets healthy: it is rolled
back, the first node keeps its new configuration, and the third node is not touched.
"""

import json

import pytest
import yaml

from ansible_run import run_playbook

NEW_ENVIRONMENT = {"SGLANG_ENABLE_SPEC_V2": "1", "SGLANG_DOUBLE_WARMUP_SECONDS": "1"}


def _main_pid(node):
    return node.ssh("systemctl show --property=MainPID --value sglang.service").stdout.strip()


def _environ(node):
    """The server's environment, NAME=value each (/proc/PID/environ holds NUL-terminated strings)."""
    return node.testinfra_host().file(f"/proc/{_main_pid(node)}/environ").content_string.split("\0")[:-1]


def _healthy(node):
    code = node.ssh("curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:30000/health").stdout
    return code == "200"


def _sha(node, path):
    return node.testinfra_host().file(path).sha256sum


@pytest.fixture(scope="module")
def fleet(node_sets, converged_snapshot):
    """Three nodes converged by site.yml. They start from the worker's converged snapshot, each
    with its own name, address and keys, so this converge has only what differs to do (the
    record names its node) instead of three first installs."""
    node_set = node_sets("fleet", 3, from_snapshot=converged_snapshot.directory)
    first = run_playbook("site.yml", node_set.inventory)
    assert first.rc == 0, first.stdout[-5000:]
    return node_set


def _changes_outside_the_scan(result, host):
    return [
        e["event_data"]["task"] for e in result.events
        if e["event"] == "runner_on_ok" and e["event_data"].get("host") == host
        and e["event_data"].get("res", {}).get("changed")
        and not e["event_data"].get("play", "").startswith("Find what would change")
    ]


def _inventory_with_host_vars(node_set, tmp_path, host_vars):
    inventory = yaml.safe_load(node_set.inventory.read_text())
    hosts = inventory["all"]["children"]["sglang_nodes"]["hosts"]
    for name, extra in host_vars.items():
        hosts[name].update(extra)
    path = tmp_path / "fleet-inventory.yml"
    path.write_text(yaml.safe_dump(inventory))
    return path


def _plays_with_hosts(result):
    """(play name, hosts with a task result in it) for each play that ran on a host, batches
    included, in order. Plays for groups this fleet has no host in (gateways, monitors) are left
    out: they start and match no host."""
    plays = []
    for event in result.events:
        data = event.get("event_data", {})
        if event["event"] == "playbook_on_play_start":
            plays.append((data["play"], set()))
        elif event["event"].startswith("runner_on_") and data.get("host"):
            plays[-1][1].add(data["host"])
    return [(name, hosts) for name, hosts in plays if hosts]


def test_checks_run_on_all_nodes_then_each_drifted_node_converges_in_its_own_batch(fleet):
    nodes = fleet.nodes()
    names = {node.name for node in nodes}
    for node in nodes:
        node.ssh("echo '# edited by hand' >> /etc/sglang/sglang.env", check=True)

    result = run_playbook("site.yml", fleet.inventory)

    assert result.rc == 0, result.failure_messages()
    (check, check_hosts), (scan, scan_hosts), *batches = _plays_with_hosts(result)
    assert check.startswith("Check every node") and check_hosts == names
    assert scan.startswith("Find what would change") and scan_hosts == names
    assert [name for name, _ in batches] == [batches[0][0]] * 3 and batches[0][0].startswith("Converge")
    # one node per batch, in the inventory's order (not the order the scan finished in)
    assert [hosts for _, hosts in batches] == [{node.name} for node in nodes]
    assert all(_healthy(node) for node in nodes)


def test_a_converged_fleet_is_checked_and_left_alone(fleet):
    names = {node.name for node in fleet.nodes()}
    result = run_playbook("site.yml", fleet.inventory)
    assert result.rc == 0 and result.changed == 0, result.changed_tasks()
    plays = _plays_with_hosts(result)
    assert [hosts for _, hosts in plays[:2]] == [names, names]
    assert [name for name, hosts in plays[2:] if hosts] == []
    assert "Could not match supplied host pattern" not in result.stdout


def test_a_node_failing_its_health_check_stops_the_rollout_after_its_batch(fleet, tmp_path):
    first, middle, last = fleet.nodes()
    last_env_sha = _sha(last, "/etc/sglang/sglang.env")
    last_pid = _main_pid(last)
    middle_env_sha = _sha(middle, "/etc/sglang/sglang.env")
    inventory = _inventory_with_host_vars(fleet, tmp_path, {
        first.name: {"sglang_service_environment": NEW_ENVIRONMENT},
        middle.name: {"sglang_service_environment": {**NEW_ENVIRONMENT, "SGLANG_DOUBLE_NEVER_HEALTHY": "1"},
                      "sglang_service_health_timeout": 20},
        last.name: {"sglang_service_environment": NEW_ENVIRONMENT},
    })

    result = run_playbook("site.yml", inventory)

    assert result.rc != 0
    assert result.count("failures", middle.name) == 1
    assert any("Rolled back to the last good configuration" in m for m in result.failure_messages())
    # the batch before the failure kept its new configuration and serves
    assert "SGLANG_DOUBLE_WARMUP_SECONDS=1" in _environ(first) and _healthy(first)
    # the failing node serves again on its old configuration
    assert _sha(middle, "/etc/sglang/sglang.env") == middle_env_sha
    assert "SGLANG_DOUBLE_NEVER_HEALTHY=1" not in _environ(middle) and _healthy(middle)
    # the batch after the failure was not touched: only the check-mode scan looked at it
    assert _changes_outside_the_scan(result, last.name) == []
    assert _sha(last, "/etc/sglang/sglang.env") == last_env_sha and _main_pid(last) == last_pid and _healthy(last)


def test_rolling_restart_restarts_every_node_one_at_a_time(fleet):
    nodes = fleet.nodes()
    before = {node.name: _main_pid(node) for node in nodes}
    result = run_playbook("playbooks/rolling_restart.yml", fleet.inventory)
    assert result.rc == 0, result.stdout[-3000:]
    batches = [e for e in result.events if e["event"] == "playbook_on_play_start"]
    assert len(batches) == len(nodes)
    for node in nodes:
        assert _main_pid(node) != before[node.name]
        assert _healthy(node)
    assert json.loads(nodes[0].ssh("curl -sf http://127.0.0.1:30000/server_info").stdout)["double"] is True
