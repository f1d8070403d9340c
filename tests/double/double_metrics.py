"""TEST DOUBLE of SGLang 0.5.9's GET /metrics, for the server double (sglang_server_double.py).

Loaded by the server double, after double_generate, with:

    import double_metrics  # pylint: disable=import-outside-toplevel
    handler = double_metrics.install(handler, double)

When SGLang would export metrics (`--enable-metrics`, i.e. ServerArgs.enable_metrics as SGLang
resolved it), GET /metrics answers Prometheus text (version 0.0.4, as prometheus_client writes
it) with exactly the metrics listed in sglang_metrics.yml next to this file: the same names,
types, help texts, label names and histogram buckets as SGLang 0.5.9 (a unit test checks that
list against the wheel's source). Without the flag /metrics is 404, as in SGLang.

The values follow the load the double serves through POST /generate:

- sglang:num_running_reqs  requests being generated now;
- sglang:num_queue_reqs    requests waiting for a running slot (at most max_running_requests run
                           at once: ServerArgs.max_running_requests, else SGLANG_DOUBLE_MAX_RUNNING,
                           default 64);
- sglang:num_used_tokens / sglang:token_usage  prompt + max_new_tokens of the running requests,
                           out of sglang:max_total_num_tokens (SGLANG_DOUBLE_MAX_TOTAL_TOKENS,
                           default 8192, small so that a test load moves it);
- sglang:gen_throughput    tokens generated in the last 5 s / 5;
- sglang:spec_accept_length  the double's accept length with speculation (0 without, as SGLang);
- counters of requests and tokens, histograms of queue time, TTFT, inter-token and e2e latency.
"""

import io
import json
import os
import threading
import time
from collections import deque
from pathlib import Path

import double_generate
import yaml

SPEC_FILE = Path(__file__).with_name("sglang_metrics.yml")
_MAX_RUNNING = "SGLANG_DOUBLE_MAX_RUNNING"
_MAX_TOTAL_TOKENS = "SGLANG_DOUBLE_MAX_TOTAL_TOKENS"
THROUGHPUT_WINDOW_SECONDS = 5.0


def load_spec(path=SPEC_FILE):
    with open(path, encoding="utf-8") as f:
        return yaml.safe_load(f)


def _fmt(value):
    return repr(float(value))


def _escape(value):
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(pairs):
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in pairs) + "}"


class Histogram:
    def __init__(self, buckets):
        self.buckets = [float(b) for b in buckets]
        self.counts = [0] * len(self.buckets)
        self.count = 0
        self.sum = 0.0

    def observe(self, value):
        self.count += 1
        self.sum += value
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[i] += 1


class Metrics:
    """Live numbers of the double, rendered as SGLang 0.5.9 exports them."""

    def __init__(self, double, spec=None):
        self.spec = spec or load_spec()
        self.double = double
        args = double.server_args
        model = args.served_model_name or args.model_path
        self.label_values = {
            "SchedulerMetricsCollector": {"model_name": model, "engine_type": "unified", "tp_rank": "0",
                                          "pp_rank": "0", "moe_ep_rank": "0"},
            "TokenizerMetricsCollector": {"model_name": model},
        }
        self.max_running = int(getattr(args, "max_running_requests", None) or os.environ.get(_MAX_RUNNING, "64"))
        self.max_total_tokens = int(os.environ.get(_MAX_TOTAL_TOKENS, "8192"))
        self.created = time.time()
        self.lock = threading.Condition()
        self.running = 0
        self.queued = 0
        self.used_tokens = 0
        self.counters = {m["name"]: 0.0 for m in self.spec["metrics"] if m["type"] == "counter"}
        self.histograms = {m["name"]: Histogram(m["buckets"]) for m in self.spec["metrics"] if m["type"] == "histogram"}
        self.generated = deque()  # (monotonic time, tokens) of finished requests

    # --- load accounting -------------------------------------------------------------------
    def admit(self, tokens):
        """Wait for a running slot (counted as queued meanwhile); returns the queue time."""
        start = time.monotonic()
        with self.lock:
            self.queued += 1
            try:
                while self.running >= self.max_running:
                    self.lock.wait()
            finally:
                self.queued -= 1
            self.running += 1
            self.used_tokens += tokens
            waited = time.monotonic() - start
            self.histograms["sglang:queue_time_seconds"].observe(waited)
        return waited

    def finish(self, tokens, prompt_tokens, new_tokens, waited, duration, steps, ok):
        now = time.monotonic()
        with self.lock:
            self.running -= 1
            self.used_tokens -= tokens
            self.lock.notify()
            self.counters["sglang:num_requests_total"] += 1
            if not ok:
                self.counters["sglang:num_aborted_requests_total"] += 1
                return
            self.counters["sglang:prompt_tokens_total"] += prompt_tokens
            self.counters["sglang:generation_tokens_total"] += new_tokens
            self.generated.append((now, new_tokens))
            first = duration / max(1, steps)
            self.histograms["sglang:time_to_first_token_seconds"].observe(waited + first)
            self.histograms["sglang:e2e_request_latency_seconds"].observe(waited + duration)
            if steps > 1:
                self.histograms["sglang:inter_token_latency_seconds"].observe((duration - first) / (steps - 1))

    def gauges(self):
        now = time.monotonic()
        with self.lock:
            while self.generated and now - self.generated[0][0] > THROUGHPUT_WINDOW_SECONDS:
                self.generated.popleft()
            generated = sum(tokens for _, tokens in self.generated)
            accept = double_generate.accept_length(self.double)
            return {
                "sglang:num_running_reqs": self.running,
                "sglang:num_queue_reqs": self.queued,
                "sglang:num_used_tokens": self.used_tokens,
                "sglang:token_usage": min(1.0, self.used_tokens / self.max_total_tokens),
                "sglang:max_total_num_tokens": self.max_total_tokens,
                "sglang:gen_throughput": generated / THROUGHPUT_WINDOW_SECONDS,
                "sglang:cache_hit_rate": 0.0,
                "sglang:spec_accept_length": accept or 0.0,
                "sglang:spec_accept_rate": self._accept_rate(accept),
            }

    def _accept_rate(self, accept):
        drafts = getattr(self.double.server_args, "speculative_num_draft_tokens", None)
        if not accept or not drafts:
            return 0.0
        return min(1.0, (accept - 1) / max(1, drafts - 1))

    # --- exposition --------------------------------------------------------------------------
    def render(self):
        gauges = self.gauges()
        out = []
        with self.lock:
            for metric in self.spec["metrics"]:
                name, kind = metric["name"], metric["type"]
                pairs = list(self.label_values[metric["collector"]].items())
                family = name[: -len("_total")] if kind == "counter" else name
                out.append(f"# HELP {family} {metric['help']}")
                out.append(f"# TYPE {family} {kind}")
                if kind == "gauge":
                    out.append(f"{name}{_labels(pairs)} {_fmt(gauges[name])}")
                elif kind == "counter":
                    out.append(f"{name}{_labels(pairs)} {_fmt(self.counters[name])}")
                    out.append(f"{family}_created{_labels(pairs)} {_fmt(self.created)}")
                else:
                    hist = self.histograms[name]
                    for bound, count in zip(hist.buckets, hist.counts):
                        out.append(f"{name}_bucket{_labels(pairs + [('le', _fmt(bound))])} {_fmt(count)}")
                    out.append(f"{name}_bucket{_labels(pairs + [('le', '+Inf')])} {_fmt(hist.count)}")
                    out.append(f"{name}_count{_labels(pairs)} {_fmt(hist.count)}")
                    out.append(f"{name}_sum{_labels(pairs)} {_fmt(hist.sum)}")
                    out.append(f"{name}_created{_labels(pairs)} {_fmt(self.created)}")
        return ("\n".join(out) + "\n").encode()


def _request_shape(raw):
    """(prompt tokens, max_new_tokens) of a /generate body, as double_generate reads it."""
    try:
        body = json.loads(raw or b"{}")
    except ValueError:
        return 0, 0
    if not isinstance(body, dict):
        return 0, 0
    if isinstance(body.get("input_ids"), list):
        prompt = len(body["input_ids"])
    else:
        text = body.get("text") or ""
        prompt = len(text.split()) if isinstance(text, str) else 0
    params = body.get("sampling_params") or {}
    return prompt, int(params.get("max_new_tokens") or 16)


def install(handler_class, double):
    """Add GET /metrics (with --enable-metrics) and the load accounting around POST /generate."""
    if not getattr(double.server_args, "enable_metrics", False):
        return handler_class
    metrics = Metrics(double)
    double.metrics = metrics
    base_get = handler_class.do_GET
    base_post = handler_class.do_POST

    def do_GET(self):  # noqa: N802 (http.server's naming)
        if self.path.split("?", 1)[0] != "/metrics":
            base_get(self)
            return
        payload = metrics.render()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def do_POST(self):  # noqa: N802 (http.server's naming)
        if self.path.split("?", 1)[0] != "/generate":
            base_post(self)
            return
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.rfile = io.BytesIO(raw)
        prompt, new_tokens = _request_shape(raw)
        tokens = prompt + new_tokens
        waited = metrics.admit(tokens)
        start = time.monotonic()
        ok = False
        try:
            base_post(self)
            ok = True
        finally:
            steps = len(double_generate.steps(new_tokens, double_generate.accept_length(double)))
            metrics.finish(tokens, prompt, new_tokens, waited, time.monotonic() - start, steps, ok)

    handler_class.do_GET = do_GET
    handler_class.do_POST = do_POST
    return handler_class
