"""irkit's own lowerings of torchvision's ops (registered by name: torchvision is never imported).

``torchvision::roi_align`` → ONNX ``RoiAlign`` (average). The boxes tensor ``(K, 5)`` holds the
batch index in its first column and ``x1, y1, x2, y2`` in the others; ``aligned=True`` shifts the
box by half a pixel (``coordinate_transformation_mode="half_pixel"``), ``aligned=False`` is the
legacy form whose boxes are at least one pixel (``"output_half_pixel"``, as onnxruntime's kernel
and torchvision's C++ kernel both compute it); a ``sampling_ratio`` ≤ 0 means adaptive sampling
(``ceil(box size / output size)`` points per bin) in both, spelled 0 in ONNX. torchlib's lowering
computes the same but warns, for torchvision's default ``sampling_ratio=-1``, that a sampling
ratio is "not supported". onnxruntime has no ``RoiAlign`` kernel at opset 22, so a model with one
gets opset 21 (``_ORT_UNSUPPORTED_FROM`` in ``_lower.py``).
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript import opset18 as op

from irkit.lowering._own_common import ints
from irkit.lowering._registration import own

__all__: list[str] = []  # (lowerings registered with @own, collected by _own.own_lowerings)


@own("torchvision::roi_align")
def _roi_align(
    input: ir.Value,
    rois: ir.Value,
    spatial_scale: float,
    pooled_height: int,
    pooled_width: int,
    sampling_ratio: int = -1,
    aligned: bool = False,
) -> ir.Value:
    index = op.Cast(op.Gather(rois, ints(0), axis=1), to=int(ir.DataType.INT64))
    return op.RoiAlign(
        input,
        op.Slice(rois, ints(1), ints(5), ints(1)),
        op.Squeeze(index, ints(1)),
        mode="avg",
        output_height=int(pooled_height),
        output_width=int(pooled_width),
        sampling_ratio=max(int(sampling_ratio), 0),
        spatial_scale=float(spatial_scale),
        coordinate_transformation_mode="half_pixel" if aligned else "output_half_pixel",
    )
