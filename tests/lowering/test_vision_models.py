"""Vision models that no exporter lowered: torchvision's ``roi_align`` op and timm's NesT, Twins
and Hiera, exported as users do, lowered, and run in onnxruntime against eager PyTorch.

``torchvision::roi_align`` is torchvision's own where torchvision is installed (one whose C++ ops
do not load fails here, as it fails every ``import transformers``); where it is not (the test
setup installs none: the registry's torchvision beside the CPU torch is a CUDA build whose ops do
not load), this module defines the op under torchvision's schema with the C++ CPU kernel's
arithmetic, so irkit's lowering of it is tested either way. timm needs torchvision: its models
run where a loadable timm is installed.
"""

from __future__ import annotations

import functools
import importlib.util
import math

import numpy as np
import pytest
import torch

import irkit
from irkit.errors import LoweringError
from tests import helpers

pytestmark = pytest.mark.slow

# torchvision 0.28's schema (torchvision/csrc/ops/roi_align.cpp).
_ROI_ALIGN_SCHEMA = (
    "roi_align(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, "
    "SymInt pooled_width, int sampling_ratio, bool aligned) -> Tensor"
)


def _bilinear(image: torch.Tensor, y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``image`` ``(C, H, W)`` sampled at every ``(y[i], x[j])``: ``(C, len(y), len(x))``.

    torchvision's C++ rule: a sample beyond one pixel outside the map is 0; otherwise
    coordinates are clamped at 0 and at the last row/column.
    """
    _, height, width = image.shape
    y_ok = (y >= -1.0) & (y <= height)
    x_ok = (x >= -1.0) & (x <= width)
    y, x = y.clamp(min=0), x.clamp(min=0)
    y_low, x_low = y.floor().long(), x.floor().long()
    y_edge, x_edge = y_low >= height - 1, x_low >= width - 1
    y_low, x_low = y_low.clamp(max=height - 1), x_low.clamp(max=width - 1)
    y_high = torch.where(y_edge, y_low, y_low + 1)
    x_high = torch.where(x_edge, x_low, x_low + 1)
    ly = torch.where(y_edge, torch.zeros_like(y), y - y_low)
    lx = torch.where(x_edge, torch.zeros_like(x), x - x_low)
    hy, hx = 1 - ly, 1 - lx

    def at(rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
        return image[:, rows[:, None], cols[None, :]]

    value = (
        (hy[:, None] * hx[None, :]) * at(y_low, x_low)
        + (hy[:, None] * lx[None, :]) * at(y_low, x_high)
        + (ly[:, None] * hx[None, :]) * at(y_high, x_low)
        + (ly[:, None] * lx[None, :]) * at(y_high, x_high)
    )
    return value * (y_ok[:, None] & x_ok[None, :])


def _roi_align_kernel(
    input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned
):
    """RoIAlign (average) as torchvision's C++ CPU kernel computes it, one box at a time.

    A sample more than one pixel outside the map counts as 0 (torchvision's Python
    ``_roi_align`` misses that, and differs by up to 0.3 there).
    """
    offset = 0.5 if aligned else 0.0
    out = input.new_zeros((rois.shape[0], input.shape[1], pooled_height, pooled_width))
    for k, (index, x1, y1, x2, y2) in enumerate(rois.tolist()):
        start_w, start_h = x1 * spatial_scale - offset, y1 * spatial_scale - offset
        width = x2 * spatial_scale - offset - start_w
        height = y2 * spatial_scale - offset - start_h
        if not aligned:  # the legacy form: boxes at least one pixel
            width, height = max(width, 1.0), max(height, 1.0)
        bin_h, bin_w = height / pooled_height, width / pooled_width
        grid_h = sampling_ratio if sampling_ratio > 0 else math.ceil(height / pooled_height)
        grid_w = sampling_ratio if sampling_ratio > 0 else math.ceil(width / pooled_width)
        if grid_h <= 0 or grid_w <= 0:
            continue
        iy = (torch.arange(grid_h, dtype=torch.float64) + 0.5) * bin_h / grid_h
        ix = (torch.arange(grid_w, dtype=torch.float64) + 0.5) * bin_w / grid_w
        ph = torch.arange(pooled_height, dtype=torch.float64) * bin_h
        pw = torch.arange(pooled_width, dtype=torch.float64) * bin_w
        y = (start_h + ph[:, None] + iy[None, :]).reshape(-1).to(input.dtype)
        x = (start_w + pw[:, None] + ix[None, :]).reshape(-1).to(input.dtype)
        samples = _bilinear(input[int(index)], y, x)  # (C, PH·gh, PW·gw)
        samples = samples.reshape(-1, pooled_height, grid_h, pooled_width, grid_w)
        out[k] = samples.sum((2, 4)) / (grid_h * grid_w)
    return out


def _roi_align_fake(
    input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned
):
    return input.new_empty((rois.shape[0], input.shape[1], pooled_height, pooled_width))


@functools.cache
def _own_library() -> torch.library.Library:
    """``torchvision::roi_align`` defined here (the library is kept alive for the process)."""
    library = torch.library.Library("torchvision", "DEF")
    library.define(_ROI_ALIGN_SCHEMA)
    library.impl("roi_align", _roi_align_kernel, "CPU")
    library.impl("roi_align", _roi_align_fake, "Meta")
    return library


def _roi_align_op():
    """``torch.ops.torchvision.roi_align``: torchvision's, or this module's where none is installed."""
    if importlib.util.find_spec("torchvision") is not None:
        import torchvision  # noqa: F401  (registers its ops; one that cannot load fails here)
    else:
        _own_library()
    return torch.ops.torchvision.roi_align


class RoiAlign(torch.nn.Module):
    def __init__(self, sampling_ratio: int, aligned: bool):
        super().__init__()
        self.sampling_ratio, self.aligned = sampling_ratio, aligned
        self.op = _roi_align_op()

    def forward(self, features, boxes):
        return self.op(features, boxes, 0.5, 3, 2, self.sampling_ratio, self.aligned)


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
