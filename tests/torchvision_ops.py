"""A test-local stand-in for torchvision's C++ op library (``torchvision::*``).

The only torchvision wheel the registry offers beside ``torch==2.13.0+cpu`` is a CUDA build whose
``_C`` extension does not load ("operator torchvision::nms does not exist" on ``import
torchvision``; timm and transformers import torchvision, so they fail too). :func:`install`
makes torchvision importable and its ops usable here: if, and only if, loading torchvision's
``_C`` fails, the library is defined from Python instead — torchvision's own schemas (its
``csrc/ops/*.cpp`` ``TORCH_LIBRARY_FRAGMENT`` definitions), with plain-PyTorch CPU kernels for
``nms`` and ``roi_align`` (the C++ kernel's arithmetic: a sample more than one pixel outside the
map counts as 0, which torchvision's own Python ``_roi_align`` misses) — and torchvision's Python code then registers its own fake (meta)
kernels, autograd and autocast wrappers on them as it does on the C++ ops. Ops without a kernel
here raise torch's ``NotImplementedError`` when called (exporting them still works: the fake
kernels are torchvision's).

``tests/conftest.py`` calls :func:`install` (cheap: it only hooks the first ``import
torchvision``), so every test sees the same torchvision; irkit never imports torchvision.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import math
import os
import sys

import torch

__all__ = ["install", "fall_back_on_failure"]

# torchvision 0.28's schemas (torchvision/csrc/ops/*.cpp and vision.cpp).
_SCHEMAS = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "roi_align(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, "
    "SymInt pooled_width, int sampling_ratio, bool aligned) -> Tensor",
    "_roi_align_backward(Tensor grad, Tensor rois, float spatial_scale, SymInt pooled_height, "
    "SymInt pooled_width, SymInt batch_size, SymInt channels, SymInt height, SymInt width, "
    "int sampling_ratio, bool aligned) -> Tensor",
    "qroi_align(Tensor input, Tensor rois, float input_scale, int input_zero_point, "
    "float rois_scale, int rois_zero_point, float spatial_scale, SymInt pooled_height, "
    "SymInt pooled_width, int sampling_ratio, bool aligned) -> Tensor",
    "roi_pool(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, "
    "SymInt pooled_width) -> (Tensor, Tensor)",
    "_roi_pool_backward(Tensor grad, Tensor rois, Tensor argmax, float spatial_scale, "
    "SymInt pooled_height, SymInt pooled_width, SymInt batch_size, SymInt channels, "
    "SymInt height, SymInt width) -> Tensor",
    "ps_roi_align(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, "
    "SymInt pooled_width, int sampling_ratio) -> (Tensor, Tensor)",
    "_ps_roi_align_backward(Tensor grad, Tensor rois, Tensor channel_mapping, "
    "float spatial_scale, SymInt pooled_height, SymInt pooled_width, int sampling_ratio, "
    "SymInt batch_size, SymInt channels, SymInt height, SymInt width) -> Tensor",
    "ps_roi_pool(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, "
    "SymInt pooled_width) -> (Tensor, Tensor)",
    "_ps_roi_pool_backward(Tensor grad, Tensor rois, Tensor channel_mapping, "
    "float spatial_scale, SymInt pooled_height, SymInt pooled_width, SymInt batch_size, "
    "SymInt channels, SymInt height, SymInt width) -> Tensor",
    "deform_conv2d(Tensor input, Tensor weight, Tensor offset, Tensor mask, Tensor bias, "
    "SymInt stride_h, SymInt stride_w, SymInt pad_h, SymInt pad_w, SymInt dilation_h, "
    "SymInt dilation_w, SymInt groups, SymInt offset_groups, bool use_mask) -> Tensor",
    "_deform_conv2d_backward(Tensor grad, Tensor input, Tensor weight, Tensor offset, "
    "Tensor mask, Tensor bias, SymInt stride_h, SymInt stride_w, SymInt pad_h, SymInt pad_w, "
    "SymInt dilation_h, SymInt dilation_w, SymInt groups, SymInt offset_groups, "
    "bool use_mask) -> (Tensor, Tensor, Tensor, Tensor, Tensor)",
    "box_iou_rotated(Tensor boxes1, Tensor boxes2) -> Tensor",
    "_cuda_version() -> int",
)


def _nms(dets: torch.Tensor, scores: torch.Tensor, iou_threshold: float) -> torch.Tensor:
    """Greedy non-maximum suppression: the kept boxes' indices, by decreasing score."""
    order = scores.argsort(descending=True, stable=True)
    x1, y1, x2, y2 = dets.unbind(1)
    areas = (x2 - x1) * (y2 - y1)
    suppressed = torch.zeros(len(dets), dtype=torch.bool)
    keep = []
    for i in order.tolist():
        if suppressed[i]:
            continue
        keep.append(i)
        w = (torch.minimum(x2[i], x2) - torch.maximum(x1[i], x1)).clamp(min=0)
        h = (torch.minimum(y2[i], y2) - torch.maximum(y1[i], y1)).clamp(min=0)
        inter = w * h
        suppressed |= inter / (areas[i] + areas - inter) > iou_threshold
    return torch.tensor(keep, dtype=torch.int64)


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


def _roi_align(
    input: torch.Tensor,
    rois: torch.Tensor,
    spatial_scale: float,
    pooled_height: int,
    pooled_width: int,
    sampling_ratio: int,
    aligned: bool,
) -> torch.Tensor:
    """RoIAlign (average) as torchvision's C++ CPU kernel computes it, one box at a time."""
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


@functools.cache
def _library() -> torch.library.Library:
    """The ``torchvision`` library defined from Python (kept alive for the process)."""
    lib = torch.library.Library("torchvision", "DEF")
    for schema in _SCHEMAS:
        lib.define(schema)
    lib.impl("nms", _nms, "CPU")
    lib.impl("roi_align", _roi_align, "CPU")
    lib.impl("_cuda_version", lambda: -1, "CompositeExplicitAutograd")
    return lib


def fall_back_on_failure(package_dir: str) -> None:
    """From now on, a failure to load torchvision's ``_C`` defines the ops from Python instead."""
    real = torch.ops.load_library

    def load_library(path: str) -> None:
        try:
            real(path)
        except OSError:
            name = os.path.basename(str(path))
            if os.path.dirname(os.path.abspath(path)) != package_dir or not name.startswith("_C"):
                raise
            _library()

    torch.ops.load_library = load_library


class _BeforeTorchvision(importlib.abc.MetaPathFinder):
    """Runs once, when ``torchvision`` is first imported, before any of its code."""

    def __init__(self, package_dir: str):
        self._package_dir: str | None = package_dir

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name == "torchvision" and self._package_dir is not None:
            fall_back_on_failure(self._package_dir)
            self._package_dir = None  # once (the finder stays: the import is iterating the list)
        return None  # the ordinary finders import it


def install() -> None:
    """Let torchvision import with this library standing in for C++ ops that fail to load.

    Cheap: nothing is imported until something imports torchvision. A no-op when torchvision
    is already imported or not installed.
    """
    if "torchvision" in sys.modules or any(
        isinstance(f, _BeforeTorchvision) for f in sys.meta_path
    ):
        return
    spec = importlib.util.find_spec("torchvision")
    if spec is None or spec.origin is None:
        return
    sys.meta_path.insert(0, _BeforeTorchvision(os.path.dirname(os.path.abspath(spec.origin))))
