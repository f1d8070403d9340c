"""A sglang-router 0.3.2 gateway run on the controller (loopback), for tests of rolling deploys
until roles/sglang_gateway deploys one on a gateway host.

Everything that knows where the gateway runs sits here, so that a test moves onto a
role-deployed gateway by swapping its fixture: what the tests use of a gateway is
`url`, `api_key`, `ca_file`, `workers()`, `wait_workers()` and `gateway_hosts` (the inventory
group `sglang_gateways` with the host variables roles/sglang_service reads:
sglang_gateway_url, sglang_gateway_api_keys, sglang_gateway_tls_ca_file).

The router's venv is .cache/router-venv, made once with pip (sglang-router by name, pinned).
"""

from __future__ import annotations

import fcntl
import json
import os
import secrets
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROUTER_VENV = REPO / ".cache" / "router-venv"
ROUTER_VERSION = "0.3.2"


def ensure_router_venv():
    """.cache/router-venv with sglang-router==0.3.2 (pip, once; a lock keeps parallel sessions apart)."""
    python = ROUTER_VENV / "bin" / "python"
    marker = ROUTER_VENV / f".sglang-router-{ROUTER_VERSION}"
    ROUTER_VENV.parent.mkdir(parents=True, exist_ok=True)
    with open(str(ROUTER_VENV) + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not marker.exists():
            subprocess.run([sys.executable, "-m", "venv", "--clear", str(ROUTER_VENV)], check=True)
            subprocess.run([str(python), "-m", "pip", "install", "--quiet", f"sglang-router=={ROUTER_VERSION}"],
                           check=True)
            marker.touch()
    return python


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ControllerRouter:
    """sglang-router on 127.0.0.1 of the controller, fronting the given worker URLs."""

    # Quick health checks so a killed node is ejected within seconds; retries on (defaults: 5).
    ARGS = ["--policy", "round_robin", "--health-check-interval-secs", "1", "--health-failure-threshold", "2",
            "--health-success-threshold", "1", "--worker-startup-timeout-secs", "120"]

    def __init__(self, log_path):
        self.python = ensure_router_venv()
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.api_key = secrets.token_hex(16)
        self.ca_file = None
        self.log_path = Path(log_path)
        self.process = None
        self.gateway_hosts = {
            "controller-gateway": {
                "ansible_connection": "local",
                "ansible_python_interpreter": "{{ ansible_playbook_python }}",
                "sglang_gateway_url": self.url,
                "sglang_gateway_api_keys": [self.api_key],
            }
        }

    def start(self, worker_urls):
        argv = [str(self.python), "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port", str(self.port),
                # its metrics listener defaults to 0.0.0.0:29000, which another router may hold
                "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()),
                "--api-key", self.api_key, *self.ARGS, "--worker-urls", *worker_urls]
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,  # noqa: S603
                                            start_new_session=True)
        self.wait_workers(worker_urls, timeout=180)
        return self

    def stop(self):
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def workers(self):
        """{url: is_healthy} as the router lists its workers (GET /workers)."""
        request = urllib.request.Request(self.url + "/workers", headers={"Authorization": f"Bearer {self.api_key}"})
        with urllib.request.urlopen(request, timeout=5) as response:  # noqa: S310 (loopback)
            listing = json.load(response)
        return {w["url"]: w["is_healthy"] for w in listing["workers"]}

    def wait_workers(self, urls, timeout=60, interval=0.5):
        """Wait (bounded) until the router lists exactly these workers, all healthy."""
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            if self.process and self.process.poll() is not None:
                raise AssertionError(f"sglang-router exited {self.process.returncode}; log: {self.log_tail()}")
            try:
                last = self.workers()
                if set(last) == set(urls) and all(last.values()):
                    return last
            except OSError as err:
                last = err
            time.sleep(interval)
        raise AssertionError(f"router workers after {timeout} s: {last}, wanted {sorted(urls)} healthy")

    def log_tail(self, chars=3000):
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path.exists() else ""

