"""The alert rules of roles/sglang_monitoring, proven with Prometheus's own promtool.

The rules template is rendered with the role's default thresholds, checked with
`promtool check rules` and run against tests/roles/monitoring/rules_test.yml with
`promtool test rules` (synthetic series: each rule fires when it should and stays silent when it
should not). The watchdog's textfile (the producer of the sglang_watchdog_* series) passes
`promtool check metrics`, and the rule tests feed only series it writes. promtool is the one of Debian's prometheus package, extracted by
scripts/fetch-monitoring-debs into .cache/promtool/ (scripts/setup runs it).
"""

import re
import shutil
import subprocess

import jinja2
import pytest
import yaml
from project_modules import REPO, load

ROLE = REPO / "roles" / "sglang_monitoring"
PROMTOOL = REPO / ".cache" / "promtool" / "promtool"
RULES_TEST = REPO / "tests" / "roles" / "monitoring" / "rules_test.yml"
WATCHDOG = REPO / "roles" / "sglang_watchdog" / "files" / "sglang-watchdog"


@pytest.fixture(scope="module", autouse=True)
def promtool():
    assert PROMTOOL.is_file(), f"{PROMTOOL} is missing: run scripts/fetch-monitoring-debs (scripts/setup does)"
    return PROMTOOL


def _role_filters():
    return load(ROLE.relative_to(REPO) / "filter_plugins" / "sglang_monitoring.py").FilterModule().filters()


def render_rules(**overrides):
    """The rules file as the role writes it (Ansible's template: trim_blocks), from the role's defaults."""
    values = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    values.update(overrides)
    env = jinja2.Environment(trim_blocks=True, undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    env.filters.update(_role_filters())
    template = env.from_string((ROLE / "templates" / "sglang.rules.yml.j2").read_text())
    return template.render(ansible_managed="Ansible managed", **values)


def run_rule_tests(tmp_path, rules_text):
    (tmp_path / "sglang.rules.yml").write_text(rules_text)
    shutil.copy(RULES_TEST, tmp_path / "rules_test.yml")
    return subprocess.run([str(PROMTOOL), "test", "rules", "rules_test.yml"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)


def test_rules_pass_promtool_check(tmp_path):
    (tmp_path / "sglang.rules.yml").write_text(render_rules())
    done = subprocess.run([str(PROMTOOL), "check", "rules", str(tmp_path / "sglang.rules.yml")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 9 rules found" in done.stdout


def test_every_rule_fires_when_it_should_and_stays_silent_otherwise(tmp_path):
    done = run_rule_tests(tmp_path, render_rules())
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_every_alert_has_a_firing_and_a_silent_case():
    alerts = [rule["alert"] for group in yaml.safe_load(render_rules())["groups"] for rule in group["rules"]]
    cases = [case for test in yaml.safe_load(RULES_TEST.read_text())["tests"] for case in test["alert_rule_test"]]
    for alert in alerts:
        mine = [case for case in cases if case["alertname"] == alert]
        assert any(case["exp_alerts"] for case in mine), f"{alert}: no case where it fires"
        assert any(not case["exp_alerts"] for case in mine), f"{alert}: no case where it stays silent"


def test_every_rule_states_its_reason():
    text = (ROLE / "templates" / "sglang.rules.yml.j2").read_text()
    blocks = re.split(r"\n(?=      # Reason:)", text)[1:]
    alerts = re.findall(r"^      - alert: (\w+)$", text, re.M)
    assert len(blocks) == len(alerts) == 9
    for block, alert in zip(blocks, alerts):
        assert f"- alert: {alert}" in block, f"{alert}: no '# Reason:' comment right above it"


# Every threshold of the rules, each moved both ways: stricter and looser than its default.
THRESHOLD_MUTATIONS = {
    "sglang_monitoring_alert_server_down_for": ("5m", "30s"),
    "sglang_monitoring_alert_target_down_for": ("5m", "1m"),
    "sglang_monitoring_alert_health_failing_for": ("5m", "1m"),
    "sglang_monitoring_alert_token_usage_threshold": (0.98, 0.90),
    "sglang_monitoring_alert_token_usage_for": ("10m", "2m"),
    "sglang_monitoring_alert_queue_min": (20, 5),
    "sglang_monitoring_alert_queue_window": ("1m", "15m"),
    "sglang_monitoring_alert_queue_for": ("20m", "5m"),
    "sglang_monitoring_alert_accept_length_threshold": (1.2, 2.5),
    "sglang_monitoring_alert_accept_length_for": ("30m", "5m"),
    "sglang_monitoring_alert_gateway_worker_unhealthy_for": ("5m", "30s"),
    "sglang_monitoring_alert_watchdog_restart_window": ("5m", "3h"),
}


def test_every_threshold_variable_is_mutated():
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    thresholds = {name for name in defaults if name.startswith("sglang_monitoring_alert_")}
    assert thresholds == set(THRESHOLD_MUTATIONS)


@pytest.mark.parametrize("name,value", [(name, value) for name, values in THRESHOLD_MUTATIONS.items()
                                        for value in values])
def test_the_rule_tests_catch_a_changed_threshold(tmp_path, name, value):
    # The thresholds are variables of the rules: a rule that fires (or stays silent) where the
    # tests no longer expect it must fail them, whichever way the value moved (the tests are
    # not blind to any of the values).
    done = run_rule_tests(tmp_path, render_rules(**{name: value}))
    assert done.returncode != 0 and "FAILED" in done.stdout + done.stderr, done.stdout


@pytest.mark.parametrize(("name", "value"), [
    # Issue 38: passed promtool and made SGLangWatchdogRestarted unable to fire.
    ("sglang_monitoring_alert_watchdog_restart_window", "1h])) < 0 #"),
    ("sglang_monitoring_alert_queue_window", "5m])) > 0 or vector(1"),
    ("sglang_monitoring_alert_server_down_for", "1m\n        labels: {}"),
    ("sglang_monitoring_alert_target_down_for", "2 m"),
    ("sglang_monitoring_alert_token_usage_threshold", "0.95 or vector(1)"),
    ("sglang_monitoring_alert_queue_min", "10 unless up"),
    ("sglang_monitoring_alert_accept_length_threshold", True),
])
def test_a_threshold_that_is_not_a_duration_or_number_is_refused_as_the_rules_render(name, value):
    with pytest.raises(Exception, match=f"{name}: expected a"):
        render_rules(**{name: value})


def test_the_injection_of_issue_38_would_pass_promtool_unnoticed(tmp_path):
    # Why the template refuses it itself: promtool accepts the rule it makes, which never fires.
    injected = render_rules().replace("restarts_total[1h])) > 0", "restarts_total[1h])) < 0 #])) > 0")
    assert "< 0 #" in injected
    (tmp_path / "sglang.rules.yml").write_text(injected)
    done = subprocess.run([str(PROMTOOL), "check", "rules", str(tmp_path / "sglang.rules.yml")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def _watchdog_textfiles():
    """What the watchdog writes for the textfile collector after a good, a failed and a skipped probe."""
    wd = load(WATCHDOG.relative_to(REPO))
    texts = []
    for probe_ok, unit_state in ((True, "active"), (False, "active"), (None, "inactive")):
        action, state, _ = wd.decide(wd.empty_state(), 1000.0, unit_state=unit_state, main_pid=1, locked=False,
                                     probe_ok=probe_ok, threshold=3, budget=3)
        texts.append(wd.textfile_metrics(state, action, "sglang.service"))
    return texts


def test_the_watchdog_textfile_passes_promtool_and_feeds_the_rule_tests():
    texts = _watchdog_textfiles()
    for text in texts:
        done = subprocess.run([str(PROMTOOL), "check", "metrics"], input=text, capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 0, text + done.stdout + done.stderr
    written = {m.group(1) for text in texts for m in re.finditer(r'^(\w+)\{unit="sglang\.service"\} ', text, re.M)}
    series = [case["series"] for test in yaml.safe_load(RULES_TEST.read_text())["tests"] for case in test["input_series"]]
    fed = {re.match(r"\w+", s).group(0) for s in series if s.startswith("sglang_watchdog_")}
    assert fed and fed <= written, f"rule tests feed watchdog series it never writes: {sorted(fed - written)}"
    assert all('unit="sglang.service"' in s for s in series if s.startswith("sglang_watchdog_"))
