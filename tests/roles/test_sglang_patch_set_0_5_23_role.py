"""Patch 0002 as ported to SGLang 0.5.23, for real on CPU torch: a skipped draft keeps the verify shapes.

EagleDraftWorker.draft_forward of the patched 0.5.23 file runs in the parser venv (the session
fixture `parser_python`: CPU torch 2.13.0), cut out with the helpers it calls from the pristine
0.5.23 wheel of the wheelhouse (tests/roles/draft_forward_check_0_5_23.py). The set on the wheel's
bytes alone is tested in tests/unit/test_sglang_patch_set_0_5_23.py.
"""

import json
import subprocess
import zipfile
from pathlib import Path

from parser_venv import WHEELHOUSE, ensure_wheelhouse
from patch_set_fixtures import ud
from project_modules import REPO

SET_DIR = REPO / "roles" / "sglang_patches" / "files" / "sglang-0.5.23"
WORKER = "sglang/srt/speculative/eagle_worker_v2.py"
HELPERS = ("sglang/srt/utils/common.py", "sglang/srt/speculative/eagle_utils.py", "sglang/srt/speculative/spec_utils.py")
DRAFT_FORWARD_CHECK = Path(__file__).resolve().parent / "draft_forward_check_0_5_23.py"


def test_skipped_draft_keeps_the_chain_shapes_on_both_topk1_paths(parser_python, tmp_path):
    """Skipping must give the verify pass the same shapes and chain tree, every draft slot the first token.

    Both of 0.5.23's topk-1 paths: the chain its CUDA kernel writes in place (the port fills the
    skipped columns itself) and the token list of other devices.
    """
    ensure_wheelhouse()
    (wheel,) = WHEELHOUSE.glob("sglang-0.5.23-*.whl")
    patches = [ud.parse_patch(p.name, p.read_bytes()) for p in sorted(SET_DIR.glob("*.patch"))]
    with zipfile.ZipFile(wheel) as zf:
        for path in HELPERS:
            (tmp_path / Path(path).name).write_bytes(zf.read(path))
        (tmp_path / "eagle_worker_v2.py").write_bytes(ud.apply_patches(zf.read(WORKER), WORKER, patches))
    done = subprocess.run(
        [parser_python, str(DRAFT_FORWARD_CHECK), *(str(tmp_path / Path(p).name) for p in HELPERS),
         str(tmp_path / "eagle_worker_v2.py"), WORKER],
        cwd=tmp_path, capture_output=True, text=True, check=False, timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    results = [json.loads(line) for line in done.stdout.strip().splitlines()[-2:]]
    assert [r["path"] for r in results] == ["in-place chain (CUDA kernel path)", "token list (other devices)"]
    for result in results:
        assert result["torch"].startswith("2.13.0")
        assert result["forwards"] == [result["steps"] - 1, 0], result  # skipping runs no draft forward at all
        assert result["same_parents"] and result["same_index"], result
        assert result["same_shape"] and result["same_dtype"] and result["no_probs"], result
        assert result["every_slot_holds_the_first_token"] and result["drafted_slots_differ"], result
