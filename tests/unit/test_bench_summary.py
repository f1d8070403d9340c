"""The bench_serving parser and the sweep summary (filter_plugins/bench_summary.py), on output in
bench_serving's real format: tests/fixtures/bench_serving/*.jsonl are lines written by the real
SGLang 0.5.9 client (see the README there); synthetic lines reuse exactly those keys."""

import json

import pytest
from project_modules import REPO

FIXTURES = REPO / "tests" / "fixtures" / "bench_serving"


@pytest.fixture(scope="module")
def bench(project_module):
    return project_module("filter_plugins/bench_summary.py")


@pytest.fixture(scope="module")
def bench_double(project_module):
    return project_module("tests/double/bench_serving_double.py")


# The seed's measurements (production_v2.md): at C=1 topk 1 + spec v2 made 86.8 tok/s, no
# speculation 92.7; above C=30 speculation matched or beat the baseline. The other levels are
# made up in the same spirit.
SEED = {
    1: (86.8, 92.7), 2: (170.1, 176.0), 4: (331.0, 334.2), 8: (640.5, 630.0),
    16: (1210.0, 1180.4), 32: (2205.3, 2150.9), 64: (3810.2, 3605.5), 128: (5920.8, 5480.1),
}


def _fixture(name):
    return (FIXTURES / name).read_text()


def _line(concurrency, output_throughput, accept_length, completed=None, template="eagle3-topk1-c4.jsonl"):
    """A result line with exactly bench_serving's keys (taken from a real line), chosen metrics."""
    data = json.loads(_fixture(template).splitlines()[-1])
    data.update({
        "max_concurrency": concurrency,
        "output_throughput": output_throughput,
        "median_ttft_ms": 50.0 + concurrency,
        "mean_itl_ms": 1000.0 / output_throughput * concurrency,
        "median_itl_ms": 1000.0 / output_throughput * concurrency,
        "accept_length": accept_length,
        "completed": completed if completed is not None else 4 * concurrency,
        "random_input_len": 1024,
        "random_output_len": 512,
    })
    return json.dumps(data) + "\n"


def _seed_runs():
    runs = []
    for level, (prod, base) in SEED.items():
        runs.append({"configuration": "production", "concurrency": level, "rc": 0, "num_prompts": 4 * level,
                     "jsonl": _line(level, prod, 2.31)})
        runs.append({"configuration": "baseline", "concurrency": level, "rc": 0, "num_prompts": 4 * level,
                     "jsonl": _line(level, base, None, template="baseline-c1.jsonl")})
    return runs


# --------------------------------------------------------------------------- the parser

def test_real_line_with_speculation_parses(bench):
    result = bench.parse_result(_fixture("eagle3-topk1-c4.jsonl"))
    assert result["max_concurrency"] == 4
    assert result["accept_length"] == 2.7
    assert result["completed"] == 16
    assert result["output_throughput"] == pytest.approx(3984.66, abs=0.01)
    assert result["median_ttft_ms"] > 0 and result["median_itl_ms"] > 0
    assert result["workload"] == {"backend": "sglang", "dataset_name": "random-ids", "random_input_len": 64,
                                  "random_output_len": 32, "random_range_ratio": 1.0}
    assert result["server_version"] == "0.5.9"


def test_real_baseline_line_has_no_accept_length(bench):
    result = bench.parse_result(_fixture("baseline-c1.jsonl"))
    assert result["accept_length"] is None
    assert result["max_concurrency"] == 1


def test_infinity_and_nan_are_read_but_never_written_back(bench):
    text = _fixture("baseline-c8.jsonl")
    assert '"request_rate": Infinity' in text  # bench_serving's own encoding of float("inf")
    line = json.loads(text)
    line["p99_itl_ms"] = float("nan")
    result = bench.parse_result(json.dumps(line))
    assert result["p99_itl_ms"] is None
    json.dumps(result, allow_nan=False)  # strict JSON


def test_the_last_line_counts_because_bench_serving_appends(bench):
    text = _line(8, 100.0, None) + _line(8, 200.0, None)
    assert bench.parse_result(text)["output_throughput"] == 200.0


@pytest.mark.parametrize("text, message", [
    ("", "empty"),
    ("\n\n", "empty"),
    ("not json\n", "not JSON"),
    ("[1, 2]\n", "not a bench_serving result object"),
    ('{"backend": "sglang", "completed": 3}\n', "missing max_concurrency"),
])
def test_what_is_not_bench_serving_output_is_refused(bench, text, message):
    with pytest.raises(bench.BenchSummaryError, match=message):
        bench.parse_result(text)


def test_the_test_double_writes_bench_servings_keys_in_order(bench, bench_double):
    real = json.loads(_fixture("eagle3-topk1-c4.jsonl"))
    assert tuple(real) == bench_double.RESULT_KEYS
    assert set(bench.REQUIRED) <= set(real)


def test_filter_raises_ansibles_error(bench):
    from ansible.errors import AnsibleFilterError

    with pytest.raises(AnsibleFilterError):
        bench.FilterModule().filters()["bench_serving_result"]("")


# --------------------------------------------------------------------------- the summary

def test_seed_table_winner_per_level(bench):
    summary = bench.summarize(_seed_runs(), configurations=[{"name": "production", "production": True}],
                              production="production", measured_at="2026-01-01T00:00:00Z")
    assert [c["name"] for c in summary["configurations"]] == ["production", "baseline"]
    winners = {row["concurrency"]: row["winner"] for row in summary["rows"]}
    assert winners == {1: "baseline", 2: "baseline", 4: "baseline", 8: "production", 16: "production",
                       32: "production", 64: "production", 128: "production"}
    first = summary["rows"][0]
    assert first["production_vs_winner"] == pytest.approx(86.8 / 92.7 - 1, abs=1e-4)  # -6.4 %
    assert first["results"]["production"]["accept_length"] == 2.31
    assert first["results"]["baseline"]["accept_length"] is None
    assert summary["wins"] == {"production": 5, "baseline": 3}
    assert summary["failures"] == []
    assert summary["workload"]["random_input_len"] == 1024
    assert summary["server_versions"] == ["0.5.9"]
    json.dumps(summary, allow_nan=False)


def test_failed_runs_are_listed_and_excluded_from_winners(bench):
    runs = [
        {"configuration": "production", "concurrency": 1, "rc": 0, "num_prompts": 4, "jsonl": _line(1, 86.8, 2.3)},
        {"configuration": "baseline", "concurrency": 1, "rc": 124, "error": "", "jsonl": None},
        {"configuration": "production", "concurrency": 2, "rc": 1, "error": "ValueError: Warmup failed", "jsonl": None},
        {"configuration": "baseline", "concurrency": 2, "rc": 0, "num_prompts": 8, "jsonl": None},
        {"configuration": "production", "concurrency": 4, "rc": 0, "num_prompts": 16, "jsonl": _line(4, 300.0, 2.3, completed=12)},
        {"configuration": "baseline", "concurrency": 4, "rc": 0, "num_prompts": 16, "jsonl": _line(4, 250.0, None)},
    ]
    summary = bench.summarize(runs)
    messages = [f["message"] for f in summary["failures"]]
    assert messages == [
        "baseline at concurrency 1: bench_serving timed out (timeout killed it)",
        "production at concurrency 2: bench_serving exited 1: ValueError: Warmup failed",
        "baseline at concurrency 2: no result file",
        "production at concurrency 4: only 12 of 16 requests completed",
    ]
    rows = {row["concurrency"]: row for row in summary["rows"]}
    assert rows[1]["winner"] == "production" and rows[1]["results"]["baseline"] is None
    assert rows[2]["winner"] is None
    assert rows[4]["winner"] == "baseline" and rows[4]["production_vs_winner"] is None


def test_a_tie_goes_to_production(bench):
    runs = [
        {"configuration": "production", "concurrency": 1, "rc": 0, "jsonl": _line(1, 90.0, 2.0)},
        {"configuration": "alt", "concurrency": 1, "rc": 0, "jsonl": _line(1, 90.0, 2.0)},
    ]
    summary = bench.summarize(runs, configurations=["alt", "production"])
    assert summary["rows"][0]["winner"] == "production"


def test_a_result_for_another_concurrency_is_not_trusted(bench):
    summary = bench.summarize([{"configuration": "production", "concurrency": 2, "rc": 0, "jsonl": _line(4, 1.0, None)}])
    assert summary["failures"][0]["message"].endswith("the result line says max_concurrency 4")


def test_latency_metric_picks_the_lowest(bench):
    runs = [
        {"configuration": "production", "concurrency": 1, "rc": 0, "jsonl": _line(1, 80.0, 2.0)},
        {"configuration": "baseline", "concurrency": 1, "rc": 0, "jsonl": _line(1, 90.0, None)},
    ]
    summary = bench.summarize(runs, metric="median_itl_ms")
    assert summary["rows"][0]["winner"] == "baseline"  # 1000/90 ms < 1000/80 ms


def test_bad_input_is_refused(bench):
    with pytest.raises(bench.BenchSummaryError, match="concurrency must be a positive integer"):
        bench.summarize([{"configuration": "production", "concurrency": 0}])
    with pytest.raises(bench.BenchSummaryError, match="metric"):
        bench.summarize([], metric="speed")
    with pytest.raises(bench.BenchSummaryError, match="listed twice"):
        bench.summarize([], configurations=["a", "a"])


def test_markdown_shows_configurations_side_by_side_with_winners(bench):
    summary = bench.summarize(_seed_runs(), production="production")
    text = bench.summary_markdown(summary)
    lines = text.splitlines()
    assert "| Concurrency | production | baseline | Winner | Production vs winner |" in lines
    assert "| 1 | 86.8 | **92.7** | baseline | -6.4% |" in lines
    assert "| 128 | **5920.8** | 5480.1 | production | best |" in lines
    assert "Levels won: production 5, baseline 3." in lines
    assert "Accept length:" in lines
    assert "| 1 | 2.31 | - |" in lines
    assert "Median TTFT (ms):" in lines and "Median ITL (ms):" in lines


def test_markdown_marks_a_production_configuration_with_another_name(bench):
    runs = [{"configuration": "topk1-v2", "concurrency": 1, "rc": 0, "jsonl": _line(1, 86.8, 2.3)}]
    assert "| Concurrency | topk1-v2 (production) | Winner | Production vs winner |" in \
        bench.summary_markdown(bench.summarize(runs, production="topk1-v2")).splitlines()


def test_markdown_lists_failures(bench):
    summary = bench.summarize([{"configuration": "production", "concurrency": 1, "rc": 124, "jsonl": None}])
    assert "- production at concurrency 1: bench_serving timed out (timeout killed it)" in bench.summary_markdown(summary)


def test_summary_round_trips_through_load(bench):
    summary = bench.summarize(_seed_runs())
    assert bench.bench_summary_load(json.dumps(summary)) == summary
    assert "error" in bench.bench_summary_load("{")
    assert "error" in bench.bench_summary_load('{"schema": 99, "rows": []}')


# --------------------------------------------------------------------------- the client double's model

def _double_throughput(bench_double, kind, level):
    return bench_double.metrics(level, kind, None, 1024, 512, 16)["output_throughput"]


def test_the_double_tells_the_seeds_configurations_apart(bench_double):
    def info(algorithm, topk, spec_v2):
        return {"server_args": {"speculative_algorithm": algorithm, "speculative_eagle_topk": topk}, "spec_v2": spec_v2}

    assert bench_double.configuration(info(None, None, False)) == "baseline"
    assert bench_double.configuration(info("EAGLE3", 1, True)) == "topk1-spec-v2"
    assert bench_double.configuration(info("EAGLE3", 1, False)) == "topk1-spec-v1"
    assert bench_double.configuration(info("EAGLE3", 4, False)) == "topk4-spec-v1"


def test_the_doubles_production_and_baseline_follow_the_seed(bench_double):
    assert _double_throughput(bench_double, "topk1-spec-v2", 1) == pytest.approx(86.8)
    assert _double_throughput(bench_double, "baseline", 1) == pytest.approx(92.7)
    levels = [1, 2, 4, 8, 16, 24, 28, 31, 32, 64, 128, 256]
    ahead = [level for level in levels if _double_throughput(bench_double, "topk1-spec-v2", level) >= _double_throughput(bench_double, "baseline", level)]
    assert ahead == [31, 32, 64, 128, 256]  # matched or beat the baseline above C=30, behind below


def test_the_default_sweep_has_eight_levels_around_the_seeds_crossover(bench, bench_double):
    import yaml

    defaults = yaml.safe_load((REPO / "roles" / "sglang_benchmark" / "defaults" / "main.yml").read_text())
    levels = defaults["sglang_benchmark_concurrency_levels"]
    assert len(levels) == 8 and levels == sorted(set(levels)) and levels[0] == 1
    below = max(level for level in levels if level < 30)
    above = min(level for level in levels if level > 30)
    assert 30 - below <= 6 and above - 30 <= 2, levels
    # with the double's model of the seed, the winner changes between those two levels
    runs = [{"configuration": name, "concurrency": level, "rc": 0, "num_prompts": 16,
             "jsonl": json.dumps(dict(json.loads(_fixture("eagle3-topk1-c4.jsonl").splitlines()[-1]), max_concurrency=level,
                                      **bench_double.metrics(level, kind, None, 1024, 512, 16)))}
            for level in (below, above) for name, kind in (("production", "topk1-spec-v2"), ("baseline", "baseline"))]
    summary = bench.summarize(runs, levels=[below, above])
    assert [row["winner"] for row in summary["rows"]] == ["baseline", "production"]
