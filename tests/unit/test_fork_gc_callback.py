"""sglang_fork_gc keeps its promise: a worker forked after a task start does not copy the
controller's heap when its garbage collector runs (unless SGLANG_FORK_GC=0), and garbage frozen
during the run is freed at its end."""

import gc
import os
import weakref

import pytest
from ansible.plugins.loader import callback_loader
from project_modules import REPO

# Enough small containers (about 40 MB) that copying them stands far above a fork's own noise.
HEAP_OBJECTS = 400_000


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


def _private_dirty_kib():
    with open("/proc/self/smaps_rollup", encoding="ascii") as rollup:
        return sum(int(line.split()[1]) for line in rollup if line.startswith("Private_Dirty:"))


def _copied_by_a_worker_collecting(plugin):
    """KiB of the parent's heap a forked worker copies when its collector runs, as a task start
    with the callback leaves it: what ansible-playbook's worker forks pay per task."""
    heap = [[index] for index in range(HEAP_OBJECTS)]
    plugin.v2_playbook_on_task_start(task=None, is_conditional=False)
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:  # the worker: collect, say how much it copied, leave without cleanup
        os.close(reader)
        before = _private_dirty_kib()
        gc.collect()
        os.write(writer, str(_private_dirty_kib() - before).encode())
        os._exit(0)  # pylint: disable=protected-access
    os.close(writer)
    with os.fdopen(reader) as answer:
        copied = int(answer.read())
    os.waitpid(pid, 0)
    plugin.v2_playbook_on_stats(stats=None)
    del heap
    return copied


def test_a_forked_worker_collects_without_copying_the_heap(callback):
    frozen = _copied_by_a_worker_collecting(callback())
    unfrozen = _copied_by_a_worker_collecting(callback("0"))
    # Each of the 400k lists has its collector header written when the worker's GC scans it
    assert unfrozen > 8 * 1024, f"the check cannot tell: a worker without the callback copied only {unfrozen} KiB"
    assert frozen < unfrozen / 4, f"with the callback a worker copied {frozen} KiB, without it {unfrozen} KiB"


class _Cycle:
    """Garbage only the cyclic collector frees."""

    def __init__(self):
        self.me = self


def test_garbage_frozen_during_the_run_is_freed_at_its_end(callback):
    plugin = callback()
    garbage = _Cycle()
    freed = []
    weakref.finalize(garbage, freed.append, True)
    del garbage
    plugin.v2_playbook_on_task_start(task=None, is_conditional=False)
    gc.collect()
    assert not freed, "frozen garbage was collected during the run"
    plugin.v2_playbook_on_stats(stats=None)
    gc.collect()
    assert freed, "the end of the run did not release the frozen garbage"


def test_sglang_fork_gc_0_leaves_garbage_to_the_collector(callback):
    plugin = callback("0")
    garbage = _Cycle()
    freed = []
    weakref.finalize(garbage, freed.append, True)
    del garbage
    plugin.v2_playbook_on_task_start(task=None, is_conditional=False)
    plugin.v2_playbook_on_handler_task_start(task=None)
    gc.collect()
    assert freed
