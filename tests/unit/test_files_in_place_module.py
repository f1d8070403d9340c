"""The sglang_files_in_place module: what differs between a path and the state a play writes."""

import hashlib
import os

import pytest
import yaml
from project_modules import REPO


@pytest.fixture(scope="module")
def files(project_module):
    return project_module("library/sglang_files_in_place.py")


def sha1(data):
    return hashlib.sha1(data).hexdigest()


def me():
    """Names of this process's user and group, as the module's lookups give them."""
    return {"owner": str(os.getuid()), "group": str(os.getgid())}


def test_a_file_as_wanted_differs_in_nothing(files, tmp_path):
    path = tmp_path / "unit"
    path.write_bytes(b"[Unit]\n")
    path.chmod(0o644)
    entry = {"path": str(path), "checksum": sha1(b"[Unit]\n"), "mode": "0644", **me()}
    assert files.compare(entry) == []


def test_a_folder_as_wanted_differs_in_nothing(files, tmp_path):
    tmp_path.chmod(0o755)
    assert files.compare({"path": str(tmp_path), "state": "directory", "mode": "0755", **me()}) == []


def test_content_owner_group_and_mode_are_each_named(files, tmp_path):
    path = tmp_path / "probe"
    path.write_bytes(b"#!/bin/sh\nexit 0\n")
    path.chmod(0o700)
    entry = {"path": str(path), "checksum": sha1(b"#!/bin/sh\n"), "owner": "root", "group": "root", "mode": "0755"}

    reasons = files.compare(entry, user_name=lambda uid: "sglang", group_name=lambda gid: "sglang")

    assert reasons == ["content", "owner", "group", "mode"]


def test_an_absent_path_and_a_link_in_place_of_a_file_are_named(files, tmp_path):
    (tmp_path / "target").write_bytes(b"x")
    (tmp_path / "link").symlink_to(tmp_path / "target")
    wanted = {"checksum": sha1(b"x"), "mode": "0644"}
    assert files.compare({"path": str(tmp_path / "absent"), **wanted}) == ["absent"]
    # a masked unit is a link to /dev/null: never "in place", whatever it points at
    assert files.compare({"path": str(tmp_path / "link"), **wanted}) == ["type"]
    assert files.compare({"path": str(tmp_path / "target"), "state": "directory"}) == ["type"]


def test_numeric_ids_and_ids_without_a_name_compare_as_numbers(files, tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"")

    def nameless(number):
        raise KeyError(number)

    entry = {"path": str(path), "checksum": sha1(b""), "owner": str(os.getuid()), "group": "root"}
    assert files.compare(entry, user_name=nameless, group_name=nameless) == ["group"]


def test_an_uppercase_checksum_matches(files, tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"data")
    assert files.compare({"path": str(path), "checksum": sha1(b"data").upper()}) == []


@pytest.mark.parametrize(("entry", "message"), [
    ({"path": "/etc/x"}, "/etc/x: a checksum is required for a file"),
    ({"path": "/etc/x", "checksum": "00", "mode": "u=rw"}, "/etc/x: mode 'u=rw' is not an octal string such as '0644'"),
])
def test_an_entry_it_cannot_compare_is_refused_naming_the_path(files, entry, message):
    with pytest.raises(files.BadEntry, match="^" + message.replace("(", r"\(") + "$"):
        files.compare(entry)


# Each role that compares its files with sglang_files_in_place declares them once (vars/main.yml),
# and its write.yml writes exactly that declaration: one task per kind, looping over its entries.
DECLARING_ROLES = {"sglang_service": "__sglang_service_files", "sglang_watchdog": "__sglang_watchdog_files"}
WRITING_MODULES = {"ansible.builtin.file": "state", "ansible.builtin.copy": "src", "ansible.builtin.template": "template"}


@pytest.fixture(scope="module")
def wanted(project_module):
    return project_module("filter_plugins/files_wanted.py").sglang_files_wanted


def _declared_entries(role):
    """Every entry of the role's declaration: the plain lists of vars/main.yml it is built from."""
    variables = yaml.safe_load((REPO / "roles" / role / "vars" / "main.yml").read_text())
    name = DECLARING_ROLES[role]
    # a plain list, or an expression joining the role's lists of that name's stem
    parts = [name] if isinstance(variables[name], list) else sorted(
        part for part in variables if part.startswith(name.removesuffix("files")) and part.endswith("_files")
        and part != name and part in variables[name])
    entries = [entry for part in parts for entry in variables[part] if isinstance(entry, dict)]
    assert entries, f"{role}: no declared entries found in {parts}"
    return entries


def _writing_tasks(role):
    tasks = yaml.safe_load((REPO / "roles" / role / "tasks" / "write.yml").read_text())
    return [(task, module) for task in tasks for module in WRITING_MODULES if module in task]


def test_the_filter_gives_each_declared_file_its_checksum_in_order(wanted):
    declared = [
        {"path": "/etc/x", "state": "directory", "mode": "0755"},
        {"path": "/usr/bin/p", "src": "p", "mode": "0755"},
        {"path": "/etc/x/u.service", "template": "u.service.j2", "mode": "0644", "validate": "v %s"},
        {"path": "/etc/x/s.env", "template": "s.env.j2", "mode": "0600", "secret": True},
    ]
    assert wanted(declared, ["program\n"], ["[Unit]\n", "A=1\n"]) == [
        {"path": "/etc/x", "state": "directory", "mode": "0755"},
        {"path": "/usr/bin/p", "mode": "0755", "checksum": sha1(b"program\n")},
        {"path": "/etc/x/u.service", "mode": "0644", "checksum": sha1(b"[Unit]\n")},
        {"path": "/etc/x/s.env", "mode": "0600", "checksum": sha1(b"A=1\n")},
    ]


@pytest.mark.parametrize(("declared", "copied", "rendered", "message"), [
    ([{"path": "/a", "mode": "0644"}], [], [], "/a: expected exactly one of state: directory, src or template"),
    ([{"path": "/a", "src": "a", "template": "a.j2", "mode": "0644"}], ["x"], ["x"], "/a: expected exactly one of"),
    ([{"path": "/a", "state": "file", "mode": "0644"}], [], [], "/a: expected exactly one of"),
    ([{"path": "/a", "src": "a", "mode": "0644"}], [], [], "/a: no content given for its src"),
    ([{"path": "/a", "src": "a", "mode": "0644"}], ["x", "y"], [], "more contents given than entries declare"),
])
def test_the_filter_refuses_a_declaration_it_cannot_pair_with_contents(wanted, declared, copied, rendered, message):
    with pytest.raises(Exception, match="^" + message):
        wanted(declared, copied, rendered)


# The loops a writing task may have: every entry of one kind, or those of one kind split into the
# entries without and those with `secret` (a task of its own with no_log: no_log on one item of a
# loop censors the whole loop's result, the other files' diffs and drift report with it).
def _loop_selection(declaration, loop):
    """(kind, secret) the loop selects: secret None for all of the kind, else whether the secret ones."""
    for kind in WRITING_MODULES.values():
        if loop == f"{{{{ {declaration} | selectattr('{kind}', 'defined') }}}}":
            return kind, None
        if loop == f"{{{{ {declaration} | selectattr('{kind}', 'defined') | rejectattr('secret', 'defined') }}}}":
            return kind, False
    if loop == f"{{{{ {declaration} | selectattr('secret', 'defined') }}}}":
        return "template", True
    raise AssertionError(f"a loop over something else than one kind of {declaration}: {loop}")


@pytest.mark.parametrize("role", sorted(DECLARING_ROLES))
def test_write_yml_writes_the_declaration_and_nothing_else(role):
    """A file written by write.yml but not declared (or declared but not written) cannot be added:
    every writing task loops over one kind of the declaration (its secret entries apart, under
    no_log) and writes item.path, and every declared entry is written by exactly one task."""
    declaration = DECLARING_ROLES[role]
    selections = []
    for task, module in _writing_tasks(role):
        args = task[module]
        if args.get("state") == "absent":
            continue  # a removal (the watchdog's credential off gateways), not a file written
        kind, secret = _loop_selection(declaration, task.get("loop"))
        assert kind == WRITING_MODULES[module], task["name"]
        assert args.get("dest", args.get("path")) == "{{ item.path }}", task["name"]
        assert args["mode"] == "{{ item.mode }}", task["name"]
        # only the secrets' task hides its result, and it hides it whole
        assert task.get("no_log", False) is (secret is True), task["name"]
        selections.append((kind, secret))
    role_dir = REPO / "roles" / role
    for entry in _declared_entries(role):
        kinds = [kind for kind in WRITING_MODULES.values() if kind in entry]
        assert len(kinds) == 1, f"{role}: {entry} is not of exactly one kind"
        writers = [(kind, secret) for kind, secret in selections
                   if kind == kinds[0] and secret in (None, "secret" in entry)]
        assert len(writers) == 1, f"{role}: {entry} is written by {len(writers)} tasks of write.yml, not one"
        if "src" in entry:
            assert (role_dir / "files" / entry["src"]).is_file(), entry
        if "template" in entry:
            assert (role_dir / "templates" / entry["template"]).is_file(), entry


@pytest.mark.parametrize("role", sorted(DECLARING_ROLES))
def test_the_comparison_reads_the_same_declaration(role):
    variables = yaml.safe_load((REPO / "roles" / role / "vars" / "main.yml").read_text())
    declaration = DECLARING_ROLES[role]
    compared = declaration.removesuffix("files") + "wanted"
    assert variables[compared].strip().startswith(f"{{{{ {declaration} | sglang_files_wanted("), variables[compared]
    tasks = [task for path in (REPO / "roles" / role / "tasks").glob("*.yml")
             for task in yaml.safe_load(path.read_text()) or [] if "sglang_files_in_place" in task]
    assert [task["sglang_files_in_place"]["files"] for task in tasks] == [f"{{{{ {compared} }}}}"]
