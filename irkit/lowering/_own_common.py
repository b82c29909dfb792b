"""Small constants the own-lowering modules (``_own_*.py``) build their graphs from."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnxscript import opset18 as op

__all__ = ["ints", "extreme", "INT64"]

INT64 = ir.DataType.INT64
"""The index dtype (``int(INT64)`` where an op attribute wants the number)."""


def ints(*values: int) -> ir.Value:
    """A 1-D int64 ``Constant`` (axes, shapes, slice bounds)."""
    return op.Constant(value=ir.tensor(list(values), dtype=ir.DataType.INT64))


def extreme(dtype: ir.DataType, largest: bool) -> np.generic:
    """The value no element of ``dtype`` beats: −∞ (the smallest int) when looking for the
    largest, +∞ (the largest int) when looking for the smallest."""
    np_dtype = dtype.numpy()
    if np.issubdtype(np_dtype, np.floating):
        return np_dtype.type(-np.inf if largest else np.inf)
    info = np.iinfo(np_dtype)
    return np_dtype.type(info.min if largest else info.max)
