"""Two serving nodes and one monitor (tests/testnode up 2 --monitor), converged once by site.yml.

Prometheus (Debian's package, installed from the harness's .deb cache) scrapes both servers, the
three node exporters, and evaluates the project's rules; stopping a server fires SGLangServerDown
within its `for:`; a second run changes nothing; a scrape configuration and a rule edited by hand
are repaired by one run, with a reload (same MainPID), not a restart.

The tests of the module share the nodes and run in file order (each leaves the fleet healthy).
Scrape/evaluation intervals and the alert's `for:` are shortened by variables, so waits stay short;
every wait polls the monitor's API and is bounded.
"""

import json
import time
from pathlib import Path

import pytest
import yaml

from ansible_run import run_playbook

REPO = Path(__file__).resolve().parents[2]
SCRAPE_SECONDS = 1
SERVER_DOWN_FOR_SECONDS = 5


def _extravars():
    # The canonical server listens on loopback; a monitor scrapes it at the node's address.
    # Extra vars reach the monitor too, where the sglang role's defaults (sglang_worker_port, which
    # the canonical args template) are not defined: give the port as a value.
    defaults = yaml.safe_load((REPO / "roles" / "sglang" / "defaults" / "main.yml").read_text())
    server_args = defaults["sglang_server_args"]
    return {
        "sglang_server_args": {**server_args, "host": "0.0.0.0", "port": defaults["sglang_worker_port"],
                               "enable_metrics": True},
        "sglang_monitoring_scrape_interval": f"{SCRAPE_SECONDS}s",
        "sglang_monitoring_evaluation_interval": f"{SCRAPE_SECONDS}s",
        "sglang_monitoring_alert_server_down_for": f"{SERVER_DOWN_FOR_SECONDS}s",
    }


def converge(node_set, **kwargs):
    return run_playbook("site.yml", node_set.inventory, extravars=_extravars(), **kwargs)


@pytest.fixture(scope="module")
def fleet(node_sets, converged_snapshot):
    # Serving nodes start converged (the worker's snapshot); this run moves their servers off
    # loopback and sets up the monitor, which starts from the base image.
    node_set = node_sets("monitoring", 2, monitor=True, from_snapshot=converged_snapshot.directory)
    first = converge(node_set)
    assert first.rc == 0, first.stdout[-5000:]
    return node_set


def _monitor(fleet):
    (monitor,) = [node for node in fleet.nodes() if node.group == "sglang_monitors"]
    return monitor


def _servers(fleet):
    return [node for node in fleet.nodes() if node.group == "sglang_nodes"]


def _api(monitor, path):
    done = monitor.ssh(f"curl -sf 'http://127.0.0.1:9090/api/v1/{path}'", check=True)
    return json.loads(done.stdout)["data"]


def _wait_for(what, probe, timeout, describe=None):
    """Poll probe() until it returns something true; fail naming what and the last state."""
    end = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > end:
            pytest.fail(f"{what} not within {timeout} s; last: {describe() if describe else value!r}")
        time.sleep(0.5)


def _targets(monitor):
    return {(t["labels"]["job"], t["labels"]["node"]): t for t in _api(monitor, "targets")["activeTargets"]}


def _firing(monitor, alertname):
    return [a["labels"]["node"] for a in _api(monitor, "alerts")["alerts"]
            if a["labels"]["alertname"] == alertname and a["state"] == "firing"]


def _prometheus_pid(monitor):
    return monitor.ssh("systemctl show --property=MainPID --value prometheus", check=True).stdout.strip()


def test_prometheus_reports_every_target_up(fleet):
    monitor = _monitor(fleet)
    servers = _servers(fleet)
    want = {("sglang", node.name) for node in servers} | {("node", node.name) for node in fleet.nodes()}
    # Prometheus hands a new configuration's targets to its scrape manager a few seconds after it
    # is ready (discovery updates are batched), so the set is polled, not read once.
    # No gateway in the inventory: no gateway target.
    _wait_for("the target of every exporter", lambda: set(_targets(monitor)) == want, timeout=30,
              describe=lambda: sorted(_targets(monitor)))
    _wait_for("every target up", lambda: all(t["health"] == "up" for t in _targets(monitor).values()), timeout=30,
              describe=lambda: {k: (t["health"], t["lastError"]) for k, t in _targets(monitor).items()})
    targets = _targets(monitor)
    for node in servers:
        assert targets[("sglang", node.name)]["scrapeUrl"] == f"http://{node.ip}:30000/metrics"
    # The rules are loaded: the 8 alerts of the project, nothing firing on a healthy fleet.
    rules = [rule["name"] for group in _api(monitor, "rules")["groups"] for rule in group["rules"]]
    assert len(rules) == 8 and "SGLangServerDown" in rules
    assert [a for a in _api(monitor, "alerts")["alerts"] if a["state"] == "firing"] == []
    host = monitor.testinfra_host()
    assert host.service("prometheus").is_enabled and host.service("prometheus").is_running
    assert host.socket("tcp://127.0.0.1:9090").is_listening
    assert not host.socket("tcp://0.0.0.0:9090").is_listening
    for node in fleet.nodes():
        exporter = node.testinfra_host().service("prometheus-node-exporter")
        assert exporter.is_enabled and exporter.is_running


def test_second_run_changes_nothing(fleet):
    again = converge(fleet)
    assert again.rc == 0, again.stdout[-5000:]
    assert again.changed == 0, again.changed_tasks()


def test_stopping_a_server_fires_its_alert_within_the_rules_for(fleet):
    monitor = _monitor(fleet)
    stopped, running = _servers(fleet)
    stopped.ssh("systemctl stop sglang", check=True)
    try:
        start = time.monotonic()
        # for: plus a scrape and an evaluation to notice, and one more of each for slack.
        _wait_for("SGLangServerDown firing", lambda: _firing(monitor, "SGLangServerDown"),
                  timeout=SERVER_DOWN_FOR_SECONDS + 4 * SCRAPE_SECONDS + 5)
        took = time.monotonic() - start
        assert _firing(monitor, "SGLangServerDown") == [stopped.name]
        assert took >= SERVER_DOWN_FOR_SECONDS - 1, f"fired after {took:.1f} s, before its for: ({SERVER_DOWN_FOR_SECONDS} s)"
        assert running.name not in _firing(monitor, "SGLangServerDown")
    finally:
        stopped.ssh("systemctl start sglang", check=True)
    _wait_for("the server scraped again", lambda: _targets(monitor).get(("sglang", stopped.name), {}).get("health") == "up",
              timeout=60)
    _wait_for("SGLangServerDown resolved", lambda: not _firing(monitor, "SGLangServerDown"), timeout=10)


def test_hand_edits_of_scrape_config_and_rules_are_repaired_by_one_run_with_a_reload(fleet):
    monitor = _monitor(fleet)
    pid = _prometheus_pid(monitor)
    monitor.ssh("sed -i 's/scrape_interval: 1s/scrape_interval: 7s/' /etc/prometheus/prometheus.yml"
                " && sed -i 's/for: 5s/for: 9m/' /etc/prometheus/rules/sglang.rules.yml && systemctl reload prometheus",
                check=True)
    _wait_for("the hand edit live", lambda: "scrape_interval: 7s" in _api(monitor, "status/config")["yaml"], timeout=20)

    repaired = converge(fleet, tags=["sglang_monitoring"])
    assert repaired.rc == 0, repaired.stdout[-5000:]
    changed = sorted(task.split(": ", 1)[1] for task in repaired.changed_tasks())
    assert changed == [
        "Reload prometheus",
        "Write the alert rules (checked by promtool check rules)",
        "Write the scrape configuration (checked by promtool check config)",
    ], changed
    assert all(task.startswith(monitor.name + ":") for task in repaired.changed_tasks())
    assert _prometheus_pid(monitor) == pid  # reloaded, not restarted
    config = _api(monitor, "status/config")["yaml"]
    assert "scrape_interval: 1s" in config and "scrape_interval: 7s" not in config
    server_down = [rule for group in _api(monitor, "rules")["groups"] for rule in group["rules"]
                   if rule["name"] == "SGLangServerDown"]
    assert server_down[0]["duration"] == SERVER_DOWN_FOR_SECONDS

    again = converge(fleet, tags=["sglang_monitoring"])
    assert again.rc == 0 and again.changed == 0, again.changed_tasks()
