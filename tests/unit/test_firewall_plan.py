"""sglang_firewall_plan: who may reach which port of a serving node, and which inventories are refused.

roles/sglang_firewall renders its nftables table from this plan; tests/integration/test_firewall.py
proves the rendered table on real nodes.
"""

import pytest

FILTER = "roles/sglang_firewall/filter_plugins/sglang_firewall.py"


@pytest.fixture(scope="module")
def plan(project_module):
    make = project_module(FILTER).sglang_firewall_plan

    def run(**overrides):
        settings = {
            "worker_port": 30000,
            "server_host": "10.0.0.2",
            "gateway_group": "sglang_gateways",
            "gateway_hosts": [{"inventory_hostname": "gw1", "ansible_host": "10.0.0.10"}],
            "gateway_addresses": [],
            "monitor_group": "sglang_monitors",
            "monitor_hosts": [{"inventory_hostname": "mon1", "ansible_host": "10.0.0.20",
                               "sglang_firewall_address": "fd00::20"}],
            "monitor_addresses": [],
            "monitor_ports": [9100],
            "protected_ports": [22, 22],
            **overrides,
        }
        return make(settings)

    return run


def test_gateways_reach_the_worker_port_and_monitors_every_guarded_port(plan):
    result = plan(gateway_addresses=["192.168.5.0/24", "10.0.0.10"], monitor_addresses=["172.16.0.7/32"])
    assert result["errors"] == []
    assert result["worker_port"] == 30000
    assert result["monitor_ports"] == [9100]
    assert result["guarded_ports"] == [30000, 9100]
    # A host's own variable wins over its ansible_host; duplicates are listed once; /32 is an address.
    assert result["gateways"] == {"ipv4": ["10.0.0.10", "192.168.5.0/24"], "ipv6": []}
    assert result["monitors"] == {"ipv4": ["172.16.0.7"], "ipv6": ["fd00::20"]}
    assert result["server_on_loopback"] is False


def test_metrics_on_the_worker_port_are_not_listed_twice(plan):
    assert plan(monitor_ports=[30000, 9100, 9100])["guarded_ports"] == [30000, 9100]


@pytest.mark.parametrize("host, loopback", [
    ("127.0.0.1", True), ("127.0.1.1", True), ("::1", True), ("[::1]", True), ("localhost", True), (None, True),
    ("0.0.0.0", False), ("10.1.2.3", False), ("::", False), ("node1.example", False),
])
def test_loopback_servers_are_told_apart(plan, host, loopback):
    assert plan(server_host=host)["server_on_loopback"] is loopback


def test_a_worker_port_that_is_ssh_is_refused(plan):
    errors = plan(worker_port=22)["errors"]
    assert len(errors) == 1
    assert errors[0].startswith("sglang_server_args.port: port 22 is an SSH port")


def test_a_monitor_port_that_is_the_connection_port_is_refused(plan):
    errors = plan(monitor_ports=[9100, 2222], protected_ports=[22, 2222])["errors"]
    assert errors == [
        "sglang_firewall_monitor_ports: port 2222 is an SSH port (sglang_firewall_protected_ports, ansible_port); "
        "the firewall would close it to everyone but the gateways and monitors, locking Ansible out"
    ]


@pytest.mark.parametrize("port", [0, 65536, "http", True, None, -1])
def test_ports_out_of_range_are_refused(plan, port):
    assert plan(worker_port=port)["errors"] == [f"sglang_server_args.port: expected a TCP port 1-65535, got {port!r}"]


def test_a_source_that_is_no_ip_is_refused_naming_host_and_variable(plan):
    result = plan(
        gateway_hosts=[{"inventory_hostname": "gw1", "ansible_host": "gw1.example.com"},
                       {"inventory_hostname": "gw2", "sglang_firewall_address": "10.0.0.300"}],
        monitor_addresses=["", "10.0.0.0/33"],
    )
    assert result["errors"] == [
        "ansible_host of gw1 (group sglang_gateways): expected an IPv4 or IPv6 address or network (CIDR), "
        "got 'gw1.example.com'",
        "sglang_firewall_address of gw2 (group sglang_gateways): expected an IPv4 or IPv6 address or network (CIDR), "
        "got '10.0.0.300'",
        "sglang_firewall_monitor_addresses[0]: expected an IPv4 or IPv6 address or network (CIDR), got ''",
        "sglang_firewall_monitor_addresses[1]: expected an IPv4 or IPv6 address or network (CIDR), got '10.0.0.0/33'",
    ]


def test_a_host_without_ansible_host_is_taken_by_its_name(plan):
    result = plan(gateway_hosts=[{"inventory_hostname": "10.9.9.9"}], monitor_hosts=[])
    assert result["gateways"]["ipv4"] == ["10.9.9.9"]
    assert result["monitors"] == {"ipv4": [], "ipv6": []}


@pytest.mark.parametrize("host, monitors, enabled", [
    ("127.0.0.1", [], False),  # the canonical node: nothing reaches the server from outside
    ("127.0.0.1", ["10.0.0.20"], True),  # the node exporter's port is scraped from the network
    ("10.0.0.2", [], True),
])
def test_null_means_on_when_something_is_reachable_from_the_network(plan, host, monitors, enabled):
    assert plan(server_host=host, monitor_hosts=[], monitor_addresses=monitors)["auto_enabled"] is enabled
