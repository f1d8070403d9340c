"""Callback: how long each task took, to see where a run (or a ``--tags`` slice) spends its time.

ansible-core ships no task timer (``profile_tasks`` lives in the ansible.posix collection, which
this project does not install), so this is a small one of our own. It is listed in
ansible.cfg's ``callbacks_enabled`` but prints nothing unless asked to:
``SGLANG_TASK_TIMER=1 ansible-playbook site.yml --tags nccl_tuning``.
"""

from __future__ import annotations

import time

from ansible.plugins.callback import CallbackBase

DOCUMENTATION = r"""
name: sglang_task_timer
type: aggregate
short_description: Print the slowest tasks of a run when asked to
description:
  - Inert unless O(enabled) is true, so an ordinary run prints nothing more and pays nothing for it.
  - When enabled, a task's time runs from its start to the start of the next task (or the end of
    the play), over all hosts at once, as ansible.posix's profile_tasks measures it.
  - At the end of the run it prints the O(top) slowest tasks, slowest first, and the total.
requirements:
  - enabled in ansible.cfg (callbacks_enabled)
options:
  enabled:
    description: Time the tasks and print the table at the end of the run.
    type: bool
    default: false
    env:
      - name: SGLANG_TASK_TIMER
    ini:
      - section: callback_sglang_task_timer
        key: enabled
  top:
    description: How many of the slowest tasks to print.
    type: int
    default: 20
    env:
      - name: SGLANG_TASK_TIMER_TOP
    ini:
      - section: callback_sglang_task_timer
        key: top
"""


class CallbackModule(CallbackBase):
    """Times tasks from one task start to the next; prints the slowest at the end."""

    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "sglang_task_timer"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self):
        super().__init__()
        self._enabled = False
        self._top = 20
        self._durations = {}  # "role : task" -> seconds, summed when a task runs again (loops of plays, handlers)
        self._current = None  # (name, start time) of the task running now

    def set_options(self, task_keys=None, var_options=None, direct=None):
        super().set_options(task_keys=task_keys, var_options=var_options, direct=direct)
        self._enabled = self.get_option("enabled")
        self._top = self.get_option("top")

    def _start(self, name):
        self._stop()
        self._current = (name, time.monotonic())

    def _stop(self):
        if self._current is not None:
            name, started = self._current
            self._durations[name] = self._durations.get(name, 0.0) + time.monotonic() - started
            self._current = None

    def v2_playbook_on_task_start(self, task, is_conditional):
        if self._enabled:
            self._start(task.get_name())

    def v2_playbook_on_handler_task_start(self, task):
        if self._enabled:
            self._start(task.get_name())

    def v2_playbook_on_play_start(self, play):
        if self._enabled:
            self._stop()

    def v2_playbook_on_stats(self, stats):
        if not self._enabled:
            return
        self._stop()
        slowest = sorted(self._durations.items(), key=lambda item: item[1], reverse=True)[: self._top]
        total = sum(self._durations.values())
        self._display.banner(f"TASK TIMES (slowest {len(slowest)} of {len(self._durations)})")
        for name, seconds in slowest:
            self._display.display(f"{seconds:8.2f}s  {name}")
        self._display.display(f"{total:8.2f}s  total over {len(self._durations)} tasks")
