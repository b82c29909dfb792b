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
from collections.abc import Iterator, MutableMapping, Sequence
from typing import Any, NoReturn

import numpy as np
import onnx
import onnx_ir as ir

from irkit.errors import WeightsError

__all__ = [
    "WeightlessTensor",
    "WEIGHTLESS_KEY",
    "is_weightless",
    "weightless_initializers",
    "hide_weightless",
    "weightless_marker",
    "from_marker",
]

logger = logging.getLogger(__name__)

WEIGHTLESS_KEY = "irkit.weightless"
"""``metadata_props`` key of an initializer saved without its data (the ``TensorProto`` holds
dims and dtype only). :func:`irkit.load` recognizes it."""


class WeightlessTensor:
    """A tensor with a name, dtype and shape and no data (onnx-ir's ``TensorProtocol``).

    Reading the data (``numpy()``, ``tobytes()``, ``__array__``, DLPack, ``tofile``) raises
    :class:`~irkit.errors.WeightsError` naming the tensor and saying how to supply the weights.

    Args:
        dtype: The element type.
        shape: The shape (static).
        name: The initializer's name (the parameter's or buffer's fully qualified name).
        aliases: Other names of the same tensor (tied weights), tried when looking it up in a
            checkpoint.

    Example:
        >>> import onnx_ir as ir
        >>> t = WeightlessTensor(ir.DataType.FLOAT, ir.Shape([4, 2]), name="fc.weight")
        >>> t.nbytes, isinstance(t, ir.Tensor)
        (32, False)
        >>> t.numpy()
        Traceback (most recent call last):
        ...
        irkit.errors.WeightsError: initializer 'fc.weight' (FLOAT[4,2]) has no data: ...
    """

    __slots__ = ("_dtype", "_shape", "name", "aliases", "doc_string", "_metadata_props", "_meta")

    def __init__(
        self,
        dtype: ir.DataType,
        shape: ir.Shape | Sequence[int],
        *,
        name: str | None = None,
        aliases: Sequence[str] = (),
        doc_string: str | None = None,
    ) -> None:
        self._dtype = dtype
        shape = shape if isinstance(shape, ir.Shape) else ir.Shape(shape)
        shape.freeze()
        self._shape = shape
        self.name = name
        self.aliases = list(aliases)
        self.doc_string = doc_string
        self._metadata_props: dict[str, str] | None = None
        self._meta: MutableMapping[str, Any] | None = None

    @property
    def dtype(self) -> ir.DataType:
        """The element type."""
        return self._dtype

    @property
    def shape(self) -> ir.Shape:
        """The (frozen) shape."""
        return self._shape

    @property
    def raw(self) -> None:
        """No backing data: always ``None``."""
        return None

    @property
    def metadata_props(self) -> dict[str, str]:
        """Serialized metadata (kept for the protocol; irkit writes none here)."""
        if self._metadata_props is None:
            self._metadata_props = {}
        return self._metadata_props

    @property
    def meta(self) -> MutableMapping[str, Any]:
        """Pass-local metadata (the protocol's ``meta``)."""
        if self._meta is None:
            self._meta = {}
        return self._meta

    @property
    def size(self) -> int:
        """The number of elements."""
        return int(np.prod(self._shape.numpy(), dtype=np.int64))

    @property
    def nbytes(self) -> int:
        """The number of bytes the data will take (``ceil`` for sub-byte types)."""
        return (self.size * self._dtype.bitwidth + 7) // 8

    def _no_data(self) -> NoReturn:
        raise WeightsError(
            f"initializer {self.name!r} ({self._dtype.name}{list(self._shape.numpy())}) has no "
            "data: the model was lowered from a program on the meta device (or saved without "
            "weights). Fix: pass the weights when saving, irkit.save(model, path, "
            "weights=<state_dict | model.safetensors | save_pretrained folder>)."
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
        return f"WeightlessTensor<{self._dtype.name},{self._shape}>(name={self.name!r})"


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


def weightless_marker(tensor: WeightlessTensor, name: str) -> ir.TensorProtocol:
    """What a weightless initializer is saved as: a ``TensorProto`` with dims, dtype and the
    :data:`WEIGHTLESS_KEY` metadata, and no data (``onnx.checker`` and runtimes refuse it)."""
    proto = onnx.TensorProto()
    proto.name = name
    proto.data_type = tensor.dtype.value
    proto.dims.extend(int(d) for d in tensor.shape.numpy())
    marker = ir.serde.TensorProtoTensor(proto)
    marker.metadata_props[WEIGHTLESS_KEY] = "no data: save with irkit.save(..., weights=...)"
    return marker


def from_marker(tensor: ir.TensorProtocol | None) -> WeightlessTensor | None:
    """The :class:`WeightlessTensor` a loaded initializer stands for, if it was saved weightless."""
    if tensor is None or WEIGHTLESS_KEY not in tensor.metadata_props:
        return None
    return WeightlessTensor(tensor.dtype, ir.Shape(tensor.shape.numpy()), name=tensor.name)
