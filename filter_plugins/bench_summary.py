"""Benchmark results of sglang-canon: parse bench_serving's output and summarise a sweep (pure functions).

Filters:
  bench_serving_result(text)       -> the metrics of one `bench_serving --output-file F.jsonl` run
  bench_summary(runs, ...)         -> the table behind the configuration choice (summary.json)
  bench_summary_load(text)         -> a summary.json read back, or {"error": ...} when unusable
  bench_summary_markdown(summary)  -> that table as Markdown, configurations side by side

The input format is SGLang 0.5.9's python/sglang/bench_serving.py, function benchmark(): after each
run it appends ONE line to --output-file, `json.dumps(result)`, where result holds the run's
arguments (backend, dataset_name, request_rate, max_concurrency, random_input_len, ...), the
server's /get_server_info answer (server_info) and the metrics (output_throughput in tok/s,
*_ttft_ms, *_itl_ms, *_tpot_ms, *_e2e_latency_ms, accept_length, completed, ...). Python's json
writes float('inf') (request_rate without --request-rate) as Infinity and an empty run's
percentiles as NaN; both are read here and never written back (JSON has no such values).
"""

from __future__ import annotations

import json
import math

SCHEMA = 1

# bench_serving result keys kept per run, in the order the doc shows them.
METRICS = (
    "output_throughput",
    "request_throughput",
    "input_throughput",
    "total_throughput",
    "max_output_tokens_per_s",
    "mean_ttft_ms",
    "median_ttft_ms",
    "p99_ttft_ms",
    "mean_itl_ms",
    "median_itl_ms",
    "p95_itl_ms",
    "p99_itl_ms",
    "mean_tpot_ms",
    "median_tpot_ms",
    "p99_tpot_ms",
    "mean_e2e_latency_ms",
    "median_e2e_latency_ms",
    "p99_e2e_latency_ms",
    "accept_length",
    "concurrency",
    "duration",
    "completed",
    "total_input_tokens",
    "total_output_tokens",
)
# The run's own arguments as bench_serving records them.
WORKLOAD_KEYS = ("backend", "dataset_name", "random_input_len", "random_output_len", "random_range_ratio")
# Keys every bench_serving result line has; a line without them is not bench_serving's.
REQUIRED = ("backend", "max_concurrency", "completed", "output_throughput", "median_ttft_ms", "mean_itl_ms")

# Metrics where higher is better; everything else (latencies) lower is better.
HIGHER_IS_BETTER = frozenset({"output_throughput", "request_throughput", "input_throughput", "total_throughput",
                              "max_output_tokens_per_s"})


class BenchSummaryError(ValueError):
    """Input that is not what bench_serving writes, or a sweep that cannot be summarised."""


def _error(exc):
    try:
        from ansible.errors import AnsibleFilterError  # only inside Ansible; keeps the module importable
    except ImportError:  # pragma: no cover - plain Python use
        return exc
    return AnsibleFilterError(str(exc))


def _finite(value):
    """JSON-safe number: NaN/Infinity (and non-numbers) become None; bools are not numbers."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


# --------------------------------------------------------------------------- parsing

def parse_result(text, source="bench_serving output"):
    """Metrics of the LAST result line of a bench_serving --output-file (it appends one per run)."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    if not isinstance(text, str):
        raise BenchSummaryError(f"{source}: expected the text of a JSONL file, got {type(text).__name__}")
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        raise BenchSummaryError(f"{source}: empty; bench_serving wrote no result line (the run failed before the end)")
    try:
        raw = json.loads(lines[-1])  # Python's json accepts bench_serving's Infinity/NaN
    except ValueError as exc:
        raise BenchSummaryError(f"{source}: last line is not JSON ({exc})") from exc
    if not isinstance(raw, dict):
        raise BenchSummaryError(f"{source}: last line is a {type(raw).__name__}, not a bench_serving result object")
    missing = [key for key in REQUIRED if key not in raw]
    if missing:
        raise BenchSummaryError(f"{source}: not a bench_serving result line (missing {', '.join(missing)})")
    result = {key: _finite(raw.get(key)) for key in METRICS}
    result["max_concurrency"] = _finite(raw.get("max_concurrency"))
    result["workload"] = {key: raw.get(key) for key in WORKLOAD_KEYS}
    info = raw.get("server_info") if isinstance(raw.get("server_info"), dict) else {}
    result["server_version"] = info.get("version") if isinstance(info.get("version"), str) else None
    return result


def bench_serving_result(text):
    try:
        return parse_result(text)
    except BenchSummaryError as exc:
        raise _error(exc) from exc


# --------------------------------------------------------------------------- summary

def _run_outcome(run, index):
    """(configuration, concurrency, result or None, failure message or None) for one run record."""
    if not isinstance(run, dict):
        raise BenchSummaryError(f"runs[{index}]: expected a mapping, got {type(run).__name__}")
    name = run.get("configuration")
    level = run.get("concurrency")
    if not isinstance(name, str) or not name:
        raise BenchSummaryError(f"runs[{index}]: configuration must be a non-empty name")
    if isinstance(level, bool) or not isinstance(level, int) or level < 1:
        raise BenchSummaryError(f"runs[{index}] ({name}): concurrency must be a positive integer, got {level!r}")
    label = f"{name} at concurrency {level}"
    rc = run.get("rc")
    text = run.get("jsonl")
    result = None
    problem = None
    if text:
        try:
            result = parse_result(text, source=label)
        except BenchSummaryError as exc:
            problem = str(exc)
    if rc not in (0, None):
        reason = "timed out (timeout killed it)" if rc in (124, 137) else f"exited {rc}"
        detail = (run.get("error") or "").strip()
        problem = f"{label}: bench_serving {reason}" + (f": {detail}" if detail else "")
        result = None
    elif result is None and problem is None:
        problem = f"{label}: no result file" + (f" ({run['error'].strip()})" if run.get("error") else "")
    if result is not None:
        if result["max_concurrency"] not in (None, level):
            problem = f"{label}: the result line says max_concurrency {result['max_concurrency']}"
            result = None
        else:
            expected = run.get("num_prompts")
            completed = result.get("completed") or 0
            if completed == 0 or (isinstance(expected, int) and completed < expected):
                of = f" of {expected}" if isinstance(expected, int) else ""
                problem = f"{label}: only {completed}{of} requests completed"
                result = None
            elif result.get("output_throughput") is None:
                problem = f"{label}: no output throughput in the result"
                result = None
    return name, level, result, problem


def summarize(runs, configurations=None, production="production", metric="output_throughput",
              workload=None, measured_at=None, levels=None):
    """The sweep as summary.json: per concurrency level, every configuration's metrics and the winner.

    runs: [{configuration, concurrency, rc, jsonl (text of the --output-file), num_prompts, error}]
    configurations: [{name, argv, environment, ...}] in display order (production first);
                    names only seen in runs are appended in order of appearance.
    The winner of a level is the configuration with the best `metric` among the runs that
    completed; a tie goes to production, then to the earlier configuration.
    """
    if metric not in METRICS:
        raise BenchSummaryError(f"metric {metric!r} is not one of the recorded metrics ({', '.join(METRICS)})")
    runs = list(runs or [])
    configs = []
    seen = set()
    for entry in configurations or []:
        entry = entry if isinstance(entry, dict) else {"name": entry}
        name = entry.get("name")
        if not isinstance(name, str) or not name or name in seen:
            raise BenchSummaryError(f"configurations: {name!r} is empty or listed twice")
        seen.add(name)
        configs.append(dict(entry))
    table = {}
    failures = []
    server_versions = set()
    recorded_workload = {}
    for index, run in enumerate(runs):
        name, level, result, problem = _run_outcome(run, index)
        if name not in seen:
            seen.add(name)
            configs.append({"name": name})
        if problem:
            failures.append({"configuration": name, "concurrency": level, "message": problem})
        if result is not None:
            if result["server_version"]:
                server_versions.add(result["server_version"])
            for key, value in result["workload"].items():
                if value is not None:
                    recorded_workload.setdefault(key, value)
            table.setdefault(level, {})[name] = {key: result[key] for key in METRICS}
    names = [c["name"] for c in configs]
    wanted_levels = sorted(set(list(levels or []) + [r["concurrency"] for r in runs if isinstance(r, dict)
                                                       and isinstance(r.get("concurrency"), int)]))
    better = max if metric in HIGHER_IS_BETTER else min
    rows = []
    wins = {name: 0 for name in names}
    for level in wanted_levels:
        results = {name: table.get(level, {}).get(name) for name in names}
        scored = [(name, r[metric]) for name, r in results.items() if r is not None and r.get(metric) is not None]
        winner = None
        if scored:
            best = better(value for _name, value in scored)
            tied = [name for name, value in scored if value == best]
            winner = production if production in tied else tied[0]
            wins[winner] += 1
        prod = results.get(production)
        best_value = results[winner][metric] if winner else None
        versus = None
        if prod is not None and prod.get(metric) is not None and best_value:
            versus = round(prod[metric] / best_value - 1.0, 4)
        rows.append({"concurrency": level, "results": results, "winner": winner, "production_vs_winner": versus})
    merged_workload = dict(recorded_workload)
    merged_workload.update({k: v for k, v in (workload or {}).items() if v is not None})
    return {
        "schema": SCHEMA,
        "measured_at": measured_at,
        "metric": metric,
        "production": production,
        "configurations": configs,
        "levels": wanted_levels,
        "workload": {k: merged_workload[k] for k in sorted(merged_workload)},
        "server_versions": sorted(server_versions),
        "rows": rows,
        "wins": wins,
        "failures": failures,
    }


def bench_summary(runs, configurations=None, production="production", metric="output_throughput",
                  workload=None, measured_at=None, levels=None):
    try:
        return summarize(runs, configurations, production, metric, workload, measured_at, levels)
    except BenchSummaryError as exc:
        raise _error(exc) from exc


def bench_summary_load(text):
    """A summary.json read back from the node; {"error": why} instead of failing the doc."""
    try:
        data = json.loads(text) if isinstance(text, (str, bytes)) else text
    except ValueError as exc:
        return {"error": f"not JSON ({exc})"}
    if not isinstance(data, dict) or data.get("schema") != SCHEMA or not isinstance(data.get("rows"), list):
        return {"error": f"not a sglang-canon benchmark summary (schema {SCHEMA} with rows)"}
    return data


# --------------------------------------------------------------------------- markdown

_UNITS = {
    "output_throughput": ("Output throughput (tok/s)", 1),
    "median_ttft_ms": ("Median TTFT (ms)", 1),
    "median_itl_ms": ("Median ITL (ms)", 2),
    "p99_itl_ms": ("P99 ITL (ms)", 2),
    "accept_length": ("Accept length", 2),
}


def _cell(value, digits):
    if value is None:
        return "-"
    return f"{value:.{digits}f}"


def _md_escape(text):
    return str(text).replace("|", "\\|")


def _table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " if i == 0 else " ---: " for i in range(len(header))) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def summary_markdown(summary):
    """Tables of a summary: the choice metric with the winner per level, then latency and accept length."""
    if not isinstance(summary, dict) or not isinstance(summary.get("rows"), list):
        raise BenchSummaryError("not a benchmark summary")
    names = [c["name"] for c in summary.get("configurations", [])]
    production = summary.get("production")
    metric = summary.get("metric", "output_throughput")
    title, digits = _UNITS.get(metric, (metric, 2))
    lines = []
    header = ["Concurrency"] + [_md_escape(n) + (" (production)" if n == production and n != "production" else "")
                                for n in names]
    header += ["Winner", "Production vs winner"]
    rows = []
    for row in summary["rows"]:
        cells = [str(row["concurrency"])]
        for name in names:
            result = row["results"].get(name)
            value = result.get(metric) if result else None
            text = _cell(value, digits)
            if name == row.get("winner") and len(names) > 1:
                text = f"**{text}**"
            cells.append(text)
        cells.append(_md_escape(row["winner"]) if row.get("winner") else "-")
        versus = row.get("production_vs_winner")
        if versus is None:
            cells.append("-")
        elif row.get("winner") == production:
            cells.append("best")
        else:
            cells.append(f"{versus * 100:+.1f}%")
        rows.append(cells)
    lines.append(f"{title}, higher is better; bold = winner of the level:" if metric in HIGHER_IS_BETTER
                 else f"{title}, lower is better; bold = winner of the level:")
    lines.append("")
    lines += _table(header, rows)
    wins = summary.get("wins") or {}
    if len(names) > 1:
        lines.append("")
        lines.append("Levels won: " + ", ".join(f"{_md_escape(n)} {wins.get(n, 0)}" for n in names) + ".")
    for other in ("median_ttft_ms", "median_itl_ms", "accept_length"):
        if other == metric:
            continue
        other_title, other_digits = _UNITS[other]
        values = [[(row["results"].get(n) or {}).get(other) for n in names] for row in summary["rows"]]
        if not any(v is not None for row in values for v in row):
            continue
        lines.append("")
        lines.append(f"{other_title}:")
        lines.append("")
        lines += _table(["Concurrency"] + [_md_escape(n) for n in names],
                        [[str(row["concurrency"])] + [_cell(v, other_digits) for v in vals]
                         for row, vals in zip(summary["rows"], values)])
    failures = summary.get("failures") or []
    if failures:
        lines.append("")
        lines.append("Runs without a result (excluded from the winners):")
        lines.append("")
        lines += [f"- {_md_escape(f['message'])}" for f in failures]
    return "\n".join(lines)


def bench_summary_markdown(summary):
    try:
        return summary_markdown(summary)
    except BenchSummaryError as exc:
        raise _error(exc) from exc


class FilterModule:
    """sglang-canon's benchmark filters."""

    def filters(self):
        return {
            "bench_serving_result": bench_serving_result,
            "bench_summary": bench_summary,
            "bench_summary_load": bench_summary_load,
            "bench_summary_markdown": bench_summary_markdown,
        }
