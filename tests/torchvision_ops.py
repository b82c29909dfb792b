"""A test-local stand-in for torchvision's C++ op library (``torchvision::*``).

The only torchvision wheel the registry offers beside ``torch==2.13.0+cpu`` is a CUDA build whose
``_C`` extension does not load ("operator torchvision::nms does not exist" on ``import
torchvision``; timm and transformers import torchvision, so they fail too). :func:`install`
makes torchvision importable and its ops usable here: if, and only if, loading torchvision's
``_C`` fails, the library is defined from Python instead — torchvision's own schemas (its
``csrc/ops/*.cpp`` ``TORCH_LIBRARY_FRAGMENT`` definitions), with plain-PyTorch CPU kernels for
``nms`` and ``roi_align`` — and torchvision's Python code then registers its own fake (meta)
kernels, autograd and autocast wrappers on them as it does on the C++ ops. Ops without a kernel
here raise torch's ``NotImplementedError`` when called (exporting them still works: the fake
kernels are torchvision's).

``tests/conftest.py`` calls :func:`install` (cheap: it only hooks the first ``import
torchvision``), so every test sees the same torchvision; irkit never imports torchvision.
"""

from __future__ import annotations

import functools
import importlib
import importlib.abc
import importlib.util
import os
import sys

import torch

__all__ = ["install"]

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


def _roi_align(
    input: torch.Tensor,
    rois: torch.Tensor,
    spatial_scale: float,
    pooled_height: int,
    pooled_width: int,
    sampling_ratio: int,
    aligned: bool,
) -> torch.Tensor:
    """torchvision's own plain-PyTorch ``roi_align`` (its reference, without ``torch.compile``)."""
    module = importlib.import_module("torchvision.ops.roi_align")
    reference = module._roi_align
    reference = getattr(reference, "__wrapped__", reference)
    return reference(
        input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned
    )


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


def _fall_back_on_failure(package_dir: str) -> None:
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

    torch.ops.load_library = load_library  # type: ignore[method-assign]


class _BeforeTorchvision(importlib.abc.MetaPathFinder):
    """Runs once, when ``torchvision`` is first imported, before any of its code."""

    def __init__(self, package_dir: str):
        self._package_dir = package_dir

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name == "torchvision":
            sys.meta_path.remove(self)
            _fall_back_on_failure(self._package_dir)
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
