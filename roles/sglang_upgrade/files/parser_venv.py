#!/usr/bin/env python3
"""Fetch one SGLang release's wheel and make (once) the controller venv in which its own ServerArgs runs.

    parser_venv.py [--python PYTHON] WHEELS VERSION VENV REQUIREMENTS [PIP SOURCE ARGUMENTS...]

The wheel of sglang==VERSION is taken from WHEELS, or downloaded there first (pip download
--no-deps, from the sources given; a release may ship a pure or a binary wheel). Exit code 2,
with pip's last words, when no source holds it.

VENV is made with this interpreter and gets the wheel plus, when REQUIREMENTS is a file, its
name==version lines with pip --no-deps (the parser-only closure, as tests/parser_venv.py builds the
test suite's; a sglang line there is left out, the wheel is the release); with REQUIREMENTS "-"
pip resolves the wheel's own dependencies from the sources. Then `import sglang.srt.server_args`
must work.

With --python, PYTHON is an interpreter that has sglang==VERSION and its parser closure already
(the test suite's parser venv): it is used as it is, once its SGLang's version is checked, and no
venv is made.

A lock (VENV.lock) keeps two runs from building it at once; a marker written last holds the digest
of the inputs, so an interrupted build, another wheel or another requirements file is rebuilt and
an unchanged one is reused. Prints one JSON line: {"python", "wheel", "changed"}. Exits 1 with
pip's or Python's last words when the venv cannot be made.
"""

import fcntl
import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys

MARKER = ".sglang-canon-upgrade-parser-venv"


def fail(message, code=1):
    print(json.dumps({"failed": True, "msg": message}))
    sys.exit(code)


def run(argv, code=1):
    done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True, check=False)
    if done.returncode != 0:
        last = done.stdout.strip().splitlines()[-1:] if code == 2 else [done.stdout.strip()[-2000:]]
        fail("%s failed (rc %d): %s" % (" ".join(argv[:4]), done.returncode, " ".join(last)), code)


def release_wheel(wheels, version, source_args):
    """The release's wheel in WHEELS, downloaded there when it is not yet."""
    pattern = os.path.join(wheels, "sglang-%s-*.whl" % version)
    if not glob.glob(pattern):
        run([sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-deps",
             "--dest", wheels] + source_args + ["sglang==%s" % version], code=2)
    found = sorted(glob.glob(pattern))
    if not found:
        fail("pip download left no wheel of sglang %s in %s" % (version, wheels), 2)
    return found[0]


def requirement_lines(path):
    """The requirements file's lines, without its sglang pin (the wheel is the release)."""
    with open(path, encoding="utf-8") as handle:
        lines = [line.split("#", 1)[0].strip() for line in handle]
    return [line for line in lines if line and not line.lower().replace("_", "-").startswith("sglang==")]


def existing_python(python, version, wheel):
    """An interpreter given for the release, used once it has that release of SGLang."""
    done = subprocess.run([python, "-c", "import importlib.metadata as m; print(m.version('sglang'))"],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True, check=False)
    found = done.stdout.strip().splitlines()[-1:] if done.returncode == 0 else []
    if found != [version]:
        fail("sglang_upgrade_parser_pythons: %s has no sglang %s (%s)" % (python, version, done.stdout.strip()[-300:]))
    print(json.dumps({"python": python, "wheel": wheel, "changed": False}))


def main():
    given = sys.argv[2] if sys.argv[1] == "--python" else None
    arguments = sys.argv[3:] if given else sys.argv[1:]
    wheels, version, venv, requirements, source_args = arguments[0], arguments[1], arguments[2], arguments[3], arguments[4:]
    wheel = release_wheel(wheels, version, source_args)
    if given:
        existing_python(given, version, wheel)
        return
    wanted = requirement_lines(requirements) if requirements != "-" else []
    digest = hashlib.sha256()
    with open(wheel, "rb") as handle:
        digest.update(hashlib.sha256(handle.read()).digest())
    digest.update(json.dumps([wanted, requirements == "-", source_args, sys.version]).encode("utf-8"))
    python = os.path.join(venv, "bin", "python")
    os.makedirs(os.path.dirname(venv), exist_ok=True)
    with open(venv + ".lock", "w", encoding="utf-8") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        marker = os.path.join(venv, MARKER)
        if os.path.isfile(marker):
            with open(marker, encoding="utf-8") as handle:
                if handle.read().strip() == digest.hexdigest():
                    print(json.dumps({"python": python, "wheel": wheel, "changed": False}))
                    return
        shutil.rmtree(venv, ignore_errors=True)
        run([sys.executable, "-m", "venv", venv])
        pip = [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"] + source_args
        if requirements == "-":
            run(pip + [wheel])
        else:
            listed = os.path.join(venv, "parser-requirements.txt")
            with open(listed, "w", encoding="utf-8") as handle:
                handle.write("\n".join(wanted) + "\n")
            run(pip + ["--no-deps", "-r", listed, wheel])
        run([python, "-c", "import sglang.srt.server_args"])
        with open(marker, "w", encoding="utf-8") as handle:
            handle.write(digest.hexdigest() + "\n")
    print(json.dumps({"python": python, "wheel": wheel, "changed": True}))


if __name__ == "__main__":
    main()
