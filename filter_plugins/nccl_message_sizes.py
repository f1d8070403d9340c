"""The all-reduce message sizes an SGLang 0.5.9 server sends, for roles/nccl_measure (pure, no I/O).

Filters:
  nccl_model_hidden_size(config)         -> the hidden size in a model's config.json (dict or JSON text)
  nccl_message_plan(server_args, hidden_size, gpu_memory_mib=None, decode_sizes=(), prefill_sizes=())
                                         -> {decode, prefill, hidden_size, ..., summary}

A tensor-parallel layer all-reduces one bf16 activation row per token in the batch, so a message is
tokens x hidden size x 2 bytes:
  decode  : every running request's tokens of one step. With EAGLE the target model verifies
            speculative_num_draft_tokens tokens per request, so a step carries up to
            max_running_requests x num_draft_tokens tokens; measured at 1, 2, 4, ... tokens up to that.
  prefill : one chunk of chunked_prefill_size tokens, and the shorter prefills (a prompt's last
            chunk, short prompts) down to an eighth of a chunk.
SGLang 0.5.9's own defaults are applied where the server arguments leave a value unset, as its
server_args.py does: max_running_requests becomes 48 with speculative decoding; chunked_prefill_size
follows the GPU memory (_handle_gpu_memory_settings); chunked prefill off (-1) prefills up to
max_prefill_tokens (16384) at once.
"""

from __future__ import annotations

import json

DTYPE_BYTES = 2  # bf16 activations

# SGLang 0.5.9 server_args.py, ServerArgs._handle_gpu_memory_settings: chunked_prefill_size when
# unset, by the smallest GPU's memory.total in MiB (nvidia-smi, as get_nvgpu_memory_capacity reads it).
# (upper bound exclusive in MiB, chunk); above the last bound 16384; memory unknown: 4096.
SGLANG_CHUNK_BY_GPU_MEMORY = (
    (20 * 1024, 2048),  # T4, 4080
    (35 * 1024, 2048),  # A10, 4090, 5090
    (60 * 1024, 4096),  # A100 40GB, L40
    (90 * 1024, 8192),  # H100, A100 80GB
    (160 * 1024, 8192),  # H20, H200, RTX PRO 6000 (96 GB)
)
SGLANG_CHUNK_ABOVE = 16384  # B200, MI300
SGLANG_CHUNK_MEMORY_UNKNOWN = 4096
SGLANG_SPECULATIVE_MAX_RUNNING_REQUESTS = 48  # server_args.py: "reset to 48 for speculative decoding"
SGLANG_MAX_PREFILL_TOKENS = 16384  # ServerArgs.max_prefill_tokens
SPECULATIVE_ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM")
# Without speculative decoding SGLang sizes max_running_requests from the KV cache at start-up,
# which is not known before the server runs: the decode range then stops at 256 requests.
DECODE_REQUESTS_WITHOUT_LIMIT = 256
# Prefill is measured at the chunk and at 1/2, 1/4, 1/8 of it.
PREFILL_FRACTIONS = (1, 2, 4, 8)


class PlanError(ValueError):
    """Bad input, named by the inventory variable it came from."""


def sglang_default_chunked_prefill_size(gpu_memory_mib):
    """SGLang 0.5.9's chunked_prefill_size for GPUs of this much memory (MiB); None = unknown."""
    if gpu_memory_mib is None:
        return SGLANG_CHUNK_MEMORY_UNKNOWN
    for bound, chunk in SGLANG_CHUNK_BY_GPU_MEMORY:
        if gpu_memory_mib < bound:
            return chunk
    return SGLANG_CHUNK_ABOVE


def model_hidden_size(config):
    """hidden_size of a config.json, also where multimodal models nest it (text_config, llm_config)."""
    if isinstance(config, (str, bytes)):
        try:
            config = json.loads(config)
        except ValueError as exc:
            raise PlanError(f"nccl_measure_model_config is not JSON: {exc}") from None
    if not isinstance(config, dict):
        raise PlanError("nccl_measure_model_config: expected a JSON object (a model's config.json)")
    for section in (config, config.get("text_config"), config.get("llm_config"), config.get("language_config")):
        if isinstance(section, dict) and _positive_int(section.get("hidden_size")):
            return int(section["hidden_size"])
    raise PlanError(
        "nccl_measure_model_config has no positive hidden_size (top level, text_config or llm_config): "
        "set nccl_measure_hidden_size"
    )


def _positive_int(value):
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _int_arg(server_args, name, label):
    value = server_args.get(name)
    if value is None:
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        raise PlanError(f"{label}.{name}: expected an integer, got {value!r}") from None


def _powers_of_two_up_to(limit):
    tokens, step = [], 1
    while step < limit:
        tokens.append(step)
        step *= 2
    return tokens + [limit]


def _sizes(values, label):
    try:
        sizes = sorted({int(v) for v in values})
    except (TypeError, ValueError):
        raise PlanError(f"{label}: expected message sizes in bytes, got {list(values)!r}") from None
    bad = [s for s in sizes if s < 2 or s % 2]
    if bad:
        raise PlanError(f"{label}: {bad} are not whole numbers of bf16 elements (even, >= 2 bytes)")
    return sizes


def size_label(size):
    for unit, factor in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= factor:
            value = size / factor
            return f"{value:.0f} {unit}" if value == int(value) else f"{value:.1f} {unit}"
    return f"{size} B"


def message_plan(
    server_args,
    hidden_size,
    gpu_memory_mib=None,
    decode_sizes=(),
    prefill_sizes=(),
    label="nccl_measure_server_args",
):
    """Decode and prefill message sizes (bytes) and where each number came from.

    decode_sizes / prefill_sizes, when not empty, replace the derived sizes of that phase."""
    server_args = server_args or {}
    if not isinstance(server_args, dict):
        raise PlanError(f"{label}: expected a mapping of ServerArgs fields, got {type(server_args).__name__}")
    if not _positive_int(hidden_size):
        raise PlanError(f"nccl_measure_hidden_size: expected a positive integer, got {hidden_size!r}")
    algorithm = str(server_args.get("speculative_algorithm") or "").upper()
    speculative = algorithm in SPECULATIVE_ALGORITHMS

    requests = _int_arg(server_args, "max_running_requests", label)
    if requests is not None:
        requests_from = f"{label}.max_running_requests"
    elif speculative:
        requests, requests_from = SGLANG_SPECULATIVE_MAX_RUNNING_REQUESTS, f"SGLang's default with {algorithm}"
    else:
        requests = DECODE_REQUESTS_WITHOUT_LIMIT
        requests_from = f"none set: SGLang sizes it from the KV cache at start-up, {requests} assumed"
    per_request = 1
    if speculative:  # the target model verifies num_draft_tokens per request (num_steps + 1 with topk 1)
        draft = _int_arg(server_args, "speculative_num_draft_tokens", label)
        steps = _int_arg(server_args, "speculative_num_steps", label)
        per_request = draft if draft and draft > 0 else (steps + 1 if steps and steps > 0 else 1)
    if requests < 1:
        raise PlanError(f"{label}.max_running_requests: expected a positive integer, got {requests}")

    chunk = _int_arg(server_args, "chunked_prefill_size", label)
    if chunk is not None and chunk > 0:
        chunk_from = f"{label}.chunked_prefill_size"
    elif chunk is not None:  # -1 or 0: chunked prefill off, a prefill batch is up to max_prefill_tokens
        chunk = _int_arg(server_args, "max_prefill_tokens", label) or SGLANG_MAX_PREFILL_TOKENS
        chunk_from = "chunked prefill off: max_prefill_tokens"
    else:
        chunk = sglang_default_chunked_prefill_size(gpu_memory_mib)
        chunk_from = (
            f"SGLang 0.5.9's default for {gpu_memory_mib} MiB GPUs"
            if gpu_memory_mib is not None
            else "SGLang 0.5.9's default when the GPU memory is unknown"
        )

    decode_tokens = _powers_of_two_up_to(requests * per_request)
    prefill_tokens = sorted({max(1, chunk // f) for f in PREFILL_FRACTIONS})
    row = hidden_size * DTYPE_BYTES
    plan = {
        "hidden_size": hidden_size,
        "dtype_bytes": DTYPE_BYTES,
        "max_running_requests": requests,
        "max_running_requests_from": requests_from,
        "tokens_per_request": per_request,
        "chunked_prefill_size": chunk,
        "chunked_prefill_size_from": chunk_from,
        "decode_tokens": decode_tokens,
        "prefill_tokens": prefill_tokens,
        "decode": _sizes(decode_sizes, "nccl_measure_decode_sizes")
        if decode_sizes
        else [t * row for t in decode_tokens],
        "prefill": _sizes(prefill_sizes, "nccl_measure_prefill_sizes")
        if prefill_sizes
        else [t * row for t in prefill_tokens],
        "decode_from": "nccl_measure_decode_sizes" if decode_sizes else "derived",
        "prefill_from": "nccl_measure_prefill_sizes" if prefill_sizes else "derived",
    }
    plan["summary"] = plan_summary(plan)
    return plan


def plan_summary(plan):
    """One line: which sizes are measured, and why those."""
    row = plan["hidden_size"] * plan["dtype_bytes"]

    def span(sizes):
        return f"{size_label(sizes[0])} .. {size_label(sizes[-1])} ({len(sizes)} sizes)"

    if plan["decode_from"] == "derived":
        decode_why = (
            f"1 .. {plan['decode_tokens'][-1]} tokens = {plan['max_running_requests']} requests "
            f"({plan['max_running_requests_from']})"
            + (f" x {plan['tokens_per_request']} draft tokens" if plan["tokens_per_request"] > 1 else "")
        )
    else:
        decode_why = "nccl_measure_decode_sizes"
    if plan["prefill_from"] == "derived":
        prefill_why = (
            f"{plan['prefill_tokens'][0]} .. {plan['prefill_tokens'][-1]} tokens, chunk "
            f"{plan['chunked_prefill_size']} ({plan['chunked_prefill_size_from']})"
        )
    else:
        prefill_why = "nccl_measure_prefill_sizes"
    return (
        f"decode {span(plan['decode'])}: {decode_why}; prefill {span(plan['prefill'])}: {prefill_why}; "
        f"each token x hidden {plan['hidden_size']} x {plan['dtype_bytes']} bytes = {size_label(row)}"
    )


def _filter_errors(func):
    def wrapper(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except PlanError as exc:
            from ansible.errors import AnsibleFilterError  # only inside Ansible; keeps the module importable

            raise AnsibleFilterError(f"nccl_measure: {exc}") from exc

    wrapper.__doc__ = func.__doc__
    return wrapper


class FilterModule:
    def filters(self):
        return {
            "nccl_model_hidden_size": _filter_errors(model_hidden_size),
            "nccl_message_plan": _filter_errors(message_plan),
        }
