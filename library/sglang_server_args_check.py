#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: (c) sglang-canon contributors
# MIT License (see LICENSE or https://opensource.org/licenses/MIT)
"""Ansible module sglang_server_args_check: `nginx -t` for SGLang's command line and environment."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: sglang_server_args_check
short_description: Check SGLang server arguments and environment with SGLang's own ServerArgs, before a restart
version_added: "1.0.0"
description:
  - Like C(nginx -t) before a reload, runs the exact argv and environment a service unit will give
    C(python -m sglang.launch_server) through SGLang's own argument handling, in the node's SGLang Python,
    without starting a server and without a GPU.
  - "In one subprocess of O(python), whose environment is exactly O(environment) (plus E(PATH), E(HOME), E(LANG)
    and E(TMPDIR) from the module's own environment where O(environment) does not set them), it:
    imports C(sglang.srt.server_args);
    checks every C(SGLANG_*) (and deprecated C(SGL_*)) variable that C(sglang.srt.environ.Envs) declares with
    that variable's own parser, since SGLang only warns about a value its parser rejects and uses the default
    (C(SGLANG_ENABLE_SPEC_V2=on) runs silently without spec v2);
    runs C(prepare_server_args) on argv, the function C(launch_server) calls, with argparse's errors captured
    (unknown flags, bad types, bad choices come back as argparse's message), then the ServerArgs post-init
    rules (for example spec v2 refusing C(--speculative-eagle-topk) above 1) and C(ServerArgs.check_server_args);
    and adds checks SGLang 0.5.9 lacks."
  - "Checks SGLang lacks: C(mem_fraction_static) must be in (0, 1) (SGLang 0.5.9 accepts 1.5, 0 and -0.2
    silently), C(port) in 1..65535, an absolute C(--model-path), C(--speculative-draft-model-path) or
    C(--tokenizer-path) must exist on the node. Whether the parallel sizes fit the node's GPUs is judged on
    the controller from C(resolved) (filter C(gpu_layout_mismatches))."
  - C(--device cuda) is added when O(argv) has no C(--device), since SGLang's post-init stops with
    "No accelerator" on a node where torch sees no GPU.
  - Fails with one message listing every problem, each naming the flag (as O(argv) gives it) or the environment
    variable, and what SGLang (or the extra check) said. Succeeds with C(resolved), the ServerArgs fields as
    SGLang resolved them.
  - Changes nothing. Runs in check mode too, since it only reads.
author:
  - sglang-canon contributors
options:
  python:
    description:
      - The Python interpreter that runs SGLang on the node (the unit's interpreter).
    type: path
    required: true
  argv:
    description:
      - The server arguments exactly as the unit passes them after C(-m sglang.launch_server), one list item per word.
      - Items that are not strings (numbers from YAML) are turned into strings.
    type: list
    elements: str
    required: true
  environment:
    description:
      - The environment the unit sets (its C(Environment=)/C(EnvironmentFile=) variables), NAME to value.
      - Nothing else of the module's environment reaches SGLang but E(PATH), E(HOME), E(LANG) and E(TMPDIR),
        and only where this does not set them.
    type: dict
    default: {}
  variables:
    description:
      - The inventory variables the argv and the environment were made from, each with its keys, to name the
        variable behind each problem; for example C(sglang_server_args) with its ServerArgs fields and
        C(sglang_service_environment) with its variable names.
      - A problem whose flag is C(--tp-size) is then named C(sglang_server_args.tp_size), one with
        C(SGLANG_ENABLE_SPEC_V2=on) C(sglang_service_environment.SGLANG_ENABLE_SPEC_V2); a variable of O(environment)
        that no entry lists (set by another role) is named by itself.
    type: dict
    default: {}
  timeout:
    description:
      - Seconds the check may run. Importing SGLang takes seconds to tens of seconds on a cold disk.
    type: int
    default: 300
notes:
  - The check reads the model folders' C(config.json) as SGLang's post-init does, so the folders named by
    C(--model-path) (and the draft's) must be on the node. A hub repository name instead of a folder makes
    transformers look it up online.
  - The subprocess runs in C(/), like a unit without C(WorkingDirectory=); give absolute paths.
  - Values SGLang derives from GPU memory when not given (C(mem_fraction_static), C(cuda_graph_max_bs),
    C(chunked_prefill_size)) are resolved from what nvidia-smi says on the node, or as for an unknown GPU where
    none is visible, so they can differ from the running server's on a node without GPUs.
  - The probe's source is the module utility C(sglang_args_probe), sent to the node with the module and run
    there with C(python -c); nothing is written on the node.
attributes:
  check_mode:
    support: full
    description: Only reads; check mode runs the same check.
  diff_mode:
    support: none
    description: Nothing changes, so there is no diff.
"""

EXAMPLES = r"""
- name: Check the server's flags and environment with SGLang itself before restarting it
  sglang_server_args_check:
    python: /opt/sglang/venv/bin/python
    argv:
      - --model-path
      - /srv/models/target
      - --speculative-algorithm
      - EAGLE3
      - --speculative-draft-model-path
      - /srv/models/draft
      - --speculative-num-steps
      - "3"
      - --speculative-eagle-topk
      - "1"
      - --speculative-num-draft-tokens
      - "4"
      - --tp-size
      - "8"
    environment:
      SGLANG_ENABLE_SPEC_V2: "1"
    variables:
      sglang_server_args: [model_path, speculative_algorithm, speculative_draft_model_path, speculative_num_steps,
                           speculative_eagle_topk, speculative_num_draft_tokens, tp_size]
      sglang_service_environment: [SGLANG_ENABLE_SPEC_V2]
  register: sglang_args

- name: Insist that spec v2 is really on
  ansible.builtin.assert:
    that: sglang_args.resolved.spec_v2
"""

RETURN = r"""
resolved:
  description:
    - Every ServerArgs field as SGLang 0.5.9 resolved it (post-init defaults and adjustments included), for example
      C(speculative_algorithm), C(speculative_num_steps), C(speculative_eagle_topk), C(speculative_num_draft_tokens),
      C(tp_size), C(mem_fraction_static), C(host), C(port), C(max_running_requests), C(disable_overlap_schedule).
    - Two keys that are not ServerArgs fields. C(spec_v2) is true when the scheduler will run the spec v2 worker
      (an EAGLE/EAGLE3/STANDALONE algorithm with the overlap schedule on, the rule of SGLang's
      C(SpeculativeAlgorithm.create_worker)). C(spec_v2_env) is C(SGLANG_ENABLE_SPEC_V2) as SGLang read it.
    - Null when SGLang refused the arguments before resolving them.
  returned: always
  type: dict
  sample:
    speculative_algorithm: EAGLE3
    speculative_num_steps: 3
    speculative_eagle_topk: 1
    speculative_num_draft_tokens: 4
    tp_size: 8
    mem_fraction_static: 0.88
    host: 127.0.0.1
    port: 30000
    max_running_requests: 48
    disable_overlap_schedule: false
    spec_v2: true
    spec_v2_env: true
spec_v2:
  description: Same as C(resolved.spec_v2) (false when nothing was resolved).
  returned: always
  type: bool
  sample: true
adjusted:
  description: Fields whose value SGLang's post-init changed from what the command line parsed to (defaults it
    filled in, values it reset), as C(parsed) and C(resolved).
  returned: always
  type: dict
  sample: {"max_running_requests": {"parsed": null, "resolved": 48}, "speculative_num_draft_tokens": {"parsed": 8, "resolved": 4}}
errors:
  description: Every problem found, each with C(stage) (C(import), C(environment), C(parse), C(post_init),
    C(check_server_args), C(value), C(probe)), C(flag) (the flag as argv gives it, or the variable)
    C(message), and C(variables) (the inventory variables behind it, from O(variables); empty when none is known).
    Empty on success.
  returned: always
  type: list
  elements: dict
  sample: [{"stage": "parse", "flag": "--tensor-parallel-size/--tp-size", "variables": ["sglang_server_args.tp_size"],
            "message": "SGLang's argument parser: argument --tensor-parallel-size/--tp-size: invalid int value: 'eight'"}]
variables:
  description: The inventory variables behind all problems, in order, each once (see O(variables)). Empty on success.
  returned: always
  type: list
  elements: str
  sample: ["sglang_server_args.tp_size", "sglang_service_environment.SGLANG_ENABLE_SPEC_V2"]
sglang_warnings:
  description: Warnings SGLang logged while resolving (for example that max_running_requests was reset to 48), and
    C(SGLANG_*) variables SGLang does not declare.
  returned: always
  type: list
  elements: str
  sample: ["WARNING: Max running requests is reset to 48 for speculative decoding."]
argv_checked:
  description: The argv given to SGLang (O(argv), plus C(--device cuda) when it had no C(--device)).
  returned: always
  type: list
  elements: str
device_added:
  description: Whether C(--device cuda) was added.
  returned: always
  type: bool
sglang_version:
  description: Version of the SGLang distribution that did the check.
  returned: always
  type: str
  sample: 0.5.9
"""

import json
import os
import subprocess

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils import sglang_args_probe
from ansible.module_utils.sglang_args_variables import name_variables

INHERITED = ("PATH", "HOME", "LANG", "TMPDIR")
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def probe_source():
    """The probe's own source text: shipped inside the module's payload, run by the node's SGLang Python."""
    loader = getattr(sglang_args_probe, "__loader__", None)
    source = None
    if loader is not None and hasattr(loader, "get_source"):
        source = loader.get_source(sglang_args_probe.__name__)
    if not source:
        with open(sglang_args_probe.__file__) as handle:
            source = handle.read()
    return source


def probe_environment(environment):
    env = {}
    for name in INHERITED:
        if name in os.environ:
            env[name] = os.environ[name]
    env.setdefault("PATH", DEFAULT_PATH)
    env.setdefault("LANG", "C.UTF-8")
    for name, value in (environment or {}).items():
        env[str(name)] = "" if value is None else str(value)
    return env


def parse_result(stdout):
    """The probe's JSON (its last marked line), or None."""
    found = None
    for line in (stdout or "").splitlines():
        if line.startswith(sglang_args_probe.MARKER):
            found = line[len(sglang_args_probe.MARKER):]
    if found is None:
        return None
    try:
        return json.loads(found)
    except ValueError:
        return None


def describe(errors):
    lines = []
    for error in errors:
        flag = error.get("flag")
        lines.append("%s%s" % ("%s: " % flag if flag else "", error.get("message")))
    return lines


def main():
    module = AnsibleModule(
        argument_spec=dict(
            python=dict(type="path", required=True),
            argv=dict(type="list", elements="str", required=True),
            environment=dict(type="dict", default={}),
            variables=dict(type="dict", default={}),
            timeout=dict(type="int", default=300),
        ),
        supports_check_mode=True,
    )
    params = module.params
    python = params["python"]
    if not (os.path.isfile(python) and os.access(python, os.X_OK)):
        module.fail_json(msg="SGLang's Python %s does not exist or is not executable on the node" % python,
                         resolved=None, spec_v2=False, errors=[], variables=[], sglang_warnings=[], adjusted={})

    request = {"argv": [str(a) for a in params["argv"]]}
    env = probe_environment(params["environment"])
    try:
        proc = subprocess.run(
            [python, "-c", probe_source()], input=json.dumps(request), env=env, cwd="/",
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, timeout=params["timeout"],
        )
    except subprocess.TimeoutExpired:
        module.fail_json(msg="the SGLang argument check did not finish within %ss (timeout)" % params["timeout"],
                         resolved=None, spec_v2=False, errors=[], variables=[], sglang_warnings=[], adjusted={})
    result = parse_result(proc.stdout)
    if result is None:
        tail = (proc.stderr or "").strip().splitlines()[-15:]
        module.fail_json(msg="the SGLang argument check printed no result (rc=%s): %s" % (proc.returncode, " | ".join(tail)),
                         rc=proc.returncode, stderr=proc.stderr, resolved=None, spec_v2=False, errors=[],
                         variables=[], sglang_warnings=[], adjusted={})

    resolved = result.get("resolved")
    errors, variables = name_variables(result.get("errors") or [], params["variables"], list(params["environment"] or {}))
    output = dict(
        changed=False,
        resolved=resolved,
        spec_v2=bool(resolved and resolved.get("spec_v2")),
        adjusted=result.get("adjusted") or {},
        errors=errors,
        variables=variables,
        sglang_warnings=result.get("warnings") or [],
        argv_checked=result.get("argv_checked"),
        device_added=bool(result.get("device_added")),
        sglang_version=result.get("sglang_version"),
    )
    if output["errors"]:
        problems = describe(output["errors"])
        module.fail_json(
            msg="SGLang %s refuses the server arguments or environment (%d problem(s)): %s" % (
                output["sglang_version"] or "(version unknown)", len(problems), "; ".join(problems)),
            **output)
    module.exit_json(**output)


if __name__ == "__main__":
    main()
