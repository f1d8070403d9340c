"""Lookup: another role's defaults, found by the role's name in roles_path, as a play finds the role."""

from __future__ import annotations

import os

import yaml
from ansible import constants as C
from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase

DOCUMENTATION = r"""
name: sglang_role_defaults
short_description: A role's defaults/main.yml, found by the role's name in roles_path
description:
  - Each term names a role; returns its C(defaults/main.yml) as a dictionary, the values as text
    (a default that is a template stays that text and is never rendered here, since it refers to
    the other role's variables, which the calling play need not have).
  - The role is found in the configured C(roles_path) (C(ANSIBLE_ROLES_PATH), ansible.cfg's
    C(roles_path)), the way a play resolves C(roles:), not from the calling role's own folder.
  - For a role that documents values in force on hosts that run another role, e.g. production_doc
    documenting the gateways' and monitors' settings their inventory leaves at the default.
options:
  _terms:
    description: The roles' names.
    type: list
    elements: str
    required: true
"""

EXAMPLES = r"""
- name: The monitoring role's defaults
  ansible.builtin.debug:
    msg: "{{ lookup('sglang_role_defaults', 'sglang_monitoring').sglang_monitoring_scrape_interval }}"
"""

RETURN = r"""
_raw:
  description: One dictionary per role, its variables with their defaults.
  type: list
  elements: dict
"""


def defaults_file(role, roles_path):
    """The path of the role's defaults/main.yml in the first folder of roles_path that holds the role."""
    for folder in roles_path:
        path = os.path.join(folder, role, "defaults", "main.yml")
        if os.path.isfile(path):
            return path
    raise AnsibleLookupError(f"role {role!r}: no defaults/main.yml in roles_path {os.pathsep.join(roles_path)}")


def read_defaults(path):
    """The file's variables, plain YAML: no value is marked as a template Ansible would render."""
    with open(path, encoding="utf-8") as handle:
        return yaml.safe_load(handle) or {}


class LookupModule(LookupBase):
    """sglang-canon's lookup of another role's defaults."""

    def run(self, terms, variables=None, **kwargs):
        self.set_options(var_options=variables, direct=kwargs)
        return [read_defaults(defaults_file(str(role), C.DEFAULT_ROLES_PATH)) for role in terms]
