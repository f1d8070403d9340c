"""playbooks/upgrade.yml, report only, run as an operator runs it, against the real wheels of the wheelhouse.

The inventory's one node is an address nothing answers at (TEST-NET-3): a task that contacted it
would fail the run as unreachable, so every passing run proves the report touches no node. The
target's parser venv is built once into .cache/upgrade (the role's default cache) and
reused by later sessions (the current release's is the suite's own .cache/parser-venv); the reports
go to a temporary folder.
"""

import itertools
import json

import pytest
from ansible_run import run_playbook
from parser_venv import ensure_wheelhouse, upgrade_sources

FROM, TARGET = "0.5.9", "0.5.23"
NODE = "upgrade-node"
INVENTORY = f"""\
sglang_nodes:
  hosts:
    {NODE}:
      ansible_host: 203.0.113.9
"""


@pytest.fixture(scope="module")
def upgrade(tmp_path_factory):
    """Run upgrade.yml report-only to a release with extra variables; (result, report dir)."""
    folder = tmp_path_factory.mktemp("upgrade")
    inventory = folder / "hosts.yml"
    inventory.write_text(INVENTORY)
    runs = itertools.count()

    def run(version, check=False, **extravars):
        reports = folder / f"reports-{next(runs)}"
        variables = {
            "sglang_version": version,
            "sglang_upgrade_report_only": True,
            **upgrade_sources(TARGET),
            "sglang_upgrade_report_dir": str(reports),
            **extravars,
        }
        result = run_playbook("playbooks/upgrade.yml", inventory, extravars=variables, check=check)
        assert result.count("dark") == 0, f"the report contacted the node: {result.stdout[-3000:]}"
        return result, reports

    return run


def _report(reports, target):
    return json.loads((reports / f"sglang-{FROM}-to-{target}.json").read_text())


def test_the_ported_target_is_reported_from_its_real_wheel_and_allowed(upgrade):
    result, reports = upgrade(TARGET)
    assert result.rc == 0, result.failure_messages() or result.stdout[-3000:]
    report = _report(reports, TARGET)
    assert report["refusals"] == []
    active = {p["name"].split("/")[1][:4]: p for p in report["active_set"]["patches"]}
    assert active["0001"]["status"] == "obsolete" and active["0001"]["reason"].startswith("set.yml: ")
    assert active["0002"]["status"] == "fails" and "sglang/srt/speculative/eagle_worker_v2.py hunk" in active["0002"]["reason"]
    assert report["target_set"]["exists"] and [p["status"] for p in report["target_set"]["patches"]] == ["clean"]
    speculative = report["server_args"]["speculative"]
    assert speculative["speculative_algorithm"] == {"current": "EAGLE3", "target": "EAGLE3"}
    assert speculative["spec_v2"] == {"current": True, "target": True}
    assert f"sglang_service_environment.SGLANG_ENABLE_SPEC_V2: sglang {TARGET} and its patch set no longer reads it" \
        in report["warnings"]
    assert any(p["package"] == "transformers" and p["current"] == "4.57.1" for p in report["stack"]["pins"])
    markdown = (reports / f"sglang-{FROM}-to-{TARGET}.md").read_text()
    assert markdown.startswith(f"# SGLang upgrade report: {FROM} to {TARGET}\n\n**Allowed by the report**")
    assert any("Report only (sglang_upgrade_report_only): nothing on any node changed." in m for m in result.messages())


def test_a_target_without_its_patch_set_is_refused_with_the_report_in_a_dry_run_too(upgrade, tmp_path):
    missing = tmp_path / f"sglang-{TARGET}"
    result, reports = upgrade(TARGET, check=True, sglang_upgrade_target_patch_set=str(missing))
    assert result.rc != 0
    report_path = reports / f"sglang-{FROM}-to-{TARGET}.md"
    expected = (f"The upgrade of sglang {FROM} to {TARGET} is refused: no patch set for sglang {TARGET} ({missing}) "
                f"while the active set sglang-{FROM} has 2 patch(es) (report: {report_path}); nothing on any node changed.")
    assert expected in result.failure_messages()
    assert _report(reports, TARGET)["target_set"]["exists"] is False


def test_a_release_no_source_holds_is_refused_naming_the_sources_tried(upgrade):
    result, reports = upgrade("0.5.999")
    assert result.rc != 0
    wheelhouse = ensure_wheelhouse()
    messages = " ".join(result.failure_messages())
    assert (f"sglang_version: no source holds sglang 0.5.999 (tried everything from the wheelhouse {wheelhouse} (no index)): "
            in messages), messages
    assert "Nothing was changed." in messages
    assert not reports.exists()


def test_a_rollout_with_a_canary_that_is_no_node_is_refused_before_anything_runs(upgrade):
    result, reports = upgrade(TARGET, sglang_upgrade_report_only=False, sglang_upgrade_canary="no-such-node")
    assert result.rc != 0
    assert any(m.startswith(f'sglang_upgrade_canary: expected a host of sglang_nodes ({NODE}), got "no-such-node"')
               for m in result.failure_messages()), result.failure_messages()
    assert not reports.exists()
