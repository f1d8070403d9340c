"""The formats of role variables (filter_plugins/value_formats.py) and every role's declaration of them.

Each format is tried with values an operator would write and with values that would be read as
something else where they land: another nft command, another Prometheus flag, another PromQL
clause, another pip option. A final test holds every role to declaring a format (or a reason for
none) for each string or number option of its argument spec.
"""


import pytest
import yaml
from project_modules import REPO

ROLES = REPO / "roles"


@pytest.fixture(scope="module")
def value_formats(project_module):
    return project_module("filter_plugins/value_formats.py")


# format -> (values it takes, values it refuses)
CASES = {
    "identifier": (["sglang_canon", "x", "A1_b"],
                   ["sglang_canon; insert rule inet sglang_canon input tcp dport 30000 accept; table inet sglang_canon",
                    "", "1table", "sglang-canon", "a" * 65, "table inet x", "sglang_canon\n"]),
    "unit_name": (["network-online.target", "nvidia-persistenced.service", "sglang-watchdog.timer", "getty@tty1.service"],
                  ["sglang", "x.service; rm -rf /", "a b.service", "x.service\nExecStart=/bin/sh", ".service.bak"]),
    "service_name": (["sglang", "sglang-gateway", "prometheus-node-exporter"],
                     ["", "sglang gateway", "sglang;reboot", "-sglang", "../sglang"]),
    "user_name": (["sglang", "sglang-gateway", "video", "_apt"], ["", "root:root", "-x", "a b", "x" * 33, "1user"]),
    "simple_name": (["sglang-0.5.9", "baseline", "random-ids", "eagle3+spec"], ["", "../x", "a/b", "-x", "a b"]),
    "inventory_host": (["localhost", "gw-1", "sglang_gw", "10.0.0.5", "node.example"], ["", "a b", "x;y", "-x"]),
    "prometheus_duration": (["15d", "1h30m", "500ms", "0", "1y2w3d4h5m6s7ms", "90s"],
                            ["15d --web.enable-admin-api --web.enable-lifecycle", "1h])) < 0 #", "", "1.5h", "h",
                             "30m1h", "-1h", "15 d", "1H"]),
    "prometheus_size": (["512MB", "2GB", "1B"], ["", "2G", "2 GB", "1.5GB", "2GB --web.enable-admin-api", "-1GB"]),
    "port": ([1, 30000, 65535, "30001"], [0, 65536, -1, True, "30000 --flag", "", 1.5, "0x10", [1]]),
    "int 1..20": ([1, 20, "5"], [0, 21, False, "5 --flag", 3.0, "3.0"]),
    "number 0..1": ([0, 0.5, 1, "0.95", 1.0], [-0.1, 1.01, True, "0.9 or 1", "nan", ""]),
    "ip_address": (["10.0.0.5", "::1", "fe80::1"], ["10.0.0.0/8", "10.0.0.256", "host", "", 167772165, "10.0.0.5 "]),
    "ip_network": (["0.0.0.0/0", "::/0", "10.0.0.0/8", "10.1.2.3/8", "10.0.0.5", "fd00::/64"],
                   ["10.0.0.0/33", "any", "", "10.0.0.0/8; flush ruleset", "10.0.0.0/8,0.0.0.0/0"]),
    "listen_address": ([":9100", "127.0.0.1:9090", "[::1]:9093", "0.0.0.0:9100", "[::]:9100"],
                       ["9100", "localhost:9090", "::1:9093", "127.0.0.1:0", "127.0.0.1:70000",
                        ":9100 --web.enable-admin-api", "127.0.0.1:9090 ", ""]),
    "host": (["127.0.0.1", "::1", "node-1.example.org", "localhost"],
             ["", "a b", "host;reboot", "-x.example", "x..y", "under_score.example", "[::1]"]),
    "url_path": (["/health", "/health_generate", "/v1/models"],
                 ["health", "/health?x=1", "/health#x", "/he alth", "/x'", "", "/x\n"]),
    "absolute_path": (["/opt/sglang/venv", "/srv/wheelhouse/parser-requirements.txt", "/"],
                      ["opt/sglang", "/opt/../etc/shadow", "/opt/x y", "/opt/x;rm", "", "/opt/$HOME", "/opt/x\n"]),
    "path": (["inventory/production", "/opt/x", "org/model-7B"], ["../x", "a/../b", "a b", "", "a;b"]),
    "http_url": (["https://pypi.example/simple", "http://10.0.0.5:8080/x", "http://[::1]:8443"],
                 ["ftp://x", "https://", "https://x y", "https://x:99999", "file:///etc/passwd", "", "https://x'\""]),
    "pip_index_url": (["https://pypi.example/simple", "file:///srv/wheelhouse/simple"],
                      ["file://srv/x", "file:///srv/../etc", "ftp://x/simple", "--index-url=http://x", ""]),
    "version": (["0.5.9", "595.58.03", "595", "2.9.1+cu130", "13.0", "0.5.10rc0"],
                ["", "v1", "1.0 --pre", "1.0;x", ".5"]),
    "regex": (["RTX PRO 6000 Blackwell", "H200|H100", "^A[0-9]+$"], ["(", "[a-", 5]),
    "python_package": (["torch", "sgl-kernel", "sglang_router", "a"], ["", "-r", "torch==2.9", "torch ", "-torch"]),
    "pip_requirement": (["sglang==0.5.9", "torch==2.9.1+cu130", "sglang-router>=0.3", "numpy"],
                        ["--index-url=http://x", "-r /etc/x", "", "sglang==", "sglang ; rm -rf /"]),
    "debian_package": (["python3-venv", "libstdc++6", "prometheus"], ["", "Python3", "x;y", "-x", "a b"]),
    "file_mode": (["0644", "644", "0755", "1777"], [644, "0999", "u+rwx", "", "06444"]),
    "device_allow": (["char-nvidia-uvm rw", "/dev/nvidiactl rw", "char-nvidia-caps", "block-loop rwm"],
                     ["char-nvidia-uvm rw\nExecStartPre=+/bin/sh", "char-nvidia-uvm rwx", "nvidia rw", "",
                      "/dev/nvidia0 rw extra"]),
    "absolute_path or empty": (["", "/srv/wheelhouse"], ["srv", " "]),
}


@pytest.mark.parametrize("spec", list(CASES))
def test_each_format_takes_what_an_operator_writes(value_formats, spec):
    _, test = value_formats.format_check(spec)
    good, _ = CASES[spec]
    assert [value for value in good if not test(value)] == []


@pytest.mark.parametrize("spec", list(CASES))
def test_each_format_refuses_what_would_be_read_as_something_else(value_formats, spec):
    _, test = value_formats.format_check(spec)
    _, bad = CASES[spec]
    assert [value for value in bad if test(value)] == []


def test_a_refusal_names_the_variable_what_was_expected_and_the_value_with_its_type(value_formats):
    formats = {"sglang_firewall_table": "identifier", "sglang_monitoring_retention": "prometheus_duration",
               "sglang_gateway_port": "port", "sglang_watchdog_failure_threshold": "int 1..20"}
    errors = value_formats.value_format_errors({
        "sglang_firewall_table": "sglang_canon; flush ruleset",
        "sglang_monitoring_retention": "15d --web.enable-admin-api",
        "sglang_gateway_port": "8443",  # a string that is exactly an integer, as -e gives it: fine
        "sglang_watchdog_failure_threshold": True,
    }, formats)
    assert errors == [
        "sglang_firewall_table: expected an identifier (a letter, then up to 63 letters, digits or '_'),"
        ' got "sglang_canon; flush ruleset" (a string)',
        'sglang_monitoring_retention: expected a Prometheus duration (e.g. 15d, 1h30m, 500ms), got "15d --web.enable-admin-api" (a string)',
        "sglang_watchdog_failure_threshold: expected an integer in 1..20, got True (a boolean)",
    ]


def test_each_element_of_a_list_is_checked_and_named_by_its_index(value_formats):
    errors = value_formats.value_format_errors(
        {"sglang_firewall_gateway_addresses": ["10.0.0.5", "0.0.0.0/0", "10.0.0.0/8 accept", "::/0"]},
        {"sglang_firewall_gateway_addresses": "ip_network"})
    assert errors == ['sglang_firewall_gateway_addresses[2]: expected an IP address or a CIDR network, got "10.0.0.0/8 accept" (a string)']


def test_null_values_and_variables_without_a_format_are_not_checked(value_formats):
    assert value_formats.value_format_errors(
        {"stack_verify_expected_nccl_version": None, "sglang_server_args": {"x": "; rm"}, "free": "a b; c"},
        {"stack_verify_expected_nccl_version": "version"}) == []


def test_a_control_character_is_shown_escaped_in_the_refusal(value_formats):
    errors = value_formats.value_format_errors({"sglang_service_user": "sg\nlang"}, {"sglang_service_user": "user_name"})
    assert errors == ["sglang_service_user: expected a user or group name (a letter or '_', then up to 31 letters, digits, '_',"
                      """ '.' or '-'), got "sg\\nlang" (a string)"""]


@pytest.mark.parametrize("spec", ["identfier", "int 1..", "int 5..1", "int 1.5..3", "port or none", 5, "number a..b"])
def test_an_unknown_or_malformed_format_is_an_error_not_a_pass(value_formats, spec):
    with pytest.raises(ValueError):
        value_formats.format_check(spec)


def test_a_typo_in_a_roles_file_or_two_formats_for_one_variable_name_the_file(value_formats, tmp_path):
    (tmp_path / "a" / "meta").mkdir(parents=True)
    (tmp_path / "b" / "meta").mkdir(parents=True)
    (tmp_path / "a" / "meta" / "value_formats.yml").write_text("value_formats: {x: identifier, y: port}\n")
    (tmp_path / "b" / "meta" / "value_formats.yml").write_text("value_formats: {x: identifier}\n")
    assert value_formats.role_value_formats(tmp_path) == {"x": "identifier", "y": "port"}
    (tmp_path / "b" / "meta" / "value_formats.yml").write_text("value_formats: {x: absolute_path}\n")
    with pytest.raises(ValueError, match=r"b/meta/value_formats.yml: x: format 'absolute_path', but .*a/meta/value_formats.yml says 'identifier'"):
        value_formats.role_value_formats(tmp_path)
    (tmp_path / "b" / "meta" / "value_formats.yml").write_text("value_formats: {z: int 1..}\n")
    with pytest.raises(ValueError, match=r"b/meta/value_formats.yml: z: unknown format"):
        value_formats.role_value_formats(tmp_path)


# --- every role's declarations -------------------------------------------------------------------

# Read from the node by the roles (facts), never from the inventory (as in check_control_characters.yml).
NODE_FACTS = {"sglang_check_mode", "sglang_stack", "production_doc_gpu_topology", "production_doc_stack", "production_doc_nccl"}
# Types whose values can carry a string or a number to a command line, a file or a query. Mappings
# and lists of mappings are checked by their own parsers (sglang_argv, the gateway's and the models'
# checks); options with `choices` are checked by Ansible against their list.
SCALAR_TYPES = {"str", "int", "float", "path"}


def _role_files(role_dir):
    spec = yaml.safe_load((role_dir / "meta" / "argument_specs.yml").read_text())["argument_specs"]
    formats_file = role_dir / "meta" / "value_formats.yml"
    declared = yaml.safe_load(formats_file.read_text()) if formats_file.is_file() else {}
    return spec, declared or {}


def _options_needing_a_format(spec):
    names = set()
    for entry in spec.values():
        for name, option in (entry.get("options") or {}).items():
            kind = option.get("type", "str")
            scalar = kind in SCALAR_TYPES or (kind == "list" and option.get("elements") in SCALAR_TYPES)
            if scalar and "choices" not in option and name not in NODE_FACTS:
                names.add(name)
    return names


def test_every_role_option_has_a_format_or_a_reason():
    missing, stale = {}, {}
    for spec_file in sorted(ROLES.glob("*/meta/argument_specs.yml")):
        role_dir = spec_file.parent.parent
        spec, declared = _role_files(role_dir)
        formats, reasons = declared.get("value_formats") or {}, declared.get("free_text") or {}
        needed = _options_needing_a_format(spec)
        options = {name for entry in spec.values() for name in (entry.get("options") or {})}
        if needed - set(formats) - set(reasons):
            missing[role_dir.name] = sorted(needed - set(formats) - set(reasons))
        if (set(formats) | set(reasons)) - options:
            stale[role_dir.name] = sorted((set(formats) | set(reasons)) - options)
        assert all(isinstance(reason, str) and reason.strip() for reason in reasons.values()), role_dir.name
    assert not missing, f"options with neither a format nor a free_text reason in roles/ROLE/meta/value_formats.yml: {missing}"
    assert not stale, f"value_formats.yml entries that are not options of the role's argument spec: {stale}"


def test_the_formats_of_every_role_merge_and_parse(value_formats):
    formats = value_formats.role_value_formats(ROLES)
    assert {"sglang_worker_port", "sglang_service_after_units"} <= set(formats)


def _plain(value):
    return not (isinstance(value, str) and "{{" in value)


def test_every_default_and_inventory_value_has_its_format(value_formats):
    # A format that refuses our own defaults or shipped inventories would stop every run.
    formats = value_formats.role_value_formats(ROLES)
    sources = sorted(ROLES.glob("*/defaults/main.yml")) + sorted((REPO / "inventory").glob("*/group_vars/*.yml"))
    errors = []
    for source in sources:
        values = {name: value for name, value in (yaml.safe_load(source.read_text()) or {}).items()
                  if _plain(value) and not (isinstance(value, list) and not all(map(_plain, value)))}
        errors += [f"{source.relative_to(REPO)}: {line}" for line in value_formats.value_format_errors(values, formats)]
    assert errors == []
