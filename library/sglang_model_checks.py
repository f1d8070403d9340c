#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: sglang-canon contributors
# MIT License
"""Ansible module: refuse models that would not serve, before anything on the node changes."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

DOCUMENTATION = r"""
---
module: sglang_model_checks
short_description: Check the target model, its drafter and the GPUs against each other
description:
  - Fails, listing every problem with both values and the inventory variables, when the
    drafter's config.json does not belong to the target's (architecture, hidden size, vocabulary,
    draft-vocabulary mapping), when the weights do not fit the GPU memory SGLang may use, when the
    target lacks its tokenizer files, or when a filesystem lacks the space the files still to fetch need.
  - Reads only its arguments (what the sglang_model module returned in check mode); it changes
    nothing and runs the same in check mode.
version_added: "1.0.0"
author: sglang-canon contributors
options:
  target:
    description: The sglang_model result of the target (config, files, needed_bytes, available_bytes, filesystem).
    type: dict
    required: true
  draft:
    description: The sglang_model result of the drafter (also tensors); omit without speculative decoding.
    type: dict
  target_var:
    description: The inventory variable of the target's folder, for messages.
    type: str
    default: sglang_server_args.model_path
  draft_var:
    description: The inventory variable of the drafter's folder, for messages.
    type: str
    default: sglang_server_args.speculative_draft_model_path
  speculative_algorithm:
    description: SGLang's --speculative-algorithm (EAGLE3, EAGLE ...).
    type: str
  tp_size:
    description: Tensor-parallel size; the weights are split over this many GPUs.
    type: int
    required: true
  mem_fraction_static:
    description: Share of each GPU's memory SGLang takes for weights and KV cache.
    type: float
    required: true
  gpu_memory_mib:
    description: Total memory of each GPU (the smallest one counts).
    type: list
    elements: int
    required: true
  kv_cache_min_gib:
    description: KV cache per GPU that must be left after the weights.
    type: float
    required: true
  check_tokenizer:
    description: Require the tokenizer files in the target folder (false when the server gets another tokenizer path).
    type: bool
    default: true
"""

EXAMPLES = r"""
- name: Refuse a drafter of another target and weights too large for the GPUs
  sglang_model_checks:
    target: "{{ plan.results[0] }}"
    draft: "{{ plan.results[1] }}"
    speculative_algorithm: EAGLE3
    tp_size: 8
    mem_fraction_static: 0.88
    gpu_memory_mib: "{{ gpu_topology.gpus | map(attribute='memory_total_mib') | list }}"
    kv_cache_min_gib: 4
"""

RETURN = r"""
weights_bytes:
  description: Bytes of weight files per model.
  returned: always
  type: dict
  sample: {"target": 1311176, "drafter": 112000}
problems:
  description: Every refusal (empty when the models pass).
  returned: always
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.model_checks import drafter_problems, fit_problem, tokenizer_problem, weights_bytes
from ansible.module_utils.model_manifest import gib


def space_problems(models):
    """Models on one filesystem share its free space: refuse when their needs together exceed it."""
    problems = []
    by_filesystem = {}
    for label, result in models:
        if result.get("needed_bytes"):
            by_filesystem.setdefault(result.get("filesystem"), []).append((label, result))
    for group in by_filesystem.values():
        needed = sum(r["needed_bytes"] for _label, r in group)
        available = group[0][1]["available_bytes"]
        if needed > available:
            problems.append("not enough free space for %s: the files still to fetch need %d bytes (%s), the "
                            "filesystem holding %s has %d bytes (%s) available"
                            % (" and ".join(label for label, _r in group), needed, gib(needed),
                               group[0][1].get("folder"), available, gib(available)))
    return problems


def run_module():
    module = AnsibleModule(
        argument_spec=dict(
            target=dict(type="dict", required=True),
            draft=dict(type="dict"),
            target_var=dict(type="str", default="sglang_server_args.model_path"),
            draft_var=dict(type="str", default="sglang_server_args.speculative_draft_model_path"),
            speculative_algorithm=dict(type="str"),
            tp_size=dict(type="int", required=True),
            mem_fraction_static=dict(type="float", required=True),
            gpu_memory_mib=dict(type="list", elements="int", required=True),
            kv_cache_min_gib=dict(type="float", required=True),
            check_tokenizer=dict(type="bool", default=True),
        ),
        supports_check_mode=True,
    )
    params = module.params
    target, draft = params["target"], params["draft"]
    problems = []
    weights = {"target": weights_bytes(target["files"])}
    models = [(params["target_var"], target)]
    if draft:
        weights["drafter"] = weights_bytes(draft["files"])
        models.append((params["draft_var"], draft))
        problems += drafter_problems(target["config"], draft["config"], params["speculative_algorithm"],
                                     params["target_var"], params["draft_var"], draft.get("tensors"))
    if not params["gpu_memory_mib"]:
        problems.append("no GPU memory to check the weights against: gpu_topology found no GPU")
    else:
        problem = fit_problem(weights, params["tp_size"], min(params["gpu_memory_mib"]), params["mem_fraction_static"],
                              params["kv_cache_min_gib"], {
                                  "tp_size": "sglang_server_args.tp_size",
                                  "gpu_memory": "smallest GPU, gpu_topology",
                                  "mem_fraction_static": "sglang_server_args.mem_fraction_static",
                                  "headroom": "sglang_models_kv_cache_min_gib"})
        if problem:
            problems.append(problem)
    if params["check_tokenizer"]:
        problem = tokenizer_problem([f["path"] for f in target["files"]], params["target_var"])
        if problem:
            problems.append(problem)
    problems += space_problems(models)
    if problems:
        module.fail_json(msg="the models were refused, nothing on the node changed: " + " | ".join(problems),
                         problems=problems, weights_bytes=weights)
    module.exit_json(changed=False, problems=[], weights_bytes=weights)


def main():
    run_module()


if __name__ == "__main__":
    main()
