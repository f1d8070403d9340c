#!/usr/bin/python
"""Ansible module: a password for an exporter-toolkit web API (Alertmanager's), made on the host."""

from __future__ import annotations

import grp
import json
import os
import secrets
import warnings

from ansible.module_utils.basic import AnsibleModule

with warnings.catch_warnings():  # deprecated since Python 3.11; Debian 12's python3 has it
    warnings.simplefilter("ignore", DeprecationWarning)
    import crypt  # pylint: disable=deprecated-module

DOCUMENTATION = r"""
---
module: sglang_monitoring_api_password
short_description: Make a password for an exporter-toolkit web API and the web configuration that asks for it
description:
  - Alertmanager (and every program built on Prometheus's exporter-toolkit) answers its API to anyone who
    reaches its port, its configuration with the receivers' URLs and tokens included. With
    C(--web.config.file) naming O(web_config), it asks for basic auth.
  - The password is made on the host (32 random bytes, URL-safe text) and written to O(password_file) once;
    it never leaves the host, and this module never returns it.
  - O(web_config) holds its bcrypt hash for O(user) (exporter-toolkit's C(basic_auth_users)), written as
    JSON (valid YAML). A hash that still matches the password is kept, so a converged host reports no change.
  - Both files are owned by root and O(group), mode 0640; a wrong owner or mode is put right.
version_added: "0.1.0"
author: sglang-canon
options:
  password_file:
    description: Where the password is kept (read by the clients, e.g. Prometheus's C(password_file)).
    type: path
    required: true
  web_config:
    description: The web configuration file the program reads (C(--web.config.file)).
    type: path
    required: true
  user:
    description: The basic auth user name.
    type: str
    required: true
  group:
    description: The group that may read both files (the program's and its clients').
    type: str
    required: true
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
notes:
  - Needs Python's crypt module with bcrypt (Debian 12's python3 and libcrypt1 have both).
"""

EXAMPLES = r"""
- name: Make Alertmanager's API password
  sglang_monitoring_api_password:
    password_file: /etc/prometheus/alertmanager-api.password
    web_config: /etc/prometheus/alertmanager-web.yml
    user: prometheus
    group: prometheus
"""

RETURN = r"""
changed_items:
  description: What was (or in check mode would be) written or put right; never the password.
  returned: always
  type: list
  elements: str
  sample: [password made, web configuration written]
"""

MODE = 0o640
# bcrypt cost 10: about 50 ms per check, and exporter-toolkit caches a good answer.
BCRYPT_ROUNDS = 2**10


def _read(path):
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except FileNotFoundError:
        return None


def _hash_matches(web_config_text, user, password):
    try:
        stored = json.loads(web_config_text)["basic_auth_users"][user]
    except (TypeError, ValueError, KeyError):
        return False
    return isinstance(stored, str) and stored.startswith("$2") and crypt.crypt(password, stored) == stored


def _write(path, text, gid):
    """Write text to path atomically, root:gid 0640 from the start."""
    temporary = f"{path}.sglang-tmp"
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, MODE)
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        os.fchown(handle.fileno(), 0, gid)
        os.fchmod(handle.fileno(), MODE)
        handle.write(text)
    os.replace(temporary, path)


def main():
    module = AnsibleModule(
        argument_spec={
            "password_file": {"type": "path", "required": True},
            "web_config": {"type": "path", "required": True},
            "user": {"type": "str", "required": True},
            "group": {"type": "str", "required": True},
        },
        supports_check_mode=True,
    )
    password_file, web_config, user = module.params["password_file"], module.params["web_config"], module.params["user"]
    try:
        gid = grp.getgrnam(module.params["group"]).gr_gid
    except KeyError:
        module.fail_json(msg=f"group: {module.params['group']!r} does not exist on the host (its package makes it)")

    changed_items = []
    password = (_read(password_file) or "").strip()
    if not password:
        password = secrets.token_urlsafe(32)
        changed_items.append("password made")
        if not module.check_mode:
            _write(password_file, password + "\n", gid)
    web_text = _read(web_config)
    if web_text is None or not _hash_matches(web_text, user, password):
        changed_items.append("web configuration written")
        if not module.check_mode:
            hashed = crypt.crypt(password, crypt.mksalt(crypt.METHOD_BLOWFISH, rounds=BCRYPT_ROUNDS))
            _write(web_config, json.dumps({"basic_auth_users": {user: hashed}}, indent=2) + "\n", gid)
    for path in (password_file, web_config):
        if not os.path.exists(path):
            continue  # check mode: it would be written with the right owner and mode
        status = os.stat(path)
        if (status.st_uid, status.st_gid, status.st_mode & 0o7777) != (0, gid, MODE):
            changed_items.append(f"{path} owner or mode put right")
            if not module.check_mode:
                os.chown(path, 0, gid)
                os.chmod(path, MODE)
    module.exit_json(changed=bool(changed_items), changed_items=changed_items)


if __name__ == "__main__":
    main()
