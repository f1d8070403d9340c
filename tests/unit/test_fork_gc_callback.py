"""sglang_fork_gc: the heap is frozen while tasks are dispatched, and released at the end of the run."""

import gc
from pathlib import Path

import pytest
from ansible.plugins.loader import callback_loader

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def callback(monkeypatch):
    def make(env_value=None):
        if env_value is None:
            monkeypatch.delenv("SGLANG_FORK_GC", raising=False)
        else:
            monkeypatch.setenv("SGLANG_FORK_GC", env_value)
        callback_loader.add_directory(str(REPO / "callback_plugins"))
        plugin = callback_loader.get("sglang_fork_gc")
        plugin.set_options()
        return plugin

    yield make
    gc.unfreeze()


def test_tasks_and_handlers_freeze_and_the_end_releases(callback):
    plugin = callback()
    plugin.v2_playbook_on_task_start(task=None, is_conditional=False)
    frozen = gc.get_freeze_count()
    assert frozen > 0
    plugin.v2_playbook_on_handler_task_start(task=None)
    assert gc.get_freeze_count() >= frozen
    plugin.v2_playbook_on_task_start(task=None, is_conditional=False)
    assert gc.get_freeze_count() >= frozen
    plugin.v2_playbook_on_stats(stats=None)
    assert gc.get_freeze_count() == 0


def test_sglang_fork_gc_0_leaves_the_collector_alone(callback):
    plugin = callback("0")
    plugin.v2_playbook_on_task_start(task=None, is_conditional=False)
    plugin.v2_playbook_on_handler_task_start(task=None)
    assert gc.get_freeze_count() == 0
