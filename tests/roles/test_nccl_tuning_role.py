"""The nccl_tuning role run for real by ansible-playbook on this machine, every path in a temp dir.

Covers what needs no systemd: choosing, validating before any change, the sitecustomize and
nccl.conf blocks (written, switched, shrunk, removed), the handler notifications, idempotence and
check mode. tests/integration/test_nccl_tuning.py checks the same on a systemd node with the service.
The tests of one node (the `box` fixture) are steps of one story and run in file order.
"""

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import yaml
from ansible_run import run_playbook

MARK = "sglang-canon nccl_tuning"
SITECUSTOMIZE_LOCATOR = (
    "import importlib.util as u, site; s = u.find_spec('sitecustomize');"
    "print(s.origin if s else site.getsitepackages()[0])"
)


def private_python(root):
    """A Python whose sitecustomize.py can only be one inside root: a venv on a private copy of this Python.

    The role writes into the sitecustomize.py its interpreter imports. A plain venv would import one of
    the base installation's stdlib directory where there is one (Debian's /usr/lib/python3.11/
    sitecustomize.py), so the base is rebuilt under root first: this interpreter's binary copied, its
    lib/ linked entry by entry, and its stdlib directory linked file by file without sitecustomize.py.
    Python finds its prefix from the binary's own location, so the copy runs on that private stdlib.
    """
    base = Path(os.path.realpath(getattr(sys, "_base_executable", sys.executable)))
    stdlib = Path(sysconfig.get_paths()["stdlib"])  # <base prefix>/lib/pythonX.Y
    prefix = root / "base"
    (prefix / "bin").mkdir(parents=True)
    shutil.copy2(base, prefix / "bin" / base.name)
    lib = prefix / "lib"
    lib.mkdir()
    for entry in stdlib.parent.iterdir():
        if entry.name != stdlib.name:
            (lib / entry.name).symlink_to(entry)
    (lib / stdlib.name).mkdir()
    for entry in stdlib.iterdir():
        if entry.name not in ("sitecustomize.py", "site-packages", "dist-packages", "__pycache__"):
            (lib / stdlib.name / entry.name).symlink_to(entry)
    subprocess.run([str(prefix / "bin" / base.name), "-m", "venv", "--without-pip", str(root / "venv")], check=True)
    python = root / "venv" / "bin" / "python"
    where = subprocess.run(
        [str(python), "-c", SITECUSTOMIZE_LOCATOR], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert where.startswith(str(root)), (
        f"the private Python {python} still imports a sitecustomize outside {root} ({where}); "
        "the test will not touch it: fix private_python() for this installation"
    )
    return python, where


@pytest.fixture(scope="module")
def box(tmp_path_factory):
    root = tmp_path_factory.mktemp("nccl_role")
    py, where = private_python(root)
    playbook = root / "play.yml"
    playbook.write_text(
        yaml.safe_dump(
            [
                {
                    "name": "nccl_tuning on localhost",
                    "hosts": "localhost",
                    "connection": "local",
                    "gather_facts": False,
                    "roles": ["nccl_tuning"],
                    "handlers": [{"name": "Restart sglang service", "ansible.builtin.debug": {"msg": "restart"}}],
                },
                {
                    "name": "dump facts",
                    "hosts": "localhost",
                    "connection": "local",
                    "gather_facts": False,
                    "tasks": [
                        {
                            "name": "Dump",
                            "changed_when": False,
                            "ansible.builtin.copy": {
                                "dest": str(root / "facts.json"),
                                "mode": "0644",
                                "content": "{{ {'applied': nccl_tuning_applied, 'service_env': nccl_tuning_service_environment} | to_json }}",
                            },
                        }
                    ],
                },
            ]
        )
    )
    inventory = root / "hosts"
    inventory.write_text(f"localhost ansible_connection=local ansible_python_interpreter={sys.executable}\n")

    class Box:
        venv_python = py
        site_file = Path(where) / "sitecustomize.py" if not where.endswith(".py") else Path(where)
        conf = root / "etc" / "nccl.conf"
        state = root / "state"

        def run(self, check=False, **extra):
            extravars = {
                "sglang_state_dir": str(self.state),
                "nccl_tuning_nccl_conf_path": str(self.conf),
                "nccl_tuning_sitecustomize_python": str(py),
                "nccl_tuning_interconnect": "pcie",
                **extra,
            }
            result = run_playbook(playbook, inventory, extravars=extravars, check=check, testnode_vars=False,
                                  envvars={"ANSIBLE_NOCOLOR": "1"})
            facts = json.loads((root / "facts.json").read_text()) if result.rc == 0 else None
            return result.rc, result.stdout, result.count("changed") if result.stats else None, facts

    return Box()


def env_seen_by(python, name):
    return subprocess.run(
        [str(python), "-c", f"import os; print(os.environ.get({name!r}))"],
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": "/usr/bin:/bin"},
    ).stdout.strip()


def test_service_delivery_sets_the_fact_only(box):
    rc, out, _, facts = box.run()
    assert rc == 0, out[-3000:]
    assert facts["service_env"] == {"NCCL_ALGO": "Ring", "NCCL_PROTO": "LL"}
    applied = facts["applied"]
    assert applied["delivery"] == "service" and applied["source"] == "pcie default"
    assert applied["settings"] == facts["service_env"] and applied["measurement"] is None
    assert set(applied["setting_reasons"]) == {"NCCL_ALGO", "NCCL_PROTO"}
    assert not box.conf.exists() and not box.site_file.exists()
    assert "RUNNING HANDLER [Restart sglang service]" not in out  # sglang_service restarts on env change
    assert json.loads((box.state / "nccl" / "applied.json").read_text())["places"]["service"] == "sglang"


def test_sitecustomize_delivery_reaches_every_process_of_that_python(box):
    rc, out, _, facts = box.run(nccl_tuning_delivery="sitecustomize")
    assert rc == 0, out[-3000:]
    assert facts["service_env"] == {}
    text = box.site_file.read_text()
    assert f"# BEGIN {MARK}" in text and 'environ.setdefault("NCCL_PROTO", "LL")' in text
    assert env_seen_by(box.venv_python, "NCCL_PROTO") == "LL"
    assert env_seen_by(box.venv_python, "NCCL_ALGO") == "Ring"
    assert "RUNNING HANDLER [Restart sglang service]" in out
    assert facts["applied"]["places"]["sitecustomize"] == str(box.site_file.resolve())


def test_second_run_changes_nothing(box):
    rc, out, changed, _ = box.run(nccl_tuning_delivery="sitecustomize")
    assert rc == 0 and changed == 0, out[-3000:]


def test_check_mode_predicts_the_switch_without_making_it(box):
    rc, out, changed, _ = box.run(check=True, nccl_tuning_delivery="nccl_conf")
    assert rc == 0 and changed > 0, out[-3000:]
    assert not box.conf.exists() and MARK in box.site_file.read_text()


def test_switch_to_nccl_conf_moves_the_settings(box):
    box.site_file.write_text("# kept: someone else's line\n" + box.site_file.read_text())
    rc, out, _, facts = box.run(nccl_tuning_delivery="nccl_conf")
    assert rc == 0, out[-3000:]
    conf = box.conf.read_text()
    assert "NCCL_ALGO=Ring\nNCCL_PROTO=LL\n" in conf and f"# BEGIN {MARK}" in conf
    assert "=" not in "".join(line for line in conf.splitlines() if line.startswith("#"))  # NCCL < 2.19 safe
    assert MARK not in box.site_file.read_text()
    assert "someone else's line" in box.site_file.read_text()
    assert env_seen_by(box.venv_python, "NCCL_PROTO") == "None"
    assert "RUNNING HANDLER [Restart sglang service]" in out
    assert facts["service_env"] == {} and facts["applied"]["places"]["nccl_conf"] == str(box.conf)


def test_removing_a_variable_removes_it(box):
    rc, out, _, facts = box.run(nccl_tuning_delivery="nccl_conf", nccl_tuning_settings={"NCCL_PROTO": "LL"})
    assert rc == 0, out[-3000:]
    assert "NCCL_ALGO" not in box.conf.read_text() and "NCCL_PROTO=LL" in box.conf.read_text()
    assert facts["applied"]["source"] == "inventory"


def test_invalid_value_fails_naming_it_before_anything_changes(box):
    before = box.conf.read_text()
    rc, out, _, _ = box.run(nccl_tuning_delivery="service", nccl_tuning_settings={"NCCL_PROTO": "LL129"})
    assert rc != 0
    assert "nccl_tuning_settings: NCCL_PROTO='LL129' unknown protocol 'LL129'" in out
    assert box.conf.read_text() == before  # validation runs before any delivery or cleanup


def test_unknown_name_and_bad_delivery_fail(box):
    rc, out, _, _ = box.run(nccl_tuning_pcie_settings={"NCCL_ALGOS": "Ring"})
    assert rc != 0 and "nccl_tuning_pcie_settings: NCCL_ALGOS is not an NCCL variable" in out
    rc, out, _, _ = box.run(nccl_tuning_delivery="environment")
    assert rc != 0 and "nccl_tuning_delivery" in out


def test_back_to_service_cleans_everywhere(box):
    rc, out, _, facts = box.run()
    assert rc == 0, out[-3000:]
    assert MARK not in box.conf.read_text() and MARK not in box.site_file.read_text()
    assert facts["service_env"] == {"NCCL_ALGO": "Ring", "NCCL_PROTO": "LL"}


def test_nvlink_node_gets_nccl_defaults_and_measurement_is_reported(box):
    choice = {"chosen": "defaults", "settings": {}, "rule": "r", "table_md": "| t |"}
    (box.state / "nccl").mkdir(parents=True, exist_ok=True)
    (box.state / "nccl" / "choice.json").write_text(json.dumps(choice))
    rc, out, _, facts = box.run(nccl_tuning_interconnect="nvlink")
    assert rc == 0, out[-3000:]
    assert facts["service_env"] == {} and facts["applied"]["source"] == "nvlink default"
    assert facts["applied"]["measurement"]["table_md"] == "| t |"
    rc, out, _, facts = box.run(nccl_tuning_use_measurement=True)
    assert rc == 0 and facts["applied"]["source"] == "measurement" and facts["service_env"] == {}
