"""The sglang_benchmark role's plan filters (roles/sglang_benchmark/filter_plugins/benchmark_plan.py):
the production environment read back from the unit's EnvironmentFile, and alternatives as
production with overrides."""


import pytest
from project_modules import REPO


@pytest.fixture(scope="module")
def plan(project_module):
    return project_module("roles/sglang_benchmark/filter_plugins/benchmark_plan.py")


def test_env_file_parse_reads_what_sglang_service_writes(plan):
    # sglang.env.j2 writes NAME="value" with \ and " escaped, after a comment header.
    text = '# Ansible managed\n# Environment of sglang.service\nA="1"\nB="say \\"hi\\""\nC="back\\\\slash"\n'
    assert plan.sglang_env_file_parse(text) == {"A": "1", "B": 'say "hi"', "C": "back\\slash"}


def test_env_file_parse_refuses_other_shapes(plan):
    from ansible.errors import AnsibleFilterError

    with pytest.raises(AnsibleFilterError, match="line 1"):
        plan.sglang_env_file_parse("export A=1\n")


def test_combine_overrides_null_removes(plan):
    base = {"speculative_algorithm": "EAGLE3", "tp_size": 8, "mem_fraction_static": 0.88}
    merged = plan.combine_overrides(base, {"speculative_algorithm": None, "mem_fraction_static": None, "tp_size": 4})
    assert merged == {"tp_size": 4}
    assert base["speculative_algorithm"] == "EAGLE3"  # not modified
    assert plan.combine_overrides(base, None) == base


def test_combine_overrides_refuses_what_is_not_a_mapping(plan):
    from ansible.errors import AnsibleFilterError

    with pytest.raises(AnsibleFilterError, match="mappings"):
        plan.combine_overrides({"a": 1}, ["a"])


def test_the_summary_filters_no_longer_carry_the_plan_helpers(plan, project_module):
    summary = project_module("filter_plugins/bench_summary.py")
    assert set(summary.FilterModule().filters()).isdisjoint(plan.FilterModule().filters())


def _canonical(name):
    """A variable of roles/sglang/defaults/main.yml with its {{ sglang_* }} references filled in."""
    import jinja2
    import jinja2.nativetypes
    import yaml

    data = yaml.safe_load((REPO / "roles" / "sglang" / "defaults" / "main.yml").read_text())

    def render(value):
        if isinstance(value, str) and "{{" in value:
            # native types, as Ansible renders "{{ sglang_worker_port }}": an integer stays one
            return render(jinja2.nativetypes.NativeEnvironment().from_string(value).render(data))
        if isinstance(value, dict):
            return {k: render(v) for k, v in value.items()}
        return value

    return render(data[name])


def _presets():
    import yaml

    defaults = yaml.safe_load((REPO / "roles" / "sglang_benchmark" / "defaults" / "main.yml").read_text())
    return defaults["sglang_benchmark_presets"]


def _apply(plan, preset):
    import jinja2

    args = _canonical("sglang_server_args")
    overrides = {k: jinja2.Environment().from_string(v).render(sglang_draft_model_path=_canonical("sglang_draft_model_path"))
                 if isinstance(v, str) else v for k, v in preset["server_args_overrides"].items()}
    env = plan.combine_overrides(_canonical("sglang_service_environment"), preset["environment_overrides"])
    return plan.combine_overrides(args, overrides), env


def test_the_presets_are_the_configurations_the_seed_compared(plan):
    presets = _presets()
    assert sorted(presets) == ["baseline", "topk1-spec-v1", "topk1-spec-v2", "topk4-spec-v1"]
    production_args, production_env = _canonical("sglang_server_args"), _canonical("sglang_service_environment")
    assert production_env["SGLANG_ENABLE_SPEC_V2"] == "1"

    args, env = _apply(plan, presets["topk1-spec-v2"])  # the seed's production = the canonical node
    assert args == production_args and env == production_env

    args, env = _apply(plan, presets["topk1-spec-v1"])  # the same chain on the v1 scheduler
    assert args == production_args and "SGLANG_ENABLE_SPEC_V2" not in env

    args, env = _apply(plan, presets["topk4-spec-v1"])  # the tree: topk 4, 16 draft tokens, v1 scheduler
    assert (args["speculative_eagle_topk"], args["speculative_num_draft_tokens"]) == (4, 16)
    assert args["speculative_algorithm"] == "EAGLE3" and "SGLANG_ENABLE_SPEC_V2" not in env

    args, env = _apply(plan, presets["baseline"])  # no speculation, SGLang's own memory fraction
    assert not any(name.startswith("speculative_") for name in args)
    assert "mem_fraction_static" not in args and "SGLANG_ENABLE_SPEC_V2" not in env
    assert args["model_path"] == production_args["model_path"] and args["tp_size"] == production_args["tp_size"]
