"""The gateway a test fleet's inventory names (tests/testnode up N --gateway, deployed by
roles/sglang_gateway), as tests use it: its client URL, API key and CA file (host variables
the harness wrote), and its worker listing (GET /workers, the API sglang-router 0.3.2 serves
behind the same key).
"""

from __future__ import annotations

import json
import ssl
import time
import urllib.request

import yaml


class DeployedGateway:
    """The one host of the inventory group sglang_gateways."""

    def __init__(self, inventory_path):
        groups = yaml.safe_load(inventory_path.read_text())["all"]["children"]
        (self.name, host_vars), = groups["sglang_gateways"]["hosts"].items()
        self.url = host_vars["sglang_gateway_url"]
        self.api_key = host_vars["sglang_gateway_api_keys"][0]
        self.ca_file = host_vars["sglang_gateway_tls_ca_file"]
        self.serving = list(groups["sglang_nodes"]["hosts"])

    def workers(self):
        """{url: is_healthy} as the gateway lists its workers."""
        request = urllib.request.Request(self.url + "/workers", headers={"Authorization": f"Bearer {self.api_key}"})
        context = ssl.create_default_context(cafile=self.ca_file)
        with urllib.request.urlopen(request, timeout=5, context=context) as response:  # noqa: S310 (test node)
            listing = json.load(response)
        return {w["url"]: w["is_healthy"] for w in listing["workers"]}

    def wait_workers(self, urls, timeout=60, interval=0.5):
        """Wait (bounded) until the gateway lists exactly these workers, all healthy."""
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            try:
                last = self.workers()
                if set(last) == set(urls) and all(last.values()):
                    return last
            except OSError as err:
                last = err
            time.sleep(interval)
        raise AssertionError(f"gateway workers after {timeout} s: {last}, wanted {sorted(urls)} healthy")
