"""The gateway fleet of the integration tests: its inventory and the hosts a test uses.

Three serving nodes, one gateway and one monitor (tests/testnode up 3 --gateway --monitor), made
and converged once per pytest-xdist worker by the session fixture gateway_fleet
(tests/conftest.py) and shared by the files of conftest's FLEET_FILES.
"""

from __future__ import annotations

import yaml

import alertmanager_checks
from ansible_run import run_playbook

# What the fleet's files need of every run on it, as inventory variables (so that any run of
# any of them leaves the others' settings in place): each request to the server double takes
# about half a second, so requests are in flight whenever a node restarts; a killed server is
# back after 1 s; the monitor scrapes and evaluates every 2 s and SGLangServerDown fires after
# 5 s, so the monitoring waits stay short (scrapes every second cost the node exporters and
# Prometheus about 14 % of a CI core, measured, for the fleet's whole life); its Alertmanager
# is on, with a webhook receiver (tests/alertmanager_checks.py).
FLEET_SERVER_ENVIRONMENT = {
    "SGLANG_ENABLE_SPEC_V2": "1",
    "SGLANG_DOUBLE_REQUEST_SECONDS": "0.5",
    "SGLANG_DOUBLE_DRAIN_POLL_SECONDS": "0.5",
    "SGLANG_DOUBLE_WARMUP_SECONDS": "1",
}
FLEET_NODE_VARS = {"sglang_service_environment": FLEET_SERVER_ENVIRONMENT, "sglang_service_restart_sec": 1}
FLEET_SCRAPE_SECONDS = 2
FLEET_SERVER_DOWN_FOR_SECONDS = 5
FLEET_MONITOR_VARS = {
    "sglang_monitoring_scrape_interval": f"{FLEET_SCRAPE_SECONDS}s",
    "sglang_monitoring_evaluation_interval": f"{FLEET_SCRAPE_SECONDS}s",
    "sglang_monitoring_alert_server_down_for": f"{FLEET_SERVER_DOWN_FOR_SECONDS}s",
    **alertmanager_checks.VARIABLES,
}


def fleet_inventory(harness_inventory, path, node_vars=None):
    """The harness's inventory of the fleet with FLEET_NODE_VARS (updated by node_vars: {name:
    {variable: value}}) on the serving nodes and FLEET_MONITOR_VARS on the monitor."""
    inventory = yaml.safe_load(harness_inventory.read_text())
    groups = inventory["all"]["children"]
    for name, variables in groups["sglang_nodes"]["hosts"].items():
        variables.update(FLEET_NODE_VARS)
        variables.update((node_vars or {}).get(name, {}))
    for variables in groups["sglang_monitors"]["hosts"].values():
        variables.update(FLEET_MONITOR_VARS)
    path.write_text(yaml.safe_dump(inventory))
    return path


class GatewayFleet:
    """Serving nodes, one gateway and one monitor (tests/testnode up N --gateway --monitor),
    converged once by site.yml.

    nodes: the serving nodes (group sglang_nodes), in inventory order; gateway: the gateway host
    (sglang_gateways); monitor: the monitor (sglang_monitors); url, api_key, ca_file: what a client
    of the gateway uses (host variables the harness wrote); inventory: the harness's inventory
    with the fleet's variables (fleet_inventory).
    """

    def __init__(self, node_set, inventory):
        self.node_set = node_set
        self.harness_inventory = node_set.inventory
        self.inventory = inventory
        self.first_run = None
        groups = yaml.safe_load(inventory.read_text())["all"]["children"]
        by_name = {n.name: n for n in node_set.nodes()}
        self.nodes = [by_name[name] for name in groups["sglang_nodes"]["hosts"]]
        (gateway_name, gateway_vars), = groups["sglang_gateways"]["hosts"].items()
        (monitor_name,) = groups["sglang_monitors"]["hosts"]
        self.gateway = by_name[gateway_name]
        self.monitor = by_name[monitor_name]
        self.hosts = [*self.nodes, self.gateway, self.monitor]
        self.url = gateway_vars["sglang_gateway_url"]
        self.api_key = gateway_vars["sglang_gateway_api_keys"][0]
        self.ca_file = gateway_vars["sglang_gateway_tls_ca_file"]

    def converge(self, **kwargs):
        return run_playbook("site.yml", self.inventory, **kwargs)
