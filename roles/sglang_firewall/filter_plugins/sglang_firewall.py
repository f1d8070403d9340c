"""Turn the inventory's gateways, monitors and ports into the host firewall's plan, or refuse it.

sglang_firewall_plan(settings) returns {"errors": [...], "server_on_loopback": bool, "auto_enabled": bool,
"worker_port": int, "monitor_ports": [...], "guarded_ports": [...],
"gateways": {"ipv4": [...], "ipv6": [...]}, "monitors": {"ipv4": [...], "ipv6": [...]}}.

A gateway's or monitor's address is its host variable sglang_firewall_address, else its
ansible_host; each error line names the variable and host it came from. An address
is an IPv4/IPv6 address or network (CIDR); anything else (a host name, an empty value) is refused,
since nft would have to resolve it once at load time. A port that the firewall would guard
(the worker port, a monitor port) must never be an SSH port: a firewall that could lock Ansible
out is refused before it is rendered. Pure Python, unit-tested in tests/unit/test_firewall_plan.py.
"""

from __future__ import annotations

import ipaddress

try:
    from ansible.errors import AnsibleFilterError
except ImportError:  # pragma: no cover - only outside Ansible
    AnsibleFilterError = ValueError


def _port(value, where, errors):
    if isinstance(value, bool) or not isinstance(value, (int, str)) or not str(value).strip().isdigit():
        errors.append(f"{where}: expected a TCP port 1-65535, got {value!r}")
        return None
    port = int(value)
    if not 1 <= port <= 65535:
        errors.append(f"{where}: expected a TCP port 1-65535, got {port}")
        return None
    return port


def _networks(entries, errors):
    found = {"ipv4": [], "ipv6": []}
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
        family = "ipv4" if network.version == 4 else "ipv6"
        shown = str(network.network_address) if network.num_addresses == 1 else str(network)
        if shown not in found[family]:
            found[family].append(shown)
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


def sglang_firewall_plan(settings):
    """The firewall's plan: who may reach which port, with every reason to refuse it (see module doc).

    settings keys: worker_port, server_host, gateway_group, gateway_hosts (their hostvars),
    gateway_addresses, monitor_group, monitor_hosts, monitor_addresses, monitor_ports, protected_ports.
    """
    errors = []
    protected = []
    for index, value in enumerate(settings.get("protected_ports") or []):
        port = _port(value, f"sglang_firewall_protected_ports[{index}]", errors)
        if port is not None and port not in protected:
            protected.append(port)

    worker = _port(settings.get("worker_port"), "sglang_server_args.port", errors)
    metrics = []
    for index, value in enumerate(settings.get("monitor_ports") or []):
        port = _port(value, f"sglang_firewall_monitor_ports[{index}]", errors)
        if port is not None and port != worker and port not in metrics:
            metrics.append(port)

    for where, port in [("sglang_server_args.port", worker)] + [("sglang_firewall_monitor_ports", p) for p in metrics]:
        if port is not None and port in protected:
            errors.append(f"{where}: port {port} is an SSH port (sglang_firewall_protected_ports, ansible_port); "
                          "the firewall would close it to everyone but the gateways and monitors, locking Ansible out")

    gateways = _host_sources(settings.get("gateway_hosts"), settings.get("gateway_group")) \
        + _listed_sources(settings.get("gateway_addresses"), "sglang_firewall_gateway_addresses")
    monitors = _host_sources(settings.get("monitor_hosts"), settings.get("monitor_group")) \
        + _listed_sources(settings.get("monitor_addresses"), "sglang_firewall_monitor_addresses")
    on_loopback = _is_loopback(settings.get("server_host"))
    networks = {"gateways": _networks(gateways, errors), "monitors": _networks(monitors, errors)}
    has_monitors = bool(networks["monitors"]["ipv4"] or networks["monitors"]["ipv6"])
    return {
        "errors": errors,
        "server_on_loopback": on_loopback,
        # What sglang_firewall_enabled null means: something to guard from the network, either
        # the server's port beyond loopback or the node exporter's port that monitors scrape.
        "auto_enabled": not on_loopback or has_monitors,
        "worker_port": worker,
        "monitor_ports": metrics,
        "guarded_ports": ([worker] if worker is not None else []) + metrics,
        **networks,
    }


class FilterModule:
    """sglang-canon's host firewall filter."""

    def filters(self):
        return {"sglang_firewall_plan": sglang_firewall_plan}
