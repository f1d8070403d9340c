"""Patch 0002 as ported to SGLang 0.5.23, on CPU torch: a skipped draft keeps the verify pass's shapes.

Run by tests/roles/test_sglang_patch_set_0_5_23_role.py with the parser venv's Python (no SGLang
import): argv = common.py, eagle_utils.py, spec_utils.py (pristine, from the 0.5.23 wheel), the patched
eagle_worker_v2.py, its name. Compiles EagleDraftWorker.draft_forward and the helpers it calls out
of those files and drives it with a fake drafter, with and without skipping, on both of 0.5.23's
topk-1 paths: the chain written in place by the draft_topk1_postprocess Triton kernel (CUDA only,
so a pure-torch stand-in of that kernel writes the column here) and the token list of other
devices. Prints one JSON line per path comparing the two runs.
"""

import ast
import contextlib
import json
import sys
import types
import typing

import torch


def functions(source, names, cls=None):
    body = ast.parse(source).body
    if cls:
        body = next(n for n in body if isinstance(n, ast.ClassDef) and n.name == cls).body
    return [n for n in body if isinstance(n, ast.FunctionDef) and n.name in names]


def draft_topk1_postprocess(next_token_logits, positions, draft_tokens=None, draft_token_column=0):
    """Stand-in of the Triton kernel: argmax, stored into draft_tokens[:, column], positions advanced."""
    topk_index = torch.argmax(next_token_logits, dim=-1, keepdim=True)
    if draft_tokens is not None:
        draft_tokens[:, draft_token_column : draft_token_column + 1].copy_(topk_index)
    positions.add_(1)
    return torch.ones_like(topk_index, dtype=torch.float32), topk_index


common, eagle_utils, spec_utils, worker_source = (open(path, "rb").read() for path in sys.argv[1:5])
worker_name = sys.argv[5]
BATCH, HIDDEN, VOCAB, STEPS = 5, 8, 50, 3
forwards = []


def forward(forward_batch):
    forwards.append(forward_batch.input_ids.clone())
    n = forward_batch.input_ids.shape[0]
    out = types.SimpleNamespace(next_token_logits=torch.randn(n, VOCAB), hidden_states=torch.randn(n, HIDDEN))
    return types.SimpleNamespace(logits_output=out)


def compiled(on_cuda):
    namespace = {
        "torch": torch,
        "List": list,
        "Optional": typing.Optional,
        "contextlib": contextlib,
        "ForwardBatch": object,
        "_is_cuda": on_cuda,
        "_is_hip": False,
        "_is_npu": False,
        # Turns off torch.compile of _select_top_k_tokens_later (its decorator's `disable`): eager on CPU.
        "_is_xpu": True,
        "get_spec": lambda: types.SimpleNamespace(speculative_use_rejection_sampling=False),
        "maybe_detect_nan": lambda *_: None,
        "maybe_detect_inf": lambda *_: None,
        "maybe_detect_oob": lambda *_: None,
        "IndexTopKShareState": types.SimpleNamespace(mtp_iteration=lambda *_, **__: contextlib.nullcontext()),
        "forward_context": lambda *_, **__: contextlib.nullcontext(),
        "ForwardContext": lambda **_: None,
        "draft_topk1_postprocess": draft_topk1_postprocess,
    }
    nodes = functions(common, {"fast_topk"}) + functions(eagle_utils, {"per_step_draft_out_cache_loc"})
    nodes += functions(spec_utils, {"select_top_k_tokens", "_select_top_k_tokens_first", "_select_top_k_tokens_later"})
    nodes += functions(worker_source, {"draft_forward"}, cls="EagleDraftWorker")
    exec(compile(ast.Module(body=nodes, type_ignores=[]), worker_name, "exec"), namespace)  # noqa: S102
    return namespace["draft_forward"]


def run(draft_forward, skip):
    forwards.clear()
    torch.manual_seed(0)
    first = torch.randint(0, VOCAB, (BATCH, 1))
    spec = types.SimpleNamespace(topk_p=torch.rand(BATCH, 1), topk_index=first, hidden_states=torch.randn(BATCH, HIDDEN))
    forward_batch = types.SimpleNamespace(
        spec_info=spec,
        forward_mode=types.SimpleNamespace(is_idle=lambda: False),
        out_cache_loc=torch.arange(BATCH * STEPS),
        batch_size=BATCH,
        positions=torch.zeros(BATCH, dtype=torch.long),
        sampling_info=types.SimpleNamespace(is_all_greedy=True),
    )
    max_bs = 16
    worker = types.SimpleNamespace(
        hot_token_id=None,
        topk=1,
        speculative_num_steps=STEPS,
        speculative_num_draft_tokens=STEPS + 1,
        index_share_for_mtp_iteration=False,
        seed_dsa_topk_from_draft_extend=False,
        _topk1_parents_prealloc=torch.arange(-1, STEPS - 1, dtype=torch.long).repeat(max_bs, 1),
        _topk1_score_indices_prealloc=torch.arange(STEPS, dtype=torch.long).repeat(max_bs, 1),
        draft_attn_backend=types.SimpleNamespace(attn_backends=[None] * STEPS),
        draft_runner=types.SimpleNamespace(
            forward=forward,
            canary_manager=None,
            model_config=types.SimpleNamespace(
                hf_config=types.SimpleNamespace(architectures=["LlamaForCausalLMEagle3"]), model_is_mrope=False
            ),
        ),
    )
    out = draft_forward(worker, forward_batch, skip_draft_steps=skip)
    return out, first, len(forwards)


for path, on_cuda in (("in-place chain (CUDA kernel path)", True), ("token list (other devices)", False)):
    draft_forward = compiled(on_cuda)
    (parents, index, tokens, probs), first, drafted = run(draft_forward, skip=False)
    (skip_parents, skip_index, skip_tokens, skip_probs), skip_first, skipped = run(draft_forward, skip=True)
    print(json.dumps({
        "path": path,
        "torch": torch.__version__,
        "steps": STEPS,
        "forwards": [drafted, skipped],
        "same_parents": bool(torch.equal(parents, skip_parents)),
        "same_index": bool(torch.equal(index, skip_index)),
        "same_shape": list(tokens.shape) == list(skip_tokens.shape) == [BATCH, STEPS],
        "same_dtype": tokens.dtype == skip_tokens.dtype,
        "no_probs": probs is None and skip_probs is None,
        "every_slot_holds_the_first_token": bool(torch.equal(skip_tokens, skip_first.expand(BATCH, STEPS))),
        "drafted_slots_differ": not bool(torch.equal(tokens, first.expand(BATCH, STEPS))),
    }))
