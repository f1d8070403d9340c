"""The watchdog's decisions (roles/sglang_watchdog/files/sglang-watchdog): pure functions only.

When it probes, when it restarts, that it never loops (restart budget, no action while the server
starts or a deploy holds the lock), and that a new server process starts the count again.
"""

import importlib.machinery
import importlib.util
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

PROGRAM = Path(__file__).resolve().parents[2] / "roles" / "sglang_watchdog" / "files" / "sglang-watchdog"


@pytest.fixture(scope="module")
def wd():
    loader = importlib.machinery.SourceFileLoader("sglang_watchdog_program", str(PROGRAM))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


NOW = 1_000_000.0
LIMITS = {"threshold": 3, "budget": 2}


def tick(wd, state, probe_ok, unit_state="active", main_pid=100, locked=False, now=NOW, **limits):
    return wd.decide(state, now, unit_state=unit_state, main_pid=main_pid, locked=locked, probe_ok=probe_ok,
                     **{**LIMITS, **limits})


def test_restart_after_threshold_consecutive_failures_and_not_before(wd):
    state = wd.empty_state()
    actions = []
    for _ in range(3):
        action, state, _reason = tick(wd, state, probe_ok=False)
        actions.append(action)
    assert actions == ["fail", "fail", "restart"]
    assert state["failures"] == 0 and state["restarts"] == [NOW] and state["restarts_total"] == 1


def test_a_success_resets_the_count(wd):
    state = wd.empty_state()
    _, state, _ = tick(wd, state, probe_ok=False)
    _, state, _ = tick(wd, state, probe_ok=False)
    action, state, _ = tick(wd, state, probe_ok=True)
    assert (action, state["failures"]) == ("ok", 0)
    action, state, _ = tick(wd, state, probe_ok=False)
    assert action == "fail"


def test_no_probe_counted_while_the_unit_is_not_active(wd):
    state = {**wd.empty_state(), "failures": 2, "main_pid": 100}
    for unit_state in ("activating", "deactivating", "inactive", "failed", "reloading"):
        action, new, reason = tick(wd, state, probe_ok=False, unit_state=unit_state)
        assert action == "skip" and new["failures"] == 0, unit_state
        assert unit_state in reason


def test_no_action_while_a_deploy_holds_the_lock(wd):
    state = {**wd.empty_state(), "failures": 2, "main_pid": 100}
    action, new, reason = tick(wd, state, probe_ok=False, locked=True)
    assert action == "skip" and new["failures"] == 0 and "lock" in reason


def test_the_budget_stops_a_restart_loop(wd):
    state = {**wd.empty_state(), "main_pid": 100, "restarts": [NOW - 1000, NOW - 10], "restarts_total": 2}
    _, state, _ = tick(wd, state, probe_ok=False)
    _, state, _ = tick(wd, state, probe_ok=False)
    action, state, reason = tick(wd, state, probe_ok=False)
    assert action == "budget" and "budget" in reason
    assert state["restarts_total"] == 2 and len(state["restarts"]) == 2
    # once the oldest restart is more than an hour old, one restart is allowed again
    action, state, _ = tick(wd, state, probe_ok=False, now=NOW - 1000 + 3600 + 1)
    assert action == "restart" and state["restarts_total"] == 3


def test_a_zero_budget_never_restarts(wd):
    state = wd.empty_state()
    for _ in range(5):
        action, state, _ = tick(wd, state, probe_ok=False, threshold=1, budget=0)
        assert action == "budget"


def test_a_new_server_process_starts_the_count_again(wd):
    state = {**wd.empty_state(), "failures": 2, "main_pid": 100}
    action, state, _ = tick(wd, state, probe_ok=False, main_pid=200)
    assert (action, state["failures"], state["main_pid"]) == ("fail", 1, 200)


@pytest.mark.parametrize(
    ("content", "mtime", "held"),
    [
        (None, None, False),  # no lock file
        (f"{NOW + 60:.0f}\n", NOW, True),  # expires in a minute
        (f"{NOW - 1:.0f}\n", NOW - 3000, False),  # expired: a run that died left it
        ("garbage", NOW - 60, True),  # unreadable expiry: held while fresh
        ("garbage", NOW - 7200, False),  # ... and stale after an hour
        ("", None, False),
    ],
)
def test_lock_expiry(wd, content, mtime, held):
    assert wd.lock_held(content, mtime, NOW) is held


def test_state_file_survives_garbage(wd, tmp_path):
    path = tmp_path / "state.json"
    assert wd.load_state(str(path)) == wd.empty_state()
    path.write_text("[1, 2]")
    assert wd.load_state(str(path)) == wd.empty_state()
    path.write_text(json.dumps({"failures": 1, "restarts": "x", "other": 3}))
    assert wd.load_state(str(path)) == {**wd.empty_state(), "failures": 1}


class _Server:
    def __init__(self, behaviour):
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                behaviour(self)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_port}/health_generate"

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def _answer(code):
    def behaviour(handler):
        handler.send_response(code)
        handler.send_header("Content-Length", "0")
        handler.end_headers()

    return behaviour


def test_probe_ok_only_on_200_within_the_timeout(wd):
    hang = threading.Event()
    servers = {name: _Server(b) for name, b in {
        "ok": _answer(200), "unavailable": _answer(503), "hung": lambda h: hang.wait(10),
    }.items()}
    try:
        assert wd.probe(servers["ok"].url, 2)[0] is True
        ok, what = wd.probe(servers["unavailable"].url, 2)
        assert not ok and "503" in what
        ok, what = wd.probe(servers["hung"].url, 0.5)
        assert not ok and "no answer within 0.5 s" in what
    finally:
        hang.set()
        for server in servers.values():
            server.close()
    ok, what = wd.probe("http://127.0.0.1:9/health_generate", 1)  # nothing listens on port 9
    assert not ok
