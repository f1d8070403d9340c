#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: (c) sglang-canon contributors
# MIT License (see LICENSE or https://opensource.org/licenses/MIT)
"""Ansible module gpu_topology: read the NVIDIA GPUs and their interconnect with nvidia-smi."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_topology
short_description: Gather NVIDIA GPU inventory and GPU-to-GPU topology with nvidia-smi
version_added: "1.0.0"
description:
  - Runs C(nvidia-smi --query-gpu=... --format=csv,noheader,nounits) and C(nvidia-smi topo -m)
    on the node and returns what they print as the C(gpu_topology) fact.
  - Per GPU it reports index, name, UUID, PCI bus id, total memory, compute capability, driver
    version, PCIe link generation and width (current and max), persistence mode, and the CPU and
    NUMA affinity printed by C(topo -m).
  - For every unordered GPU pair it reports the link exactly as C(nvidia-smi topo -m) prints it
    (C(SYS), C(NODE), C(PHB), C(PXB), C(PIX) or C(NV#)), and classifies the node's interconnect.
  - Needs only nvidia-smi on the node, no extra Python packages. Changes nothing; runs the same
    read-only commands in check mode.
  - The C(topo -m) parser copes with ANSI escapes in the header, NIC rows and a NIC legend of any length
    (or a truncated one), with or without the C(GPU NUMA ID) column, several NUMA nodes, blank or C(N/A)
    affinity cells (read as unknown, V(null)), any number of GPUs and a missing final newline.
  - It reads a capture whose tabs were expanded to spaces (through a terminal, a paste or a log collector)
    as it reads the tab-separated original, so the same parser serves recorded captures.
  - It refuses output without a header naming the GPU columns, or whose rows and columns disagree, with a
    message that quotes the offending line.
  - C(nvidia-smi) runs with C(LC_ALL=C).
author:
  - sglang-canon contributors
options:
  nvidia_smi:
    description:
      - Path of the nvidia-smi executable.
      - When empty or not given, C(nvidia-smi) is looked up on E(PATH), then in C(/usr/bin),
        C(/usr/local/bin) and C(/usr/local/nvidia/bin).
    type: path
    required: false
notes:
  - Fails with a clear message when nvidia-smi cannot be found or run, or exits non-zero (for example
    with exit status 9 when the NVIDIA driver is not loaded or does not answer).
  - When nvidia-smi answers "No devices were found" (driver loaded, no GPU visible) the module
    succeeds with C(gpu_count=0) and C(interconnect=none) rather than failing, so a preflight can
    say how many GPUs it expected and how many it found.
  - C(pcie_link_gen_current) and C(pcie_link_width_current) of an idle GPU are usually lower than
    the max values (power saving); judge the slot by C(pcie_link_gen_max) and C(pcie_link_width_max).
  - GPU indexes are those nvidia-smi uses (PCI bus order), which may differ from CUDA's default
    device order unless C(CUDA_DEVICE_ORDER=PCI_BUS_ID).
attributes:
  check_mode:
    support: full
    description: Only reads; check mode runs the same read-only commands and returns the same facts.
  diff_mode:
    support: none
    description: Nothing changes, so there is no diff.
  facts:
    support: full
    description: Returns C(ansible_facts.gpu_topology).
seealso:
  - name: nvidia-smi documentation
    description: The --query-gpu fields and the topo -m legend.
    link: https://docs.nvidia.com/deploy/nvidia-smi/index.html
"""

EXAMPLES = r"""
- name: Read the GPU topology
  gpu_topology:

- name: Read the GPU topology with an nvidia-smi outside PATH
  gpu_topology:
    nvidia_smi: /usr/local/nvidia/bin/nvidia-smi

- name: Show how the GPUs are connected
  ansible.builtin.debug:
    msg: >-
      {{ gpu_topology.gpu_count }} x {{ gpu_topology.gpus[0].name }},
      interconnect {{ gpu_topology.interconnect }}

- name: Stop unless every GPU pair is PCIe
  ansible.builtin.assert:
    that: gpu_topology.interconnect == 'pcie'
"""

RETURN = r"""
ansible_facts:
  description: Facts added to the host.
  returned: success
  type: dict
  contains:
    gpu_topology:
      description: NVIDIA GPUs of the node and how they are connected.
      returned: success
      type: dict
      contains:
        gpu_count:
          description: Number of GPUs nvidia-smi lists.
          type: int
          sample: 8
        driver_version:
          description:
            - NVIDIA driver version; when GPUs report different versions, all of them joined by C(, ).
            - V(null) when there is no GPU.
          type: str
          sample: "595.58.03"
        interconnect:
          description:
            - C(nvlink) when every GPU pair is an C(NV#) link, C(pcie) when no pair is, C(mixed) otherwise.
            - C(none) on a node with fewer than two GPUs (no pair to judge).
          type: str
          sample: pcie
        nvlink:
          description: Whether any GPU pair is joined by NVLink (C(NV#)).
          type: bool
          sample: false
        numa_nodes:
          description: NUMA nodes the GPUs are affine to, sorted.
          type: list
          elements: int
          sample: [0, 1]
        links:
          description: The link of every unordered GPU pair, exactly as C(nvidia-smi topo -m) prints it.
          type: list
          elements: dict
          sample:
            - {a: 0, b: 1, link: PIX}
            - {a: 0, b: 2, link: NODE}
            - {a: 0, b: 4, link: SYS}
          contains:
            a:
              description: Index of the first GPU (always lower than C(b)).
              type: int
            b:
              description: Index of the second GPU.
              type: int
            link:
              description: C(SYS), C(NODE), C(PHB), C(PXB), C(PIX) or C(NV#) (C(NV18) is 18 bonded NVLinks).
              type: str
        link_matrix:
          description:
            - The GPU x GPU part of the C(topo -m) matrix as printed, C(X) on the diagonal.
            - Rows and columns by GPU order.
          type: list
          elements: list
          sample: [["X", "NV18"], ["NV18", "X"]]
        gpus:
          description: One entry per GPU, by index. Values nvidia-smi reports as N/A are V(null).
          type: list
          elements: dict
          contains:
            index:
              description: nvidia-smi's GPU index.
              type: int
              sample: 0
            name:
              description: Product name.
              type: str
              sample: NVIDIA RTX PRO 6000 Blackwell Server Edition
            uuid:
              description: GPU UUID.
              type: str
              sample: GPU-e588912b-1368-6b4f-0e2a-0d08f8afb39b
            pci_bus_id:
              description: PCI bus id.
              type: str
              sample: "00000000:06:00.0"
            memory_total_mib:
              description: Total framebuffer memory in MiB.
              type: int
              sample: 97887
            compute_capability:
              description: CUDA compute capability, as C(major.minor).
              type: str
              sample: "12.0"
            driver_version:
              description: Driver version this GPU reports.
              type: str
              sample: "595.58.03"
            pcie_link_gen_current:
              description: PCIe generation the link runs at now (idle GPUs train down).
              type: int
              sample: 1
            pcie_link_gen_max:
              description: Highest PCIe generation this GPU and slot can reach together.
              type: int
              sample: 5
            pcie_link_width_current:
              description: PCIe lanes in use now.
              type: int
              sample: 16
            pcie_link_width_max:
              description: Most PCIe lanes this GPU and slot can use together.
              type: int
              sample: 16
            persistence_mode:
              description: Whether persistence mode is on.
              type: bool
              sample: true
            cpu_affinity:
              description: CPUs close to the GPU, as C(topo -m) prints them; V(null) when blank or N/A.
              type: str
              sample: "0-63,128-191"
            numa_affinity:
              description: NUMA affinity as C(topo -m) prints it; V(null) when blank or N/A.
              type: str
              sample: "0"
            numa_nodes:
              description: NUMA nodes named by C(numa_affinity), expanded.
              type: list
              elements: int
              sample: [0]
            numa_node:
              description: The NUMA node when the affinity names exactly one, else V(null).
              type: int
              sample: 0
            gpu_numa_id:
              description:
                - The GPU's own NUMA id (C(GPU NUMA ID) column; set on coherent systems such as Grace), else V(null).
              type: int
              sample: null
        nics:
          description: NICs C(topo -m) lists, with their link to each GPU (by GPU order).
          type: list
          elements: dict
          sample:
            - {name: NIC0, device: mlx5_0, links: [PIX, PIX, SYS, SYS]}
nvidia_smi:
  description: Path of the nvidia-smi that was run.
  returned: success
  type: str
  sample: /usr/bin/nvidia-smi
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.gpu_topology_parse import (
    QUERY_FIELD_NAMES,
    NO_DEVICES_MESSAGE,
    GpuTopologyParseError,
    build_topology,
)

# Where drivers put nvidia-smi when it is not on PATH (Debian/Ubuntu packages, .run installer, containers).
EXTRA_DIRS = ["/usr/bin", "/usr/local/bin", "/usr/local/nvidia/bin"]

# nvidia-smi's documented exit statuses, to say what went wrong.
EXIT_REASONS = {
    2: "an invalid argument or field (a driver too old for a queried field?)",
    3: "the operation is not available on this device",
    4: "insufficient permissions",
    6: "the query was unsuccessful",
    9: "the NVIDIA driver is not loaded or does not answer",
    10: "the NVIDIA kernel module reported an interrupt issue with a GPU",
    12: "the NVML shared library could not be found or loaded",
    14: "a GPU's infoROM is corrupted",
    15: "a GPU has fallen off the bus or is otherwise inaccessible",
}


class GpuTopology:
    """Runs nvidia-smi read-only and turns its output into the gpu_topology facts."""

    def __init__(self, module):
        self.module = module
        self.nvidia_smi = self.find_nvidia_smi(module.params["nvidia_smi"])

    def find_nvidia_smi(self, path):
        if path:
            if not os.path.exists(path):
                self.module.fail_json(msg="nvidia_smi=%s: no such file; is the NVIDIA driver installed?" % path)
            if not os.path.isfile(path) or not os.access(path, os.X_OK):
                self.module.fail_json(msg="nvidia_smi=%s: not an executable file" % path)
            return path
        found = self.module.get_bin_path("nvidia-smi", required=False, opt_dirs=EXTRA_DIRS)
        if not found:
            self.module.fail_json(
                msg="nvidia-smi not found on PATH nor in %s: is the NVIDIA driver installed? "
                "Set nvidia_smi to its path." % ", ".join(EXTRA_DIRS)
            )
        return found

    def run(self, args, allow_no_devices=False):
        command = [self.nvidia_smi] + args
        rc, out, err = self.module.run_command(command, environ_update={"LC_ALL": "C"})
        if rc != 0:
            said = " ".join(part.strip() for part in (out, err) if part and part.strip())
            if allow_no_devices and NO_DEVICES_MESSAGE in said:
                return said
            reason = EXIT_REASONS.get(rc, "an unexpected failure")
            self.module.fail_json(
                msg="%s exited %d (%s): %s" % (" ".join(command), rc, reason, said or "it printed nothing"),
                rc=rc,
                stdout=out,
                stderr=err,
                cmd=command,
            )
        return out

    def gather(self):
        query = self.run(
            ["--query-gpu=" + ",".join(QUERY_FIELD_NAMES), "--format=csv,noheader,nounits"],
            allow_no_devices=True,
        )
        if NO_DEVICES_MESSAGE in query:
            topo = ""
        else:
            topo = self.run(["topo", "-m"])
        try:
            return build_topology(query, topo)
        except GpuTopologyParseError as error:
            self.module.fail_json(
                msg="cannot read the output of %s: %s" % (self.nvidia_smi, error),
                query_gpu=query,
                topo_m=topo,
            )
        return None  # not reached: fail_json exits


def main():
    module = AnsibleModule(
        argument_spec=dict(
            nvidia_smi=dict(type="path", required=False),
        ),
        supports_check_mode=True,
    )
    gatherer = GpuTopology(module)
    facts = gatherer.gather()
    module.exit_json(changed=False, nvidia_smi=gatherer.nvidia_smi, ansible_facts=dict(gpu_topology=facts))


if __name__ == "__main__":
    main()
