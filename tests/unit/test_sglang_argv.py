"""The one place sglang_server_args become argv, and its systemd quoting."""

import shlex

import pytest
from ansible.errors import AnsibleFilterError


@pytest.fixture(scope="module")
def sglang_argv(project_module):
    return project_module("filter_plugins/sglang_argv.py").sglang_argv


@pytest.fixture(scope="module")
def systemd_exec_line(project_module):
    return project_module("filter_plugins/sglang_argv.py").systemd_exec_line


def test_canonical_mapping_renders_flags_in_order(sglang_argv):
    argv = sglang_argv({
        "model_path": "/m", "speculative_algorithm": "EAGLE3", "speculative_eagle_topk": 1,
        "tp_size": 8, "mem_fraction_static": 0.88, "host": "127.0.0.1", "port": 30000,
    })
    assert argv == ["--model-path", "/m", "--speculative-algorithm", "EAGLE3", "--speculative-eagle-topk", "1",
                    "--tp-size", "8", "--mem-fraction-static", "0.88", "--host", "127.0.0.1", "--port", "30000"]


def test_true_is_a_bare_flag_and_false_or_null_omit_it(sglang_argv):
    argv = sglang_argv({"enable_metrics": True, "disable_cuda_graph": False, "chunked_prefill_size": None})
    assert argv == ["--enable-metrics"]


def test_a_list_renders_the_flag_then_each_item(sglang_argv):
    assert sglang_argv({"cuda_graph_bs": [1, 2, 4]}) == ["--cuda-graph-bs", "1", "2", "4"]


@pytest.mark.parametrize("bad", [{"Model-Path": "/m"}, {"--tp-size": 8}, {"tp size": 8}, {1: 2}])
def test_a_key_that_is_not_a_field_name_is_refused_naming_it(bad, sglang_argv):
    with pytest.raises(AnsibleFilterError, match="not a ServerArgs field name"):
        sglang_argv(bad)


def test_a_nested_mapping_is_refused(sglang_argv):
    with pytest.raises(AnsibleFilterError, match="sglang_server_args.json_model_override_args"):
        sglang_argv({"json_model_override_args": {"a": 1}})


def test_not_a_mapping_is_refused(sglang_argv):
    with pytest.raises(AnsibleFilterError, match="must be a mapping"):
        sglang_argv(["--tp-size", "8"])


def test_systemd_exec_line_escapes_specifiers_variables_and_spaces(systemd_exec_line):
    line = systemd_exec_line(["/opt/python", "--served-model-name", "my model", "--x", "50%", "$HOME", 'a"b'])
    assert line == '/opt/python --served-model-name "my model" --x 50%% $$HOME "a\\"b"'


def test_systemd_exec_line_round_trips_plain_arguments(systemd_exec_line):
    argv = ["/opt/sglang/venv/bin/python", "-m", "sglang.launch_server", "--tp-size", "8"]
    assert shlex.split(systemd_exec_line(argv)) == argv
