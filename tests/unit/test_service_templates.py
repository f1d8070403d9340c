"""The unit and environment templates of sglang_service, rendered with the role's own filters."""


import jinja2
import pytest
import yaml

import expected
from project_modules import REPO

TEMPLATES = REPO / "roles" / "sglang_service" / "templates"


@pytest.fixture(scope="module")
def render(project_module):
    """Render a template of the role with the testnode's variables (and overrides) and the argv filters."""
    filters = project_module("filter_plugins/sglang_argv.py").FilterModule().filters()
    return lambda name, **overrides: _render(filters, name, **overrides)


def _render(filters, name, **overrides):
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), undefined=jinja2.StrictUndefined,
                             trim_blocks=True)
    env.filters.update(filters)
    variables = expected.testnode_vars()
    # the shared values (sglang_libexec: the folder of the helper programs), then the role's
    variables.update(yaml.safe_load((REPO / "roles" / "sglang" / "vars" / "main.yml").read_text()))
    variables.update(yaml.safe_load((REPO / "roles" / "sglang_service" / "vars" / "main.yml").read_text()))
    variables.update({
        "ansible_managed": "managed by sglang-canon",
        "sglang_server_argv": expected.server_argv(),
        "__sglang_service_supplementary_groups": [],
        "sglang_health_url": "http://127.0.0.1:30000/health",
        "sglang_service_effective_environment": variables["sglang_service_environment"],
    })
    variables.update(overrides)
    return env.get_template(name).render(**variables)


def test_unit_execstart_is_the_launcher_plus_the_rendered_argv(render):
    unit = render("sglang.service.j2")
    assert f"ExecStart={expected.systemd_exec_line(expected.exec_argv())}" in unit.splitlines()


def test_unit_waits_for_health_within_the_start_timeout(render):
    unit = render("sglang.service.j2").splitlines()
    assert "ExecStartPost=/usr/local/libexec/sglang-canon/sglang-wait-healthy http://127.0.0.1:30000/health 120" in unit
    assert "TimeoutStartSec=120" in unit


def test_unit_is_hardened_but_lets_the_gpus_through(render):
    unit = render("sglang.service.j2").splitlines()
    for line in ("NoNewPrivileges=yes", "ProtectSystem=strict", "ProtectHome=yes", "PrivateTmp=yes",
                 "CapabilityBoundingSet=", "DevicePolicy=closed", "DeviceAllow=char-nvidia-frontend rw",
                 "DeviceAllow=char-nvidia-uvm rw", "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6 AF_NETLINK"):
        assert line in unit


def test_supplementary_groups_only_when_some_exist(render):
    assert "SupplementaryGroups" not in render("sglang.service.j2")
    assert "SupplementaryGroups=video render" in render("sglang.service.j2",
                                                        __sglang_service_supplementary_groups=["video", "render"])


def test_environment_file_quotes_values_for_systemd(render):
    text = render("sglang.env.j2", sglang_service_effective_environment={"B": 'say "hi"', "A": "1"})
    assert text.splitlines()[-2:] == ['A="1"', 'B="say \\"hi\\""']
