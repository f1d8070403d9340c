# -*- coding: utf-8 -*-
# Copyright: sglang-canon contributors
# MIT License (see roles/sglang_patches/meta/main.yml)
"""Programs the python_package_patch module runs under the package's own interpreter.

The module does not import this file for its logic: it ships this file's *source* in its
payload and runs it as ``PYTHON -c SOURCE COMMAND ARGS...`` with the interpreter whose
site-packages holds the package, so what is checked is what that Python sees. Commands:

  probe PACKAGE PATH...        the installed distribution, found without importing it
                               (importing sglang pulls torch): one JSON line with its
                               version, site-packages directory and the RECORD hash of
                               each PATH asked for
  compile-check FILE NAME...   compile each FILE, reported as NAME, so a patch that breaks
                               the syntax for *that* Python fails before anything is written;
                               exit status 1 and one line per error on stderr
  byte-compile FILE...         refresh the .pyc files after the writes, so they match that
                               Python and the service user never has to write them

Standard library only; keep it runnable by any Python 3 the package may use.
"""

import json
import sys


def probe(name, wanted):
    try:
        from importlib import metadata
    except ImportError:
        return {"found": False, "error": "importlib.metadata needs Python 3.8+"}
    out = {"python": sys.version.split()[0], "cache_tag": sys.implementation.cache_tag}
    try:
        dist = metadata.distribution(name)
    except metadata.PackageNotFoundError:
        out["found"] = False
        return out
    out.update(found=True, version=dist.version, base=str(dist.locate_file("")), record={})
    for entry in dist.files or []:
        path = str(entry).replace("\\", "/")
        if path in wanted:
            out["record"][path] = "%s=%s" % (entry.hash.mode, entry.hash.value) if entry.hash else None
    return out


def compile_check(pairs):
    """Number of files that do not compile; each error goes to stderr as NAME:LINE: MESSAGE."""
    bad = 0
    for path, name in pairs:
        with open(path, "rb") as handle:
            source = handle.read()
        try:
            compile(source, name, "exec", dont_inherit=True)
        except SyntaxError as exc:
            bad += 1
            sys.stderr.write("%s:%s: %s\n" % (name, exc.lineno, exc.msg))
    return bad


def byte_compile(paths):
    import py_compile

    for path in paths:
        py_compile.compile(path, doraise=True)


def main(argv):
    command, args = argv[0], argv[1:]
    if command == "probe":
        print(json.dumps(probe(args[0], set(args[1:]))))
        return 0
    if command == "compile-check":
        return 1 if compile_check(zip(args[0::2], args[1::2])) else 0
    if command == "byte-compile":
        byte_compile(args)
        return 0
    sys.stderr.write("unknown command %r (probe, compile-check, byte-compile)\n" % command)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
