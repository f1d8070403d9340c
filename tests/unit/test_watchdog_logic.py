"""The watchdog's decisions (roles/sglang_watchdog/files/sglang-watchdog): pure functions only.

When it probes, when it restarts, that it never loops (restart budget, no action while the server
starts or a deploy holds the lock), that a new server process starts the count again, and what
it writes for the node exporter's textfile collector (every sglang_watchdog_* series the alert
rules read is one it writes).
"""

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import jinja2
import pytest
import yaml
from project_modules import REPO, load

PROGRAM = REPO / "roles" / "sglang_watchdog" / "files" / "sglang-watchdog"
MONITORING = REPO / "roles" / "sglang_monitoring"


@pytest.fixture(scope="module")
def wd():
    return load(PROGRAM.relative_to(REPO))


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


LOCK_MAX = 7200


@pytest.mark.parametrize(
    ("content", "mtime", "status"),
    [
        (None, None, "none"),  # no lock file
        (f"{NOW + 60:.0f}\n", NOW, "held"),  # expires in a minute
        (f"{NOW + LOCK_MAX:.0f}\n", NOW, "held"),  # the longest a deploy may hold it
        (f"{NOW - 1:.0f}\n", NOW - 3000, "expired"),  # expired: a run that died left it
        ("garbage", NOW - 60, "held"),  # unreadable expiry: held while fresh
        ("garbage", NOW - LOCK_MAX - 1, "expired"),  # ... and stale after the maximum
        ("", None, "expired"),
        # issue 38: an expiry no deploy writes once silenced the watchdog forever
        ("9999999999\n", NOW, "too_long"),
        (f"{NOW + LOCK_MAX + 1:.0f}\n", NOW, "too_long"),
    ],
)
def test_lock_expiry(wd, content, mtime, status):
    assert wd.lock_status(content, mtime, NOW, LOCK_MAX) == status


def test_a_lock_held_too_long_does_not_stop_the_watchdog_and_is_reported(wd):
    lock = wd.lock_status("9999999999\n", NOW, NOW, LOCK_MAX)
    state = {**wd.empty_state(), "failures": 2, "main_pid": 100}
    action, state, _ = tick(wd, state, probe_ok=False, locked=lock == "held")
    assert action == "restart"
    samples = _samples(wd.textfile_metrics(state, action, "sglang.service", lock))
    assert samples["sglang_watchdog_lock_held_too_long"] == 1
    samples = _samples(wd.textfile_metrics(state, action, "sglang.service", "held"))
    assert samples["sglang_watchdog_lock_held_too_long"] == 0


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
    """The alert rules as roles/sglang_monitoring writes them, from the role's defaults and with
    the role's own filters."""
    values = yaml.safe_load((MONITORING / "defaults" / "main.yml").read_text())
    env = jinja2.Environment(trim_blocks=True, undefined=jinja2.StrictUndefined)
    for plugin in sorted((MONITORING / "filter_plugins").glob("*.py")):
        env.filters.update(load(plugin.relative_to(REPO)).FilterModule().filters())
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


@pytest.mark.parametrize(
    ("action", "out_of_rotation", "step"),
    [
        ("restart", False, "leave"),  # leaves and drains like every restart
        ("restart", True, "leave"),
        ("budget", False, "leave"),  # spent budget: a failing node leaves the rotation ...
        ("budget", True, "leave"),  # ... every tick (a deploy may have put it back)
        ("fail", False, None),  # below the threshold it keeps serving
        ("fail", True, None),
        ("skip", True, None),  # starting, stopped or locked: no probe, no verdict
        ("ok", True, "rejoin"),  # ... until a probe succeeds again
        ("ok", False, None),
    ],
)
def test_rotation_step(wd, action, out_of_rotation, step):
    assert wd.rotation_step(action, out_of_rotation) == step


def test_a_node_whose_budget_is_spent_stays_out_until_a_probe_succeeds(wd):
    state = {**wd.empty_state(), "main_pid": 100, "restarts": [NOW - 10, NOW - 5], "restarts_total": 2}
    steps = []
    for probe_ok in (False, False, False, False, True):
        action, state, _ = tick(wd, state, probe_ok=probe_ok)
        step = wd.rotation_step(action, state["out_of_rotation"])
        state["out_of_rotation"] = {"leave": True, "rejoin": False}.get(step, state["out_of_rotation"])
        steps.append((action, step))
    assert steps == [("fail", None), ("fail", None), ("budget", "leave"), ("budget", "leave"), ("ok", "rejoin")]
    assert state["out_of_rotation"] is False


class _WorkerApi:
    """A stand-in for sglang-router 0.3.2's worker API (module_utils/gateway_workers.py's
    docstring): GET/POST /workers, DELETE /workers/{id}, acting in the background after a delay,
    behind a bearer key; and a server's GET /v1/loads."""

    def __init__(self, key, workers=(), delay=0.3, in_flight=0):
        self.key, self.delay, self.in_flight = key, delay, in_flight
        self.workers = {f"id-{i}": url for i, url in enumerate(workers)}
        self.calls = []
        api = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self, code, body=None):
                payload = json.dumps(body).encode() if body is not None else b""
                self.send_response(code)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def _route(self):
                api.calls.append((self.command, self.path))
                if self.path == "/v1/loads":
                    return self._answer(200, {"aggregate": {"total_reqs": api.in_flight}})
                if self.headers.get("Authorization") != f"Bearer {api.key}":
                    return self._answer(401, {"error": "unauthorized"})
                if self.command == "GET" and self.path == "/workers":
                    return self._answer(200, {"workers": [{"id": i, "url": u, "is_healthy": True}
                                                          for i, u in list(api.workers.items())]})
                if self.command == "DELETE" and self.path.startswith("/workers/"):
                    threading.Timer(api.delay, api.workers.pop, (self.path.rsplit("/", 1)[1], None)).start()
                    return self._answer(202, {})
                if self.command == "POST" and self.path == "/workers":
                    url = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["url"]
                    threading.Timer(api.delay, api.workers.__setitem__, (f"id-{len(api.calls)}", url)).start()
                    return self._answer(202, {})
                return self._answer(404, {})

            do_GET = do_DELETE = do_POST = _route  # noqa: N815

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_port}"

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


WORKER = "http://10.0.0.11:30000"


def test_leave_removes_the_worker_from_every_gateway_and_waits_until_none_lists_it(wd):
    apis = [_WorkerApi("k1", [WORKER, "http://10.0.0.12:30000"]), _WorkerApi("k2", [WORKER + "/"])]
    try:
        problems = wd.leave([wd.Gateway(apis[0].url, "k1"), wd.Gateway(apis[1].url, "k2")], WORKER, 5, poll=0.1)
        assert problems == []
        assert list(apis[0].workers.values()) == ["http://10.0.0.12:30000"] and apis[1].workers == {}
        assert ("DELETE", "/workers/id-0") in apis[0].calls and ("DELETE", "/workers/id-0") in apis[1].calls
    finally:
        for api in apis:
            api.close()


def test_leave_is_bounded_and_names_what_went_wrong(wd):
    api = _WorkerApi("key", [WORKER], delay=30)
    try:
        problems = wd.leave([wd.Gateway(api.url, "wrong key"), wd.Gateway(api.url, "key")], WORKER, 1, poll=0.1)
        assert len(problems) == 2
        assert "answered 401" in problems[0] and "wrong key" not in " ".join(problems)
        assert "still lists http://10.0.0.11:30000 after 1 s" in problems[1]
        dead = wd.leave([wd.Gateway("http://127.0.0.1:9", "key")], WORKER, 1)  # nothing listens on port 9
        assert len(dead) == 1 and "gave no answer" in dead[0]
    finally:
        api.close()


def test_rejoin_adds_the_worker_back_and_reports_once_every_gateway_lists_it(wd):
    api = _WorkerApi("key", [], delay=0.2)
    try:
        gateways = [wd.Gateway(api.url, "key")]
        assert wd.rejoin(gateways, WORKER, 5) == (False, [])  # POST accepted, added in the background
        assert ("POST", "/workers") in api.calls
        threading.Event().wait(0.5)
        assert wd.rejoin(gateways, WORKER, 5) == (True, [])  # the next tick sees it listed
        assert [c for c in api.calls if c[0] == "POST"] == [("POST", "/workers")]
    finally:
        api.close()


def test_drain_waits_for_the_requests_in_flight_within_its_bound(wd):
    api = _WorkerApi("key", in_flight=2)
    try:
        threading.Timer(0.5, setattr, (api, "in_flight", 0)).start()
        assert wd.drain(api.url + "/v1/loads", 5, poll=0.1) == (True, "0 requests in flight")
        api.in_flight = 1
        drained, seen = wd.drain(api.url + "/v1/loads", 1, poll=0.1)
        assert not drained and seen == "1 requests in flight"
    finally:
        api.close()


def _self_signed_pem():
    import datetime  # pylint: disable=import-outside-toplevel

    from cryptography import x509  # pylint: disable=import-outside-toplevel
    from cryptography.hazmat.primitives import hashes, serialization  # pylint: disable=import-outside-toplevel
    from cryptography.hazmat.primitives.asymmetric import ec  # pylint: disable=import-outside-toplevel

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(x509.oid.NameOID.COMMON_NAME, "test CA")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(1).not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True).sign(key, hashes.SHA256()))
    return cert.public_bytes(serialization.Encoding.PEM).decode()


def test_the_gateways_credential_is_read_with_its_ca(wd, tmp_path):
    credential = tmp_path / "gateways"
    credential.write_text(json.dumps({"worker_url": WORKER, "gateways": [
        {"url": "https://10.0.0.2:8443/", "api_key": "k", "ca_pem": _self_signed_pem()},
        {"url": "http://10.0.0.3:8080", "api_key": "", "ca_pem": None}]}))
    worker_url, gateways = wd.load_gateways(str(credential))
    assert worker_url == WORKER and [g.url for g in gateways] == ["https://10.0.0.2:8443", "http://10.0.0.3:8080"]
    assert gateways[0].headers["Authorization"] == "Bearer k" and "Authorization" not in gateways[1].headers
    assert gateways[0].context.get_ca_certs()[0]["subject"] == ((("commonName", "test CA"),),)
    assert gateways[1].context is None


def test_the_roles_value_formats_refuse_what_issue_38_found(project_module):
    # A probe path with a query or no leading slash, a threshold of 0 (a restart on the first
    # slow probe), a negative budget, a lock maximum of "forever": refused before anything changes.
    formats_module = project_module("filter_plugins/value_formats.py")
    formats = yaml.safe_load((PROGRAM.parent.parent / "meta" / "value_formats.yml").read_text())["value_formats"]
    defaults = yaml.safe_load((PROGRAM.parent.parent / "defaults" / "main.yml").read_text())
    assert formats_module.value_format_errors(defaults, formats) == []
    bad = {"sglang_watchdog_probe_path": "health_generate", "sglang_watchdog_failure_threshold": 0,
           "sglang_watchdog_restart_budget": -1, "sglang_watchdog_lock_max_seconds": 9999999999,
           "sglang_watchdog_interval": "30s", "sglang_watchdog_textfile_dir": "/var/lib/../etc"}
    errors = formats_module.value_format_errors(bad, formats)
    assert [e.split(":", 1)[0] for e in errors] == list(bad), errors
