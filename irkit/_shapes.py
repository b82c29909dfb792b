"""The shapes a model does not carry: ONNX shape inference for a whole model, and the dims of
one value derived from its producers.

Two tools, for two situations:

- :func:`infer_shapes` runs ONNX shape inference over a model that comes without shapes (other
  exporters' files), before optimizing it.
- :func:`known_dims` (and :func:`known_rank`, :func:`shape_length` where only the rank is
  known) and the helpers under it (:func:`reshape_target`, :func:`unsqueezed`,
  :func:`squeezed`, :func:`transposed`, :func:`broadcast`, :func:`output_dims`) answer for one
  value where ONNX's inference does not reach: values inside function bodies (a body's input
  shapes differ per call site) and the values torchlib's own expansions compute. Rules, viz's
  FLOP estimates and the weightless folding passes all read shapes through them, so they agree
  on what a ``Reshape`` with ``0`` and ``-1`` produces.

A dim is an ``int``, a symbol name (``"B"``) or ``None`` (unknown). This module imports no torch
and no stage.
"""

from __future__ import annotations

import collections
import logging
import math
from collections.abc import Callable, Sequence
from typing import Any

import onnx_ir as ir

from irkit._irutil import const_tensor

__all__ = [
    "Dim",
    "Dims",
    "infer_shapes",
    "unknown_shape_fraction",
    "value_dims",
    "known_dims",
    "known_rank",
    "shape_length",
    "output_dims",
    "reshape_target",
    "unsqueezed",
    "squeezed",
    "transposed",
    "broadcast",
]

Dim = int | str | None
"""One dimension: a size, a symbol name, or ``None`` (unknown)."""

Dims = tuple[Dim, ...]

logger = logging.getLogger(__name__)


def unknown_shape_fraction(model: ir.Model) -> float:
    """The fraction of the main graph's node outputs whose shape is unknown (0.0 if none);
    ``Constant`` nodes do not count (their attribute says their shape)."""
    outputs = [v for node in model.graph if node.op_type != "Constant" for v in node.outputs]
    if not outputs:
        return 0.0
    return sum(v.shape is None for v in outputs) / len(outputs)


def infer_shapes(model: ir.Model) -> None:
    """Give the main graph's values the shapes ONNX shape inference derives, **in place**.

    Exporters often write no shape for intermediate values (``torch.onnx.export`` with
    ``optimize=False`` leaves about two thirds of them unknown), and the rules whose
    preconditions are about shapes (a broadcast that changes nothing, a 2-D ``MatMul``) cannot
    fire without them; with shapes, constant folding also resolves ``Shape`` chains.

    Runs ``onnx.shape_inference.infer_shapes`` (data propagation, not strict) on a copy without
    the large initializers' data, and fills in only what the model does not know: a shape or
    type the model already has is never replaced. An op shape inference does not know keeps its
    unknown shape; a model it rejects is left unchanged (with a warning in the log).

    Example:
        >>> m = ir.from_onnx_text('''
        ...   <ir_version: 10, opset_import: ["" : 20]>
        ...   g (float[2, 3] x) => (float[2, 3] y) { t = Relu(x)  y = Neg(t) }''')
        >>> infer_shapes(m)
        >>> m.graph.node(0).outputs[0].shape
        Shape([2, 3])
    """
    import onnx

    def infer(proto: onnx.ModelProto) -> onnx.ModelProto:
        return onnx.shape_inference.infer_shapes(
            proto, check_type=False, strict_mode=False, data_prop=True
        )

    try:
        inferred = _without_large_initializers(infer, model)
    except Exception as exc:  # onnx rejects the model: optimize it as it is
        logger.warning("shape inference failed, the model keeps its shapes: %s", exc)
        return
    types = {vi.name: vi.type for vi in inferred.graph.value_info}
    types.update((vi.name, vi.type) for vi in inferred.graph.output)
    for node in model.graph:
        for value in node.outputs:
            proto_type = types.get(value.name or "")
            if proto_type is None:
                continue
            if value.shape is None:
                value.shape = ir.serde.deserialize_type_proto_for_shape(proto_type)
            if value.type is None:
                value.type = ir.serde.deserialize_type_proto_for_type(proto_type)


def _without_large_initializers(fn: Callable[[Any], Any], model: ir.Model) -> Any:
    """``fn(proto of model)``, serializing the model without its large initializers' data."""
    try:  # onnx_ir's helper (private): initializer data above 1 KB is not copied
        from onnx_ir.passes.common._c_api_utils import call_onnx_api
    except ImportError:  # pragma: no cover - a future onnx_ir without it: copy everything
        return fn(ir.serde.serialize_model(model))
    return call_onnx_api(fn, model)


# --- The dims of one value -----------------------------------------------------------------------


def value_dims(value: ir.Value | None) -> Dims | None:
    """The dims ``value``'s shape records (ints, symbol names, ``None``), or ``None`` if it has
    no shape.

    Example:
        >>> value_dims(ir.val("x", ir.DataType.FLOAT, ["B", 4, None]))
        ('B', 4, None)
    """
    if value is None or value.shape is None:
        return None
    return tuple(d if isinstance(d, int) else d.value for d in value.shape)


def known_dims(value: ir.Value | None, depth: int = 8) -> Dims | None:
    """The dims of ``value``: its shape, else what its producer implies (:func:`output_dims`),
    following up to ``depth`` producers.

    Values torchlib's expansions compute and values in function bodies usually carry no shape;
    a ``Reshape`` to a constant, an ``Expand``, an ``Unsqueeze``, a ``Transpose``, an
    elementwise op of known operands still say what it is.

    Example:
        >>> x = ir.val("x", ir.DataType.FLOAT, ["B", 8])
        >>> axes = ir.Value(name="axes", const_value=ir.tensor([1], dtype=ir.DataType.INT64))
        >>> t = ir.node("Transpose", [ir.node("Unsqueeze", [x, axes]).outputs[0]], {"perm": [2, 0, 1]})
        >>> known_dims(t.outputs[0])
        (8, 'B', 1)
    """
    dims = value_dims(value)
    if dims is not None or value is None or depth <= 0:
        return dims
    node = value.producer()
    if node is None or value.index() != 0:
        return None
    return output_dims(node, lambda v: known_dims(v, depth - 1))


def known_rank(value: ir.Value | None, depth: int = 8) -> int | None:
    """The rank of ``value``: the length of :func:`known_dims`, else what a ``Reshape`` or
    ``Expand`` producing it says through the length of its computed target shape
    (:func:`shape_length`), following up to ``depth`` producers.

    Example:
        >>> x = ir.val("x", ir.DataType.FLOAT, ["B", 8])
        >>> target = ir.node("Concat", [ir.node("Shape", [x]).outputs[0]] * 2, {"axis": 0})
        >>> known_rank(ir.node("Reshape", [x, target.outputs[0]]).outputs[0])
        4
    """
    dims = known_dims(value, depth)
    if dims is not None:
        return len(dims)
    if value is None or depth <= 0:
        return None
    node = value.producer()
    if node is None or node.domain not in ("", "ai.onnx") or len(node.inputs) < 2:
        return None
    if node.op_type == "Reshape":
        return shape_length(node.inputs[1], depth - 1)
    if node.op_type == "Expand":
        target, source = (
            shape_length(node.inputs[1], depth - 1),
            known_rank(node.inputs[0], depth - 1),
        )
        return None if target is None or source is None else max(target, source)
    return None


def shape_length(value: ir.Value | None, depth: int = 8) -> int | None:
    """The number of elements of a 1-D shape tensor: a constant, a ``Shape`` (of a value of
    :func:`known_rank`, with its ``start``/``end``) or a ``Concat`` of those.

    Example:
        >>> x = ir.val("x", ir.DataType.FLOAT, ["B", "S", 8])
        >>> shape_length(ir.node("Shape", [x], {"start": 1}).outputs[0])
        2
    """
    if value is None or depth <= 0:
        return None
    tensor = const_tensor(value)
    if tensor is not None:
        return math.prod(int(d) for d in tensor.shape.numpy())
    node = value.producer()
    if node is None or node.domain not in ("", "ai.onnx"):
        return None
    if node.op_type == "Concat":
        parts = [shape_length(i, depth - 1) for i in node.inputs]
        return None if None in parts else sum(p for p in parts if p is not None)
    if node.op_type == "Shape":
        rank = known_rank(node.inputs[0], depth - 1)
        if rank is None:
            return None
        start = node.attributes.get_int("start", 0)
        end = node.attributes.get_int("end", rank)
        start, end = (start + rank if start < 0 else start), (end + rank if end < 0 else end)
        return max(0, min(end, rank) - max(start, 0))
    return None


_ELEMENTWISE = frozenset(
    [
        "Identity",
        "Cast",
        "CastLike",
        "Neg",
        "Relu",
        "Sigmoid",
        "Tanh",
        "Erf",
        "Exp",
        "Log",
        "Sqrt",
        "Reciprocal",
        "Abs",
        "Softmax",
        "LogSoftmax",
        "Gelu",
        "Elu",
        "LeakyRelu",
        "HardSigmoid",
        "HardSwish",
        "Mish",
        "Softplus",
        "Not",
        "Dropout",
    ]
)
"""Ops whose (first) output has the shape of their first input."""

_BROADCAST = frozenset(
    [
        "Add",
        "Sub",
        "Mul",
        "Div",
        "Pow",
        "Where",
        "Max",
        "Min",
        "And",
        "Or",
        "Equal",
        "Less",
        "Greater",
    ]
)
"""Ops whose output has the broadcast shape of their inputs."""


def output_dims(node: ir.Node, dims_of: Callable[[ir.Value], Dims | None]) -> Dims | None:
    """The dims of ``node``'s first output, from its inputs' dims (``dims_of``) and constants.

    Knows ``Constant``, the elementwise ops, the broadcasting ones, ``Reshape``, ``Expand``,
    ``Unsqueeze``, ``Squeeze`` and ``Transpose`` of the default domain; ``None`` for anything
    else or when the inputs do not say enough.
    """
    if node.domain not in ("", "ai.onnx"):
        return None
    if node.op_type == "Constant":
        attribute = node.attributes.get("value")
        tensor = None if attribute is None else attribute.as_tensor()
        return None if tensor is None else tuple(tensor.shape.numpy())
    inputs = node.inputs
    if not inputs or inputs[0] is None:
        return None
    if node.op_type in _BROADCAST:
        return broadcast([None if v is None else dims_of(v) for v in inputs])
    rule = _DERIVATIONS.get(node.op_type)
    if rule is not None:
        return rule(node, dims_of)
    dims = dims_of(inputs[0])
    if dims is None:
        return None
    if node.op_type in _ELEMENTWISE:
        return dims
    if node.op_type == "Transpose":
        perm = node.attributes.get("perm")
        return transposed(dims, None if perm is None else perm.as_ints())
    return None


def _reshape(node: ir.Node, dims_of: Callable[[ir.Value], Dims | None]) -> Dims | None:
    target = _const_ints(node.inputs[1] if len(node.inputs) > 1 else None)
    if target is None:
        return None
    allowzero = node.attributes.get_int("allowzero", 0)
    if all(t > 0 for t in target) or (allowzero and all(t >= 0 for t in target)):
        return tuple(target)  # (the input's dims do not matter)
    source = dims_of(node.inputs[0])  # type: ignore[arg-type]
    return None if source is None else reshape_target(source, target, allowzero)


def _expand(node: ir.Node, dims_of: Callable[[ir.Value], Dims | None]) -> Dims | None:
    target = _const_ints(node.inputs[1] if len(node.inputs) > 1 else None)
    if target is None:
        return None
    return broadcast([dims_of(node.inputs[0]), tuple(target)])  # type: ignore[arg-type]


def _axes(node: ir.Node) -> list[int] | None:
    """The constant ``axes`` (input, or attribute before opset 13); ``None`` if not given."""
    if len(node.inputs) > 1 and node.inputs[1] is not None:
        return _const_ints(node.inputs[1])
    attribute = node.attributes.get("axes")
    return None if attribute is None else list(attribute.as_ints())


def _has_axes(node: ir.Node) -> bool:
    return (len(node.inputs) > 1 and node.inputs[1] is not None) or "axes" in node.attributes


def _unsqueeze(node: ir.Node, dims_of: Callable[[ir.Value], Dims | None]) -> Dims | None:
    source, axes = dims_of(node.inputs[0]), _axes(node)  # type: ignore[arg-type]
    return None if source is None or axes is None else unsqueezed(source, axes)


def _squeeze(node: ir.Node, dims_of: Callable[[ir.Value], Dims | None]) -> Dims | None:
    source, axes = dims_of(node.inputs[0]), _axes(node)  # type: ignore[arg-type]
    if source is None or (axes is None and _has_axes(node)):  # (axes computed at run time)
        return None
    return squeezed(source, axes)


_DERIVATIONS: dict[str, Callable[[ir.Node, Callable[[ir.Value], Dims | None]], Dims | None]] = {
    "Reshape": _reshape,
    "Expand": _expand,
    "Unsqueeze": _unsqueeze,
    "Squeeze": _squeeze,
}


def _const_ints(value: ir.Value | None) -> list[int] | None:
    """A constant 0-D or 1-D integer tensor (a ``shape`` or ``axes`` input) as ints."""
    tensor = const_tensor(value)
    if tensor is None or tensor.dtype not in (ir.DataType.INT64, ir.DataType.INT32):
        return None
    try:
        array = tensor.numpy()
    except Exception:  # (no data: a weightless tensor, external data not loaded)
        return None
    return None if array.ndim > 1 else [int(d) for d in array.reshape(-1)]


# --- What an op does to dims ---------------------------------------------------------------------


def reshape_target(dims: Sequence[Dim], target: Sequence[int], allowzero: int = 0) -> Dims | None:
    """The output dims of ONNX ``Reshape`` of a value with ``dims`` to a constant ``target``.

    A ``0`` copies the input's dim at its position (unless ``allowzero``); a ``-1`` is the
    element count divided by the other dims, kept symbolic where the symbols cancel
    (``["B", 12]`` to ``[-1, 3, 4]`` gives ``("B", 3, 4)``) and ``None`` where the dims do not
    determine it.

    Returns:
        The dims, or ``None`` if ``target`` cannot apply to ``dims``: two ``-1``, an entry below
        ``-1``, a ``0`` past the input's rank, a ``0`` beside a ``-1`` with ``allowzero``, or
        (all dims known) a different element count.

    Example:
        >>> reshape_target(["B", "S", 64], [0, 0, 4, -1])
        ('B', 'S', 4, 16)
        >>> reshape_target([2, 3], [4, -1]) is None  # (6 elements do not fill 4 × k)
        True
    """
    out: list[Dim] = []
    for i, t in enumerate(target):
        if t < -1:
            return None
        if t == 0 and not allowzero:
            if i >= len(dims):
                return None
            out.append(dims[i])
        else:
            out.append(t)
    wildcards = [i for i, t in enumerate(target) if t == -1]
    if len(wildcards) > 1 or (wildcards and allowzero and 0 in target):
        return None
    if wildcards:
        j = wildcards[0]
        copied = {i for i, t in enumerate(target) if t == 0 and not allowzero}  # (they cancel)
        rest = [d for i, d in enumerate(dims) if i not in copied]
        out[j] = _quotient(rest, [d for i, d in enumerate(out) if i != j and i not in copied])
        if out[j] == -1:  # (the element count does not divide)
            return None
    elif _all_ints(dims) and _all_ints(out) and math.prod(dims) != math.prod(out):  # type: ignore[arg-type]
        return None
    return tuple(out)


def _all_ints(dims: Sequence[Dim]) -> bool:
    return all(isinstance(d, int) for d in dims)


def _quotient(dims: Sequence[Dim], others: Sequence[Dim]) -> Dim:
    """``prod(dims) / prod(others)`` as one dim: an int, one symbol, ``None`` if undetermined,
    ``-1`` if the known element counts do not divide."""
    if None in dims or None in others:
        return None
    numerator = math.prod(d for d in dims if isinstance(d, int))
    denominator = math.prod(d for d in others if isinstance(d, int))
    if denominator == 0:
        return None
    if numerator % denominator:
        return -1 if _all_ints(dims) and _all_ints(others) else None
    left = collections.Counter(d for d in dims if isinstance(d, str))
    left.subtract(d for d in others if isinstance(d, str))
    if any(n < 0 for n in left.values()):
        return None
    rest = list(left.elements())
    coefficient = numerator // denominator
    if not rest:
        return coefficient
    return rest[0] if len(rest) == 1 and coefficient == 1 else None


def unsqueezed(dims: Sequence[Dim], axes: Sequence[int]) -> Dims | None:
    """``dims`` with a ``1`` inserted at each of ``axes`` (ONNX ``Unsqueeze``; negative axes
    count from the end of the output); ``None`` if an axis is out of range or repeated.

    Example:
        >>> unsqueezed(["B", 8], [0, -1])
        (1, 'B', 8, 1)
    """
    rank = len(dims) + len(axes)
    if any(not -rank <= a < rank for a in axes):
        return None
    positions = sorted(a % rank for a in axes)
    if len(set(positions)) != len(positions):
        return None
    out = list(dims)
    for position in positions:
        out.insert(position, 1)
    return tuple(out)


def squeezed(dims: Sequence[Dim], axes: Sequence[int] | None) -> Dims | None:
    """``dims`` without the size-1 dims at ``axes`` (ONNX ``Squeeze``; ``None``: every dim
    that is 1); ``None`` if an axis is out of range or repeated, a squeezed dim is a known size
    other than 1, or (no axes) a dim is not known.

    Example:
        >>> squeezed([1, "B", 1], [0]), squeezed([1, 4, 1], None)
        (('B', 1), (4,))
    """
    if axes is None:
        if not _all_ints(dims):
            return None
        return tuple(d for d in dims if d != 1)
    rank = len(dims)
    if any(not -rank <= a < rank for a in axes):
        return None
    drop = {a % rank for a in axes}
    if len(drop) != len(axes) or any(isinstance(dims[i], int) and dims[i] != 1 for i in drop):
        return None
    return tuple(d for i, d in enumerate(dims) if i not in drop)


def transposed(dims: Sequence[Dim], perm: Sequence[int] | None) -> Dims | None:
    """``dims`` permuted by ``perm`` (ONNX ``Transpose``; ``None`` reverses them), or ``None``
    if ``perm`` is not a permutation of the axes.

    Example:
        >>> transposed(["B", 4, 8], [0, 2, 1]), transposed([2, 3], None)
        (('B', 8, 4), (3, 2))
    """
    order = list(range(len(dims) - 1, -1, -1)) if perm is None else [int(p) for p in perm]
    if sorted(order) != list(range(len(dims))):
        return None
    return tuple(dims[i] for i in order)


def broadcast(shapes: Sequence[Sequence[Dim] | None]) -> Dims | None:
    """Numpy broadcasting of ``shapes`` (ONNX's multidirectional broadcasting); ``None`` if
    there are none or one is unknown. A dim is ``None`` where the inputs do not settle it: an
    unknown dim beside other dims, or two different sizes or symbols other than 1.

    Example:
        >>> broadcast([("B", 1, 8), (4, 1)]), broadcast([(2, 3), (None,)])
        (('B', 4, 8), (2, None))
    """
    known = [s for s in shapes if s is not None]
    if not shapes or len(known) != len(shapes):
        return None
    rank = max(len(s) for s in known)
    out: list[Dim] = []
    for i in range(rank):
        seen = {s[i - rank + len(s)] for s in known if i - rank + len(s) >= 0}
        seen.discard(1)
        out.append(seen.pop() if len(seen) == 1 else (1 if not seen else None))
    return tuple(out)
