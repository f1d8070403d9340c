"""filter_plugins/nccl_message_sizes.py: the all-reduce sizes an SGLang 0.5.9 server sends, from the
model's hidden size and the server arguments, with SGLang's own defaults where they are unset.
(That those defaults are the wheel's own is checked in tests/roles/test_nccl_sglang_defaults.py.)"""

import json

import pytest
import yaml
from project_modules import REPO


@pytest.fixture(scope="module")
def ms(project_module):
    return project_module("filter_plugins/nccl_message_sizes.py")


KiB, MiB = 1 << 10, 1 << 20
# The canonical server arguments (roles/sglang/defaults/main.yml): EAGLE3, 4 draft tokens, no
# max_running_requests and no chunked_prefill_size.
CANONICAL_ARGS = yaml.safe_load((REPO / "roles" / "sglang" / "defaults" / "main.yml").read_text())["sglang_server_args"]
RTX_PRO_6000_MIB = 97887  # memory.total of the canonical node's GPUs (tests/double/captures/rtx-pro-6000-8x)
H200_MIB = 143771  # tests/fixtures/gpu-runs/*/gpu_topology.json


def test_canonical_node_sizes_follow_eagle_and_the_gpu_memory(ms):
    plan = ms.message_plan(CANONICAL_ARGS, 5120, RTX_PRO_6000_MIB)
    # decode: 48 requests (SGLang's default with EAGLE3) x 4 draft tokens verified per request
    assert plan["max_running_requests"] == 48 and plan["tokens_per_request"] == 4
    assert plan["decode_tokens"] == [1, 2, 4, 8, 16, 32, 64, 128, 192]
    assert plan["decode"] == [t * 5120 * 2 for t in plan["decode_tokens"]]
    assert plan["decode"][-1] == 192 * 10 * KiB  # 1.9 MiB
    # prefill: SGLang 0.5.9 picks an 8192-token chunk for 96 GB GPUs; 80 MiB per all-reduce
    assert plan["chunked_prefill_size"] == 8192
    assert plan["prefill_tokens"] == [1024, 2048, 4096, 8192]
    assert plan["prefill"] == [10 * MiB, 20 * MiB, 40 * MiB, 80 * MiB]
    assert "SGLang 0.5.9's default for 97887 MiB GPUs" in plan["summary"]
    assert "48 requests (SGLang's default with EAGLE3) x 4 draft tokens" in plan["summary"]
    assert plan["summary"].startswith("decode 10 KiB .. 1.9 MiB (9 sizes)")
    assert "prefill 10 MiB .. 80 MiB (4 sizes)" in plan["summary"]


@pytest.mark.parametrize(
    "memory_mib, chunk",
    [(None, 4096), (16 * 1024, 2048), (24 * 1024, 2048), (40 * 1024, 4096), (81559, 8192), (H200_MIB, 8192),
     (160 * 1024, 16384), (183359, 16384)],
)
def test_default_chunk_follows_sglangs_gpu_memory_table(ms, memory_mib, chunk):
    assert ms.sglang_default_chunked_prefill_size(memory_mib) == chunk
    plan = ms.message_plan({}, 4096, memory_mib)
    assert plan["chunked_prefill_size"] == chunk and plan["prefill"][-1] == chunk * 4096 * 2


def test_server_args_win_over_sglangs_defaults(ms):
    args = dict(CANONICAL_ARGS, max_running_requests=16, chunked_prefill_size=2048)
    plan = ms.message_plan(args, 8192, H200_MIB)
    assert plan["decode_tokens"][-1] == 64 and plan["max_running_requests_from"].endswith(".max_running_requests")
    assert plan["prefill_tokens"] == [256, 512, 1024, 2048]
    assert plan["chunked_prefill_size_from"] == "nccl_measure_server_args.chunked_prefill_size"


def test_chunked_prefill_off_prefills_up_to_max_prefill_tokens(ms):
    plan = ms.message_plan({"chunked_prefill_size": -1}, 1024, H200_MIB)
    assert plan["chunked_prefill_size"] == 16384 and "chunked prefill off" in plan["summary"]
    plan = ms.message_plan({"chunked_prefill_size": -1, "max_prefill_tokens": 4000}, 1024)
    assert plan["prefill_tokens"] == [500, 1000, 2000, 4000]


def test_without_speculation_one_token_per_request_and_no_known_limit(ms):
    plan = ms.message_plan({"tp_size": 8}, 8192)
    assert plan["tokens_per_request"] == 1 and plan["decode_tokens"][-1] == 256
    assert plan["decode"][0] == 16 * KiB and plan["decode"][-1] == 4 * MiB  # the probe's earlier decode range
    assert "SGLang sizes it from the KV cache" in plan["summary"]


def test_eagle_without_draft_tokens_verifies_num_steps_plus_one(ms):
    plan = ms.message_plan({"speculative_algorithm": "EAGLE", "speculative_num_steps": 5}, 1024)
    assert plan["tokens_per_request"] == 6 and plan["decode_tokens"][-1] == 48 * 6


def test_explicit_sizes_replace_a_phase(ms):
    plan = ms.message_plan(CANONICAL_ARGS, 5120, None, [16384, 4096], [])
    assert plan["decode"] == [4096, 16384] and plan["decode_from"] == "nccl_measure_decode_sizes"
    assert plan["prefill_from"] == "derived" and "decode 4 KiB .. 16 KiB (2 sizes): nccl_measure_decode_sizes" in plan[
        "summary"
    ]
    with pytest.raises(ms.PlanError, match="nccl_measure_prefill_sizes: .*even"):
        ms.message_plan(CANONICAL_ARGS, 5120, None, [], [3])


@pytest.mark.parametrize(
    "config, hidden",
    [
        ({"hidden_size": 5120}, 5120),
        ('{"hidden_size": 8192, "model_type": "llama"}', 8192),
        ({"model_type": "llava", "text_config": {"hidden_size": 4096}}, 4096),  # multimodal: nested
        ({"llm_config": {"hidden_size": 3584}}, 3584),
    ],
)
def test_hidden_size_from_config_json(ms, config, hidden):
    assert ms.model_hidden_size(config) == hidden


def test_testnode_model_config_is_read(ms):
    text = (REPO / "tests" / "fixtures" / "testnode-model" / "target" / "config.json").read_text()
    assert ms.model_hidden_size(text) == json.loads(text)["hidden_size"] == 64


@pytest.mark.parametrize(
    "config, needle",
    [
        ("not json", "nccl_measure_model_config is not JSON"),
        ([1, 2], "expected a JSON object"),
        ({"hidden_size": 0}, "set nccl_measure_hidden_size"),
        ({"hidden_size": True}, "set nccl_measure_hidden_size"),
        ({"vocab_size": 1024}, "set nccl_measure_hidden_size"),
    ],
)
def test_bad_config_names_the_variables(ms, config, needle):
    with pytest.raises(ms.PlanError, match=needle):
        ms.model_hidden_size(config)


@pytest.mark.parametrize(
    "args, hidden, needle",
    [
        ({}, 0, "nccl_measure_hidden_size: expected a positive integer"),
        ({}, "5120", "nccl_measure_hidden_size: expected a positive integer"),
        ({"max_running_requests": "many"}, 64, "nccl_measure_server_args.max_running_requests: expected an integer"),
        ({"max_running_requests": 0}, 64, "max_running_requests: expected a positive integer"),
        (["--tp", "8"], 64, "nccl_measure_server_args: expected a mapping"),
    ],
)
def test_bad_input_names_the_variable(ms, args, hidden, needle):
    with pytest.raises(ms.PlanError, match=needle):
        ms.message_plan(args, hidden)


def test_filters_raise_ansible_errors_naming_the_role(ms):
    filters = ms.FilterModule().filters()
    from ansible.errors import AnsibleFilterError

    with pytest.raises(AnsibleFilterError, match="nccl_measure: nccl_measure_hidden_size"):
        filters["nccl_message_plan"]({}, None)
    assert filters["nccl_model_hidden_size"]({"hidden_size": 7168}) == 7168
