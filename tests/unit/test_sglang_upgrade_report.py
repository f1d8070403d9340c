"""The upgrade report's pure logic (module_utils/sglang_upgrade_report.py): patches classified against a
target's files, both releases' ServerArgs compared, the environment's readers, the stack, the verdict."""

import difflib
import json
import subprocess
import sys
import zipfile

import pytest

import ansible.module_utils  # noqa: E402
from project_modules import REPO

if str(REPO / "module_utils") not in ansible.module_utils.__path__:
    ansible.module_utils.__path__.append(str(REPO / "module_utils"))

from ansible.module_utils import sglang_upgrade_report as report  # noqa: E402

PATH = "pkg/mod.py"
BASE = [f"line {n}\n" for n in range(1, 41)]


def _patch(before, after, name="0001-x.patch"):
    diff = difflib.unified_diff(before, after, f"a/{PATH}", f"b/{PATH}", n=3)
    return {"name": f"set/{name}", "content": "Subject: a test patch\n\n" + "".join(diff)}


def _edited(lines, index, text):
    changed = list(lines)
    changed[index] = text
    return changed


def _classify(patch, target_lines, rule=None):
    files = {PATH: "".join(target_lines).encode()}
    return report.classify_patch(patch["name"], patch["content"], files, rule), files


def test_a_patch_made_against_the_target_applies_cleanly_and_updates_the_files():
    patch = _patch(BASE, _edited(BASE, 19, "patched\n"))
    result, files = _classify(patch, BASE)
    assert (result["status"], result["reason"]) == ("clean", "")
    assert b"patched\n" in files[PATH]


def test_a_hunk_found_lower_down_is_an_offset_naming_both_lines():
    patch = _patch(BASE, _edited(BASE, 19, "patched\n"))
    result, _ = _classify(patch, ["new\n"] * 5 + BASE)
    assert result["status"] == "offset"
    assert "pkg/mod.py hunk 1 at line 22, stated 17" in result["reason"]


def test_a_hunk_whose_outer_context_changed_needs_fuzz_which_the_role_does_not_do():
    patch = _patch(BASE, _edited(BASE, 19, "patched\n"))
    target = _edited(BASE, 16, "context rewritten upstream\n")
    result, files = _classify(patch, target)
    assert result["status"] == "fuzz"
    assert "hunk 1" in result["reason"] and "only with fuzz 1" in result["reason"]
    assert b"patched" not in files[PATH]


def test_a_hunk_whose_changed_lines_differ_fails_naming_file_and_hunk():
    patch = _patch(BASE, _edited(BASE, 19, "patched\n"))
    result, _ = _classify(patch, _edited(BASE, 19, "upstream changed this very line\n"))
    assert result["status"] == "fails"
    assert result["reason"].startswith("pkg/mod.py hunk 1 (@@ -17,7 +17,7 @@): context differs")


def test_a_target_that_already_holds_the_patched_lines_makes_the_patch_obsolete():
    after = _edited(BASE, 19, "patched\n")
    result, _ = _classify(_patch(BASE, after), after)
    assert result["status"] == "obsolete"
    assert "already holds the patch's lines" in result["reason"]


def test_set_yml_names_upstreams_own_fix_and_its_why():
    rule = {"file": PATH, "contains": "upstream fix", "why": "upstream does it\n  now"}
    result, _ = _classify(_patch(BASE, _edited(BASE, 19, "patched\n")), _edited(BASE, 5, "upstream fix\n"), rule)
    assert result["status"] == "obsolete"
    assert result["reason"] == "set.yml: pkg/mod.py of the target contains 'upstream fix' (upstream's own fix): upstream does it now"
    absent, _ = _classify(_patch(BASE, _edited(BASE, 19, "patched\n")), BASE, rule)
    assert absent["status"] == "clean"


def test_set_yml_may_name_what_upstream_removed():
    rule = {"file": PATH, "contains": "line 5\n", "lacks": "SGLANG_OLD"}
    removed, _ = _classify(_patch(BASE, _edited(BASE, 19, "patched\n")), BASE, rule)
    assert removed["reason"] == "set.yml: pkg/mod.py of the target contains 'line 5\\n' and lacks 'SGLANG_OLD' (upstream's own fix)"
    still_there, _ = _classify(_patch(BASE, _edited(BASE, 19, "patched\n")), _edited(BASE, 30, "SGLANG_OLD\n"), rule)
    assert still_there["status"] == "clean"


def test_a_patch_of_a_file_the_target_lacks_fails_naming_it():
    result = report.classify_patch("set/0001-x.patch", _patch(BASE, _edited(BASE, 3, "x\n"))["content"], {PATH: None})
    assert (result["status"], result["reason"]) == ("fails", "the target has no pkg/mod.py")


def test_each_patch_of_a_set_sees_what_the_earlier_ones_wrote():
    first_after = _edited(BASE, 19, "first\n")
    second = _patch(first_after, _edited(first_after, 20, "second\n"), "0002-y.patch")
    results = report.classify_set([_patch(BASE, first_after), second], {PATH: "".join(BASE).encode()}, {})
    assert [r["status"] for r in results] == ["clean", "clean"]


def _check(resolved, errors=()):
    return {"resolved": resolved, "errors": list(errors)}


SPEC = {"speculative_algorithm": "EAGLE3", "spec_v2": True, "disable_overlap_schedule": False}


def test_server_args_name_refused_flags_with_the_closest_field_and_changed_defaults():
    current = _check(dict(SPEC, tp_size=8, chunked_prefill_size=8192, enable_metrics=True, old_field=1, cuda_graph_max_bs=8))
    target = _check(dict(SPEC, tp_size=8, chunked_prefill_size=4096, enable_metrics=True, enable_metric=True,
                         cuda_graph_max_bs_decode=8), [
        {"flag": "--enable-metrics", "variable": "sglang_server_args.enable_metrics",
         "message": "SGLang's argument parser: unrecognized arguments: --enable-metrics"}])
    compared = report.compare_server_args(current, target, ["tp_size", "enable_metrics"])
    assert compared["refused"] == [{"flag": "--enable-metrics", "variable": "sglang_server_args.enable_metrics",
                                    "message": "SGLang's argument parser: unrecognized arguments: --enable-metrics",
                                    "closest": ["enable_metrics"]}]
    assert compared["changed"] == [{"field": "chunked_prefill_size", "current": 8192, "target": 4096, "configured": False}]
    assert compared["removed_fields"] == [{"field": "cuda_graph_max_bs", "closest": ["cuda_graph_max_bs_decode"]},
                                          {"field": "old_field", "closest": []}]
    assert compared["new_fields"] == ["cuda_graph_max_bs_decode", "enable_metric"]
    assert compared["speculative"]["speculative_algorithm"] == {"current": "EAGLE3", "target": "EAGLE3"}


def _report(**changes):
    base = {
        "from": "0.5.9", "to": "0.5.10", "wheel": "sglang-0.5.10-py3-none-any.whl", "sources": "the wheelhouse",
        "active_set": {"names": ["sglang-0.5.9"], "patches": [{"name": "sglang-0.5.9/0001-x.patch", "status": "clean", "reason": ""}]},
        "target_set": {"name": "sglang-0.5.10", "dir": "/roles/sglang_patches/files/sglang-0.5.10", "exists": True, "errors": [],
                       "patches": [{"name": "sglang-0.5.10/0001-x.patch", "status": "clean", "reason": ""}]},
        "server_args": report.compare_server_args(_check(dict(SPEC)), _check(dict(SPEC)), []),
        "environment": [],
        "stack": {"pins": [], "inventory": [], "torch_cuda": "13.0"},
    }
    base.update(changes)
    return base


def test_a_clean_report_refuses_nothing_and_says_the_rollout_is_not_built():
    clean = _report()
    clean["refusals"], clean["warnings"] = report.refusals(clean), report.warnings(clean)
    assert clean["refusals"] == [] and clean["warnings"] == []
    assert "**Allowed by the report** (the rollout itself is not built yet" in report.render_markdown(clean)


def test_no_patch_set_for_the_target_with_an_active_set_is_refused_naming_the_set():
    missing = _report(target_set={"name": "sglang-0.5.10", "dir": "/sets/sglang-0.5.10", "exists": False, "errors": [], "patches": []})
    assert report.refusals(missing) == [
        "no patch set for sglang 0.5.10 (/sets/sglang-0.5.10) while the active set sglang-0.5.9 has 1 patch(es)"]
    empty = dict(missing, active_set={"names": [], "patches": []})
    assert report.refusals(empty) == []


@pytest.mark.parametrize("status, word", [("fails", "fails"), ("fuzz", "needs fuzz")])
def test_a_patch_of_the_targets_set_the_role_cannot_apply_is_refused(status, word):
    broken = _report()
    broken["target_set"]["patches"] = [{"name": "sglang-0.5.10/0001-x.patch", "status": status, "reason": "a/b.py hunk 2"}]
    assert report.refusals(broken) == [f"patch sglang-0.5.10/0001-x.patch of the target's set {word} on sglang 0.5.10: a/b.py hunk 2"]


def test_another_speculative_algorithm_or_scheduler_and_a_refused_flag_are_refused():
    target = _check(dict(SPEC, spec_v2=False), [{"flag": "--tp-size 8", "variable": "sglang_server_args.tp_size", "message": "no"}])
    changed = _report(server_args=report.compare_server_args(_check(dict(SPEC)), target, []))
    assert report.refusals(changed) == [
        "sglang 0.5.10 refuses sglang_server_args.tp_size: no",
        "sglang 0.5.10 resolves spec_v2 to False, not True as 0.5.9 does",
    ]


def test_a_variable_the_target_no_longer_reads_is_a_warning_unless_its_set_reads_it():
    rows = report.environment_readers(
        {"SGLANG_ENABLE_SPEC_V2": "1", "SGLANG_SWITCH": "0"},
        [b"os.getenv('SGLANG_ENABLE_SPEC_V2')"], [b"nothing here"],
        [{"name": "old/0002.patch", "content": "SGLANG_SWITCH"}], [{"name": "new/0002.patch", "content": "SGLANG_SWITCH"}])
    assert rows[0] == {"name": "SGLANG_ENABLE_SPEC_V2", "value": "1", "current_reads": True, "target_reads": False,
                       "patches": [], "target_patches": []}
    assert rows[1]["patches"] == ["old/0002.patch"] and rows[1]["target_patches"] == ["new/0002.patch"]
    assert report.warnings(_report(environment=rows)) == [
        "sglang_service_environment.SGLANG_ENABLE_SPEC_V2: sglang 0.5.10 and its patch set no longer reads it"]
    assert report.refusals(_report(environment=rows)) == []


def test_the_stack_lists_changed_pins_and_judges_each_inventory_pin():
    current = ["torch==2.9.1", "sgl-kernel==0.3.21", "transformers==4.57.1", "tqdm"]
    target = ["torch==2.9.1", "sglang-kernel==0.4.1", "transformers==5.3.0", "tqdm", "pytest==8; extra == 'test'"]
    pins = [{"name": "torch", "pin": "2.9.1+cu130", "origin": "PyTorch cu130"},
            {"name": "sgl-kernel", "pin": "0.3.21+cu130", "origin": "sgl-kernel cu130"},
            {"name": "transformers", "pin": "4.57.1", "origin": "pins"},
            {"name": "tqdm", "pin": "4.70.1", "origin": "pins"}]
    stack = report.compare_stack(current, target, pins)
    assert stack["pins"] == [{"package": "sgl-kernel", "current": "0.3.21", "target": None},
                             {"package": "sglang-kernel", "current": None, "target": "0.4.1"},
                             {"package": "transformers", "current": "4.57.1", "target": "5.3.0"}]
    assert [row["verdict"] for row in stack["inventory"]] == [
        "ok", "not required by the target", "conflict: the target requires transformers==5.3.0", "ok (the target requires tqdm)"]
    deviated = report.compare_stack(current, target, [{"name": "torch", "pin": "2.13.0", "origin": "x"}], deviations=["torch"])
    assert deviated["inventory"][0]["verdict"].startswith("deliberate deviation (sglang_install_constraints_exclude)")
    refused = _report(stack=dict(stack, torch_cuda=None))
    assert report.refusals(refused) == ["pins pins transformers==4.57.1, but sglang 0.5.10 requires transformers==5.3.0"]


def test_the_markdown_leads_with_the_refusal_and_has_every_section():
    refused = _report(target_set={"name": "sglang-0.5.10", "dir": "/sets/sglang-0.5.10", "exists": False, "errors": [], "patches": []})
    refused["refusals"], refused["warnings"] = report.refusals(refused), report.warnings(refused)
    text = report.render_markdown(refused)
    assert text.startswith("# SGLang upgrade report: 0.5.9 to 0.5.10\n\n**Refused**: no patch set for sglang 0.5.10")
    for heading in ("## Patches", "## Server arguments and environment", "## Stack"):
        assert heading in text
    assert "| sglang-0.5.9/0001-x.patch | clean |  |" in text


def test_the_module_reads_only_the_patched_and_the_rules_files_of_a_wheel(tmp_path, project_module):
    module = project_module("library/sglang_upgrade_report.py")
    wheel = tmp_path / "pkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(PATH, "".join(BASE))
        archive.writestr("pkg/other.py", "SGLANG_X = 1\n")
    assert module.wheel_files(str(wheel), [PATH, "pkg/gone.py"]) == {PATH: "".join(BASE).encode(), "pkg/gone.py": None}
    assert sorted(module.python_sources(str(wheel))) == [b"SGLANG_X = 1\n", "".join(BASE).encode()]


def test_an_interpreter_given_for_a_release_must_have_that_release(tmp_path):
    (tmp_path / "sglang-9.9-py3-none-any.whl").write_bytes(b"")
    done = subprocess.run(
        [sys.executable, str(REPO / "roles" / "sglang_upgrade" / "files" / "parser_venv.py"), "--python", sys.executable,
         str(tmp_path), "9.9", str(tmp_path / "venv"), "-"],
        capture_output=True, text=True, check=False)
    assert done.returncode == 1
    assert json.loads(done.stdout)["msg"].startswith(f"sglang_upgrade_parser_pythons: {sys.executable} has no sglang 9.9")
    assert not (tmp_path / "venv").exists()


def test_a_configuration_the_current_release_refuses_here_is_refused_naming_the_model_folders():
    missing = {"flag": "--model-path /data/models/target", "message": "/data/models/target: no such file or directory on the node"}
    broken = _report(server_args=report.compare_server_args(_check(None, [missing]), _check(None, [missing]), []))
    assert report.refusals(broken)[0] == (
        "sglang 0.5.9 itself refuses the canonical configuration on the controller, so the releases cannot be compared "
        "(sglang_upgrade_model_path, sglang_upgrade_draft_model_path?): /data/models/target: no such file or directory on the node")
