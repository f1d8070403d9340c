"""NCCL settings for sglang-canon: validate, select and render them (pure functions).

Filters:
  nccl_settings_errors(settings, label='settings') -> list of error strings ([] when valid)
  nccl_candidate_errors({'key': name, 'value': settings}) -> errors of one measurement candidate
  nccl_settings_normalize(settings)                -> {NAME: 'string value'}, sorted by name
  nccl_tuning_select(topology, explicit, by_interconnect, interconnect=None,
                     measurement=None, use_measurement=False)
                                                   -> {settings, source, reason, interconnect}
  nccl_setting_reasons(settings, reasons)          -> {NAME: reason} for the doc
  nccl_conf_block(settings)                        -> KEY=VALUE lines for /etc/nccl.conf
  nccl_sitecustomize_block(settings)               -> Python source for sitecustomize.py

What is accepted follows NCCL's own parsers (src/graph/tuning.cc parseList for NCCL_ALGO and
NCCL_PROTO, src/debug.cc for NCCL_DEBUG, NCCL_PARAM integers) and NVIDIA's environment-variable
documentation. A name outside KNOWN is refused on purpose: a typo such as NCCL_ALGOS is silently
ignored by NCCL, which is exactly the failure this validator exists to catch.
"""

from __future__ import annotations

import json
import re

# --------------------------------------------------------------------------- vocabularies

# ncclFuncStr[NCCL_NUM_FUNCTIONS]: the prefixes NCCL_ALGO / NCCL_PROTO accept (2.24+), case-insensitive.
COLLECTIVES = ("Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllReduce")
# ncclAlgoStr[NCCL_NUM_ALGORITHMS] (2.23+ added PAT), compared case-insensitively (strcasecmp).
ALGORITHMS = ("Tree", "Ring", "CollnetDirect", "CollnetChain", "NVLS", "NVLSTree", "PAT")
# ncclProtoStr[NCCL_NUM_PROTOCOLS]
PROTOCOLS = ("LL", "LL128", "Simple")
# NCCL_DEBUG levels (strcasecmp in src/debug.cc)
DEBUG_LEVELS = ("VERSION", "WARN", "INFO", "ABORT", "TRACE")
# NCCL_DEBUG_SUBSYS names (comma list, '^' inverts)
DEBUG_SUBSYSTEMS = (
    "INIT",
    "COLL",
    "P2P",
    "SHM",
    "NET",
    "GRAPH",
    "TUNING",
    "ENV",
    "ALLOC",
    "CALL",
    "PROXY",
    "NVLS",
    "BOOTSTRAP",
    "REG",
    "PROFILE",
    "RAS",
    "ALL",
)
# NCCL_P2P_LEVEL / NCCL_NET_GDR_LEVEL path types as documented (exact, upper case); legacy ints 0..5.
PATH_LEVELS = ("LOC", "NVL", "PIX", "PXB", "PHB", "SYS")

INTERCONNECTS = ("pcie", "nvlink", "mixed")

_SAFE_TEXT = re.compile(r"^[A-Za-z0-9_.,:;^=/%@+-]+$")
_IFNAME = re.compile(r"^[\^=]?[A-Za-z0-9_.:@-]+(,[A-Za-z0-9_.:@-]+)*$")
_PATH = re.compile(r"^/[A-Za-z0-9_./%@+-]*$")


# --------------------------------------------------------------------------- value checks
# Each check takes the value as a string and returns None when valid, else a short reason.


def _int_check(low, high=None, multiple_of=None):
    def check(text):
        if not re.fullmatch(r"-?[0-9]+", text):
            return "must be an integer"
        value = int(text)
        if value < low or (high is not None and value > high):
            return f"must be between {low} and {high}" if high is not None else f"must be >= {low}"
        if multiple_of and value % multiple_of:
            return f"must be a multiple of {multiple_of}"
        return None

    return check


def _choice_check(choices, case_insensitive=True):
    def check(text):
        ok = (text.lower() in {c.lower() for c in choices}) if case_insensitive else (text in choices)
        return None if ok else f"must be one of {', '.join(choices)}"

    return check


def _bool01(text):
    return None if text in ("0", "1") else "must be 0 or 1"


def _path_level(text):
    if text in PATH_LEVELS:
        return None
    if re.fullmatch(r"[0-5]", text):
        return None
    return f"must be one of {', '.join(PATH_LEVELS)} or a legacy integer 0-5"


def _list_check(elements, name):
    """NCCL's parseList grammar: '[^]a,b' or '[^]a,b;func:[^]c;func2:d' (per-collective since 2.24)."""
    lower = {e.lower(): e for e in elements}
    funcs = {f.lower() for f in COLLECTIVES}

    def check(text):
        entries = text.split(";")
        for index, entry in enumerate(entries):
            if entry == "":
                return "has an empty ';' entry"
            parts = entry.split(":")
            if len(parts) > 2:
                return f"entry {entry!r} has more than one ':'"
            if len(parts) == 1:
                if index != 0:
                    # NCCL: "All entries except the first must have a prefix"
                    return f"entry {entry!r}: every entry after the first needs a collective prefix (e.g. allreduce:)"
                elem_list = parts[0]
            else:
                prefix, elem_list = parts
                if prefix.lower() not in funcs:
                    return f"unknown collective {prefix!r} (one of {', '.join(COLLECTIVES)})"
            if elem_list.startswith("^"):
                elem_list = elem_list[1:]
            items = elem_list.split(",")
            for item in items:
                if item == "":
                    return f"entry {entry!r} has an empty {name} name"
                if item.lower() not in lower:
                    return f"unknown {name} {item!r} (one of {', '.join(elements)})"
        return None

    return check


def _debug_subsys(text):
    body = text[1:] if text.startswith("^") else text
    for item in body.split(","):
        if item.upper() not in DEBUG_SUBSYSTEMS:
            return f"unknown subsystem {item!r} (one of {', '.join(DEBUG_SUBSYSTEMS)})"
    return None


def _ifname(text):
    return None if _IFNAME.match(text) else "must be a comma list of interface names, optionally prefixed by ^ or ="


def _abs_path(text):
    return None if _PATH.match(text) else "must be an absolute path without spaces"


# The NCCL variables sglang-canon lets an inventory set, each with NCCL's accepted values.
KNOWN = {
    # algorithm / protocol selection (NVIDIA lists them under "Debugging")
    "NCCL_ALGO": _list_check(ALGORITHMS, "algorithm"),
    "NCCL_PROTO": _list_check(PROTOCOLS, "protocol"),
    # transports
    "NCCL_P2P_DISABLE": _bool01,
    "NCCL_P2P_LEVEL": _path_level,
    "NCCL_P2P_DIRECT_DISABLE": _bool01,
    "NCCL_SHM_DISABLE": _bool01,
    "NCCL_IB_DISABLE": _bool01,
    "NCCL_NET_GDR_LEVEL": _path_level,
    "NCCL_CUMEM_ENABLE": _bool01,
    "NCCL_NVLS_ENABLE": _bool01,
    "NCCL_SOCKET_IFNAME": _ifname,
    # resources (NCCL clamps channels/CTAs to MAXCHANNELS = 64 in current releases)
    "NCCL_MIN_NCHANNELS": _int_check(1, 64),
    "NCCL_MAX_NCHANNELS": _int_check(1, 64),
    "NCCL_MIN_CTAS": _int_check(1, 64),
    "NCCL_MAX_CTAS": _int_check(1, 64),
    "NCCL_BUFFSIZE": _int_check(1),
    # getNthreads(): a multiple of WARP_SIZE between 2*WARP_SIZE and NCCL_SIMPLE_MAX_NTHREADS
    "NCCL_NTHREADS": _int_check(64, 512, multiple_of=32),
    # diagnostics
    "NCCL_DEBUG": _choice_check(DEBUG_LEVELS),
    "NCCL_DEBUG_SUBSYS": _debug_subsys,
    "NCCL_DEBUG_FILE": _abs_path,
}

# pairs that must be ordered (min <= max) when both are given
_MIN_MAX = (("NCCL_MIN_NCHANNELS", "NCCL_MAX_NCHANNELS"), ("NCCL_MIN_CTAS", "NCCL_MAX_CTAS"))


def _as_text(value):
    """The string NCCL would read for a YAML value, or (None, reason) when the type is unusable."""
    if isinstance(value, bool):
        return None, "is a boolean; write 0 or 1 (quoted) instead of true/false"
    if isinstance(value, int):
        return str(value), None
    if isinstance(value, str):
        return value, None
    if value is None:
        return None, "is null; remove the key to leave NCCL's default"
    return None, f"has type {type(value).__name__}; give a string or an integer"


# --------------------------------------------------------------------------- filters


def nccl_settings_errors(settings, label="settings"):
    """Every problem in one mapping of NCCL variables, each message naming the variable."""
    if settings is None:
        return []
    if not isinstance(settings, dict):
        return [f"{label}: must be a mapping of NCCL_* names to values, got {type(settings).__name__}"]
    errors = []
    texts = {}
    for name in sorted(settings, key=str):
        value = settings[name]
        if not isinstance(name, str) or not name.startswith("NCCL_"):
            errors.append(f"{label}: {name!r} is not an NCCL_* variable")
            continue
        if name not in KNOWN:
            errors.append(
                f"{label}: {name} is not an NCCL variable sglang-canon knows " f"(known: {', '.join(sorted(KNOWN))})"
            )
            continue
        text, problem = _as_text(value)
        if problem:
            errors.append(f"{label}: {name} {problem}")
            continue
        if text == "" or text != text.strip() or not _SAFE_TEXT.match(text):
            errors.append(
                f"{label}: {name}={text!r} is empty or holds spaces, quotes or other characters NCCL " "does not parse"
            )
            continue
        reason = KNOWN[name](text)
        if reason:
            errors.append(f"{label}: {name}={text!r} {reason}")
            continue
        texts[name] = text
    for low, high in _MIN_MAX:
        if low in texts and high in texts and int(texts[low]) > int(texts[high]):
            errors.append(f"{label}: {low}={texts[low]} is greater than {high}={texts[high]}")
    return errors


def nccl_candidate_errors(item):
    """Errors of one measurement candidate ({'key': name, 'value': settings}, as from dict2items).
    A candidate must set something, and may not turn NVLink multicast on (NCCL_NVLS_ENABLE=1)."""
    name, settings = item.get("key"), item.get("value")
    label = f"nccl_measure_candidates.{name}"
    if not isinstance(settings, dict) or not settings:
        return [f"{label}: must be a non-empty mapping of NCCL_* settings"]
    errors = nccl_settings_errors(settings, label)
    if str(settings.get("NCCL_NVLS_ENABLE", "0")) != "0":
        errors.append(f"{label}: NCCL_NVLS_ENABLE must stay 0 while measuring (NVLink multicast stays off)")
    return errors


def nccl_settings_normalize(settings):
    """{NAME: str(value)} sorted by name; assumes nccl_settings_errors() found nothing."""
    if not settings:
        return {}
    return {name: _as_text(settings[name])[0] for name in sorted(settings)}


def select_settings(topology, explicit, by_interconnect, interconnect=None, measurement=None, use_measurement=False):
    """Which NCCL settings a node gets, and why. Raises ValueError when it cannot tell."""
    topology = topology or {}
    by_interconnect = by_interconnect or {}
    if explicit is not None:
        return {
            "settings": nccl_settings_normalize(explicit),
            "source": "inventory",
            "reason": "nccl_tuning_settings is set in the inventory; it overrides every default.",
            "interconnect": interconnect or topology.get("interconnect"),
        }
    if use_measurement:
        if not measurement or not isinstance(measurement.get("settings"), dict):
            raise ValueError(
                "nccl_tuning_use_measurement is true but no measured choice was found on the node; "
                "run playbooks/nccl_measure.yml first"
            )
        chosen = measurement.get("chosen", "?")
        return {
            "settings": nccl_settings_normalize(measurement["settings"]),
            "source": "measurement",
            "reason": f"Measured on this node by nccl_measure: candidate {chosen!r} won under the rule "
            f"'{measurement.get('rule', 'see choice.json')}'.",
            "interconnect": interconnect or topology.get("interconnect"),
        }
    count = topology.get("gpu_count")
    if interconnect is None and isinstance(count, int) and count < 2:
        return {
            "settings": {},
            "source": "single gpu",
            "reason": f"{count} GPU(s): no NCCL collectives run between GPUs, so NCCL's defaults are kept.",
            "interconnect": topology.get("interconnect"),
        }
    kind = interconnect if interconnect is not None else topology.get("interconnect")
    if kind is None:
        raise ValueError(
            "no GPU interconnect known: run gpu_preflight first (ansible_facts.gpu_topology), "
            "or set nccl_tuning_interconnect or nccl_tuning_settings"
        )
    if kind not in INTERCONNECTS:
        raise ValueError(f"interconnect {kind!r} is not one of {', '.join(INTERCONNECTS)}")
    settings = by_interconnect.get(kind) or {}
    reasons = {
        "pcie": "PCIe-only node: the seed's all-reduce settings from nccl_tuning_pcie_settings "
        "(small decode all-reduces go through NCCL at TP8 on PCIe).",
        "nvlink": "NVLink node: NCCL's own choice (nccl_tuning_nvlink_settings); forcing LL+Ring measured "
        "2.4x slower at 64 MiB on an H200 NVLink pair.",
        "mixed": "Mixed NVLink/PCIe node: NCCL's topology search handles mixed links "
        "(nccl_tuning_mixed_settings); nothing measured justifies forcing a protocol.",
    }
    reason = (
        reasons[kind]
        if settings or kind != "pcie"
        else "PCIe-only node with an empty nccl_tuning_pcie_settings: NCCL's defaults."
    )
    return {
        "settings": nccl_settings_normalize(settings),
        "source": f"{kind} default",
        "reason": reason,
        "interconnect": kind,
    }


def nccl_tuning_select(topology, explicit, by_interconnect, interconnect=None, measurement=None, use_measurement=False):
    try:
        return select_settings(topology, explicit, by_interconnect, interconnect, measurement, use_measurement)
    except ValueError as exc:
        from ansible.errors import AnsibleFilterError  # only inside Ansible; keeps the module importable

        raise AnsibleFilterError(f"nccl_tuning: {exc}") from exc


def nccl_setting_reasons(settings, reasons):
    """{NAME: reason} for each set variable; a variable without a reason says so (the doc shows it)."""
    reasons = reasons or {}
    return {
        name: reasons.get(name) or "No reason recorded (add one to nccl_tuning_setting_reasons)."
        for name in sorted(settings or {})
    }


def nccl_conf_block(settings):
    """Lines for /etc/nccl.conf. NCCL reads 'NAME=value' verbatim (no quotes, no spaces)."""
    return "\n".join(f"{k}={v}" for k, v in nccl_settings_normalize(settings).items())


def nccl_sitecustomize_block(settings):
    """Python for sitecustomize.py. setdefault: an explicit environment (a unit's Environment=, a
    shell's NCCL_DEBUG=INFO) still wins over the node-wide value, the same precedence NCCL gives
    /etc/nccl.conf (setenv without overwrite)."""
    items = nccl_settings_normalize(settings)
    lines = ["import os as _sglang_canon_os"]
    lines += [f"_sglang_canon_os.environ.setdefault({json.dumps(k)}, {json.dumps(v)})" for k, v in items.items()]
    lines.append("del _sglang_canon_os")
    return "\n".join(lines)


class FilterModule:
    def filters(self):
        return {
            "nccl_settings_errors": nccl_settings_errors,
            "nccl_settings_normalize": nccl_settings_normalize,
            "nccl_candidate_errors": nccl_candidate_errors,
            "nccl_tuning_select": nccl_tuning_select,
            "nccl_setting_reasons": nccl_setting_reasons,
            "nccl_conf_block": nccl_conf_block,
            "nccl_sitecustomize_block": nccl_sitecustomize_block,
        }
