"""FLOP estimates for MatMul, Gemm and Conv from value shapes, symbolic dims kept symbolic.

A count is a polynomial in the symbolic dims: ``{("B", "S"): 2048}`` means ``2048·B·S``. A node
whose shapes are not known well enough is counted in :attr:`Flops.unknown` instead.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Sequence

import onnx_ir as ir

from irkit._shapes import output_dims
from irkit.rewriting import dims

__all__ = ["Flops", "node_flops", "format_count", "derived_shape", "ShapeTracker"]

Dim = int | str


@dataclasses.dataclass
class Flops:
    """A FLOP count: ``terms`` maps a sorted tuple of symbol names to its coefficient.

    Attributes:
        terms: The polynomial; ``()`` is the constant term.
        unknown: Number of MatMul/Gemm/Conv nodes whose FLOPs could not be estimated.
    """

    terms: Counter[tuple[str, ...]] = dataclasses.field(default_factory=Counter)
    unknown: int = 0

    def __iadd__(self, other: Flops) -> Flops:
        self.terms.update(other.terms)
        self.unknown += other.unknown
        return self

    def scaled(self, factor: int) -> Flops:
        return Flops(Counter({k: v * factor for k, v in self.terms.items()}), self.unknown * factor)

    def __bool__(self) -> bool:
        return bool(self.terms) or self.unknown > 0

    def text(self) -> str:
        """``"4.2M·B·S + 1.0K"``; ``"?"`` parts for unknown nodes; ``"0"`` when nothing."""
        parts = []
        for symbols, coef in sorted(self.terms.items(), key=lambda kv: (-len(kv[0]), kv[0])):
            parts.append("·".join([format_count(coef), *_powers(symbols)]))
        if self.unknown:
            parts.append(f"?({self.unknown} node{'s' if self.unknown > 1 else ''})")
        return " + ".join(parts) if parts else "0"

    def to_json(self) -> dict[str, object]:
        return {
            "terms": [{"coef": c, "symbols": list(s)} for s, c in sorted(self.terms.items())],
            "unknown_nodes": self.unknown,
        }


def _powers(symbols: tuple[str, ...]) -> list[str]:
    counts = Counter(symbols)
    return [s if n == 1 else f"{s}^{n}" for s, n in sorted(counts.items())]


def format_count(n: float) -> str:
    """``1234567 → "1.23M"``; integers below 10,000 stay exact."""
    if abs(n) < 10_000:
        return str(int(n)) if float(n).is_integer() else f"{n:.3g}"
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.3g}{unit}"
    return str(n)


ShapeOf = Callable[[ir.Value], "tuple[int | str | None, ...] | None"]


_value_shape: ShapeOf = dims  # (value.shape, symbolic dims by name: irkit.rewriting.dims)


def _dims(value: ir.Value | None, shape_of: ShapeOf) -> list[Dim] | None:
    """The dims of ``value`` if every one is known (an int or a symbol)."""
    shape = None if value is None else shape_of(value)
    if shape is None:
        return None
    known = [d for d in shape if d is not None]
    return known if len(known) == len(shape) else None


def _product(dims: Sequence[Dim], factor: int = 1) -> Flops:
    coef = factor
    symbols: list[str] = []
    for d in dims:
        if isinstance(d, int):
            coef *= d
        else:
            symbols.append(d)
    return Flops(Counter({tuple(sorted(symbols)): coef}))


def node_flops(node: ir.Node, shape_of: ShapeOf = _value_shape) -> Flops:
    """FLOPs of one node (2 per multiply-add); zero for ops other than MatMul/Gemm/Conv.

    ``shape_of`` gives a value's shape (ints, symbol names, ``None`` for unknown dims); the
    default reads ``value.shape``.

    Example:
        >>> import onnx_ir as ir
        >>> a, b = ir.val("a", ir.DataType.FLOAT, ["B", 4, 8]), ir.val("b", ir.DataType.FLOAT, [8, 16])
        >>> node_flops(ir.node("MatMul", [a, b])).text()
        '1024·B'
    """
    if node.domain not in ("", "ai.onnx") or node.op_type not in ("MatMul", "Gemm", "Conv"):
        return Flops()
    if node.op_type == "Conv":
        weight, out = _dims(node.inputs[1], shape_of), _dims(node.outputs[0], shape_of)
        if weight is None or out is None or len(weight) < 2:
            return Flops(unknown=1)
        # out[N, C_out, *spatial] each costs C_in/group × prod(kernel) multiply-adds.
        return _product([*out, *weight[1:]], factor=2)
    a, b = _dims(node.inputs[0], shape_of), _dims(node.inputs[1], shape_of)
    if a is None or b is None or not a or not b:
        return Flops(unknown=1)
    if node.op_type == "Gemm":
        attrs = node.attributes
        trans_a = attrs["transA"].as_int() if "transA" in attrs else 0
        trans_b = attrs["transB"].as_int() if "transB" in attrs else 0
        m, k = (a[1], a[0]) if trans_a else (a[0], a[-1])
        n = b[0] if trans_b else b[-1]
        return _product([m, k, n], factor=2)
    out = _dims(node.outputs[0], shape_of)
    if out is None:  # out[..., M, N]: batch dims from the longer operand (broadcasting)
        rows = a[-2:-1] if len(a) >= 2 else []
        cols = b[-1:] if len(b) >= 2 else []
        batch = a[:-2] if len(a) >= len(b) else b[:-2]
        out = [*batch, *rows, *cols]
    # Each output element costs K = a[-1] multiply-adds.
    return _product([*out, a[-1]], factor=2)


def derived_shape(node: ir.Node, shape_of: ShapeOf) -> tuple[int | str | None, ...] | None:
    """The first output's shape of ``node`` from its inputs' shapes (``shape_of``):
    :func:`irkit._shapes.output_dims`, which knows the shape-preserving and broadcasting ops,
    ``Reshape``, ``Expand``, ``(Un)Squeeze`` and ``Transpose``.

    Values inside ONNX function bodies usually carry no shapes (a ``Linear`` body is
    ``MatMul(x, Transpose(weight))``); this recovers enough of them to estimate FLOPs. (ONNX's
    shape inference, which onnx-ir's ``ShapeInferencePass`` runs, annotates main-graph values
    only, and a function body's input shapes differ per call site; so viz derives these few ops
    with the shape helpers the rules use.)

    Example:
        >>> import onnx_ir as ir
        >>> w = ir.val("w", ir.DataType.FLOAT, [32, 64])
        >>> derived_shape(ir.node("Transpose", [w], {"perm": [1, 0]}), _value_shape)
        (64, 32)
    """
    return output_dims(node, shape_of)


class ShapeTracker:
    """Shapes of values in one body, filled in along the way where the model has none.

    Visit nodes in graph order with :meth:`flops`; each node's missing output shape is derived
    (:func:`derived_shape`) before its FLOPs are counted, so later nodes see it.
    """

    def __init__(self, base: ShapeOf = _value_shape):
        self.base = base
        self.derived: dict[ir.Value, tuple[int | str | None, ...]] = {}

    def shape_of(self, value: ir.Value) -> tuple[int | str | None, ...] | None:
        if value in self.derived:
            return self.derived[value]
        return self.base(value)

    def flops(self, node: ir.Node) -> Flops:
        """Record ``node``'s derived output shape and return its FLOPs."""
        if node.outputs and self.shape_of(node.outputs[0]) is None:
            shape = derived_shape(node, self.shape_of)
            if shape is not None:
                self.derived[node.outputs[0]] = shape
        return node_flops(node, self.shape_of)
