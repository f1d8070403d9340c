"""Role argument specs, checked ahead of the role (roles/sglang/tasks/check_role_arguments.yml)."""

from ansible.errors import AnsibleFilterError


def argument_spec_without_defaults(options):
    """The options of an argument spec with their `default` keys removed.

    A role's variables get their values from its defaults/main.yml when the role runs. Checked
    earlier, in another role's scope, a variable the inventory leaves out is not an error, and its
    spec default (often a template over the role's other variables) must not be type-checked
    there: the role checks its own arguments, defaults included, when it starts.
    """
    if not isinstance(options, dict):
        raise AnsibleFilterError(f"argument_spec_without_defaults: expected the options mapping, got {type(options).__name__}")
    return {name: {key: value for key, value in (option or {}).items() if key != "default"}
            for name, option in options.items()}


class FilterModule:
    """sglang-canon's argument spec filter."""

    def filters(self):
        return {"argument_spec_without_defaults": argument_spec_without_defaults}
