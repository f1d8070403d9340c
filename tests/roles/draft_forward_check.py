"""Patch 0002 on CPU torch: a skipped draft keeps the verify pass's shapes (no SGLang import).

Run by tests/roles/test_sglang_patch_set_role.py with the parser venv's Python:
argv = common.py, spec_utils.py (pristine, from the wheel), the patched eagle_worker_v2.py, its name.
Compiles EagleDraftWorker.draft_forward and the two helpers it calls out of those files, drives it
with a fake drafter with and without skipping, and prints one JSON line comparing the two.
"""

import ast, json, sys, types

import torch


def functions(source, names, cls=None):
    body = ast.parse(source).body
    if cls:
        body = next(n for n in body if isinstance(n, ast.ClassDef) and n.name == cls).body
    return [n for n in body if isinstance(n, ast.FunctionDef) and n.name in names]


common, spec_utils, worker_source = (open(path, "rb").read() for path in sys.argv[1:4])
worker_name = sys.argv[4]
torch.manual_seed(0)
namespace = {"torch": torch, "List": list, "_is_npu": False, "detect_nan": lambda _: None, "ForwardBatch": object}
nodes = functions(common, {"fast_topk"}) + functions(spec_utils, {"select_top_k_tokens"})
nodes += functions(worker_source, {"draft_forward"}, cls="EagleDraftWorker")
exec(compile(ast.Module(body=nodes, type_ignores=[]), worker_name, "exec"), namespace)
batch, hidden, vocab, steps = 5, 8, 50, 3
forwards = []


def forward(forward_batch, skip_attn_backend_init):
    forwards.append(forward_batch.input_ids.clone())
    n = forward_batch.input_ids.shape[0]
    out = types.SimpleNamespace(next_token_logits=torch.randn(n, vocab), hidden_states=torch.randn(n, hidden))
    return types.SimpleNamespace(logits_output=out)


def run(skip):
    forwards.clear()
    first = torch.randint(0, vocab, (batch, 1))
    spec = types.SimpleNamespace(topk_p=torch.rand(batch, 1), topk_index=first, hidden_states=torch.randn(batch, hidden))
    forward_batch = types.SimpleNamespace(
        spec_info=spec,
        out_cache_loc=torch.arange(batch * steps),
        batch_size=batch,
        positions=torch.zeros(batch, dtype=torch.long),
    )
    worker = types.SimpleNamespace(
        hot_token_id=None,
        topk=1,
        speculative_num_steps=steps,
        speculative_num_draft_tokens=steps + 1,
        draft_attn_backend=types.SimpleNamespace(attn_backends=[None] * steps),
        draft_runner=types.SimpleNamespace(forward=forward),
        server_args=types.SimpleNamespace(enable_nan_detection=False),
    )
    out = namespace["draft_forward"](worker, forward_batch, skip_draft_steps=skip)
    return out, first, len(forwards)


(parents, index, tokens), _, normal_forwards = run(False)
(s_parents, s_index, s_tokens), first, skipped_forwards = run(True)
print(json.dumps({
    "torch": torch.__version__,
    "steps": steps,
    "forwards": [normal_forwards, skipped_forwards],
    "same_parents": torch.equal(parents, s_parents),
    "same_index": torch.equal(index, s_index),
    "same_shape": list(s_tokens.shape) == list(tokens.shape),
    "same_dtype": s_tokens.dtype == tokens.dtype,
    "every_slot_holds_the_first_token": torch.equal(s_tokens, first.repeat(1, steps)),
}))
