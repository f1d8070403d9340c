"""Callback: collect what a check-mode run would change, for playbooks/drift.yml's report.

In plays that set ``sglang_drift_scan: true`` (site.yml's plays do under drift.yml, which runs
them in check mode), every task result that reports ``changed`` is a drifted item. The callback
records it as the host fact ``sglang_drift_items`` so drift.yml's last play can list the items
and fail, which gives drift.yml its non-zero exit status. Other plays are left alone.

It only reports: which nodes converge, and in what batches, is site.yml's (its converge play
targets every node with ``serial``); no play decides anything from ``sglang_drift_items``.
"""

from __future__ import annotations

from ansible.plugins.callback import CallbackBase
from ansible.template import Templar

DOCUMENTATION = r"""
name: sglang_drift
type: aggregate
short_description: Record would-be changes of a drift scan as the host fact sglang_drift_items
description:
  - Active only in plays whose variables set C(sglang_drift_scan=true) (templated).
  - Each changed task result is appended to the host's C(sglang_drift_items) fact,
    labelled with its role and task; a loop's result gives one entry per changed item, labelled
    with the item's label too.
  - The fact is for playbooks/drift.yml's report only; no play decides which nodes converge from it.
requirements:
  - enabled in ansible.cfg (callbacks_enabled)
"""


class CallbackModule(CallbackBase):
    """Turns changed results of a drift-scan play into a host fact."""

    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "sglang_drift"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self):
        super().__init__()
        self._variable_manager = None
        self._scanning = False
        self._items = {}

    def v2_playbook_on_play_start(self, play):
        self._variable_manager = play.get_variable_manager()
        flag = play.vars.get("sglang_drift_scan", False)
        if isinstance(flag, str):  # e.g. "{{ sglang_drift_only | default(false) }}"
            templar = Templar(loader=play._loader, variables=self._variable_manager.get_vars(play=play))  # pylint: disable=protected-access
            flag = templar.template(flag)
        self._scanning = flag is True or str(flag).lower() == "true"

    def v2_runner_on_ok(self, result):
        if self._scanning and result._result.get("changed"):  # pylint: disable=protected-access
            self._record(result)

    def _record(self, result):
        task = result._task  # pylint: disable=protected-access
        host = result._host.get_name()  # pylint: disable=protected-access
        name = task.get_name()  # already "role : task" for role tasks
        items = self._items.setdefault(host, [])
        items.extend(drifted_items(name, result._result))  # pylint: disable=protected-access
        self._variable_manager.set_nonpersistent_facts(host, {"sglang_drift_items": list(items)})


def drifted_items(name, res):
    """The report's lines for one changed task result: the task's name, and for a loop each changed
    item by its label (the file a loop over files would rewrite), each with what the module says
    drifted. A result whose output no_log hid is the task's name alone."""
    loop = [item for item in res.get("results") or [] if isinstance(item, dict)]
    if loop:
        return [_label(name, item.get("_ansible_item_label", item.get("item")), item.get("drifted"))
                for item in loop if item.get("changed")] or [name]
    return [_label(name, res.get("item"), res.get("drifted"))]


def _label(name, item, drifted):
    if item is not None:
        name += f" ({item.get('key', item) if isinstance(item, dict) else item})"
    if drifted:
        name += f" [drifted: {', '.join(map(str, drifted))}]"
    return name
