"""module_utils/sglang_args_variables.py: the inventory variable behind each problem
sglang_server_args_check reports, named by the module itself (not by a regex in the role)."""

import pytest

VARIABLES = {
    "sglang_server_args": ["model_path", "tp_size", "base_gpu_id", "mem_fraction_static", "port",
                           "speculative_eagle_topk"],
    "sglang_service_environment": ["SGLANG_ENABLE_SPEC_V2"],
}
EFFECTIVE_ENVIRONMENT = ["SGLANG_ENABLE_SPEC_V2", "NCCL_PROTO", "SGLANG_SPEC_DISABLE_AT_RUNNING_REQUESTS"]


@pytest.fixture(scope="module")
def named(project_module):
    return project_module("module_utils/sglang_args_variables.py")


@pytest.mark.parametrize("flag, variables", [
    # argparse's spelling: every option string of the field, the alias included
    ("--tensor-parallel-size/--tp-size", ["sglang_server_args.tp_size"]),
    ("--tp-size eight", ["sglang_server_args.tp_size"]),
    ("--mem-fraction-static", ["sglang_server_args.mem_fraction_static"]),
    ("--port=0", ["sglang_server_args.port"]),
    # the GPU-count check names every parallel flag given
    ("--tp-size, --base-gpu-id", ["sglang_server_args.tp_size", "sglang_server_args.base_gpu_id"]),
    # a post-init rule that involves a flag and the environment
    ("--speculative-eagle-topk, SGLANG_ENABLE_SPEC_V2=1",
     ["sglang_server_args.speculative_eagle_topk", "sglang_service_environment.SGLANG_ENABLE_SPEC_V2"]),
    ("SGLANG_ENABLE_SPEC_V2=on", ["sglang_service_environment.SGLANG_ENABLE_SPEC_V2"]),
    # set by another role (nccl_tuning, sglang_patches): named by itself
    ("NCCL_PROTO=LX", ["NCCL_PROTO"]),
    # a prefix is not a match: --port-x is not --port, --tp is not --tp-size
    ("--port-x 1", []),
    ("--tp 8", []),
    ("--foo 1", []),
    (None, []),
    ("", []),
])
def test_variables_for_each_flag(named, flag, variables):
    assert named.variables_for(flag, VARIABLES, EFFECTIVE_ENVIRONMENT) == variables


def test_each_error_gets_its_variables_and_all_are_listed_once(named):
    errors = [
        {"stage": "parse", "flag": "--tp-size eight", "message": "invalid int value"},
        {"stage": "gpu_count", "flag": "--tp-size, --base-gpu-id", "message": "needs 9 GPUs"},
        {"stage": "import", "flag": None, "message": "No module named 'sglang'"},
    ]
    with_names, everything = named.name_variables(errors, VARIABLES, EFFECTIVE_ENVIRONMENT)
    assert [e["variables"] for e in with_names] == [
        ["sglang_server_args.tp_size"], ["sglang_server_args.tp_size", "sglang_server_args.base_gpu_id"], []]
    assert with_names[0]["message"] == "invalid int value"  # the rest of each error is kept
    assert everything == ["sglang_server_args.tp_size", "sglang_server_args.base_gpu_id"]
