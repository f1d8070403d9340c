"""The upgrade gate's rule (role sglang_upgrade): the canary against the control, beyond noise.

Filter:
  sglang_upgrade_gate(measurements, levels) -> the verdict and its figures (upgrade-reports/*-gate.json,
                                               the upgrade history in production_v2.md)

measurements: {"canary": [summary, ...], "control": [summary, ...]}, each summary one repeated run
of the sglang_benchmark role on that node (its summary.json: rows of {concurrency, results:
{production: {metric: value}}}, and failures). The rule, at each level of `levels`:
  - output throughput of the canary not below the control's beyond noise;
  - p99 TTFT and p99 ITL of the canary not above the control's beyond noise;
  - no failed request on the canary (a run with fewer completed requests than it sent);
  - a level a node could not measure fails the gate.
Medians of the repeated runs are compared. Noise, per level and metric, is the larger relative
spread (max - min) / median of either node's runs: estimated from the repetitions, never assumed,
so at least two runs per node are required.
"""

from __future__ import annotations

import statistics

# metric -> True where higher is better (throughput), False where lower is (latency)
GATED_METRICS = {"output_throughput": True, "p99_ttft_ms": False, "p99_itl_ms": False}


class GateError(ValueError):
    """Measurements the rule cannot judge: too few runs, or not the benchmark role's summaries."""


def _error(exc):
    try:
        from ansible.errors import AnsibleFilterError  # only inside Ansible; keeps the module importable
    except ImportError:  # pragma: no cover - plain Python use
        return exc
    return AnsibleFilterError(str(exc))


def _spread(values):
    middle = statistics.median(values)
    return (max(values) - min(values)) / middle if middle else 0.0


def _level_results(summary, level):
    """The production results of one level in one summary, or None when the run did not measure it."""
    for row in summary.get("rows", []):
        if row.get("concurrency") == level:
            return (row.get("results") or {}).get("production")
    return None


def _failed_runs(summary, level):
    return [f["message"] for f in summary.get("failures", []) if f.get("concurrency") == level]


def gate(measurements, levels):
    """The verdict: {"passed", "reasons", "levels": [{concurrency, metrics: {name: {canary, control,
    noise, passed}}, failed_requests}], "rule"}."""
    runs = {}
    for node in ("canary", "control"):
        summaries = measurements.get(node) if isinstance(measurements, dict) else None
        if not isinstance(summaries, list) or len(summaries) < 2:
            raise GateError(f"{node}: the gate needs at least 2 repeated runs per node to estimate the noise, "
                            f"got {len(summaries) if isinstance(summaries, list) else 'none'} "
                            "(sglang_upgrade_gate_repetitions)")
        runs[node] = summaries
    reasons = []
    verdicts = []
    for level in levels:
        entry = {"concurrency": level, "metrics": {}, "failed_requests": []}
        for summary in runs["canary"]:
            entry["failed_requests"] += _failed_runs(summary, level)
        if entry["failed_requests"]:
            reasons.append(f"concurrency {level}: requests failed on the canary ({entry['failed_requests'][0]})")
        results = {node: [_level_results(s, level) for s in runs[node]] for node in runs}
        unmeasured = [node for node, found in results.items() if any(r is None for r in found)]
        if unmeasured:
            reasons.append(f"concurrency {level}: not measured on the {' and the '.join(unmeasured)}")
            verdicts.append(entry)
            continue
        for metric, higher_is_better in GATED_METRICS.items():
            values = {node: [r.get(metric) for r in found] for node, found in results.items()}
            if any(v is None for vs in values.values() for v in vs):
                reasons.append(f"concurrency {level}: {metric} missing from a run")
                continue
            noise = max(_spread(values["canary"]), _spread(values["control"]))
            canary, control = statistics.median(values["canary"]), statistics.median(values["control"])
            if higher_is_better:
                passed = canary >= control * (1 - noise)
                bound = "below"
            else:
                passed = canary <= control * (1 + noise)
                bound = "above"
            entry["metrics"][metric] = {"canary": round(canary, 3), "control": round(control, 3),
                                        "noise": round(noise, 4), "passed": passed}
            if not passed:
                reasons.append(f"concurrency {level}: {metric} {canary:.3f} on the canary is {bound} the control's "
                               f"{control:.3f} beyond the noise of {noise:.1%}")
        verdicts.append(entry)
    return {"passed": not reasons, "reasons": reasons, "levels": verdicts,
            "repetitions": {node: len(summaries) for node, summaries in runs.items()},
            "rule": ("at each concurrency: output throughput not below the control's, p99 TTFT and p99 ITL not above "
                     "it, beyond noise ((max - min) / median of either node's repeated runs, medians compared); "
                     "no failed request on the canary")}


def sglang_upgrade_gate(measurements, levels):
    try:
        return gate(measurements, [int(level) for level in levels])
    except GateError as exc:
        raise _error(exc) from exc


class FilterModule:  # pylint: disable=too-few-public-methods
    def filters(self):
        return {"sglang_upgrade_gate": sglang_upgrade_gate}
