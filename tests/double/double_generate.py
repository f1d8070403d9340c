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

Knobs (environment of the server double):
  SGLANG_DOUBLE_STEP_SECONDS    pause per decode step (default 0.002)
  SGLANG_DOUBLE_ACCEPT_LENGTH   reported and simulated accept length with speculation (default 2.7)
  SGLANG_DOUBLE_GENERATE_FAIL=1 /generate answers 500 (a server that is up but cannot serve)
"""

import json
import os
import time

_STEP_SECONDS = "SGLANG_DOUBLE_STEP_SECONDS"
_ACCEPT_LENGTH = "SGLANG_DOUBLE_ACCEPT_LENGTH"
_FAIL = "SGLANG_DOUBLE_GENERATE_FAIL"


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
    length = int(handler.headers.get("Content-Length") or 0)
    try:
        body = json.loads(handler.rfile.read(length) or b"{}")
    except ValueError:
        _send_json(handler, 400, {"error": "request body is not JSON"})
        return
    if os.environ.get(_FAIL) == "1":
        _send_json(handler, 500, {"error": "TEST DOUBLE told to fail /generate (SGLANG_DOUBLE_GENERATE_FAIL=1)"})
        return
    params = body.get("sampling_params") or {}
    max_new_tokens = int(params.get("max_new_tokens") or 16)
    prompt_tokens = _prompt_tokens(body)
    pause = float(os.environ.get(_STEP_SECONDS, "0.002"))
    plan = steps(max_new_tokens, accept_length(double))
    if not body.get("stream"):
        time.sleep(pause * len(plan))
        _send_json(handler, 200, _chunk(max_new_tokens, prompt_tokens, True, max_new_tokens))
        return
    handler.send_response(200)
    handler.send_header("Content-Type", "text/event-stream")
    handler.send_header("Cache-Control", "no-cache")
    handler.send_header("Connection", "close")
    handler.end_headers()
    total = 0
    for step in plan:
        time.sleep(pause)
        total += step
        event = _chunk(total, prompt_tokens, total >= max_new_tokens, max_new_tokens)
        handler.wfile.write(b"data: " + json.dumps(event).encode() + b"\n\n")
        handler.wfile.flush()
    handler.wfile.write(b"data: [DONE]\n\n")
    handler.wfile.flush()
    handler.close_connection = True


def _send_json(handler, status, body):
    payload = json.dumps(body).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(payload)))
    handler.end_headers()
    handler.wfile.write(payload)


def install(handler_class, double):
    """Add POST /generate and /flush_cache to the double's handler and internal_states to its
    server info; returns the handler class for ThreadingHTTPServer."""
    base_info = double.server_info

    def server_info():
        info = dict(base_info())
        state = {"last_gen_throughput": 0.0, "memory_usage": {}}
        accept = accept_length(double)
        if accept is not None:
            state["avg_spec_accept_length"] = accept
        info["internal_states"] = [state]
        return info

    double.server_info = server_info

    def do_POST(self):  # noqa: N802 (http.server's naming)
        path = self.path.split("?", 1)[0]
        if path == "/generate":
            handle_generate(self, double)
        elif path == "/flush_cache":
            _send_json(self, 200, {})
        else:
            _send_json(self, 404, {"error": "not found"})

    handler_class.do_POST = do_POST
    return handler_class
