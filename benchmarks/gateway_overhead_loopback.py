#!/usr/bin/env python3
"""The gateway's overhead measured on one machine, set up by itself: gateway_load.py overhead
against one server and the real gateway in front of it, both on loopback.

- The server: the TEST DOUBLE (tests/double/sglang_server_double.py, through SGLang 0.5.9's own
  argument parser in .cache/parser-venv) with the canonical node's arguments, on
  127.0.0.1:31002, each decode step paced by --step-seconds (SGLANG_DOUBLE_STEP_SECONDS).
- The gateway: sglang-router 0.3.2 from the wheelhouse (installed into .cache/router-venv), on
  127.0.0.1:38002 with TLS (a throwaway CA made here) and an API key, its command line rendered
  from roles/sglang_gateway/defaults/main.yml's sglang_gateway_args by the role's own filter
  (filter_plugins/sglang_argv.py), as the role renders it.

The pace decides what the ratio means. The double's own default (2 ms a step, with its accept
length of 2.7 tokens a step about 1350 tokens/s per stream) answers ten times faster than the
GPUs it stands in for, and the gateway's fixed cost per request (a few ms) is then a large share.
--step-seconds 0.0311 paces it at the canonical node's measured single-stream rate, 86.8
tokens/s at concurrency 1 (the seed's benchmark table: EAGLE-3, topk 1, spec v2), the fastest a
stream of that node runs; at higher concurrency each stream is slower and the share smaller.

    benchmarks/gateway_overhead_loopback.py --step-seconds 0.0311 -- --requests 400 --rounds 3 \\
        --write-results --label double-paced-86.8-tok-s

Arguments after -- go to `gateway_load.py overhead` (its --url, --node-url, --api-key and
--ca-file are set here). Needs scripts/setup (the wheelhouse) first.
"""

from __future__ import annotations

import argparse
import os
import shlex
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "filter_plugins"))
sys.path.insert(0, str(REPO / "benchmarks"))
import gateway_load  # noqa: E402  pylint: disable=wrong-import-position
import parser_venv  # noqa: E402  pylint: disable=wrong-import-position
from sglang_argv import sglang_argv  # noqa: E402  pylint: disable=wrong-import-position

ROUTER_VENV = REPO / ".cache" / "router-venv"
MODELS = REPO / "tests" / "fixtures" / "testnode-model"
NODE_PORT, GATEWAY_PORT = 31002, 38002
API_KEY = "loopback-benchmark-key"


def router_python():
    """sglang-router's pinned version, from the wheelhouse, in a venv of its own (made once)."""
    defaults = yaml.safe_load((REPO / "roles" / "sglang_gateway" / "defaults" / "main.yml").read_text())
    version = defaults["sglang_gateway_version"]
    python = ROUTER_VENV / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(ROUTER_VENV)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-index",
                    "--find-links", str(parser_venv.WHEELHOUSE), f"sglang-router=={version}"], check=True)
    return python, defaults["sglang_gateway_args"]


def throwaway_tls(folder):
    """A CA and a certificate for 127.0.0.1 signed by it; returns (ca, cert, key) paths."""
    ca_key, ca, key, csr, cert = (folder / n for n in ("ca.key", "ca.pem", "gw.key", "gw.csr", "gw.pem"))
    run = lambda *a: subprocess.run(a, check=True, capture_output=True)  # noqa: E731
    run("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(ca_key), "-out", str(ca),
        "-days", "1", "-subj", "/CN=loopback benchmark CA")
    run("openssl", "req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(csr),
        "-subj", "/CN=127.0.0.1")
    ext = folder / "ext.cnf"
    ext.write_text("subjectAltName=IP:127.0.0.1\n")
    run("openssl", "x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key), "-CAcreateserial",
        "-out", str(cert), "-days", "1", "-extfile", str(ext))
    return ca, cert, key


def wait_answering(url, seconds, context=None):
    deadline = time.monotonic() + seconds
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2, context=context) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit(f"{url} did not answer 200 within {seconds} s")
        time.sleep(0.5)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--step-seconds", type=float, default=0.0311,
                        help="the double's pause per decode step (default: the canonical node's 86.8 tokens/s)")
    parser.add_argument("overhead_args", nargs=argparse.REMAINDER, help="-- then gateway_load.py overhead arguments")
    args = parser.parse_args(argv)
    extra = [a for a in args.overhead_args if a != "--"]
    double_python = parser_venv.ensure_parser_venv()
    python, gateway_args = router_python()
    processes = []
    with tempfile.TemporaryDirectory(prefix="gateway-overhead-") as tmp:
        ca, cert, key = throwaway_tls(Path(tmp))
        try:
            env = {**os.environ, "SGLANG_DOUBLE_STEP_SECONDS": str(args.step_seconds),
                   "SGLANG_DOUBLE_WARMUP_SECONDS": "0", "SGLANG_ENABLE_SPEC_V2": "1"}
            server = [str(double_python), str(REPO / "tests" / "double" / "sglang_server_double.py"),
                      *sglang_argv({"model_path": str(MODELS / "target"), "speculative_algorithm": "EAGLE3",
                                    "speculative_draft_model_path": str(MODELS / "draft"),
                                    "speculative_num_steps": 3, "speculative_eagle_topk": 1,
                                    "speculative_num_draft_tokens": 4, "tp_size": 8, "mem_fraction_static": 0.88,
                                    "host": "127.0.0.1", "port": NODE_PORT, "enable_metrics": True})]
            processes.append(subprocess.Popen(server, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            wait_answering(f"http://127.0.0.1:{NODE_PORT}/health", 180)
            router = [str(python), "-m", "sglang_router.launch_router",
                      *sglang_argv({"host": "127.0.0.1", "port": GATEWAY_PORT}, "sglang_gateway_args"),
                      "--worker-urls", f"http://127.0.0.1:{NODE_PORT}",
                      "--tls-cert-path", str(cert), "--tls-key-path", str(key),
                      *sglang_argv(gateway_args, "sglang_gateway_args"), "--api-key", API_KEY]
            processes.append(subprocess.Popen(router, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            wait_answering(f"https://127.0.0.1:{GATEWAY_PORT}/liveness", 60, ssl.create_default_context(cafile=str(ca)))
            time.sleep(2 * gateway_args.get("health_check_interval_secs", 5))  # the worker reported healthy
            overhead = ["overhead", "--url", f"https://127.0.0.1:{GATEWAY_PORT}", "--ca-file", str(ca),
                        "--api-key", API_KEY, "--node-url", f"http://127.0.0.1:{NODE_PORT}", *extra]
            shown = shlex.join(["benchmarks/gateway_overhead_loopback.py", "--step-seconds", str(args.step_seconds),
                                "--", *extra])
            return gateway_load.main(overhead, shown_command=shown)
        finally:
            for process in reversed(processes):
                process.terminate()
                process.wait(timeout=30)


if __name__ == "__main__":
    sys.exit(main())
