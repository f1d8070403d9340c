"""The one list of SGLang metrics (tests/double/sglang_metrics.yml) against the real 0.5.9 wheel.

Every name, type, help text, label set and bucket list of the list must be what SGLang 0.5.9's
own source declares (read from the pristine wheel of the wheelhouse, not from an installed copy
that a patch could have changed), and the server double must export exactly that list.
"""

import ast
import re
import sys
import threading
import time
import zipfile
from types import SimpleNamespace

import pytest
import yaml

from parser_venv import sglang_wheel
from project_modules import REPO

DOUBLE = REPO / "tests" / "double"
SPEC = yaml.safe_load((DOUBLE / "sglang_metrics.yml").read_text(encoding="utf-8"))
_TYPES = {"Gauge": "gauge", "Counter": "counter", "Histogram": "histogram"}


def _wheel_source(member):
    with zipfile.ZipFile(sglang_wheel()) as wheel:
        return wheel.read(member).decode()


def _literal(node):
    """The value of a literal; None for a computed one (buckets SGLang builds in code)."""
    try:
        return ast.literal_eval(node)
    except ValueError:
        return None


def _declared_metrics():
    """{name: {type, collector, help, labelnames, buckets}} from sglang/srt/metrics/collector.py."""
    tree = ast.parse(_wheel_source("sglang/srt/metrics/collector.py"))
    found = {}
    for cls in (node for node in tree.body if isinstance(node, ast.ClassDef)):
        assigned = {}
        for node in ast.walk(cls):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.List):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        assigned[target.id] = _literal(node.value)
        for node in ast.walk(cls):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _TYPES):
                continue
            kw = {k.arg: k.value for k in node.keywords}
            if "name" not in kw:
                continue
            buckets = kw.get("buckets")
            if isinstance(buckets, ast.Name):
                buckets = assigned.get(buckets.id)
            elif buckets is not None:
                buckets = _literal(buckets)
            found[ast.literal_eval(kw["name"])] = {
                "type": _TYPES[node.func.id],
                "collector": cls.name,
                "help": ast.literal_eval(kw["documentation"]),
                "labelnames": ast.unparse(kw["labelnames"]),
                "buckets": buckets,
            }
    return found


def _label_keys(member, function, must_have):
    """Keys of the `labels = {...}` dict literal in FUNCTION of MEMBER that holds MUST_HAVE."""
    tree = ast.parse(_wheel_source(member))
    for func in ast.walk(tree):
        if isinstance(func, ast.FunctionDef) and func.name == function:
            for node in ast.walk(func):
                if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict)
                        and any(isinstance(t, ast.Name) and t.id == "labels" for t in node.targets)):
                    keys = [ast.literal_eval(k) for k in node.value.keys]
                    if must_have in keys:
                        return keys
    raise AssertionError(f"no labels dict with {must_have!r} in {member}:{function}")


@pytest.fixture(scope="module")
def declared():
    return _declared_metrics()


def test_the_list_is_for_the_pinned_release():
    assert SPEC["version"] == "0.5.9"


@pytest.mark.parametrize("metric", SPEC["metrics"], ids=lambda m: m["name"])
def test_each_metric_is_declared_so_by_sglang_0_5_9(metric, declared):
    assert metric["name"] in declared, f"{metric['name']} is not a metric of SGLang 0.5.9's collector.py"
    real = declared[metric["name"]]
    assert (metric["type"], metric["collector"], metric["help"]) == (real["type"], real["collector"], real["help"])
    # Only the collector's own labels (no per-metric extra label such as "stage" or "mode").
    assert real["labelnames"] == "labels.keys()"
    if metric["type"] == "histogram":
        assert [float(b) for b in metric["buckets"]] == [float(b) for b in real["buckets"]]
    else:
        assert "buckets" not in metric


def test_collector_labels_are_sglangs():
    scheduler = _label_keys("sglang/srt/managers/scheduler_metrics_mixin.py", "init_metrics", "engine_type")
    tokenizer = _label_keys("sglang/srt/managers/tokenizer_manager.py", "init_metric_collector_watchdog", "model_name")
    assert SPEC["collectors"]["SchedulerMetricsCollector"]["labels"] == scheduler
    assert SPEC["collectors"]["TokenizerMetricsCollector"]["labels"] == tokenizer


def test_the_checker_can_fail(declared):
    """A misspelt name or a wrong type would not pass the checks above."""
    assert "sglang:num_running_requests" not in declared
    assert declared["sglang:token_usage"]["type"] != "counter"


@pytest.fixture(scope="module")
def double_metrics():
    sys.path.insert(0, str(DOUBLE))
    try:
        import double_metrics  # pylint: disable=import-outside-toplevel
    finally:
        sys.path.remove(str(DOUBLE))
    return double_metrics


def _double(spec=None):
    args = SimpleNamespace(served_model_name="m", model_path="/m", max_running_requests=2, enable_metrics=True,
                           speculative_algorithm="EAGLE3", speculative_num_draft_tokens=4)
    return SimpleNamespace(server_args=args)


def _samples(text):
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name_labels, value = line.rsplit(" ", 1)
            out[name_labels] = float(value)
    return out


def test_the_double_exports_exactly_the_list_with_prometheus_types(double_metrics):
    text = double_metrics.Metrics(_double()).render().decode()
    types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
    expected = {(m["name"][: -len("_total")] if m["type"] == "counter" else m["name"]): m["type"]
                for m in SPEC["metrics"]}
    assert types == expected
    samples = _samples(text)
    labels = '{model_name="m",engine_type="unified",tp_rank="0",pp_rank="0",moe_ep_rank="0"}'
    assert samples["sglang:spec_accept_length" + labels] == 2.7
    assert samples['sglang:prompt_tokens_total{model_name="m"}'] == 0.0
    assert samples['sglang:time_to_first_token_seconds_bucket{model_name="m",le="+Inf"}'] == 0.0


def test_the_double_numbers_follow_the_load(double_metrics):
    metrics = double_metrics.Metrics(_double())
    waited = metrics.admit(100)
    metrics.admit(50)
    gauges = metrics.gauges()
    assert (gauges["sglang:num_running_reqs"], gauges["sglang:num_used_tokens"]) == (2, 150)
    assert gauges["sglang:token_usage"] == 150 / 8192
    metrics.finish(100, 60, 40, waited, 0.4, 10, True)
    gauges = metrics.gauges()
    assert (gauges["sglang:num_running_reqs"], gauges["sglang:num_used_tokens"]) == (1, 50)
    assert gauges["sglang:gen_throughput"] == 40 / double_metrics.THROUGHPUT_WINDOW_SECONDS
    samples = _samples(metrics.render().decode())
    assert samples['sglang:generation_tokens_total{model_name="m"}'] == 40.0
    assert samples['sglang:prompt_tokens_total{model_name="m"}'] == 60.0
    assert samples['sglang:e2e_request_latency_seconds_count{model_name="m"}'] == 1.0


def test_the_double_queues_requests_beyond_its_running_slots(double_metrics):
    # max_running_requests=2 (_double): a third request waits, counted in sglang:num_queue_reqs
    # (what SGLangQueueGrowing reads) until a running one finishes.
    metrics = double_metrics.Metrics(_double())
    first = metrics.admit(10)
    metrics.admit(10)
    third = threading.Thread(target=metrics.admit, args=(10,))
    third.start()
    deadline = time.monotonic() + 5
    while metrics.gauges()["sglang:num_queue_reqs"] < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert metrics.gauges()["sglang:num_queue_reqs"] == 1
    assert metrics.gauges()["sglang:num_running_reqs"] == 2
    metrics.finish(10, 5, 5, first, 0.1, 5, True)
    third.join(timeout=5)
    assert not third.is_alive()
    gauges = metrics.gauges()
    assert (gauges["sglang:num_queue_reqs"], gauges["sglang:num_running_reqs"]) == (0, 2)
    labels = '{model_name="m",engine_type="unified",tp_rank="0",pp_rank="0",moe_ep_rank="0"}'
    samples = _samples(metrics.render().decode())
    assert samples["sglang:num_queue_reqs" + labels] == 0.0
    assert samples["sglang:queue_time_seconds_count" + labels] == 3.0
