"""Deprecated: dynamic int8 is ``irkit.quantize(model, bits=8, activations="dynamic")``.

:func:`quantize_dynamic` is kept as a thin alias of it (with a :class:`DeprecationWarning`); its
report is a :class:`~irkit.rules.quantize.QuantizeReport`, and weights that are inputs of
deduplicated function bodies are now quantized as function inputs instead of skipped.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import onnx_ir as ir

from irkit.errors import QuantizationError
from irkit.rules.quantize import Activations, QuantizeReport, quantize
from irkit.weights.packing import quantize_columns_int8

__all__ = ["DynamicQuantizeReport", "quantize_dynamic", "quantize_weight"]

DynamicQuantizeReport = QuantizeReport
"""Deprecated name of :class:`~irkit.rules.quantize.QuantizeReport`."""


def quantize_weight(
    w: npt.ArrayLike, reduce_range: bool = True
) -> tuple[npt.NDArray[np.int8], npt.NDArray[np.float32]]:
    """Deprecated: :func:`irkit.weights.packing.quantize_columns_int8`."""
    return quantize_columns_int8(w, reduce_range=reduce_range)


def quantize_dynamic(
    model: ir.Model,
    *,
    exclude: Sequence[str] = (),
    reduce_range: bool = True,
    report: QuantizeReport | None = None,
) -> ir.Model:
    """Deprecated: ``irkit.quantize(model, bits=8, activations="dynamic", exclude=exclude)``
    (``activations="dynamic-full-range"`` when ``reduce_range`` is false).

    Raises:
        QuantizationError: ``exclude`` is one string (give a sequence of names).
    """
    warnings.warn(
        "irkit.rules.quantize_dynamic.quantize_dynamic is deprecated: use "
        "irkit.quantize(model, bits=8, activations='dynamic')",
        DeprecationWarning,
        stacklevel=2,
    )
    if isinstance(exclude, str):
        raise QuantizationError(
            f"quantize_dynamic: exclude={exclude!r} is one string; pass a list of node names"
        )
    mode = Activations.DYNAMIC if reduce_range else Activations.DYNAMIC_FULL_RANGE
    return quantize(model, bits=8, activations=mode, exclude=list(exclude), report=report)
