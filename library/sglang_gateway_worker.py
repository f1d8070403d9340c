#!/usr/bin/python
"""Ansible module: take a SGLang server out of a sglang-router gateway, wait for it to drain,
and put it back once healthy, through the gateway's worker API."""

from __future__ import annotations

import json
import time
from urllib.parse import quote

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.gateway_workers import healthy, in_flight, matching, plan, worker_id
from ansible.module_utils.six.moves.urllib.error import HTTPError
from ansible.module_utils.urls import open_url

DOCUMENTATION = r"""
---
module: sglang_gateway_worker
short_description: Remove a SGLang worker from a sglang-router gateway, wait until it drained, add it back
description:
  - O(state=absent) removes the worker O(worker_url) from the gateway at O(gateway_url)
    (C(DELETE /workers/{id}), the id read from C(GET /workers)) and waits until the gateway no
    longer lists it, so that no new request is routed to it.
  - O(state=present) adds it (C(POST /workers)) when it is not listed and waits until the
    gateway reports it C(is_healthy), so that it takes requests again.
  - O(state=drained) talks to the worker only; it waits until the server's C(GET /v1/loads)
    counts no request running or waiting. Run it after the worker left every gateway, on a
    host that reaches the worker (e.g. the node itself).
  - Every wait is bounded by O(timeout) and polls every O(poll_interval) seconds; the module
    fails naming the gateway or worker and the last state it saw.
  - Written against sglang-router 0.3.2, whose worker API answers 202 and acts in the
    background, and SGLang 0.5.9's C(/v1/loads).
version_added: "0.1.0"
author: sglang-canon
options:
  state:
    description: C(absent) out of the gateway, C(present) in it and healthy, C(drained) nothing in flight.
    type: str
    choices: [absent, present, drained]
    required: true
  worker_url:
    description: The worker's URL exactly as the gateway reaches it (scheme, address, port).
    type: str
    required: true
  gateway_url:
    description: Base URL of the gateway (its client URL; the worker API shares its port). Required unless O(state=drained).
    type: str
  api_key:
    description: The gateway's API key, sent as a bearer token; sglang-router 0.3.2 guards the worker API with it.
    type: str
  ca_file:
    description: CA certificate file (on the host the module runs on) to verify the gateway's TLS certificate with.
    type: path
  validate_certs:
    description: Verify the gateway's TLS certificate.
    type: bool
    default: true
  timeout:
    description: Seconds allowed for the wait (removal, health, or drain).
    type: int
    default: 300
  poll_interval:
    description: Seconds between polls.
    type: float
    default: 1.0
attributes:
  check_mode:
    support: full
    details: Reads the gateway and reports whether a removal or addition would happen; a drain is only reported.
  diff_mode:
    support: none
notes:
  - The API key is never returned or logged.
"""

EXAMPLES = r"""
- name: Take this node out of the gateway before its server restarts
  sglang_gateway_worker:
    state: absent
    gateway_url: https://gateway.example:8443
    api_key: "{{ vault_gateway_api_key }}"
    worker_url: http://10.0.0.11:30000
  delegate_to: localhost

- name: Wait until the node's in-flight requests finished
  sglang_gateway_worker:
    state: drained
    worker_url: http://10.0.0.11:30000
    timeout: 120

- name: Put it back once it is healthy again
  sglang_gateway_worker:
    state: present
    gateway_url: https://gateway.example:8443
    api_key: "{{ vault_gateway_api_key }}"
    worker_url: http://10.0.0.11:30000
  delegate_to: localhost
"""

RETURN = r"""
worker_ids:
  description: The gateway's ids of this worker before the change (absent, present), empty when it was not listed.
  returned: state is absent or present
  type: list
  elements: str
  sample: ["b7c1d6e0-0d1c-4a7e-9a51-3c1f0f8a2e11"]
action:
  description: What was (or in check mode, would be) done; one of add, remove, wait_healthy, wait_drained, none.
  returned: always
  type: str
  sample: remove
in_flight:
  description: Requests the worker counted when the drain wait ended (state drained).
  returned: state is drained
  type: int
  sample: 0
waited:
  description: Seconds spent waiting.
  returned: always
  type: float
  sample: 2.4
"""


class Api:
    """HTTP calls of one module run; the key stays in the headers, never in a message."""

    def __init__(self, module):
        self.module = module
        params = module.params
        self.headers = {"Content-Type": "application/json"}
        if params["api_key"]:
            self.headers["Authorization"] = "Bearer " + params["api_key"]
        self.ca_file = params["ca_file"]
        self.validate_certs = params["validate_certs"]

    def call(self, method, url, body=None, auth=True):
        data = json.dumps(body).encode() if body is not None else None
        headers = self.headers if auth else {}
        try:
            response = open_url(url, method=method, data=data, headers=headers, timeout=10,
                                validate_certs=self.validate_certs, ca_path=self.ca_file)
            status, text = response.getcode(), response.read()
        except HTTPError as err:
            status, text = err.code, err.read()
        return status, text

    def json(self, method, url, body=None, auth=True, ok=(200,)):
        status, text = self.call(method, url, body, auth)
        if status not in ok:
            raise RuntimeError(f"{method} {url} answered {status}: {text[:300]!r}")
        return json.loads(text) if text.strip() else None


def wait(module, probe, done, what):
    """Poll probe() until done(value), bounded by the timeout; returns (value, seconds waited)."""
    start = time.monotonic()
    deadline = start + module.params["timeout"]
    last = None
    while True:
        try:
            last = probe()
            if done(last):
                return last, round(time.monotonic() - start, 2)
        except (OSError, RuntimeError, ValueError) as err:  # not answering yet, or a transient error
            last = f"error: {err}"
        if time.monotonic() >= deadline:
            module.fail_json(msg=f"{what}: not done after {module.params['timeout']} s; last seen: {str(last)[:600]}")
        time.sleep(module.params["poll_interval"])


def run_membership(module, api):
    params = module.params
    base = params["gateway_url"].rstrip("/")
    worker = params["worker_url"]
    gateway_name = f"gateway {base}"

    def entries():
        return matching(api.json("GET", base + "/workers"), worker)

    try:
        before = entries()
    except (OSError, RuntimeError, ValueError) as err:
        module.fail_json(msg=f"{gateway_name}: cannot list its workers (GET /workers): {err}")
    action = plan(params["state"], before)
    result = {"worker_ids": [worker_id(e) for e in before], "action": action, "waited": 0.0,
              "changed": action in ("add", "remove")}
    if module.check_mode or action == "none":
        module.exit_json(**result)
    if action == "remove":
        for entry in before:
            api.json("DELETE", f"{base}/workers/{quote(worker_id(entry), safe='')}", ok=(200, 202, 204))
        _, result["waited"] = wait(module, entries, lambda e: not e, f"{gateway_name} still lists worker {worker}")
    else:
        if action == "add":
            api.json("POST", base + "/workers", {"url": worker}, ok=(200, 201, 202))
        _, result["waited"] = wait(module, entries, healthy, f"{gateway_name} does not report worker {worker} healthy")
    module.exit_json(**result)


def run_drain(module, api):
    url = module.params["worker_url"].rstrip("/") + "/v1/loads"
    result = {"action": "wait_drained", "changed": False, "waited": 0.0}
    if module.check_mode:
        module.exit_json(**result)
    count, result["waited"] = wait(
        module, lambda: in_flight(api.json("GET", url, auth=False)), lambda n: n == 0,
        f"worker {module.params['worker_url']} still has requests in flight (GET /v1/loads)")
    result["in_flight"] = count
    module.exit_json(**result)


def main():
    module = AnsibleModule(
        argument_spec={
            "state": {"type": "str", "required": True, "choices": ["absent", "present", "drained"]},
            "worker_url": {"type": "str", "required": True},
            "gateway_url": {"type": "str"},
            "api_key": {"type": "str", "no_log": True},
            "ca_file": {"type": "path"},
            "validate_certs": {"type": "bool", "default": True},
            "timeout": {"type": "int", "default": 300},
            "poll_interval": {"type": "float", "default": 1.0},
        },
        required_if=[("state", "absent", ["gateway_url"]), ("state", "present", ["gateway_url"])],
        supports_check_mode=True,
    )
    api = Api(module)
    if module.params["state"] == "drained":
        run_drain(module, api)
    else:
        run_membership(module, api)


if __name__ == "__main__":
    main()
