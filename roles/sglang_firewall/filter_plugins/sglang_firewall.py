"""Turn the inventory's gateways, monitors and ports into a host firewall's plan, or refuse it.

sglang_firewall_plan(settings) returns {"errors": [...], "server_on_loopback": bool, "auto_enabled": bool,
"worker_port": int or None, "monitor_ports": [...], "guarded_ports": [...],
"gateways": {"ipv4": [...], "ipv6": [...]}, "monitors": {"ipv4": [...], "ipv6": [...]}}.

Every host of the fleet gets a plan by its kinds (settings["kinds"]): a serving node ("node")
admits its server's port from the gateways and monitors; every host admits its node exporter's
port only from the monitors, and so a gateway its metrics port and a monitor Prometheus's and
Alertmanager's ports. What is not guarded (the gateway's own port, SSH) is not this table's business.

A gateway's or monitor's address is its host variable sglang_firewall_address, else its
ansible_host; each error line names the variable and host it came from. An address
is an IPv4/IPv6 address or network (CIDR); anything else (a host name, an empty value) is refused,
since nft would have to resolve it once at load time. Sources that together admit every address
(0.0.0.0/0, ::/0, or e.g. 0.0.0.0/1 and 128.0.0.0/1) are refused unless allow_any_source says so.
A guarded port must never be an SSH port: a firewall that could lock Ansible out is refused before
it is rendered. The table's name must be an nft identifier (nft runs what a ';' in it adds).
Pure Python, unit-tested in tests/unit/test_firewall_plan.py.
"""

from __future__ import annotations

import ipaddress
import re

try:
    from ansible.errors import AnsibleFilterError
except ImportError:  # pragma: no cover - only outside Ansible
    AnsibleFilterError = ValueError

# module_utils/nft_table.py's IDENTIFIER (the module checks again before nft runs).
_IDENTIFIER = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,63}")


def _port(value, where, errors):
    if isinstance(value, bool) or not isinstance(value, (int, str)) or not str(value).strip().isdigit():
        errors.append(f"{where}: expected a TCP port 1-65535, got {value!r}")
        return None
    port = int(value)
    if not 1 <= port <= 65535:
        errors.append(f"{where}: expected a TCP port 1-65535, got {port}")
        return None
    return port


def _listen_port(address, where, errors):
    """The port of a [HOST]:PORT listen address (Prometheus's, Alertmanager's)."""
    _, colon, port = str(address).rpartition(":")
    if not colon:
        errors.append(f"{where}: expected [HOST]:PORT, got {address!r}")
        return None
    return _port(port, where, errors)


def _networks(entries, allow_any, errors):
    """{ipv4: [...], ipv6: [...]} of the entries' addresses, refusing any that is no IP and, unless
    allow_any, any set of sources that admits every address of a family."""
    found = {"ipv4": [], "ipv6": []}
    admitted = {4: [], 6: []}  # (network, source) per IP version
    for entry in entries or []:
        if not isinstance(entry, dict) or "address" not in entry:
            raise AnsibleFilterError(f"sglang_firewall_plan: expected {{source, address}} entries, got {entry!r}")
        text = entry["address"]
        try:
            if not isinstance(text, str) or not text.strip():
                raise ValueError
            network = ipaddress.ip_network(text.strip(), strict=False)
        except ValueError:
            errors.append(f"{entry.get('source')}: expected an IPv4 or IPv6 address or network (CIDR), got {text!r}")
            continue
        admitted[network.version].append((network, entry.get("source")))
        family = "ipv4" if network.version == 4 else "ipv6"
        shown = str(network.network_address) if network.num_addresses == 1 else str(network)
        if shown not in found[family]:
            found[family].append(shown)
    for version, networks in admitted.items():
        if allow_any or not networks:
            continue
        collapsed = list(ipaddress.collapse_addresses(network for network, _ in networks))
        if collapsed[0].prefixlen == 0:
            everything = collapsed[0]
            # The sources to fix: a /0 itself, else the networks no other listed one contains.
            sources = [source for network, source in networks if network.prefixlen == 0] \
                or [f"{source} ({network})" for network, source in networks
                    if not any(network != other and network.subnet_of(other) for other, _ in networks)]
            errors.append(f"{', '.join(sources)}: admits every IPv{version} address ({everything}); name the hosts "
                          "or networks that need the port, or set sglang_firewall_allow_any_source: true if any "
                          "source is meant")
    return found


_LOOPBACK_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"}


def _is_loopback(host):
    text = str(host if host is not None else "127.0.0.1").strip().strip("[]")
    if text.lower() in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(text).is_loopback
    except ValueError:
        return False


def _host_sources(hosts, group):
    """{source, address} of each inventory host (its hostvars): sglang_firewall_address, else ansible_host."""
    sources = []
    for host in hosts or []:
        name = host.get("inventory_hostname", "?")
        if host.get("sglang_firewall_address") is not None:
            variable, address = "sglang_firewall_address", host.get("sglang_firewall_address")
        else:
            variable, address = "ansible_host", host.get("ansible_host", name)
        sources.append({"source": f"{variable} of {name} (group {group})", "address": address})
    return sources


def _listed_sources(addresses, variable):
    return [{"source": f"{variable}[{index}]", "address": address} for index, address in enumerate(addresses or [])]


def _monitor_ports(settings, kinds, errors):
    """(variable, port) of every port admitted from the monitors only, by what this host runs."""
    ports = [("sglang_monitoring_node_exporter_port",
              _port(settings.get("exporter_port"), "sglang_monitoring_node_exporter_port", errors))]
    if "gateway" in kinds:
        ports.append(("sglang_gateway_args.prometheus_port",
                      _port(settings.get("gateway_metrics_port"), "sglang_gateway_args.prometheus_port", errors)))
    if "monitor" in kinds:
        for key, variable in (("prometheus_listen_address", "sglang_monitoring_listen_address"),
                              ("alertmanager_listen_address", "sglang_monitoring_alertmanager_listen_address")):
            if settings.get(key) is not None:
                ports.append((variable, _listen_port(settings[key], variable, errors)))
    for index, value in enumerate(settings.get("monitor_ports") or []):
        ports.append(("sglang_firewall_monitor_ports", _port(value, f"sglang_firewall_monitor_ports[{index}]", errors)))
    return [(variable, port) for variable, port in ports if port is not None]


def sglang_firewall_plan(settings):
    """The firewall's plan: who may reach which port, with every reason to refuse it (see module doc).

    settings keys: table, kinds (of this host: node, gateway, monitor), worker_port, server_host,
    exporter_port, gateway_metrics_port, prometheus_listen_address, alertmanager_listen_address (None when
    Alertmanager is off), gateway_group, gateway_hosts (their hostvars), gateway_addresses, monitor_group,
    monitor_hosts, monitor_addresses, monitor_ports, protected_ports, allow_any_source.
    """
    errors = []
    if not isinstance(settings.get("table"), str) or not _IDENTIFIER.fullmatch(settings["table"]):
        errors.append("sglang_firewall_table: expected an nft identifier: a letter, then letters, digits or _, "
                      f"at most 64 characters, got {settings.get('table')!r}")
    kinds = set(settings.get("kinds") or [])
    protected = []
    for index, value in enumerate(settings.get("protected_ports") or []):
        port = _port(value, f"sglang_firewall_protected_ports[{index}]", errors)
        if port is not None and port not in protected:
            protected.append(port)

    worker = _port(settings.get("worker_port"), "sglang_server_args.port", errors) if "node" in kinds else None
    guarded = [("sglang_server_args.port", worker)] if worker is not None else []
    metrics = []
    for variable, port in _monitor_ports(settings, kinds, errors):
        if port != worker and port not in metrics:
            metrics.append(port)
            guarded.append((variable, port))

    for where, port in guarded:
        if port in protected:
            errors.append(f"{where}: port {port} is an SSH port (sglang_firewall_protected_ports, ansible_port); "
                          "the firewall would close it to everyone but the gateways and monitors, locking Ansible out")

    gateways = _host_sources(settings.get("gateway_hosts"), settings.get("gateway_group")) \
        + _listed_sources(settings.get("gateway_addresses"), "sglang_firewall_gateway_addresses")
    monitors = _host_sources(settings.get("monitor_hosts"), settings.get("monitor_group")) \
        + _listed_sources(settings.get("monitor_addresses"), "sglang_firewall_monitor_addresses")
    on_loopback = _is_loopback(settings.get("server_host"))
    allow_any = settings.get("allow_any_source") is True
    networks = {"gateways": _networks(gateways, allow_any, errors), "monitors": _networks(monitors, allow_any, errors)}
    has_monitors = bool(networks["monitors"]["ipv4"] or networks["monitors"]["ipv6"])
    return {
        "errors": errors,
        "server_on_loopback": on_loopback,
        # What sglang_firewall_enabled null means: something to guard from the network. A gateway
        # and a monitor always have it (the gateway's metrics, Prometheus, the node exporter); a
        # serving node when its server's port is beyond loopback or monitors scrape its exporter.
        "auto_enabled": bool(kinds & {"gateway", "monitor"}) or not on_loopback or has_monitors,
        "worker_port": worker,
        "monitor_ports": metrics,
        "guarded_ports": [port for _, port in guarded],
        **networks,
    }


class FilterModule:
    """sglang-canon's host firewall filter."""

    def filters(self):
        return {"sglang_firewall_plan": sglang_firewall_plan}
