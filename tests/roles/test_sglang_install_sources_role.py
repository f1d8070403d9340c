"""The sglang_install role with package sources, for real, on localhost: pip is given the sources,
and the labelled builds they hold meet both SGLang's own pins and the sources' pins.

Everything pip sees is made here, in a temporary directory, from locally built STAND-IN wheels
(a few bytes each, no torch anywhere): a local index standing in for PyPI (sglang 0.5.9, which
pins torch==2.9.1, torchaudio==2.9.1 and sgl-kernel==0.3.21, and unlabelled builds of those three),
a local index standing in for PyTorch's cu130 index (torch and torchaudio 2.9.1+cu130), and a
wheelhouse directory standing in for the files of sgl-kernel's CUDA 13 build (0.3.21+cu130). The
role installs into a throw-away venv, three times: from the "PyPI" index alone (the unlabelled
builds), then with the sources (drift: each package replaced by its +cu130 build), then again
(no drift, no pip). The pip arguments, the pin checks and the announcing line are unit-tested in
tests/unit/test_sglang_pip_sources.py and test_sglang_install_pins.py.
"""

import base64
import hashlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from urllib.parse import quote

import pytest
import yaml
from ansible_run import run_playbook


PLAYBOOK = """\
- name: sglang_install with package sources into a throw-away venv
  hosts: all
  gather_facts: false
  roles:
    - role: sglang_install
"""

SOURCES = [
    {"name": "PyTorch cu130 (stand-in index)", "index_url": "", "pins": ["torch==2.9.1+cu130", "torchaudio==2.9.1+cu130"]},
    {"name": "sgl-kernel cu130 (stand-in files)", "find_links": "", "pins": ["sgl-kernel==0.3.21+cu130"]},
]


def build_standin_wheel(dest, name, version, requires=(), files=None):
    """A py3-none-any wheel of `name` `version`, as scripts/build-wheelhouse builds its shim: the
    package is a marker module saying it is a stand-in, nothing else."""
    dist = f"{name.replace('-', '_')}-{version}"
    module = name.replace("-", "_")
    files = dict(files or {f"{module}/__init__.py": f"STAND_IN = 'sglang-canon test: not the real {name}'\n"})
    files = {path: text.encode() for path, text in files.items()}
    files[f"{dist}.dist-info/METADATA"] = (
        "Metadata-Version: 2.1\n"
        f"Name: {name}\n"
        f"Version: {version}\n"
        "Summary: sglang-canon test stand-in\n"
        + "".join(f"Requires-Dist: {r}\n" for r in requires)
    ).encode()
    files[f"{dist}.dist-info/WHEEL"] = (
        "Wheel-Version: 1.0\nGenerator: sglang-canon test\nRoot-Is-Purelib: true\nTag: py3-none-any\n").encode()
    record_name = f"{dist}.dist-info/RECORD"
    record = []
    for path, data in sorted(files.items()):
        sha = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={sha},{len(data)}")
    record.append(f"{record_name},,")
    files[record_name] = ("\n".join(record) + "\n").encode()
    target = dest / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as wheel:
        for path, data in sorted(files.items()):
            wheel.writestr(zipfile.ZipInfo(path, date_time=(1980, 1, 1, 0, 0, 0)), data)
    return target


def write_simple_index(root, wheels):
    """A PEP 503 index as files (pip reads file:// indexes): root/simple/<project>/index.html."""
    for wheel in wheels:
        project = wheel.name.split("-")[0].replace("_", "-").lower()
        page = root / "simple" / project / "index.html"
        page.parent.mkdir(parents=True, exist_ok=True)
        links = page.read_text() if page.exists() else ""
        page.write_text(links + f'<a href="{wheel.as_uri().replace(wheel.name, quote(wheel.name))}">{wheel.name}</a>\n')
    return (root / "simple").as_uri()


@pytest.fixture(name="world", scope="module")
def fixture_world(tmp_path_factory):
    root = tmp_path_factory.mktemp("sglang-install-sources")
    pypi_files, cu130_files, wheelhouse = root / "pypi-files", root / "cu130-files", root / "sgl-kernel-cu130"
    for folder in (pypi_files, cu130_files, wheelhouse):
        folder.mkdir()
    sglang = build_standin_wheel(pypi_files, "sglang", "0.5.9",
                                 requires=["torch==2.9.1", "torchaudio==2.9.1", "sgl-kernel==0.3.21"],
                                 files={"sglang/__init__.py": "__version__ = '0.5.9'  # sglang-canon test stand-in\n"})
    pypi = [sglang] + [build_standin_wheel(pypi_files, n, v) for n, v in
                       (("torch", "2.9.1"), ("torchaudio", "2.9.1"), ("sgl-kernel", "0.3.21"))]
    cu130 = [build_standin_wheel(cu130_files, n, "2.9.1+cu130") for n in ("torch", "torchaudio")]
    build_standin_wheel(wheelhouse, "sgl-kernel", "0.3.21+cu130")
    sources = [dict(SOURCES[0], index_url=write_simple_index(root / "cu130", cu130)),
               dict(SOURCES[1], find_links=str(wheelhouse))]
    return {"root": root, "pypi_index": write_simple_index(root / "pypi", pypi), "sources": sources,
            "venv": root / "venvs" / "0.5.9", "wheelhouse": wheelhouse}


def run_role(world, sources, wheelhouse=""):
    playbook = world["root"] / "install.yml"
    playbook.write_text(PLAYBOOK, encoding="utf-8")
    inventory = world["root"] / "inventory.yml"
    inventory.write_text(yaml.safe_dump({"all": {"hosts": {"localhost": {
        "ansible_connection": "local",
        "ansible_python_interpreter": sys.executable,
        # one venv per release: the role installs into sglang_venvs_dir/sglang_version
        "sglang_venvs_dir": str(world["venv"].parent),
        "sglang_releases_record": str(world["venv"].parent / "releases.json"),
        "sglang_install_index_url": world["pypi_index"],
        "sglang_install_sources": sources,
        "sglang_install_wheelhouse": wheelhouse,
        # nothing from this machine's pip configuration (a mirror, a cache) may answer instead
        "sglang_install_environment": {"PIP_CONFIG_FILE": os.devnull, "PIP_NO_CACHE_DIR": "1"},
    }}}}), encoding="utf-8")
    result = run_playbook(playbook, inventory, testnode_vars=False)
    events = [e for e in result.events if e.get("event") in ("runner_on_ok", "runner_on_failed")]
    return {"rc": result.rc, "stats": result.stats, "stdout": result.stdout,
            "tasks": {e["event_data"]["task"]: e["event_data"].get("res", {}) for e in events}}


def installed(world):
    """{name: version} of the stand-ins in the venv, as its own Python reads them."""
    script = ("import json; from importlib import metadata as m; "
              "print(json.dumps({n: m.version(n) for n in ('sglang', 'torch', 'torchaudio', 'sgl-kernel')}))")
    out = subprocess.run([str(world["venv"] / "bin" / "python"), "-c", script], capture_output=True, text=True,
                         check=True).stdout
    return json.loads(out)


@pytest.fixture(name="runs", scope="module")
def fixture_runs(world):
    """The three runs, in order: index alone, with the sources, with the sources again; each with
    what the venv held after it."""
    runs = []
    for sources in ([], world["sources"], world["sources"]):
        run = run_role(world, sources)
        run["installed"] = installed(world) if run["rc"] == 0 else None
        runs.append(run)
    return runs


def test_without_sources_the_index_gives_the_unlabelled_builds(runs, world):
    first = runs[0]
    assert first["rc"] == 0, first["stdout"][-4000:]
    argv = first["tasks"]["Run pip install"]["cmd"]
    assert "--extra-index-url" not in argv and "--index-url" in argv
    assert first["installed"] == {"sglang": "0.5.9", "torch": "2.9.1", "torchaudio": "2.9.1", "sgl-kernel": "0.3.21"}


def test_with_sources_the_probe_sees_pypis_builds_as_drift(runs):
    second = runs[1]
    assert second["rc"] == 0, second["stdout"][-4000:]
    assert second["tasks"]["Show what differs from the wanted state"]["msg"] == [
        "torch: 2.9.1 installed, wanted ==2.9.1+cu130 (pin of source PyTorch cu130 (stand-in index))",
        "torchaudio: 2.9.1 installed, wanted ==2.9.1+cu130 (pin of source PyTorch cu130 (stand-in index))",
        "sgl-kernel: 0.3.21 installed, wanted ==0.3.21+cu130 (pin of source sgl-kernel cu130 (stand-in files))",
    ]


def test_pip_is_given_every_source_and_their_pins(runs, world):
    command = runs[1]["tasks"]["Run pip install"]["cmd"]
    argv = command[command.index("install"):]  # pip's own arguments, after the umask wrapper's
    cu130, _ = world["sources"]
    assert argv[argv.index("--index-url") + 1] == world["pypi_index"]
    assert argv[argv.index("--extra-index-url") + 1] == cu130["index_url"]
    assert str(world["wheelhouse"]) in [argv[i + 1] for i, a in enumerate(argv) if a == "--find-links"]
    constraints = [argv[i + 1] for i, a in enumerate(argv) if a == "-c"]
    assert [Path(c).name for c in constraints] == ["constraints.txt", "source-constraints.txt"]


def test_the_pip_run_is_announced_with_what_and_from_where(runs, world):
    message = runs[1]["tasks"]["Say what pip installs and from where"]["msg"]
    cu130, kernel = world["sources"]
    assert message == (
        f"pip installs sglang==0.5.9 into {world['venv']}/bin/python, with SGLang 0.5.9's own == pins as "
        f"constraints; sources: PyTorch cu130 (stand-in index) (torch==2.9.1+cu130, torchaudio==2.9.1+cu130) "
        f"from index {cu130['index_url']}; sgl-kernel cu130 (stand-in files) (sgl-kernel==0.3.21+cu130) from "
        f"files in {kernel['find_links']}; everything else from index {world['pypi_index']}")


def test_the_labelled_builds_are_installed_and_meet_every_pin(runs):
    assert runs[1]["installed"] == runs[2]["installed"] == {"sglang": "0.5.9", "torch": "2.9.1+cu130", "torchaudio": "2.9.1+cu130",
                                "sgl-kernel": "0.3.21+cu130"}
    # the probe after pip found nothing left: SGLang's torch==2.9.1 accepts 2.9.1+cu130
    assert runs[1]["tasks"]["Probe again after pip"]["in_sync"] is True


def test_a_converged_venv_runs_no_pip(runs):
    third = runs[2]
    assert third["rc"] == 0, third["stdout"][-4000:]
    assert not third["stats"].get("changed"), third["stats"]
    assert "Run pip install" not in third["tasks"]
    probe = third["tasks"]["Compare the installed packages with the wanted pins"]
    assert probe["in_sync"] is True and probe["installed"]["torch"] == "2.9.1+cu130"


def test_a_source_without_exact_pins_or_a_place_is_refused_before_anything_changes(world, tmp_path):
    broken = dict(world, venv=tmp_path / "never-made")
    run = run_role(broken, [{"name": "PyTorch cu130", "index_url": world["sources"][0]["index_url"],
                             "pins": ["torch>=2.9.1"]},
                            {"name": "sgl-kernel cu130", "pins": ["sgl-kernel==0.3.21+cu130"]}])
    assert run["rc"] != 0
    items = run["tasks"]["Check every package source (sglang_install_sources)"]["results"]
    assert [item["msg"] for item in items] == [
        "sglang_install_sources entry 'PyTorch cu130': pins must be exact name==version, with the source's local "
        "label (torch==2.9.1+cu130); these are not: torch>=2.9.1.",
        "sglang_install_sources entry 'sgl-kernel cu130': index_url and find_links are both empty, so pip has "
        "nowhere to look for it. Set one (inventory/production fills them from placeholder variables in "
        "group_vars/all.yml), or install from a sglang_install_wheelhouse.",
    ]
    assert not (tmp_path / "never-made").exists()


def test_a_wheelhouse_with_other_builds_too_installs_the_pinned_cu130_builds(world, tmp_path):
    """An air-gapped node: one directory holds everything, including a build whose label sorts
    above +cu130 (pip takes the highest version that meets its constraints, and SGLang's own
    torch==2.9.1 accepts any label), so only the sources' pins can make pip pick +cu130. The
    sources' index URLs are not given to pip (--no-index)."""
    wheelhouse = tmp_path / "wheelhouse"
    wheelhouse.mkdir()
    build_standin_wheel(wheelhouse, "sglang", "0.5.9",
                        requires=["torch==2.9.1", "torchaudio==2.9.1", "sgl-kernel==0.3.21"],
                        files={"sglang/__init__.py": "__version__ = '0.5.9'  # sglang-canon test stand-in\n"})
    for name, version in (("torch", "2.9.1+rocm6.4"), ("torch", "2.9.1+cu130"), ("torchaudio", "2.9.1+rocm6.4"),
                          ("torchaudio", "2.9.1+cu130"), ("sgl-kernel", "0.3.21")):
        build_standin_wheel(wheelhouse, name, version)
    air_gapped = dict(world, venv=tmp_path / "venvs" / "0.5.9")
    run = run_role(air_gapped, world["sources"], wheelhouse=str(wheelhouse))
    assert run["rc"] == 0, run["stdout"][-4000:]
    command = run["tasks"]["Run pip install"]["cmd"]
    argv = command[command.index("install"):]
    assert argv[argv.index("--no-index") + 1:argv.index("--no-index") + 5] == [
        "--find-links", str(wheelhouse), "--find-links", world["sources"][1]["find_links"]]
    assert "--index-url" not in argv and "--extra-index-url" not in argv
    assert installed(air_gapped) == {"sglang": "0.5.9", "torch": "2.9.1+cu130", "torchaudio": "2.9.1+cu130",
                                     "sgl-kernel": "0.3.21+cu130"}
