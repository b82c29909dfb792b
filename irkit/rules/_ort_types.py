"""The dtypes onnxruntime's ``com.microsoft`` CPU kernels the ``"ort"`` rules target run."""

from __future__ import annotations

import onnx_ir as ir

__all__ = ["ORT_FLOAT_TYPES"]

ORT_FLOAT_TYPES = frozenset({ir.DataType.FLOAT, ir.DataType.FLOAT16})
"""float32 and float16: the contrib attention, rotary, GELU, skip-norm and ``FusedMatMul``
kernels, and the packed ``MatMul`` that :func:`irkit.quantize` turns into ``MatMulNBits``."""
