"""The python_package_patch module and its pure logic (module_utils/unified_diff.py, package_patch.py).

Every test builds a small synthetic package in a temporary site-packages directory, with a
dist-info whose RECORD holds the real sha256 of each file, and finds it through a real
interpreter (this one, with PYTHONPATH pointing at the fake site-packages) exactly as the
module does on a node.
"""

import base64
import difflib
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import zipfile
from contextlib import redirect_stdout
from pathlib import Path

import pytest


# The module imports its helpers as ansible.module_utils.NAME, as Ansible ships them.
import ansible.module_utils  # noqa: E402
from project_modules import REPO

if str(REPO / "module_utils") not in ansible.module_utils.__path__:
    ansible.module_utils.__path__.append(str(REPO / "module_utils"))

from ansible.module_utils import package_patch as pp  # noqa: E402
from ansible.module_utils import unified_diff as ud  # noqa: E402
from ansible.module_utils.testing import patch_module_args  # noqa: E402

sys.path.insert(0, str(REPO / "library"))
import python_package_patch as module  # noqa: E402

PKG = "fakepkg"
VERSION = "1.0"

CORE = "".join(f"# line {n}\n" for n in range(1, 31))
UTIL = 'def answer():\n    return 41\n\n\ndef name():\n    return "util"\n'
INIT = '"""fake package"""\n'


def sha(data):
    return hashlib.sha256(data).hexdigest()


def record_hash(data):
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def make_patch(path, old, new, header="What: a test change.\nWhy: to test.\n\n"):
    diff = difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True), f"a/{path}", f"b/{path}")
    return header + "".join(diff)


class Site:
    """A fake site-packages holding fakepkg 1.0, installed 'from a wheel'."""

    def __init__(self, root, version=VERSION):
        self.root = root
        self.base = root / "site-packages"
        self.state = root / "state"
        self.manifest = str(self.state / "fakepkg.manifest.json")
        self.version = version
        self.pristine = {
            "fakepkg/__init__.py": INIT.encode(),
            "fakepkg/core.py": CORE.encode(),
            "fakepkg/util.py": UTIL.encode(),
        }
        self.install()

    def install(self):
        """(Re)install: pristine files and a RECORD with their hashes."""
        dist = self.base / f"{PKG}-{self.version}.dist-info"
        dist.mkdir(parents=True, exist_ok=True)
        (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {PKG}\nVersion: {self.version}\n")
        lines = []
        for rel, data in self.pristine.items():
            path = self.base / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
            lines.append(f"{rel},{record_hash(data)},{len(data)}")
        lines.append(f"{PKG}-{self.version}.dist-info/METADATA,,")
        lines.append(f"{PKG}-{self.version}.dist-info/RECORD,,")
        (dist / "RECORD").write_text("\n".join(lines) + "\n")

    def read(self, rel):
        return (self.base / rel).read_bytes()

    def write(self, rel, data):
        (self.base / rel).write_bytes(data if isinstance(data, bytes) else data.encode())

    def snapshot(self):
        """Every file under the fake root (package and state), path -> bytes."""
        return {
            str(p.relative_to(self.root)): p.read_bytes()
            for p in sorted(self.root.rglob("*"))
            if p.is_file() and "__pycache__" not in p.parts and p.parts[len(self.root.parts)] != "bin"
        }

    def env(self):
        return dict(os.environ, PYTHONPATH=str(self.base))

    def probe(self, paths):
        out = subprocess.run(
            [sys.executable, "-c", module.node_program(), "probe", PKG, *paths],
            env=self.env(),
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        return pp.parse_probe_output(PKG, out)

    def plan(self, patches, state="present", version=VERSION, wheel=None):
        manifest = pp.load_manifest(self.manifest) or {}
        info = self.probe(ud.target_paths(patches) + sorted(manifest.get("files", {})))
        return pp.build_plan(info, PKG, version, patches, state, self.manifest, wheel_path=wheel)

    def run(self, patches, state="present", version=VERSION, check=False, wheel=None):
        plan = self.plan(patches, state=state, version=version, wheel=wheel)
        if not check:
            pp.execute(plan)
        return plan


@pytest.fixture
def site(tmp_path):
    return Site(tmp_path)


def core_patch(new_line="line 10 patched\n", name="0001-core.patch"):
    new = CORE.replace("line 10\n", new_line)
    return ud.parse_patch(name, make_patch("fakepkg/core.py", CORE, new))


def util_patch(name="0002-util.patch", value="42"):
    return ud.parse_patch(name, make_patch("fakepkg/util.py", UTIL, UTIL.replace("41", value)))


def actions(plan):
    return {f.path: f.action for f in plan.files}


# ----------------------------------------------------------------------------------------
# Parsing and the strict applier (unified_diff)
# ----------------------------------------------------------------------------------------


def test_header_paths_and_git_prefixes_are_parsed():
    text = make_patch(
        "fakepkg/core.py", CORE, CORE.replace("line 3\n", "line three\n"), header="Subject: x\n\nWhy: y\n"
    )
    patch = ud.parse_patch("p.patch", text)
    assert patch.header == "Subject: x\n\nWhy: y\n"
    assert patch.paths() == ["fakepkg/core.py"]
    assert patch.sha256 == sha(text.encode())
    git = "diff --git a/fakepkg/core.py b/fakepkg/core.py\nindex 1..2 100644\n" + text.split("\n", 3)[3]
    assert ud.parse_patch("g.patch", git).paths() == ["fakepkg/core.py"]


def test_plain_paths_without_prefix_are_relative_to_site_packages():
    text = "--- fakepkg/util.py\n+++ fakepkg/util.py\n@@ -1,2 +1,2 @@\n def answer():\n-    return 41\n+    return 42\n"
    patch = ud.parse_patch("p", text)
    assert ud.apply_patches(UTIL.encode(), "fakepkg/util.py", [patch]) == UTIL.replace("41", "42").encode()


@pytest.mark.parametrize(
    "path",
    ["/etc/passwd", "../outside.py", "fakepkg/../../x.py", "fakepkg//core.py"],
)
def test_paths_outside_site_packages_are_refused(path):
    text = f"--- {path}\n+++ {path}\n@@ -1 +1 @@\n-a\n+b\n"
    with pytest.raises(pp.PatchError, match="relative to site-packages"):
        ud.parse_patch("evil.patch", text)


@pytest.mark.parametrize(
    "text",
    [
        "--- /dev/null\n+++ b/fakepkg/new.py\n@@ -0,0 +1 @@\n+x\n",
        "diff --git a/x b/x\ndeleted file mode 100644\n--- a/x\n+++ /dev/null\n@@ -1 +0,0 @@\n-x\n",
        "no diff in here\n",
    ],
)
def test_new_deleted_files_and_non_diffs_are_refused(text):
    with pytest.raises(pp.PatchError):
        ud.parse_patch("p.patch", text)


def test_truncated_hunk_is_refused():
    text = "--- a/fakepkg/util.py\n+++ b/fakepkg/util.py\n@@ -1,3 +1,3 @@\n def answer():\n-    return 41\n"
    with pytest.raises(pp.PatchError, match="truncated"):
        ud.parse_patch("p.patch", text)


def test_context_must_match_exactly_no_fuzz():
    patch = core_patch()
    almost = CORE.replace("line 9\n", "line 9 \n").encode()  # one trailing space in the context
    with pytest.raises(pp.PatchConflict, match="hunk 1"):
        ud.apply_patches(almost, "fakepkg/core.py", [patch])


def test_hunk_applies_at_a_unique_offset_but_not_at_an_ambiguous_one():
    patch = core_patch()
    shifted = ("header\n" * 5 + CORE).encode()
    assert (
        ud.apply_patches(shifted, "fakepkg/core.py", [patch])
        == ("header\n" * 5 + CORE.replace("line 10\n", "line 10 patched\n")).encode()
    )
    block = "".join(f"# line {n}\n" for n in range(7, 14))
    twice = ("x\n" * 40 + block + "y\n" + block).encode()
    with pytest.raises(pp.PatchConflict, match="several places"):
        ud.apply_patches(twice, "fakepkg/core.py", [patch])


def test_reverse_application_gives_back_the_original():
    patches = [
        core_patch(),
        ud.parse_patch(
            "two",
            make_patch(
                "fakepkg/core.py",
                CORE.replace("line 10\n", "line 10 patched\n"),
                CORE.replace("line 10\n", "line 10 patched\n").replace("line 25\n", ""),
            ),
        ),
    ]
    patched = ud.apply_patches(CORE.encode(), "fakepkg/core.py", patches)
    assert b"line 25\n" not in patched and b"line 10 patched\n" in patched
    assert ud.apply_patches(patched, "fakepkg/core.py", patches, reverse=True) == CORE.encode()


def test_no_newline_at_end_of_file_is_honoured():
    text = "--- a/fakepkg/x.py\n+++ b/fakepkg/x.py\n@@ -1,2 +1,2 @@\n a\n-b\n\\ No newline at end of file\n+c\n\\ No newline at end of file\n"
    patch = ud.parse_patch("p", text)
    assert ud.apply_patches(b"a\nb", "fakepkg/x.py", [patch]) == b"a\nc"
    assert ud.apply_patches(b"a\nc", "fakepkg/x.py", [patch], reverse=True) == b"a\nb"
    with pytest.raises(pp.PatchConflict):
        ud.apply_patches(b"a\nb\n", "fakepkg/x.py", [patch])  # the file does end with a newline


def test_record_hash_conversion():
    assert pp.record_hash_to_hex(record_hash(b"abc")) == sha(b"abc")
    assert pp.record_hash_to_hex("md5=xyz") is None
    assert pp.record_hash_to_hex(None) is None


def test_probe_finds_version_site_packages_and_record_without_importing(site):
    (site.base / "fakepkg" / "__init__.py").write_text("raise SystemExit('imported!')\n")
    info = site.probe(["fakepkg/core.py", "fakepkg/nothere.py"])
    assert info.version == VERSION
    assert Path(info.base) == site.base
    assert info.record == {"fakepkg/core.py": sha(CORE.encode())}


def test_probe_reports_a_missing_package(site):
    out = subprocess.run(
        [sys.executable, "-c", module.node_program(), "probe", "nosuchpkg"], env=site.env(), capture_output=True, text=True, check=True
    ).stdout
    with pytest.raises(pp.PatchError, match="nosuchpkg is not installed"):
        pp.parse_probe_output("nosuchpkg", out)


# ----------------------------------------------------------------------------------------
# Planner and writer: the behaviours the role relies on
# ----------------------------------------------------------------------------------------


def test_fresh_apply_patches_files_and_writes_manifest_and_pristine_copies(site):
    patches = [core_patch(), util_patch()]
    plan = site.run(patches)
    assert actions(plan) == {"fakepkg/core.py": "apply", "fakepkg/util.py": "apply"}
    assert site.read("fakepkg/core.py") == CORE.replace("line 10\n", "line 10 patched\n").encode()
    assert site.read("fakepkg/util.py") == UTIL.replace("41", "42").encode()
    manifest = json.loads(Path(site.manifest).read_text())
    assert manifest["package"] == PKG and manifest["version"] == VERSION
    assert manifest["patches"] == [{"name": p.name, "sha256": p.sha256} for p in patches]
    assert manifest["files"]["fakepkg/core.py"]["sha256"] == sha(site.read("fakepkg/core.py"))
    assert manifest["files"]["fakepkg/util.py"]["pristine_sha256"] == sha(UTIL.encode())
    kept = Path(pp.default_pristine_dir(site.manifest))
    assert kept.name == "fakepkg.pristine"
    assert (kept / "fakepkg" / "util.py").read_bytes() == UTIL.encode()
    assert (site.base / "fakepkg" / "__init__.py").read_bytes() == INIT.encode()  # untouched


def test_second_run_changes_nothing(site):
    patches = [core_patch(), util_patch()]
    site.run(patches)
    before = site.snapshot()
    plan = site.run(patches)
    assert not plan.changed
    assert set(actions(plan).values()) == {"ok"}
    assert site.snapshot() == before


def test_file_patched_by_hand_with_the_same_patch_is_left_alone(site):
    """An applied patch is detected: same bytes as wanted, nothing to write."""
    site.write("fakepkg/util.py", UTIL.replace("41", "42"))
    plan = site.run([util_patch()])
    assert actions(plan) == {"fakepkg/util.py": "ok"}
    assert plan.files[0].pristine_source == "reverse-applied set"
    assert not plan.files_changed


def test_hand_edited_file_is_reported_as_drift_and_restored(site):
    patches = [core_patch(), util_patch()]
    site.run(patches)
    wanted = site.read("fakepkg/util.py")
    site.write("fakepkg/util.py", wanted + b"# hot fix by hand\n")
    plan = site.run(patches)
    assert [f.path for f in plan.files if f.drifted] == ["fakepkg/util.py"]
    assert actions(plan)["fakepkg/core.py"] == "ok"
    assert site.read("fakepkg/util.py") == wanted


def test_half_patched_file_is_repaired_not_stacked(site):
    both = CORE.replace("line 10\n", "line 10 patched\n").replace("line 20\n", "line 20 patched\n")
    patch = ud.parse_patch("two-hunks", make_patch("fakepkg/core.py", CORE, both))
    site.run([patch])
    site.write("fakepkg/core.py", CORE.replace("line 10\n", "line 10 patched\n"))  # hunk 2 undone by hand
    plan = site.run([patch])
    assert actions(plan) == {"fakepkg/core.py": "restore"}
    assert site.read("fakepkg/core.py") == both.encode()


def test_half_patched_file_of_an_unmanaged_node_fails_clearly_and_changes_nothing(site):
    """No kept copy, not pristine, not the set's result: the pristine bytes are unknown."""
    both = CORE.replace("line 10\n", "line 10 patched\n").replace("line 20\n", "line 20 patched\n")
    patch = ud.parse_patch("two-hunks", make_patch("fakepkg/core.py", CORE, both))
    site.write("fakepkg/core.py", CORE.replace("line 10\n", "line 10 patched\n"))  # only hunk 1
    before = site.snapshot()
    with pytest.raises(pp.PatchError, match="fakepkg/core.py: the file on disk is not the pristine"):
        site.run([patch])
    assert site.snapshot() == before


def test_missing_file_is_restored(site):
    site.run([util_patch()])
    (site.base / "fakepkg" / "util.py").unlink()
    plan = site.run([util_patch()])
    assert actions(plan) == {"fakepkg/util.py": "restore"}
    assert site.read("fakepkg/util.py") == UTIL.replace("41", "42").encode()


def test_updated_patch_reverts_the_old_result_and_applies_the_new_one(site):
    site.run([core_patch("line 10 version one\n")])
    plan = site.run([core_patch("line 10 version two\n")])
    assert actions(plan) == {"fakepkg/core.py": "update"}
    text = site.read("fakepkg/core.py").decode()
    assert "line 10 version two\n" in text
    assert "version one" not in text  # never stacked
    assert text == CORE.replace("line 10\n", "line 10 version two\n")
    manifest = json.loads(Path(site.manifest).read_text())
    assert manifest["files"]["fakepkg/core.py"]["sha256"] == sha(text.encode())


def test_patch_dropped_from_the_set_is_reverted(site):
    site.run([core_patch(), util_patch()])
    plan = site.run([core_patch()])
    assert actions(plan) == {"fakepkg/core.py": "ok", "fakepkg/util.py": "revert"}
    assert site.read("fakepkg/util.py") == UTIL.encode()
    assert "fakepkg/util.py" not in json.loads(Path(site.manifest).read_text())["files"]
    assert not (Path(pp.default_pristine_dir(site.manifest)) / "fakepkg" / "util.py").exists()


def test_reinstalled_pristine_files_are_patched_again(site):
    patches = [core_patch(), util_patch()]
    site.run(patches)
    patched = site.snapshot()
    site.install()  # pip install --force-reinstall: pristine files, same version
    assert site.read("fakepkg/core.py") == CORE.encode()
    plan = site.run(patches)
    assert actions(plan) == {"fakepkg/core.py": "apply", "fakepkg/util.py": "apply"}
    assert site.snapshot() == patched


def test_upgrade_then_downgrade_back_is_patched_again(site):
    patches = [util_patch()]
    site.run(patches)
    shutil.rmtree(site.base / f"{PKG}-{VERSION}.dist-info")
    site.version = "2.0"
    site.install()  # upgraded: pristine 2.0 files
    with pytest.raises(pp.PatchError, match="installed fakepkg is 2.0 but the patch set was made for fakepkg 1.0"):
        site.run(patches)
    shutil.rmtree(site.base / f"{PKG}-2.0.dist-info")
    site.version = VERSION
    site.install()  # downgraded back to 1.0: pristine again
    plan = site.run(patches)
    assert actions(plan) == {"fakepkg/util.py": "apply"}
    assert site.read("fakepkg/util.py") == UTIL.replace("41", "42").encode()


def test_version_mismatch_is_refused_before_any_change(site):
    before = site.snapshot()
    with pytest.raises(pp.PatchError) as err:
        site.run([core_patch()], version="0.9")
    assert "1.0" in str(err.value) and "0.9" in str(err.value)
    assert site.snapshot() == before
    assert not Path(site.manifest).exists()


def test_conflict_fails_and_leaves_every_file_as_it_was(site):
    good = util_patch()
    bad = ud.parse_patch(
        "0003-bad.patch", make_patch("fakepkg/core.py", CORE.replace("line 5\n", "line five\n"), "nothing\n")
    )
    before = site.snapshot()
    with pytest.raises(pp.PatchConflict) as err:
        site.run([good, bad])
    assert "0003-bad.patch" in str(err.value) and "fakepkg/core.py" in str(err.value)
    assert "nothing was changed" in str(err.value)
    assert site.snapshot() == before


def test_conflict_after_an_applied_set_leaves_the_patched_state(site):
    site.run([core_patch(), util_patch()])
    before = site.snapshot()
    bad = ud.parse_patch("0002-util.patch", make_patch("fakepkg/util.py", "something else\n", "x\n"))
    with pytest.raises(pp.PatchConflict):
        site.run([core_patch(), bad])
    assert site.snapshot() == before


def test_check_mode_changes_nothing_and_reports(site):
    site.run([util_patch()])
    site.write("fakepkg/util.py", "edited\n")
    before = site.snapshot()
    plan = site.run([core_patch(), util_patch()], check=True)
    assert plan.changed
    assert actions(plan) == {"fakepkg/core.py": "apply", "fakepkg/util.py": "restore"}
    diffs = [pp.file_diff(plan, f) for f in plan.files_changed]
    assert diffs[0]["before"] == CORE and "line 10 patched" in diffs[0]["after"]
    assert diffs[0]["before_header"].endswith("core.py (on disk)") and diffs[0]["after_header"].endswith("(patched)")
    assert site.snapshot() == before


def test_absent_restores_pristine_bytes_equal_to_record_and_removes_manifest(site):
    patches = [core_patch(), util_patch()]
    site.run(patches)
    plan = site.run([], state="absent")
    assert actions(plan) == {"fakepkg/core.py": "revert", "fakepkg/util.py": "revert"}
    record = (site.base / f"{PKG}-{VERSION}.dist-info" / "RECORD").read_text()
    for rel in ("fakepkg/core.py", "fakepkg/util.py"):
        assert f"{rel},{record_hash(site.read(rel))}," in record
    assert not Path(site.manifest).exists()
    assert not Path(pp.default_pristine_dir(site.manifest)).exists()
    assert not site.run([], state="absent").changed  # and again: nothing to do


def test_absent_without_kept_copies_uses_the_set_itself(site):
    patches = [core_patch(), util_patch()]
    site.run(patches)
    shutil.rmtree(pp.default_pristine_dir(site.manifest))
    site.run(patches, state="absent")
    assert site.read("fakepkg/core.py") == CORE.encode() and site.read("fakepkg/util.py") == UTIL.encode()


def test_absent_restores_a_hand_edited_file_too(site):
    site.run([util_patch()])
    site.write("fakepkg/util.py", "edited\n")
    plan = site.run([], state="absent")
    assert [f.path for f in plan.files if f.drifted] == ["fakepkg/util.py"]
    assert site.read("fakepkg/util.py") == UTIL.encode()


def test_unknown_file_state_without_pristine_source_is_refused_then_recovered_from_wheel(site, tmp_path):
    """A node patched by hand before the module managed it: refused, unless a pristine wheel is given."""
    site.write("fakepkg/util.py", "patched by hand long ago\n")
    before = site.snapshot()
    with pytest.raises(pp.PatchError, match="not the pristine fakepkg 1.0 file"):
        site.run([util_patch()])
    assert site.snapshot() == before
    wheel = tmp_path / "fakepkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for rel, data in site.pristine.items():
            zf.writestr(rel, data)
    plan = site.run([util_patch()], wheel=str(wheel))
    assert plan.files[0].pristine_source == "wheel" and plan.files[0].action == "restore"
    assert site.read("fakepkg/util.py") == UTIL.replace("41", "42").encode()


def test_corrupted_kept_copy_is_not_trusted(site):
    site.run([util_patch()])
    kept = Path(pp.default_pristine_dir(site.manifest)) / "fakepkg" / "util.py"
    kept.write_text("not pristine\n")
    site.write("fakepkg/util.py", "edited\n")
    with pytest.raises(pp.PatchError, match="no verified pristine copy"):
        site.run([util_patch()])


def test_file_not_in_record_is_refused(site):
    (site.base / "fakepkg" / "extra.py").write_text("x = 1\n")
    patch = ud.parse_patch("p", "--- a/fakepkg/extra.py\n+++ b/fakepkg/extra.py\n@@ -1 +1 @@\n-x = 1\n+x = 2\n")
    with pytest.raises(pp.PatchError, match="not in its RECORD"):
        site.run([patch])


def test_failed_write_puts_back_the_files_already_written(site, monkeypatch):
    before = site.snapshot()
    real = pp.atomic_write
    calls = []

    def flaky(path, data, mode=None, template=None):
        if str(path).startswith(str(site.base)):
            calls.append(path)
            if len(calls) == 2:
                raise OSError("disk full")
        return real(path, data, mode=mode, template=template)

    plan = site.plan([core_patch(), util_patch()])
    monkeypatch.setattr(pp, "atomic_write", flaky)
    with pytest.raises(OSError, match="disk full"):
        pp.execute(plan)
    monkeypatch.setattr(pp, "atomic_write", real)
    after = site.snapshot()
    for rel in ("fakepkg/core.py", "fakepkg/util.py"):
        key = f"site-packages/{rel}"
        assert after[key] == before[key]
    assert not Path(site.manifest).exists()


def test_atomic_write_keeps_mode(site):
    path = site.base / "fakepkg" / "util.py"
    os.chmod(path, 0o640)
    pp.atomic_write(str(path), b"x\n")
    assert path.read_bytes() == b"x\n" and (path.stat().st_mode & 0o777) == 0o640
    assert [p.name for p in path.parent.iterdir() if p.name.endswith(".tmp")] == []


# ----------------------------------------------------------------------------------------
# The Ansible module itself (argument handling, check/diff mode, byte-compiling)
# ----------------------------------------------------------------------------------------


def _python_wrapper(site):
    """An 'interpreter' that sees the fake site-packages, as a venv's python would."""
    wrapper = site.root / "bin" / "python"
    wrapper.parent.mkdir(exist_ok=True)
    wrapper.write_text(f'#!/bin/sh\nPYTHONPATH="{site.base}" exec "{sys.executable}" "$@"\n')
    wrapper.chmod(0o755)
    return str(wrapper)


def run_module(args, check=False, diff=False):
    args = dict(args, _ansible_check_mode=check, _ansible_diff=diff)
    out = io.StringIO()
    with patch_module_args(args), redirect_stdout(out), pytest.raises(SystemExit):
        module.main()
    return json.loads(out.getvalue())


def module_args(site, patches, **extra):
    return dict(
        python=_python_wrapper(site),
        package=PKG,
        version=VERSION,
        patches=patches,
        manifest=site.manifest,
        **extra,
    )


def test_module_check_diff_then_apply_then_idempotent(site, tmp_path):
    patch_file = tmp_path / "0001-core.patch"
    patch_file.write_bytes(core_patch().data)
    inline = {"name": "0002-util.patch", "content": util_patch().data.decode()}
    args = module_args(site, [str(patch_file), inline])
    before = site.snapshot()

    checked = run_module(args, check=True, diff=True)
    assert checked["changed"] and not checked.get("failed")
    assert checked["files_changed"] == ["fakepkg/core.py", "fakepkg/util.py"]
    assert [d["after_header"].rsplit("/", 1)[1] for d in checked["diff"]] == ["core.py (patched)", "util.py (patched)"]
    assert site.snapshot() == before

    applied = run_module(args)
    assert applied["changed"] and applied["drifted"] == []
    assert [p["name"] for p in applied["patches"]] == ["0001-core.patch", "0002-util.patch"]
    assert applied["patches"][0]["header"] == "What: a test change.\nWhy: to test."
    assert applied["installed_version"] == VERSION and Path(applied["site_packages"]) == site.base
    pycache = site.base / "fakepkg" / "__pycache__"
    assert (pycache / f"util.{sys.implementation.cache_tag}.pyc").exists()
    assert applied["byte_compiled"] == [str(site.base / "fakepkg" / "core.py"), str(site.base / "fakepkg" / "util.py")]

    again = run_module(args)
    assert not again["changed"] and again["files_changed"] == []


def test_module_keeps_each_patch_text_in_its_set_folder_and_absent_removes_the_set(site, tmp_path):
    copies = tmp_path / "patches"
    inline = [{"name": "fakepkg-1.0/0002-util.patch", "content": util_patch().data.decode()}]
    kept = copies / "fakepkg-1.0" / "0002-util.patch"

    checked = run_module(module_args(site, inline, keep_copies=str(copies)), check=True)
    assert checked["copies_changed"] == [str(copies), str(copies / "fakepkg-1.0"), str(kept)]
    assert not copies.exists()

    applied = run_module(module_args(site, inline, keep_copies=str(copies)))
    assert applied["changed"] and kept.read_bytes() == util_patch().data
    kept.write_text("edited by hand\n")
    repaired = run_module(module_args(site, inline, keep_copies=str(copies)))
    # the package files were right: a changed copy alone is a change, and no restart (files_changed)
    assert repaired["changed"] and repaired["copies_changed"] == [str(kept)] and repaired["files_changed"] == []
    assert kept.read_bytes() == util_patch().data
    assert not run_module(module_args(site, inline, keep_copies=str(copies)))["changed"]

    removed = run_module(module_args(site, inline, state="absent", keep_copies=str(copies)))
    assert removed["copies_changed"] == [str(copies / "fakepkg-1.0")] and not (copies / "fakepkg-1.0").exists()


def test_module_refuses_wrong_version_naming_both(site):
    before = site.snapshot()
    result = run_module(dict(module_args(site, [{"name": "p", "content": util_patch().data.decode()}]), version="2.0"))
    assert result["failed"]
    assert "fakepkg is 1.0" in result["msg"] and "fakepkg 2.0" in result["msg"]
    assert site.snapshot() == before


def test_module_refuses_a_patch_that_breaks_the_syntax(site):
    broken = make_patch("fakepkg/util.py", UTIL, UTIL.replace("return 41", "return (41"))
    before = site.snapshot()
    result = run_module(module_args(site, [{"name": "broken.patch", "content": broken}]))
    assert result["failed"] and "do not compile" in result["msg"] and "fakepkg/util.py" in result["msg"]
    assert site.snapshot() == before


def test_module_absent_restores_and_drops_manifest(site):
    inline = [{"name": "0002-util.patch", "content": util_patch().data.decode()}]
    run_module(module_args(site, inline))
    result = run_module(module_args(site, [], state="absent"))
    assert result["changed"] and result["files_changed"] == ["fakepkg/util.py"]
    assert site.read("fakepkg/util.py") == UTIL.encode()
    assert not Path(site.manifest).exists()


def test_module_present_needs_patches_and_unique_names(site):
    assert "at least one patch" in run_module(module_args(site, []))["msg"]
    same = {"name": "same", "content": util_patch().data.decode()}
    assert "unique" in run_module(module_args(site, [same, same]))["msg"]


def test_node_program_is_shipped_from_module_utils():
    # What runs on the node under the package's Python is the real file, not a copy in a string.
    source = module.node_program()
    assert source == (REPO / "module_utils" / "package_patch_node.py").read_text()
    done = subprocess.run([sys.executable, "-c", source, "no-such-command"], capture_output=True, text=True, check=False)
    assert done.returncode == 2 and "probe, compile-check, byte-compile" in done.stderr
