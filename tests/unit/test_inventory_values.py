"""The one place control characters in inventory values are found, and type-naming for messages."""


import pytest
from project_modules import REPO


@pytest.fixture(scope="module")
def inventory_values(project_module):
    return project_module("filter_plugins/inventory_values.py")


@pytest.fixture(scope="module")
def control_characters(inventory_values):
    return inventory_values.control_characters


@pytest.fixture(scope="module")
def value_with_type(inventory_values):
    return inventory_values.value_with_type


@pytest.mark.parametrize(
    "char, shown",
    [("\n", "\\n"), ("\r", "\\r"), ("\0", "\\0"), ("\t", "\\t"), ("\x1b", "\\x1b"), ("\x7f", "\\x7f"), ("\x1f", "\\x1f")],
)
def test_each_control_character_is_named_with_its_position(control_characters, char, shown):
    found = control_characters({"sglang_service_user": f"sg{char}lang"})
    assert found == [f"sglang_service_user: control character {shown} at position 3"]


def test_printable_text_unicode_and_non_strings_pass(control_characters):
    assert control_characters({
        "a": "char-nvidia-uvm rw", "b": "Blackwell — 8 × GPU", "c": 30000, "d": 0.88, "e": True, "f": None,
        "g": ["x y", {"k": "v"}], "h": "", "i": "~@privileged $HOME %n",
    }) == []


def test_nested_mappings_and_lists_name_the_path_to_the_value(control_characters):
    found = control_characters({
        "sglang_server_args": {"model_path": "/m", "served_model_name": "m\nExecStart=/bin/sh"},
        "sglang_service_device_allow": ["char-nvidia-frontend rw", "char-nvidia-uvm rw\nExecStartPre=+/bin/sh"],
        "nccl": {"outer": [{"inner": "ok"}, {"inner": "bad\r"}]},
    })
    assert found == [
        "sglang_server_args.served_model_name: control character \\n at position 2",
        "sglang_service_device_allow[1]: control character \\n at position 19",
        "nccl.outer[1].inner: control character \\r at position 4",
    ]


def test_a_mapping_key_is_checked_too(control_characters):
    found = control_characters({"sglang_service_environment": {"GOOD": "1", "BAD\nUser=root": "1"}})
    assert found == ['sglang_service_environment key "BAD\\nUser=root": control character \\n at position 4']


def test_only_the_first_control_character_of_each_string_is_reported_and_no_value_is_echoed(control_characters):
    secret = "hf_secret\n\n\0tail"
    found = control_characters({"sglang_service_secret_environment": {"HF_TOKEN": secret}})
    assert found == ["sglang_service_secret_environment.HF_TOKEN: control character \\n at position 10"]
    assert "hf_secret" not in found[0]


def test_something_that_is_not_a_mapping_is_refused(control_characters):
    with pytest.raises(TypeError, match="mapping of variable names"):
        control_characters(["sglang_service_user"])


@pytest.mark.parametrize(
    "value, described",
    [("30001", '"30001" (a string)'), (30001, "30001 (an integer)"), (1.5, "1.5 (a float)"),
     (True, "True (a boolean)"), (None, "None (null)"), ([1, 2], "[1, 2] (a list)"), ({"a": 1}, "{'a': 1} (a mapping)")],
)
def test_value_with_type_names_the_type(value_with_type, value, described):
    assert value_with_type(value) == described


def test_role_options_names_every_option_of_every_entry_point(inventory_values, tmp_path):
    for role, text in {
        "one": "argument_specs:\n  main:\n    options:\n      one_a: {type: str}\n      shared: {type: str}\n",
        "two": "argument_specs:\n  main:\n    options:\n      shared: {type: str}\n  other:\n    options:\n      two_b: {type: int}\n",
        "no_spec": None,
    }.items():
        (tmp_path / role / "meta").mkdir(parents=True)
        if text:
            (tmp_path / role / "meta" / "argument_specs.yml").write_text(text)
    assert inventory_values.role_options(tmp_path) == ["one_a", "shared", "two_b"]


def test_role_options_of_this_repository_include_every_role(inventory_values):
    names = inventory_values.role_options(REPO / "roles")
    assert {"sglang_service_device_allow", "production_doc_path", "nccl_tuning_settings", "sglang_config_dir"} <= set(names)
