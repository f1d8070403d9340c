"""Fixtures of the SGLang 0.5.9 patch set's tests: the pristine wheel, the set and its result.

Shared by tests/unit/test_sglang_patch_set.py (the set on the wheel's bytes) and
tests/roles/test_sglang_patch_set_role.py (the role and torch code); a test module imports the
fixtures it uses by name. The wheel is the wheelhouse's (scripts/setup builds .cache/wheelhouse):
without it the tests fail, naming the fix, rather than skip.
"""

from __future__ import annotations

import zipfile

import ansible.module_utils
import pytest
import yaml

from parser_venv import REPO, SGLANG_VERSION, sglang_wheel

SET_DIR = REPO / "roles" / "sglang_patches" / "files" / f"sglang-{SGLANG_VERSION}"
VERSION = SGLANG_VERSION
WORKER = "sglang/srt/speculative/eagle_worker_v2.py"

if str(REPO / "module_utils") not in ansible.module_utils.__path__:
    ansible.module_utils.__path__.append(str(REPO / "module_utils"))

from ansible.module_utils import package_patch as pp  # noqa: E402  pylint: disable=wrong-import-position
from ansible.module_utils import unified_diff as ud  # noqa: E402  pylint: disable=wrong-import-position


@pytest.fixture(scope="session")
def wheel():
    return sglang_wheel()


@pytest.fixture(scope="session")
def set_meta():
    return yaml.safe_load((SET_DIR / "set.yml").read_text())


@pytest.fixture(scope="session")
def patches(set_meta):
    return [ud.parse_patch(name, (SET_DIR / name).read_bytes()) for name in set_meta["patches"]]


@pytest.fixture(scope="session")
def record(wheel):
    """RECORD of the wheel: path -> sha256 hex."""
    with zipfile.ZipFile(wheel) as zf:
        text = zf.read(f"sglang-{VERSION}.dist-info/RECORD").decode()
    out = {}
    for line in text.splitlines():
        path, digest, _ = line.rsplit(",", 2)
        out[path] = pp.record_hash_to_hex(digest)
    return out


@pytest.fixture(scope="session")
def pristine(wheel, patches):
    """Pristine bytes of every file the set touches, straight from the wheel."""
    with zipfile.ZipFile(wheel) as zf:
        return {path: zf.read(path) for path in ud.target_paths(patches)}


@pytest.fixture(scope="session")
def patched(pristine, patches):
    return {path: ud.apply_patches(data, path, patches) for path, data in pristine.items()}
