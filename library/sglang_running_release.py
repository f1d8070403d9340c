"""Ansible module: which SGLang release the running server was started from."""

from __future__ import annotations

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
---
module: sglang_running_release
short_description: Tell which SGLang release the running server runs, and whether the inventory names another
description:
  - Finds the main process of O(service) (C(systemctl show --property=MainPID)), reads the
    interpreter it was started with (the first word of C(/proc/PID/cmdline)) and asks that
    interpreter which C(sglang) distribution it holds (C(importlib.metadata)).
  - With versions side by side (one venv per release, roles/sglang_install), the unit names the
    active release's interpreter; the process shows what actually runs, which is what differs
    after an upgrade interrupted between writing the unit and restarting, or on a node left on
    another release than the inventory says.
  - With O(report_drift), a running server of another release than O(wanted) is a change
    (RV(drifted) says which), so a drift scan (playbooks/drift.yml) names the node; otherwise
    the module never reports a change. Changes nothing on the node.
version_added: "1.0.0"
author: sglang-canon contributors
options:
  service:
    description: The server's systemd unit, e.g. C(sglang.service).
    type: str
    required: true
  wanted:
    description: The release the inventory names (sglang_version).
    type: str
    required: true
  report_drift:
    description: Report a server that runs another release than O(wanted) as changed.
    type: bool
    default: false
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: Name a node whose server runs another SGLang release than the inventory (drift scans)
  sglang_running_release:
    service: sglang.service
    wanted: "{{ sglang_version }}"
    report_drift: true
"""

RETURN = r"""
running:
  description: Whether the unit has a main process.
  returned: always
  type: bool
python:
  description: The interpreter the main process was started with; null when nothing runs.
  returned: always
  type: str
  sample: /opt/sglang/venvs/0.5.9/bin/python
release:
  description: The sglang release that interpreter holds; null when nothing runs or it holds none.
  returned: always
  type: str
  sample: 0.5.9
drifted:
  description: With O(report_drift), what differs from O(wanted), in words; else empty.
  returned: always
  type: list
  elements: str
  sample: [runs SGLang 0.5.23, the inventory says 0.5.9]
"""

# Prints the sglang distribution's version, or nothing when the interpreter holds none.
VERSION_PROGRAM = (
    "import importlib.metadata as m\n"
    "try:\n    print(m.version('sglang'))\n"
    "except m.PackageNotFoundError:\n    pass\n"
)


def interpreter_of(cmdline):
    """The program a process was started as: the first NUL-separated word of /proc/PID/cmdline."""
    first = cmdline.split(b"\0", 1)[0]
    return first.decode("utf-8", errors="replace") or None


def drift_of(release, wanted):
    """The drifted lines of a server that runs `release` (None: nothing runs) where `wanted` is named."""
    if release is None or release == wanted:
        return []
    return [f"runs SGLang {release}, the inventory says {wanted}"]


def main():
    module = AnsibleModule(
        argument_spec={
            "service": {"type": "str", "required": True},
            "wanted": {"type": "str", "required": True},
            "report_drift": {"type": "bool", "default": False},
        },
        supports_check_mode=True,
    )
    service, wanted = module.params["service"], module.params["wanted"]
    rc, out, err = module.run_command(["systemctl", "show", service, "--property=MainPID", "--value"])
    if rc != 0:
        module.fail_json(msg=f"systemctl show {service} failed: {err.strip()}")
    pid = out.strip()
    python = release = None
    if pid not in ("", "0"):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                python = interpreter_of(handle.read())
        except FileNotFoundError:
            python = None  # it exited since systemctl answered: nothing runs
    if python:
        rc, out, err = module.run_command([python, "-c", VERSION_PROGRAM])
        if rc != 0:
            module.fail_json(msg=f"{python} (the main process of {service}) could not tell its sglang release: "
                                 f"{err.strip()[-500:]}")
        release = out.strip() or None
    drifted = drift_of(release, wanted) if module.params["report_drift"] else []
    module.exit_json(changed=bool(drifted), running=python is not None, python=python, release=release,
                     drifted=drifted)


if __name__ == "__main__":
    main()
