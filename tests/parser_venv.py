"""The CPU-only SGLang parser venv of the test suite: .cache/parser-venv, built from the wheelhouse.

The venv holds what the test node installs (tests/wheelhouse/parser-requirements.txt): SGLang
0.5.9, CPU torch 2.13.0 and the dependencies of SGLang's argument parser. Tests use its
interpreter to run SGLang's own ServerArgs, the stack probe, torch code and gloo runs on a
machine without GPU; tests/conftest.py offers it as the session fixture `parser_python`.

It is built once (about a minute) and reused while the wheelhouse and the requirements file
are unchanged. The wheelhouse (.cache/wheelhouse) is made by scripts/setup; when it is not
complete, scripts/build-wheelhouse is run first.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
from project_modules import REPO

WHEELHOUSE = REPO / ".cache" / "wheelhouse"
REQUIREMENTS = REPO / "tests" / "wheelhouse" / "parser-requirements.txt"
PARSER_VENV = REPO / ".cache" / "parser-venv"
MARKER = ".sglang-canon-parser-venv"
SGLANG_VERSION = "0.5.9"
SGLANG_WHEEL = WHEELHOUSE / f"sglang-{SGLANG_VERSION}-py3-none-any.whl"
# An interpreter with torch for the NCCL all-reduce benchmark (a CUDA build on a GPU machine);
# without it the benchmark's tests use the parser venv's CPU torch.
NCCL_BENCH_PYTHON = "NCCL_BENCH_PYTHON"


def _base_python():
    """A CPython 3.11 (the wheelhouse holds cp311 wheels, Debian 12's Python)."""
    for candidate in (shutil.which("python3.11"), sys.executable):
        if not candidate:
            continue
        version = subprocess.run(
            [candidate, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
        if version == "3.11":
            return candidate
    raise RuntimeError("the parser venv needs CPython 3.11 (the wheelhouse is cp311); none found")


def ensure_wheelhouse():
    """.cache/wheelhouse, built with scripts/build-wheelhouse when not complete (scripts/setup's job)."""
    if not (WHEELHOUSE / ".complete").is_file():
        subprocess.run([sys.executable, str(REPO / "scripts" / "build-wheelhouse")], check=True)
    return WHEELHOUSE


def sglang_wheel():
    """The pristine sglang 0.5.9 wheel of the wheelhouse; an AssertionError naming the fix when absent."""
    ensure_wheelhouse()
    assert SGLANG_WHEEL.is_file(), (
        f"{SGLANG_WHEEL} is missing although the wheelhouse is marked complete: "
        "run scripts/build-wheelhouse --force (scripts/setup builds it)"
    )
    return SGLANG_WHEEL


def ensure_parser_venv():
    """Path of .cache/parser-venv/bin/python, (re)built from the wheelhouse when missing or stale.

    Builds the wheelhouse first with scripts/build-wheelhouse when it is not complete. A file lock
    keeps concurrent test sessions from building it twice; a marker holding the wheelhouse's hash
    is written last, so an interrupted build is redone.
    """
    python = PARSER_VENV / "bin" / "python"
    PARSER_VENV.parent.mkdir(parents=True, exist_ok=True)
    with open(PARSER_VENV.parent / "parser-venv.lock", "w", encoding="utf-8") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        ensure_wheelhouse()
        wanted = hashlib.sha256((WHEELHOUSE / ".complete").read_bytes() + REQUIREMENTS.read_bytes()).hexdigest()
        marker = PARSER_VENV / MARKER
        if python.exists() and marker.is_file() and marker.read_text().strip() == wanted:
            return str(python)
        shutil.rmtree(PARSER_VENV, ignore_errors=True)
        subprocess.run([_base_python(), "-m", "venv", str(PARSER_VENV)], check=True)
        subprocess.run(
            [
                str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                "--no-index", "--no-deps", "--find-links", str(WHEELHOUSE), "-r", str(REQUIREMENTS),
            ],
            check=True,
        )
        subprocess.run([str(python), "-c", "import sglang.srt.server_args"], check=True, capture_output=True)
        marker.write_text(wanted + "\n")
        return str(python)


def nccl_bench_python(request):
    """$NCCL_BENCH_PYTHON when set, else the parser venv's Python (CPU torch, gloo); it must import torch.

    `request` is the test's pytest request: the parser venv is only built when it is the one used.
    """
    python = os.environ.get(NCCL_BENCH_PYTHON) or request.getfixturevalue("parser_python")
    done = subprocess.run([python, "-c", "import torch.distributed"], capture_output=True, text=True, check=False)
    assert done.returncode == 0, f"{python} cannot import torch.distributed ({NCCL_BENCH_PYTHON}?): {done.stderr[-1500:]}"
    return python


def upgrade_sources(target):
    """The variables through which playbooks/upgrade.yml reads both releases from the wheelhouse
    on the controller: 0.5.9 in this suite's parser venv, `target` in a parser venv of its own made
    from its parser closure, and the test node's model config folders for their ServerArgs."""
    return {
        "sglang_upgrade_wheelhouse": str(ensure_wheelhouse()),
        "sglang_upgrade_parser_pythons": {SGLANG_VERSION: ensure_parser_venv()},
        "sglang_upgrade_parser_requirements": {target: str(REPO / "tests" / "wheelhouse" / f"parser-requirements-{target}.txt")},
        "sglang_upgrade_model_path": str(REPO / "tests" / "fixtures" / "testnode-model" / "target"),
        "sglang_upgrade_draft_model_path": str(REPO / "tests" / "fixtures" / "testnode-model" / "draft"),
    }
