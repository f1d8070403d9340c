"""callback_plugins/sglang_drift.py's lines for one changed result, on the shapes Ansible gives the
callback: a plain result, a module's own `drifted` list, a loop (one line per changed item, by its
label), and a loop whose output no_log hid."""

import pytest

TASK = "sglang_service : Write the server's unit and environment file"


@pytest.fixture(scope="module")
def drifted_items(project_module):
    return project_module("callback_plugins/sglang_drift.py").drifted_items


def test_a_plain_result_is_the_task_name(drifted_items):
    assert drifted_items("sglang_service : Enable the service", {"changed": True}) == ["sglang_service : Enable the service"]


def test_what_the_module_says_drifted_is_appended(drifted_items):
    res = {"changed": True, "drifted": ["sglang/srt/environ.py"]}
    assert drifted_items("Apply", res) == ["Apply [drifted: sglang/srt/environ.py]"]


def test_a_loop_lists_each_changed_item_by_its_label(drifted_items):
    res = {"changed": True, "results": [
        {"changed": True, "item": {"path": "/etc/systemd/system/sglang.service"},
         "_ansible_item_label": "/etc/systemd/system/sglang.service"},
        {"changed": False, "item": {"path": "/etc/sglang/sglang.env"}, "_ansible_item_label": "/etc/sglang/sglang.env"},
        {"changed": True, "item": {"path": "/etc/sglang/x.env"}, "_ansible_item_label": "/etc/sglang/x.env"},
    ]}
    assert drifted_items(TASK, res) == [f"{TASK} (/etc/systemd/system/sglang.service)", f"{TASK} (/etc/sglang/x.env)"]


def test_a_loop_item_without_a_label_is_named_by_its_key_or_value(drifted_items):
    res = {"changed": True, "results": [{"changed": True, "item": {"key": "NCCL_ALGO", "value": "Ring"}},
                                        {"changed": True, "item": "b", "drifted": ["mode"]}]}
    assert drifted_items("T", res) == ["T (NCCL_ALGO)", "T (b) [drifted: mode]"]


def test_a_result_no_log_hid_is_the_task_name_alone(drifted_items):
    hidden = {"changed": True, "censored": "the output has been hidden due to the fact that 'no_log: true' was specified"}
    assert drifted_items("sglang_service : Write the server's secrets file", hidden) == [
        "sglang_service : Write the server's secrets file"]
