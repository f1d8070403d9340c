"""The hardening drop-ins of roles/sglang_monitoring on Debian's own units, rated by systemd itself.

Each unit file comes from its Debian package (the .deb in .cache/debs that the test nodes install,
filled by scripts/fetch-monitoring-debs), the drop-in is the role's template rendered with its
vars, both placed in a root folder as on the host (/lib/systemd/system/UNIT.service and
/etc/systemd/system/UNIT.service.d/sglang-canon-hardening.conf), and `systemd-analyze security
--offline=true --root=...` rates the merged unit. Debian's units alone score 9.2 (UNSAFE) for the
node exporter and Alertmanager. tests/integration/test_monitoring.py rates them again on the fleet,
running.
"""

import shutil
import subprocess

import jinja2
import pytest
import yaml
from project_modules import REPO

ROLE = REPO / "roles" / "sglang_monitoring"
DEBS = REPO / ".cache" / "debs"
VARS = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())
UNITS = sorted(VARS["__sglang_monitoring_hardening"])
# What the fleet test asserts too; the project's sglang.service rates 1.6.
EXPOSURE_BOUND = 2.0


def _deb(unit):
    (deb,) = sorted((DEBS / unit).glob(f"{unit}_*.deb"))
    return deb


def _render_dropin(unit):
    env = jinja2.Environment(trim_blocks=True, undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    template = env.from_string((ROLE / "templates" / "hardening.conf.j2").read_text())
    return template.render(ansible_managed="Ansible managed", __sglang_monitoring_hardened_unit=unit,
                           __sglang_monitoring_hardening=VARS["__sglang_monitoring_hardening"])


def _root(tmp_path, unit, dropin):
    """A root folder with Debian's unit of the package and, if dropin, the role's drop-in."""
    extracted = tmp_path / "deb"
    extracted.mkdir(parents=True)
    subprocess.run(["dpkg-deb", "-x", str(_deb(unit)), str(extracted)], check=True)
    root = tmp_path / "root"
    (root / "lib/systemd/system").mkdir(parents=True)
    shutil.copy(extracted / f"lib/systemd/system/{unit}.service", root / "lib/systemd/system")
    if dropin:
        folder = root / f"etc/systemd/system/{unit}.service.d"
        folder.mkdir(parents=True)
        (folder / VARS["__sglang_monitoring_hardening_dropin"]).write_text(_render_dropin(unit))
    return root


def _exposure(root, unit):
    done = subprocess.run(["systemd-analyze", "security", "--no-pager", "--offline=true", f"--root={root}",
                           f"{unit}.service"], capture_output=True, text=True, timeout=60)
    line = [text for text in done.stdout.splitlines() if "Overall exposure level" in text]
    assert line, done.stdout + done.stderr
    return float(line[0].split(":")[1].split()[0])


@pytest.fixture(scope="module", autouse=True)
def tools():
    for tool in ("systemd-analyze", "dpkg-deb"):
        assert shutil.which(tool), f"{tool} is missing (Debian's systemd and dpkg)"
    for unit in UNITS:
        assert list((DEBS / unit).glob("*.deb")), f"{DEBS / unit} has no .deb: run scripts/fetch-monitoring-debs"


@pytest.mark.parametrize("unit", UNITS)
def test_the_drop_in_brings_debians_unit_to_the_level_of_the_projects_own(tmp_path, unit):
    bare = _exposure(_root(tmp_path / "bare", unit, dropin=False), unit)
    hardened = _exposure(_root(tmp_path / "hardened", unit, dropin=True), unit)
    print(f"{unit}: {bare} -> {hardened}")
    assert hardened <= EXPOSURE_BOUND < bare


@pytest.mark.parametrize("unit", UNITS)
def test_every_writable_path_is_a_folder_the_package_ships(unit):
    # systemd refuses to start a unit whose ReadWritePaths= is missing (226/NAMESPACE): the
    # drop-in is written before the package is installed, so its first start needs them there.
    listing = subprocess.run(["dpkg-deb", "-c", str(_deb(unit))], capture_output=True, text=True, check=True).stdout
    folders = {line.split()[-1].removeprefix(".").rstrip("/") for line in listing.splitlines() if line.startswith("d")}
    for path in VARS["__sglang_monitoring_hardening"][unit]["read_write_paths"]:
        assert path in folders, f"{unit}: {path} is not shipped by {_deb(unit).name}"


def test_the_drop_in_passes_systemds_own_parser(tmp_path):
    # Every directive of the drop-in is one systemd 252 (Debian 12) knows: an unknown one would be
    # ignored with a warning only, and the unit would run less confined than it says.
    for unit in UNITS:
        root = _root(tmp_path / unit, unit, dropin=True)
        done = subprocess.run(["systemd-analyze", "verify", f"--root={root}", f"{unit}.service"],
                              capture_output=True, text=True, timeout=60)
        unknown = [line for line in done.stderr.splitlines() if "Unknown key" in line or "ignoring" in line.lower()]
        assert unknown == [], done.stderr
