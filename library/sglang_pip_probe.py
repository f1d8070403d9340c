#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: sglang-canon contributors
# MIT License
"""Ansible module: read-only check whether a Python environment holds the wanted packages."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

DOCUMENTATION = r"""
---
module: sglang_pip_probe
short_description: Tell, without pip, whether an interpreter has the wanted package versions
description:
  - Runs the target interpreter once with a small standard-library script that lists the
    versions of its installed distributions (C(importlib.metadata)) and the installed release's
    own C(Requires-Dist); compares them with the wanted requirements. Never changes anything.
  - The wanted state is O(requirements) plus the lines of O(requirements_file); pinned
    (C(==)) requirements must match exactly (C(2.13.0) matches C(2.13.0+cpu)), others only
    need to be installed.
  - With O(check_release_pins), every C(==) pin of the installed release's own metadata
    (for instance transformers==4.57.1 of sglang 0.5.9) must match as well, apart from
    O(exclude); so a dependency drifted by hand is caught.
  - With O(sources), an installed package that a package source pins (C(torch==2.9.1+cu130))
    must be at that pin, local label included; so PyPI's C(torch 2.9.1) is drift where the
    PyTorch cu130 build is wanted, while SGLang's own C(torch==2.9.1) accepts either.
  - The comparison is plain Python (module_utils/sglang_pins.py).
version_added: "1.0.0"
author: sglang-canon contributors
options:
  python:
    description: Interpreter whose packages are checked. A missing one means everything drifts.
    type: path
    required: true
  requirements:
    description: Requirement strings that must be satisfied (C(sglang==0.5.9)).
    type: list
    elements: str
    default: []
  requirements_file:
    description:
      - A requirements file on the node whose lines must be satisfied too. Only plain
        requirement lines (no C(-r), C(-c), C(--index-url) ...); comments are allowed.
    type: path
  release:
    description: The release whose own pins are checked (see O(check_release_pins)).
    type: str
    default: sglang
  check_release_pins:
    description: Also require the installed release's own C(==) pins.
    type: bool
    default: true
  exclude:
    description: Names whose release pin is deliberately not followed on this node.
    type: list
    elements: str
    default: []
  require_release_deps:
    description:
      - A release pin whose package is missing counts as drift (an install with dependencies).
        With false (a C(--no-deps) install) only installed packages must match.
    type: bool
    default: true
  sources:
    description:
      - Package sources as the sglang_install role's C(sglang_install_sources) lists them; only
        C(name) and C(pins) are read here. Every pin must be exact (C(name==version)).
    type: list
    elements: dict
    default: []
"""

EXAMPLES = r"""
- name: Probe the SGLang venv
  sglang_pip_probe:
    python: /opt/sglang/venv/bin/python
    requirements: ["sglang==0.5.9"]
    sources:
      - name: PyTorch cu130
        pins: ["torch==2.9.1+cu130"]
  register: probe
  changed_when: false
  check_mode: false
"""

RETURN = r"""
python_found:
  description: Whether O(python) exists and ran.
  returned: always
  type: bool
in_sync:
  description: True when nothing drifts.
  returned: always
  type: bool
summary:
  description: One readable line per difference (and one for a missing interpreter).
  returned: always
  type: list
  elements: str
  sample: ["transformers: 4.56.0 installed, wanted ==4.57.1 (sglang pin)",
           "torch: 2.9.1 installed, wanted ==2.9.1+cu130 (pin of source PyTorch cu130)"]
drift:
  description: One entry per difference.
  returned: always
  type: list
  elements: dict
  sample: [{"name": "sglang", "wanted": "==0.5.9", "installed": null, "source": "requested"}]
installed:
  description: Installed version of each wanted package and release pin (null when missing).
  returned: always
  type: dict
  sample: {"sglang": "0.5.9", "torch": "2.13.0+cpu"}
python_version:
  description: Version of the target interpreter.
  returned: when python_found
  type: str
"""

import json
import os

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.sglang_pins import (
    RequirementError,
    canonical_name,
    describe_drift,
    find_drift,
    parse_requirement,
    parse_requirements_text,
    release_pins,
    source_pins,
)

# Runs under the TARGET interpreter (any Python >= 3.8): standard library only, except that
# markers are evaluated with `packaging` when that interpreter happens to have it.
PROBE = r"""
import json, platform, sys
from importlib import metadata
release = sys.argv[1]
versions = {}
for dist in metadata.distributions():
    name = dist.metadata["Name"]
    if name:
        key = name.lower().replace("_", "-").replace(".", "-")
        while "--" in key:
            key = key.replace("--", "-")
        versions.setdefault(key, dist.version)
try:
    requires = metadata.requires(release) if release else None
except metadata.PackageNotFoundError:
    requires = None
markers = {}
try:
    from packaging.requirements import Requirement
except Exception:
    Requirement = None
for entry in requires or []:
    if ";" in entry:
        try:
            markers[entry] = Requirement(entry).marker.evaluate({"extra": ""}) if Requirement else None
        except Exception:
            markers[entry] = None
print(json.dumps({"python": platform.python_version(), "versions": versions,
                  "requires": requires, "markers": markers}))
"""


def wanted_requirements(requirements, requirements_file):
    """Parsed requirements from the list and the file (file read on the node)."""
    wanted = [parse_requirement(r) for r in requirements]
    if requirements_file:
        with open(requirements_file) as handle:
            wanted.extend(parse_requirements_text(handle.read(), requirements_file))
    return wanted


def report(wanted, pinned_sources, probe, params):
    """Module result from the parsed wanted state, the sources' pins and the probe's JSON answer."""
    installed = probe["versions"]
    requires = probe["requires"] if params["check_release_pins"] else None
    drift = find_drift(
        wanted,
        installed,
        release=params["release"],
        release_requires=requires,
        exclude=params["exclude"],
        require_release_deps=params["require_release_deps"],
        marker_results=probe.get("markers"),
        pinned_sources=pinned_sources,
    )
    names = [r["canonical"] for r in wanted] + [p["canonical"] for p in pinned_sources]
    if requires:
        names += [p["canonical"] for p in release_pins(requires, params["exclude"])]
    shown = dict((n, installed.get(n)) for n in names)
    return dict(changed=False, python_found=True, python_version=probe["python"],
                in_sync=not drift, drift=drift, summary=[describe_drift(d) for d in drift],
                installed=shown)


def run_module():
    module = AnsibleModule(
        argument_spec=dict(
            python=dict(type="path", required=True),
            requirements=dict(type="list", elements="str", default=[]),
            requirements_file=dict(type="path"),
            release=dict(type="str", default="sglang"),
            check_release_pins=dict(type="bool", default=True),
            exclude=dict(type="list", elements="str", default=[]),
            require_release_deps=dict(type="bool", default=True),
            sources=dict(type="list", elements="dict", default=[]),
        ),
        supports_check_mode=True,
    )
    params = module.params
    try:
        wanted = wanted_requirements(params["requirements"], params["requirements_file"])
        pinned_sources = source_pins(params["sources"])
    except (RequirementError, IOError, OSError) as exc:
        module.fail_json(msg="cannot read the wanted requirements: %s" % exc)

    python = params["python"]
    if not (os.path.isfile(python) and os.access(python, os.X_OK)):
        drift = [dict(name=r["name"], wanted="==" + r["pin"] if r["pin"] else "any",
                      installed=None, source="requested") for r in wanted]
        module.exit_json(changed=False, python_found=False, in_sync=False, drift=drift,
                         summary=["%s does not exist" % python] + [describe_drift(d) for d in drift],
                         installed=dict((r["canonical"], None) for r in wanted))

    release = canonical_name(params["release"]) if params["check_release_pins"] else ""
    rc, out, err = module.run_command([python, "-I", "-c", PROBE, release],
                                      environ_update=dict(LC_ALL="C"))
    if rc != 0:
        module.fail_json(msg="probe failed under %s: %s" % (python, err.strip() or out.strip()), rc=rc)
    try:
        probe = json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        module.fail_json(msg="probe printed no JSON under %s" % python, stdout=out, stderr=err)
    module.exit_json(**report(wanted, pinned_sources, probe, params))


def main():
    run_module()


if __name__ == "__main__":
    main()
