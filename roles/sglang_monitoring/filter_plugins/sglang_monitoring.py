"""Scrape targets from the inventory, for roles/sglang_monitoring's prometheus.yml, the targets no
monitor can reach (refused by its check.yml), and the values its files are rendered from, each
written so that it cannot be read as more than one value (defence in depth behind the formats of
meta/value_formats.yml, which roles/sglang checks before anything changes)."""

import ipaddress
import re

from ansible.errors import AnsibleFilterError

# What a node's server listens on when its inventory sets neither sglang_server_args.host nor
# sglang_worker_host (roles/sglang/defaults/main.yml: the args' host comes from sglang_worker_host,
# 127.0.0.1). A node's role defaults are not in hostvars, so the inventory's values are read in
# that order (SERVER_HOST_PATHS), then this default.
SGLANG_DEFAULT_HOST = "127.0.0.1"
SERVER_HOST_PATHS = ("sglang_server_args.host", "sglang_worker_host")


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


def _first(variables, paths, default):
    """The value at the first of paths (dotted) that the variables hold, else default."""
    for path in paths:
        value = _lookup(variables, path, None)
        if value is not None:
            return value
    return default


def sglang_monitoring_targets(hosts, hostvars, port_path, default_port):
    """One target per host: {"node": name, "address": "ansible_host:port"}.

    The port is the host's variable at port_path (dotted, e.g. sglang_server_args.port; or a list
    of such paths, the first the host has wins), else default_port. An IPv6 address is put in
    brackets.
    """
    paths = [port_path] if isinstance(port_path, str) else port_path
    if not isinstance(paths, (list, tuple)) or not paths or not all(isinstance(p, str) and p for p in paths):
        raise AnsibleFilterError("sglang_monitoring_targets: port_path must be a variable name (dotted for a key) "
                                 "or a list of them")
    targets = []
    for name in hosts or []:
        variables = hostvars[name]
        port = _first(variables, paths, default_port)
        try:
            port = int(port)
        except (TypeError, ValueError):
            raise AnsibleFilterError(f"{name}: {' or '.join(paths)} is {port!r}, expected a port number") from None
        if not 0 < port < 65536:
            raise AnsibleFilterError(f"{name}: {' or '.join(paths)} is {port}, expected a port number 1-65535")
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
    scrape it: 'NODE: sglang_server_args.host is 127.0.0.1'. Empty when every server is reachable.
    The server's host is the inventory's sglang_server_args.host, else its sglang_worker_host (where
    the canonical arguments take it from), else 127.0.0.1."""
    found = []
    for name in hosts or []:
        host = str(_first(hostvars[name], SERVER_HOST_PATHS, SGLANG_DEFAULT_HOST))
        if _is_loopback(host):
            found.append(f"{name}: sglang_server_args.host is {host}")
    return found


def sglang_monitoring_unreachable_gateways(hosts, hostvars, monitors, host_path):
    """One line per gateway whose metrics no monitor of the list can scrape. Empty when all can.

    host_path (dotted) is where a gateway's facts hold the address its metrics listen on: the fact
    sglang_gateway_endpoint that roles/sglang_gateway publishes in site.yml's first play, with the
    role's defaults applied. A gateway without it is named ('NODE: publishes no ...'), and so is one
    listening on loopback ('NODE: sglang_gateway_args.prometheus_host is 127.0.0.1'), unless every
    monitor is that host itself and reaches it at a loopback address (ansible_host)."""
    if not isinstance(host_path, str) or not host_path:
        raise AnsibleFilterError("sglang_monitoring_unreachable_gateways: host_path must be a variable name (dotted for a key)")
    monitors = [str(m) for m in monitors or []]
    found = []
    for name in hosts or []:
        variables = hostvars[name]
        host = _lookup(variables, host_path, None)
        if host is None:
            found.append(f"{name}: publishes no {host_path} (site.yml's first play sets it on every gateway; "
                         "was the gateway left out with --limit?)")
            continue
        host = str(host)
        if not _is_loopback(host):
            continue
        local = all(m == str(name) for m in monitors) and _is_loopback(_address(name, variables))
        if not local:
            found.append(f"{name}: sglang_gateway_args.prometheus_host is {host}")
    return found


# Prometheus's duration grammar (prometheus/common model.ParseDuration): units from the largest
# down, each at most once, or a bare 0.
PROMETHEUS_DURATION = re.compile(r"(?:[0-9]+y)?(?:[0-9]+w)?(?:[0-9]+d)?(?:[0-9]+h)?(?:[0-9]+m)?(?:[0-9]+s)?(?:[0-9]+ms)?")
# What a word of ARGS may hold: inside systemd's single quotes only a quote, a backslash or a
# control character could end the word or change it.
ARGS_UNSAFE = re.compile(r"['\"\\\x00-\x1f\x7f]")


def sglang_monitoring_duration(value, name):
    """value, when it is a Prometheus duration; else refused naming the variable name. For the
    rules and scrape configuration, where a duration is spliced into a query or YAML: e.g.
    '1h])) < 0 #' would make a rule that can never fire and still passes promtool."""
    text = str(value)
    if isinstance(value, bool) or not text or not (text == "0" or PROMETHEUS_DURATION.fullmatch(text)):
        raise AnsibleFilterError(f"{name}: expected a Prometheus duration (e.g. 30s, 5m, 1h30m, 15d), got {text!r}")
    return text


def sglang_monitoring_number(value, name):
    """value, when it is an int or a float (a number spliced into a rule's query); else refused
    naming the variable name."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise AnsibleFilterError(f"{name}: expected a number, got {value!r}")
    return value


def sglang_monitoring_args(argv):
    """The ARGS line of a Debian unit's /etc/default file: each argument one single-quoted word.

    Debian's units run `PROGRAM $ARGS`, and systemd splits an unbraced $ARGS at whitespace,
    honouring quotes: quoted, a space in a value stays inside its argument and cannot start a new
    flag. An argument holding a quote, a backslash or a control character, which could end the
    word, is refused (the role's formats allow none of them)."""
    words = []
    for arg in argv or []:
        arg = str(arg)
        if ARGS_UNSAFE.search(arg):
            raise AnsibleFilterError(f"sglang_monitoring_args: {arg!r} holds a quote, a backslash or a control "
                                     "character, which could end its word in ARGS")
        words.append(f"'{arg}'")
    return " ".join(words)


class FilterModule:
    """sglang_monitoring's filters."""

    def filters(self):
        return {
            "sglang_monitoring_targets": sglang_monitoring_targets,
            "sglang_monitoring_unreachable_servers": sglang_monitoring_unreachable_servers,
            "sglang_monitoring_unreachable_gateways": sglang_monitoring_unreachable_gateways,
            "sglang_monitoring_duration": sglang_monitoring_duration,
            "sglang_monitoring_number": sglang_monitoring_number,
            "sglang_monitoring_args": sglang_monitoring_args,
        }
