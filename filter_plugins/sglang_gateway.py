"""Filters of roles/sglang_gateway: the workers behind a gateway (their URLs, the inventories that
would make them unreachable or ambiguous), the refusals of a TLS pair community.crypto read on the
controller, and the variables behind what sglang-router's own parser refused.

Pure logic, unit-tested in tests/unit/test_sglang_gateway.py.
"""

import datetime
import ipaddress
import json
from urllib.parse import urlsplit

from ansible.errors import AnsibleFilterError

# roles/sglang/defaults/main.yml: sglang_worker_host and sglang_worker_port. A node's role
# defaults are not in hostvars, so these are the values a node without inventory settings
# has (tests/unit/test_sglang_gateway.py checks they equal the defaults file).
DEFAULT_WORKER_HOST = "127.0.0.1"
DEFAULT_WORKER_PORT = 30000


def _get(variables, name):
    try:
        return variables[name]
    except KeyError:
        return None


def worker_url(variables):
    """The URL a gateway reaches one node's server at, from that node's variables."""
    url = _get(variables, "sglang_worker_url")
    if url:
        return str(url)
    host = _get(variables, "sglang_worker_host") or DEFAULT_WORKER_HOST
    port = _get(variables, "sglang_worker_port")
    if port is None:
        server_args = _get(variables, "sglang_server_args")
        if isinstance(server_args, dict) and isinstance(server_args.get("port"), int):
            port = server_args["port"]
    if port is None:
        port = DEFAULT_WORKER_PORT
    host = str(host)
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"  # an IPv6 address
    return f"http://{host}:{port}"


def sglang_gateway_worker_urls(hosts, hostvars):
    """[URL] of the given nodes (groups['sglang_nodes']), in their order."""
    if not isinstance(hosts, (list, tuple)):
        raise AnsibleFilterError(f"sglang_gateway_worker_urls expects a list of host names, got {type(hosts).__name__}")
    return [worker_url(hostvars[host]) for host in hosts]


def _only_local(host):
    """True when a URL's host is reached only from the machine itself: loopback or unspecified."""
    host = (host or "").strip("[]").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False  # a name: whether others reach it is the DNS's business
    return address.is_loopback or address.is_unspecified


def _same_host(hostvars, one, other):
    """Two inventory hosts are one machine: the same name, or the same ansible_host."""
    if one == other:
        return True
    address = _get(hostvars[one], "ansible_host")
    return address is not None and address == _get(hostvars[other], "ansible_host")


def _names(hosts):
    return hosts[0] if len(hosts) == 1 else ", ".join(hosts[:-1]) + " and " + hosts[-1]


def sglang_gateway_worker_errors(hosts, hostvars, gateway):
    """[message] of nodes the gateway `gateway` cannot tell apart or reach; [] when every node has its own URL."""
    if not isinstance(hosts, (list, tuple)):
        raise AnsibleFilterError(f"sglang_gateway_worker_errors expects a list of host names, got {type(hosts).__name__}")
    errors = []
    by_url = {}
    for host in hosts:
        variables = hostvars[host]
        url = worker_url(variables)
        by_url.setdefault(url, []).append(host)
        address = urlsplit(url).hostname
        if _only_local(address) and not _same_host(hostvars, host, gateway):
            variable = "sglang_worker_url" if _get(variables, "sglang_worker_url") else "sglang_worker_host"
            errors.append(f"{variable} of {host}: its worker URL {url} is on {address}, which only {host} itself "
                          f"reaches, and the gateway {gateway} is another host; expected {host}'s address as "
                          f"{gateway} reaches it (its private address)")
    for url, same in by_url.items():
        if len(same) > 1:
            errors.append(f"sglang_worker_host: {_names(same)} have the same worker URL {url}; expected a URL of "
                          "its own for each node (each node's own address in sglang_worker_host)")
    return errors


def sglang_gateway_tls_errors(cert_info, key_info):
    """[message] of what is wrong with a certificate and its key; [] when the pair is usable.

    cert_info and key_info are what community.crypto's x509_certificate_info and
    openssl_privatekey_info returned for them (tasks/check.yml): the parsing is theirs, the
    messages that name the variable are the role's."""
    errors = []
    if not (cert_info or {}).get("public_key"):
        errors.append("sglang_gateway_tls_cert: expected a PEM certificate (-----BEGIN CERTIFICATE-----), "
                      "got something that does not parse as one")
    if not (key_info or {}).get("can_parse_key"):
        # The key's text is never quoted back: it is a secret.
        errors.append("sglang_gateway_tls_key: expected an unencrypted PEM private key, got something that does not "
                      "parse as one (its content is not shown)")
    if errors:
        return errors
    if cert_info["public_key"] != key_info["public_key"]:
        subject = ",".join(f"{name}={value}" for name, value in cert_info.get("subject_ordered") or [])
        errors.append("sglang_gateway_tls_cert and sglang_gateway_tls_key: the certificate's public key is not the "
                      f"key's (certificate {subject}, SHA-256 {cert_info['fingerprints']['sha256'].upper()}); "
                      "expected the private key of this certificate")
    if cert_info.get("expired"):
        not_after = datetime.datetime.strptime(cert_info["not_after"], "%Y%m%d%H%M%SZ")
        errors.append(f"sglang_gateway_tls_cert: expired on {not_after.isoformat()}Z; expected a valid certificate")
    return errors


# Options of the gateway's command line that come from other variables than sglang_gateway_args
# (roles/sglang_gateway/vars/main.yml, __sglang_gateway_router_argv and the worker URLs).
_OPTION_VARIABLES = {
    "--host": "sglang_gateway_host",
    "--port": "sglang_gateway_port",
    "--tls-cert-path": "sglang_gateway_tls_cert",
    "--tls-key-path": "sglang_gateway_tls_key",
    "--worker-urls": "the worker URLs of sglang_nodes (sglang_worker_url, sglang_worker_host, sglang_worker_port)",
}


def sglang_gateway_parser_verdict(check_result, gateway_args, version):
    """What roles/sglang_gateway makes of `sglang-gateway-launch --check`'s JSON line (check_result):
    {"pending": true} when the host has no sglang-router `version` yet to ask (a first deploy, an
    upgrade before pip ran), else {"pending": false, "errors": [message naming the variable]}."""
    try:
        answer = json.loads(check_result) if isinstance(check_result, str) else check_result
    except ValueError:
        answer = None
    if not isinstance(answer, dict) or answer.get("version") != version:
        return {"pending": True, "errors": []}
    error = answer.get("error")
    if not error:
        return {"pending": False, "errors": []}
    option = answer.get("option")
    field = option[2:].replace("-", "_") if option else None
    if option in _OPTION_VARIABLES:
        variable = _OPTION_VARIABLES[option]
    elif field and isinstance(gateway_args, dict) and field in gateway_args:
        variable = f"sglang_gateway_args.{field}"
    else:
        # a value the Rust side could not take (no option named): any of the values the role renders
        variable = "sglang_gateway_args, sglang_gateway_host or sglang_gateway_port"
    return {"pending": False, "errors": [f"{variable}: sglang-router {version} refused the gateway's command line: {error}"]}


class FilterModule:
    """sglang_gateway's filters."""

    def filters(self):
        return {
            "sglang_gateway_worker_urls": sglang_gateway_worker_urls,
            "sglang_gateway_worker_errors": sglang_gateway_worker_errors,
            "sglang_gateway_tls_errors": sglang_gateway_tls_errors,
            "sglang_gateway_parser_verdict": sglang_gateway_parser_verdict,
        }
