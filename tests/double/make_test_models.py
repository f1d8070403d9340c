#!/usr/bin/env python3
"""Write small synthetic models (a Llama target and its EAGLE-3 drafter) for the model tests.

Run it with a Python that has numpy and safetensors (.cache/parser-venv/bin/python):

    make_test_models.py OUT_DIR [--variant NAME]

OUT_DIR/target and OUT_DIR/draft then hold a real config.json, real safetensors shards written
by the safetensors package (random bf16-sized weights, a few MB), and for the target a
tokenizer (tokenizer.json + tokenizer_config.json). Variants make the faulty sources the tests
need: ``other-target`` writes a drafter trained for a model of another hidden size.
The last line printed is a JSON object: model name -> manifest (path, size, sha256).
"""

import argparse
import hashlib
import json
import os

import numpy as np
from safetensors.numpy import save_file

HIDDEN, VOCAB, DRAFT_VOCAB, LAYERS = 64, 1024, 512, 2
LLAMA = {
    "model_type": "llama", "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 16, "hidden_act": "silu", "max_position_embeddings": 2048, "rms_norm_eps": 1e-05,
    "rope_theta": 500000.0, "vocab_size": VOCAB, "bos_token_id": 1, "eos_token_id": 2,
    "tie_word_embeddings": False, "torch_dtype": "float16",
}


def _weights(rng, shapes):
    return dict((name, rng.standard_normal(shape).astype(np.float16)) for name, shape in shapes.items())


def _tokenizer():
    """A word-level tokenizer.json of VOCAB entries, in the tokenizers library's format."""
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab.update(("tok%d" % i, i) for i in range(3, VOCAB))
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True} for t, i in (("<unk>", 0), ("<s>", 1), ("</s>", 2))],
        "normalizer": None, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": None, "decoder": None,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"},
    }


def write_target(folder, rng):
    os.makedirs(folder)
    config = dict(LLAMA, architectures=["LlamaForCausalLM"], hidden_size=HIDDEN, num_hidden_layers=LAYERS)
    _json(folder, "config.json", config)
    _json(folder, "tokenizer.json", _tokenizer())
    _json(folder, "tokenizer_config.json", {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>",
                                            "eos_token": "</s>", "unk_token": "<unk>", "model_max_length": 2048})
    # Two shards so that a test can corrupt or cut one of them; each about 1 MB.
    shards = [{"model.embed_tokens.weight": (VOCAB, HIDDEN), "model.layers.0.mlp.up_proj.weight": (2048, 128)},
              {"lm_head.weight": (VOCAB, HIDDEN), "model.layers.1.mlp.up_proj.weight": (2048, 128)}]
    weight_map = {}
    for number, shapes in enumerate(shards, 1):
        name = "model-%05d-of-%05d.safetensors" % (number, len(shards))
        save_file(_weights(rng, shapes), os.path.join(folder, name), metadata={"format": "pt"})
        weight_map.update((tensor, name) for tensor in shapes)
    _json(folder, "model.safetensors.index.json", {"metadata": {}, "weight_map": weight_map})


def write_draft(folder, rng, hidden):
    os.makedirs(folder)
    config = dict(LLAMA, architectures=["LlamaForCausalLMEagle3"], hidden_size=hidden, num_hidden_layers=1,
                  draft_vocab_size=DRAFT_VOCAB)
    _json(folder, "config.json", config)
    weights = _weights(rng, {"midlayer.mlp.up_proj.weight": (128, hidden), "fc.weight": (hidden, 3 * hidden),
                             "lm_head.weight": (DRAFT_VOCAB, hidden)})
    weights["d2t"] = np.arange(DRAFT_VOCAB, dtype=np.int64)
    weights["t2d"] = np.zeros(VOCAB, dtype=np.bool_)
    save_file(weights, os.path.join(folder, "model.safetensors"))


def _json(folder, name, data):
    with open(os.path.join(folder, name), "w") as handle:
        json.dump(data, handle, indent=1)


def manifest(folder):
    entries = []
    for root, _dirs, files in os.walk(folder):
        for name in sorted(files):
            path = os.path.join(root, name)
            with open(path, "rb") as handle:
                data = handle.read()
            entries.append({"path": os.path.relpath(path, folder), "size": len(data),
                            "sha256": hashlib.sha256(data).hexdigest()})
    return sorted(entries, key=lambda e: e["path"])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--variant", choices=["good", "other-target"], default="good")
    parser.add_argument("--seed", type=int, default=16)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    write_target(os.path.join(args.out, "target"), rng)
    write_draft(os.path.join(args.out, "draft"), rng, HIDDEN * 2 if args.variant == "other-target" else HIDDEN)
    print(json.dumps({name: manifest(os.path.join(args.out, name)) for name in ("target", "draft")}))


if __name__ == "__main__":
    main()
