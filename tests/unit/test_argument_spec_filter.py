"""argument_spec_without_defaults: the server-facing roles' specs, checked ahead of the roles."""


import pytest
import yaml
from ansible.errors import AnsibleFilterError
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from project_modules import REPO


@pytest.fixture(scope="module")
def argument_specs(project_module):
    return project_module("filter_plugins/argument_specs.py")


def _options(role):
    return yaml.safe_load((REPO / "roles" / role / "meta" / "argument_specs.yml").read_text())["argument_specs"]["main"]["options"]


def test_spec_defaults_out_of_the_roles_scope_would_fail_the_check():
    # Why the filter exists: sglang_service_health_timeout's default is a template (an int once
    # templated in the role), which the validator cannot convert outside the role.
    assert ArgumentSpecValidator(_options("sglang_service")).validate({}).error_messages


@pytest.mark.parametrize("role", ["sglang_patches", "nccl_tuning", "sglang_service", "production_doc"])
def test_a_role_left_at_its_defaults_passes(role, argument_specs):
    checked = argument_specs.argument_spec_without_defaults(_options(role))
    assert not any("default" in option for option in checked.values())
    assert ArgumentSpecValidator(checked).validate({}).error_messages == []


def test_a_wrong_inventory_value_is_still_refused(argument_specs):
    checked = argument_specs.argument_spec_without_defaults(_options("sglang_service"))
    result = ArgumentSpecValidator(checked).validate({"sglang_service_health_timeout": "soon"})
    assert any("sglang_service_health_timeout" in message for message in result.error_messages)


def test_everything_but_the_default_is_kept(argument_specs):
    options = {"a": {"type": "int", "default": 1, "choices": [1, 2], "description": "x"}, "b": {"type": "str"}}
    assert argument_specs.argument_spec_without_defaults(options) == {
        "a": {"type": "int", "choices": [1, 2], "description": "x"}, "b": {"type": "str"}}
    assert options["a"]["default"] == 1  # the input is left as it was


def test_not_a_mapping_is_refused(argument_specs):
    with pytest.raises(AnsibleFilterError, match="expected the options mapping"):
        argument_specs.argument_spec_without_defaults(["a"])
