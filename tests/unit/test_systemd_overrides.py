"""Where a systemd unit's overrides can lie, and which ones sglang-canon may remove."""

import pytest


@pytest.fixture(scope="module")
def systemd_overrides(project_module):
    # the name library/systemd_unit_overrides.py imports it by, as test_systemd_unit_overrides_module.py loads it
    return project_module("module_utils/systemd_overrides.py", as_name="ansible.module_utils.systemd_overrides")

FRAGMENT = "/etc/systemd/system/sglang.service"
# `systemctl show sglang.service --property=DropInPaths` on a test node after
# `systemctl set-property --runtime sglang.service CPUWeight=50` and a hand-written zz.conf
SHOWN = (
    "DropInPaths=/etc/systemd/system/sglang.service.d/zz.conf "
    "/run/systemd/system.control/sglang.service.d/50-CPUWeight.conf\n"
)


def test_dropin_folders_of_a_plain_and_a_dashed_name(systemd_overrides):
    assert systemd_overrides.dropin_dir_names("sglang.service") == ["sglang.service.d", "service.d"]
    assert systemd_overrides.dropin_dir_names("sglang-gateway-tls.service") == [
        "sglang-gateway-tls.service.d", "sglang-gateway-.service.d", "sglang-.service.d", "service.d",
    ]


def test_candidates_cover_the_control_runtime_and_vendor_folders(systemd_overrides):
    unit_files, dropin_dirs = systemd_overrides.candidate_paths("sglang.service")
    assert "/run/systemd/system/sglang.service" in unit_files
    for folder in ("/etc/systemd/system/sglang.service.d", "/run/systemd/system/sglang.service.d",
                   "/etc/systemd/system.control/sglang.service.d", "/run/systemd/system.control/sglang.service.d",
                   "/run/systemd/transient/sglang.service.d", "/usr/lib/systemd/system/sglang.service.d",
                   "/etc/systemd/system/service.d"):
        assert folder in dropin_dirs


def test_loaded_dropins_are_parsed_from_systemctl_show(systemd_overrides):
    shown = systemd_overrides.parse_show(SHOWN + "FragmentPath=/etc/systemd/system/sglang.service\n")
    assert shown["DropInPaths"].split() == [
        "/etc/systemd/system/sglang.service.d/zz.conf", "/run/systemd/system.control/sglang.service.d/50-CPUWeight.conf",
    ]
    assert systemd_overrides.parse_show("DropInPaths=\n")["DropInPaths"] == ""


def test_the_managed_unit_alone_is_not_an_override(systemd_overrides):
    assert systemd_overrides.foreign_overrides("sglang.service", FRAGMENT, [FRAGMENT], []) == ([], [])


def test_foreign_dropins_on_disk_or_loaded_are_found_and_this_units_own_are_removable(systemd_overrides):
    on_disk = [FRAGMENT, "/etc/systemd/system/sglang.service.d/zz.conf", "/run/systemd/system/sglang.service"]
    loaded = systemd_overrides.parse_show(SHOWN)["DropInPaths"].split()
    foreign, removable = systemd_overrides.foreign_overrides("sglang.service", FRAGMENT, on_disk, loaded)
    assert foreign == [
        "/etc/systemd/system/sglang.service.d/zz.conf",
        "/run/systemd/system.control/sglang.service.d/50-CPUWeight.conf",
        "/run/systemd/system/sglang.service",
    ]
    assert removable == foreign


def test_shared_and_package_dropins_are_foreign_but_not_removed(systemd_overrides):
    found = ["/etc/systemd/system/service.d/10-all.conf", "/usr/lib/systemd/system/sglang.service.d/vendor.conf",
             "/etc/systemd/system/sglang-.service.d/prefix.conf"]
    foreign, removable = systemd_overrides.foreign_overrides("sglang-gateway.service", "/etc/x", found, [])
    assert foreign == sorted(found)
    assert removable == []


def test_allowed_dropins_are_not_foreign(systemd_overrides):
    ours = "/etc/systemd/system/sglang.service.d/10-sglang-canon.conf"
    assert systemd_overrides.foreign_overrides("sglang.service", FRAGMENT, [FRAGMENT, ours], [ours], [ours]) == ([], [])
