"""The server double remembers a configuration SGLang's parser accepted, and only that one
(tests/double/sglang_server_double.py): the same argv, environment and package files skip the
parser; anything else, or a refusal, runs it again."""

import pytest


@pytest.fixture()
def double(project_module, tmp_path, monkeypatch):
    module = project_module("tests/double/sglang_server_double.py")
    package = tmp_path / "site-packages" / "sglang"
    (package / "srt").mkdir(parents=True)
    (package / "srt" / "server_args.py").write_text("# the parser\n")
    monkeypatch.setattr(module, "sglang_package_folder", lambda: str(package))
    monkeypatch.setenv("STATE_DIRECTORY", str(tmp_path / "state"))
    monkeypatch.setattr(module, "spec_v2_enabled", lambda fields: True)
    module.parsed = []

    class Resolved:  # what dataclasses.asdict reads of SGLang's ServerArgs
        __dataclass_fields__ = {}

    def resolve(argv):
        module.parsed.append(list(argv))
        if "--refused" in argv:
            raise SystemExit(2)
        return Resolved()

    monkeypatch.setattr(module, "resolve_server_args", resolve)
    monkeypatch.setattr(module.dataclasses, "asdict", lambda _: {"host": "127.0.0.1", "port": 30000, "tp_size": 8})
    module.package = package
    return module


def test_the_same_configuration_is_parsed_once(double):
    first = double.resolve_or_remember(["--tp-size", "8"])
    second = double.resolve_or_remember(["--tp-size", "8"])
    assert first == second == ({"host": "127.0.0.1", "port": 30000, "tp_size": 8}, True)
    assert double.parsed == [["--tp-size", "8"]]


def test_another_flag_variable_or_package_file_is_parsed_again(double, monkeypatch):
    double.resolve_or_remember(["--tp-size", "8"])
    double.resolve_or_remember(["--tp-size", "4"])
    monkeypatch.setenv("SGLANG_ENABLE_SPEC_V2", "1")
    double.resolve_or_remember(["--tp-size", "4"])
    (double.package / "srt" / "server_args.py").write_text("# the parser, patched\n")
    double.resolve_or_remember(["--tp-size", "4"])
    assert len(double.parsed) == 4


def test_bytecode_and_systemds_per_start_variables_are_not_part_of_the_key(double, monkeypatch):
    double.resolve_or_remember(["--tp-size", "8"])
    (double.package / "srt" / "__pycache__").mkdir()
    (double.package / "srt" / "__pycache__" / "server_args.cpython-311.pyc").write_bytes(b"\0")
    monkeypatch.setenv("INVOCATION_ID", "another-start")
    double.resolve_or_remember(["--tp-size", "8"])
    assert len(double.parsed) == 1


def test_a_refusal_is_never_remembered(double):
    for _ in range(2):
        with pytest.raises(SystemExit):
            double.resolve_or_remember(["--refused"])
    assert len(double.parsed) == 2


def test_outside_systemd_it_always_parses(double, monkeypatch):
    monkeypatch.delenv("STATE_DIRECTORY")
    double.resolve_or_remember(["--tp-size", "8"])
    double.resolve_or_remember(["--tp-size", "8"])
    assert len(double.parsed) == 2
