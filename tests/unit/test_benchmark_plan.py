"""The sglang_benchmark role's plan filters (roles/sglang_benchmark/filter_plugins/benchmark_plan.py):
the production environment read back from the unit's EnvironmentFile, and alternatives as
production with overrides."""

import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location(
    "benchmark_plan", REPO / "roles" / "sglang_benchmark" / "filter_plugins" / "benchmark_plan.py")
plan = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(plan)


def test_env_file_parse_reads_what_sglang_service_writes():
    # sglang.env.j2 writes NAME="value" with \ and " escaped, after a comment header.
    text = '# Ansible managed\n# Environment of sglang.service\nA="1"\nB="say \\"hi\\""\nC="back\\\\slash"\n'
    assert plan.sglang_env_file_parse(text) == {"A": "1", "B": 'say "hi"', "C": "back\\slash"}


def test_env_file_parse_refuses_other_shapes():
    from ansible.errors import AnsibleFilterError

    with pytest.raises(AnsibleFilterError, match="line 1"):
        plan.sglang_env_file_parse("export A=1\n")


def test_combine_overrides_null_removes():
    base = {"speculative_algorithm": "EAGLE3", "tp_size": 8, "mem_fraction_static": 0.88}
    merged = plan.combine_overrides(base, {"speculative_algorithm": None, "mem_fraction_static": None, "tp_size": 4})
    assert merged == {"tp_size": 4}
    assert base["speculative_algorithm"] == "EAGLE3"  # not modified
    assert plan.combine_overrides(base, None) == base


def test_combine_overrides_refuses_what_is_not_a_mapping():
    from ansible.errors import AnsibleFilterError

    with pytest.raises(AnsibleFilterError, match="mappings"):
        plan.combine_overrides({"a": 1}, ["a"])


def test_the_summary_filters_no_longer_carry_the_plan_helpers():
    spec = importlib.util.spec_from_file_location("bench_summary", REPO / "filter_plugins" / "bench_summary.py")
    summary = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(summary)
    assert set(summary.FilterModule().filters()).isdisjoint(plan.FilterModule().filters())
