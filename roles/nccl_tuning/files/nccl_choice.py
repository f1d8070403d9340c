"""Pick NCCL settings from an all-reduce latency table (stdlib only, no GPU needed).

The table is JSON lines, one per run, as written by nccl_allreduce_bench.py (and as in the
captured fixture tests/fixtures/nccl/h200x2-nvlink.jsonl):

  {"candidate": "seed-pcie", "settings": {"NCCL_PROTO": "LL", ...}, "world": 2,
   "us_per_allreduce": {"16384": 39.4, ...}, "spread_us": {"16384": 0.8, ...}, "correct": true}

Older lines without "candidate"/"settings" (the fixture) are understood too: the settings are then
the line's "env" minus bookkeeping names (NCCL_VERSION, and the variables every run carries).

The rule (RULE below, stored next to the choice):
  1. The baseline is the run with no settings: NCCL's own defaults.
  2. A candidate is eligible only if it ran, gave correct sums, covered every baseline size, and was
     never slower than the baseline beyond noise at any size, where
     noise(size) = max(noise_mult x max(spread_candidate, spread_baseline), noise_floor x baseline).
  3. Among eligible candidates the lowest geometric-mean latency over the sizes wins, but only if it
     beats the baseline's geometric mean by at least min_gain; otherwise NCCL's defaults are kept
     (an empty mapping). Ties go to fewer variables, then to the name.
"""

from __future__ import annotations

import json
import math

# Names present in every run's environment (safety and isolation) or pure bookkeeping: never
# part of what a candidate *is*.
BOOKKEEPING = frozenset({"NCCL_VERSION", "NCCL_NVLS_ENABLE", "NCCL_CONF_FILE"})

NOISE_MULT = 3.0
NOISE_FLOOR = 0.05
MIN_GAIN = 0.03


def rule_text(noise_mult=NOISE_MULT, noise_floor=NOISE_FLOOR, min_gain=MIN_GAIN):
    return (
        f"lowest geometric-mean latency among candidates that gave correct sums and were never slower "
        f"than NCCL's defaults by more than max({noise_mult:g} x spread, {noise_floor:.0%}) at any size, "
        f"and only if at least {min_gain:.0%} faster than the defaults in geometric mean; "
        f"otherwise NCCL's defaults (no settings)"
    )


RULE = rule_text()


def load_records(lines):
    """Table records from JSON lines; other lines (NCCL INFO logs, '---', choice/skip lines) are skipped."""
    records = []
    for line in lines:
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict) and ("us_per_allreduce" in obj or "error" in obj) and "choice" not in obj:
            records.append(obj)
    return records


def settings_of(record):
    if isinstance(record.get("settings"), dict):
        return {k: str(v) for k, v in record["settings"].items()}
    env = record.get("env") or {}
    return {k: str(v) for k, v in env.items() if k.startswith("NCCL_") and k not in BOOKKEEPING}


def name_of(record):
    if record.get("candidate"):
        return str(record["candidate"])
    settings = settings_of(record)
    if not settings:
        return "defaults"
    return " ".join(f"{k}={v}" for k, v in sorted(settings.items()))


def _series(record, key):
    return {int(size): float(v) for size, v in (record.get(key) or {}).items()}


def geomean(values):
    values = [v for v in values if v > 0]
    if not values:
        return None
    return math.exp(sum(math.log(v) for v in values) / len(values))


def choose(records, noise_mult=NOISE_MULT, noise_floor=NOISE_FLOOR, min_gain=MIN_GAIN, sizes=None):
    """The choice and the evidence, as a JSON-ready dict. Raises ValueError without a defaults run."""
    baseline = next((r for r in records if not settings_of(r) and "error" not in r), None)
    if baseline is None:
        raise ValueError("no run under NCCL's defaults (a line with no NCCL settings) in the table")
    base_us = _series(baseline, "us_per_allreduce")
    base_spread = _series(baseline, "spread_us")
    if sizes:
        missing = [s for s in sizes if s not in base_us]
        if missing:
            raise ValueError(f"sizes {missing} were not measured under NCCL's defaults")
        base_us = {s: base_us[s] for s in sizes}
    size_list = sorted(base_us)
    base_geo = geomean(base_us[s] for s in size_list)

    rows = [
        {
            "candidate": name_of(baseline),
            "settings": {},
            "baseline": True,
            "eligible": True,
            "geomean_us": base_geo,
            "vs_defaults": 1.0,
            "why": "NCCL's defaults (the baseline)",
            "us_per_allreduce": {str(s): base_us[s] for s in size_list},
        }
    ]
    for record in records:
        if record is baseline:
            continue
        row = {"candidate": name_of(record), "settings": settings_of(record), "baseline": False}
        rows.append(row)
        if "error" in record:
            row.update(eligible=False, geomean_us=None, vs_defaults=None, why=f"did not run: {record['error']}")
            continue
        if not row["settings"]:
            row.update(eligible=False, geomean_us=None, vs_defaults=None, why="another run under NCCL's defaults")
            continue
        us = _series(record, "us_per_allreduce")
        spread = _series(record, "spread_us")
        row["us_per_allreduce"] = {str(s): us[s] for s in size_list if s in us}
        missing = [s for s in size_list if s not in us]
        if missing:
            row.update(eligible=False, geomean_us=None, vs_defaults=None, why=f"not measured at sizes {missing}")
            continue
        geo = geomean(us[s] for s in size_list)
        row.update(geomean_us=geo, vs_defaults=geo / base_geo if base_geo else None)
        if record.get("correct") is False:
            row.update(eligible=False, why="wrong all-reduce sums (data corruption): never use")
            continue
        slower = []
        for s in size_list:
            tolerance = max(noise_mult * max(spread.get(s, 0.0), base_spread.get(s, 0.0)), noise_floor * base_us[s])
            if us[s] > base_us[s] + tolerance:
                slower.append(
                    f"{s} B: {us[s]:.1f} us vs {base_us[s]:.1f} us (+{us[s] / base_us[s] - 1:.0%}, "
                    f"noise {tolerance:.1f} us)"
                )
        if slower:
            row.update(eligible=False, why="slower than NCCL's defaults beyond noise at " + "; ".join(slower))
        else:
            row.update(eligible=True, why="never slower than NCCL's defaults beyond noise")

    contenders = [r for r in rows if r["eligible"] and not r["baseline"]]
    contenders.sort(key=lambda r: (r["geomean_us"], len(r["settings"]), r["candidate"]))
    chosen = rows[0]
    decision = "no candidate was eligible: keep NCCL's defaults"
    if contenders:
        best = contenders[0]
        gain = 1.0 - best["vs_defaults"]
        if gain >= min_gain:
            chosen = best
            decision = f"{best['candidate']!r} is {gain:.1%} faster than NCCL's defaults in geometric mean"
        elif gain > 0:
            decision = (
                f"best eligible candidate {best['candidate']!r} is only {gain:.1%} faster in geometric mean "
                f"(< {min_gain:.0%}): keep NCCL's defaults"
            )
        else:
            decision = (
                f"best eligible candidate {best['candidate']!r} is {-gain:.1%} slower in geometric mean: "
                "keep NCCL's defaults"
            )
    return {
        "rule": rule_text(noise_mult, noise_floor, min_gain),
        "sizes": size_list,
        "world": baseline.get("world"),
        "chosen": chosen["candidate"] if not chosen["baseline"] else "defaults",
        "settings": dict(chosen["settings"]),
        "decision": decision,
        "candidates": rows,
    }


def markdown_table(choice):
    """A small Markdown table of the evidence (median us per size), for production docs."""
    sizes = choice["sizes"]
    head = "| candidate | " + " | ".join(_size_label(s) for s in sizes) + " | geomean | eligible |"
    sep = "|" + " --- |" * (len(sizes) + 3)
    lines = [head, sep]
    for row in choice["candidates"]:
        us = row.get("us_per_allreduce") or {}
        cells = [f"{us[str(s)]:.1f}" if str(s) in us else "-" for s in sizes]
        geo = f"{row['geomean_us']:.1f}" if row.get("geomean_us") else "-"
        lines.append(
            f"| {row['candidate']} | " + " | ".join(cells) + f" | {geo} | {'yes' if row['eligible'] else 'no'} |"
        )
    return "\n".join(lines)


def _size_label(size):
    for unit, factor in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= factor and size % factor == 0:
            return f"{size // factor} {unit}"
    return f"{size} B"
