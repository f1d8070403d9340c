"""The sglang_running_release module: the interpreter a process was started as, the release that
interpreter holds, and the drift line a scan prints."""

import subprocess
import sys

import pytest


@pytest.fixture(scope="module")
def running_release(project_module):
    return project_module("library/sglang_running_release.py")


def test_the_interpreter_is_the_first_word_of_a_real_cmdline(running_release):
    with open("/proc/self/cmdline", "rb") as handle:
        cmdline = handle.read()
    assert running_release.interpreter_of(cmdline) == cmdline.split(b"\0")[0].decode()
    server = b"/opt/sglang/venvs/0.5.9/bin/python\0-m\0sglang.launch_server\0--tp-size\x008\0"
    assert running_release.interpreter_of(server) == "/opt/sglang/venvs/0.5.9/bin/python"
    # a kernel thread or a process gone half-way has an empty cmdline
    assert running_release.interpreter_of(b"") is None


def test_the_version_program_names_the_release_an_interpreter_holds(running_release, parser_python):
    held = subprocess.run([parser_python, "-c", running_release.VERSION_PROGRAM], capture_output=True, text=True,
                          check=True)
    assert held.stdout.strip() == "0.5.9"
    # the suite's own interpreter holds no sglang: nothing, not a traceback
    none = subprocess.run([sys.executable, "-c", running_release.VERSION_PROGRAM], capture_output=True, text=True,
                          check=True)
    assert none.stdout == ""


@pytest.mark.parametrize(("release", "drifted"), [
    ("0.5.23", ["runs SGLang 0.5.23, the inventory says 0.5.9"]),
    ("0.5.9", []),
    (None, []),  # nothing runs: the unit's own state is what a scan reports then
])
def test_only_another_running_release_is_drift(running_release, release, drifted):
    assert running_release.drift_of(release, "0.5.9") == drifted
