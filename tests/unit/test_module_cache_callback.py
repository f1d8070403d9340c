"""sglang_module_cache: payloads are kept between runs under a digest of their sources, never reused across an edit."""

import os
import time
from pathlib import Path

import pytest
from ansible import constants as C
from ansible.plugins.loader import callback_loader

REPO = Path(__file__).resolve().parents[2]
CALLBACKS = REPO / "callback_plugins"


@pytest.fixture
def loaded(monkeypatch, tmp_path):
    """The callback as Ansible loads it, with a kept-payload folder and a run temporary folder of the test's own."""
    kept_parent = tmp_path / "kept"
    run_tmp = tmp_path / "ansible-local-run"
    run_tmp.mkdir()
    monkeypatch.setenv("SGLANG_MODULE_CACHE_PATH", str(kept_parent))
    monkeypatch.setattr(C, "DEFAULT_LOCAL_TMP", str(run_tmp))
    callback_loader.add_directory(str(CALLBACKS))

    def make(enabled=None):
        if enabled is None:
            monkeypatch.delenv("SGLANG_MODULE_CACHE", raising=False)
        else:
            monkeypatch.setenv("SGLANG_MODULE_CACHE", enabled)
        plugin = callback_loader.get("sglang_module_cache")
        plugin.set_options()
        return plugin

    return make, kept_parent, run_tmp / "ansiballz_cache"


def module_of(plugin):
    return __import__(type(plugin).__module__, fromlist=["sources_digest"])


def test_a_run_keeps_its_payloads_and_the_next_run_starts_with_them(loaded, tmp_path):
    make, kept_parent, run_cache = loaded
    first = make()
    first.v2_playbook_on_start(playbook=None)
    assert run_cache.is_dir() and not list(run_cache.iterdir())
    # What module_common leaves in the run's folder: a payload, its lock, a half-written file.
    (run_cache / "ansible.modules.stat-ZIP_DEFLATED-none").write_bytes(b"payload")
    (run_cache / "ansible.modules.stat-ZIP_DEFLATED-none.lock").write_bytes(b"")
    (run_cache / "ansible.modules.file-ZIP_DEFLATED-none-part").write_bytes(b"half")
    first.v2_playbook_on_stats(stats=None)

    (kept,) = kept_parent.iterdir()
    assert sorted(path.name for path in kept.iterdir()) == ["ansible.modules.stat-ZIP_DEFLATED-none"]
    assert oct(kept.stat().st_mode & 0o777) == "0o700"

    for path in run_cache.iterdir():  # the next run has a new, empty temporary folder
        path.unlink()
    make().v2_playbook_on_start(playbook=None)
    assert (run_cache / "ansible.modules.stat-ZIP_DEFLATED-none").read_bytes() == b"payload"


def test_any_edit_of_a_module_or_module_util_changes_the_digest(loaded, tmp_path):
    make, _, _ = loaded
    cache = module_of(make())
    library, utils = tmp_path / "library", tmp_path / "module_utils"
    library.mkdir()
    utils.mkdir()
    (library / "probe.py").write_text("print(1)\n")
    (utils / "helper.py").write_text("X = 1\n")
    roots = [str(library), str(utils)]
    before = cache.sources_digest(roots)

    (utils / "helper.py").write_text("X = 2\n")
    edited_util = cache.sources_digest(roots)
    (library / "new.py").write_text("")
    added_module = cache.sources_digest(roots)
    assert len({before, edited_util, added_module}) == 3

    # Byte code is not a source: compiling a module changes nothing.
    (utils / "__pycache__").mkdir()
    (utils / "__pycache__" / "helper.cpython-311.pyc").write_bytes(b"\0")
    assert cache.sources_digest(roots) == added_module
    # Nor does another ansible-core or Python give the same folder.
    assert cache.sources_digest(roots, extra=("2.19.14",)) != cache.sources_digest(roots, extra=("2.20.0",))


def test_the_digest_covers_ansible_core_and_the_configured_paths(loaded):
    make, _, _ = loaded
    roots = module_of(make()).source_roots()
    assert str(REPO / "library") in roots and str(REPO / "module_utils") in roots
    assert any(root.endswith(os.path.join("ansible", "modules")) for root in roots)
    assert any(root.endswith(os.path.join("ansible", "module_utils")) for root in roots)


def test_folders_of_other_digests_go_when_unused_for_max_age(loaded):
    make, kept_parent, _ = loaded
    cache = module_of(make())
    for name in ("current", "old", "recent"):
        (kept_parent / name).mkdir(parents=True)
    now = time.time()
    os.utime(kept_parent / "old", (now - 8 * 86400, now - 8 * 86400))
    os.utime(kept_parent / "current", (now - 30 * 86400, now - 30 * 86400))
    cache.remove_stale(str(kept_parent), "current", 7 * 86400, now)
    assert sorted(path.name for path in kept_parent.iterdir()) == ["current", "recent"]


def test_sglang_module_cache_0_keeps_nothing(loaded):
    make, kept_parent, run_cache = loaded
    plugin = make("0")
    plugin.v2_playbook_on_start(playbook=None)
    plugin.v2_playbook_on_stats(stats=None)
    assert not kept_parent.exists() and not run_cache.exists()


def test_a_folder_it_cannot_make_leaves_the_run_alone(loaded, monkeypatch, tmp_path):
    make, _, run_cache = loaded
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("SGLANG_MODULE_CACHE_PATH", str(blocker / "kept"))
    plugin = make()
    plugin.v2_playbook_on_start(playbook=None)  # no exception: ansible-core builds the payloads itself
    run_cache.mkdir(exist_ok=True)
    (run_cache / "ansible.modules.stat-ZIP_DEFLATED-none").write_bytes(b"payload")
    plugin.v2_playbook_on_stats(stats=None)
    assert not (blocker.parent / "kept").exists()
