"""Prometheus on the gateway fleet's monitor (conftest's gateway_fleet: 3 serving nodes, one
gateway, one monitor, converged once).

Prometheus (Debian's package, installed from the harness's .deb cache) scrapes the three servers,
the gateway's own metrics, the five node exporters and its Alertmanager (Debian's, turned on by
the fleet's inventory), and evaluates the project's rules; stopping a server fires
SGLangServerDown within its `for:`, and Alertmanager sends it to the webhook receiver, then its
resolution; a scrape configuration, a rule and Alertmanager's configuration edited by hand are
repaired by one run, with reloads (same MainPIDs), not restarts; Alertmanager turned off is
stopped and Prometheus no longer sends to it. (A second run of the whole fleet, the monitor
included, changing nothing: test_gateway.py.)

The tests share the fleet and run in file order (each leaves it healthy and converged). Scrape and
evaluation intervals and the alert's `for:` are shortened by the fleet's inventory
(gateway_fleet.FLEET_MONITOR_VARS), so waits stay short; every wait polls the monitor's API and
is bounded.
"""

import json
import re
import shlex
import time


import alertmanager_checks as alertmanager
from alertmanager_checks import wait_for as _wait_for
from ansible_run import run_playbook
from node_state import failure_messages
from gateway_fleet import FLEET_SCRAPE_SECONDS as SCRAPE_SECONDS
from gateway_fleet import FLEET_SERVER_DOWN_FOR_SECONDS as SERVER_DOWN_FOR_SECONDS

GATEWAY_METRICS_PORT = 29000  # inventory/testnode/group_vars/sglang_gateways.yml: prometheus_port
# systemd-analyze security's exposure of Debian's units with the role's drop-in (Debian's own
# node exporter and Alertmanager units: 9.2 UNSAFE; the project's sglang.service: 1.6; measured offline
# by tests/roles/monitoring/test_unit_hardening.py: 1.5 and 1.2).
EXPOSURE_BOUND = 2.0
DROPIN = "sglang-canon-hardening.conf"
RULES = "/etc/prometheus/rules/sglang.rules.yml"


def _api(monitor, path):
    done = monitor.ssh(f"curl -sf 'http://127.0.0.1:9090/api/v1/{path}'", check=True)
    return json.loads(done.stdout)["data"]


def _targets(monitor):
    return {(t["labels"]["job"], t["labels"]["node"]): t for t in _api(monitor, "targets")["activeTargets"]}


def _firing(monitor, alertname):
    return [a["labels"]["node"] for a in _api(monitor, "alerts")["alerts"]
            if a["labels"]["alertname"] == alertname and a["state"] == "firing"]


def _prometheus_pid(monitor):
    return monitor.ssh("systemctl show --property=MainPID --value prometheus", check=True).stdout.strip()


def test_prometheus_reports_every_target_up(gateway_fleet):
    fleet = gateway_fleet
    monitor, servers = fleet.monitor, fleet.nodes
    want = ({("sglang", node.name) for node in servers} | {("node", host.name) for host in fleet.hosts}
            | {("sglang_gateway", fleet.gateway.name), ("alertmanager", monitor.name)})
    # Prometheus hands a new configuration's targets to its scrape manager a few seconds after it
    # is ready (discovery updates are batched), so the set is polled, not read once.
    _wait_for("the target of every exporter", lambda: set(_targets(monitor)) == want, timeout=30,
              describe=lambda: sorted(_targets(monitor)))
    _wait_for("every target up", lambda: all(t["health"] == "up" for t in _targets(monitor).values()), timeout=30,
              describe=lambda: {k: (t["health"], t["lastError"]) for k, t in _targets(monitor).items()})
    targets = _targets(monitor)
    for node in servers:
        assert targets[("sglang", node.name)]["scrapeUrl"] == f"http://{node.ip}:30000/metrics"
    # the gateway's own metrics (sglang-router's Prometheus endpoint, on the gateway's address)
    assert targets[("sglang_gateway", fleet.gateway.name)]["scrapeUrl"] == (
        f"http://{fleet.gateway.ip}:{GATEWAY_METRICS_PORT}/metrics")
    # The rules are loaded: the 9 alerts of the project, nothing firing on a healthy fleet.
    rules = [rule["name"] for group in _api(monitor, "rules")["groups"] for rule in group["rules"]]
    assert len(rules) == 9 and "SGLangServerDown" in rules
    assert [a for a in _api(monitor, "alerts")["alerts"] if a["state"] == "firing"] == []
    host = monitor.testinfra_host()
    assert host.service("prometheus").is_enabled and host.service("prometheus").is_running
    assert host.socket("tcp://127.0.0.1:9090").is_listening
    assert not host.socket("tcp://0.0.0.0:9090").is_listening
    for host in fleet.hosts:
        exporter = host.testinfra_host().service("prometheus-node-exporter")
        assert exporter.is_enabled and exporter.is_running
    alertmanager.check_alertmanager_runs(monitor)
    alertmanager.check_prometheus_lists_the_alertmanager(monitor)


def _exposure(host, unit):
    report = host.ssh(f"systemd-analyze security --no-pager {unit}.service", check=True).stdout
    return float(re.search(rf"Overall exposure level for {re.escape(unit)}\.service: ([0-9.]+)", report).group(1))


def test_debian_units_run_hardened_by_their_drop_ins_and_still_collect(gateway_fleet):
    fleet, monitor = gateway_fleet, gateway_fleet.monitor
    units = [(host, "prometheus-node-exporter") for host in fleet.hosts]
    units += [(monitor, "prometheus"), (monitor, "prometheus-alertmanager")]
    scores = {}
    for host, unit in units:
        assert host.ssh(f"test -f /etc/systemd/system/{unit}.service.d/{DROPIN}").returncode == 0, (host.name, unit)
        show = {prop: host.ssh(f"systemctl show -P {prop} {unit}", check=True).stdout.strip()
                for prop in ("ActiveState", "ProtectSystem", "CapabilityBoundingSet", "NoNewPrivileges")}
        assert show == {"ActiveState": "active", "ProtectSystem": "strict", "CapabilityBoundingSet": "",
                        "NoNewPrivileges": "yes"}, (host.name, unit, show)
        scores[(host.name, unit)] = _exposure(host, unit)
    print("systemd-analyze security:", scores)
    assert all(score <= EXPOSURE_BOUND for score in scores.values()), scores
    # Confined, each still does its work: the node exporters are scraped (every target up:
    # test_prometheus_reports_every_target_up; an alert reaches the webhook: the test after), read
    # /proc and the watchdog's textfile on the serving nodes, with no read error.
    def textfile_nodes():
        series = _api(monitor, "query?query=" + "node_textfile_mtime_seconds%7Bfile%3D~%22.*sglang_watchdog.prom%22%7D")
        return sorted(sample["metric"]["node"] for sample in series["result"])
    written = sorted(node.name for node in fleet.nodes
                     if node.ssh("test -s /var/lib/prometheus/node-exporter/sglang_watchdog.prom").returncode == 0)
    assert written, "no serving node has the watchdog's textfile"
    _wait_for("the watchdog's textfile collected", lambda: textfile_nodes() == written, timeout=30,
              describe=textfile_nodes)
    errors = _api(monitor, "query?query=node_textfile_scrape_error")["result"]
    assert errors and all(sample["value"][1] == "0" for sample in errors), errors
    for metric in ("node_memory_MemTotal_bytes", "node_load1"):  # /proc/meminfo, /proc/loadavg
        samples = _api(monitor, f"query?query={metric}")["result"]
        assert sorted(sample["metric"]["node"] for sample in samples) == sorted(host.name for host in fleet.hosts)


def test_each_argument_reaches_its_program_as_one_word(gateway_fleet):
    # /etc/default's ARGS holds each argument single-quoted: systemd passes it as one argv word,
    # so a value with a space cannot add a flag (issue 38: --web.enable-admin-api via retention).
    monitor = gateway_fleet.monitor
    pid = _prometheus_pid(monitor)
    argv = monitor.ssh(f"cat /proc/{pid}/cmdline", check=True).stdout.split("\0")[:-1]
    assert argv[1:] == ["--config.file=/etc/prometheus/prometheus.yml", "--web.listen-address=127.0.0.1:9090",
                        "--storage.tsdb.retention.time=15d"], argv
    assert "'" in monitor.ssh("grep ^ARGS= /etc/default/prometheus", check=True).stdout


def test_alertmanager_shows_nothing_of_its_receivers_to_a_local_user(gateway_fleet):
    monitor = gateway_fleet.monitor
    sink_url = alertmanager.VARIABLES["sglang_monitoring_alertmanager_receivers"][0]["webhook_configs"][0]["url"]
    # root, with the password, sees the configuration (the receiver's URL is what it shows) ...
    assert sink_url in alertmanager.live_config(monitor)
    # ... a local user without it gets 401 and nothing of it, from the API, the UI's API or metrics
    for path in ("/api/v2/status", "/api/v2/receivers", "/api/v1/status", "/metrics", "/"):
        asked = monitor.ssh(f"runuser -u nobody -- curl -s -w '\\n%{{http_code}}' "
                            f"{shlex.quote(alertmanager.ALERTMANAGER + path)}", check=True).stdout
        body, _, code = asked.rpartition("\n")
        assert code == "401", (path, asked)
        assert sink_url not in body and "9099" not in body, (path, body)
    # and cannot read the password, nor the configuration
    for path in (alertmanager.PASSWORD_FILE, alertmanager.WEB_CONFIG, alertmanager.CONFIG):
        assert monitor.ssh(f"runuser -u nobody -- cat {path}").returncode != 0, path


def test_stopping_a_server_fires_its_alert_within_the_rules_for_and_notifies_the_receiver(gateway_fleet):
    monitor = gateway_fleet.monitor
    stopped, *running = gateway_fleet.nodes
    alertmanager.start_sink(monitor)
    try:
        stopped.ssh("systemctl stop sglang", check=True)
        try:
            start = time.monotonic()
            # for: plus a scrape and an evaluation to notice, and one more of each for slack.
            _wait_for("SGLangServerDown firing", lambda: _firing(monitor, "SGLangServerDown"),
                      timeout=SERVER_DOWN_FOR_SECONDS + 4 * SCRAPE_SECONDS + 5)
            took = time.monotonic() - start
            assert _firing(monitor, "SGLangServerDown") == [stopped.name]
            assert took >= SERVER_DOWN_FOR_SECONDS - 1, f"fired after {took:.1f} s, before its for: ({SERVER_DOWN_FOR_SECONDS} s)"
            assert not set(_firing(monitor, "SGLangServerDown")) & {node.name for node in running}
            # Prometheus sent it to Alertmanager, which notified the receiver, naming the node.
            _wait_for("SGLangServerDown at Alertmanager",
                      lambda: alertmanager.active_alerts(monitor, "SGLangServerDown") == [stopped.name], timeout=30,
                      describe=lambda: alertmanager.active_alerts(monitor, "SGLangServerDown"))
            _wait_for("the webhook notified of SGLangServerDown",
                      lambda: alertmanager.notified(monitor, "SGLangServerDown", stopped.name), timeout=30,
                      describe=lambda: alertmanager.posted(monitor))
            (body, *_) = alertmanager.notified(monitor, "SGLangServerDown", stopped.name)
            assert body["receiver"] == "sink"
            assert body["groupLabels"] == {"alertname": "SGLangServerDown", "node": stopped.name}
        finally:
            stopped.ssh("systemctl start sglang", check=True)
        _wait_for("the server scraped again",
                  lambda: _targets(monitor).get(("sglang", stopped.name), {}).get("health") == "up", timeout=60)
        _wait_for("SGLangServerDown resolved", lambda: not _firing(monitor, "SGLangServerDown"), timeout=10)
        _wait_for("the webhook notified of the resolution",
                  lambda: alertmanager.notified(monitor, "SGLangServerDown", stopped.name, status="resolved"),
                  timeout=30, describe=lambda: alertmanager.posted(monitor))
    finally:
        alertmanager.stop_sink(monitor)


def test_hand_edits_of_scrape_config_rules_and_alertmanager_are_repaired_by_one_run_with_reloads(gateway_fleet):
    monitor = gateway_fleet.monitor
    pid, alertmanager_pid = _prometheus_pid(monitor), alertmanager.pid(monitor)
    monitor.ssh(f"sed -i 's/scrape_interval: {SCRAPE_SECONDS}s/scrape_interval: 7s/' /etc/prometheus/prometheus.yml"
                " && sed -i 's/for: 5s/for: 9m/' /etc/prometheus/rules/sglang.rules.yml && systemctl reload prometheus"
                f" && sed -i 's/\"repeat_interval\": \"1m\"/\"repeat_interval\": \"7m\"/' {alertmanager.CONFIG}"
                " && systemctl reload prometheus-alertmanager",
                check=True)
    _wait_for("the hand edit live", lambda: "scrape_interval: 7s" in _api(monitor, "status/config")["yaml"], timeout=20)
    # Alertmanager's API shows the configuration it runs re-marshalled as YAML.
    _wait_for("the Alertmanager hand edit live", lambda: "repeat_interval: 7m" in alertmanager.live_config(monitor),
              timeout=20)

    repaired = gateway_fleet.converge(tags=["sglang_monitoring"])
    assert repaired.rc == 0, repaired.stdout[-5000:]
    changed = sorted(task.split(": ", 1)[1] for task in repaired.changed_tasks())
    # Alertmanager's configuration task is no_log (receivers may hold secrets): its event shows no
    # result, so its change is read from the stats (five on the monitor) and from its handler.
    assert changed == sorted([
        "Reload prometheus",
        "Reload prometheus-alertmanager",
        "Write the alert rules (checked by promtool check rules)",
        "Write the scrape configuration (checked by promtool check config)",
    ]), changed
    assert repaired.count("changed", monitor.name) == 5 and repaired.changed == 5, repaired.stats
    assert all(task.startswith(monitor.name + ":") for task in repaired.changed_tasks())
    assert _prometheus_pid(monitor) == pid  # reloaded, not restarted
    assert alertmanager.pid(monitor) == alertmanager_pid
    config = _api(monitor, "status/config")["yaml"]
    assert f"scrape_interval: {SCRAPE_SECONDS}s" in config and "scrape_interval: 7s" not in config
    server_down = [rule for group in _api(monitor, "rules")["groups"] for rule in group["rules"]
                   if rule["name"] == "SGLangServerDown"]
    assert server_down[0]["duration"] == SERVER_DOWN_FOR_SECONDS
    # The role waited until Alertmanager ran the file on disk: no wait needed here.
    live = alertmanager.live_config(monitor)
    assert "repeat_interval: 1m" in live and "repeat_interval: 7m" not in live

    again = gateway_fleet.converge(tags=["sglang_monitoring"])
    assert again.rc == 0 and again.changed == 0, again.changed_tasks()


def test_alertmanager_turned_off_is_stopped_and_prometheus_sends_to_it_no_more(gateway_fleet):
    monitor = gateway_fleet.monitor
    off = gateway_fleet.converge(tags=["sglang_monitoring"], extravars=alertmanager.OFF)
    assert off.rc == 0, off.stdout[-5000:]
    alertmanager.check_prometheus_without_alertmanager(monitor)
    # back on (the fleet's inventory): the files after this one find the fleet as it was
    on = gateway_fleet.converge(tags=["sglang_monitoring"])
    assert on.rc == 0, on.stdout[-5000:]
    alertmanager.check_alertmanager_runs(monitor)
    alertmanager.check_prometheus_lists_the_alertmanager(monitor)


def test_drift_scan_names_an_edited_rule_and_a_stopped_alertmanager_and_one_run_repairs_both(gateway_fleet):
    # Issue 38: drift.yml ignored the monitor (rc 0 with both). The fleet comes converged (each
    # file leaves it so); only the monitor may be named in the drifted report, and the monitor's
    # scan after the repair, which must pass, shows the report is not always red.
    monitor = gateway_fleet.monitor
    monitor.ssh(f"sed -i 's/for: 5s/for: 9m/' {RULES} && systemctl stop prometheus-alertmanager", check=True)
    try:
        scan = run_playbook("playbooks/drift.yml", gateway_fleet.inventory)
        assert scan.rc != 0, "drift.yml exited 0 with the monitor drifted"
        (report,) = [m for m in failure_messages(scan) if m.startswith(f"{monitor.name} drifted: ")]
        assert "Write the alert rules (checked by promtool check rules)" in report, report
        assert "Keep Alertmanager enabled and running" in report, report
        assert not [m for m in failure_messages(scan) if " drifted: " in m and not m.startswith(monitor.name)]
        # the scan changed nothing
        assert monitor.ssh(f"grep -c 'for: 9m' {RULES}").stdout.strip() != "0"
        assert monitor.ssh("systemctl is-active prometheus-alertmanager").stdout.strip() != "active"
    finally:
        # the monitor alone drifted (the scan above names no other host): one run limited to it
        # (and the gateways, which publish the endpoint it scrapes) repairs
        repair = gateway_fleet.converge(limit=f"{monitor.name},sglang_gateways")
    assert repair.rc == 0, failure_messages(repair)
    alertmanager.check_alertmanager_runs(monitor)
    again = run_playbook("playbooks/drift.yml", gateway_fleet.inventory, limit=f"{monitor.name},sglang_gateways")
    assert again.rc == 0, failure_messages(again)
