#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: (c) sglang-canon contributors
# MIT License (see LICENSE or https://opensource.org/licenses/MIT)
"""Ansible module sglang_stack_facts: read the driver/CUDA/torch/NCCL/SGLang stack of a node."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: sglang_stack_facts
short_description: Read the NVIDIA driver, CUDA, torch, NCCL and SGLang versions a node runs SGLang with
version_added: "1.0.0"
description:
  - Reads, on the node, the NVIDIA driver version and the highest CUDA version that driver supports
    (the header of C(nvidia-smi -q); when C(-q) gives nothing, the banner of plain C(nvidia-smi); as a
    last resort C(nvidia-smi --query-gpu=driver_version), which gives no CUDA version), and the number
    of GPUs nvidia-smi lists.
  - Reads the CUDA toolkit compiler's version from C(nvcc --version) where nvcc is installed.
  - Runs the Python that will run SGLang (O(python)) once, in one subprocess, and reads from it Python's
    version, C(torch.__version__), C(torch.version.cuda), whether CUDA is available, the device count and
    each device's compute capability, the cuDNN version, NCCL's version (torch.cuda.nccl.version(),
    else the version of an installed C(nvidia-nccl-cu13)/C(nvidia-nccl-cu12) wheel), and SGLang's
    version and install location (from its package metadata; C(sglang) is not imported).
  - Returns them as the C(sglang_stack) fact. Nothing missing is an error of the module; a missing
    nvidia-smi, nvcc, torch or SGLang gives null values (and a line in C(sglang_stack.errors)), and the
    caller (the C(stack_verify) role) decides whether that is a failure.
  - Importing torch takes seconds, so the facts are meant to be gathered once per run. Pass the facts
    gathered earlier as O(cache) and the Python probe is skipped when nothing was installed, removed
    or upgraded in that Python since (a cheap fingerprint of the interpreter and the mtimes of its
    C(sys.path) directories, which no torch import is needed for). nvidia-smi and nvcc are read every time.
  - Changes nothing; check mode runs the same read-only commands.
author:
  - sglang-canon contributors
options:
  python:
    description:
      - The Python interpreter that runs SGLang on the node (for example C(/opt/sglang/venv/bin/python)).
      - When it does not exist or cannot run, the python/torch/nccl/sglang facts are null and
        C(sglang_stack.errors.python) says why.
    type: path
    required: true
  nvidia_smi:
    description:
      - Path of nvidia-smi.
      - When not given, C(nvidia-smi) is looked up on E(PATH), then in C(/usr/bin), C(/usr/local/bin)
        and C(/usr/local/nvidia/bin).
      - When none is found the driver facts are null and C(sglang_stack.errors.nvidia_smi) says so.
    type: path
  nvcc:
    description:
      - Path of nvcc.
      - When not given, C(nvcc) is looked up on E(PATH), then C(/usr/local/cuda/bin/nvcc) is tried.
      - When none is found the nvcc facts are null, with no error (the toolkit is optional).
    type: path
  cache:
    description:
      - The C(sglang_stack) fact gathered earlier in the run, if any (pass it with the C(default) filter and
        C(omit), see the examples).
      - When it was gathered from the same O(python) and that Python's fingerprint is unchanged, its
        python/torch/nccl/sglang sections are returned again without importing torch, and C(reused) is true.
    type: dict
  timeout:
    description:
      - Seconds the Python probe may run (importing torch and initialising CUDA on many GPUs is slow).
    type: int
    default: 180
notes:
  - All commands run with C(LC_ALL=C).
  - CUDA availability and the device count are what torch sees with the module's own environment
    (C(CUDA_VISIBLE_DEVICES) of the Ansible task, not of the SGLang service).
  - torch.cuda.nccl.version() needs a CUDA build of torch; with a CPU build the NCCL version comes
    from an installed nvidia-nccl wheel, or is null.
  - The C(stack_verify) role of sglang-canon asserts these facts against the inventory's expectations.
attributes:
  check_mode:
    support: full
    description: Only reads; check mode runs the same commands and returns the same facts.
  diff_mode:
    support: none
    description: Nothing changes, so there is no diff.
  facts:
    support: full
    description: Returns C(ansible_facts.sglang_stack).
"""

EXAMPLES = r"""
- name: Read the stack SGLang runs on
  sglang_stack_facts:
    python: /opt/sglang/venv/bin/python

- name: Read it again after an install, reusing what is unchanged
  sglang_stack_facts:
    python: "{{ sglang_python }}"
    nvidia_smi: /usr/local/nvidia/bin/nvidia-smi
    cache: "{{ sglang_stack | default(omit) }}"

- name: Show torch's CUDA
  ansible.builtin.debug:
    msg: "torch {{ sglang_stack.torch.version }} built for CUDA {{ sglang_stack.torch.cuda }}"
"""

RETURN = r"""
reused:
  description: True when the python/torch/nccl/sglang sections came from O(cache) (fingerprint unchanged).
  returned: always
  type: bool
  sample: false
ansible_facts:
  description: Facts added to the host.
  returned: always
  type: complex
  contains:
    sglang_stack:
      description: The stack, section by section. Values that could not be read are null.
      returned: always
      type: complex
      contains:
        driver:
          description: What nvidia-smi says.
          type: dict
          returned: always
          sample:
            nvidia_smi: /usr/local/nvidia/bin/nvidia-smi
            source: nvidia-smi -q
            driver_version: "580.159.04"
            cuda_version: "13.0"
            gpu_count: 2
        nvcc:
          description: The CUDA compiler, where installed (C(path), C(release) like C(13.0), C(version) like C(13.0.88)).
          type: dict
          returned: always
          sample: {"path": "/usr/local/cuda/bin/nvcc", "release": "13.0", "version": "13.0.88"}
        python:
          description:
            - The probed interpreter (C(executable) as C(sys.executable) says, C(version), C(prefix)) and the
              path O(python) was given (C(requested)).
          type: dict
          returned: always
          sample:
            executable: /opt/sglang/venv/bin/python
            requested: /opt/sglang/venv/bin/python
            version: "3.12.3"
            prefix: /opt/sglang/venv
        torch:
          description:
            - torch as that Python imports it. C(version) is C(torch.__version__) (with its local tag like
              C(+cu130)); C(version_public) and C(version_local) are its two halves; C(cuda) is
              C(torch.version.cuda) (null for a CPU build); C(compute_capabilities) lists C(devices[].compute_capability).
          type: dict
          returned: always
          sample:
            version: "2.9.1+cu130"
            version_public: "2.9.1"
            version_local: "cu130"
            cuda: "13.0"
            cuda_available: true
            device_count: 2
            devices: [{"index": 0, "name": "NVIDIA H200", "compute_capability": "9.0"}]
            compute_capabilities: ["9.0", "9.0"]
            cudnn_version: 91900
            location: /opt/sglang/venv/lib/python3.12/site-packages/torch
        nccl:
          description: NCCL's version (C(major.minor.patch)) and where it was read (C(source)).
          type: dict
          returned: always
          sample: {"version": "2.28.9", "source": "torch.cuda.nccl.version()"}
        sglang:
          description: SGLang's distribution version and package directory.
          type: dict
          returned: always
          sample: {"version": "0.5.9", "location": "/opt/sglang/venv/lib/python3.12/site-packages/sglang"}
        errors:
          description: Why a section is null, keyed by section (C(nvidia_smi), C(python), C(torch), C(cuda), C(nccl), C(sglang)).
          type: dict
          returned: always
          sample: {"nccl": "AttributeError: module 'torch._C' has no attribute '_nccl_version'"}
        fingerprint:
          description: Fingerprint of the probed Python's installed packages (see O(cache)).
          type: str
          returned: always
          sample: bc37ee8553b1e461aa4412ac2b9d7675cd5b61101251652aeb39e74a2e609d67
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.stack_facts_parse import (
    FINGERPRINT_PROBE_SOURCE,
    PROBE_SOURCE,
    ProbeOutputError,
    empty_python_facts,
    parse_fingerprint_output,
    parse_nvcc_version,
    parse_nvidia_smi_banner,
    parse_nvidia_smi_q,
    parse_nvidia_smi_query_driver,
    parse_probe_output,
)

NVIDIA_SMI_DIRS = ["/usr/bin", "/usr/local/bin", "/usr/local/nvidia/bin"]
NVCC_FALLBACK = "/usr/local/cuda/bin/nvcc"
C_LOCALE = {"LC_ALL": "C"}


class StackFacts:
    """Gathers the sglang_stack fact; every step reads only."""

    def __init__(self, module):
        self.module = module
        self.errors = {}

    def _run(self, argv, **kwargs):
        return self.module.run_command(argv, environ_update=C_LOCALE, **kwargs)

    def driver(self):
        params = self.module.params
        facts = {"nvidia_smi": None, "source": None, "driver_version": None, "cuda_version": None, "gpu_count": None}
        path = params["nvidia_smi"] or self.module.get_bin_path("nvidia-smi", opt_dirs=NVIDIA_SMI_DIRS)
        if not path or not os.path.exists(path):
            self.errors["nvidia_smi"] = "nvidia-smi not found" + (" at %s" % path if path else " (PATH, %s)" % ", ".join(NVIDIA_SMI_DIRS))
            return facts
        facts["nvidia_smi"] = path
        problems = []
        for argv, parse, source in (([path, "-q"], parse_nvidia_smi_q, "nvidia-smi -q"),
                                    ([path], parse_nvidia_smi_banner, "nvidia-smi"),
                                    ([path, "--query-gpu=driver_version", "--format=csv,noheader"],
                                     parse_nvidia_smi_query_driver, "nvidia-smi --query-gpu=driver_version")):
            rc, out, err = self._run(argv)
            parsed = parse(out)
            if rc == 0 and parsed["driver_version"]:
                facts.update(parsed)
                facts["source"] = source
                return facts
            last = ((err or out or "").strip().splitlines() or [""])[-1]
            problems.append("%s: rc=%s %s" % (source, rc, last.strip()))
        self.errors["nvidia_smi"] = "; ".join(problems)
        return facts

    def nvcc(self):
        facts = {"path": None, "release": None, "version": None}
        path = self.module.params["nvcc"] or self.module.get_bin_path("nvcc")
        if not path and os.path.exists(NVCC_FALLBACK):
            path = NVCC_FALLBACK
        if not path or not os.path.exists(path):
            return facts
        facts["path"] = path
        rc, out, err = self._run([path, "--version"])
        parsed = parse_nvcc_version(out) if rc == 0 else None
        if parsed:
            facts.update(parsed)
        else:
            self.errors["nvcc"] = "%s --version: rc=%s, no 'release X.Y, VX.Y.Z' line" % (path, rc)
        return facts

    def python(self):
        """(python/torch/nccl/sglang sections, reused?)"""
        params = self.module.params
        python = params["python"]
        if not os.path.exists(python):
            return empty_python_facts(python, "%s does not exist" % python), False
        cache = params["cache"] or {}
        cached_fp = cache.get("fingerprint")
        cached_python = (cache.get("python") or {}).get("requested")
        if cached_fp and cached_python == python:
            rc, out, err = self._run([python, "-c", FINGERPRINT_PROBE_SOURCE])
            if rc == 0 and parse_fingerprint_output(out) == cached_fp:
                sections = {key: cache.get(key) for key in ("python", "torch", "nccl", "sglang")}
                sections["errors"] = {k: v for k, v in (cache.get("errors") or {}).items()
                                      if k not in ("nvidia_smi", "nvcc")}
                sections["fingerprint"] = cached_fp
                return sections, True
        rc, out, err = self._run(self._with_timeout([python, "-c", PROBE_SOURCE]), cwd="/")
        try:
            sections = parse_probe_output(out)
        except ProbeOutputError as exc:
            if rc == 124:
                why = "timed out after %ss" % params["timeout"]
            else:
                why = "%s %s" % (exc, " | ".join((err or "").strip().splitlines()[-3:]))
            return empty_python_facts(python, "%s (rc=%s): %s" % (python, rc, why.strip())), False
        sections["python"]["requested"] = python
        return sections, False

    def _with_timeout(self, argv):
        """run_command has no timeout: wrap in coreutils' timeout where the node has it."""
        timeout = self.module.get_bin_path("timeout")
        if timeout and self.module.params["timeout"] > 0:
            return [timeout, "--kill-after=10", str(self.module.params["timeout"])] + argv
        return argv

    def gather(self):
        driver = self.driver()
        nvcc = self.nvcc()
        sections, reused = self.python()
        errors = dict(sections.pop("errors", {}) or {})
        errors.update(self.errors)
        facts = {"driver": driver, "nvcc": nvcc}
        facts.update(sections)
        facts["python"].setdefault("requested", self.module.params["python"])
        facts["errors"] = errors
        return facts, reused


def main():
    module = AnsibleModule(
        argument_spec=dict(
            python=dict(type="path", required=True),
            nvidia_smi=dict(type="path"),
            nvcc=dict(type="path"),
            cache=dict(type="dict"),
            timeout=dict(type="int", default=180),
        ),
        supports_check_mode=True,
    )
    facts, reused = StackFacts(module).gather()
    module.exit_json(changed=False, reused=reused, ansible_facts={"sglang_stack": facts})


if __name__ == "__main__":
    main()
