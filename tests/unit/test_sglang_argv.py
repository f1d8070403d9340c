"""The one place sglang_server_args become argv, and its systemd quoting."""

import importlib.util
import shlex
from pathlib import Path

import pytest
from ansible.errors import AnsibleFilterError

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("sglang_argv", REPO / "filter_plugins" / "sglang_argv.py")
sglang_argv_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sglang_argv_module)
sglang_argv = sglang_argv_module.sglang_argv
systemd_exec_line = sglang_argv_module.systemd_exec_line


def test_canonical_mapping_renders_flags_in_order():
    argv = sglang_argv({
        "model_path": "/m", "speculative_algorithm": "EAGLE3", "speculative_eagle_topk": 1,
        "tp_size": 8, "mem_fraction_static": 0.88, "host": "127.0.0.1", "port": 30000,
    })
    assert argv == ["--model-path", "/m", "--speculative-algorithm", "EAGLE3", "--speculative-eagle-topk", "1",
                    "--tp-size", "8", "--mem-fraction-static", "0.88", "--host", "127.0.0.1", "--port", "30000"]


def test_true_is_a_bare_flag_and_false_or_null_omit_it():
    argv = sglang_argv({"enable_metrics": True, "disable_cuda_graph": False, "chunked_prefill_size": None})
    assert argv == ["--enable-metrics"]


def test_a_list_renders_the_flag_then_each_item():
    assert sglang_argv({"cuda_graph_bs": [1, 2, 4]}) == ["--cuda-graph-bs", "1", "2", "4"]


@pytest.mark.parametrize("bad", [{"Model-Path": "/m"}, {"--tp-size": 8}, {"tp size": 8}, {1: 2}])
def test_a_key_that_is_not_a_field_name_is_refused_naming_it(bad):
    with pytest.raises(AnsibleFilterError, match="not a ServerArgs field name"):
        sglang_argv(bad)


def test_a_nested_mapping_is_refused():
    with pytest.raises(AnsibleFilterError, match="sglang_server_args.json_model_override_args"):
        sglang_argv({"json_model_override_args": {"a": 1}})


def test_not_a_mapping_is_refused():
    with pytest.raises(AnsibleFilterError, match="must be a mapping"):
        sglang_argv(["--tp-size", "8"])


def test_systemd_exec_line_escapes_specifiers_variables_and_spaces():
    line = systemd_exec_line(["/opt/python", "--served-model-name", "my model", "--x", "50%", "$HOME", 'a"b'])
    assert line == '/opt/python --served-model-name "my model" --x 50%% $$HOME "a\\"b"'


def test_systemd_exec_line_round_trips_plain_arguments():
    argv = ["/opt/sglang/venv/bin/python", "-m", "sglang.launch_server", "--tp-size", "8"]
    assert shlex.split(systemd_exec_line(argv)) == argv
