# -*- coding: utf-8 -*-
# Copyright: sglang-canon contributors
# MIT License (see roles/sglang_upgrade/meta/main.yml)
"""Pure logic of the SGLang upgrade report (the sglang_upgrade_report module, playbooks/upgrade.yml).

Given what was read on the controller -- the target release's wheel (its files and METADATA), the
patch sets, the canonical command line and environment as the current and the target release's own
ServerArgs resolved them (the sglang_server_args_check module's results), and the inventory's
package pins -- it says, section by section:

  patches      each patch of the active set against the target's pristine files, in set order:
               clean (every hunk at its stated line), offset (some hunk found elsewhere, exact
               context), fuzz (only with GNU patch's fuzz), fails (file and hunk), obsolete (the target already holds the patch's
               lines, or the set's set.yml names upstream's own fix and the target has it).
               The applier is the role's own (module_utils/unified_diff.py): there is no fuzz,
               a hunk whose context differs fails.
  server_args  flags the target refuses (removed ones with the target's closest field), fields
               gone (with a new field of a close name: renamed or split),
               resolved values that changed (defaults the canonical config relies on), the
               speculative algorithm and scheduler each release resolves to.
  environment  each variable the canonical environment sets, and whether the target reads it.
  stack        the target's pinned requirements against the current release's and the
               inventory's pins.
  refusals     one line per reason the upgrade must not go ahead; empty = the report allows it.
  warnings     what does not refuse it but must be known (a variable the target no longer reads).

render_markdown() writes the report a person reads; the same dict is the JSON for tools.
Standard library only, plus the project's own module_utils.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import difflib

from ansible.module_utils.sglang_pins import canonical_name, is_extra_only, parse_requirement, release_pins, versions_equal
from ansible.module_utils.unified_diff import FilePatch, PatchError, apply_file_patch, parse_patch, split_lines

# GNU patch's default fuzz: context lines it may ignore at each end of a hunk.
MAX_FUZZ = 2

# Resolved ServerArgs fields that name the speculative decoding and the scheduler serving it.
SPECULATIVE_FIELDS = ("speculative_algorithm", "speculative_num_steps", "speculative_eagle_topk",
                      "speculative_num_draft_tokens", "disable_overlap_schedule", "spec_v2", "spec_v2_env")


# --------------------------------------------------------------------------
# Patches
# --------------------------------------------------------------------------


def _declared_obsolete(rule, read_file):
    """The reason set.yml's obsolete rule holds for the target, or None: the target's ``file`` holds
    ``contains`` (a line of upstream's own change) and lacks ``lacks`` (what upstream removed);
    either may be left out, not both."""
    if not isinstance(rule, dict) or not rule.get("file") or not (rule.get("contains") or rule.get("lacks")):
        return None
    data = read_file(rule["file"])
    contains, lacks = rule.get("contains"), rule.get("lacks")
    if data is None or (contains and contains.encode("utf-8") not in data) or (lacks and lacks.encode("utf-8") in data):
        return None
    said = " and ".join(["contains %r" % contains] * bool(contains) + ["lacks %r" % lacks] * bool(lacks))
    why = " ".join(str(rule.get("why") or "").split())
    return "set.yml: %s of the target %s (upstream's own fix)%s" % (rule["file"], said, ": " + why if why else "")


def _fuzz_match(data, hunk):
    """(fuzz, line) where the hunk's old lines match exactly once when up to ``fuzz`` context lines
    at each end are ignored, as GNU patch's fuzz does, or None."""
    src = split_lines(data)
    for fuzz in range(1, MAX_FUZZ + 1):
        lead = 0
        while lead < fuzz and lead < len(hunk.lines) and hunk.lines[lead][0] == b" ":
            lead += 1
        trail = 0
        while trail < fuzz and trail < len(hunk.lines) - lead and hunk.lines[-1 - trail][0] == b" ":
            trail += 1
        old = [body for tag, body in hunk.lines[lead:len(hunk.lines) - trail] if tag in (b" ", b"-")]
        if not old:
            continue
        found = [k for k in range(len(src) - len(old) + 1) if src[k] == old[0] and src[k:k + len(old)] == old]
        if len(found) == 1:
            return fuzz, found[0] + 1 - lead
    return None


def _hunk_results(data, file_patch, patch_name):
    """Each hunk of one file applied alone to the file: its stated line, where it was found, or why not."""
    results = []
    for number, hunk in enumerate(file_patch.hunks, 1):
        single = FilePatch(file_patch.path)
        single.hunks = [hunk]
        placements = []
        try:
            apply_file_patch(data, single, patch_name, placements=placements)
        except PatchError as exc:
            reason = str(exc).rsplit(": ", 1)[-1]
            fuzzy = _fuzz_match(data, hunk)
            if fuzzy:
                results.append({"hunk": number, "header": hunk.header, "result": "fuzz %d" % fuzzy[0], "found_line": fuzzy[1],
                                "reason": "%s; only with fuzz %d, near line %d" % (reason, fuzzy[0], fuzzy[1])})
            else:
                results.append({"hunk": number, "header": hunk.header, "result": "fails", "reason": reason})
            continue
        _, stated, found = placements[0]
        results.append({"hunk": number, "header": hunk.header, "stated_line": stated, "found_line": found,
                        "result": "clean" if stated == found else "offset %+d" % (found - stated)})
    return results


def classify_patch(name, content, files, obsolete_rule=None):
    """One patch against the target's files as the earlier patches of its set left them.

    Its status: clean, offset, fuzz (some hunk matches only when GNU patch's fuzz ignores outer
    context lines: the role's applier has none, so it must be ported), fails, or obsolete.
    ``files`` maps a site-packages path to the target's bytes (None: the wheel has no such file);
    a patch that applies updates it, so the next patch of the set sees what the role would write.
    Returns {name, status, files: [{path, hunks}], reason}.
    """
    try:
        patch = parse_patch(name, content)
    except PatchError as exc:
        return {"name": name, "status": "fails", "files": [], "reason": str(exc)}

    def read_file(path):
        return files.get(path)

    declared = _declared_obsolete(obsolete_rule, read_file)
    if declared:
        return {"name": name, "status": "obsolete", "files": [], "reason": declared}
    missing = [fp.path for fp in patch.files if read_file(fp.path) is None]
    if missing:
        return {"name": name, "status": "fails", "files": [],
                "reason": "the target has no %s" % ", ".join(sorted(set(missing)))}

    reports = [{"path": fp.path, "hunks": _hunk_results(read_file(fp.path), fp, name)} for fp in patch.files]
    failed = ["%s hunk %d (%s): %s" % (r["path"], h["hunk"], h["header"], h["reason"])
              for r in reports for h in r["hunks"] if "reason" in h]
    if failed:
        try:
            for fp in patch.files:
                apply_file_patch(read_file(fp.path), fp, name, reverse=True)
        except PatchError:
            fuzz_only = all(h["result"] != "fails" for r in reports for h in r["hunks"])
            return {"name": name, "status": "fuzz" if fuzz_only else "fails", "files": reports, "reason": "; ".join(failed)}
        return {"name": name, "status": "obsolete", "files": reports,
                "reason": "the target already holds the patch's lines (it reverses cleanly)"}

    patched = {}
    try:
        for fp in patch.files:
            patched[fp.path] = apply_file_patch(patched.get(fp.path, read_file(fp.path)), fp, name)
    except PatchError as exc:
        # Each hunk fits alone, yet not all in order (overlapping or out of order).
        return {"name": name, "status": "fails", "files": reports, "reason": str(exc)}
    files.update(patched)
    offsets = [h for r in reports for h in r["hunks"] if h["result"] != "clean"]
    return {"name": name, "status": "offset" if offsets else "clean", "files": reports,
            "reason": ", ".join("%s hunk %d at line %d, stated %d" % (r["path"], h["hunk"], h["found_line"], h["stated_line"])
                                for r in reports for h in r["hunks"] if h["result"] != "clean")}


def classify_set(patches, wheel_files, obsolete_rules):
    """classify_patch for each patch of a set in order ({name: SET/FILE, content}), on a copy of the files."""
    files = dict(wheel_files)
    results = []
    for patch in patches:
        rule = obsolete_rules.get(patch["name"].rsplit("/", 1)[-1])
        results.append(classify_patch(patch["name"], patch["content"], files, rule))
    return results


def patched_paths(patches):
    """Every site-packages path the patches edit (the files the report reads from the wheel)."""
    paths = []
    for patch in patches:
        try:
            parsed = parse_patch(patch["name"], patch["content"])
        except PatchError:
            continue
        paths.extend(p for p in parsed.paths() if p not in paths)
    return paths


# --------------------------------------------------------------------------
# Server arguments and environment
# --------------------------------------------------------------------------


def compare_server_args(current, target, configured_fields):
    """The canonical command line through both releases' ServerArgs (sglang_server_args_check results).

    ``configured_fields`` are the sglang_server_args keys the inventory sets. A resolved value
    that differs for a field it leaves unset is a changed default the configuration relies on.
    """
    current_resolved = current.get("resolved") or {}
    target_resolved = target.get("resolved") or {}
    refused = []
    for error in target.get("errors") or []:
        entry = {"flag": error.get("flag"), "variable": error.get("variable"), "message": error.get("message")}
        flag = error.get("flag") or ""
        if "unrecognized arguments" in (error.get("message") or "") and flag:
            entry["closest"] = []
            for word in flag.split():
                if word.startswith("--"):
                    field = word[2:].replace("-", "_")
                    entry["closest"] += difflib.get_close_matches(field, list(target_resolved), n=1, cutoff=0.75)
        refused.append(entry)
    changed = []
    if current_resolved and target_resolved:
        for field in sorted(set(current_resolved) & set(target_resolved)):
            if field in SPECULATIVE_FIELDS or current_resolved[field] == target_resolved[field]:
                continue
            changed.append({"field": field, "current": current_resolved[field], "target": target_resolved[field],
                            "configured": field in configured_fields})
    speculative = {field: {"current": current_resolved.get(field), "target": target_resolved.get(field)}
                   for field in SPECULATIVE_FIELDS}
    new_fields = sorted(set(target_resolved) - set(current_resolved)) if current_resolved else []
    # A field gone with a new one of a close name was most likely renamed (or split) into it.
    removed = [{"field": field, "closest": difflib.get_close_matches(field, new_fields, n=2, cutoff=0.75)}
               for field in (sorted(set(current_resolved) - set(target_resolved)) if target_resolved else [])]
    return {
        "current_errors": [e.get("message") for e in current.get("errors") or []],
        "refused": refused,
        "changed": changed,
        "removed_fields": removed,
        "new_fields": new_fields,
        "speculative": speculative,
    }


def environment_readers(environment, current_sources, target_sources, active_patches, target_patches):
    """Whether each variable of the canonical environment is read by each release (its name in
    its Python sources) or by a patch of the active set or of the target's set. ``*_sources`` are
    the wheels' .py texts."""
    rows = []
    for name in sorted(environment):
        needle = name.encode("utf-8")
        rows.append({
            "name": name,
            "value": environment[name],
            "current_reads": any(needle in text for text in current_sources),
            "target_reads": any(needle in text for text in target_sources),
            "patches": [p["name"] for p in active_patches if name in p["content"]],
            "target_patches": [p["name"] for p in target_patches if name in p["content"]],
        })
    return rows


# --------------------------------------------------------------------------
# Stack
# --------------------------------------------------------------------------


def compare_stack(current_requires, target_requires, inventory_pins, deviations=()):
    """The target's exact pins next to the current release's, and each inventory pin against the
    target's requirement of that package. ``inventory_pins`` are {name, pin, origin};
    ``deviations`` name the packages a node runs at another version on purpose
    (sglang_install_constraints_exclude: the CPU test node's torch)."""
    deliberate = set(canonical_name(n) for n in deviations)
    current = dict((p["canonical"], p["pin"]) for p in release_pins(current_requires))
    target = dict((p["canonical"], p["pin"]) for p in release_pins(target_requires))
    pins = []
    for name in sorted(set(current) | set(target)):
        if current.get(name) != target.get(name):
            pins.append({"package": name, "current": current.get(name), "target": target.get(name)})
    requirements = {}
    for entry in target_requires or []:
        requirement = parse_requirement(entry)
        if not is_extra_only(requirement):
            requirements[requirement["canonical"]] = requirement
    inventory = []
    for pin in inventory_pins:
        name = canonical_name(pin["name"])
        wanted = requirements.get(name)
        if wanted is None:
            verdict = "not required by the target"
        elif name in deliberate and wanted["pin"] is not None and not versions_equal(wanted["pin"], pin["pin"]):
            verdict = "deliberate deviation (sglang_install_constraints_exclude) from the target's %s==%s" % (
                wanted["name"], wanted["pin"])
        elif wanted["pin"] is None:
            verdict = "ok (the target requires %s)" % (wanted["text"],)
        elif versions_equal(wanted["pin"], pin["pin"]):
            verdict = "ok"
        else:
            verdict = "conflict: the target requires %s==%s" % (wanted["name"], wanted["pin"])
        inventory.append({"package": pin["name"], "pin": pin["pin"], "origin": pin["origin"], "verdict": verdict})
    return {"pins": pins, "inventory": inventory}


# --------------------------------------------------------------------------
# Verdict and Markdown
# --------------------------------------------------------------------------


def refusals(report):
    """One line per reason the report refuses the upgrade; the first is the one-line reason."""
    reasons = []
    active, target_set = report["active_set"], report["target_set"]
    if active["patches"] and not target_set["exists"]:
        reasons.append("no patch set for sglang %s (%s) while the active set %s has %d patch(es)" % (
            report["to"], target_set["dir"], ", ".join(active["names"]) or "-", len(active["patches"])))
    for patch in target_set["patches"]:
        if patch["status"] in ("fails", "fuzz"):
            reasons.append("patch %s of the target's set %s on sglang %s: %s" % (
                patch["name"], "fails" if patch["status"] == "fails" else "needs fuzz", report["to"], patch["reason"]))
    args = report["server_args"]
    if args["current_errors"]:
        # Then nothing the target says can be compared: most often the models' config folders are
        # not on the controller (sglang_upgrade_model_path, sglang_upgrade_draft_model_path).
        reasons.append("sglang %s itself refuses the canonical configuration on the controller, so the releases cannot "
                       "be compared (sglang_upgrade_model_path, sglang_upgrade_draft_model_path?): %s" % (
                           report["from"], "; ".join(args["current_errors"])))
    for entry in args["refused"]:
        reasons.append("sglang %s refuses %s: %s" % (report["to"], entry.get("variable") or entry.get("flag") or "the arguments",
                                                     entry["message"]))
    for field in ("speculative_algorithm", "spec_v2"):
        values = args["speculative"][field]
        if values["current"] != values["target"]:
            reasons.append("sglang %s resolves %s to %s, not %s as %s does" % (
                report["to"], field, values["target"], values["current"], report["from"]))
    for row in report["stack"]["inventory"]:
        if row["verdict"].startswith("conflict"):
            reasons.append("%s pins %s==%s, but sglang %s requires %s" % (
                row["origin"], row["package"], row["pin"], report["to"], row["verdict"].rsplit(" ", 1)[-1]))
    return reasons


def warnings(report):
    """What the report does not refuse but an operator must know: a variable of the environment
    that the current release (or its patches) reads and the target (with its set) no longer does.
    Not a refusal: its effect shows in what the target resolves, which is compared and refused."""
    lines = []
    for row in report["environment"]:
        if (row["current_reads"] or row["patches"]) and not row["target_reads"] and not row["target_patches"]:
            lines.append("sglang_service_environment.%s: sglang %s%s no longer reads it" % (
                row["name"], report["to"], " and its patch set" if report["target_set"]["exists"] else ""))
    return lines


def _cell(value):
    text = "-" if value is None else str(value)
    return text.replace("|", "\\|").replace("\n", " ")


def _table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
    return lines


def _patch_rows(patches):
    return [(p["name"], p["status"], p["reason"] or "") for p in patches]


def render_markdown(report):
    """The report as Markdown: verdict first, then each section."""
    out = ["# SGLang upgrade report: %s to %s" % (report["from"], report["to"]), ""]
    if report["refusals"]:
        out += ["**Refused**: %s" % report["refusals"][0], ""]
        out += ["- %s" % reason for reason in report["refusals"]]
    else:
        out += ["**Allowed by the report** (the rollout itself is not built yet: see README, Upgrades)."]
    if report["warnings"]:
        out += ["", "Warnings:", ""] + ["- %s" % line for line in report["warnings"]]
    out += ["", "Target wheel: `%s` (%s)." % (report["wheel"], report["sources"]), ""]

    active, target_set = report["active_set"], report["target_set"]
    out += ["## Patches", "",
            "The role's applier is strict (exact context, an offset only where the context matches at exactly one "
            "place, no fuzz): a hunk whose context differs fails.", "",
            "Active set (%s) on sglang %s:" % (", ".join(active["names"]) or "none", report["to"]), ""]
    out += _table(["patch", "result", "detail"], _patch_rows(active["patches"])) if active["patches"] else ["(no patches)"]
    out += ["", "Patch set for sglang %s: %s" % (
        report["to"], ("`%s`" % target_set["name"]) if target_set["exists"] else "none (%s does not exist)" % target_set["dir"]), ""]
    if target_set["exists"]:
        out += _table(["patch", "result", "detail"], _patch_rows(target_set["patches"])) + [""]

    args = report["server_args"]
    out += ["## Server arguments and environment", "",
            "The canonical command line and environment through each release's own `ServerArgs` (on the controller, "
            "no GPU: values derived from GPU memory are those of an unknown GPU in both).", ""]
    if args["current_errors"]:
        out += ["sglang %s itself refuses them here: %s" % (report["from"], "; ".join(args["current_errors"])), ""]
    if args["refused"]:
        out += _table(["variable / flag", "sglang %s says" % report["to"], "closest field"],
                      [(e.get("variable") or e.get("flag"), e["message"], ", ".join(e.get("closest") or []))
                       for e in args["refused"]]) + [""]
    else:
        out += ["sglang %s accepts every flag." % report["to"], ""]
    out += ["Speculative decoding and scheduler as resolved:", ""]
    out += _table(["field", report["from"], report["to"]],
                  [(f, v["current"], v["target"]) for f, v in args["speculative"].items()]) + [""]
    out += ["Resolved values that changed (`set` = the inventory sets the field):", ""]
    out += _table(["field", "set", report["from"], report["to"]],
                  [(c["field"], "set" if c["configured"] else "default", c["current"], c["target"]) for c in args["changed"]]) \
        if args["changed"] else ["(none)"]
    out += ["", "Fields gone in %s (with its closest new field, a likely rename): %s. New fields: %d." % (
        report["to"], ", ".join(r["field"] + (" (%s)" % ", ".join(r["closest"]) if r["closest"] else "")
                                for r in args["removed_fields"]) or "none", len(args["new_fields"])), ""]
    out += _table(["environment variable", "value", "read by %s" % report["from"], "read by %s" % report["to"],
                   "read by the active set", "read by the target's set"],
                  [(r["name"], r["value"], "yes" if r["current_reads"] else "no", "yes" if r["target_reads"] else "no",
                    ", ".join(r["patches"]) or "-", ", ".join(r["target_patches"]) or "-") for r in report["environment"]]) + [""]

    stack = report["stack"]
    out += ["## Stack", "", "Exact pins that differ between the releases' metadata (Requires-Dist):", ""]
    out += _table(["package", report["from"], report["to"]], [(p["package"], p["current"], p["target"]) for p in stack["pins"]]) \
        if stack["pins"] else ["(none)"]
    out += ["", "The inventory's pins (`sglang_install_sources`, stack_verify's torch) against the target; the target's "
            "metadata names no CUDA build, stack_verify expects torch built for CUDA %s:" % (stack.get("torch_cuda") or "(not checked)"), ""]
    out += _table(["package", "pin", "from", "verdict"], [(r["package"], r["pin"], r["origin"], r["verdict"]) for r in stack["inventory"]]) \
        if stack["inventory"] else ["(no pins)"]
    return "\n".join(out) + "\n"
