"""Task timings as README.md documents them: ansible.posix's profile_tasks, added for one run by the
README's ANSIBLE_CALLBACKS_ENABLED line, lists the slowest task first; an ordinary run prints none."""

import configparser
import re
import shlex
import sys

import pytest

from ansible_run import run_playbook
from project_modules import REPO

PLAYBOOK = """
- name: Two tasks of known length
  hosts: localhost
  gather_facts: false
  tasks:
    - name: Quick task
      ansible.builtin.debug:
        msg: quick
    - name: Slow task
      ansible.builtin.command: sleep 0.5
      changed_when: false
"""


@pytest.fixture(name="readme_environment")
def fixture_readme_environment():
    """The variables README.md's timing command line sets (NAME=value words before ansible-playbook)."""
    lines = [line for line in (REPO / "README.md").read_text().splitlines() if "ansible.posix.profile_tasks" in line
             and "ansible-playbook" in line]
    assert len(lines) == 1, f"README.md: expected one command line with ansible.posix.profile_tasks, got {lines}"
    words = shlex.split(lines[0])
    return dict(word.split("=", 1) for word in words[:next(i for i, w in enumerate(words) if "=" not in w)])


def _run(tmp_path, envvars):
    playbook = tmp_path / "timed.yml"
    playbook.write_text(PLAYBOOK)
    inventory = tmp_path / "hosts"
    inventory.write_text(f"localhost ansible_connection=local ansible_python_interpreter={sys.executable}\n")
    result = run_playbook(playbook, inventory, envvars={"ANSIBLE_NOCOLOR": "1", **envvars})
    assert result.rc == 0, result.stdout
    return result.stdout


def test_the_readme_line_keeps_every_callback_of_ansible_cfg(readme_environment):
    config = configparser.ConfigParser()
    config.read(REPO / "ansible.cfg")
    configured = [name.strip() for name in config["defaults"]["callbacks_enabled"].split(",")]
    assert readme_environment["ANSIBLE_CALLBACKS_ENABLED"].split(",") == [*configured, "ansible.posix.profile_tasks"]


def test_an_ordinary_run_prints_no_timings(tmp_path):
    assert "TASKS RECAP" not in _run(tmp_path, {})


def test_the_readme_line_lists_the_slowest_task_first_with_its_time(tmp_path, readme_environment):
    out = _run(tmp_path, readme_environment)
    recap = out[out.index("TASKS RECAP"):].splitlines()[3:]
    timed = [re.fullmatch(r"(.+?) -+ ([0-9.]+)s", line).groups() for line in recap if line.strip()]
    assert [name for name, _ in timed] == ["Slow task", "Quick task"]
    assert float(timed[0][1]) >= 0.5
