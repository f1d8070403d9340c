"""roles/sglang_gateway's pure logic: worker URLs from the nodes' variables, argv (its TLS checks: tests/roles/test_sglang_gateway_tls_role.py)."""

import subprocess
from pathlib import Path

import pytest
import yaml
from project_modules import REPO


@pytest.fixture(scope="module")
def gateway(project_module):
    return project_module("filter_plugins/sglang_gateway.py")


def test_worker_url_fallbacks_equal_the_sglang_role_defaults(gateway):
    # A node's role defaults are not in hostvars: the filter's fallbacks must be those defaults.
    defaults = yaml.safe_load((REPO / "roles/sglang/defaults/main.yml").read_text())
    assert gateway.DEFAULT_WORKER_HOST == defaults["sglang_worker_host"]
    assert gateway.DEFAULT_WORKER_PORT == defaults["sglang_worker_port"]
    assert defaults["sglang_server_args"]["host"] == "{{ sglang_worker_host }}"
    assert defaults["sglang_server_args"]["port"] == "{{ sglang_worker_port }}"


def test_worker_urls_follow_each_nodes_variables_in_order(gateway):
    hostvars = {
        "a": {},
        "b": {"sglang_worker_host": "10.0.0.2"},
        "c": {"sglang_worker_host": "10.0.0.3", "sglang_worker_port": 31000},
        "d": {"sglang_worker_host": "10.0.0.4", "sglang_server_args": {"port": 32000}},
        "e": {"sglang_worker_url": "http://node-e.internal:30000"},
        "f": {"sglang_worker_host": "fd00::6"},
    }
    assert gateway.sglang_gateway_worker_urls(list("abcdef"), hostvars) == [
        "http://127.0.0.1:30000", "http://10.0.0.2:30000", "http://10.0.0.3:31000",
        "http://10.0.0.4:32000", "http://node-e.internal:30000", "http://[fd00::6]:30000",
    ]


def test_the_sglang_roles_worker_url_default_is_the_filters_url(gateway):
    # roles/sglang's sglang_worker_url (read on the node itself, where role defaults apply) and
    # the filter (what the gateway registers, and sglang_service's URL) mean one URL.
    import jinja2  # pylint: disable=import-outside-toplevel

    defaults = yaml.safe_load((REPO / "roles/sglang/defaults/main.yml").read_text())
    rendered = jinja2.Template(defaults["sglang_worker_url"]).render(defaults)
    assert rendered == gateway.worker_url({}) == "http://127.0.0.1:30000"
    node = {"sglang_worker_host": "10.0.0.2", "sglang_worker_port": 31000}
    assert jinja2.Template(defaults["sglang_worker_url"]).render(node) == gateway.worker_url(node)


def test_sglang_service_takes_its_worker_url_from_the_filter():
    # One function for both sides: the node leaves and rejoins under the URL the gateway registered.
    service_vars = yaml.safe_load((REPO / "roles/sglang_service/vars/main.yml").read_text())
    assert service_vars["__sglang_service_worker_url"] == (
        "{{ [inventory_hostname] | sglang_gateway_worker_urls(hostvars) | first }}")
    gateway_vars = yaml.safe_load((REPO / "roles/sglang_gateway/vars/main.yml").read_text())
    assert "sglang_gateway_worker_urls(hostvars)" in gateway_vars["__sglang_gateway_worker_urls"]


def _worker_errors(gateway, nodes, hostvars, on="gw"):
    hostvars = {"gw": {"ansible_host": "10.0.0.100"}, **hostvars}
    return gateway.sglang_gateway_worker_errors(nodes, hostvars, on)


def test_nodes_with_their_own_addresses_behind_a_gateway_elsewhere_pass(gateway):
    hostvars = {"a": {"sglang_worker_host": "10.0.0.1"}, "b": {"sglang_worker_host": "10.0.0.2"},
                "c": {"sglang_worker_url": "http://node-c.internal:30000"}}
    assert _worker_errors(gateway, ["a", "b", "c"], hostvars) == []


def test_a_gateway_on_the_node_itself_reaches_its_loopback(gateway):
    # the canonical single node: one host in both groups, or two names for one ansible_host
    assert _worker_errors(gateway, ["gw"], {}) == []
    assert _worker_errors(gateway, ["node"], {"node": {"ansible_host": "10.0.0.100"}}) == []


@pytest.mark.parametrize("variables, variable, address", [
    ({}, "sglang_worker_host", "127.0.0.1"),
    ({"sglang_worker_host": "127.0.1.1"}, "sglang_worker_host", "127.0.1.1"),
    ({"sglang_worker_host": "localhost"}, "sglang_worker_host", "localhost"),
    ({"sglang_worker_host": "::1"}, "sglang_worker_host", "::1"),
    ({"sglang_worker_host": "0.0.0.0"}, "sglang_worker_host", "0.0.0.0"),
    ({"sglang_worker_url": "http://127.0.0.1:31000"}, "sglang_worker_url", "127.0.0.1"),
])
def test_a_loopback_node_behind_a_gateway_on_another_host_is_refused_naming_it(gateway, variables, variable, address):
    errors = _worker_errors(gateway, ["n1"], {"n1": {"ansible_host": "10.0.0.1", **variables}})
    assert len(errors) == 1, errors
    assert errors[0].startswith(f"{variable} of n1: its worker URL ")
    assert f"is on {address}, which only n1 itself reaches, and the gateway gw is another host" in errors[0]
    assert errors[0].endswith("expected n1's address as gw reaches it (its private address)")


def test_nodes_sharing_a_worker_url_are_refused_naming_them(gateway):
    # three nodes without sglang_worker_host, their gateway on the first: all at 127.0.0.1:30000
    hostvars = {"gw": {}, "n2": {}, "n3": {}, "n4": {"sglang_worker_host": "10.0.0.4"}}
    errors = gateway.sglang_gateway_worker_errors(["gw", "n2", "n3", "n4"], hostvars, "gw")
    assert errors[-1] == ("sglang_worker_host: gw, n2 and n3 have the same worker URL http://127.0.0.1:30000; "
                          "expected a URL of its own for each node (each node's own address in sglang_worker_host)")
    # n2 and n3 are also out of reach of the gateway on gw; gw's own loopback is not
    assert [e.split(":")[0] for e in errors[:-1]] == ["sglang_worker_host of n2", "sglang_worker_host of n3"]
    two = gateway.sglang_gateway_worker_errors(
        ["a", "b"], {"gw": {}, "a": {"sglang_worker_host": "10.0.0.9"},
                     "b": {"sglang_worker_url": "http://10.0.0.9:30000"}}, "gw")
    assert two == ["sglang_worker_host: a and b have the same worker URL http://10.0.0.9:30000; "
                   "expected a URL of its own for each node (each node's own address in sglang_worker_host)"]


def test_the_gateway_check_refuses_with_the_worker_errors():
    check = (REPO / "roles/sglang_gateway/tasks/check.yml").read_text()
    assert "sglang_gateway_worker_errors(hostvars, inventory_hostname)" in check


def test_gateway_args_render_through_the_server_args_renderer(project_module):
    sglang_argv = project_module("filter_plugins/sglang_argv.py").sglang_argv
    defaults = yaml.safe_load((REPO / "roles/sglang_gateway/defaults/main.yml").read_text())
    argv = sglang_argv(defaults["sglang_gateway_args"], "sglang_gateway_args")
    assert argv[:2] == ["--policy", "cache_aware"]
    assert "--prometheus-host" in argv and argv[argv.index("--prometheus-host") + 1] == "127.0.0.1"
    from ansible.errors import AnsibleFilterError  # pylint: disable=import-outside-toplevel
    with pytest.raises(AnsibleFilterError, match="sglang_gateway_args: 'Bad' is not an option name"):
        sglang_argv({"Bad": 1}, "sglang_gateway_args")


def _testnode_util():
    import sys  # pylint: disable=import-outside-toplevel

    sys.path.insert(0, str(REPO / "tests"))
    from testnode_lib import util  # pylint: disable=import-outside-toplevel

    return util


def test_harness_puts_a_node_into_an_extra_group_with_host_vars():
    util = _testnode_util()
    nodes = [{"name": "tn-1", "ip": "10.213.0.2", "host_ip": "10.213.0.1",
              "host_vars": {"sglang_worker_host": "10.213.0.2"}},
             util.add_to_group({"name": "tn-2", "ip": "10.213.0.6", "host_ip": "10.213.0.5"}, "sglang_gateways",
                               {"sglang_gateway_api_keys": ["k"], "sglang_gateway_url": "https://10.213.0.6:8443"})]
    groups = yaml.safe_load(util.render_inventory(nodes, "/k"))["all"]["children"]
    assert list(groups["sglang_nodes"]["hosts"]) == ["tn-1"]
    assert groups["sglang_nodes"]["hosts"]["tn-1"]["sglang_worker_host"] == "10.213.0.2"
    gateway = groups["sglang_gateways"]["hosts"]["tn-2"]
    assert gateway["sglang_gateway_api_keys"] == ["k"] and gateway["ansible_host"] == "10.213.0.6"


def test_harness_routes_peers_through_the_host():
    text = _testnode_util().render_network_file("10.213.0.2", 30, "10.213.0.0/16", "10.213.0.1")
    assert "[Route]\nDestination=10.213.0.0/16\nGateway=10.213.0.1\n" in text
    assert "[Route]" not in _testnode_util().render_network_file("10.213.0.2", 30)


# The launcher the gateway's unit runs (roles/sglang_gateway/files/sglang-gateway-launch), with the
# real sglang-router 0.3.2 of the wheelhouse: its --check is what the role asks before it writes
# anything, and its start hands the API key to the router in its own process.
LAUNCHER = REPO / "roles/sglang_gateway/files/sglang-gateway-launch"
ROUTER_VERSION = "0.3.2"


@pytest.fixture(scope="module")
def router_python(tmp_path_factory):
    """Python of a venv with sglang-router and its closure from the wheelhouse (as the test gateway has them)."""
    from parser_venv import WHEELHOUSE, _base_python, ensure_wheelhouse  # pylint: disable=import-outside-toplevel

    ensure_wheelhouse()
    venv = tmp_path_factory.mktemp("router-venv")
    subprocess.run([_base_python(), "-m", "venv", str(venv)], check=True)
    subprocess.run([str(venv / "bin/python"), "-m", "pip", "install", "--quiet", "--no-index", "--no-deps",
                    "--find-links", str(WHEELHOUSE), "-r", str(WHEELHOUSE / "gateway-requirements.txt")], check=True)
    return str(venv / "bin/python")


def _check(python, *argv):
    done = subprocess.run([python, "-", "--check", *argv], input=LAUNCHER.read_text(), capture_output=True,
                          text=True, check=True)
    return done.stdout


def test_the_launchers_check_returns_the_routers_own_refusal_and_the_filter_names_the_variable(gateway, router_python):
    args = {"policy": "fastest", "retry_max_retries": 5}
    answer = _check(router_python, "--host", "0.0.0.0", "--port", "8443", "--policy", "fastest",
                    "--retry-max-retries", "5", "--worker-urls", "http://10.0.0.1:30000")
    verdict = gateway.sglang_gateway_parser_verdict(answer, args, ROUTER_VERSION)
    assert verdict["pending"] is False
    (error,) = verdict["errors"]
    assert error.startswith("sglang_gateway_args.policy: sglang-router 0.3.2 refused"), error
    assert "invalid choice: 'fastest'" in error and "round_robin" in error, error


@pytest.mark.parametrize("argv, variable", [
    (["--port", "99999"], "sglang_gateway_args, sglang_gateway_host or sglang_gateway_port"),  # the Rust side's u16
    (["--port", "8443", "--retry-max-retries", "many"], "sglang_gateway_args.retry_max_retries"),
    (["--port", "8443", "--no-such-option", "1"], "sglang_gateway_args.no_such_option"),
])
def test_each_refusal_names_its_variable(gateway, router_python, argv, variable):
    args = {"retry_max_retries": "many", "no_such_option": 1}
    verdict = gateway.sglang_gateway_parser_verdict(_check(router_python, *argv), args, ROUTER_VERSION)
    assert [e.split(": sglang-router", 1)[0] for e in verdict["errors"]] == [variable], verdict


def test_accepted_arguments_have_no_errors(gateway, router_python):
    defaults = yaml.safe_load((REPO / "roles/sglang_gateway/defaults/main.yml").read_text())
    argv = gateway_argv(defaults["sglang_gateway_args"])
    verdict = gateway.sglang_gateway_parser_verdict(_check(router_python, "--port", "8443", *argv),
                                                    defaults["sglang_gateway_args"], ROUTER_VERSION)
    assert verdict == {"pending": False, "errors": []}


def gateway_argv(args):
    return [word for key, value in args.items() for word in (f"--{key.replace('_', '-')}", str(value))]


@pytest.mark.parametrize("answer", [
    "",  # no interpreter yet: the command did not run
    '{"version": null, "error": "sglang-router is not importable", "option": null}',
    '{"version": "0.3.1", "error": null, "option": null}',  # an older release, before pip upgrades it
])
def test_no_answer_of_the_wanted_release_is_pending(gateway, answer):
    assert gateway.sglang_gateway_parser_verdict(answer, {}, ROUTER_VERSION) == {"pending": True, "errors": []}


def test_the_check_answers_without_sglang_router(tmp_path):
    done = subprocess.run(["python3", "-", "--check", "--port", "8443"], input=LAUNCHER.read_text(),
                          capture_output=True, text=True, check=True, cwd=tmp_path)
    assert '"version": null' in done.stdout


def _free_port():
    import socket  # pylint: disable=import-outside-toplevel

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _status(url, key=None):
    import urllib.error  # pylint: disable=import-outside-toplevel
    import urllib.request  # pylint: disable=import-outside-toplevel

    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"} if key else {})
    try:
        with urllib.request.urlopen(request, timeout=2) as response:  # noqa: S310 (loopback)
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def test_the_launcher_starts_the_router_with_the_credentials_key_in_no_argv_or_environment(router_python, tmp_path):
    import time  # pylint: disable=import-outside-toplevel

    key = "sk-unit-test-key-0123456789"
    (tmp_path / "api_key").write_text(key + "\n")
    port = _free_port()
    environment = {"PATH": "/usr/bin:/bin", "CREDENTIALS_DIRECTORY": str(tmp_path), "NO_COLOR": "1"}
    router = subprocess.Popen(  # pylint: disable=consider-using-with
        [router_python, str(LAUNCHER), "--host", "127.0.0.1", "--port", str(port), "--prometheus-port",
         str(_free_port()), "--worker-urls"], env=environment, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        seen = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            seen.append(Path(f"/proc/{router.pid}/cmdline").read_bytes() + Path(f"/proc/{router.pid}/environ").read_bytes())
            try:
                if _status(f"http://127.0.0.1:{port}/liveness") == 200:
                    break
            except OSError:
                time.sleep(0.05)
        assert _status(f"http://127.0.0.1:{port}/workers") == 401
        assert _status(f"http://127.0.0.1:{port}/workers", key) == 200
        assert any(b"sglang-gateway-launch" in s for s in seen)  # polled before setproctitle too
        assert not any(key.encode() in s for s in seen)
    finally:
        router.terminate()
        router.wait(timeout=30)


def test_the_launcher_refuses_a_key_on_the_command_line_and_an_empty_credential(router_python, tmp_path):
    (tmp_path / "api_key").write_text("\n")
    for argv, environment, words in [
        (["--api-key", "sk-x"], {}, "--api-key on the command line"),
        ([], {"CREDENTIALS_DIRECTORY": str(tmp_path)}, "is empty"),
    ]:
        done = subprocess.run([router_python, str(LAUNCHER), "--port", "1", *argv], env={"PATH": "/usr/bin:/bin", **environment},
                              capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode != 0 and words in done.stderr, done.stderr
