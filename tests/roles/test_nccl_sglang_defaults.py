"""The SGLang 0.5.9 defaults that filter_plugins/nccl_message_sizes.py applies are the wheel's own.

Read from sglang/srt/server_args.py inside the wheelhouse's sglang-0.5.9 wheel (the one the test
nodes install): the chunked_prefill_size chosen by GPU memory in _handle_gpu_memory_settings, the
fallback when the memory is unknown, max_running_requests with speculative decoding, and
max_prefill_tokens. A new SGLang release that changes them fails here.
"""

import ast
import re
import zipfile

import pytest
from parser_venv import SGLANG_WHEEL


@pytest.fixture(scope="module")
def ms(project_module):
    return project_module("filter_plugins/nccl_message_sizes.py")


def server_args_source():
    assert SGLANG_WHEEL.is_file(), f"{SGLANG_WHEEL} is missing: scripts/setup (or scripts/build-wheelhouse) makes it"
    with zipfile.ZipFile(SGLANG_WHEEL) as wheel:
        return wheel.read("sglang/srt/server_args.py").decode()


def method_source(source, name):
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return ast.get_source_segment(source, node)
    raise AssertionError(f"{name} not found in server_args.py")


def test_chunk_by_gpu_memory_is_the_wheels_table(ms):
    body = method_source(server_args_source(), "_handle_gpu_memory_settings")
    memory_branch, fallback = body.split("Fallback defaults when gpu_mem is None")
    # each "gpu_mem < N * 1024" branch, then the first chunked_prefill_size it sets
    bounds = re.findall(r"gpu_mem < (\d+) \* 1024:.*?self\.chunked_prefill_size = (\d+)", memory_branch, re.S)
    table = tuple((int(n) * 1024, int(chunk)) for n, chunk in bounds)
    assert table == ms.SGLANG_CHUNK_BY_GPU_MEMORY
    # one more assignment follows the last bound: the "else" of GPUs above it
    chunks = [int(c) for c in re.findall(r"self\.chunked_prefill_size = (\d+)", memory_branch)]
    assert len(chunks) == len(table) + 1 and chunks[-1] == ms.SGLANG_CHUNK_ABOVE
    assert int(re.search(r"self\.chunked_prefill_size = (\d+)", fallback).group(1)) == ms.SGLANG_CHUNK_MEMORY_UNKNOWN


def test_speculative_requests_and_max_prefill_tokens_are_the_wheels(ms):
    source = server_args_source()
    assert re.search(r"\n    chunked_prefill_size: Optional\[int\] = None\n", source)  # unset unless given
    assert int(re.search(r"\n    max_prefill_tokens: int = (\d+)\n", source).group(1)) == ms.SGLANG_MAX_PREFILL_TOKENS
    speculative = method_source(source, "_handle_speculative_decoding")
    eagle = speculative.split('if self.speculative_algorithm in ("EAGLE", "EAGLE3", "STANDALONE"):', 1)[1]
    reset = re.search(r"if self\.max_running_requests is None:\s+self\.max_running_requests = (\d+)", eagle)
    assert int(reset.group(1)) == ms.SGLANG_SPECULATIVE_MAX_RUNNING_REQUESTS
