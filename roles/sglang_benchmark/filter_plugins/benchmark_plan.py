"""Filters that build sglang_benchmark's plan (pure functions): the production environment as the
unit reads it, and an alternative as production with overrides.

Filters:
  sglang_env_file_parse(text)      -> {NAME: value} of an EnvironmentFile written by sglang_service
  combine_overrides(base, over)    -> base updated with over, a null value removing the key

Role-local: only the benchmark plans configurations; the summary filters it shares with
production_doc stay in filter_plugins/bench_summary.py.
"""

from __future__ import annotations

import re

_ENV_LINE = re.compile(r'^([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"\s*$')


class BenchmarkPlanError(ValueError):
    """Input the plan cannot be built from."""


def _error(exc):
    try:
        from ansible.errors import AnsibleFilterError  # only inside Ansible; keeps the module importable
    except ImportError:  # pragma: no cover - plain Python use
        return exc
    return AnsibleFilterError(str(exc))


def sglang_env_file_parse(text):
    """{NAME: value} of an EnvironmentFile as sglang_service writes it (NAME="value", \\\\ and \\" escaped).

    Comments and blank lines are skipped; a line of another shape is an error, since this file is
    only ever written by sglang_service's template.
    """
    if isinstance(text, bytes):
        text = text.decode("utf-8")
    env = {}
    for number, line in enumerate((text or "").splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        match = _ENV_LINE.match(stripped)
        if not match:
            raise _error(BenchmarkPlanError(f"environment file line {number} is not NAME=\"value\": {stripped!r}"))
        env[match.group(1)] = re.sub(r"\\(.)", r"\1", match.group(2))
    return env


def combine_overrides(base, overrides):
    """base updated with overrides; an override of null removes the key (e.g. drop a flag for a baseline)."""
    if base is None:
        base = {}
    if overrides is None:
        overrides = {}
    if not isinstance(base, dict) or not isinstance(overrides, dict):
        raise _error(BenchmarkPlanError("combine_overrides: both arguments must be mappings"))
    merged = dict(base)
    for key, value in overrides.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = value
    return merged


class FilterModule:
    """sglang_benchmark's plan filters."""

    def filters(self):
        return {
            "sglang_env_file_parse": sglang_env_file_parse,
            "combine_overrides": combine_overrides,
        }
