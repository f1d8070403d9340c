"""`tests/testnode up N --gateway`: N serving nodes plus one gateway host, with a test CA, the
gateway's certificate (its address in the SAN) and a test API key, all made here, on the
controller, in <state dir>/gateway/.

The gateway host is put into the inventory group `sglang_gateways` with, as host variables:
  sglang_gateway_url          the URL clients use (https://ADDRESS:PORT)
  sglang_gateway_api_keys     the test API keys (one: sglang-router 0.3.2 takes one --api-key)
  sglang_gateway_tls_ca_file  controller path of the test CA that signed the gateway's certificate
  sglang_gateway_tls_cert     the certificate (PEM), read from its file by a lookup
  sglang_gateway_tls_key      the private key (PEM), read from its file by a lookup
The serving nodes get `sglang_worker_host`, their own address, where their server listens for
the gateway (node.assign_other_hosts, as for a monitor alone). In a fleet with a monitor (`up
--monitor`), the gateway also gets `sglang_gateway_args`: the one of
inventory/testnode/group_vars/sglang_gateways.yml (read by a lookup, so that file stays the only
copy) with `prometheus_host` set to the gateway's own address, so that the monitor can scrape its
metrics (roles/sglang_monitoring refuses a gateway whose
metrics listen on loopback while a monitor is another host).
"""

from __future__ import annotations

import os
import secrets
import subprocess
from pathlib import Path

from . import util
from .sysops import Fail
from project_modules import REPO  # tests/ is on sys.path (tests/testnode, conftest.py)

GATEWAY_GROUP = "sglang_gateways"
# The role's default client port (roles/sglang_gateway/defaults/main.yml: sglang_gateway_port).
GATEWAY_PORT = 8443
# The test fleet's gateway arguments (a host variable replaces the group's whole mapping).
GROUP_VARS = REPO / "inventory" / "testnode" / "group_vars" / "sglang_gateways.yml"


def _openssl(*args: str) -> None:
    result = subprocess.run(["openssl", *args], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise Fail(f"openssl {args[0]} failed: {result.stderr.strip()}")


def make_tls(directory: Path, name: str, address: str) -> dict[str, Path]:
    """A test CA and a certificate for `address` (IP and name in the SAN) signed by it."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(directory, 0o700)
    files = {k: directory / f for k, f in (("ca_key", "ca.key"), ("ca", "ca.pem"),
                                            ("key", "gateway.key"), ("csr", "gateway.csr"),
                                            ("cert", "gateway.pem"), ("ext", "gateway.ext"))}
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(files["ca_key"]),
             "-out", str(files["ca"]), "-days", "7", "-subj", "/CN=sglang-canon test CA")
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(files["key"]),
             "-out", str(files["csr"]), "-subj", f"/CN={name}")
    files["ext"].write_text(f"subjectAltName=IP:{address},DNS:{name}\n"
                            "extendedKeyUsage=serverAuth\nbasicConstraints=CA:FALSE\n")
    _openssl("x509", "-req", "-in", str(files["csr"]), "-CA", str(files["ca"]), "-CAkey", str(files["ca_key"]),
             "-CAcreateserial", "-out", str(files["cert"]), "-days", "7", "-extfile", str(files["ext"]))
    for path in directory.iterdir():
        os.chmod(path, 0o600)
    return files


def monitored_args(address: str) -> str:
    """sglang_gateway_args for a gateway that a monitor scrapes: the group's, metrics on `address`."""
    return ("{{ (lookup('ansible.builtin.file', '%s') | from_yaml).sglang_gateway_args"
            " | combine({'prometheus_host': '%s'}) }}" % (GROUP_VARS, address))


def assign(state_dir: Path, gateway: dict, monitored: bool = False) -> None:
    """Make `gateway` the gateway of the serving nodes (each serves at its own address:
    node.assign_other_hosts). monitored: the fleet has a monitor (`up --monitor`), so the gateway's
    metrics listen on its address."""
    tls = make_tls(state_dir / "gateway", gateway["name"], gateway["ip"])
    api_key = "sk-test-" + secrets.token_urlsafe(24)
    key_file = state_dir / "gateway" / "api-key"
    key_file.write_text(api_key + "\n")
    os.chmod(key_file, 0o600)
    util.add_to_group(gateway, GATEWAY_GROUP, {
        "sglang_gateway_url": f"https://{gateway['ip']}:{GATEWAY_PORT}",
        "sglang_gateway_api_keys": [api_key],
        "sglang_gateway_tls_ca_file": str(tls["ca"]),
        "sglang_gateway_tls_cert": "{{ lookup('ansible.builtin.file', '%s') }}" % tls["cert"],
        "sglang_gateway_tls_key": "{{ lookup('ansible.builtin.file', '%s') }}" % tls["key"],
    })
    if monitored:
        gateway["host_vars"]["sglang_gateway_args"] = monitored_args(gateway["ip"])
