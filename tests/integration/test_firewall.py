"""Host firewall (roles/sglang_firewall) on three test nodes: node 1 is the gateway of node 2, node 3 the monitor.

The test writes its own inventory: node 2 is the serving node (group sglang_nodes), node 1 its
gateway (group sglang_gateways, a host of its own), node 3 a monitor (group sglang_monitors), and
the host's address on node 1's link (10.x.x.1 of node 1's /30, "the monitor") is listed in
sglang_firewall_monitor_addresses. The host's address on node 2's own link is then an address
nobody admitted ("the host"). Test nodes reach only the host: they reach each other through it,
by a route on each node and forwarding on their host links only
(/proc/sys/net/ipv4/conf/ve-NAME/forwarding; the host's ip_forward is left as it is).

Only the firewall is deployed (site.yml --tags sglang_firewall: the shared checks, then this
role, in the nodes' play, the gateways' and the monitors'): what listens on the guarded ports is
a stand-in, Python's http.server on 0.0.0.0 (node 2: the worker port 30000 and the node
exporter's 9100; node 1: the gateway's port 8443, its metrics port 29000 and 9100; node 3:
Prometheus's 9090 and 9100), since the firewall judges ports and sources, not what answers. The
nodes are shared by every test of the file, which run in order: access, foreign rules,
idempotence, drift, bad input, names and sources that are refused, a rename, the exporter's
port moved, reboot, off.
"""

from __future__ import annotations

import json
import subprocess
import time
import types
from pathlib import Path

import pytest
import yaml
from ansible_run import run_playbook
from project_modules import REPO

TAGS = ["sglang_firewall"]
WORKER_PORT = 30000
EXPORTER_PORT = 9100
RULES = "/etc/nftables.d/sglang-canon.nft"
UNIT = "sglang-firewall.service"
FOREIGN = (
    "nft add table inet someone_else && "
    "nft add chain inet someone_else input '{ type filter hook input priority 10; policy accept; }' && "
    "nft add rule inet someone_else input tcp dport 4444 drop"
)


def _records(node_set):
    """nodes.json of the harness: each node's host interface and subnet, which Node does not carry."""
    records = json.loads((node_set.state_dir / "nodes.json").read_text())
    return {r["name"]: r for r in (records.values() if isinstance(records, dict) else records)}


def _ssh(node, command):
    done = node.ssh(command)
    assert done.returncode == 0, f"{node.name}: {command}: {done.stderr}{done.stdout}"
    return done.stdout


def _link(fleet):
    """Let the nodes reach each other through the host (again after a reboot)."""
    for record in fleet.records.values():
        Path(f"/proc/sys/net/ipv4/conf/{record['interface']}/forwarding").write_text("1\n")
    nodes = (fleet.gateway, fleet.server, fleet.monitor)
    for node in nodes:
        for peer in nodes:
            if peer is not node:
                mine, theirs = fleet.records[node.name], fleet.records[peer.name]
                _ssh(node, f"ip route replace {theirs['subnet']} via {mine['host_ip']}")


def _listen(node, ports=(WORKER_PORT, EXPORTER_PORT)):
    """Stand-ins on the given ports of a node, on every address; returns when all accept."""
    for port in ports:
        _ssh(node, f"systemctl is-active -q fw-listen-{port} || "
                   f"systemd-run -q --unit=fw-listen-{port} python3 -m http.server {port} --bind 0.0.0.0")
    probe = " && ".join(f"curl -s -o /dev/null http://127.0.0.1:{port}/" for port in ports)
    _ssh(node, f"for i in $(seq 100); do {probe} && exit 0; sleep 0.1; done; exit 1")


def _from_node(node, address, port):
    """HTTP status seen from a test node, or 'refused'/'timeout'."""
    out = node.ssh(f"curl -s -m 5 -o /dev/null -w '%{{http_code}} %{{exitcode}}' http://{address}:{port}/").stdout
    return _status(out)


def _from_host(source, address, port):
    """HTTP status seen from the host, from one of its addresses."""
    out = subprocess.run(["curl", "-s", "-m", "5", "--interface", source, "-o", "/dev/null",
                          "-w", "%{http_code} %{exitcode}", f"http://{address}:{port}/"],
                         capture_output=True, text=True, check=False).stdout
    return _status(out)


def _status(out):
    code, _, exitcode = out.strip().partition(" ")
    return {"7": "refused", "28": "timeout"}.get(exitcode, code)


def _access(fleet):
    """Who gets an answer on which port of node 2."""
    server_ip = fleet.server.ip
    return {
        "gateway": {p: _from_node(fleet.gateway, server_ip, p) for p in (WORKER_PORT, EXPORTER_PORT)},
        "monitor": {p: _from_host(fleet.monitor_ip, server_ip, p) for p in (WORKER_PORT, EXPORTER_PORT)},
        "host": {p: _from_host(fleet.host_ip, server_ip, p) for p in (WORKER_PORT, EXPORTER_PORT)},
        "itself": {p: _from_node(fleet.server, server_ip, p) for p in (WORKER_PORT, EXPORTER_PORT)},
    }


EXPECTED_ACCESS = {
    "gateway": {WORKER_PORT: "200", EXPORTER_PORT: "refused"},
    "monitor": {WORKER_PORT: "200", EXPORTER_PORT: "200"},
    "host": {WORKER_PORT: "refused", EXPORTER_PORT: "refused"},
    "itself": {WORKER_PORT: "200", EXPORTER_PORT: "200"},
}


def _table(node, name="sglang_canon"):
    """The live table as the kernel lists it, without handles (they change on every load)."""
    listing = json.loads(_ssh(node, f"nft -j list table inet {name}"))
    return [{k: {f: v for f, v in body.items() if f != "handle"} for k, body in item.items()}
            for item in listing["nftables"] if "metainfo" not in item]


def _site(fleet, **kwargs):
    return run_playbook("site.yml", fleet.inventory, tags=TAGS, **kwargs)


@pytest.fixture(scope="module")
def fleet(node_sets):
    node_set = node_sets("firewall", 3)
    gateway, server, monitor = node_set.nodes()
    records = _records(node_set)
    fleet = types.SimpleNamespace(
        gateway=gateway, server=server, monitor=monitor, records=records,
        monitor_ip=records[gateway.name]["host_ip"],  # the host, on node 1's link
        host_ip=records[server.name]["host_ip"],  # the host, on node 2's link: admitted nowhere
    )
    harness = yaml.safe_load(node_set.inventory.read_text())["all"]["children"]["sglang_nodes"]["hosts"]
    fleet.inventory = node_set.state_dir / "firewall-inventory.yml"
    fleet.inventory.write_text(yaml.safe_dump({"all": {
        # Every host's table admits the host's address on node 1's link as a monitor.
        "vars": {"sglang_firewall_monitor_addresses": [fleet.monitor_ip]},
        "children": {
            "sglang_nodes": {
                # The gateway reaches the server at its own address (a gateway on another host never
                # reaches a loopback worker: play 0 refuses that); the runs take --tags sglang_firewall,
                # so the server double is not moved there. The firewall is asked for by name on the
                # node; the gateway's and the monitor's are on by default (null).
                "hosts": {server.name: {**harness[server.name], "sglang_worker_host": server.ip}},
                "vars": {"sglang_firewall_enabled": True},
            },
            # Node 1 only stands in as the gateway's host (no gateway is deployed: the runs take
            # --tags sglang_firewall), so the gateway inventory checks of play 0 are told it has no
            # TLS and no key on purpose. Its metrics port is sglang-router's default (29000).
            "sglang_gateways": {"hosts": {gateway.name: harness[gateway.name]},
                                "vars": {"sglang_gateway_allow_insecure": True}},
            # Node 3 stands in as the monitor's host (no Prometheus is deployed either).
            "sglang_monitors": {"hosts": {monitor.name: harness[monitor.name]}},
        },
    }}))
    _link(fleet)
    _ssh(server, FOREIGN)
    _listen(server)
    _listen(gateway, GATEWAY_PORTS)
    _listen(monitor, MONITOR_PORTS)
    fleet.foreign = _table(server, "someone_else")
    # Without the firewall every source gets an answer: what is refused later, the firewall refuses.
    assert _access(fleet)["host"] == {WORKER_PORT: "200", EXPORTER_PORT: "200"}
    started = time.monotonic()
    fleet.first = _site(fleet)
    fleet.first_seconds = time.monotonic() - started
    assert fleet.first.rc == 0, fleet.first.stdout[-6000:]
    return fleet


def test_worker_port_only_from_gateway_and_monitor_metrics_ports_only_from_monitor(fleet):
    assert fleet.first.count("changed", fleet.server.name) > 0
    assert _access(fleet) == EXPECTED_ACCESS
    rules = _ssh(fleet.server, f"cat {RULES}")
    # The monitors: the monitor host of the inventory, then the listed address.
    assert f"elements = {{ {fleet.gateway.ip} }}" in rules
    assert f"elements = {{ {fleet.monitor.ip}, {fleet.monitor_ip} }}" in rules
    assert _ssh(fleet.server, f"systemctl is-enabled {UNIT}; systemctl is-active {UNIT}").split() == ["enabled", "active"]


GATEWAY_PORT, GATEWAY_METRICS_PORT, PROMETHEUS_PORT = 8443, 29000, 9090
GATEWAY_PORTS = (GATEWAY_PORT, GATEWAY_METRICS_PORT, EXPORTER_PORT)
MONITOR_PORTS = (PROMETHEUS_PORT, EXPORTER_PORT)


def _access_to(fleet, node, ports):
    """Who gets an answer on which port of the gateway's or the monitor's host."""
    return {
        "server": {p: _from_node(fleet.server, node.ip, p) for p in ports},
        "monitor host": {p: _from_node(fleet.monitor, node.ip, p) for p in ports} if node is not fleet.monitor else None,
        "monitor": {p: _from_host(fleet.monitor_ip, node.ip, p) for p in ports},
        "host": {p: _from_host(fleet.host_ip, node.ip, p) for p in ports},
        "itself": {p: _from_node(node, node.ip, p) for p in ports},
    }


def test_the_gateway_and_the_monitor_get_tables_of_their_own(fleet):
    # The gateway's own port answers everyone; its metrics and node exporter only the monitors.
    assert _access_to(fleet, fleet.gateway, GATEWAY_PORTS) == {
        "server": {GATEWAY_PORT: "200", GATEWAY_METRICS_PORT: "refused", EXPORTER_PORT: "refused"},
        "monitor host": {GATEWAY_PORT: "200", GATEWAY_METRICS_PORT: "200", EXPORTER_PORT: "200"},
        "monitor": {GATEWAY_PORT: "200", GATEWAY_METRICS_PORT: "200", EXPORTER_PORT: "200"},
        "host": {GATEWAY_PORT: "200", GATEWAY_METRICS_PORT: "refused", EXPORTER_PORT: "refused"},
        "itself": {GATEWAY_PORT: "200", GATEWAY_METRICS_PORT: "200", EXPORTER_PORT: "200"},
    }
    # Prometheus (were it on every address) and the node exporter answer the monitors only.
    assert _access_to(fleet, fleet.monitor, MONITOR_PORTS) == {
        "server": {PROMETHEUS_PORT: "refused", EXPORTER_PORT: "refused"},
        "monitor host": None,
        "monitor": {PROMETHEUS_PORT: "200", EXPORTER_PORT: "200"},
        "host": {PROMETHEUS_PORT: "refused", EXPORTER_PORT: "refused"},
        "itself": {PROMETHEUS_PORT: "200", EXPORTER_PORT: "200"},
    }
    # The monitor host is admitted on the serving node too, by its inventory address.
    assert _from_node(fleet.monitor, fleet.server.ip, EXPORTER_PORT) == "200"
    for node in (fleet.gateway, fleet.monitor):
        assert _ssh(node, f"systemctl is-enabled {UNIT}; systemctl is-active {UNIT}").split() == ["enabled", "active"]
        assert 'comment "managed by sglang-canon"' in _ssh(node, "nft list table inet sglang_canon")


def test_ssh_and_a_foreign_table_survive_the_firewall(fleet):
    # Ansible still reaches the node over SSH (the first run's stats: no host unreachable), and so does ssh.
    assert fleet.first.count("dark") == 0
    assert _ssh(fleet.server, "echo reachable").strip() == "reachable"
    assert _table(fleet.server, "someone_else") == fleet.foreign
    tables = _ssh(fleet.server, "nft list tables").split("\n")
    assert "table inet someone_else" in tables and "table inet sglang_canon" in tables


def test_a_second_run_changes_nothing(fleet):
    second = _site(fleet)
    assert second.rc == 0, second.stdout[-6000:]
    assert second.changed == 0, second.changed_tasks()
    assert _table(fleet.server, "someone_else") == fleet.foreign


def test_a_rule_deleted_by_hand_is_reported_by_the_drift_scan_and_put_back_by_one_run(fleet):
    before = _table(fleet.server)
    handle = _ssh(fleet.server, "nft -a list chain inet sglang_canon input | "
                                "sed -n 's/.*@gateways_ipv4 accept # handle \\([0-9]*\\)$/\\1/p'").strip()
    assert handle.isdigit(), handle
    _ssh(fleet.server, f"nft delete rule inet sglang_canon input handle {handle}")
    assert _access(fleet)["gateway"][WORKER_PORT] == "refused"

    scan = run_playbook("playbooks/drift.yml", fleet.inventory, tags=TAGS)
    assert scan.rc != 0
    report = " ".join(scan.failure_messages())
    assert f"{fleet.server.name} drifted:" in report and "[drifted: 1 rule(s) missing]" in report, report
    assert _access(fleet)["gateway"][WORKER_PORT] == "refused"  # the scan changed nothing

    repair = _site(fleet)
    assert repair.rc == 0, repair.stdout[-6000:]
    assert repair.changed_tasks() == [
        f"{fleet.server.name}: Make the live table equal to the rules file (a rule changed by hand is put back)"
    ]
    assert _table(fleet.server) == before
    assert _access(fleet) == EXPECTED_ACCESS
    assert _table(fleet.server, "someone_else") == fleet.foreign


def test_bad_input_is_refused_before_any_change(fleet):
    # A worker port that is SSH's, a monitor port that is another SSH port of the node, and a
    # gateway that is a name, not an address.
    defaults = yaml.safe_load((REPO / "roles/sglang/defaults/main.yml").read_text())
    # (A name in sglang_firewall_gateway_addresses is refused earlier, by play 1's format check:
    # see the end of this test. A host's sglang_firewall_address is the firewall's own to check.)
    extra = {
        "sglang_server_args": {**defaults["sglang_server_args"], "port": 22},
        "sglang_firewall_protected_ports": [22, 2222],
        "sglang_firewall_monitor_ports": [9100, 2222],
        "sglang_firewall_address": "gateway.example",
    }
    rules_before = _ssh(fleet.server, f"sha256sum {RULES}")
    table_before = _table(fleet.server)
    refused = _site(fleet, extravars=extra)
    assert refused.rc != 0
    assert refused.changed == 0, refused.changed_tasks()
    message = " ".join(refused.failure_messages())
    assert message.startswith("The host firewall is refused: "), message
    for phrase in ("sglang_server_args.port: port 22 is an SSH port",
                   "sglang_firewall_monitor_ports: port 2222 is an SSH port",
                   f"sglang_firewall_address of {fleet.gateway.name} (group sglang_gateways): expected an IPv4 or "
                   "IPv6 address or network (CIDR), got 'gateway.example'"):
        assert phrase in message, message
    assert _ssh(fleet.server, f"sha256sum {RULES}") == rules_before
    assert _table(fleet.server) == table_before
    assert _ssh(fleet.server, "echo reachable").strip() == "reachable"

    listed = _site(fleet, extravars={"sglang_firewall_gateway_addresses": ["gateway.example"]})
    assert listed.rc != 0
    assert listed.changed == 0, listed.changed_tasks()
    assert 'sglang_firewall_gateway_addresses[0]: expected an IP address or a CIDR network, got "gateway.example"' \
        in " ".join(listed.failure_messages())
    assert _ssh(fleet.server, f"sha256sum {RULES}") == rules_before


INJECTED = "sglang_canon; insert rule inet sglang_canon input tcp dport 30000 accept; table inet sglang_canon"


def _unchanged_everywhere(fleet, before):
    """Each host's live table and rules file as `before` (_tables) had them, the foreign table, the access."""
    assert _tables(fleet) == before
    assert _table(fleet.server, "someone_else") == fleet.foreign
    assert _access(fleet) == EXPECTED_ACCESS


def _tables(fleet):
    """Each host's live table and its rules file's checksum (the file the boot unit loads)."""
    return {node.name: (_table(node), _ssh(node, f"sha256sum {RULES}"))
            for node in (fleet.gateway, fleet.server, fleet.monitor)}


@pytest.mark.parametrize("playbook", ["playbooks/drift.yml", "site.yml"])
def test_a_table_name_nft_would_run_as_commands_is_refused_and_opens_nothing(fleet, playbook):
    # The drift scan with this name once inserted an accept for everyone: nft joined its arguments
    # and ran each ';'-separated command, even in check mode.
    before = _tables(fleet)
    refused = run_playbook(playbook, fleet.inventory, tags=TAGS, extravars={"sglang_firewall_table": INJECTED})
    assert refused.rc != 0
    assert refused.changed == 0, refused.changed_tasks()
    message = " ".join(refused.failure_messages())
    assert "sglang_firewall_table: expected " in message and INJECTED in message, message
    assert _ssh(fleet.server, f"grep -c 'dport 30000 accept' {RULES} || true").strip() == "0"
    _unchanged_everywhere(fleet, before)


def test_a_table_of_another_owner_is_refused_not_replaced(fleet):
    before = _tables(fleet)
    for check in (True, False):
        refused = _site(fleet, extravars={"sglang_firewall_table": "someone_else"}, check=check)
        assert refused.rc != 0
        assert refused.changed == 0, refused.changed_tasks()
        message = " ".join(refused.failure_messages())
        assert ("sglang_firewall_table: the node already has a table inet someone_else that is not ours "
                '(its comment is not "managed by sglang-canon")') in message, message
        _unchanged_everywhere(fleet, before)


def test_a_renamed_table_replaces_ours_and_leaves_no_orphan(fleet):
    before = _tables(fleet)
    renamed = _site(fleet, extravars={"sglang_firewall_table": "sglang_fw2"})
    assert renamed.rc == 0, renamed.stdout[-6000:]
    for node in (fleet.gateway, fleet.server, fleet.monitor):
        tables = _ssh(node, "nft list tables").split("\n")
        assert "table inet sglang_fw2" in tables and "table inet sglang_canon" not in tables, (node.name, tables)
    assert _access(fleet) == EXPECTED_ACCESS
    assert _table(fleet.server, "someone_else") == fleet.foreign
    back = _site(fleet)
    assert back.rc == 0, back.stdout[-6000:]
    for node in (fleet.gateway, fleet.server, fleet.monitor):
        assert "table inet sglang_fw2" not in _ssh(node, "nft list tables")
    _unchanged_everywhere(fleet, before)


@pytest.mark.parametrize("sources", [
    {"sglang_firewall_gateway_addresses": ["0.0.0.0/0"]},
    {"sglang_firewall_monitor_addresses": ["0.0.0.0/1", "128.0.0.0/1"]},
])
def test_sources_that_admit_everyone_are_refused(fleet, sources):
    before = _tables(fleet)
    refused = _site(fleet, extravars=sources)
    assert refused.rc != 0
    assert refused.changed == 0, refused.changed_tasks()
    message = " ".join(refused.failure_messages())
    assert "admits every IPv4 address (0.0.0.0/0)" in message and "sglang_firewall_allow_any_source: true" in message
    _unchanged_everywhere(fleet, before)


def test_the_node_exporters_port_moves_the_firewalls_rule_with_it(fleet):
    # One variable: the monitoring role's port is what the firewall guards (no 9100 of its own).
    _listen(fleet.server, (9200,))
    moved = _site(fleet, extravars={"sglang_monitoring_node_exporter_port": 9200})
    assert moved.rc == 0, moved.stdout[-6000:]
    assert _from_host(fleet.host_ip, fleet.server.ip, 9200) == "refused"
    assert _from_host(fleet.monitor_ip, fleet.server.ip, 9200) == "200"
    assert _from_host(fleet.host_ip, fleet.server.ip, EXPORTER_PORT) == "200"  # no longer the exporter's
    back = _site(fleet)
    assert back.rc == 0, back.stdout[-6000:]
    assert _access(fleet) == EXPECTED_ACCESS


def test_the_firewall_is_back_after_a_reboot(fleet):
    before = _table(fleet.server)
    fleet.server.reboot()
    assert _ssh(fleet.server, f"systemctl is-active {UNIT}").strip() == "active"
    assert _table(fleet.server) == before
    _link(fleet)  # the node's route and the host link's forwarding went with the old boot
    _listen(fleet.server)
    assert _access(fleet) == EXPECTED_ACCESS
    # The foreign table was made by hand, never persisted: make it again for the runs that follow.
    _ssh(fleet.server, FOREIGN)
    after = _site(fleet)
    assert after.rc == 0 and after.changed == 0, after.changed_tasks()
    assert _table(fleet.server, "someone_else") == fleet.foreign


def _alone_on_loopback(fleet):
    """The fleet's inventory as a single node with no gateway and no monitor, its server on the default
    127.0.0.1 (a gateway on another host could not reach a loopback server: play 0 refuses that)."""
    inventory = yaml.safe_load(fleet.inventory.read_text())
    groups = inventory["all"]["children"]
    del groups["sglang_gateways"], groups["sglang_monitors"]
    groups["sglang_nodes"]["hosts"][fleet.server.name].pop("sglang_worker_host")
    path = fleet.inventory.with_name("firewall-alone-inventory.yml")
    path.write_text(yaml.safe_dump(inventory))
    return path


def test_off_on_a_loopback_server_removes_the_table_its_file_and_unit_and_nothing_else(fleet):
    # sglang_firewall_enabled null decides from the inventory: a server on the default 127.0.0.1,
    # no gateway on another host and no monitor mean off.
    off_vars = {"sglang_firewall_enabled": None, "sglang_firewall_monitor_addresses": []}
    alone = _alone_on_loopback(fleet)
    off = run_playbook("site.yml", alone, tags=TAGS, extravars=off_vars)
    assert off.rc == 0, off.stdout[-6000:]
    assert off.count("changed", fleet.server.name) > 0
    assert "table inet sglang_canon" not in _ssh(fleet.server, "nft list tables")
    assert _ssh(fleet.server, f"ls {RULES} /etc/systemd/system/{UNIT} 2>/dev/null; true").strip() == ""
    assert _table(fleet.server, "someone_else") == fleet.foreign
    assert _access(fleet)["host"] == {WORKER_PORT: "200", EXPORTER_PORT: "200"}
    again = run_playbook("site.yml", alone, tags=TAGS, extravars=off_vars)
    assert again.rc == 0 and again.changed == 0, again.changed_tasks()
