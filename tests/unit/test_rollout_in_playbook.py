"""Which nodes converge, and in what batches, is decided where a reader sees it (issue 37 §2).

site.yml's converge play targets every node of sglang_nodes with `serial`; no callback writes
a host fact or a group that a play then targets, and the drift scan's fact
(callback_plugins/sglang_drift.py) is read by playbooks/drift.yml's report only.
"""

import ast

import pytest
import yaml

from project_modules import REPO

# The calls through which a plugin could change what a later task or play sees of a host.
HOST_STATE_CALLS = {"set_nonpersistent_facts", "set_host_facts", "set_host_variable", "add_host", "add_group",
                    "add_child"}
DRIFT_REPORT_FACT = "sglang_drift_items"


def _host_state_calls(path):
    tree = ast.parse(path.read_text(), filename=str(path))
    return [node for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in HOST_STATE_CALLS]


def _fact_names(call):
    """The literal names of the facts a set_*_facts call sets; None when they are not literal."""
    facts = call.args[1] if len(call.args) > 1 else next((k.value for k in call.keywords if k.arg == "facts"), None)
    if not isinstance(facts, ast.Dict) or not all(isinstance(key, ast.Constant) for key in facts.keys):
        return None
    return {key.value for key in facts.keys}


@pytest.mark.parametrize("plugin", sorted((REPO / "callback_plugins").glob("*.py")), ids=lambda p: p.name)
def test_no_callback_writes_host_state_except_the_drift_report(plugin):
    for call in _host_state_calls(plugin):
        where = f"{plugin.name}:{call.lineno}"
        assert call.func.attr == "set_nonpersistent_facts", f"{where}: {call.func.attr} changes the run's inventory"
        assert _fact_names(call) == {DRIFT_REPORT_FACT}, f"{where}: sets host facts other than {DRIFT_REPORT_FACT}"


def test_only_the_drift_report_reads_the_drift_scans_fact():
    readers = sorted(str(path.relative_to(REPO))
                     for path in [REPO / "site.yml", *(REPO / "playbooks").rglob("*.yml"), *(REPO / "roles").rglob("*.yml")]
                     if DRIFT_REPORT_FACT in path.read_text())
    assert readers == ["playbooks/drift.yml"]


def _site_plays():
    return yaml.safe_load((REPO / "site.yml").read_text())


def _role_names(play):
    return [role["role"] if isinstance(role, dict) else role for role in play.get("roles", [])]


def test_site_converges_every_node_in_batches_without_a_group_made_at_run_time():
    plays = _site_plays()
    converge = [play for play in plays if "sglang_service" in _role_names(play)]
    assert len(converge) == 1, [play["name"] for play in converge]
    play = converge[0]
    # Every node, or the group playbooks/upgrade.yml names when it imports site.yml (its canary,
    # then every node), which its plan made in a task of its own, in plain sight.
    assert play["hosts"] == "{{ groups[sglang_rollout_group] | default([]) if sglang_rollout_group is defined else 'sglang_nodes' }}", play["hosts"]
    assert "sglang_rollout_batch_size" in str(play["serial"]), play.get("serial")
    assert "sglang_rollout_max_fail_percentage" in str(play["max_fail_percentage"]), play.get("max_fail_percentage")
    # no task makes a group or a host at run time for a later play to target
    text = (REPO / "site.yml").read_text()
    for made_at_run_time in ("group_by", "add_host"):
        assert made_at_run_time not in text, f"site.yml uses {made_at_run_time}"


def test_every_node_is_checked_at_once_and_a_refusal_stops_the_run_before_the_first_batch():
    plays = _site_plays()
    converge_at = next(i for i, play in enumerate(plays) if "sglang_service" in _role_names(play))
    checks = [play for play in plays[:converge_at]
              if any(task.get("ansible.builtin.import_role", {}).get("name") == "sglang_service"
                     and task["ansible.builtin.import_role"].get("tasks_from") == "check"
                     for task in play.get("tasks", []))]
    assert len(checks) == 1, "no play checks sglang_service's configuration on every node before the converge play"
    check = checks[0]
    assert "serial" not in check and check["any_errors_fatal"] is True and check["check_mode"] is True
    assert "groups[sglang_rollout_group | default('sglang_nodes')]" in check["hosts"], check["hosts"]


# The roles of the converge play whose checks the check play runs first, each by its `check` entry point.
CHECKED_ROLES = ("sglang_patches", "nccl_tuning", "sglang_service", "sglang_watchdog")
SKIP_FLAG = "__sglang_checked_before_the_batches"


def test_the_check_play_runs_each_roles_check_and_the_converge_play_does_not_repeat_it():
    """Play 2 runs every converge role's tasks/check.yml under that role's tags in play 3; play 3
    tells the roles so (except in a dry run, which has no check play), and each role includes its
    check.yml only when not told: one include, skipped whole, so the check play's registered
    results stand (a skipped task would overwrite its register)."""
    plays = _site_plays()
    converge_at = next(i for i, play in enumerate(plays) if "sglang_service" in _role_names(play))
    converge, check = plays[converge_at], plays[converge_at - 1]
    role_tags = {role["role"]: set(role.get("tags", [])) for role in converge["roles"] if isinstance(role, dict)}
    checked = {task["ansible.builtin.import_role"]["name"]: set(task.get("tags", []))
               for task in check["tasks"] if task["ansible.builtin.import_role"].get("tasks_from") == "check"}
    assert sorted(checked) == sorted(CHECKED_ROLES), check["tasks"]
    for role, tags in checked.items():
        assert tags == role_tags[role], f"{role}: checked under {sorted(tags)}, converged under {sorted(role_tags[role])}"
    flag = converge["vars"][SKIP_FLAG]
    assert "sglang_drift_only" in flag and "ansible_check_mode" in flag and flag.startswith("{{ not ")
    for role in CHECKED_ROLES:
        main = yaml.safe_load((REPO / "roles" / role / "tasks" / "main.yml").read_text())
        includes = [task for task in main if task.get("ansible.builtin.include_tasks", {}).get("file") == "check.yml"]
        assert len(includes) == 1, f"{role}: tasks/main.yml does not include check.yml once"
        assert includes[0]["when"] == f"not ({SKIP_FLAG} | default(false) | bool)", includes[0]
        assert not [task for task in main if "check.yml" in str(task.get("ansible.builtin.import_tasks", ""))], role


def test_only_upgrade_yml_names_a_rollout_group_and_only_where_it_imports_site_yml():
    """playbooks/upgrade.yml moves its canary, then the fleet, through site.yml itself: its two
    imports name the group (made by its plan's add_host task, in plain sight); nothing else does."""
    setters = sorted(str(path.relative_to(REPO)) for path in [REPO / "site.yml", *(REPO / "playbooks").rglob("*.yml"),
                                                               *(REPO / "roles").rglob("*.yml")]
                     if "sglang_rollout_group:" in path.read_text())
    assert setters == ["playbooks/upgrade.yml"]
    upgrade = yaml.safe_load((REPO / "playbooks" / "upgrade.yml").read_text())
    imports = [play for play in upgrade if "sglang_rollout_group" in play.get("vars", {})]
    assert [play["ansible.builtin.import_playbook"] for play in imports] == ["../site.yml", "../site.yml"]
    assert [play["vars"]["sglang_rollout_group"] for play in imports] == ["sglang_upgrade_canary", "sglang_upgrade_promote"]
