#!/usr/bin/env python3
"""TEST DOUBLE of the SGLang server, for test nodes that have no GPU.

The test inventory makes sglang.service start this file instead of
`python -m sglang.launch_server`, with exactly the same command line and environment.
It is not a fake parser: the command line goes through SGLang 0.5.9's own ServerArgs
(parser and post-init rules, as installed on the node), so a flag real SGLang would refuse
makes the double exit non-zero just as the real server would. Then it serves HTTP like
SGLang does:

- /health, /health_generate: 503 during a short warm-up, 200 after (SGLang answers 503
  until its warm-up request succeeds);
- /ping: always 200 (liveness);
- /server_info: the argv it was started with, the ServerArgs as SGLang resolved them, and
  the SGLANG_* / NCCL_* environment it saw, so tests check what the unit really passed;
- /model_info, /get_model_info, /v1/models: the model path;
- POST /generate (streamed as SGLang streams it) and /flush_cache, so the real
  sglang.bench_serving can drive it (tests/double/double_generate.py);
- GET /metrics with --enable-metrics: SGLang 0.5.9's metric names and types, with values
  that follow the load served (tests/double/double_metrics.py, tests/double/sglang_metrics.yml).

Knobs for fault tests (environment): SGLANG_DOUBLE_WARMUP_SECONDS (default 2),
SGLANG_DOUBLE_NEVER_HEALTHY=1 (stays 503 forever: a configuration that fails its
health check).

Under systemd (StateDirectory= sets $STATE_DIRECTORY) the double remembers each configuration
SGLang's parser accepted, keyed by the argv, the environment and the size and mtime of every
file of the installed sglang package, in $STATE_DIRECTORY/test-double-accepted/. A restart with
the same key serves the remembered resolution instead of importing SGLang again (4.6 CPU
seconds a start: torch and transformers, on 2-core CI machines that restart servers hundreds of
times). Anything the parser could judge differently -- another flag, another variable, a patch
applied or a hand edit of the package -- is another key and is parsed again; a refusal is never
remembered. Signal: SIGUSR1 makes /health_generate and /generate hang while /health
stays 200, a scheduler hang as users see it (tests/double/double_hang.py; real SGLang's
/health would fail too, as it also runs a generation).
"""

import dataclasses
import hashlib
import importlib.util
import json
import os
import pwd
import sys
import time
from types import SimpleNamespace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

_ENV_PREFIXES = ("SGLANG_", "NCCL_")
# Set by systemd for this start only; the parser never reads them.
_PER_START_ENV = {"INVOCATION_ID", "JOURNAL_STREAM", "SYSTEMD_EXEC_PID", "NOTIFY_SOCKET", "MAINPID",
                  "LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES", "MONITOR_EXIT_CODE", "MONITOR_EXIT_STATUS",
                  "MONITOR_INVOCATION_ID", "MONITOR_SERVICE_RESULT", "MONITOR_UNIT"}


def resolve_server_args(argv):
    """Run argv through SGLang's own parser and post-init rules; SystemExit on refusal."""
    from sglang.srt.server_args import prepare_server_args  # pylint: disable=import-outside-toplevel

    # A GPU-less node has no accelerator to detect; the real node would pick cuda.
    parse_argv = list(argv) if "--device" in argv else list(argv) + ["--device", "cuda"]
    return prepare_server_args(parse_argv)


def server_args_fields(server_args):
    """Every ServerArgs field as the release resolved it: 0.5.9's dataclass, or 0.5.23's record
    with its resolution declared over it (as module_utils/sglang_args_probe.py's resolved_fields
    reads them; the double runs on the node, where the project's module_utils are not)."""
    if dataclasses.is_dataclass(server_args):
        return dataclasses.asdict(server_args)
    from sglang.srt.arg_groups.arg_utils import record_fields  # pylint: disable=import-outside-toplevel
    from sglang.srt.arg_groups.model_override_base import resolved_view  # pylint: disable=import-outside-toplevel

    view = resolved_view(server_args)
    return {field.name: getattr(view, field.name, None) for field in record_fields(type(server_args))}


def spec_v2_enabled(fields):
    """Whether the release runs the spec v2 worker (the overlap scheduler's) for these server_args:
    0.5.9 opts in with SGLANG_ENABLE_SPEC_V2; a release without that switch (0.5.23) runs it for
    every speculative algorithm unless the overlap schedule is turned off."""
    from sglang.srt.environ import envs  # pylint: disable=import-outside-toplevel

    switch = getattr(envs, "SGLANG_ENABLE_SPEC_V2", None)
    if switch is not None:
        return bool(switch.get())
    return bool(fields.get("speculative_algorithm")) and not fields.get("disable_overlap_schedule")


def sglang_package_folder():
    return os.path.dirname(importlib.util.find_spec("sglang").origin)  # finds it, runs nothing


def accepted_key(argv):
    """What SGLang's parser judges: the argv, the environment, and every file of the package."""
    package = sglang_package_folder()
    files = []
    for folder, subfolders, names in os.walk(package):
        # Bytecode follows the sources (Python checks their mtime), and whoever imports first writes it.
        subfolders[:] = [name for name in subfolders if name != "__pycache__"]
        for name in names:
            path = os.path.join(folder, name)
            stat = os.stat(path)
            files.append((os.path.relpath(path, package), stat.st_size, stat.st_mtime_ns))
    environment = {k: v for k, v in os.environ.items() if k not in _PER_START_ENV}
    material = json.dumps({"argv": argv, "environment": environment, "package": sorted(files)}, sort_keys=True)
    return hashlib.sha256(material.encode()).hexdigest()


def resolve_or_remember(argv):
    """(server_args fields as JSON, spec_v2): remembered under systemd's state directory for an
    accepted key, else from SGLang's parser (SystemExit on refusal, never remembered)."""
    state = os.environ.get("STATE_DIRECTORY")
    path = os.path.join(state, "test-double-accepted", accepted_key(argv) + ".json") if state else None
    if path and os.path.exists(path):
        with open(path, encoding="utf-8") as handle:
            remembered = json.load(handle)
        print(f"sglang server TEST DOUBLE: {os.path.basename(path)} was accepted before; parser not run", flush=True)
        return remembered["server_args"], remembered["spec_v2"]
    fields = json.loads(json.dumps(server_args_fields(resolve_server_args(argv)), default=str))
    spec_v2 = spec_v2_enabled(fields)
    if path:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path + ".tmp", "w", encoding="utf-8") as handle:
            json.dump({"server_args": fields, "spec_v2": spec_v2}, handle)
        os.replace(path + ".tmp", path)
    return fields, spec_v2


class Double:
    """State the HTTP handler reports."""

    def __init__(self, argv, server_args_fields, spec_v2):
        self.argv = argv
        self.server_args_fields = server_args_fields
        self.server_args = SimpleNamespace(**server_args_fields)
        self.spec_v2 = spec_v2
        self.started = time.monotonic()
        self.warmup = float(os.environ.get("SGLANG_DOUBLE_WARMUP_SECONDS", "2"))
        self.never_healthy = os.environ.get("SGLANG_DOUBLE_NEVER_HEALTHY") == "1"

    def healthy(self):
        return not self.never_healthy and time.monotonic() - self.started >= self.warmup

    def server_info(self):
        return {
            "double": True,
            "argv": self.argv,
            "server_args": self.server_args_fields,
            "environment": {k: v for k, v in sorted(os.environ.items()) if k.startswith(_ENV_PREFIXES)},
            "spec_v2": self.spec_v2,
            "pid": os.getpid(),
            "user": pwd.getpwuid(os.getuid()).pw_name,
            "version": _sglang_version(),
        }


def _sglang_version():
    from importlib.metadata import version  # pylint: disable=import-outside-toplevel

    return version("sglang")


def make_handler(double):
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's naming)
            path = self.path.split("?", 1)[0]
            if path in ("/health", "/health_generate"):
                self._send(200 if double.healthy() else 503, {} if double.healthy() else {"error": "warming up"})
            elif path == "/ping":
                self._send(200, {})
            elif path in ("/server_info", "/get_server_info"):
                self._send(200, double.server_info())
            elif path in ("/model_info", "/get_model_info"):
                self._send(200, {"model_path": double.server_args.model_path, "is_generation": True})
            elif path == "/v1/models":
                # SGLang 0.5.23's resolved view leaves served_model_name unset; the server then serves
                # the model under its path, as 0.5.9 does by default (bench_serving asks for the id).
                model = double.server_args.served_model_name or double.server_args.model_path
                self._send(200, {"object": "list", "data": [{"id": model, "object": "model"}]})
            else:
                self._send(404, {"error": "not found"})

        def _send(self, status, body):
            payload = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, format, *args):  # pylint: disable=redefined-builtin
            sys.stderr.write("double: " + (format % args) + "\n")

    return Handler


def main(argv):
    fields, spec_v2 = resolve_or_remember(argv)
    double = Double(argv, fields, spec_v2)
    print(f"sglang server TEST DOUBLE: accepted {' '.join(argv)}; spec_v2={spec_v2}", flush=True)
    # POST /generate and /flush_cache for bench_serving (tests/double/double_generate.py)
    import double_generate  # pylint: disable=import-outside-toplevel

    handler = double_generate.install(make_handler(double), double)
    # GET /metrics with --enable-metrics (tests/double/double_metrics.py)
    import double_metrics  # pylint: disable=import-outside-toplevel

    handler = double_metrics.install(handler, double)
    # SIGUSR1: the generation path hangs, /health stays 200 (tests/double/double_hang.py)
    import double_hang  # pylint: disable=import-outside-toplevel

    handler = double_hang.install(handler, double)
    httpd = ThreadingHTTPServer((double.server_args.host, double.server_args.port), handler)
    httpd.serve_forever()


if __name__ == "__main__":
    main(sys.argv[1:])
