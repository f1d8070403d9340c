"""The shared role's checks for real: ansible-playbook on localhost, table-driven.

Every string-bearing option of every role's meta/argument_specs.yml (str, path, lists of str,
and mappings, whose values are strings) gets a newline, a carriage return or a NUL: one
inventory host per character, each carrying every poisoned variable at once, runs
roles/sglang/tasks/check_control_characters.yml. Each host must be refused with one line per
variable, naming it, the character and its position; a host with the roles' defaults passes.
Values of the wrong type are refused naming the type, and a service environment SGLang would
misread is refused naming the entry (roles/sglang/tasks/check_server_args.yml).
"""

import sys

import pytest
import yaml
from ansible_run import run_playbook
from project_modules import REPO

SPEC_FILES = sorted(REPO.glob("roles/*/meta/argument_specs.yml"))
CHECK_TASKS = REPO / "roles" / "sglang" / "tasks" / "check_control_characters.yml"
# Values the roles read from the node (facts), never from the inventory: the check leaves them out.
NODE_FACTS = {"sglang_check_mode", "sglang_stack", "production_doc_gpu_topology", "production_doc_stack",
              "production_doc_nccl"}
# PEM content (roles/sglang_gateway): a certificate and a key are lines.
PEM_DOCUMENTS = {"sglang_gateway_tls_cert", "sglang_gateway_tls_key"}
CHARACTERS = {"newline": ("\n", "\\n"), "carriage-return": ("\r", "\\r"), "nul": ("\0", "\\0")}

PLAYBOOK = """\
- name: The shared role's checks of inventory values
  hosts: all
  gather_facts: false
  tasks:
    - name: Refuse control characters
      ansible.builtin.import_role:
        name: sglang
        tasks_from: check_control_characters
    - name: Check the server arguments
      ansible.builtin.import_role:
        name: sglang
        tasks_from: check_server_args
"""
CANONICAL_ARGS = {"model_path": "/srv/models/target", "tp_size": 8, "port": 30000}
# host -> (sglang_server_args changes, the message expected)
WRONG_TYPES = {
    "port-a-string": ({"port": "30001"}, 'sglang_server_args.port: expected an integer in 1..65535, got "30001" (a string)'),
    "tp-size-a-float": ({"tp_size": 8.0}, "sglang_server_args.tp_size: expected a positive integer, got 8.0 (a float)"),
    "mem-fraction-a-string": (
        {"mem_fraction_static": "0.88"},
        'sglang_server_args.mem_fraction_static: expected a number in (0, 1), got "0.88" (a string)',
    ),
}

# host -> (sglang_service_environment, the message expected)
WRONG_ENVIRONMENTS = {
    "spec-v2-misspelt": (
        {"SGLANG_ENABLE_SPEC_V2": "on"},
        'sglang_service_environment.SGLANG_ENABLE_SPEC_V2: "on" is not one of',
    ),
    "environment-name-not-an-identifier": (
        {"NCCL-PROTO": "LL"},
        "sglang_service_environment: names must be shell identifiers, not NCCL-PROTO",
    ),
    "environment-value-not-a-string": (
        {"SGLANG_ENABLE_SPEC_V2": 1},
        "sglang_service_environment: values must be quoted strings",
    ),
}


def _string_options():
    """name -> poisoned value builder, for every option that can hold a string."""
    options = {}
    for spec_file in SPEC_FILES:
        for entry in yaml.safe_load(spec_file.read_text())["argument_specs"].values():
            for name, option in (entry.get("options") or {}).items():
                kind, elements = option.get("type"), option.get("elements")
                if name in NODE_FACTS:
                    continue
                if kind in ("str", "path"):
                    options[name] = lambda bad: f"ok{bad}ExecStartPre=+/bin/true"
                elif kind == "list" and elements in ("str", "path", "raw", None):
                    options[name] = lambda bad: ["ok", f"ok{bad}ExecStartPre=+/bin/true"]
                elif kind in ("dict", "raw"):
                    options[name] = lambda bad: {"KEY": f"ok{bad}ExecStartPre=+/bin/true"}
    return options


OPTIONS = _string_options()


def test_the_check_leaves_out_only_the_node_facts():
    tasks = yaml.safe_load(CHECK_TASKS.read_text())
    exempt = set(tasks[0]["vars"]["__sglang_node_facts"])
    assert exempt == NODE_FACTS
    # each exemption is a real option, so renaming one cannot leave a stale hole
    declared = {name for f in SPEC_FILES for e in yaml.safe_load(f.read_text())["argument_specs"].values()
                for name in (e.get("options") or {})}
    assert exempt <= declared
    assert len(OPTIONS) > 60, sorted(OPTIONS)  # every role's strings, not a handful


@pytest.fixture(name="outcome", scope="module")
def fixture_outcome(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("control_characters")
    hosts = {"defaults": {}}
    for host, (changes, _) in WRONG_TYPES.items():
        hosts[host] = {"sglang_server_args": {**CANONICAL_ARGS, **changes}}
    for host, (environment, _) in WRONG_ENVIRONMENTS.items():
        hosts[host] = {"sglang_service_environment": environment}
    for case, (char, _) in CHARACTERS.items():
        hosts[case] = {name: poison(char) for name, poison in OPTIONS.items()}
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(yaml.safe_dump({"all": {
        "vars": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable},
        "hosts": hosts,
    }}), encoding="utf-8")
    playbook = tmp_path / "check.yml"
    playbook.write_text(PLAYBOOK, encoding="utf-8")
    result = run_playbook(playbook, inventory, testnode_vars=False)
    events, stdout = result.events, result.stdout
    failed = {e["event_data"]["host"]: str(e["event_data"]["res"].get("msg", ""))
              for e in events if e.get("event") == "runner_on_failed"}
    return failed, stdout


def test_the_defaults_pass(outcome):
    failed, stdout = outcome
    assert "defaults" not in failed, failed.get("defaults") or stdout[-3000:]


@pytest.mark.parametrize("case", list(CHARACTERS))
def test_every_string_variable_is_refused_naming_it_the_character_and_its_position(outcome, case):
    failed, stdout = outcome
    assert case in failed, stdout[-3000:]
    _, shown = CHARACTERS[case]
    lines = failed[case].split("; ")
    missing = []
    for name in OPTIONS:
        if case == "newline" and name in PEM_DOCUMENTS:
            continue  # lines are the PEM format; \r and \0 are still refused in them
        wanted = [line for line in lines if line.split(":")[0] in (name, f"{name}[1]", f"{name}.KEY")]
        if not wanted or f"control character {shown} at position 3" not in wanted[0]:
            missing.append(name)
    assert not missing, f"not refused by name: {missing}\n{failed[case][:3000]}"
    assert "ExecStartPre" not in failed[case], "the refusal echoes the value"


@pytest.mark.parametrize("host", list(WRONG_TYPES))
def test_a_value_of_the_wrong_type_is_refused_naming_its_type(outcome, host):
    failed, stdout = outcome
    assert host in failed, stdout[-3000:]
    assert WRONG_TYPES[host][1] in failed[host], failed[host]


@pytest.mark.parametrize("host", list(WRONG_ENVIRONMENTS))
def test_an_environment_sglang_would_misread_is_refused_naming_the_entry(outcome, host):
    failed, stdout = outcome
    assert host in failed, stdout[-3000:]
    assert WRONG_ENVIRONMENTS[host][1] in failed[host], failed[host]
