# -*- coding: utf-8 -*-
# Copyright: sglang-canon contributors
# MIT License (see galaxy_info of roles/sglang_models)
"""Pure checks of the models against each other and against the GPUs, run before the server
(re)starts: the EAGLE drafter belongs to the target, the weights fit the GPU memory SGLang may
use, and the tokenizer files the server loads are there. Each check returns refusals that name
both values and the inventory variables; the sglang_model_checks module fails with all of them.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import json
import struct

from ansible.module_utils.model_manifest import gib

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
# One of these sets of files is the tokenizer transformers' AutoTokenizer loads from a folder.
TOKENIZER_FILE_SETS = (
    ("tokenizer.json",),
    ("tokenizer.model",),
    ("vocab.json", "merges.txt"),
    ("tiktoken.model",),
)
# Drafter architectures SGLang 0.5.9 loads per speculative algorithm (srt/models/llama_eagle*.py,
# qwen2_eagle.py ...): the EAGLE-3 heads all end in "Eagle3", the EAGLE ones in "Eagle".
DRAFTER_ARCHITECTURE_SUFFIX = {"EAGLE3": "Eagle3", "EAGLE": "Eagle"}
# Tensors of an EAGLE-3 drafter that map its reduced draft vocabulary onto the target's.
VOCAB_MAPPING_TENSORS = ("d2t", "t2d")


def text_config(config):
    """The language-model part of a config.json (multimodal configs nest it as text_config)."""
    if "hidden_size" not in config and isinstance(config.get("text_config"), dict):
        return config["text_config"]
    return config


def drafter_problems(target, draft, algorithm, target_var, draft_var, draft_tensors=None):
    """Refusals when the drafter's config.json does not belong to the target's.

    ``target``/``draft`` are the parsed config.json files; ``*_var`` name where the inventory sets
    each folder; ``draft_tensors`` maps tensor name -> shape for the vocabulary-mapping tensors
    found in the drafter's safetensors headers.
    """
    problems = []
    tcfg, dcfg = text_config(target), text_config(draft)

    def refuse(what, draft_value, target_value):
        problems.append("drafter %s %s (%s) does not belong to target %s %s (%s)"
                        % (what, json.dumps(draft_value), draft_var, what, json.dumps(target_value), target_var))

    draft_archs = draft.get("architectures") or []
    target_archs = target.get("architectures") or []
    suffix = DRAFTER_ARCHITECTURE_SUFFIX.get(algorithm)
    if suffix and not any(str(a).endswith(suffix) for a in draft_archs):
        problems.append("drafter architectures %s (%s) hold no %s head (an architecture ending in %r), "
                        "as speculative_algorithm %s needs; target architectures %s (%s)"
                        % (json.dumps(draft_archs), draft_var, algorithm, suffix, algorithm,
                           json.dumps(target_archs), target_var))
    if any(str(a).endswith(("Eagle", "Eagle3")) for a in target_archs):
        problems.append("target architectures %s (%s) are a drafter's, not a model to serve"
                        % (json.dumps(target_archs), target_var))

    # An EAGLE-3 head reads the target's hidden states: its hidden size is the target's unless
    # the config says otherwise with target_hidden_size.
    draft_hidden = dcfg.get("target_hidden_size", dcfg.get("hidden_size"))
    if draft_hidden != tcfg.get("hidden_size"):
        refuse("hidden size", draft_hidden, tcfg.get("hidden_size"))
    if dcfg.get("vocab_size") != tcfg.get("vocab_size"):
        refuse("vocab_size", dcfg.get("vocab_size"), tcfg.get("vocab_size"))
    draft_vocab = dcfg.get("draft_vocab_size")
    if draft_vocab is not None and draft_vocab != dcfg.get("vocab_size"):
        tensors = draft_tensors or {}
        shape = tensors.get("d2t")
        if shape is None:
            problems.append("drafter draft_vocab_size %s differs from its vocab_size %s (%s) but its weights hold "
                            "no d2t tensor mapping the draft vocabulary onto the target's (%s)"
                            % (draft_vocab, dcfg.get("vocab_size"), draft_var, target_var))
        elif list(shape) != [draft_vocab]:
            problems.append("drafter d2t tensor has shape %s, draft_vocab_size %s needs [%s] (%s)"
                            % (json.dumps(list(shape)), draft_vocab, draft_vocab, draft_var))
    return problems


def weights_bytes(files):
    """Bytes of weight files among manifest-like entries {path, size}."""
    return sum(f["size"] for f in files if f["path"].endswith(WEIGHT_SUFFIXES))


def fit_problem(weights, tp_size, gpu_memory_mib, mem_fraction_static, headroom_gib, names):
    """A refusal with the numbers when the weights do not fit the GPUs, else None.

    ``weights`` maps label -> bytes (target, drafter); SGLang shards both over ``tp_size`` GPUs.
    Per GPU, the static pool is the smallest GPU's memory x mem_fraction_static; after the weights
    it must still hold ``headroom_gib`` of KV cache (SGLang refuses to start with "Not enough
    memory" otherwise). ``names`` names the inventory variables of the four numbers.
    """
    total = sum(weights.values())
    per_gpu = total / float(tp_size)
    budget = gpu_memory_mib * (1 << 20) * mem_fraction_static
    headroom = headroom_gib * float(1 << 30)
    if per_gpu + headroom <= budget:
        return None
    parts = " + ".join("%s %s" % (label, gib(count)) for label, count in sorted(weights.items()))
    return ("the weights do not fit the GPUs: %s = %s over %s %d = %s per GPU, plus %s %s of KV cache, "
            "is %s; a GPU gives SGLang %s = %d MiB (%s) x %s %s"
            % (parts, gib(total), names["tp_size"], tp_size, gib(per_gpu), names["headroom"], gib(headroom),
               gib(per_gpu + headroom), gib(budget), gpu_memory_mib, names["gpu_memory"],
               names["mem_fraction_static"], mem_fraction_static))


def tokenizer_problem(files, model_var):
    """A refusal when the folder has no tokenizer_config.json or no tokenizer, else None."""
    present = set(files)
    missing = []
    if "tokenizer_config.json" not in present:
        missing.append("tokenizer_config.json")
    if not any(all(name in present for name in names) for names in TOKENIZER_FILE_SETS):
        missing.append(" or ".join("+".join(names) for names in TOKENIZER_FILE_SETS))
    if not missing:
        return None
    return "the target model (%s) lacks the tokenizer files the server loads: %s" % (model_var, "; ".join(missing))


def safetensors_header(head):
    """Tensor name -> shape from the start of a safetensors file (8-byte little-endian header
    length, then that many bytes of JSON). ``head`` is a callable (offset, length) -> bytes."""
    length = struct.unpack("<Q", head(0, 8))[0]
    if length > 100 * 1024 * 1024:
        raise ValueError("safetensors header of %d bytes is not plausible" % length)
    header = json.loads(head(8, length).decode("utf-8"))
    return dict((name, info.get("shape")) for name, info in header.items()
                if name != "__metadata__" and isinstance(info, dict))
