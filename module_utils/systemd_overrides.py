"""Where systemd looks for a unit's overrides, and which of them belong to someone else.

Pure logic for library/systemd_unit_overrides.py (unit-tested in
tests/unit/test_systemd_overrides.py). A service's settings are its unit file plus every
drop-in systemd merges into it: NAME.d/*.conf in each folder of the unit search path (the
ones `systemctl edit` and `systemctl set-property` write included), PREFIX-.service.d for
units whose name has dashes, and the type-wide service.d. A unit file of the same name in a
folder searched earlier than the managed one replaces it altogether.
"""

# systemd's system unit search path, highest priority first (systemd.unit(5), systemd 252).
SEARCH_PATH = (
    "/etc/systemd/system.control",
    "/run/systemd/system.control",
    "/run/systemd/transient",
    "/run/systemd/generator.early",
    "/etc/systemd/system",
    "/etc/systemd/system.attached",
    "/run/systemd/system",
    "/run/systemd/system.attached",
    "/run/systemd/generator",
    "/usr/local/lib/systemd/system",
    "/usr/lib/systemd/system",
    "/lib/systemd/system",
    "/run/systemd/generator.late",
)

# Folders an administrator or a runtime tool writes; what lies elsewhere belongs to packages.
_REMOVABLE_ROOTS = ("/etc/", "/run/")


def dropin_dir_names(unit):
    """Names of the .d folders whose *.conf files systemd merges into unit, most specific first:
    sglang-gateway.service -> [sglang-gateway.service.d, sglang-.service.d, service.d]."""
    stem, _, suffix = unit.rpartition(".")
    names = [f"{unit}.d"]
    parts = stem.split("-")
    for cut in range(len(parts) - 1, 0, -1):
        names.append("-".join(parts[:cut]) + f"-.{suffix}.d")
    names.append(f"{suffix}.d")
    return names


def candidate_paths(unit, search_path=SEARCH_PATH):
    """(unit file paths, drop-in folder paths) where an override of unit could lie."""
    unit_files = [f"{folder}/{unit}" for folder in search_path]
    dropin_dirs = [f"{folder}/{name}" for folder in search_path for name in dropin_dir_names(unit)]
    return unit_files, dropin_dirs


def parse_show(text):
    """KEY=VALUE lines of `systemctl show` -> dict (values may contain '=')."""
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def foreign_overrides(unit, fragment, found_files, loaded_dropins, allowed=()):
    """What overrides the managed unit file `fragment` without being it or an allowed drop-in.

    found_files: unit files and *.conf files that exist in the candidate paths;
    loaded_dropins: the DropInPaths systemd reports (loaded before a daemon-reload, or not).
    Returns (foreign, removable): every foreign path, sorted, and those that are this unit's
    own (a unit file of its name or a file in its own NAME.d folder) under /etc or /run, which
    can be removed without touching other units or a package's files.
    """
    own_dir_suffix = f"/{unit}.d/"
    foreign = sorted({p for p in (*found_files, *loaded_dropins) if p and p != fragment and p not in allowed})
    removable = [
        p for p in foreign
        if p.startswith(_REMOVABLE_ROOTS) and (own_dir_suffix in p or p.rsplit("/", 1)[-1] == unit)
    ]
    return foreign, removable
