"""The watchdog's decisions (roles/sglang_watchdog/files/sglang-watchdog): pure functions only.

When it probes, when it restarts, that it never loops (restart budget, no action while the server
starts or a deploy holds the lock), that a new server process starts the count again, and what
it writes for the node exporter's textfile collector (every sglang_watchdog_* series the alert
rules read is one it writes).
"""

import importlib.machinery
import importlib.util
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import jinja2
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
PROGRAM = REPO / "roles" / "sglang_watchdog" / "files" / "sglang-watchdog"
MONITORING = REPO / "roles" / "sglang_monitoring"


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


def _samples(text):
    """{metric name: value} of a textfile's sample lines; every sample has its HELP and TYPE."""
    samples = {}
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        match = re.fullmatch(r'(\w+)\{unit="sglang\.service"\} (\S+)', line)
        assert match, line
        name, value = match.groups()
        assert f"# HELP {name} " in text and (f"# TYPE {name} gauge" in text or f"# TYPE {name} counter" in text), name
        samples[name] = float(value)
    return samples


@pytest.mark.parametrize(("probe_ok", "health_ok"), [(True, 1), (False, 0)])
def test_textfile_has_the_probe_result_on_a_run_that_probed(wd, probe_ok, health_ok):
    action, state, _ = tick(wd, {**wd.empty_state(), "main_pid": 100, "restarts_total": 4}, probe_ok=probe_ok)
    text = wd.textfile_metrics(state, action, "sglang.service")
    assert text.endswith("\n")
    samples = _samples(text)
    assert samples["sglang_watchdog_health_ok"] == health_ok
    assert samples["sglang_watchdog_restarts_total"] == 4
    assert samples["sglang_watchdog_consecutive_failures"] == (0 if probe_ok else 1)
    assert samples["sglang_watchdog_budget_exhausted"] == 0
    assert "# TYPE sglang_watchdog_health_ok gauge" in text


def test_textfile_says_failed_on_a_restart_and_on_a_refused_restart(wd):
    action, state, _ = tick(wd, wd.empty_state(), probe_ok=False, threshold=1)
    assert action == "restart"
    samples = _samples(wd.textfile_metrics(state, action, "sglang.service"))
    assert (samples["sglang_watchdog_health_ok"], samples["sglang_watchdog_restarts_total"]) == (0, 1)
    action, state, _ = tick(wd, wd.empty_state(), probe_ok=False, threshold=1, budget=0)
    assert action == "budget"
    samples = _samples(wd.textfile_metrics(state, action, "sglang.service"))
    assert (samples["sglang_watchdog_health_ok"], samples["sglang_watchdog_budget_exhausted"]) == (0, 1)


@pytest.mark.parametrize("why", [{"unit_state": "inactive"}, {"unit_state": "activating"}, {"locked": True}])
def test_textfile_has_no_probe_result_on_a_run_that_did_not_probe(wd, why):
    # No value rather than the last one: the series goes stale and SGLangHealthFailing resolves
    # (a stopped server is SGLangServerDown's); the other series are still written.
    action, state, _ = tick(wd, {**wd.empty_state(), "failures": 2, "main_pid": 100}, probe_ok=None, **why)
    assert action == "skip"
    text = wd.textfile_metrics(state, action, "sglang.service")
    samples = _samples(text)
    assert "sglang_watchdog_health_ok" not in text
    assert samples["sglang_watchdog_consecutive_failures"] == 0
    assert "sglang_watchdog_last_run_timestamp_seconds" in samples


def _rendered_rules():
    """The alert rules as roles/sglang_monitoring writes them, from the role's defaults."""
    values = yaml.safe_load((MONITORING / "defaults" / "main.yml").read_text())
    env = jinja2.Environment(trim_blocks=True, undefined=jinja2.StrictUndefined)
    text = env.from_string((MONITORING / "templates" / "sglang.rules.yml.j2").read_text())
    return yaml.safe_load(text.render(ansible_managed="Ansible managed", **values))


def test_every_watchdog_series_the_alert_rules_read_is_one_the_watchdog_writes(wd):
    # The producer/consumer contract: an alert on a series nobody writes never fires.
    read = {name for group in _rendered_rules()["groups"] for rule in group["rules"]
            for name in re.findall(r"\bsglang_watchdog_\w+", rule["expr"])}
    assert {"sglang_watchdog_health_ok", "sglang_watchdog_restarts_total"} <= read
    written = set()
    for probe_ok in (True, False):
        action, state, _ = tick(wd, wd.empty_state(), probe_ok=probe_ok)
        written |= set(_samples(wd.textfile_metrics(state, action, "sglang.service")))
    assert read <= written, f"read by the rules but never written by the watchdog: {sorted(read - written)}"
