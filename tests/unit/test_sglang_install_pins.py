"""Pin logic of the sglang_install role: module_utils/sglang_pins.py, the sglang_wheel_pins and
sglang_pip_probe modules (run_command mocked), and the pure parts of scripts/build-wheelhouse."""

import base64
import hashlib
import json
import sys
import zipfile
from pathlib import Path

import pytest
from ansible.module_utils import basic
from ansible.module_utils.testing import patch_module_args
from project_modules import REPO

PARSER_REQUIREMENTS = REPO / "tests" / "wheelhouse" / "parser-requirements.txt"


# --- parsing ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def pins(project_module):
    return project_module("module_utils/sglang_pins.py", as_name="ansible.module_utils.sglang_pins")


@pytest.fixture(scope="module")
def wheel_pins_module(project_module, pins):  # pylint: disable=unused-argument  # registered first
    return project_module("library/sglang_wheel_pins.py")


@pytest.fixture(scope="module")
def probe_module(project_module, pins):  # pylint: disable=unused-argument  # registered first
    return project_module("library/sglang_pip_probe.py")


@pytest.fixture(scope="module")
def build_wheelhouse(project_module):
    return project_module("scripts/build-wheelhouse")


# The modules import ansible.module_utils.sglang_pins (ansible.cfg's module_utils path at run
# time); make that name resolve to the repository's file here.

# Requires-Dist of the real sglang-0.5.9-py3-none-any.whl: every == entry, a few ranges and
# unpinned ones, the marker-bearing ones and a sample of the extras.
SGLANG_059_REQUIRES = [
    "IPython",
    "aiohttp",
    "apache-tvm-ffi<0.2,>=0.1.5",
    "anthropic>=0.20.0",
    'av; sys_platform == "linux" and (platform_machine == "aarch64" or platform_machine == "arm64"'
    ' or platform_machine == "armv7l")',
    "blobfile==3.0.0",
    "compressed-tensors",
    "cuda-python==12.9",
    "flashinfer_python==0.6.3",
    "flashinfer_cubin==0.6.3",
    "llguidance<0.8.0,>=0.7.11",
    "openai-harmony==0.0.4",
    "openai==2.6.1",
    "outlines==0.1.11",
    "pyzmq>=25.1.2",
    "quack-kernels==0.2.4",
    "sgl-kernel==0.3.21",
    "soundfile==0.13.1",
    "timm==1.0.16",
    "torch_memory_saver==0.0.9",
    "torch==2.9.1",
    "torchao==0.9.0",
    "torchaudio==2.9.1",
    'torchcodec==0.8.0; sys_platform != "linux" or (sys_platform == "linux" and platform_machine != "aarch64"'
    ' and platform_machine != "arm64" and platform_machine != "armv7l")',
    "torchvision",
    "transformers==4.57.1",
    "xgrammar==0.1.27",
    "grpcio>=1.78.0",
    'checkpoint-engine==0.1.2; extra == "checkpoint-engine"',
    'PyYAML==6.0.1; extra == "diffusion"',
    'diffusers==0.36.0; extra == "diffusion"',
    'st_attn==0.0.7; (platform_machine != "aarch64" and platform_machine != "arm64") and extra == "diffusion"',
    'sglang[test]; extra == "dev"',
]
SGLANG_059_PINS = {
    "blobfile": "3.0.0", "cuda-python": "12.9", "flashinfer_python": "0.6.3", "flashinfer_cubin": "0.6.3",
    "openai-harmony": "0.0.4", "openai": "2.6.1", "outlines": "0.1.11", "quack-kernels": "0.2.4",
    "sgl-kernel": "0.3.21", "soundfile": "0.13.1", "timm": "1.0.16", "torch_memory_saver": "0.0.9",
    "torch": "2.9.1", "torchao": "0.9.0", "torchaudio": "2.9.1", "torchcodec": "0.8.0",
    "transformers": "4.57.1", "xgrammar": "0.1.27",
}


def make_wheel(directory, name="sglang", version="0.5.9", requires=None, dist_name=None):
    """A minimal wheel whose METADATA carries the given Requires-Dist."""
    dist = dist_name or name.replace("-", "_")
    path = Path(directory) / f"{dist}-{version}-py3-none-any.whl"
    metadata = f"Metadata-Version: 2.4\nName: {name}\nVersion: {version}\n"
    metadata += "".join(f"Requires-Dist: {r}\n" for r in (requires if requires is not None else SGLANG_059_REQUIRES))
    metadata += "\nLong description: Requires-Dist: not-a-header==1\n"
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr(f"{dist}/__init__.py", "")
        wheel.writestr(f"{dist}-{version}.dist-info/METADATA", metadata)
    return path


def run_module(module, args, capsys):
    with patch_module_args(args):
        with pytest.raises(SystemExit):
            module.main()
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize(
    "text, name, pin, specs, marker",
    [
        ("sglang==0.5.9", "sglang", "0.5.9", [("==", "0.5.9")], None),
        ("torch==2.13.0+cpu", "torch", "2.13.0+cpu", [("==", "2.13.0+cpu")], None),
        ("torch (==2.13.0)", "torch", "2.13.0", [("==", "2.13.0")], None),
        ("pillow (!=8.3.*,>=5.3.0)", "pillow", None, [("!=", "8.3.*"), (">=", "5.3.0")], None),
        ("apache-tvm-ffi<0.2,>=0.1.5", "apache-tvm-ffi", None, [("<", "0.2"), (">=", "0.1.5")], None),
        ("IPython", "IPython", None, [], None),
        ("sglang[all]==0.5.9", "sglang", "0.5.9", [("==", "0.5.9")], None),
        ("foo===1.0", "foo", "1.0", [("===", "1.0")], None),
        ("foo==1.*", "foo", None, [("==", "1.*")], None),
        ('x==1; python_version < "3.10"', "x", "1", [("==", "1")], 'python_version < "3.10"'),
        ("numpy==2.4.6 --hash=sha256:abcd", "numpy", "2.4.6", [("==", "2.4.6")], None),
    ],
)
def test_parse_requirement(pins, text, name, pin, specs, marker):
    parsed = pins.parse_requirement(text)
    assert (parsed["name"], parsed["pin"], parsed["specs"], parsed["marker"]) == (name, pin, specs, marker)
    assert parsed["text"] == text


def test_parse_requirement_extras_url_and_errors(pins):
    assert pins.parse_requirement("sglang[all, test]==0.5.9")["extras"] == ["all", "test"]
    url = pins.parse_requirement("sglang @ https://example.invalid/sglang-0.5.9-py3-none-any.whl")
    assert url["url"].endswith(".whl") and url["pin"] is None
    with pytest.raises(pins.RequirementError):
        pins.parse_requirement("torch=2.9.1")
    with pytest.raises(pins.RequirementError):
        pins.parse_requirement("")


def test_canonical_name(pins):
    assert pins.canonical_name("Typing_Extensions") == "typing-extensions"
    assert pins.canonical_name("flashinfer_python") == "flashinfer-python"
    assert pins.canonical_name("ruamel.yaml") == "ruamel-yaml"


def test_requirements_text_comments_and_options(pins):
    text = "# header\n\nsglang==0.5.9\nyarl==1.25.1  # via aiohttp\n   # indented comment\n"
    parsed = pins.parse_requirements_text(text)
    assert [(r["name"], r["pin"]) for r in parsed] == [("sglang", "0.5.9"), ("yarl", "1.25.1")]
    with pytest.raises(pins.RequirementError, match=r"reqs:2: option lines"):
        pins.parse_requirements_text("sglang==0.5.9\n-r other.txt\n", "reqs")
    with pytest.raises(pins.RequirementError, match=r"reqs:1:"):
        pins.parse_requirements_text("torch=2\n", "reqs")


# --- release pins -> constraints --------------------------------------------------------


def test_release_pins_are_exactly_the_base_double_equals_entries(pins):
    found = pins.release_pins(SGLANG_059_REQUIRES)
    assert {p["name"]: p["pin"] for p in found} == SGLANG_059_PINS
    assert [p["name"] for p in found][:3] == ["blobfile", "cuda-python", "flashinfer_python"]


def test_release_pins_exclude_any_spelling(pins):
    names = [p["canonical"] for p in pins.release_pins(SGLANG_059_REQUIRES, exclude=["Torch", "torch-memory-saver"])]
    assert "torch" not in names and "torch-memory-saver" not in names
    assert "torchaudio" in names


def test_constraints_text_keeps_markers_and_drops_extras(pins):
    text = pins.constraints_text(pins.release_pins(SGLANG_059_REQUIRES), header="from sglang 0.5.9")
    lines = text.splitlines()
    assert lines[0] == "# from sglang 0.5.9"
    assert "transformers==4.57.1" in lines
    assert "torch==2.9.1" in lines
    assert any(line.startswith('torchcodec==0.8.0; sys_platform != "linux"') for line in lines)
    assert not any("extra" in line or "diffusers" in line or "PyYAML" in line for line in lines)
    assert text.endswith("\n")


def test_wheel_metadata_and_find_wheel(pins, tmp_path):
    wheel = make_wheel(tmp_path)
    make_wheel(tmp_path, version="0.5.8", requires=[])
    make_wheel(tmp_path, name="sglang-kernel", version="0.5.9", requires=[])
    name, version, requires = pins.wheel_metadata(wheel)
    assert (name, version) == ("sglang", "0.5.9")
    assert requires == SGLANG_059_REQUIRES  # the body's look-alike line is not a header
    listing = [p.name for p in tmp_path.iterdir()] + ["notes.txt", "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"]
    assert pins.find_wheel(listing, "sglang", "0.5.9") == "sglang-0.5.9-py3-none-any.whl"
    assert pins.find_wheel(listing, "Torch", "2.13.0") == "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"
    assert pins.find_wheel(listing, "sglang", "0.6.0") is None


# --- versions and drift -----------------------------------------------------------------


@pytest.mark.parametrize(
    "wanted, installed, equal",
    [
        ("2.13.0", "2.13.0+cpu", True),
        ("2.13.0+cpu", "2.13.0+cpu", True),
        ("2.13.0+cpu", "2.13.0", False),
        ("2.13.0+cpu", "2.13.0+cu130", False),
        ("2.13", "2.13.0", True),
        ("12.9", "12.9.0", True),
        ("0.2.1.1.post7", "0.2.1.1.post7", True),
        ("0.2.1.1.post7", "0.2.1.1", False),
        ("4.57.1", "4.57.10", False),
        ("1.0rc1", "1.0RC1", True),
        ("0.5.9", None, False),
        # PEP 440: '==2.9.1' matches PyTorch's labelled builds, a labelled pin only its own build.
        ("2.9.1", "2.9.1+cu130", True),
        ("2.9.1+cu130", "2.9.1", False),
        ("2.9.1+cu130", "2.9.1+cu128", False),
        ("2.9.1+cu130", "2.9.1+CU130", True),
        ("0.24.1+cu130", "0.24.1.0+cu130", True),
        ("1.0+rocm-6.4", "1.0+rocm_6.4", True),
    ],
)
def test_versions_equal(pins, wanted, installed, equal):
    assert pins.versions_equal(wanted, installed) is equal


def wanted(pins, *lines):
    return [pins.parse_requirement(line) for line in lines]


def test_drift_of_requested_packages(pins):
    installed = {"sglang": "0.5.8", "torch": "2.13.0+cpu", "ipython": "9.0"}
    drift = pins.find_drift(wanted(pins, "sglang==0.5.9", "torch==2.13.0", "ipython", "dill==0.4.1", "sglang==0.5.9"), installed)
    assert drift == [
        {"name": "sglang", "wanted": "==0.5.9", "installed": "0.5.8", "source": "requested"},
        {"name": "dill", "wanted": "==0.4.1", "installed": None, "source": "requested"},
    ]
    assert pins.describe_drift(drift[1]) == "dill: not installed, wanted ==0.4.1 (requested)"
    assert pins.describe_drift(drift[0]) == "sglang: 0.5.8 installed, wanted ==0.5.9 (requested)"


def test_drift_of_release_pins_full_install(pins):
    installed = {"sglang": "0.5.9", "transformers": "4.56.0", "torch": "2.9.1"}
    installed.update({pins.canonical_name(n): v for n, v in SGLANG_059_PINS.items() if n not in ("transformers", "torch")})
    drift = pins.find_drift(wanted(pins, "sglang==0.5.9"), installed, release="sglang",
                            release_requires=SGLANG_059_REQUIRES, require_release_deps=True)
    assert [pins.describe_drift(d) for d in drift] == ["transformers: 4.56.0 installed, wanted ==4.57.1 (sglang pin)"]


def test_drift_of_release_pins_no_deps_install_with_exclusion(pins):
    installed = {"sglang": "0.5.9", "transformers": "4.57.1", "torch": "2.13.0+cpu", "openai": "2.6.1"}
    args = dict(release="sglang", release_requires=SGLANG_059_REQUIRES, require_release_deps=False)
    assert pins.find_drift(wanted(pins, "sglang==0.5.9"), installed, exclude=["torch"], **args) == []
    # Not excluded, the CPU torch is drift; the missing flashinfer etc. are not (no-deps install).
    drift = pins.find_drift(wanted(pins, "sglang==0.5.9"), installed, **args)
    assert [(d["name"], d["installed"]) for d in drift] == [("torch", "2.13.0+cpu")]
    # A requirement asked for explicitly wins over the release pin of the same package.
    assert pins.find_drift(wanted(pins, "sglang==0.5.9", "torch==2.13.0+cpu"), installed, **args) == []


def test_drift_release_missing_deps_and_markers(pins):
    installed = {"sglang": "0.5.9"}
    args = dict(release="sglang", release_requires=SGLANG_059_REQUIRES, require_release_deps=True)
    names = {d["name"] for d in pins.find_drift(wanted(pins, "sglang==0.5.9"), installed, **args)}
    assert names == set(SGLANG_059_PINS)
    torchcodec_entry = next(r for r in SGLANG_059_REQUIRES if r.startswith("torchcodec"))
    names = {d["name"] for d in pins.find_drift(wanted(pins, "sglang==0.5.9"), installed,
                                                marker_results={torchcodec_entry: False}, **args)}
    assert "torchcodec" not in names and "torch" in names
    # Release not installed (requires None): only the requested packages count.
    assert pins.find_drift(wanted(pins, "sglang==0.5.9"), {}, release="sglang", release_requires=None) == [
        {"name": "sglang", "wanted": "==0.5.9", "installed": None, "source": "requested"}]


# --- package sources (sglang_install_sources) --------------------------------------------

PYTORCH_CU130 = {"name": "PyTorch cu130", "index_url": "https://example.invalid/whl/cu130",
                 "pins": ["torch==2.9.1+cu130", "torchvision==0.24.1+cu130", "torchaudio==2.9.1+cu130"]}
SGL_KERNEL_CU130 = {"name": "sgl-kernel cu130", "find_links": "/srv/wheels/sgl-kernel",
                    "pins": ["sgl_kernel==0.3.21+cu130"]}


def test_source_pins_carry_their_source_and_must_be_exact(pins):
    parsed = pins.source_pins([PYTORCH_CU130, SGL_KERNEL_CU130])
    assert [(p["canonical"], p["pin"], p["origin"]) for p in parsed] == [
        ("torch", "2.9.1+cu130", "PyTorch cu130"), ("torchvision", "0.24.1+cu130", "PyTorch cu130"),
        ("torchaudio", "2.9.1+cu130", "PyTorch cu130"), ("sgl-kernel", "0.3.21+cu130", "sgl-kernel cu130")]
    assert pins.source_pins([]) == [] and pins.source_pins(None) == []
    for bad in ("torch>=2.9.1", "torch", "torch==2.9.*", "torch[opt]==2.9.1", 'torch==2.9.1; sys_platform == "linux"'):
        with pytest.raises(pins.RequirementError, match="PyTorch cu130.*not an exact"):
            pins.source_pins([{"name": "PyTorch cu130", "pins": [bad]}])


def test_drift_of_source_pins_tells_the_cu130_build_from_pypis(pins):
    release = dict(release="sglang", release_requires=SGLANG_059_REQUIRES, require_release_deps=False)
    sources = pins.source_pins([PYTORCH_CU130, SGL_KERNEL_CU130])
    cu130 = {"sglang": "0.5.9", "torch": "2.9.1+cu130", "torchaudio": "2.9.1+cu130", "sgl-kernel": "0.3.21+cu130"}
    # The cu130 build meets SGLang's own torch==2.9.1 and the sources' labelled pins; torchvision is
    # not installed (a --no-deps install here): a source pin alone does not ask for a package.
    assert pins.find_drift(wanted(pins, "sglang==0.5.9"), cu130, pinned_sources=sources, **release) == []
    # PyPI's torch 2.9.1 meets SGLang's pin but not the source's: drift, named after the source.
    pypi = dict(cu130, torch="2.9.1", **{"sgl-kernel": "0.3.21"})
    drift = pins.find_drift(wanted(pins, "sglang==0.5.9"), pypi, pinned_sources=sources, **release)
    assert [pins.describe_drift(d) for d in drift] == [
        "torch: 2.9.1 installed, wanted ==2.9.1+cu130 (pin of source PyTorch cu130)",
        "sgl_kernel: 0.3.21 installed, wanted ==0.3.21+cu130 (pin of source sgl-kernel cu130)",
    ]
    # Without sources, that PyPI stack is in sync: the label is what the sources add.
    assert pins.find_drift(wanted(pins, "sglang==0.5.9"), pypi, **release) == []


# --- the parser-only requirements file of the test node ------------------------------------


def test_parser_requirements_are_exact_pins_consistent_with_sglang(pins):
    parsed = pins.parse_requirements_text(PARSER_REQUIREMENTS.read_text(), str(PARSER_REQUIREMENTS))
    by_name = {r["canonical"]: r["pin"] for r in parsed}
    assert all(r["pin"] for r in parsed), "every line must be name==version"
    assert len(by_name) == len(parsed), "no package twice"
    assert by_name["sglang"] == "0.5.9"
    assert by_name["torch"] == "2.13.0+cpu"  # the local label keeps PyPI's CUDA build out
    # Where SGLang 0.5.9 pins, the file follows -- torch is the one recorded deviation.
    for pin in pins.release_pins(SGLANG_059_REQUIRES, exclude=["torch"]):
        if pin["canonical"] in by_name:
            assert by_name[pin["canonical"]] == pin["pin"], pin["name"]
    for gpu_only in ("flashinfer-python", "sgl-kernel", "cuda-python", "nvidia-nccl-cu12", "torchaudio"):
        assert gpu_only not in by_name


# --- sglang_wheel_pins module -------------------------------------------------------------


def test_wheel_pins_module_writes_then_is_idempotent(wheel_pins_module, tmp_path, capsys):
    make_wheel(tmp_path)
    dest = tmp_path / "constraints.txt"
    args = {"src": str(tmp_path), "version": "0.5.9", "dest": str(dest), "exclude": ["torch"]}
    first = run_module(wheel_pins_module, args, capsys)
    assert first["changed"] is True
    assert first["pins"]["transformers"] == "4.57.1" and "torch" not in first["pins"]
    assert first["wheel"].endswith("sglang-0.5.9-py3-none-any.whl")
    text = dest.read_text()
    assert "transformers==4.57.1\n" in text and "\ntorch==" not in text
    assert "Left out on purpose: torch" in text
    assert oct(dest.stat().st_mode & 0o777) == "0o644"
    second = run_module(wheel_pins_module, args, capsys)
    assert second["changed"] is False


def test_wheel_pins_module_check_mode_writes_nothing(wheel_pins_module, tmp_path, capsys):
    wheel = make_wheel(tmp_path)
    dest = tmp_path / "constraints.txt"
    result = run_module(wheel_pins_module, {"src": str(wheel), "version": "0.5.9", "dest": str(dest),
                                            "_ansible_check_mode": True}, capsys)
    assert result["changed"] is True and not dest.exists()
    assert "torch==2.9.1" in result["constraints"]


def test_wheel_pins_module_refuses_wrong_version(wheel_pins_module, tmp_path, capsys):
    make_wheel(tmp_path, version="0.5.8")
    result = run_module(wheel_pins_module, {"src": str(tmp_path), "version": "0.5.9"}, capsys)
    assert result["failed"] and "no wheel of sglang==0.5.9" in result["msg"]
    renamed = tmp_path / "sglang-0.5.9-py3-none-any.whl"
    (tmp_path / "sglang-0.5.8-py3-none-any.whl").rename(renamed)
    result = run_module(wheel_pins_module, {"src": str(renamed), "version": "0.5.9"}, capsys)
    assert result["failed"] and "not 0.5.9" in result["msg"]


# --- sglang_pip_probe module --------------------------------------------------------------


class FakePython:
    """Stands in for run_command: answers the probe as the target interpreter would."""

    def __init__(self, versions, requires=None, markers=None, rc=0):
        self.answer = {"python": "3.11.2", "versions": versions, "requires": requires, "markers": markers or {}}
        self.rc = rc
        self.calls = []

    def __call__(self, args, **kwargs):  # set on the class as a plain callable: no module self
        self.calls.append(args)
        return self.rc, "noise from a .pth file\n" + json.dumps(self.answer) + "\n", "" if self.rc == 0 else "boom"


@pytest.fixture
def interpreter(tmp_path):
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\n")
    python.chmod(0o755)
    return str(python)


def test_probe_in_sync_with_requirements_file(probe_module, tmp_path, interpreter, capsys, monkeypatch):
    reqs = tmp_path / "reqs.txt"
    reqs.write_text("sglang==0.5.9\ntorch==2.13.0+cpu  # deviation\n")
    fake = FakePython({"sglang": "0.5.9", "torch": "2.13.0+cpu", "transformers": "4.57.1"}, SGLANG_059_REQUIRES)
    monkeypatch.setattr(basic.AnsibleModule, "run_command", fake)
    result = run_module(probe_module, {"python": interpreter, "requirements": ["sglang==0.5.9"],
                                       "requirements_file": str(reqs), "exclude": ["torch"],
                                       "require_release_deps": False}, capsys)
    assert result["in_sync"] is True and result["changed"] is False and result["drift"] == []
    assert result["installed"]["transformers"] == "4.57.1" and result["installed"]["flashinfer-python"] is None
    assert fake.calls[0][:3] == [interpreter, "-I", "-c"] and fake.calls[0][-1] == "sglang"


def test_probe_reports_drift(probe_module, interpreter, capsys, monkeypatch):
    fake = FakePython({"sglang": "0.5.9", "transformers": "4.56.0"}, SGLANG_059_REQUIRES)
    monkeypatch.setattr(basic.AnsibleModule, "run_command", fake)
    result = run_module(probe_module, {"python": interpreter, "requirements": ["sglang==0.5.9"],
                                       "require_release_deps": False}, capsys)
    assert result["in_sync"] is False
    assert result["summary"] == ["transformers: 4.56.0 installed, wanted ==4.57.1 (sglang pin)"]


def test_probe_checks_the_pins_of_package_sources(probe_module, interpreter, capsys, monkeypatch):
    fake = FakePython({"sglang": "0.5.9", "torch": "2.9.1", "transformers": "4.57.1"}, SGLANG_059_REQUIRES)
    monkeypatch.setattr(basic.AnsibleModule, "run_command", fake)
    args = {"python": interpreter, "requirements": ["sglang==0.5.9"], "require_release_deps": False,
            "sources": [PYTORCH_CU130]}
    result = run_module(probe_module, args, capsys)
    assert result["in_sync"] is False
    assert result["summary"] == ["torch: 2.9.1 installed, wanted ==2.9.1+cu130 (pin of source PyTorch cu130)"]
    assert result["installed"]["torch"] == "2.9.1" and result["installed"]["torchvision"] is None
    fake.answer["versions"]["torch"] = "2.9.1+cu130"
    assert run_module(probe_module, args, capsys)["in_sync"] is True
    bad = dict(args, sources=[{"name": "PyTorch cu130", "pins": ["torch>=2.9"]}])
    result = run_module(probe_module, bad, capsys)
    assert result["failed"] and "not an exact" in result["msg"]


def test_probe_without_release_pins_asks_for_no_release(probe_module, interpreter, capsys, monkeypatch):
    fake = FakePython({"sglang": "0.5.9", "transformers": "4.56.0"}, None)
    monkeypatch.setattr(basic.AnsibleModule, "run_command", fake)
    result = run_module(probe_module, {"python": interpreter, "requirements": ["sglang==0.5.9"],
                                       "check_release_pins": False}, capsys)
    assert result["in_sync"] is True and fake.calls[0][-1] == ""


def test_probe_missing_interpreter_is_drift_not_failure(probe_module, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(basic.AnsibleModule, "run_command", FakePython({}))
    result = run_module(probe_module, {"python": str(tmp_path / "venv" / "bin" / "python"),
                                       "requirements": ["sglang==0.5.9"]}, capsys)
    assert result["python_found"] is False and result["in_sync"] is False
    assert result["summary"][1] == "sglang: not installed, wanted ==0.5.9 (requested)"


def test_probe_failures(probe_module, tmp_path, interpreter, capsys, monkeypatch):
    monkeypatch.setattr(basic.AnsibleModule, "run_command", FakePython({}, rc=1))
    result = run_module(probe_module, {"python": interpreter, "requirements": ["sglang==0.5.9"]}, capsys)
    assert result["failed"] and "boom" in result["msg"]
    reqs = tmp_path / "bad.txt"
    reqs.write_text("--index-url http://mirror.invalid/simple\n")
    result = run_module(probe_module, {"python": interpreter, "requirements_file": str(reqs)}, capsys)
    assert result["failed"] and "option lines are not supported" in result["msg"]


def test_probe_script_runs_under_a_real_interpreter(probe_module):
    """The PROBE text itself, under this Python: JSON with versions of what is installed."""
    import subprocess  # pylint: disable=import-outside-toplevel

    out = subprocess.run([sys.executable, "-I", "-c", probe_module.PROBE, "pytest"],
                         capture_output=True, text=True, check=True).stdout
    answer = json.loads(out.strip().splitlines()[-1])
    assert answer["versions"]["pytest"] == pytest.__version__
    assert isinstance(answer["requires"], list)


# --- scripts/build-wheelhouse ----------------------------------------------------------------


def test_build_wheelhouse_reads_only_pins(build_wheelhouse, tmp_path):
    reqs = tmp_path / "r.txt"
    reqs.write_text("# c\nsglang==0.5.9\ntorch==2.13.0+cpu  # deviation\n")
    assert build_wheelhouse.read_pins(reqs) == [("sglang", "0.5.9"), ("torch", "2.13.0+cpu")]
    reqs.write_text("sglang>=0.5\n")
    with pytest.raises(SystemExit):
        build_wheelhouse.read_pins(reqs)
    assert build_wheelhouse.read_pins(PARSER_REQUIREMENTS)[0] == ("sglang", "0.5.9")


def test_build_wheelhouse_shim_wheel_is_valid_and_reproducible(pins, build_wheelhouse, tmp_path):
    first = tmp_path / "a"
    second = tmp_path / "b"
    first.mkdir()
    second.mkdir()
    name = build_wheelhouse.build_shim_wheel(first, "1.0.0")
    assert name == "sglang_canon_torchvision_cpu_shim-1.0.0-py3-none-any.whl"
    build_wheelhouse.build_shim_wheel(second, "1.0.0")
    assert (first / name).read_bytes() == (second / name).read_bytes()
    with zipfile.ZipFile(first / name) as wheel:
        files = set(wheel.namelist())
        assert {"sglang_canon_tvshim.py", "sglang_canon_tvshim.pth"} <= files
        record = wheel.read("sglang_canon_torchvision_cpu_shim-1.0.0.dist-info/RECORD").decode()
        for line in record.splitlines():
            path, digest, size = line.rsplit(",", 2)
            if not digest:
                continue
            data = wheel.read(path)
            expected = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert digest == "sha256=" + expected and int(size) == len(data)
    assert pins.wheel_metadata(first / name)[:2] == ("sglang-canon-torchvision-cpu-shim", "1.0.0")


def test_build_wheelhouse_completeness_marker(build_wheelhouse, tmp_path):
    assert not build_wheelhouse.is_complete(tmp_path, "h")
    (tmp_path / "a.whl").write_text("")
    (tmp_path / ".complete").write_text("h\na.whl\n")
    assert build_wheelhouse.is_complete(tmp_path, "h")
    assert not build_wheelhouse.is_complete(tmp_path, "other-hash")
    (tmp_path / "a.whl").unlink()
    assert not build_wheelhouse.is_complete(tmp_path, "h")
    assert build_wheelhouse.wheel_pin("Torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl") == ("torch", "2.13.0+cpu")
