"""The server double's OpenAI routes, request time knob and /v1/loads (tests/double/double_generate.py),
driven through a stand-in for http.server's handler, without a server or SGLang."""

import io
import json
import types

import pytest


@pytest.fixture(scope="module")
def double_generate(project_module):
    return project_module("tests/double/double_generate.py")


class FakeHandler:
    """What double_generate uses of BaseHTTPRequestHandler."""

    def __init__(self, body):
        raw = json.dumps(body).encode()
        self.headers = {"Content-Length": str(len(raw))}
        self.rfile = io.BytesIO(raw)
        self.wfile = io.BytesIO()
        self.status = None
        self.sent_headers = {}
        self.close_connection = False

    def send_response(self, status):
        self.status = status

    def send_header(self, name, value):
        self.sent_headers[name] = value

    def end_headers(self):
        pass


def fake_double(speculative=None):
    args = types.SimpleNamespace(speculative_algorithm=speculative, served_model_name="served", max_running_requests=48)
    return types.SimpleNamespace(server_args=args, server_info=lambda: {"version": "0.5.9"})


def events(handler):
    chunks = handler.wfile.getvalue().decode().split("\n\n")
    assert chunks[-2:] == ["data: [DONE]", ""]
    return [json.loads(c[len("data: "):]) for c in chunks[:-2]]


def test_completion_plain_has_the_openai_shape(double_generate, monkeypatch):
    monkeypatch.setenv("SGLANG_DOUBLE_STEP_SECONDS", "0")
    handler = FakeHandler({"model": "m", "prompt": "one two three", "max_tokens": 5})
    double_generate.handle_openai(handler, fake_double(), chat=False)
    answer = json.loads(handler.wfile.getvalue())
    assert handler.status == 200
    assert answer["object"] == "text_completion" and answer["id"].startswith("cmpl-") and answer["model"] == "m"
    assert answer["choices"][0]["text"].split() == ["w3", "w4", "w5", "w6", "w7"]
    assert answer["choices"][0]["finish_reason"] == "length"
    assert answer["usage"] == {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8, "reasoning_tokens": 0}


def test_chat_streamed_sends_role_then_deltas_then_done(double_generate, monkeypatch):
    monkeypatch.setenv("SGLANG_DOUBLE_STEP_SECONDS", "0")
    handler = FakeHandler({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 7, "stream": True,
                           "stream_options": {"include_usage": True}})
    double_generate.handle_openai(handler, fake_double("EAGLE3"), chat=True)
    chunks = events(handler)
    assert handler.sent_headers["Content-Type"] == "text/event-stream"
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"} and len({c["id"] for c in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    deltas = [c["choices"][0] for c in chunks[1:-1]]
    # speculation emits several tokens per step, as the accept length says
    assert len(deltas) < 7 and "".join(d["delta"]["content"] for d in deltas).split() == [f"w{i}" for i in range(3, 10)]
    assert [d["finish_reason"] for d in deltas] == [None] * (len(deltas) - 1) + ["length"]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 7


def test_completion_streamed_ends_with_length(double_generate, monkeypatch):
    monkeypatch.setenv("SGLANG_DOUBLE_STEP_SECONDS", "0")
    handler = FakeHandler({"prompt": "x", "max_tokens": 3, "stream": True})
    double_generate.handle_openai(handler, fake_double(), chat=False)
    chunks = events(handler)
    assert [c["choices"][0]["text"] for c in chunks] == [" w3", " w4", " w5"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_request_seconds_spread_over_the_steps(double_generate, monkeypatch):
    monkeypatch.delenv("SGLANG_DOUBLE_REQUEST_SECONDS", raising=False)
    monkeypatch.setenv("SGLANG_DOUBLE_STEP_SECONDS", "0.01")
    assert double_generate.step_pause(8) == pytest.approx(0.01)
    monkeypatch.setenv("SGLANG_DOUBLE_REQUEST_SECONDS", "2")
    assert double_generate.step_pause(8) == pytest.approx(0.25)
    assert double_generate.step_pause(0) == pytest.approx(2)


def test_the_release_the_double_runs_under_sets_its_pace(double_generate, monkeypatch):
    monkeypatch.setenv("SGLANG_DOUBLE_REQUEST_SECONDS", "2")
    monkeypatch.setattr(double_generate, "running_release", lambda: "0.5.23")
    monkeypatch.setenv("SGLANG_DOUBLE_STEP_SECONDS_BY_VERSION", '0.5.10=1,0.5.23=0.05')
    assert double_generate.step_pause(8) == pytest.approx(0.05)
    # a release not in the mapping keeps the double's pace
    monkeypatch.setenv("SGLANG_DOUBLE_STEP_SECONDS_BY_VERSION", '0.5.10=0.05')
    assert double_generate.step_pause(8) == pytest.approx(0.25)


def test_generation_fails_on_request(double_generate, monkeypatch):
    monkeypatch.setenv("SGLANG_DOUBLE_GENERATE_FAIL", "1")
    handler = FakeHandler({"prompt": "x"})
    double_generate.handle_openai(handler, fake_double(), chat=False)
    assert handler.status == 500


def test_loads_count_the_requests_in_flight_in_sglangs_shape(double_generate, project_module):
    in_flight = double_generate.InFlight()
    with in_flight, in_flight:
        loads = double_generate.loads(in_flight, fake_double())
    assert loads["aggregate"]["total_reqs"] == 2 and loads["loads"][0]["num_running_reqs"] == 2
    assert loads["dp_rank_count"] == 1 and in_flight.count == 0
    # the module that waits for a drain reads exactly this shape
    gateway_workers = project_module("module_utils/gateway_workers.py")
    assert gateway_workers.in_flight(loads) == 2
