"""torch ↔ onnx-ir types: dtypes, (symbolic) shapes, and zero-copy tensor wrapping."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx_ir as ir
import sympy
import torch

from irkit.errors import LoweringOptionsError
from irkit.weights import WeightlessTensor

__all__ = ["DTYPES", "onnx_dtype", "SymbolNames", "has_no_data", "torch_tensor_to_ir"]

DTYPES: Mapping[torch.dtype, ir.DataType] = {
    torch.float32: ir.DataType.FLOAT,
    torch.float64: ir.DataType.DOUBLE,
    torch.float16: ir.DataType.FLOAT16,
    torch.bfloat16: ir.DataType.BFLOAT16,
    torch.int8: ir.DataType.INT8,
    torch.int16: ir.DataType.INT16,
    torch.int32: ir.DataType.INT32,
    torch.int64: ir.DataType.INT64,
    torch.uint8: ir.DataType.UINT8,
    torch.uint16: ir.DataType.UINT16,
    torch.uint32: ir.DataType.UINT32,
    torch.uint64: ir.DataType.UINT64,
    torch.bool: ir.DataType.BOOL,
    torch.complex64: ir.DataType.COMPLEX64,
    torch.complex128: ir.DataType.COMPLEX128,
    torch.float8_e4m3fn: ir.DataType.FLOAT8E4M3FN,
    torch.float8_e4m3fnuz: ir.DataType.FLOAT8E4M3FNUZ,
    torch.float8_e5m2: ir.DataType.FLOAT8E5M2,
    torch.float8_e5m2fnuz: ir.DataType.FLOAT8E5M2FNUZ,
}

# dtypes numpy cannot hold natively: reinterpret the storage as an unsigned int of equal width.
_BITCAST: Mapping[torch.dtype, torch.dtype] = {
    torch.bfloat16: torch.uint16,
    torch.float8_e4m3fn: torch.uint8,
    torch.float8_e4m3fnuz: torch.uint8,
    torch.float8_e5m2: torch.uint8,
    torch.float8_e5m2fnuz: torch.uint8,
}


def onnx_dtype(dtype: torch.dtype) -> ir.DataType:
    """The ONNX dtype of a torch dtype; raises ``KeyError`` for unsupported ones."""
    return DTYPES[dtype]


class SymbolNames:
    """Names symbolic dims after the user's ``torch.export.Dim`` names.

    torch names shape symbols ``s77``; the user wrote ``Dim("batch")``. The shape environment
    remembers which input dim each symbol came from and the Dim's name; this class maps the
    former to the latter and renders derived expressions (``2*s77``) with them (``2*batch``).
    """

    def __init__(
        self,
        exported_program: torch.export.ExportedProgram,
        dim_names: Mapping[str, str] | None = None,
    ):
        self._names: dict[sympy.Symbol, sympy.Symbol] = {}
        self._cache: dict[str, str] = {}
        shape_env = _find_shape_env(exported_program)
        if shape_env is not None:
            debug_names: Mapping[str, str] = getattr(shape_env, "source_name_to_debug_name", {})
            for source, symbol in getattr(shape_env, "source_to_var", {}).items():
                name = debug_names.get(source)
                if name and isinstance(symbol, sympy.Symbol):
                    self._names[symbol] = _dim_symbol(name)
        if dim_names:
            self._names.update(_given_names(exported_program, dim_names))
            _check_distinct(exported_program, self._names)

    def dim(self, size: int | torch.SymInt) -> int | str:
        """An ONNX dim: an int for static sizes, a dim_param name for symbolic ones."""
        if isinstance(size, int):
            return size
        expr = size.node.expr
        if isinstance(expr, sympy.Integer):
            return int(expr)
        key = str(expr)
        name = self._cache.get(key)
        if name is None:
            name = str(expr.xreplace(self._names)) if self._names else key
            self._cache[key] = name
        return name

    def shape(self, sizes: torch.Size | tuple[int | torch.SymInt, ...]) -> ir.Shape:
        return ir.Shape([self.dim(s) for s in sizes])


def _dim_symbol(name: str) -> sympy.Symbol:
    return sympy.Symbol(name, integer=True, positive=True)


def _given_names(
    ep: torch.export.ExportedProgram, dim_names: Mapping[str, str]
) -> dict[sympy.Symbol, sympy.Symbol]:
    """``dim_names`` (torch symbol → name) checked against the program's symbols."""
    symbols = {str(s): s for s in ep.range_constraints if isinstance(s, sympy.Symbol)}
    known = ", ".join(sorted(symbols)) or "none: every dim is static"
    names: dict[sympy.Symbol, sympy.Symbol] = {}
    for key, name in dim_names.items():
        if key not in symbols:
            raise LoweringOptionsError(
                f"dim_names: the program has no symbolic dim {key!r}; its symbols: {known}"
            )
        if not (isinstance(name, str) and name.isidentifier()):
            raise LoweringOptionsError(
                f"dim_names[{key!r}] = {name!r}: a dim name is an identifier (like 'batch')"
            )
        names[symbols[key]] = _dim_symbol(name)
    return names


def _check_distinct(
    ep: torch.export.ExportedProgram, names: Mapping[sympy.Symbol, sympy.Symbol]
) -> None:
    """Two symbols the program does not know equal must not get one name."""
    taken: dict[str, str] = {}
    for symbol in sorted((s for s in ep.range_constraints if isinstance(s, sympy.Symbol)), key=str):
        name = str(names.get(symbol, symbol))
        if name in taken:
            raise LoweringOptionsError(
                f"dim_names: {taken[name]!r} and {str(symbol)!r} would both be named {name!r}, "
                "but the program does not know them equal; give each its own name"
            )
        taken[name] = str(symbol)


def _find_shape_env(ep: torch.export.ExportedProgram) -> Any:
    for node in ep.graph.nodes:
        if node.op != "placeholder":
            continue
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor):
            for size in val.shape:
                if isinstance(size, torch.SymInt):
                    return size.node.shape_env
    return None


def has_no_data(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` is a ``meta`` tensor or a ``FakeTensor`` (dtype and shape, no data)."""
    return tensor.device.type == "meta" or isinstance(tensor, torch._subclasses.FakeTensor)


def torch_tensor_to_ir(tensor: torch.Tensor, name: str) -> ir.Tensor[Any] | WeightlessTensor:
    """Wrap a real torch tensor as an ``ir.Tensor`` *without copying* its data.

    The numpy array shares the tensor's storage (contiguous CPU tensors); dtypes numpy lacks are
    reinterpreted bitwise through an unsigned view of the same storage. A ``meta`` or fake
    tensor becomes a :class:`~irkit._weights.WeightlessTensor` of the same dtype and shape.
    """
    if has_no_data(tensor):
        shape = list(tensor.shape) + ([2] if tensor.dtype.is_complex else [])
        real = tensor.dtype.to_real() if tensor.dtype.is_complex else tensor.dtype
        return WeightlessTensor(onnx_dtype(real), [int(d) for d in shape], name=name)
    tensor = tensor.detach()
    if tensor.device.type != "cpu":
        tensor = tensor.cpu()
    if tensor.dtype.is_complex:
        tensor = torch.view_as_real(tensor)  # torchlib's representation of complex tensors
    dtype = onnx_dtype(tensor.dtype)
    bitcast = _BITCAST.get(tensor.dtype)
    if bitcast is not None:
        array = tensor.view(bitcast).numpy().view(dtype.numpy())
    else:
        array = tensor.numpy()
    if not array.flags.c_contiguous:
        array = np.ascontiguousarray(array)
    return ir.Tensor(array, dtype=dtype, name=name)
