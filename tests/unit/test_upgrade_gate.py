"""The upgrade gate's rule (roles/sglang_upgrade/filter_plugins/sglang_upgrade_gate.py), on summaries
shaped as the sglang_benchmark role writes them (filter bench_summary)."""

from __future__ import annotations

import pytest

GATE = "roles/sglang_upgrade/filter_plugins/sglang_upgrade_gate.py"


def _summary(throughput, ttft=100.0, itl=20.0, level=4, failures=()):
    return {"rows": [{"concurrency": level, "results": {"production": {
                "output_throughput": throughput, "p99_ttft_ms": ttft, "p99_itl_ms": itl}}}],
            "failures": [{"configuration": "production", "concurrency": level, "message": m} for m in failures]}


@pytest.fixture(name="gate")
def _gate(project_module):
    return project_module(GATE).gate


def test_a_canary_as_fast_as_the_control_within_noise_passes(gate):
    verdict = gate({"canary": [_summary(98), _summary(101)], "control": [_summary(96), _summary(104)]}, [4])
    assert verdict["passed"], verdict["reasons"]
    figures = verdict["levels"][0]["metrics"]["output_throughput"]
    assert figures["noise"] == pytest.approx(8 / 100)  # the control's spread, the larger one
    assert figures["canary"] == pytest.approx(99.5) and figures["control"] == pytest.approx(100)


def test_a_slower_canary_beyond_noise_fails_naming_the_level_and_metric(gate):
    verdict = gate({"canary": [_summary(50, itl=45), _summary(51, itl=46)],
                    "control": [_summary(100), _summary(101)]}, [4])
    assert not verdict["passed"]
    assert any(r.startswith("concurrency 4: output_throughput 50.500 on the canary is below") for r in verdict["reasons"])
    assert any("p99_itl_ms" in r and "above" in r for r in verdict["reasons"])


def test_a_failed_request_on_the_canary_fails_the_gate(gate):
    verdict = gate({"canary": [_summary(100), _summary(100, failures=["production at concurrency 4: only 11 of 12 requests completed"])],
                    "control": [_summary(100), _summary(100)]}, [4])
    assert not verdict["passed"]
    assert "requests failed on the canary" in verdict["reasons"][0]


def test_a_level_a_node_did_not_measure_fails_the_gate(gate):
    verdict = gate({"canary": [_summary(100), _summary(100)], "control": [_summary(100), _summary(100)]}, [4, 16])
    assert verdict["reasons"] == ["concurrency 16: not measured on the canary and the control"]


def test_noise_is_measured_not_assumed_so_one_run_per_node_is_refused(gate, project_module):
    with pytest.raises(project_module(GATE).GateError, match="at least 2 repeated runs"):
        gate({"canary": [_summary(100)], "control": [_summary(100), _summary(100)]}, [4])
