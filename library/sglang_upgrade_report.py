#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: (c) sglang-canon contributors
# MIT License (see LICENSE or https://opensource.org/licenses/MIT)
"""Ansible module sglang_upgrade_report: what an SGLang upgrade would meet, written on the controller."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: sglang_upgrade_report
short_description: Report, from the real wheels, what upgrading SGLang would meet; write it as Markdown and JSON
version_added: "1.0.0"
description:
  - "Runs on the controller (C(delegate_to: localhost)) and reads only files there; no managed node is touched."
  - "Reads the target release's wheel O(wheel) and the current one O(current_wheel): each patch of the active set
    (O(active_set)) and of the target's own set (O(target_set)) is applied in set order to the target's pristine
    files with the role's strict applier (module_utils/unified_diff.py) and classified clean, offset, fuzz (a hunk
    matches only with GNU patch's fuzz, which the role's applier does not do), fails (file and hunk) or obsolete (the target already holds its lines, or the set's C(set.yml) entry C(obsolete) names
    a file and a string of upstream's own fix that the target has)."
  - "Compares O(current_args_check) and O(target_args_check), the results of the sglang_server_args_check module
    for the canonical command line under each release: flags the target refuses, resolved values that changed,
    the speculative algorithm and scheduler each resolves to; reports whether each variable of O(environment)
    is read by either release's Python sources or only by a patch."
  - Compares the exact pins of both wheels' C(Requires-Dist) and each of O(inventory_pins) with the target's.
  - Writes C(sglang-FROM-to-TO.md) and C(.json) into O(report_dir) and returns the refusals; it does not fail
    on them (the playbook stops with the report's path and the first one).
author:
  - sglang-canon contributors
options:
  from_version:
    description: The release the fleet runs.
    type: str
    required: true
  to_version:
    description: The release the upgrade would install.
    type: str
    required: true
  wheel:
    description: The target release's wheel on the controller.
    type: path
    required: true
  current_wheel:
    description: The current release's wheel on the controller.
    type: path
    required: true
  sources:
    description: Where the wheel came from, one line (the sglang_pip_source_summary filter's).
    type: str
    default: ""
  active_set:
    description: The sglang_patch_sets lookup's result for the active sets (C(sets), C(patches), C(errors)).
    type: dict
    required: true
  target_set:
    description: The sglang_patch_sets lookup's result for the shipped set of the target release.
    type: dict
    required: true
  current_args_check:
    description: The sglang_server_args_check result for the current release (its C(resolved), C(errors)).
    type: dict
    required: true
  target_args_check:
    description: The sglang_server_args_check result for the target release.
    type: dict
    required: true
  configured_fields:
    description: The ServerArgs fields the inventory sets (the keys of sglang_server_args).
    type: list
    elements: str
    default: []
  environment:
    description: The server's environment as the service gets it, NAME to value.
    type: dict
    default: {}
  install_sources:
    description: The inventory's package sources (sglang_install_sources), whose pins are compared with the target's.
    type: list
    elements: dict
    default: []
  expected_torch_version:
    description: The torch version stack_verify expects on the node (stack_verify_expected_torch_version); empty for none.
    type: str
    default: ""
  expected_torch_cuda:
    description: The CUDA version stack_verify expects torch to be built for (stack_verify_expected_torch_cuda); empty for none.
    type: str
    default: ""
  deviations:
    description: Packages a node runs at another version than the release requires, on purpose.
    type: list
    elements: str
    default: []
  report_dir:
    description: The folder on the controller the report is written to (made when missing).
    type: path
    required: true
attributes:
  check_mode:
    support: full
    description: In check mode the report is computed and returned but not written.
  diff_mode:
    support: none
    description: The report is a new file per pair of releases; there is nothing to diff.
"""

EXAMPLES = r"""
- name: Write the upgrade report
  sglang_upgrade_report:
    from_version: "0.5.9"
    to_version: "0.5.10"
    wheel: /srv/cache/wheels/sglang-0.5.10-py3-none-any.whl
    current_wheel: /srv/cache/wheels/sglang-0.5.9-py3-none-any.whl
    active_set: "{{ active }}"
    target_set: "{{ target }}"
    current_args_check: "{{ current_check }}"
    target_args_check: "{{ target_check }}"
    configured_fields: "{{ sglang_server_args | list }}"
    environment: {SGLANG_ENABLE_SPEC_V2: "1"}
    install_sources: "{{ sglang_install_sources }}"
    expected_torch_version: "2.9.1"
    report_dir: /srv/upgrade-reports
  delegate_to: localhost
"""

RETURN = r"""
report:
  description: The report (the JSON file's content).
  type: dict
  returned: always
warnings_of_report:
  description: What the report does not refuse but an operator must know (a variable the target no longer reads).
  type: list
  elements: str
  returned: always
refusals:
  description: One line per reason the upgrade must not go ahead; empty when the report allows it.
  type: list
  elements: str
  returned: always
markdown_path:
  description: The Markdown report's path.
  type: str
  returned: always
json_path:
  description: The JSON report's path.
  type: str
  returned: always
"""

import json
import os
import zipfile

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.sglang_pins import source_pins, wheel_metadata
from ansible.module_utils.sglang_upgrade_report import (
    classify_set,
    compare_server_args,
    compare_stack,
    environment_readers,
    patched_paths,
    refusals,
    render_markdown,
    warnings,
)


def wheel_files(path, wanted):
    """site-packages path -> bytes for each wanted path (None where the wheel has no such file)."""
    with zipfile.ZipFile(path) as wheel:
        names = set(wheel.namelist())
        return {rel: (wheel.read(rel) if rel in names else None) for rel in wanted}


def python_sources(path):
    """The text of every .py file of the wheel (what reads an environment variable)."""
    with zipfile.ZipFile(path) as wheel:
        return [wheel.read(name) for name in wheel.namelist() if name.endswith(".py")]


def obsolete_rules(resolution):
    """Patch file name -> set.yml's obsolete entry, over the sets of one lookup result."""
    rules = {}
    for one in resolution.get("sets") or []:
        rules.update(one.get("obsolete") or {})
    return rules


def inventory_pins(params):
    """{name, pin, origin} of each pin of the package sources and of stack_verify's torch."""
    pins = [{"name": p["name"], "pin": p["pin"], "origin": "sglang_install_sources (%s)" % p["origin"]}
            for p in source_pins(params["install_sources"])]
    if params["expected_torch_version"]:
        pins.append({"name": "torch", "pin": params["expected_torch_version"], "origin": "stack_verify_expected_torch_version"})
    return pins


def build_report(params):
    active, target = params["active_set"], params["target_set"]
    target_sets = target.get("sets") or [{}]
    target_exists = bool(target_sets[0].get("exists")) and not target.get("errors")
    all_patches = (active.get("patches") or []) + ((target.get("patches") or []) if target_exists else [])
    rules = dict(obsolete_rules(active), **obsolete_rules(target))
    files = wheel_files(params["wheel"], patched_paths(all_patches) + [str(r.get("file")) for r in rules.values()
                                                                       if isinstance(r, dict) and r.get("file")])
    _, _, current_requires = wheel_metadata(params["current_wheel"])
    _, _, target_requires = wheel_metadata(params["wheel"])
    report = {
        "from": params["from_version"],
        "to": params["to_version"],
        "wheel": os.path.basename(params["wheel"]),
        "sources": params["sources"],
        "active_set": {
            "names": [one["name"] for one in active.get("sets") or []],
            # The target's set.yml says which patches of the earlier set the target made obsolete.
            "patches": classify_set(active.get("patches") or [], files, rules),
        },
        "target_set": {
            "name": target_sets[0].get("name"),
            "dir": target_sets[0].get("dir"),
            "exists": target_exists,
            "errors": target.get("errors") or [],
            "patches": classify_set(target.get("patches") or [], files, obsolete_rules(target)) if target_exists else [],
        },
        "server_args": compare_server_args(params["current_args_check"], params["target_args_check"],
                                           params["configured_fields"]),
        "environment": environment_readers(params["environment"], python_sources(params["current_wheel"]),
                                           python_sources(params["wheel"]), active.get("patches") or [],
                                           (target.get("patches") or []) if target_exists else []),
        "stack": compare_stack(current_requires, target_requires, inventory_pins(params), params["deviations"]),
    }
    report["stack"]["torch_cuda"] = params["expected_torch_cuda"] or None
    report["refusals"] = refusals(report)
    report["warnings"] = warnings(report)
    return report


def write_if_different(path, text):
    try:
        with open(path, encoding="utf-8") as handle:
            if handle.read() == text:
                return False
    except OSError:
        pass
    with open(path + ".tmp", "w", encoding="utf-8") as handle:
        handle.write(text)
    os.replace(path + ".tmp", path)
    return True


def main():
    module = AnsibleModule(
        argument_spec=dict(
            from_version=dict(type="str", required=True),
            to_version=dict(type="str", required=True),
            wheel=dict(type="path", required=True),
            current_wheel=dict(type="path", required=True),
            sources=dict(type="str", default=""),
            active_set=dict(type="dict", required=True),
            target_set=dict(type="dict", required=True),
            current_args_check=dict(type="dict", required=True),
            target_args_check=dict(type="dict", required=True),
            configured_fields=dict(type="list", elements="str", default=[]),
            environment=dict(type="dict", default={}),
            install_sources=dict(type="list", elements="dict", default=[]),
            expected_torch_version=dict(type="str", default=""),
            expected_torch_cuda=dict(type="str", default=""),
            deviations=dict(type="list", elements="str", default=[]),
            report_dir=dict(type="path", required=True),
        ),
        supports_check_mode=True,
    )
    params = module.params
    try:
        report = build_report(params)
    except (OSError, zipfile.BadZipFile, ValueError) as exc:
        module.fail_json(msg="cannot read the wheels for the upgrade report: %s" % exc)
    stem = os.path.join(params["report_dir"], "sglang-%s-to-%s" % (params["from_version"], params["to_version"]))
    markdown_path, json_path = stem + ".md", stem + ".json"
    changed = True
    if not module.check_mode:
        os.makedirs(params["report_dir"], exist_ok=True)
        changed = write_if_different(markdown_path, render_markdown(report))
        changed = write_if_different(json_path, json.dumps(report, indent=2, sort_keys=True, default=str) + "\n") or changed
    module.exit_json(changed=changed, report=report, refusals=report["refusals"], warnings_of_report=report["warnings"],
                     markdown_path=markdown_path, json_path=json_path)


if __name__ == "__main__":
    main()
