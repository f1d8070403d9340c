"""The systemd_unit_overrides module's main() on a folder tree standing in for the unit search
path, with `systemctl show` mocked: what it finds, removes, keeps, and leaves alone in check mode."""

import json
from pathlib import Path

import pytest
from ansible.module_utils import basic
from ansible.module_utils.testing import patch_module_args


@pytest.fixture(scope="module")
def overrides_utils(project_module):
    # The module imports it as ansible.module_utils.systemd_overrides (ansible.cfg's module_utils path).
    return project_module("module_utils/systemd_overrides.py", as_name="ansible.module_utils.systemd_overrides")


@pytest.fixture(scope="module")
def module_under_test(project_module, overrides_utils):  # pylint: disable=unused-argument  # registered first
    return project_module("library/systemd_unit_overrides.py")


@pytest.fixture(name="root")
def fixture_root(tmp_path, monkeypatch, overrides_utils):
    """etc/ and run/ and usr/ folders of a fake search path under tmp_path; the search path is
    rewritten onto them so that the module's removal rule (/etc, /run) still applies by prefix."""
    folders = {"/etc/systemd/system": tmp_path / "etc", "/run/systemd/system.control": tmp_path / "run-control",
               "/usr/lib/systemd/system": tmp_path / "usr"}
    for folder in folders.values():
        folder.mkdir()
    monkeypatch.setattr(overrides_utils, "SEARCH_PATH", tuple(str(f) for f in folders.values()))
    monkeypatch.setattr(overrides_utils, "_REMOVABLE_ROOTS", (str(tmp_path / "etc"), str(tmp_path / "run-control")))
    return folders


@pytest.fixture(name="run")
def fixture_run(monkeypatch, capsys, module_under_test):
    """Run the module's main() with `systemctl show` answering `loaded` as the unit's drop-ins."""
    def run(args, loaded=""):
        return _run(monkeypatch, capsys, module_under_test, args, loaded)
    return run


def _run(monkeypatch, capsys, module_under_test, args, loaded):
    calls = []

    def run_command(module, argv, **kwargs):
        calls.append(argv)
        return 0, f"DropInPaths={loaded}\n", ""

    monkeypatch.setattr(basic.AnsibleModule, "run_command", run_command)
    with patch_module_args(args), pytest.raises(SystemExit) as exited:
        module_under_test.main()
    result = json.loads(capsys.readouterr().out)
    assert calls == [["systemctl", "show", args["unit"], "--property=DropInPaths"]]
    return exited.value.code, result


def _write(path, text="[Service]\nUser=root\n"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return str(path)


def test_nothing_but_the_managed_unit_is_no_change(root, run):
    fragment = _write(root["/etc/systemd/system"] / "sglang.service")
    code, result = run({"unit": "sglang.service", "fragment": fragment})
    assert code == 0 and result["changed"] is False and result["overrides"] == []


def test_foreign_dropins_are_removed_with_their_emptied_folder(root, run):
    fragment = _write(root["/etc/systemd/system"] / "sglang.service")
    handmade = _write(root["/etc/systemd/system"] / "sglang.service.d" / "zz.conf")
    set_property = _write(root["/run/systemd/system.control"] / "sglang.service.d" / "50-CPUWeight.conf")
    _write(root["/etc/systemd/system"] / "sglang.service.d" / "notes.txt", "not a drop-in")

    code, result = run({"unit": "sglang.service", "fragment": fragment}, loaded=handmade)

    assert code == 0 and result["changed"] is True
    assert result["overrides"] == result["removed"] == result["drifted"] == sorted([handmade, set_property])
    assert not Path(handmade).exists() and not Path(set_property).exists()
    assert not Path(set_property).parent.exists()  # emptied
    assert Path(handmade).parent.exists()  # still holds notes.txt


def test_check_mode_reports_and_removes_nothing(root, run):
    fragment = _write(root["/etc/systemd/system"] / "sglang.service")
    handmade = _write(root["/etc/systemd/system"] / "sglang.service.d" / "zz.conf")
    code, result = run({"unit": "sglang.service", "fragment": fragment, "_ansible_check_mode": True})
    assert code == 0 and result["changed"] is True and result["overrides"] == [handmade]
    assert Path(handmade).exists()


def test_a_dropin_shared_with_other_units_or_a_packages_is_named_not_removed(root, run):
    fragment = _write(root["/etc/systemd/system"] / "sglang.service")
    shared = _write(root["/etc/systemd/system"] / "service.d" / "10-all.conf")
    vendor = _write(root["/usr/lib/systemd/system"] / "sglang.service.d" / "vendor.conf")

    code, result = run({"unit": "sglang.service", "fragment": fragment})

    assert code == 1 and result["failed"] is True
    assert shared in result["msg"] and vendor in result["msg"] and "does not remove them" in result["msg"]
    assert Path(shared).exists() and Path(vendor).exists()


def test_allowed_dropins_stay(root, run):
    fragment = _write(root["/etc/systemd/system"] / "sglang.service")
    ours = _write(root["/etc/systemd/system"] / "sglang.service.d" / "10-ours.conf")
    code, result = run({"unit": "sglang.service", "fragment": fragment, "allowed": [ours]},
                       loaded=ours)
    assert code == 0 and result["changed"] is False and Path(ours).exists()
