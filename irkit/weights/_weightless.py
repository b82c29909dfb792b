"""Weightless initializers: tensors that know their name, dtype and shape but carry no data.

:func:`irkit.lower` makes one for each parameter, buffer or constant of a program captured on the
``meta`` device (or under a ``FakeTensorMode``). The data comes later, streamed from a checkpoint
by :func:`irkit.save` (``weights=``). Until then nothing may read it: :class:`WeightlessTensor`
implements onnx-ir's ``TensorProtocol`` for metadata only, and raises :class:`WeightsError` on
every data access. It is deliberately *not* an ``onnx_ir.Tensor``, so that a rule can tell it from
a tensor whose values it may use (``isinstance(value.const_value, ir.Tensor)``).

This module imports no torch.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
from typing import Any, NoReturn

import numpy as np
import onnx
import onnx_ir as ir

from irkit.errors import WeightsError
from irkit.metadata import WEIGHTLESS_KEY

__all__ = [
    "WeightlessTensor",
    "is_weightless",
    "weightless_initializers",
    "hide_weightless",
]

logger = logging.getLogger(__name__)


class WeightlessTensor(ir.serde.TensorProtoTensor):
    """A tensor with a name, dtype and shape and no data (onnx-ir's ``TensorProtocol``).

    Reading the data (``numpy()``, ``tobytes()``, ``__array__``, DLPack, ``tofile``) raises
    :class:`~irkit.errors.WeightsError` naming the tensor and saying how to supply the weights.
    It is not an ``onnx_ir.Tensor``. It is backed by a ``TensorProto`` with dims and dtype only
    and the :data:`WEIGHTLESS_KEY` metadata, so it serializes without its data:
    ``onnx_ir.to_onnx_text`` and ``onnx_ir.save`` work, and the file says what it lacks
    (``onnx.checker`` and runtimes refuse it; :func:`irkit.load` explains).

    Args:
        dtype: The element type.
        shape: The shape (static).
        name: The initializer's name (the parameter's or buffer's fully qualified name).
        aliases: Other names of the same tensor (tied weights), tried when looking it up in a
            checkpoint.

    Example:
        >>> import onnx_ir as ir
        >>> t = WeightlessTensor(ir.DataType.FLOAT, [4, 2], name="fc.weight")
        >>> t.nbytes, isinstance(t, ir.Tensor)
        (32, False)
        >>> t.numpy()
        Traceback (most recent call last):
        ...
        irkit.errors.WeightsError: initializer 'fc.weight' (FLOAT[4, 2]) has no data: ...
    """

    __slots__ = ("aliases",)

    def __init__(
        self,
        dtype: ir.DataType,
        shape: ir.Shape | Sequence[int],
        *,
        name: str | None = None,
        aliases: Sequence[str] = (),
    ) -> None:
        proto = onnx.TensorProto()
        if name:
            proto.name = name
        proto.data_type = dtype.value
        proto.dims.extend(int(d) for d in (shape.numpy() if isinstance(shape, ir.Shape) else shape))
        super().__init__(proto)
        self.metadata_props[WEIGHTLESS_KEY] = _NOTE
        self.aliases = list(aliases)

    def _no_data(self) -> NoReturn:
        raise WeightsError(
            f"initializer {self.name!r} ({self.dtype.name}{list(self.shape.numpy())}) has no "
            "data: the model was lowered from a program on the meta device (or saved without "
            "weights). Fix: pass the weights when saving, irkit.save(model, path, "
            "weights=<state_dict | model.safetensors | save_pretrained folder>).",
            [self.name or ""],
        )

    def numpy(self) -> np.ndarray:
        """Raises :class:`~irkit.errors.WeightsError`: there is no data."""
        self._no_data()

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        self._no_data()

    def __dlpack__(self, *, stream: Any = None) -> Any:
        self._no_data()

    def __dlpack_device__(self) -> Any:
        self._no_data()

    def tobytes(self) -> bytes:
        """Raises :class:`~irkit.errors.WeightsError`: there is no data."""
        self._no_data()

    def tofile(self, file: Any) -> None:
        """Raises :class:`~irkit.errors.WeightsError`: there is no data."""
        self._no_data()

    def __repr__(self) -> str:
        return f"WeightlessTensor<{self.dtype.name},{self.shape}>(name={self.name!r})"


_NOTE = "no data: save with irkit.save(..., weights=...)"


def is_weightless(tensor: object) -> bool:
    """Whether ``tensor`` is a :class:`WeightlessTensor`."""
    return isinstance(tensor, WeightlessTensor)


def weightless_initializers(model: ir.Model) -> list[ir.Value]:
    """The initializers of ``model`` (all graphs) whose tensor has no data, in graph order."""
    return [
        value
        for graph in model.graphs()
        for value in graph.initializers.values()
        if isinstance(value.const_value, WeightlessTensor)
    ]


@contextlib.contextmanager
def hide_weightless(model: ir.Model, why: str) -> Iterator[list[ir.Value]]:
    """Within the block, weightless initializers have no ``const_value``: passes that read
    constants (constant folding, initializer deduplication) treat them as unknown inputs and
    never read or write their data. Restored on exit, even on error.

    Args:
        model: The model.
        why: What runs in the block (for the log line).

    Yields:
        The hidden initializers.
    """
    hidden = weightless_initializers(model)
    tensors = [value.const_value for value in hidden]
    if hidden:
        logger.info(
            "%s: skipping %d weightless initializer(s) (no data; first: %r)",
            why,
            len(hidden),
            hidden[0].name,
        )
    for value in hidden:
        value.const_value = None
    # onnx-ir's initializer deduplication warns once per initializer without a value.
    quiet = _DropNoValueWarnings({value.name for value in hidden})
    dedupe_logger = logging.getLogger("onnx_ir.passes.common.initializer_deduplication")
    dedupe_logger.addFilter(quiet)
    try:
        yield hidden
    finally:
        dedupe_logger.removeFilter(quiet)
        for value, tensor in zip(hidden, tensors, strict=True):
            value.const_value = tensor


class _DropNoValueWarnings(logging.Filter):
    def __init__(self, names: set[str | None]) -> None:
        super().__init__()
        self.names = names

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        return not (
            "has no constant value" in str(record.msg)
            and isinstance(args, tuple)
            and any(a in self.names for a in args)
        )
