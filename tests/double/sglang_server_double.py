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
health check). Signal: SIGUSR1 makes /health_generate and /generate hang while /health
stays 200, a scheduler hang as users see it (tests/double/double_hang.py; real SGLang's
/health would fail too, as it also runs a generation).
"""

import dataclasses
import json
import os
import pwd
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

_ENV_PREFIXES = ("SGLANG_", "NCCL_")


def resolve_server_args(argv):
    """Run argv through SGLang's own parser and post-init rules; SystemExit on refusal."""
    from sglang.srt.server_args import prepare_server_args  # pylint: disable=import-outside-toplevel

    # A GPU-less node has no accelerator to detect; the real node would pick cuda.
    parse_argv = list(argv) if "--device" in argv else list(argv) + ["--device", "cuda"]
    return prepare_server_args(parse_argv)


def spec_v2_enabled():
    from sglang.srt.environ import envs  # pylint: disable=import-outside-toplevel

    return bool(envs.SGLANG_ENABLE_SPEC_V2.get())


class Double:
    """State the HTTP handler reports."""

    def __init__(self, argv, server_args):
        self.argv = argv
        self.server_args = server_args
        self.started = time.monotonic()
        self.warmup = float(os.environ.get("SGLANG_DOUBLE_WARMUP_SECONDS", "2"))
        self.never_healthy = os.environ.get("SGLANG_DOUBLE_NEVER_HEALTHY") == "1"

    def healthy(self):
        return not self.never_healthy and time.monotonic() - self.started >= self.warmup

    def server_info(self):
        fields = dataclasses.asdict(self.server_args)
        return {
            "double": True,
            "argv": self.argv,
            "server_args": json.loads(json.dumps(fields, default=str)),
            "environment": {k: v for k, v in sorted(os.environ.items()) if k.startswith(_ENV_PREFIXES)},
            "spec_v2": spec_v2_enabled(),
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
                self._send(200, {"object": "list", "data": [{"id": double.server_args.served_model_name, "object": "model"}]})
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
    server_args = resolve_server_args(argv)
    double = Double(argv, server_args)
    print(f"sglang server TEST DOUBLE: accepted {' '.join(argv)}; spec_v2={spec_v2_enabled()}", flush=True)
    # POST /generate and /flush_cache for bench_serving (tests/double/double_generate.py)
    import double_generate  # pylint: disable=import-outside-toplevel

    handler = double_generate.install(make_handler(double), double)
    # GET /metrics with --enable-metrics (tests/double/double_metrics.py)
    import double_metrics  # pylint: disable=import-outside-toplevel

    handler = double_metrics.install(handler, double)
    # SIGUSR1: the generation path hangs, /health stays 200 (tests/double/double_hang.py)
    import double_hang  # pylint: disable=import-outside-toplevel

    handler = double_hang.install(handler, double)
    httpd = ThreadingHTTPServer((server_args.host, server_args.port), handler)
    httpd.serve_forever()


if __name__ == "__main__":
    main(sys.argv[1:])
