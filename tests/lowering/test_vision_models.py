"""Vision models that no exporter lowered: ``torchvision.ops.roi_align`` and timm's NesT, Twins
and Hiera, exported as users do, lowered, and run in onnxruntime against eager PyTorch.

torchvision's C++ ops come from the test-local stand-in (``tests/torchvision_ops.py``, hooked
by ``tests/conftest.py``) where the installed wheel's do not load; its ``roi_align`` kernel is the
C++ kernel's arithmetic.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

import irkit
from irkit.errors import LoweringError
from tests import helpers

torchvision = pytest.importorskip("torchvision")
pytestmark = pytest.mark.slow


class RoiAlign(torch.nn.Module):
    def __init__(self, sampling_ratio: int, aligned: bool):
        super().__init__()
        self.sampling_ratio, self.aligned = sampling_ratio, aligned

    def forward(self, features, boxes):
        return torchvision.ops.roi_align(
            features, boxes, (3, 2), 0.5, self.sampling_ratio, self.aligned
        )


def _boxes(n: int, seed: int) -> torch.Tensor:
    """``(n, 5)``: batch index, then x1, y1, x2, y2 on a 20×20 image (some partly outside)."""
    g = torch.Generator().manual_seed(seed)
    start = torch.rand(n, 2, generator=g) * 24 - 4
    size = torch.rand(n, 2, generator=g) * 12
    index = torch.randint(0, 2, (n, 1), generator=g).float()
    return torch.cat([index, start, start + size], dim=1)


@pytest.mark.parametrize("aligned", [True, False], ids=["aligned", "legacy"])
@pytest.mark.parametrize("sampling_ratio", [-1, 2], ids=["adaptive", "sr2"])
def test_roi_align_matches_eager_for_any_number_of_boxes(sampling_ratio, aligned, recwarn):
    module = RoiAlign(sampling_ratio, aligned)
    features = torch.randn(2, 3, 10, 10, generator=torch.Generator().manual_seed(0))
    boxes = torch.export.Dim("boxes", min=2, max=64)
    ep = torch.export.export(module, (features, _boxes(6, 1)), dynamic_shapes=(None, {0: boxes}))
    model = irkit.lower(ep)
    assert helpers.op_histogram(model.graph).get("RoiAlign") == 1
    # torchvision's default sampling_ratio=-1 is ONNX's adaptive 0: nothing to warn about.
    assert not [w for w in recwarn if "sampling_ratio" in str(w.message)]
    # onnxruntime has no RoiAlign kernel at opset 22 and later: the default opset is lowered.
    assert model.opset_imports[""] == 21
    for n, seed in ((6, 1), (11, 2)):
        b = _boxes(n, seed)
        (actual,) = helpers.run_ort(model, [features.numpy(), b.numpy()])
        np.testing.assert_allclose(actual, module(features, b).numpy(), atol=1e-5, rtol=1e-5)


def test_roi_align_at_an_opset_onnxruntime_cannot_run_is_refused():
    ep = torch.export.export(RoiAlign(2, True), (torch.randn(1, 3, 10, 10), _boxes(3, 0)))
    with pytest.raises(LoweringError, match="no kernel for RoiAlign at opset 23"):
        irkit.lower(ep, opset=23)


# --- timm: attention over (B, T, H, N, D) blocks (NesT, Twins) and Hiera's mask units ----------

# Each model's own configuration with one block per stage (every block type, every stage
# transition; the full depths lower and match too: docs/conformance_zoo.md) and 64×64 images.
# nest_tiny fixes its depths, so NesT is built from its class with nest_tiny's widths.
IMAGE = 64
TIMM_MODELS = ("nest_tiny", "twins_svt_small", "hiera_tiny_224")


def _create(name: str) -> torch.nn.Module:
    timm = pytest.importorskip("timm")
    # num_classes=0: the pooled features (a fresh classifier head is near zero).
    common = {"num_classes": 0, "img_size": IMAGE}
    if name == "nest_tiny":
        from timm.models.nest import Nest

        return Nest(embed_dims=(96, 192, 384), num_heads=(3, 6, 12), depths=(1, 1, 1), **common)
    depth = {
        "twins_svt_small": {"depths": (1, 1, 1, 1)},
        "hiera_tiny_224": {"stages": (1, 1, 1, 1)},
    }
    return timm.create_model(name, pretrained=False, **common, **depth[name])


@functools.cache
def _timm(name: str) -> tuple[torch.nn.Module, torch.export.ExportedProgram]:
    torch.manual_seed(0)
    module = _create(name).eval()
    x = torch.randn(2, 3, IMAGE, IMAGE)
    batch = torch.export.Dim("batch", max=16)
    return module, torch.export.export(module, (x,), dynamic_shapes=({0: batch},))


@pytest.mark.parametrize("name", TIMM_MODELS)
def test_timm_model_lowers_and_matches_eager_at_two_batch_sizes(name):
    module, ep = _timm(name)
    model = irkit.lower(ep)
    session = helpers.ort_session(model)
    (input_name,) = [i.name for i in session.get_inputs()]
    for batch in (2, 3):
        x = torch.randn(batch, 3, IMAGE, IMAGE, generator=torch.Generator().manual_seed(batch))
        (actual,) = session.run(None, {input_name: x.numpy()})
        with torch.no_grad():
            expected = module(x).numpy()
        assert np.abs(expected).max() > 0.1  # real features, not a vanishing head
        np.testing.assert_allclose(actual, expected, atol=1e-4, rtol=1e-4)
