"""TEST DOUBLE of SGLang's POST /generate, for the server double (sglang_server_double.py).

Loaded by the server double with:

    import double_generate  # pylint: disable=import-outside-toplevel
    handler = double_generate.install(make_handler(double), double)

It answers what `python -m sglang.bench_serving --backend sglang` (SGLang 0.5.9) asks of a
server, in the shapes that bench_serving.py reads:

- POST /generate with {"text" or "input_ids", "sampling_params": {"max_new_tokens", ...},
  "stream": true}: server-sent events, one `data: {json}` line per decode step whose "text"
  is the whole text generated so far and whose meta_info.completion_tokens counts the
  tokens so far (async_request_sglang_generate reads exactly these), then `data: [DONE]`.
  With "stream": false, one JSON object of the same shape.
- POST /flush_cache: 200 (bench_serving calls it when SGLANG_IS_IN_CI is set).
- GET /get_server_info and /server_info gain "internal_states": [{...}], which is where
  bench_serving reads the accept length ("avg_spec_accept_length", present only when a
  speculative algorithm is configured, as in SGLang's scheduler).

No model runs: the "tokens" are words w<N>. With speculation each decode step emits
accept-length tokens at once, so the accept length shows in the stream as it does for real.

- POST /v1/completions and /v1/chat/completions, plain and streamed ("stream": true), in the
  OpenAI shapes SGLang 0.5.9 answers (entrypoints/openai/protocol.py: CompletionResponse,
  CompletionStreamResponse, ChatCompletionResponse, ChatCompletionStreamResponse), streamed as
  `data: {json}` events then `data: [DONE]`; "max_tokens" sets the length (default 16).
- GET /v1/loads (and the deprecated /get_load): the requests in flight, in SGLang's shape
  ({"loads": [{"num_running_reqs", "num_waiting_reqs", "num_total_reqs", ...}], "aggregate":
  {"total_reqs", ...}}), which the rolling restart reads to know a node has drained.

SIGTERM, as SGLang 0.5.9 handles it (srt/managers/tokenizer_manager.py, SignalHandler and
sigterm_watchdog): /health and /health_generate answer 503 from then on, requests keep being
served (new ones too: SGLang does not refuse them), and a watchdog that wakes every
SGLANG_DOUBLE_DRAIN_POLL_SECONDS (SGLang: 5 s, fixed) exits 0 once no request is in flight.
Nothing bounds the wait but systemd's TimeoutStopSec, as for SGLang.

Knobs (environment of the server double):
  SGLANG_DOUBLE_STEP_SECONDS    pause per decode step (default 0.002)
  SGLANG_DOUBLE_REQUEST_SECONDS when set, each generation request (any route) takes this long
                                in all, spread over its decode steps (requests in flight during
                                a restart)
  SGLANG_DOUBLE_STEP_SECONDS_BY_VERSION
                                RELEASE=SECONDS[,RELEASE=SECONDS...], seconds per decode step; the entry of the
                                release the double runs under sets its pace, over the two above
                                (the test inventory's sglang_test_double_step_seconds_by_version:
                                one release slower or faster than another, for the upgrade gate);
                                a release not in it keeps the pace above
  SGLANG_DOUBLE_DRAIN_POLL_SECONDS  how often the SIGTERM watchdog looks (default 5, SGLang's)
  SGLANG_DOUBLE_ACCEPT_LENGTH   reported and simulated accept length with speculation (default 2.7)
  SGLANG_DOUBLE_GENERATE_FAIL=1 generation routes answer 500 (a server that is up but cannot serve)
"""

import functools
import http.server
import importlib.metadata
import json
import os
import signal
import sys
import threading
import time
import uuid

_STEP_SECONDS = "SGLANG_DOUBLE_STEP_SECONDS"
_ACCEPT_LENGTH = "SGLANG_DOUBLE_ACCEPT_LENGTH"
_FAIL = "SGLANG_DOUBLE_GENERATE_FAIL"
_REQUEST_SECONDS = "SGLANG_DOUBLE_REQUEST_SECONDS"
_STEP_SECONDS_BY_VERSION = "SGLANG_DOUBLE_STEP_SECONDS_BY_VERSION"
_DRAIN_POLL = "SGLANG_DOUBLE_DRAIN_POLL_SECONDS"


class InFlight:
    """Generation requests being served, and whether SIGTERM asked the server to drain."""

    def __init__(self):
        self._lock = threading.Lock()
        self.count = 0
        self.draining = False

    def __enter__(self):
        with self._lock:
            self.count += 1
        return self

    def __exit__(self, *exc):
        with self._lock:
            self.count -= 1


def accept_length(double):
    """The accept length a speculative server reports; None without speculation."""
    if getattr(double.server_args, "speculative_algorithm", None) in (None, "", "NONE"):
        return None
    return float(os.environ.get(_ACCEPT_LENGTH, "2.7"))


def steps(max_new_tokens, accept):
    """Tokens emitted per decode step: 1 each, or alternating around the accept length."""
    if max_new_tokens <= 0:
        return []
    if not accept or accept <= 1:
        return [1] * max_new_tokens
    out = []
    emitted = 0.0
    total = 0
    while total < max_new_tokens:
        emitted += accept
        step = max(1, int(emitted) - total)
        step = min(step, max_new_tokens - total)
        out.append(step)
        total += step
    return out


@functools.lru_cache(maxsize=1)
def running_release():
    """The SGLang release the double runs under (its interpreter's sglang), None without one."""
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None


def step_pause(plan_length):
    """Seconds per decode step: the pace of the SGLang release the double runs under when
    SGLANG_DOUBLE_STEP_SECONDS_BY_VERSION names it, else SGLANG_DOUBLE_REQUEST_SECONDS spread
    over the steps, else the step knob."""
    by_version = dict(entry.split("=", 1) for entry in os.environ.get(_STEP_SECONDS_BY_VERSION, "").split(",") if entry)
    release = running_release()
    if release in by_version:
        return float(by_version[release])
    total = os.environ.get(_REQUEST_SECONDS)
    if total:
        return float(total) / max(1, plan_length)
    return float(os.environ.get(_STEP_SECONDS, "0.002"))


def _read_body(handler):
    length = int(handler.headers.get("Content-Length") or 0)
    try:
        body = json.loads(handler.rfile.read(length) or b"{}")
    except ValueError:
        _send_json(handler, 400, {"error": "request body is not JSON"})
        return None
    if os.environ.get(_FAIL) == "1":
        _send_json(handler, 500, {"error": f"TEST DOUBLE told to fail generation ({_FAIL}=1)"})
        return None
    return body


def _prompt_tokens(body):
    if isinstance(body.get("input_ids"), list):
        return len(body["input_ids"])
    text = body.get("text") or ""
    return len(text.split()) if isinstance(text, str) else 0


def _chunk(tokens, prompt_tokens, finished, max_new_tokens):
    words = " ".join(f"w{3 + (i % 1000)}" for i in range(tokens))
    meta = {
        "id": "double",
        "prompt_tokens": prompt_tokens,
        "completion_tokens": tokens,
        "cached_tokens": 0,
        "finish_reason": {"type": "length", "length": max_new_tokens} if finished else None,
    }
    return {"text": words, "output_ids": list(range(tokens)), "meta_info": meta}


def handle_generate(handler, double):
    body = _read_body(handler)
    if body is None:
        return
    params = body.get("sampling_params") or {}
    max_new_tokens = int(params.get("max_new_tokens") or 16)
    prompt_tokens = _prompt_tokens(body)
    plan = steps(max_new_tokens, accept_length(double))
    pause = step_pause(len(plan))
    if not body.get("stream"):
        time.sleep(pause * len(plan))
        _send_json(handler, 200, _chunk(max_new_tokens, prompt_tokens, True, max_new_tokens))
        return
    _start_stream(handler)
    total = 0
    for step in plan:
        time.sleep(pause)
        total += step
        _send_event(handler, _chunk(total, prompt_tokens, total >= max_new_tokens, max_new_tokens))
    _end_stream(handler)


def _words(start, count):
    return "".join(f" w{3 + (i % 1000)}" for i in range(start, start + count))


def _openai_prompt_tokens(body, chat):
    if chat:
        messages = body.get("messages") or []
        return sum(len(str(m.get("content") or "").split()) for m in messages if isinstance(m, dict))
    prompt = body.get("prompt") or ""
    if isinstance(prompt, list):
        return len(prompt)
    return len(str(prompt).split())


def handle_openai(handler, double, chat):
    """POST /v1/completions (chat=False) or /v1/chat/completions (chat=True)."""
    body = _read_body(handler)
    if body is None:
        return
    max_tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
    prompt_tokens = _openai_prompt_tokens(body, chat)
    plan = steps(max_tokens, accept_length(double))
    pause = step_pause(len(plan))
    head = {
        "id": ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex,
        "created": int(time.time()),
        "model": body.get("model") or double.server_args.served_model_name or double.server_args.model_path,
    }
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": max_tokens,
             "total_tokens": prompt_tokens + max_tokens, "reasoning_tokens": 0}
    if not body.get("stream"):
        time.sleep(pause * len(plan))
        text = _words(0, max_tokens).lstrip()
        if chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text},
                      "logprobs": None, "finish_reason": "length", "matched_stop": None}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "length", "matched_stop": None}
        _send_json(handler, 200, {**head, "object": "chat.completion" if chat else "text_completion",
                                  "choices": [choice], "usage": usage, "metadata": None})
        return
    _start_stream(handler)
    kind = "chat.completion.chunk" if chat else "text_completion"
    if chat:  # SGLang's first chat chunk carries the role only
        _send_event(handler, {**head, "object": kind, "choices": [
            {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}]})
    total = 0
    for step in plan:
        time.sleep(pause)
        text = _words(total, step)
        total += step
        finish = "length" if total >= max_tokens else None
        if chat:
            choice = {"index": 0, "delta": {"content": text}, "logprobs": None, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        _send_event(handler, {**head, "object": kind, "choices": [choice]})
    if (body.get("stream_options") or {}).get("include_usage"):
        _send_event(handler, {**head, "object": kind, "choices": [], "usage": usage})
    _end_stream(handler)


def _start_stream(handler):
    handler.send_response(200)
    handler.send_header("Content-Type", "text/event-stream")
    handler.send_header("Cache-Control", "no-cache")
    handler.send_header("Connection", "close")
    handler.end_headers()


def _send_event(handler, event):
    handler.wfile.write(b"data: " + json.dumps(event).encode() + b"\n\n")
    handler.wfile.flush()


def _end_stream(handler):
    handler.wfile.write(b"data: [DONE]\n\n")
    handler.wfile.flush()
    handler.close_connection = True


def loads(in_flight, double):
    """GET /v1/loads in SGLang 0.5.9's shape (srt/entrypoints/v1_loads.py), one DP rank."""
    running = in_flight.count
    load = {"dp_rank": 0, "num_running_reqs": running, "num_waiting_reqs": 0, "num_used_tokens": 0,
            "max_total_num_tokens": 0, "token_usage": 0.0, "gen_throughput": 0.0, "cache_hit_rate": 0.0,
            "utilization": 0.0, "max_running_requests": getattr(double.server_args, "max_running_requests", None) or 0,
            "num_total_reqs": running}
    return {"timestamp": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime()), "version": double.server_info()["version"],
            "dp_rank_count": 1, "loads": [load],
            "aggregate": {"total_running_reqs": running, "total_waiting_reqs": 0, "total_reqs": running,
                          "avg_token_usage": 0.0, "avg_throughput": 0.0, "avg_utilization": 0.0}}


def drain_then_exit(in_flight, poll_seconds):
    """SGLang's sigterm_watchdog: wait for the flag, then exit once nothing is in flight."""
    while True:
        time.sleep(poll_seconds)
        sys.stderr.write(f"double: gracefully exiting... remaining number of requests {in_flight.count}\n")
        if in_flight.count == 0:
            sys.stderr.flush()
            os._exit(0)  # SGLang: kill_process_tree(own pid) then sys.exit(0)


def _send_json(handler, status, body):
    payload = json.dumps(body).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(payload)))
    handler.end_headers()
    handler.wfile.write(payload)


def install(handler_class, double):
    """Add the generation routes, /v1/loads and SGLang's SIGTERM drain to the double's handler,
    and internal_states to its server info; returns the handler class for ThreadingHTTPServer."""
    base_info = double.server_info
    base_healthy = double.healthy
    base_get = handler_class.do_GET
    in_flight = InFlight()
    double.in_flight = in_flight

    def server_info():
        info = dict(base_info())
        state = {"last_gen_throughput": 0.0, "memory_usage": {}}
        accept = accept_length(double)
        if accept is not None:
            state["avg_spec_accept_length"] = accept
        info["internal_states"] = [state]
        return info

    double.server_info = server_info
    # SGLang answers 503 on /health once SIGTERM arrived (http_server.py, health_generate).
    double.healthy = lambda: base_healthy() and not in_flight.draining

    def on_sigterm(signum, frame):  # pylint: disable=unused-argument
        if in_flight.draining:
            return
        in_flight.draining = True
        sys.stderr.write("double: SIGTERM received. Draining requests and shutting down...\n")
        poll = float(os.environ.get(_DRAIN_POLL, "5"))
        threading.Thread(target=drain_then_exit, args=(in_flight, poll), daemon=True).start()

    signal.signal(signal.SIGTERM, on_sigterm)
    # SGLang serves through uvicorn, whose listen backlog is 2048; socketserver's default of 5
    # drops connections under a few dozen concurrent clients, which SGLang would not.
    http.server.ThreadingHTTPServer.request_queue_size = 2048

    routes = {
        "/generate": lambda self: handle_generate(self, double),
        "/v1/completions": lambda self: handle_openai(self, double, chat=False),
        "/v1/chat/completions": lambda self: handle_openai(self, double, chat=True),
    }

    def do_POST(self):  # noqa: N802 (http.server's naming)
        path = self.path.split("?", 1)[0]
        if path in routes:
            with in_flight:
                routes[path](self)
        elif path == "/flush_cache":
            _send_json(self, 200, {})
        else:
            _send_json(self, 404, {"error": "not found"})

    def do_GET(self):  # noqa: N802 (http.server's naming)
        path = self.path.split("?", 1)[0]
        if path == "/v1/loads":
            _send_json(self, 200, loads(in_flight, double))
        elif path == "/get_load":
            load = loads(in_flight, double)["loads"][0]
            _send_json(self, 200, [{"dp_rank": 0, "num_reqs": load["num_total_reqs"], "num_waiting_reqs": 0,
                                    "num_tokens": 0, "ts_tic": time.time()}])
        else:
            base_get(self)

    handler_class.do_POST = do_POST
    handler_class.do_GET = do_GET
    return handler_class
