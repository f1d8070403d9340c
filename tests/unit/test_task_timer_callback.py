"""sglang_task_timer: silent by default, the slowest tasks first when SGLANG_TASK_TIMER=1."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

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


def _run(tmp_path, **env):
    playbook = tmp_path / "timed.yml"
    playbook.write_text(PLAYBOOK)
    done = subprocess.run(
        [str(REPO / ".venv" / "bin" / "ansible-playbook"), "-i", "localhost,", "-c", "local",
         "-e", f"ansible_python_interpreter={sys.executable}", str(playbook)],
        cwd=REPO, capture_output=True, text=True, timeout=120,
        env={**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1", **env},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.mark.parametrize("env", [{}, {"SGLANG_TASK_TIMER": "0"}])
def test_prints_nothing_unless_enabled(tmp_path, env):
    assert "TASK TIMES" not in _run(tmp_path, **env)


def test_lists_the_slowest_task_first_with_its_time(tmp_path):
    out = _run(tmp_path, SGLANG_TASK_TIMER="1")
    table = out[out.index("TASK TIMES (slowest 2 of 2)"):].splitlines()[1:]
    timed = [re.fullmatch(r"\s*([0-9.]+)s  (.+)", line).groups() for line in table if line.strip()]
    assert [name for _, name in timed] == ["Slow task", "Quick task", "total over 2 tasks"]
    assert float(timed[0][0]) >= 0.5
    assert float(timed[2][0]) >= float(timed[0][0]) + float(timed[1][0]) - 0.02  # rounding of the shown values


def test_top_limits_the_table(tmp_path):
    out = _run(tmp_path, SGLANG_TASK_TIMER="1", SGLANG_TASK_TIMER_TOP="1")
    assert "TASK TIMES (slowest 1 of 2)" in out and "Slow task" in out.split("TASK TIMES")[1]
    assert "Quick task" not in out.split("TASK TIMES")[1]
