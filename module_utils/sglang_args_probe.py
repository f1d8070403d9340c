# -*- coding: utf-8 -*-
# Copyright: sglang-canon contributors
# MIT License (see LICENSE or https://opensource.org/licenses/MIT)
"""In-node probe of the sglang_server_args_check module: `nginx -t` for SGLang's command line.

The module does not import this file for its logic: it ships this file's *source* to the node's
SGLang Python and runs it there (`PYTHON -c SOURCE`), with exactly the environment the service
will get, the request as JSON on stdin. It prints one line `SGLANG_ARGS_PROBE {json}` on
stdout; everything SGLang prints goes to stderr. Standard library only at the top level (the
module imports it to read its source); SGLang is imported inside main(). Keep it Python 3.8+.

What it does, in SGLang's own code wherever SGLang has code for it:
  1. imports sglang.srt.server_args (and sglang.srt.environ);
  2. checks every SGLANG_*/SGL_* variable of the environment that SGLang declares in
     sglang.srt.environ.Envs with that variable's own parser: a value the parser rejects is
     one SGLang would only warn about and replace by the default (SGLANG_ENABLE_SPEC_V2=on
     silently runs without spec v2);
  3. runs sglang.srt.server_args.prepare_server_args(argv) -- the function launch_server
     calls -- with argparse's error() turned into an exception, so unknown flags, bad types
     and bad choices come back as argparse's own message instead of SystemExit; `--device
     cuda` is added when argv has no --device (else post-init fails with "No accelerator"
     on a node without a GPU); then ServerArgs.check_server_args(), which the engine runs
     at launch;
  4. adds the checks SGLang 0.5.9 lacks: mem_fraction_static in (0, 1), port in 1..65535.
The GPUs the parallel sizes need are judged on the controller from the resolved values it
returns (filter_plugins/gpu_expectations.py, gpu_layout_mismatches).
"""

from __future__ import annotations

import json
import re
import sys

MARKER = "SGLANG_ARGS_PROBE "

# Spellings tried against SGLang's own bool parser to list the ones it accepts.
BOOL_CANDIDATES = ("true", "1", "yes", "y", "on", "t", "false", "0", "no", "n", "off", "f")

# Words SGLang's messages use for a field without naming it.
MESSAGE_HINTS = (
    ("topk", "speculative_eagle_topk"),
    ("draft model", "speculative_draft_model_path"),
    ("draft_model", "speculative_draft_model_path"),
    ("config.json", "model_path"),
    ("page_size", "page_size"),
    ("page size", "page_size"),
)


# ServerArgs fields whose argparse dest differs (ServerArgs.from_cli_args copies them over).
FIELD_TO_DEST = {
    "tp_size": "tensor_parallel_size",
    "pp_size": "pipeline_parallel_size",
    "dp_size": "data_parallel_size",
    "ep_size": "expert_parallel_size",
    "attn_cp_size": "attention_context_parallel_size",
    "moe_dp_size": "moe_data_parallel_size",
}


# Fields naming a model folder or file on the node; an absolute path must exist there.
LOCAL_PATH_FIELDS = ("model_path", "speculative_draft_model_path", "tokenizer_path")


class ArgparseError(Exception):
    """argparse's error() message, raised instead of printing usage and exiting."""


class MissingPath(Exception):
    """An absolute model path given on the command line does not exist on the node."""


def _jsonable(value):
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    name = getattr(value, "name", None)
    if name is not None and type(value).__module__ != "builtins" and hasattr(type(value), "__members__"):
        return str(name)  # an Enum member
    return str(value)


def _given(argv, option_strings):
    """'--tp-size 8' as it appears in argv (any of the option strings, --opt=value too), or None."""
    for index, token in enumerate(argv):
        for option in option_strings:
            if token == option:
                if index + 1 < len(argv) and not argv[index + 1].startswith("--"):
                    return "%s %s" % (token, argv[index + 1])
                return token
            if token.startswith(option + "="):
                return token.replace("=", " ", 1)
    return None


_ARG_ERROR = re.compile(r"^argument (?P<options>[^:]+): (?P<what>.*)$", re.DOTALL)
_QUOTED = re.compile(r"'(?P<value>(?:[^'\\]|\\.)*)'")


def describe_parse_error(message, argv):
    """(error dict, argv without the offending words or None to stop) for one argparse message."""
    match = _ARG_ERROR.match(message)
    if match:
        options = match.group("options").split("/")
        what = match.group("what")
        quoted = _QUOTED.search(what)
        value = quoted.group("value") if quoted and what.startswith("invalid") else None
        for index, token in enumerate(argv):
            if token in options and (value is None or (index + 1 < len(argv) and argv[index + 1] == value)):
                takes_value = value is not None and index + 1 < len(argv)
                shown = "%s %s" % (token, argv[index + 1]) if takes_value else token
                rest = argv[:index] + argv[index + (2 if takes_value else 1):]
                return {"stage": "parse", "flag": shown, "message": "SGLang's argument parser: %s" % message}, rest
            for option in options:
                if token.startswith(option + "=") and (value is None or token[len(option) + 1:] == value):
                    rest = argv[:index] + argv[index + 1:]
                    return ({"stage": "parse", "flag": token.replace("=", " ", 1),
                             "message": "SGLang's argument parser: %s" % message}, rest)
        return {"stage": "parse", "flag": match.group("options"), "message": "SGLang's argument parser: %s" % message}, None
    flag = None
    if "unrecognized arguments:" in message:
        flag = message.split("unrecognized arguments:", 1)[1].strip()
    elif "required:" in message:
        flag = message.split("required:", 1)[1].strip()
    elif message.startswith("ambiguous option:"):
        flag = message[len("ambiguous option:"):].split(" could match", 1)[0].strip()
    return {"stage": "parse", "flag": flag, "message": "SGLang's argument parser: %s" % message}, None


def collect_parse_errors(make_parser, argv, limit=32):
    """Every argparse error, not just the first: after a bad value, drop that flag and parse again.

    argparse stops at the first bad value; unknown flags it reports all at once, at the end.
    """
    errors = []
    remaining = list(argv)
    for _ in range(limit):
        parser = make_parser()
        words = remaining
        try:
            if "--config" in words:
                from sglang.srt.server_args_config_parser import ConfigArgumentMerger

                words = ConfigArgumentMerger(parser).merge_config_with_args(words)
            parser.parse_args(words)
            return errors
        except ArgparseError as exc:
            error, rest = describe_parse_error(str(exc), remaining)
            errors.append(error)
            if rest is None or rest == remaining:
                return errors
            remaining = rest
        except SystemExit as exc:
            errors.append({"stage": "parse", "flag": None,
                           "message": "SGLang's argument parser exited (%s): --help or --version in argv?" % exc.code})
            return errors
    return errors


def _where(tb):
    """'ServerArgs._handle_speculative_decoding (server_args.py:2386)': deepest SGLang frame."""
    import os
    import traceback

    found = None
    for frame in traceback.extract_tb(tb):
        if "%ssglang%s" % (os.sep, os.sep) in frame.filename:
            found = "%s (%s:%s)" % (frame.name, os.path.basename(frame.filename), frame.lineno)
    return found


class Flags:
    """ServerArgs field <-> command-line options, from SGLang's own parser."""

    def __init__(self, parser, argv):
        self.argv = argv
        self.options = {}  # argparse dest -> option strings
        for action in parser._actions:  # pylint: disable=protected-access
            if action.option_strings:
                self.options.setdefault(action.dest, list(action.option_strings))

    def option_strings(self, field):
        return self.options.get(field) or self.options.get(FIELD_TO_DEST.get(field, ""), [])

    def primary(self, field):
        options = self.option_strings(field)
        long_opts = [o for o in options if o.startswith("--")]
        return (long_opts or options or ["--" + field.replace("_", "-")])[0]

    def given(self, field):
        """'--tp-size 8' as argv has it, or None when argv does not set the field."""
        return _given(self.argv, self.option_strings(field))

    def shown(self, field):
        return self.given(field) or self.primary(field)

    def in_message(self, message, environment):
        """Flags (as argv gives them) and SGLANG_ variables a message of SGLang is about."""
        text = message or ""
        fields = []
        for dest, options in self.options.items():
            field = next((f for f, d in FIELD_TO_DEST.items() if d == dest), dest)
            # Multi-word names are specific enough; one-word ones (port, host) only as --port.
            named = ("_" in field and re.search(r"\b%s\b" % re.escape(field), text)) or any(
                re.search(r"(?<![\w-])%s(?![\w-])" % re.escape(o), text) for o in options if o.startswith("--"))
            if named and field not in fields:
                fields.append(field)
        for word, field in MESSAGE_HINTS:
            if word in text and field not in fields and self.option_strings(field):
                fields.append(field)
        shown = []
        for field in fields:
            if self.shown(field) not in shown:
                shown.append(self.shown(field))
        for name in sorted(environment):
            if name in text or (name == "SGLANG_ENABLE_SPEC_V2" and "spec v2" in text.lower()):
                shown.append("%s=%s" % (name, environment[name]))
        return shown


def check_environment(os_environ, envs_class, env_field_class):
    """(errors, warnings) for the SGLANG_* variables, judged by SGLang's own per-variable parsers."""
    errors, warnings = [], []
    for name in sorted(os_environ):
        if not (name.startswith("SGLANG_") or name.startswith("SGL_")):
            continue
        key = "SGLANG_" + name[len("SGL_"):] if name.startswith("SGL_") else name
        field = envs_class.__dict__.get(key)
        value = os_environ[name]
        if not isinstance(field, env_field_class):
            warnings.append("%s is not declared in sglang.srt.environ.Envs: SGLang reads it elsewhere or ignores it" % name)
            continue
        try:
            field.parse(value)
        except ValueError as exc:
            kind = type(field).__name__
            message = "SGLang's %s parser rejects %r (%s)" % (kind, value, exc)
            if kind == "EnvBool":
                accepted = []
                for candidate in BOOL_CANDIDATES:
                    try:
                        field.parse(candidate)
                        accepted.append(candidate)
                    except ValueError:
                        pass
                message += "; it accepts only %s (any case)" % ", ".join(accepted)
            message += "; SGLang would just log a warning and use the default %r" % (field.default,)
            if key == "SGLANG_ENABLE_SPEC_V2":
                message += ", i.e. run silently WITHOUT spec v2"
            errors.append({"stage": "environment", "flag": "%s=%s" % (name, value), "message": message})
    return errors, warnings


def own_checks(resolved, flags):
    """What SGLang 0.5.9 accepts silently but cannot work. Whether the parallel sizes fit the
    node's GPUs is judged on the controller, from the resolved values this probe returns (filter
    gpu_layout_mismatches, the rule's one place)."""
    errors = []
    mem = resolved.get("mem_fraction_static")
    if mem is not None and not (0 < float(mem) < 1):
        errors.append({"stage": "value", "flag": flags.shown("mem_fraction_static"),
                       "message": "mem_fraction_static %s is outside (0, 1): SGLang 0.5.9 accepts it without a word, "
                                  "but it is the fraction of GPU memory for weights and KV cache" % mem})
    port = resolved.get("port")
    if port is not None and not (1 <= int(port) <= 65535):
        errors.append({"stage": "value", "flag": flags.shown("port"),
                       "message": "port %s is not a TCP port (1..65535); SGLang 0.5.9 accepts it until it binds" % port})
    return errors


def resolved_fields(server_args):
    """Every ServerArgs field as SGLang resolved it: the dataclass's attributes (0.5.9), or, where
    ServerArgs is a record with the resolution declared over it (0.5.23), its resolved view."""
    import dataclasses

    if dataclasses.is_dataclass(server_args):
        return {f.name: _jsonable(getattr(server_args, f.name, None)) for f in dataclasses.fields(server_args)}
    from sglang.srt.arg_groups.arg_utils import record_fields
    from sglang.srt.arg_groups.model_override_base import resolved_view

    view = resolved_view(server_args)
    return {f.name: _jsonable(getattr(view, f.name, None)) for f in record_fields(type(server_args))}


def run(request):
    import argparse
    import logging
    import os
    import warnings

    argv = [str(a) for a in request.get("argv") or []]
    result = {"ok": False, "errors": [], "warnings": [], "resolved": None, "adjusted": {},
              "argv_checked": None, "device_added": False, "sglang_version": None}
    environment = {k: v for k, v in os.environ.items() if k.startswith("SGLANG_") or k.startswith("SGL_")}

    log_records = []

    class _Keep(logging.Handler):
        def emit(self, record):
            try:
                log_records.append("%s: %s" % (record.levelname, record.getMessage()))
            except Exception:  # pylint: disable=broad-except
                pass

    root = logging.getLogger()
    root.addHandler(_Keep(level=logging.WARNING))

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            import sglang.srt.server_args as server_args_module
            from sglang.srt.environ import EnvField, Envs
        except BaseException as exc:  # pylint: disable=broad-except
            result["errors"].append({"stage": "import", "flag": None,
                                     "message": "cannot import sglang.srt.server_args: %s: %s" % (type(exc).__name__, exc)})
            return result
        try:
            from importlib import metadata
            result["sglang_version"] = metadata.version("sglang")
        except Exception:  # pylint: disable=broad-except
            result["sglang_version"] = getattr(sys.modules.get("sglang"), "__version__", None)

        env_errors, env_warnings = check_environment(os.environ, Envs, EnvField)
        result["errors"].extend(env_errors)
        result["warnings"].extend(env_warnings)

        has_device = any(a == "--device" or a.startswith("--device=") for a in argv)
        checked = argv if has_device else argv + ["--device", "cuda"]
        result["argv_checked"] = checked
        result["device_added"] = not has_device

        def _raise(self, message):
            raise ArgparseError(message)

        argparse.ArgumentParser.error = _raise
        ServerArgs = server_args_module.ServerArgs
        option_parser = argparse.ArgumentParser()
        ServerArgs.add_cli_args(option_parser)
        flags = Flags(option_parser, argv)

        parsed = {}
        original = ServerArgs.__dict__["from_cli_args"].__func__

        def spy(cls, args):
            # Between argparse and post-init: a missing local model folder would otherwise send
            # transformers looking for a hub repo of that name (slow, or a hang, offline).
            missing = [f for f in LOCAL_PATH_FIELDS
                       if isinstance(getattr(args, f, None), str) and getattr(args, f).startswith("/")
                       and not os.path.exists(getattr(args, f))]
            if missing:
                parsed.update(vars(args))
                raise MissingPath(missing)
            try:
                return original(cls, args)
            finally:
                parsed.update(vars(args))

        def make_parser():
            parser = argparse.ArgumentParser()
            ServerArgs.add_cli_args(parser)
            return parser

        ServerArgs.from_cli_args = classmethod(spy)
        server_args = None
        parse_errors = collect_parse_errors(make_parser, checked)
        try:
            if parse_errors:
                result["errors"].extend(parse_errors)
            else:
                prepared = server_args_module.prepare_server_args(checked)
                # Later releases (0.5.23) leave the record unresolved there: the launcher
                # resolves it, as resolve_once() does here.
                if hasattr(prepared, "resolve_once"):
                    prepared.resolve_once()
                server_args = prepared
        except ArgparseError as exc:
            result["errors"].append(describe_parse_error(str(exc), checked)[0])
        except MissingPath as exc:
            for field in exc.args[0]:
                result["errors"].append({"stage": "value", "flag": flags.shown(field),
                                         "message": "%s: no such file or directory on the node" % parsed.get(field)})
        except SystemExit as exc:
            result["errors"].append({"stage": "parse", "flag": None,
                                     "message": "SGLang's argument parser exited (%s): --help or --version in argv?" % exc.code})
        except BaseException as exc:  # pylint: disable=broad-except
            message = "%s: %s" % (type(exc).__name__, exc)
            where = _where(sys.exc_info()[2])
            named = flags.in_message(str(exc), environment)
            result["errors"].append({"stage": "post_init", "flag": ", ".join(named) or None,
                                     "message": "SGLang's ServerArgs rejects the arguments%s: %s" % (
                                         " in " + where if where else "", message)})
        if server_args is not None:
            try:
                server_args.check_server_args()
            except BaseException as exc:  # pylint: disable=broad-except
                where = _where(sys.exc_info()[2])
                named = flags.in_message(str(exc), environment)
                result["errors"].append({"stage": "check_server_args", "flag": ", ".join(named) or None,
                                         "message": "SGLang's ServerArgs.check_server_args rejects the arguments%s: %s: %s" % (
                                             " in " + where if where else "", type(exc).__name__, exc)})

    for warning in caught:
        text = str(warning.message)
        if "environ" in os.path.basename(warning.filename) or "Environment variable" in text or "Invalid value for" in text:
            result["warnings"].append("%s: %s" % (warning.category.__name__, text))
    result["warnings"].extend(log_records)

    if server_args is not None:
        resolved = resolved_fields(server_args)
        algorithm = resolved.get("speculative_algorithm")
        try:
            from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
            supports_v2 = SpeculativeAlgorithm.from_string(algorithm).supports_spec_v2()
        except Exception:  # pylint: disable=broad-except
            supports_v2 = algorithm in ("EAGLE", "EAGLE3", "STANDALONE")
        spec_v2_env = None
        try:
            from sglang.srt.environ import envs
            spec_v2_env = bool(envs.SGLANG_ENABLE_SPEC_V2.get())
        except Exception:  # pylint: disable=broad-except
            pass
        resolved["spec_v2"] = bool(supports_v2 and not resolved.get("disable_overlap_schedule"))
        resolved["spec_v2_env"] = spec_v2_env
        if spec_v2_env and not resolved["spec_v2"]:
            result["warnings"].append(
                "SGLANG_ENABLE_SPEC_V2 is on but the spec v2 worker will not run (speculative_algorithm %s, "
                "disable_overlap_schedule %s)" % (algorithm, resolved.get("disable_overlap_schedule")))
        result["resolved"] = resolved
        for name, value in parsed.items():
            if name in resolved and _jsonable(value) != resolved[name]:
                result["adjusted"][name] = {"parsed": _jsonable(value), "resolved": resolved[name]}
        result["errors"].extend(own_checks(resolved, flags))

    result["ok"] = not result["errors"]
    return result


def main():
    import os

    # Anything printed to fd 1 (SGLang, torch, C extensions) goes to stderr; the JSON goes to
    # the original stdout, so the module reads exactly one marked line.
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    try:
        request = json.loads(sys.stdin.read() or "{}")
        result = run(request)
    except BaseException as exc:  # pylint: disable=broad-except
        result = {"ok": False, "errors": [{"stage": "probe", "flag": None, "message": "%s: %s" % (type(exc).__name__, exc)}],
                  "warnings": [], "resolved": None, "adjusted": {}}
    out.write("\n" + MARKER + json.dumps(result, default=str) + "\n")
    out.flush()


if __name__ == "__main__":
    main()
