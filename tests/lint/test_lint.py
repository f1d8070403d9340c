"""Lint tier: yamllint and ansible-lint's production profile over the whole project."""

import subprocess
from project_modules import REPO

VENV_BIN = REPO / ".venv" / "bin"


def _run(*command):
    return subprocess.run([str(VENV_BIN / command[0]), *command[1:]], cwd=REPO, capture_output=True, text=True)


def test_yamllint_is_clean():
    result = _run("yamllint", "--strict", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_ansible_lint_production_profile_is_clean():
    result = _run("ansible-lint", "--profile", "production", "--nocolor")
    assert result.returncode == 0, result.stdout + result.stderr
