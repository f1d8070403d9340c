"""sglang_firewall_plan: who may reach which port of a host of the fleet, and which inventories are refused.

roles/sglang_firewall renders its nftables table from this plan; tests/integration/test_firewall.py
proves the rendered table on real nodes.
"""


import pytest
import yaml
from project_modules import REPO


FILTER = "roles/sglang_firewall/filter_plugins/sglang_firewall.py"


@pytest.fixture(scope="module")
def plan(project_module):
    make = project_module(FILTER).sglang_firewall_plan

    def run(**overrides):
        settings = {
            "table": "sglang_canon",
            "kinds": ["node"],
            "worker_port": 30000,
            "exporter_port": 9100,
            "server_host": "10.0.0.2",
            "gateway_group": "sglang_gateways",
            "gateway_hosts": [{"inventory_hostname": "gw1", "ansible_host": "10.0.0.10"}],
            "gateway_addresses": [],
            "monitor_group": "sglang_monitors",
            "monitor_hosts": [{"inventory_hostname": "mon1", "ansible_host": "10.0.0.20",
                               "sglang_firewall_address": "fd00::20"}],
            "monitor_addresses": [],
            "monitor_ports": [],
            "protected_ports": [22, 22],
            "allow_any_source": False,
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


def test_the_node_exporter_port_is_the_monitoring_roles_one_variable(plan):
    # sglang_monitoring_node_exporter_port moved: the firewall guards the new port, not a 9100 of its own.
    result = plan(exporter_port=9200)
    assert result["errors"] == []
    assert result["monitor_ports"] == [9200]
    assert result["guarded_ports"] == [30000, 9200]


def test_the_exporter_port_is_read_from_the_monitoring_role_in_every_play_that_runs_the_firewall():
    vars_file = yaml.safe_load((REPO / "roles/sglang_firewall/vars/main.yml").read_text())
    assert "'exporter_port': sglang_monitoring_node_exporter_port," in vars_file["__sglang_firewall_plan"]
    defaults = yaml.safe_load((REPO / "roles/sglang_firewall/defaults/main.yml").read_text())
    assert 9100 not in defaults["sglang_firewall_monitor_ports"]  # no second 9100 to keep in step
    monitoring = yaml.safe_load((REPO / "roles/sglang_monitoring/defaults/main.yml").read_text())
    assert monitoring["sglang_monitoring_node_exporter_listen_address"] == ":{{ sglang_monitoring_node_exporter_port }}"
    plays = yaml.safe_load((REPO / "site.yml").read_text())
    for play in plays:
        text = yaml.safe_dump(play)
        if "sglang_firewall" in text:
            assert "sglang_monitoring" in text, play["name"]


@pytest.mark.parametrize("kinds, guarded", [
    (["gateway"], [9100, 29000]),
    (["monitor"], [9100, 9090]),
    (["node", "gateway"], [30000, 9100, 29000]),
])
def test_gateways_and_monitors_guard_their_own_monitoring_ports(plan, kinds, guarded):
    result = plan(kinds=kinds, gateway_metrics_port="29000", prometheus_listen_address="127.0.0.1:9090",
                  alertmanager_listen_address=None, server_host="127.0.0.1", monitor_hosts=[])
    assert result["errors"] == []
    assert result["guarded_ports"] == guarded
    assert result["worker_port"] == (30000 if "node" in kinds else None)
    # A gateway and a monitor always have something to guard from the network.
    assert result["auto_enabled"] is True


def test_a_monitor_with_alertmanager_guards_its_port_too(plan):
    result = plan(kinds=["monitor"], prometheus_listen_address="[::]:9090", alertmanager_listen_address="0.0.0.0:9093")
    assert result["guarded_ports"] == [9100, 9090, 9093]


def test_a_monitoring_port_that_is_ssh_is_refused_naming_its_variable(plan):
    errors = plan(kinds=["monitor"], prometheus_listen_address="127.0.0.1:22", alertmanager_listen_address=None)["errors"]
    assert errors == [
        "sglang_monitoring_listen_address: port 22 is an SSH port (sglang_firewall_protected_ports, ansible_port); "
        "the firewall would close it to everyone but the gateways and monitors, locking Ansible out"
    ]


@pytest.mark.parametrize("table", [
    "sglang_canon; insert rule inet sglang_canon input tcp dport 30000 accept; table inet sglang_canon",
    "mine\n", "1st", "a-b", "x" * 65, "",
])
def test_a_table_name_that_is_no_nft_identifier_is_refused(plan, table):
    assert plan(table=table)["errors"] == [
        "sglang_firewall_table: expected an nft identifier: a letter, then letters, digits or _, "
        f"at most 64 characters, got {table!r}"
    ]


@pytest.mark.parametrize("addresses, sources", [
    (["0.0.0.0/0"], "sglang_firewall_gateway_addresses[0]"),
    (["10.0.0.1", "::/0"], "sglang_firewall_gateway_addresses[1]"),
    (["0.0.0.0/1", "128.0.0.0/1"],
     "sglang_firewall_gateway_addresses[0] (0.0.0.0/1), sglang_firewall_gateway_addresses[1] (128.0.0.0/1)"),
])
def test_sources_that_admit_every_address_are_refused(plan, addresses, sources):
    errors = plan(gateway_addresses=addresses)["errors"]
    assert len(errors) == 1
    assert errors[0].startswith(f"{sources}: admits every IPv"), errors
    assert errors[0].endswith("or set sglang_firewall_allow_any_source: true if any source is meant")


def test_a_monitor_host_at_every_address_is_named(plan):
    errors = plan(monitor_hosts=[{"inventory_hostname": "mon1", "sglang_firewall_address": "0.0.0.0/0"}])["errors"]
    assert errors == ["sglang_firewall_address of mon1 (group sglang_monitors): admits every IPv4 address (0.0.0.0/0); "
                      "name the hosts or networks that need the port, or set sglang_firewall_allow_any_source: true "
                      "if any source is meant"]


def test_every_source_is_accepted_when_the_inventory_says_so(plan):
    result = plan(gateway_addresses=["0.0.0.0/0", "::/0"], allow_any_source=True)
    assert result["errors"] == []
    assert result["gateways"] == {"ipv4": ["10.0.0.10", "0.0.0.0/0"], "ipv6": ["::/0"]}


def test_large_networks_that_leave_addresses_out_are_accepted(plan):
    assert plan(monitor_addresses=["0.0.0.0/1", "128.0.0.0/2", "10.0.0.0/8"])["errors"] == []
