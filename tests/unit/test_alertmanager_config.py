"""roles/sglang_monitoring's optional Alertmanager: its configuration, command line and Prometheus's side.

The templates are rendered with Ansible's own filters (to_nice_json, to_json, regex_*) and the role's
defaults and vars, then checked by the real tools of Debian's packages: `amtool check-config` (from
prometheus-alertmanager) accepts a configuration with a webhook receiver and refuses a route to an
undefined receiver; `promtool check config` accepts Prometheus's configuration with the alerting
block. Both tools are extracted by scripts/fetch-monitoring-debs (scripts/setup runs it) into
.cache/amtool/ and .cache/promtool/: missing, the tests fail.
"""

import json
import shlex
import subprocess

import jinja2
import pytest
import yaml
from ansible.plugins.filter.core import FilterModule as CoreFilters
from project_modules import REPO, load

ROLE = REPO / "roles" / "sglang_monitoring"
AMTOOL = REPO / ".cache" / "amtool" / "amtool"
PROMTOOL = REPO / ".cache" / "promtool" / "promtool"

WEBHOOK = {"name": "oncall", "webhook_configs": [{"url": "http://127.0.0.1:9099/hook", "send_resolved": True}]}


@pytest.fixture(scope="module", autouse=True)
def tools():
    for tool in (AMTOOL, PROMTOOL):
        assert tool.is_file(), f"{tool} is missing: run scripts/fetch-monitoring-debs (scripts/setup does)"


def _role_filters():
    return load(ROLE.relative_to(REPO) / "filter_plugins" / "sglang_monitoring.py").FilterModule().filters()


def _env():
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(ROLE / "templates"), trim_blocks=True,
                             undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    env.filters.update(CoreFilters().filters())
    env.filters.update(_role_filters())
    return env


def _variables(**overrides):
    """The role's defaults and vars, with overrides, the vars' templates resolved (the few used here)."""
    env = _env()
    values = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    values.update(overrides)
    private = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())
    values.update({"ansible_managed": "Ansible managed", "inventory_hostname": "mon-1"})
    # the vars that are plain values (paths, the hardening table), not templates
    values.update({name: value for name, value in private.items() if "{{" not in str(value)})
    for name in ("__sglang_monitoring_alertmanager_listen_host", "__sglang_monitoring_alertmanager_listen_port",
                 "__sglang_monitoring_alertmanager_local_address"):
        values[name] = env.from_string(private[name]).render(values)
    for name in ("__sglang_monitoring_alertmanager_args", "__sglang_monitoring_prometheus_args",
                 "__sglang_monitoring_node_exporter_args"):
        values[name] = [env.from_string(arg).render(values) for arg in private[name]]
    return values


def render(name, **overrides):
    return _env().get_template(name).render(_variables(**overrides))


def check(tool, *args):
    return subprocess.run([str(tool), *args], capture_output=True, text=True, timeout=60)


def test_a_webhook_receiver_passes_amtool_and_is_written_as_given(tmp_path):
    route = {"receiver": "oncall", "group_by": ["alertname", "node"], "group_wait": "1s", "group_interval": "1s",
             "repeat_interval": "1m"}
    text = render("alertmanager.yml.j2", sglang_monitoring_alertmanager_receivers=[WEBHOOK],
                  sglang_monitoring_alertmanager_route=route)
    (tmp_path / "alertmanager.yml").write_text(text)
    done = check(AMTOOL, "check-config", str(tmp_path / "alertmanager.yml"))
    assert done.returncode == 0, text + done.stdout + done.stderr
    assert "SUCCESS" in done.stdout and " - 1 receivers" in done.stdout, done.stdout
    assert yaml.safe_load(text) == {"route": route, "receivers": [WEBHOOK]}


def test_the_default_route_groups_by_alert_and_node_and_passes_amtool(tmp_path):
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    route = defaults["sglang_monitoring_alertmanager_route"]
    assert route["group_by"] == ["alertname", "node"]
    text = render("alertmanager.yml.j2", sglang_monitoring_alertmanager_receivers=[{**WEBHOOK, "name": route["receiver"]}])
    (tmp_path / "alertmanager.yml").write_text(text)
    done = check(AMTOOL, "check-config", str(tmp_path / "alertmanager.yml"))
    assert done.returncode == 0, text + done.stdout + done.stderr
    assert yaml.safe_load(text)["route"] == route


def test_amtool_refuses_a_route_to_an_undefined_receiver(tmp_path):
    # What the role's validate: relies on when its own check (tasks/check.yml) is passed, e.g. a
    # sub-route naming a receiver that does not exist.
    route = {"receiver": "oncall", "routes": [{"matchers": ['severity="critical"'], "receiver": "pager"}]}
    text = render("alertmanager.yml.j2", sglang_monitoring_alertmanager_receivers=[WEBHOOK],
                  sglang_monitoring_alertmanager_route=route)
    (tmp_path / "alertmanager.yml").write_text(text)
    done = check(AMTOOL, "check-config", str(tmp_path / "alertmanager.yml"))
    assert done.returncode != 0, done.stdout
    assert 'undefined receiver "pager" used in route' in done.stdout + done.stderr, done.stdout + done.stderr


def argv_of(default_file_text):
    """The arguments systemd passes for `PROGRAM $ARGS` with this /etc/default file: the value of
    ARGS (its double quotes removed), split at whitespace outside quotes, quotes removed."""
    (line,) = [line for line in default_file_text.splitlines() if line.startswith("ARGS=")]
    (value,) = shlex.split(line.removeprefix("ARGS="))
    return shlex.split(value)


def test_the_command_line_closes_the_gossip_port_asks_for_the_api_password_and_listens_where_asked():
    text = render("alertmanager.default.j2", sglang_monitoring_alertmanager_listen_address="10.0.0.7:9093")
    assert argv_of(text) == ["--config.file=/etc/prometheus/alertmanager.yml",
                             "--storage.path=/var/lib/prometheus/alertmanager",
                             "--web.config.file=/etc/prometheus/alertmanager-web.yml",
                             "--web.listen-address=10.0.0.7:9093",
                             "--cluster.listen-address="]


@pytest.mark.parametrize(("template", "variable", "flag"), [
    ("prometheus.default.j2", "sglang_monitoring_retention", "--storage.tsdb.retention.time="),
    ("prometheus.default.j2", "sglang_monitoring_listen_address", "--web.listen-address="),
    ("node-exporter.default.j2", "sglang_monitoring_node_exporter_listen_address", "--web.listen-address="),
    ("alertmanager.default.j2", "sglang_monitoring_alertmanager_listen_address", "--web.listen-address="),
])
def test_a_space_in_a_value_cannot_start_another_flag(template, variable, flag):
    # Issue 38: sglang_monitoring_retention "15d --web.enable-admin-api --web.enable-lifecycle" gave
    # any local user Prometheus's admin API. Quoted, it stays one argument (which the program refuses).
    value = "15d --web.enable-admin-api --web.enable-lifecycle"
    argv = argv_of(render(template, **{variable: value}))
    assert f"{flag}{value}" in argv
    assert "--web.enable-admin-api" not in argv and "--web.enable-lifecycle" not in argv


@pytest.mark.parametrize("value", ["15d' '--web.enable-admin-api", '15d" "--x', "15d\\' --x", "15d\n--x"])
def test_a_value_that_could_end_its_quoted_word_is_refused_as_it_renders(value):
    with pytest.raises(Exception, match="could end its word in ARGS"):
        render("prometheus.default.j2", sglang_monitoring_retention=value.replace("\\n", "\n"))


def _prometheus(tmp_path, **overrides):
    """prometheus.yml with one job target of each kind, checked by promtool (rules file beside it)."""
    rules = tmp_path / "sglang.rules.yml"
    rules.write_text(render("sglang.rules.yml.j2"))
    jobs = [{"name": "sglang", "targets": [{"node": "n1", "address": "10.0.0.2:30000"}]},
            {"name": "node", "targets": [{"node": "n1", "address": "10.0.0.2:9100"}]},
            {"name": "sglang_gateway", "targets": []}]
    text = render("prometheus.yml.j2", __sglang_monitoring_jobs=jobs, **overrides)
    text = text.replace(_variables()["__sglang_monitoring_rules_file"], str(rules))
    (tmp_path / "prometheus.yml").write_text(text)
    done = check(PROMTOOL, "check", "config", str(tmp_path / "prometheus.yml"))
    assert done.returncode == 0, text + done.stdout + done.stderr
    return yaml.safe_load(text)


@pytest.mark.parametrize(("listen", "target"), [
    ("127.0.0.1:9093", "127.0.0.1:9093"),
    ("0.0.0.0:9093", "127.0.0.1:9093"),
    (":9193", "127.0.0.1:9193"),
    ("[::]:9093", "[::1]:9093"),
    ("10.0.0.5:9093", "10.0.0.5:9093"),
])
def test_prometheus_sends_alerts_to_the_alertmanager_of_its_monitor_and_scrapes_it(tmp_path, listen, target):
    config = _prometheus(tmp_path, sglang_monitoring_alertmanager_enabled=True,
                         sglang_monitoring_alertmanager_listen_address=listen)
    # Alertmanager's API asks for its password (a file root and group prometheus only read), for
    # alerts sent and for its scrape.
    auth = {"username": "prometheus", "password_file": "/etc/prometheus/alertmanager-api.password"}
    assert config["alerting"] == {"alertmanagers": [{"static_configs": [{"targets": [target]}], "basic_auth": auth}]}
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert list(jobs) == ["sglang", "node", "sglang_gateway", "alertmanager"]
    assert jobs["alertmanager"]["static_configs"] == [{"targets": [target], "labels": {"node": "mon-1"}}]
    assert jobs["alertmanager"]["basic_auth"] == auth


def test_without_alertmanager_prometheus_has_no_alerting_block_nor_its_job(tmp_path):
    config = _prometheus(tmp_path)
    assert "alerting" not in config
    assert [job["job_name"] for job in config["scrape_configs"]] == ["sglang", "node", "sglang_gateway"]


@pytest.fixture(scope="module")
def api_password(project_module):
    return project_module("library/sglang_monitoring_api_password.py")


def test_the_api_password_hash_is_bcrypt_and_kept_while_it_matches(api_password):
    hashed = api_password.crypt.crypt("s3cret", api_password.crypt.mksalt(api_password.crypt.METHOD_BLOWFISH,
                                                                           rounds=api_password.BCRYPT_ROUNDS))
    assert hashed.startswith("$2b$10$")  # what exporter-toolkit's basic_auth_users reads
    web_config = json.dumps({"basic_auth_users": {"prometheus": hashed}})
    assert api_password._hash_matches(web_config, "prometheus", "s3cret")
    assert not api_password._hash_matches(web_config, "prometheus", "other")
    assert not api_password._hash_matches(web_config, "admin", "s3cret")
    assert not api_password._hash_matches("basic_auth_users: {}", "prometheus", "s3cret")
    # a hash of another scheme (a plain SHA-512 crypt) is replaced, not trusted
    sha = api_password.crypt.crypt("s3cret", api_password.crypt.mksalt(api_password.crypt.METHOD_SHA512))
    assert not api_password._hash_matches(json.dumps({"basic_auth_users": {"prometheus": sha}}), "prometheus", "s3cret")


@pytest.fixture(scope="module")
def value_formats(project_module):
    return project_module("filter_plugins/value_formats.py")


def _declared():
    return yaml.safe_load((ROLE / "meta" / "value_formats.yml").read_text())


def test_every_string_and_number_option_has_a_declared_format_or_a_reason():
    specs = yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text())["argument_specs"]
    options = {name: option for entry in specs.values() for name, option in entry["options"].items()}
    declared = _declared()
    covered = set(declared["value_formats"]) | set(declared["free_text"])
    wanted = {name for name, option in options.items() if option["type"] in ("str", "int", "float", "path")
              or option.get("elements") in ("str", "int", "float", "path", "dict")}
    assert wanted - covered == set()
    assert covered - set(options) == set()  # no format for a variable the role does not have


def test_the_role_defaults_have_their_formats(value_formats):
    defaults = _variables()
    defaults["sglang_monitoring_node_exporter_listen_address"] = _env().from_string(
        str(defaults["sglang_monitoring_node_exporter_listen_address"])).render(defaults)
    formats = _declared()["value_formats"]
    assert value_formats.value_format_errors({name: defaults[name] for name in formats}, formats) == []


@pytest.mark.parametrize(("name", "value"), [
    # issue 38: gave any local user Prometheus's admin API
    ("sglang_monitoring_retention", "15d --web.enable-admin-api --web.enable-lifecycle"),
    # issue 38: passed promtool and made SGLangWatchdogRestarted unable to fire
    ("sglang_monitoring_alert_watchdog_restart_window", "1h])) < 0 #"),
    ("sglang_monitoring_scrape_interval", "15s\nscrape_configs: []"),
    ("sglang_monitoring_alert_server_down_for", "1 m"),
    ("sglang_monitoring_listen_address", "0.0.0.0:9090 --web.enable-admin-api"),
    ("sglang_monitoring_listen_address", "localhost:9090"),
    ("sglang_monitoring_alertmanager_listen_address", "127.0.0.1:99999"),
    ("sglang_monitoring_node_exporter_listen_address", ":9100 --collector.disable-defaults"),
    ("sglang_monitoring_node_exporter_port", 0),
    ("sglang_monitoring_sglang_port", "30000; x"),
    ("sglang_monitoring_package_dir", "relative/debs"),
    ("sglang_monitoring_package_dir", "/srv/../etc"),
    ("sglang_monitoring_alert_token_usage_threshold", "0.95 or vector(1)"),
    ("sglang_monitoring_alert_token_usage_threshold", 1.5),
    ("sglang_monitoring_alert_queue_min", 0),
    ("sglang_monitoring_alert_accept_length_threshold", 0.5),
])
def test_a_value_without_its_format_is_refused_naming_the_variable(value_formats, name, value):
    (error,) = value_formats.value_format_errors({name: value}, _declared()["value_formats"])
    assert error.startswith(f"{name}: expected "), error
