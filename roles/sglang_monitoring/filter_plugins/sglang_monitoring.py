"""Scrape targets from the inventory, for roles/sglang_monitoring's prometheus.yml."""

import ipaddress

from ansible.errors import AnsibleFilterError

# What SGLang listens on when sglang_server_args.host is not set (ServerArgs' default).
SGLANG_DEFAULT_HOST = "127.0.0.1"


def _lookup(variables, path, default):
    """variables[a][b]... for path "a.b", or default when any step is missing."""
    value = variables
    for key in path.split("."):
        if not hasattr(value, "get"):
            return default
        value = value.get(key)
        if value is None:
            return default
    return value


def _address(name, variables):
    return str(_lookup(variables, "ansible_host", name))


def sglang_monitoring_targets(hosts, hostvars, port_path, default_port):
    """One target per host: {"node": name, "address": "ansible_host:port"}.

    The port is the host's variable at port_path (dotted, e.g. sglang_server_args.port), else
    default_port. An IPv6 address is put in brackets.
    """
    if not isinstance(port_path, str) or not port_path:
        raise AnsibleFilterError("sglang_monitoring_targets: port_path must be a variable name (dotted for a key)")
    targets = []
    for name in hosts or []:
        variables = hostvars[name]
        port = _lookup(variables, port_path, default_port)
        try:
            port = int(port)
        except (TypeError, ValueError):
            raise AnsibleFilterError(f"{name}: {port_path} is {port!r}, expected a port number") from None
        if not 0 < port < 65536:
            raise AnsibleFilterError(f"{name}: {port_path} is {port}, expected a port number 1-65535")
        address = _address(name, variables)
        if ":" in address and not address.startswith("["):
            address = f"[{address}]"
        targets.append({"node": str(name), "address": f"{address}:{port}"})
    return targets


def _is_loopback(host):
    if host in ("localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def sglang_monitoring_unreachable_servers(hosts, hostvars):
    """One line per SGLang node whose server listens on loopback only, so that no monitor can
    scrape it: 'NODE: sglang_server_args.host is 127.0.0.1'. Empty when every server is reachable."""
    found = []
    for name in hosts or []:
        host = str(_lookup(hostvars[name], "sglang_server_args.host", SGLANG_DEFAULT_HOST))
        if _is_loopback(host):
            found.append(f"{name}: sglang_server_args.host is {host}")
    return found


class FilterModule:
    """sglang_monitoring's filters."""

    def filters(self):
        return {
            "sglang_monitoring_targets": sglang_monitoring_targets,
            "sglang_monitoring_unreachable_servers": sglang_monitoring_unreachable_servers,
        }
