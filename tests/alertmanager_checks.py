"""The optional Alertmanager of roles/sglang_monitoring, as tests/integration/test_monitoring.py
checks it on the gateway fleet's monitor.

The fleet's inventory turns it on (VARIABLES, in gateway_fleet.FLEET_MONITOR_VARS) with one
receiver: a webhook to a tiny HTTP sink on the monitor (python3, started as a transient systemd
unit over SSH by start_sink) that appends every body posted to it to a file. Every wait polls and
is bounded.
"""

import json
import shlex
import time

import pytest

ALERTMANAGER = "http://127.0.0.1:9093"
PROMETHEUS = "http://127.0.0.1:9090"
SINK_UNIT = "sglang-test-alert-sink"
SINK_PORT = 9099
SINK_FILE = "/tmp/sglang-test-alert-sink.jsonl"
CONFIG = "/etc/prometheus/alertmanager.yml"
# Alertmanager's API asks for basic auth (roles/sglang_monitoring/vars/main.yml): user prometheus,
# the password in a file only root and group prometheus read. These checks ask as root, with it.
USER = "prometheus"
PASSWORD_FILE = "/etc/prometheus/alertmanager-api.password"
WEB_CONFIG = "/etc/prometheus/alertmanager-web.yml"
CONFIG_TASK = "Write Alertmanager's configuration (checked by amtool check-config)"

# Short waits, so that a notification follows its alert within seconds.
ROUTE = {"receiver": "sink", "group_by": ["alertname", "node"], "group_wait": "1s", "group_interval": "1s",
         "repeat_interval": "1m"}
VARIABLES = {
    "sglang_monitoring_alertmanager_enabled": True,
    "sglang_monitoring_alertmanager_receivers": [
        {"name": "sink", "webhook_configs": [{"url": f"http://127.0.0.1:{SINK_PORT}/hook", "send_resolved": True}]},
    ],
    "sglang_monitoring_alertmanager_route": ROUTE,
}
OFF = {"sglang_monitoring_alertmanager_enabled": False}

SINK = f"""
import http.server
class Sink(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        with open({SINK_FILE!r}, "ab") as out:
            out.write(body.replace(b"\\n", b" ") + b"\\n")
        self.send_response(200)
        self.end_headers()
http.server.HTTPServer(("127.0.0.1", {SINK_PORT}), Sink).serve_forever()
"""


def wait_for(what, probe, timeout, describe=None):
    """Poll probe() until it returns something true; fail naming what and the last state."""
    end = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > end:
            pytest.fail(f"{what} not within {timeout} s; last: {describe() if describe else value!r}")
        time.sleep(0.5)


def _get(monitor, url):
    auth = f'--user "{USER}:$(cat {PASSWORD_FILE})" ' if url.startswith(ALERTMANAGER) else ""
    return json.loads(monitor.ssh(f"curl -sf {auth}{shlex.quote(url)}", check=True).stdout)


def pid(monitor):
    return monitor.ssh("systemctl show --property=MainPID --value prometheus-alertmanager", check=True).stdout.strip()


def live_config(monitor):
    """The configuration Alertmanager runs, as its API shows it (re-marshalled YAML)."""
    return _get(monitor, f"{ALERTMANAGER}/api/v2/status")["config"]["original"]


def active_alerts(monitor, alertname):
    """Nodes of the alerts named alertname that Alertmanager holds active."""
    return sorted(a["labels"].get("node", "") for a in _get(monitor, f"{ALERTMANAGER}/api/v2/alerts")
                  if a["labels"].get("alertname") == alertname and a["status"]["state"] == "active")


def posted(monitor):
    """The bodies the sink received, parsed, oldest first."""
    done = monitor.ssh(f"cat {SINK_FILE} 2>/dev/null || true", check=True)
    return [json.loads(line) for line in done.stdout.splitlines() if line.strip()]


def notified(monitor, alertname, node, status="firing"):
    return [body for body in posted(monitor) if body.get("status") == status
            and any(a["labels"].get("alertname") == alertname and a["labels"].get("node") == node
                    for a in body.get("alerts", []))]


def prometheus_firing(monitor, alertname):
    alerts = _get(monitor, f"{PROMETHEUS}/api/v1/alerts")["data"]["alerts"]
    return [a["labels"]["node"] for a in alerts if a["labels"]["alertname"] == alertname and a["state"] == "firing"]


def start_sink(monitor):
    """The webhook receiver's sink on the monitor, listening, with nothing received yet."""
    monitor.ssh(f"systemctl stop {SINK_UNIT} 2>/dev/null; rm -f {SINK_FILE}; "
                f"systemd-run --quiet --collect --unit={SINK_UNIT} /usr/bin/python3 -c {shlex.quote(SINK)}", check=True)
    wait_for("the webhook sink listening",
             lambda: monitor.ssh(f"curl -s -o /dev/null -w '%{{http_code}}' -X POST -d '{{}}' "
                                 f"http://127.0.0.1:{SINK_PORT}/probe").stdout.strip() == "200", timeout=15)
    monitor.ssh(f"rm -f {SINK_FILE}", check=True)


def stop_sink(monitor):
    monitor.ssh(f"systemctl stop {SINK_UNIT} 2>/dev/null; rm -f {SINK_FILE}")


def check_alertmanager_runs(monitor):
    """Installed and running on the monitor, on loopback only, without the gossip port, its
    configuration (root:prometheus 0640) the one it runs."""
    host = monitor.testinfra_host()
    service = host.service("prometheus-alertmanager")
    assert service.is_enabled and service.is_running
    assert host.socket("tcp://127.0.0.1:9093").is_listening
    assert not host.socket("tcp://0.0.0.0:9093").is_listening
    # No gossip port (9094 on all addresses, Alertmanager's default): nothing listens on it.
    assert monitor.ssh("ss -Hlntu 'sport = :9094'", check=True).stdout.strip() == ""
    for path in (CONFIG, PASSWORD_FILE, WEB_CONFIG):
        secret = host.file(path)
        assert (secret.user, secret.group, secret.mode) == ("root", "prometheus", 0o640), path
    live = live_config(monitor)
    assert "- name: sink" in live and "repeat_interval: 1m" in live, live


def check_prometheus_lists_the_alertmanager(monitor):
    """Prometheus sends its alerts to the monitor's Alertmanager (listed active by its API) and scrapes it."""
    def urls():
        return [a["url"] for a in _get(monitor, f"{PROMETHEUS}/api/v1/alertmanagers")["data"]["activeAlertmanagers"]]
    # Prometheus's notifier takes up a configuration's Alertmanagers a few seconds after a (re)load.
    wait_for("the Alertmanager active in Prometheus", lambda: urls() == [f"{ALERTMANAGER}/api/v2/alerts"], timeout=30,
             describe=urls)
    targets = _get(monitor, f"{PROMETHEUS}/api/v1/targets")["data"]["activeTargets"]
    (scraped,) = [t for t in targets if t["labels"]["job"] == "alertmanager"]
    assert scraped["labels"]["node"] == monitor.name and scraped["scrapeUrl"] == f"{ALERTMANAGER}/metrics"


def check_prometheus_without_alertmanager(monitor):
    """Turned off: stopped and disabled, and Prometheus neither sends to it nor scrapes it."""
    service = monitor.testinfra_host().service("prometheus-alertmanager")
    assert not service.is_running and not service.is_enabled

    def sent_to():
        active = _get(monitor, f"{PROMETHEUS}/api/v1/alertmanagers")["data"]["activeAlertmanagers"]
        jobs = {t["labels"]["job"] for t in _get(monitor, f"{PROMETHEUS}/api/v1/targets")["data"]["activeTargets"]}
        return [a["url"] for a in active] + sorted(jobs & {"alertmanager"})
    wait_for("Prometheus without Alertmanager", lambda: sent_to() == [], timeout=30, describe=sent_to)
