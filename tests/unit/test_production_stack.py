"""inventory/production reaches the seed's CUDA 13.0 stack: its package sources, as Ansible loads
them, pin builds that meet SGLang 0.5.9's own pins and the stack_verify expectations, and the
places to fetch them from are placeholders for the operator (no index host is written here)."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from project_modules import REPO

INVENTORY = REPO / "inventory" / "production"
WHEELHOUSE_SGLANG = REPO / ".cache" / "wheelhouse" / "sglang-0.5.9-py3-none-any.whl"


@pytest.fixture(scope="module")
def pins(project_module):
    # the name library/sglang_wheel_pins.py imports it by, as test_sglang_install_pins.py loads it
    return project_module("module_utils/sglang_pins.py", as_name="ansible.module_utils.sglang_pins")


def host_vars():
    """The first production host's variables as ansible-inventory loads them (group_vars included)."""
    listing = subprocess.run([str(Path(sys.executable).parent / "ansible-inventory"), "-i", str(INVENTORY), "--list"],
                             capture_output=True, text=True, check=True, cwd=REPO)
    data = json.loads(listing.stdout)
    host = data["sglang_nodes"]["hosts"][0]
    return data["_meta"]["hostvars"][host]


def role_default(role, name):
    return yaml.safe_load((REPO / "roles" / role / "defaults" / "main.yml").read_text())[name]


def test_the_production_inventory_loads_the_seeds_sources():
    variables = host_vars()
    sources = {s["name"]: s for s in variables["sglang_install_sources"]}
    assert sources["PyTorch cu130"]["index_url"] == "{{ canonical_pytorch_cu130_index_url }}"
    assert sources["sgl-kernel cu130"]["find_links"] == "{{ canonical_sgl_kernel_cu130_find_links }}"
    # the placeholders are there to be filled, and the generated per-variable docs still load beside them
    assert variables["canonical_pytorch_cu130_index_url"] == "" == variables["canonical_sgl_kernel_cu130_find_links"]
    assert variables["sglang_model_path"] == "/data/models/target"


def test_every_source_pin_is_a_cu130_build_that_sglangs_own_pins_accept(pins):
    sources = host_vars()["sglang_install_sources"]
    parsed = pins.source_pins(sources)
    assert all(p["pin"].endswith("+cu130") for p in parsed)
    if WHEELHOUSE_SGLANG.exists():  # the real wheel's Requires-Dist, where the wheelhouse is built
        _, _, requires = pins.wheel_metadata(str(WHEELHOUSE_SGLANG))
    else:  # the same pins, as SGLang 0.5.9 states them
        requires = ["torch==2.9.1", "torchaudio==2.9.1", "sgl-kernel==0.3.21", "torchvision"]
    release = {p["canonical"]: p["pin"] for p in pins.release_pins(requires)}
    for pin in parsed:
        if pin["canonical"] in release:
            assert pins.versions_equal(release[pin["canonical"]], pin["pin"]), pin["text"]
    assert {"torch", "torchaudio", "sgl-kernel"} <= {p["canonical"] for p in parsed}


def test_the_torch_pin_is_what_stack_verify_expects(pins):
    torch = next(p for p in pins.source_pins(host_vars()["sglang_install_sources"]) if p["canonical"] == "torch")
    public, _, label = torch["pin"].partition("+")
    assert public == role_default("stack_verify", "stack_verify_expected_torch_version")
    # +cu130 is the build for torch.version.cuda 13.0
    assert label == "cu" + role_default("stack_verify", "stack_verify_expected_torch_cuda").replace(".", "")


def test_no_index_host_is_written_in_the_production_inventory():
    for path in INVENTORY.rglob("*.yml"):
        assert not re.search(r"[a-z]+://", path.read_text()), path
