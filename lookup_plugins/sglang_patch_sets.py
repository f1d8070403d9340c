"""Lookup: resolve sglang_patches' patch sets on the controller, with their patches' text and every refusal."""

from __future__ import annotations

import os

import yaml
from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase

DOCUMENTATION = r"""
name: sglang_patch_sets
short_description: Resolve patch sets on the controller, their patches in order with their text
description:
  - Each term is a patch set, as C(sglang_patches_sets) of the sglang_patches role names it. An
    absolute path is used as it is, a relative path with a C(/) is under O(playbook_dir), and a
    bare name is a set shipped in the C(files) folder of O(role_path).
  - A set's C(set.yml) says which C(package) and C(version) it was made for and, optionally, the
    order of its C(patches). Without it the directory name C(PACKAGE-VERSION) says what it was
    made for, and its C(*.patch) files apply sorted by name.
  - Returns one dictionary with the resolved sets, the patches in the order they apply (with their
    text), and a message for each reason to refuse the sets. The
    role refuses the run on any message, before anything on the node changes.
  - One task on the controller instead of a loop of tasks per set and per patch.
options:
  _terms:
    description: The patch sets, in the order they apply.
    type: list
    elements: str
    required: true
  role_path:
    description: The sglang_patches role's folder (the shipped sets are under its C(files/)).
    type: path
    required: true
  playbook_dir:
    description: The folder a relative set path is under.
    type: path
    required: true
  package:
    description: The Python package every set must be made for.
    type: str
    required: true
  version:
    description: The version of O(package) every set must be made for.
    type: str
    required: true
"""

EXAMPLES = r"""
- name: Resolve the patch sets
  ansible.builtin.set_fact:
    sets: >-
      {{ lookup('sglang_patch_sets', *sglang_patches_sets, role_path=role_path, playbook_dir=playbook_dir,
                package='sglang', version='0.5.9') }}
"""

RETURN = r"""
_raw:
  description: One dictionary with the keys C(sets), C(patches) and C(errors).
  type: list
  elements: dict
  contains:
    sets:
      description: >-
        Each set, with C(name), C(dir), C(exists), C(package), C(version), C(patches) (file names, in order) and
        C(obsolete) (set.yml's patch file -> C(file) and C(contains): how to recognise upstream's own fix).
      type: list
    patches:
      description: Each patch in the order it applies, with C(name) (SET/FILE) and C(content).
      type: list
    errors:
      description: Why the sets must be refused, one message each; empty when they may be applied.
      type: list
"""


def set_dir(term, role_path, playbook_dir):
    """Where a set named in sglang_patches_sets lives on the controller."""
    if os.path.isabs(term):
        return term
    if "/" in term:
        return os.path.join(playbook_dir, term)
    return os.path.join(role_path, "files", term)


def resolve_set(term, role_path, playbook_dir):
    """A set as the role records it: name, dir, exists, package, version, patches (file names in order)."""
    directory = set_dir(term, role_path, playbook_dir)
    name = os.path.basename(directory.rstrip("/"))
    meta_path = os.path.join(directory, "set.yml")
    if os.path.isfile(meta_path):
        with open(meta_path, encoding="utf-8") as handle:
            meta = yaml.safe_load(handle) or {}
    else:
        package, _, version = name.rpartition("-")
        meta = {"package": package, "version": version}
    patches = meta.get("patches")
    if patches is None:
        patches = sorted(entry for entry in os.listdir(directory) if entry.endswith(".patch")) if os.path.isdir(directory) else []
    return {
        "name": name,
        "dir": directory,
        "exists": os.path.isdir(directory),
        "package": str(meta.get("package", "")),
        "version": str(meta.get("version", "")),
        "patches": [str(patch) for patch in patches],
        # How the upgrade report recognises a patch that a later release makes obsolete (set.yml:
        # patch file -> {file, contains}: upstream's own fix); the role itself does not read it.
        "obsolete": meta.get("obsolete") or {},
    }


def set_errors(sets, package, version):
    """Every reason to refuse the sets, in the words the role has always used."""
    errors = []
    for one in sets:
        if not one["exists"]:
            why = "does not exist"
        elif not one["patches"]:
            why = "has no patches"
        elif one["package"] != package or one["version"] != version:
            why = f"was made for {one['package']} {one['version']} but this deployment runs {package} {version}"
        else:
            why = None
        if why:
            errors.append(f"sglang_patches_sets: patch set {one['name']} ({one['dir']}) {why}; nothing was changed.")
        elif missing := [patch for patch in one["patches"] if not os.path.isfile(os.path.join(one["dir"], patch))]:
            errors.extend(f"Patch set {one['name']} lists {patch}, which is not in {one['dir']}." for patch in missing)
    names = [one["name"] for one in sets]
    if len(set(names)) != len(names):
        errors.append(f"Patch set names must be unique: {', '.join(names)}")
    return errors


def patches_in_order(sets):
    """Each patch of the sets in the order they apply, named SET/FILE, with its text."""
    patches = []
    for one in sets:
        for patch in one["patches"]:
            with open(os.path.join(one["dir"], patch), encoding="utf-8", newline="") as handle:
                content = handle.read()
            patches.append({"name": f"{one['name']}/{patch}", "content": content})
    return patches


class LookupModule(LookupBase):
    """Returns [{sets, patches, errors}] for the patch sets given as terms."""

    def run(self, terms, variables=None, **kwargs):
        self.set_options(var_options=variables, direct=kwargs)
        try:
            sets = [resolve_set(str(term), self.get_option("role_path"), self.get_option("playbook_dir")) for term in terms]
        except (OSError, yaml.YAMLError) as error:
            raise AnsibleLookupError(f"sglang_patches_sets: cannot read a patch set: {error}") from error
        errors = set_errors(sets, self.get_option("package"), self.get_option("version"))
        patches = [] if errors else patches_in_order(sets)
        return [{"sets": sets, "patches": patches, "errors": errors}]
