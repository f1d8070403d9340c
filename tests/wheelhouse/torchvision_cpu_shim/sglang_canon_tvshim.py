"""Test-node only: let PyPI's CUDA build of torchvision import beside a CPU-only torch.

torchvision 0.28.0 from PyPI is built against CUDA torch; beside the CPU build of torch 2.13.0
its C++ ops (_C.so) cannot load, which torchvision tolerates -- except in
torchvision/_meta_registrations.py, where two ``torch.library.register_fake`` calls
(torchvision::nms, torchvision::qnms) are not guarded by ``torchvision.extension._has_ops()``
and raise "operator torchvision::nms does not exist". SGLang imports torchvision
unconditionally, so its argument parser could not be imported at all.

This module is loaded by a .pth file at interpreter start-up and does nothing but add a
meta-path hook. Only when ``torchvision._meta_registrations`` is about to be imported AND
torchvision's own ops did not load, it declares the schemas of those two operators (no kernels:
calling them still fails, as it would without the shim). With working ops (a GPU stack) it
does nothing. Never install it on a real node: it exists only in the test wheelhouse.
"""

import importlib.abc
import sys

_TARGET = "torchvision._meta_registrations"
_SCHEMAS = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
)
_LIBS = []  # keeps the torch.library fragment (and so the schemas) alive


class _DeclareMissingTorchvisionOps(importlib.abc.MetaPathFinder):
    """Declares torchvision's unguarded op schemas right before they are needed."""

    def find_spec(self, fullname, path=None, target=None):  # noqa: D102
        if fullname != _TARGET:
            return None
        sys.meta_path.remove(self)
        import torch  # noqa: PLC0415  (only once torchvision is being imported)
        import torchvision.extension  # noqa: PLC0415

        if not torchvision.extension._has_ops():  # pylint: disable=protected-access
            lib = torch.library.Library("torchvision", "FRAGMENT")
            for schema in _SCHEMAS:
                lib.define(schema)
            _LIBS.append(lib)
        return None  # let the normal finders import the real module


if not any(isinstance(f, _DeclareMissingTorchvisionOps) for f in sys.meta_path):
    sys.meta_path.insert(0, _DeclareMissingTorchvisionOps())
