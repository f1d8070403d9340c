#!/usr/bin/env python3
"""Load client and benchmark for SGLang behind its gateway (sglang-router), stdlib only.

N concurrent clients, each on its own keep-alive connection, send requests to one URL
(http or https, with a CA file and an API key optional) and count failures and latencies.
A request fails when it gets no answer, a status other than 200, or (streamed) a stream that
does not end with `data: [DONE]`.

Commands:

  load     one load run against one URL; prints the statistics as JSON.
             gateway_load.py load --url https://gw:8443 --ca-file ca.pem --api-key K \\
                 --clients 16 --requests 400 [--route /v1/completions] [--stream]
  overhead direct to one node vs through the gateway to the same node, in the same run
           (alternating rounds, so drift of the machine hits both); prints throughput and
           p50/p99 of each and the gateway's overhead as a ratio (target <= 1.10 at p50).
  rolling  load through the gateway while a command (e.g. ansible-playbook
           playbooks/rolling_restart.yml) restarts the fleet; prints the failed requests
           (target 0).

Results go, with the command line, machine and date, to benchmarks/results/gateway_load.md
and .json when --write-results is given.

Also imported by tests (tests/integration/test_rolling_gateway.py): LoadRun runs the same
clients in threads until stopped.
"""

from __future__ import annotations

import argparse
import datetime
import http.client
import json
import platform
import os
import shlex
import ssl
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

RESULTS = Path(__file__).resolve().parent / "results"


def percentile(values, q):
    """The q-th percentile (0-100) by nearest rank; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, min(len(ordered), int(round(q / 100 * len(ordered) + 0.5))))
    return ordered[rank - 1]


def request_body(route, max_tokens, stream):
    if route == "/generate":
        return {"text": "Say something.", "sampling_params": {"max_new_tokens": max_tokens}, "stream": stream}
    if route == "/v1/chat/completions":
        return {"model": "default", "messages": [{"role": "user", "content": "Say something."}],
                "max_tokens": max_tokens, "stream": stream}
    return {"model": "default", "prompt": "Say something.", "max_tokens": max_tokens, "stream": stream}


class Target:
    """Where requests go: URL, TLS context, headers and body."""

    def __init__(self, url, route="/v1/completions", api_key=None, ca_file=None, stream=False, max_tokens=16,
                 timeout=120.0):
        parts = urlsplit(url)
        self.https = parts.scheme == "https"
        self.host = parts.hostname
        self.port = parts.port or (443 if self.https else 80)
        self.path = parts.path.rstrip("/") + route
        self.stream = stream
        self.timeout = timeout
        self.context = ssl.create_default_context(cafile=ca_file) if self.https else None
        self.headers = {"Content-Type": "application/json"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
        self.body = json.dumps(request_body(route, max_tokens, stream)).encode()

    def connect(self):
        if self.https:
            return http.client.HTTPSConnection(self.host, self.port, timeout=self.timeout, context=self.context)
        return http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)

    def once(self, conn):
        """One request on conn; returns None on success, else why it failed. Raises on a broken connection."""
        conn.request("POST", self.path, body=self.body, headers=self.headers)
        response = conn.getresponse()
        data = response.read()
        if response.status != 200:
            return f"HTTP {response.status}: {data[:200]!r}"
        if self.stream:
            if not data.rstrip().endswith(b"data: [DONE]"):
                return f"stream without [DONE]: {data[-200:]!r}"
        else:
            try:
                answer = json.loads(data)
            except ValueError:
                return f"answer is not JSON: {data[:200]!r}"
            if not isinstance(answer, dict) or not (answer.get("choices") or answer.get("text") is not None):
                return f"answer without choices/text: {data[:200]!r}"
        if response.getheader("Connection", "").lower() == "close":
            conn.close()
        return None


class LoadRun:
    """`clients` threads sending requests until `requests` were sent in all, or stop() is called."""

    def __init__(self, target, clients=16, requests=None):
        self.target = target
        self.clients = clients
        self.limit = requests
        self.lock = threading.Lock()
        self.sent = 0
        self.latencies = []  # seconds of the successful requests
        self.failures = []  # (time since start, reason)
        self.finished_at = []  # time since start of each successful request's end
        self.stopping = threading.Event()
        self.threads = []
        self.started = None
        self.elapsed = None

    def _take(self):
        with self.lock:
            if self.stopping.is_set() or (self.limit is not None and self.sent >= self.limit):
                return False
            self.sent += 1
            return True

    def _client(self):
        conn = self.target.connect()
        while self._take():
            start = time.monotonic()
            try:
                reason = self.target.once(conn)
            except (OSError, http.client.HTTPException) as err:
                reason = f"{type(err).__name__}: {err}"
                conn.close()
                conn = self.target.connect()
            end = time.monotonic()
            with self.lock:
                if reason is None:
                    self.latencies.append(end - start)
                    self.finished_at.append(end - self.started)
                else:
                    self.failures.append((round(end - self.started, 3), reason))
        conn.close()

    def start(self):
        self.started = time.monotonic()
        self.threads = [threading.Thread(target=self._client, daemon=True) for _ in range(self.clients)]
        for thread in self.threads:
            thread.start()
        return self

    def wait(self):
        for thread in self.threads:
            thread.join()
        self.elapsed = time.monotonic() - self.started
        return self.stats()

    def stop(self):
        self.stopping.set()
        return self.wait()

    def completed(self):
        with self.lock:
            return len(self.latencies)

    def stats(self):
        lat = self.latencies
        elapsed = self.elapsed or (time.monotonic() - self.started)
        return {
            "url": f"{'https' if self.target.https else 'http'}://{self.target.host}:{self.target.port}{self.target.path}",
            "stream": self.target.stream,
            "clients": self.clients,
            "sent": self.sent,
            "ok": len(lat),
            "failed": len(self.failures),
            "failures": self.failures[:20],
            "seconds": round(elapsed, 3),
            "throughput_rps": round(len(lat) / elapsed, 2) if elapsed else None,
            "p50_ms": round(percentile(lat, 50) * 1000, 2) if lat else None,
            "p99_ms": round(percentile(lat, 99) * 1000, 2) if lat else None,
            "mean_ms": round(statistics.fmean(lat) * 1000, 2) if lat else None,
        }


def run_load(target, clients, requests):
    return LoadRun(target, clients, requests).start().wait()


def overhead(args):
    """Alternating rounds direct / through the gateway; the ratio of the pooled p50s."""
    direct_lat, gateway_lat, rounds = [], [], []
    for i in range(args.rounds):
        for name, url, key, ca in (("direct", args.node_url, None, args.node_ca_file),
                                   ("gateway", args.url, args.api_key, args.ca_file)):
            target = Target(url, args.route, key, ca, args.stream, args.max_tokens)
            run = LoadRun(target, args.clients, args.requests).start()
            stats = run.wait()
            (direct_lat if name == "direct" else gateway_lat).extend(run.latencies)
            rounds.append({"round": i + 1, "path": name, **{k: v for k, v in stats.items() if k != "failures"}})
    p50_direct, p50_gateway = percentile(direct_lat, 50), percentile(gateway_lat, 50)
    return {
        "rounds": rounds,
        "direct_p50_ms": round(p50_direct * 1000, 2), "gateway_p50_ms": round(p50_gateway * 1000, 2),
        "direct_p99_ms": round(percentile(direct_lat, 99) * 1000, 2),
        "gateway_p99_ms": round(percentile(gateway_lat, 99) * 1000, 2),
        "overhead_p50": round(p50_gateway / p50_direct, 3),
        "overhead_p99": round(percentile(gateway_lat, 99) / percentile(direct_lat, 99), 3),
        "target_p50": 1.10,
        "met": p50_gateway / p50_direct <= 1.10,
        "failed": sum(r["failed"] for r in rounds),
    }


def rolling(args):
    """Load through the gateway for as long as the deploy command runs."""
    target = Target(args.url, args.route, args.api_key, args.ca_file, args.stream, args.max_tokens)
    run = LoadRun(target, args.clients).start()
    started = time.monotonic()
    deploy = subprocess.run(args.deploy, shell=True, capture_output=True, text=True, check=False)  # noqa: S602
    deploy_seconds = time.monotonic() - started
    stats = run.stop()
    return {"deploy_command": args.deploy, "deploy_rc": deploy.returncode, "deploy_seconds": round(deploy_seconds, 1),
            "deploy_tail": deploy.stdout[-1500:] if deploy.returncode else "", **stats, "target_failed": 0,
            "met": deploy.returncode == 0 and stats["failed"] == 0}


def write_results(command, name, result):
    """benchmarks/results/gateway_load_NAME.{md,json}: the result with its command, machine and date."""
    RESULTS.mkdir(exist_ok=True)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    record = {"measured": stamp, "machine": f"{platform.node()} ({os.cpu_count()} cores, {platform.platform()})",
              "load_average_at_end": load, "command": command, "result": result}
    (RESULTS / f"gateway_load_{name}.json").write_text(json.dumps(record, indent=2) + "\n")
    lines = [f"# gateway_load {name}", "", f"Measured {stamp} on {record['machine']}, load average at the end",
             f"{load} (1, 5, 15 min; other work shares the machine), by", "", f"    {command}", ""]
    if "rounds" in result:
        lines += ["| path | round | requests ok | failed | throughput req/s | p50 ms | p99 ms |",
                  "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
        lines += [f"| {r['path']} | {r['round']} | {r['ok']} | {r['failed']} | {r['throughput_rps']} | {r['p50_ms']} | "
                  f"{r['p99_ms']} |" for r in result["rounds"]]
        lines += ["", "| measure | value | target | met |", "| --- | ---: | ---: | --- |",
                  f"| p50 direct / through gateway, ms | {result['direct_p50_ms']} / {result['gateway_p50_ms']} | | |",
                  f"| p99 direct / through gateway, ms | {result['direct_p99_ms']} / {result['gateway_p99_ms']} | | |",
                  f"| gateway overhead at p50 | {result['overhead_p50']} | <= 1.10 | {'yes' if result['met'] else 'NO'} |",
                  f"| gateway overhead at p99 | {result['overhead_p99']} | | |",
                  f"| failed requests | {result['failed']} | 0 | {'yes' if result['failed'] == 0 else 'NO'} |"]
    else:
        lines += ["| measure | value | target | met |", "| --- | ---: | ---: | --- |",
                  f"| deploy command exit status | {result['deploy_rc']} | 0 | {'yes' if result['deploy_rc'] == 0 else 'NO'} |",
                  f"| deploy seconds | {result['deploy_seconds']} | | |",
                  f"| requests ok | {result['ok']} | | |",
                  f"| requests failed | {result['failed']} | 0 | {'yes' if result['failed'] == 0 else 'NO'} |",
                  f"| throughput req/s | {result['throughput_rps']} | | |",
                  f"| p50 / p99 ms | {result['p50_ms']} / {result['p99_ms']} | | |"]
    (RESULTS / f"gateway_load_{name}.md").write_text("\n".join(lines) + "\n")


def main(argv=None, shown_command=None):
    """shown_command: the command line the results record, when a wrapper (e.g.
    gateway_overhead_loopback.py) set up what this measures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    for name in ("load", "overhead", "rolling"):
        p = sub.add_parser(name)
        p.add_argument("--url", required=True, help="base URL: the gateway's (overhead, rolling) or any (load)")
        p.add_argument("--api-key", help="bearer key for --url")
        p.add_argument("--ca-file", help="CA file to verify --url's TLS certificate")
        p.add_argument("--route", default="/v1/completions",
                       choices=["/v1/completions", "/v1/chat/completions", "/generate"])
        p.add_argument("--stream", action="store_true")
        p.add_argument("--max-tokens", type=int, default=16)
        p.add_argument("--clients", type=int, default=16)
        p.add_argument("--write-results", action="store_true",
                       help="write benchmarks/results/gateway_load_CMD[_LABEL].{md,json}")
        p.add_argument("--label", help="suffix of the results' file names, e.g. the setup measured")
        if name in ("load", "overhead"):
            p.add_argument("--requests", type=int, default=400, help="requests per run (per round for overhead)")
        if name == "overhead":
            p.add_argument("--node-url", required=True, help="base URL of one node's server, direct")
            p.add_argument("--node-ca-file")
            p.add_argument("--rounds", type=int, default=3)
        if name == "rolling":
            p.add_argument("--deploy", required=True, help="shell command that restarts the fleet")
    args = parser.parse_args(argv)
    if args.cmd == "load":
        result = run_load(Target(args.url, args.route, args.api_key, args.ca_file, args.stream, args.max_tokens),
                          args.clients, args.requests)
        ok = result["failed"] == 0
    elif args.cmd == "overhead":
        result = overhead(args)
        ok = result["met"] and result["failed"] == 0
    else:
        result = rolling(args)
        ok = result["met"]
    print(json.dumps(result, indent=2))
    if args.write_results:
        command = shown_command or " ".join(shlex.quote(a) for a in ["benchmarks/gateway_load.py", *(argv or sys.argv[1:])])
        name = f"{args.cmd}_{args.label}" if args.label else args.cmd
        write_results(command.replace(args.api_key, "KEY") if args.api_key else command, name, result)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
