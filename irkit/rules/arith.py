"""Arithmetic identities: neutral operands disappear, constant scales fold into weights.

Neutral elements (``0`` / ``1`` stand for a constant tensor whose every element is 0 / 1):

- ``Add(x, 0) = Add(0, x) = x``
- ``Sub(x, 0) = x``
- ``Mul(x, 1) = Mul(1, x) = x``
- ``Div(x, 1) = x``
- ``And(x, true) = And(true, x) = x``   (torch's masks start from ``new_ones(...)``)
- ``(x + c) − c = x`` and ``Unsqueeze(x + c) − c = Unsqueeze(x)`` for integer ``x`` and one
  constant ``c`` (two's-complement wrapping cancels too; an index computed as ``end + K`` then
  ``− K``, as irkit's conv-state gather does)

Precondition (all rules): the constant is an initializer or a ``Constant`` output (not a graph
input, which a caller may override), and broadcasting it against ``x`` leaves ``x``'s shape
unchanged — its rank is at most ``x``'s and each of its dims (right-aligned) is 1 or equal to
``x``'s. A rank-0 constant always qualifies; otherwise ``x``'s shape must be known.

A constant scale of a ``MatMul`` product folds into its constant weight (one node fewer):

- ``Mul(MatMul(x, W), s) = MatMul(x, W · s)``
- ``Mul(Add(MatMul(x, W), b), s) = Add(MatMul(x, W · s), b · s)``   (``Mul`` operands in either
  order, ``Add`` too)

Preconditions (scale): ``W`` a floating-point rank-2 constant used by this ``MatMul`` only (the
folded copy replaces it, no weight is duplicated); ``s`` a constant of ``W``'s dtype that scales
whole output columns — one element, or shape ``[N]`` / ``[1, N]`` with ``N = W.shape[1]`` — so
``W · s`` keeps ``W``'s shape (a rank-2 ``s`` also needs ``x`` of rank ≥ 2, so that it adds no
dimension to the product); ``b`` a constant. The products are computed in float64 and cast
back to ``W``'s dtype: the result differs from the unfolded graph by rounding only. ``W``, ``s``
and ``b`` may be weightless (a model lowered on the ``meta`` device): ``W · s`` is then a
derived weightless tensor (:func:`~irkit.rewriting.multiply_weight`), multiplied when the
weights are saved.

Typical sources: norm weights that are still all ones and biases or attention masks that are
all zeros in the exported graph. In floating point ``x + 0`` turns ``-0.0`` into ``+0.0``;
the two compare equal, so the rewrite changes no number a comparison can see.

The family runs after the fusions (see :func:`irkit.rules.default_rules`): a fusion that
matches a ``· w + b`` with ``w = 1`` or ``b = 0`` still sees the whole pattern. All rules are
valid at every opset and inside function bodies.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from irkit.errors import WeightsError
from irkit.rewriting import (
    MatchFailure,
    RewriteBuilder,
    Rule,
    RuleSet,
    Verdict,
    const_tensor,
    const_value,
    dims,
    either,
    fail,
    multiply_weight,
    op,
    rank,
    var,
    weight_constant,
)

a, b, x, c = var("a"), var("b"), var("x"), var("c")
w, s, bias = var("w"), var("s"), var("bias")


def _is_neutral(x: ir.Value, c: ir.Value, neutral: int) -> Verdict:
    """Whether ``c`` is a constant all equal to ``neutral`` that broadcasts onto ``x`` unchanged."""
    arr = const_value(c)
    if arr is None:
        return fail("no constant operand", c)
    if c.is_graph_input():
        return fail("the constant is a graph input (callers may override it)", c)
    if arr.size == 0 or arr.dtype.kind not in "biufc" or not np.all(arr == neutral):
        return fail(f"the constant is not all {neutral}s", c)
    if arr.ndim == 0:
        return True
    xd = dims(x)
    if xd is None:
        return fail("x's shape unknown", x)
    if arr.ndim > len(xd):
        return fail(f"the constant (rank {arr.ndim}) adds dimensions to x (rank {len(xd)})", c)
    for cd, d in zip(reversed(arr.shape), reversed(xd), strict=False):
        if cd != 1 and cd != d:
            return fail(f"the constant's dim {cd} broadcasts x's dim {d}", c)
    return True


def _either_side(a: ir.Value, b: ir.Value, neutral: int) -> Verdict:
    """For a commutative op: the operand to keep, whichever side the neutral constant is on."""
    first: MatchFailure | None = None
    for keep, const in ((a, b), (b, a)):
        verdict = _is_neutral(keep, const, neutral)
        if verdict is True:
            return {"keep": keep}
        if first is None and isinstance(verdict, MatchFailure):
            # Report the reason about the constant side, not "no constant operand" of the other.
            first = verdict if const_value(const) is not None else None
    return first if first is not None else fail("no constant operand", b)


def _np(dtype: ir.DataType) -> str:
    try:
        return str(dtype.numpy())
    except TypeError:  # (no numpy type: strings, 4-bit types)
        return dtype.name


def _scale_folds(x: ir.Value, w: ir.Value, s: ir.Value, bias: ir.Value | None) -> Verdict:
    """Whether ``s`` folds into ``W`` (and ``bias``); finds the folded constants (real, or
    derived when a weight is weightless: computed when the weights are saved)."""
    weight = const_tensor(w)
    if weight is None or w.is_graph_input():
        return fail("the MatMul weight is not a constant", w)
    wshape = tuple(int(d) for d in weight.shape.numpy())
    if not weight.dtype.is_floating_point() or len(wshape) != 2:
        return fail(
            f"the weight is not a rank-2 float tensor ({_np(weight.dtype)}, rank {len(wshape)})",
            w,
        )
    if len(w.uses()) != 1:
        return fail("the weight has other uses (folding would duplicate it)", w)
    scale = const_tensor(s)
    if scale is None or s.is_graph_input():
        return fail("the scale is not a constant", s)
    if scale.dtype != weight.dtype:
        return fail(
            f"the scale's dtype {_np(scale.dtype)} is not the weight's {_np(weight.dtype)}", s
        )
    n = wshape[1]
    sshape = tuple(int(d) for d in scale.shape.numpy())
    per_column = len(sshape) == 0 or (
        len(sshape) <= 2 and sshape[-1] in (1, n) and sshape[:-1] in ((), (1,))
    )
    if not per_column:
        return fail(f"the scale (shape {list(sshape)}) does not scale whole columns", s)
    if len(sshape) == 2 and ((xr := rank(x)) is None or xr < 2):
        return fail(
            "the rank-2 scale may add a dimension to the product (x's rank < 2 or unknown)", s
        )
    folded: dict[str, ir.TensorProtocol | None] = {"w_s": None, "b_s": None}
    if bias is not None:
        offset = const_tensor(bias)
        if offset is None or bias.is_graph_input():
            return fail("the bias is not a constant", bias)
        if offset.dtype != weight.dtype:
            return fail(
                f"the bias's dtype {_np(offset.dtype)} is not the weight's {_np(weight.dtype)}",
                bias,
            )
        try:
            folded["b_s"] = multiply_weight(offset, scale)
        except WeightsError as exc:
            return fail(f"the bias does not broadcast with the scale ({exc})", bias)
    folded["w_s"] = multiply_weight(weight, scale)  # (in float64, rounded once)
    return folded


def _fold_scale(
    op: RewriteBuilder, x: ir.Value, w_s: ir.TensorProtocol, b_s: ir.TensorProtocol | None
) -> ir.Value:
    """MatMul(x, W·s) (+ b·s)"""
    product = op.MatMul(x, weight_constant(op, w_s))
    if x.shape is not None and len(x.shape) >= 2:
        # The product's shape, for the rules that fire after this one (AddZero on b · s = 0).
        product.dtype, product.shape = x.dtype, ir.Shape([*x.shape[:-1], int(w_s.shape.numpy()[1])])
    return product if b_s is None else op.Add(product, weight_constant(op, b_s))


_INTEGERS = frozenset(
    {
        ir.DataType.INT8,
        ir.DataType.INT16,
        ir.DataType.INT32,
        ir.DataType.INT64,
        ir.DataType.UINT8,
        ir.DataType.UINT16,
        ir.DataType.UINT32,
        ir.DataType.UINT64,
    }
)


def _cancels(x: ir.Value, c: ir.Value, c2: ir.Value) -> Verdict:
    """``(x + c) − c = x`` in integers (wrapping arithmetic cancels exactly too)."""
    if x.dtype not in _INTEGERS:
        return fail("not an integer (rounding would not cancel)", x)
    first, second = const_value(c), const_value(c2)
    if first is None or second is None or first.size != 1 or second.size != 1:
        return fail("the added and subtracted values are not one-element constants", c)
    if first.reshape(()) != second.reshape(()):
        return fail("the added and subtracted constants differ", c2)
    if max(first.ndim, second.ndim) > (rank(x) or 0):
        return fail("a constant would add dimensions", c)
    return True


rules = RuleSet(
    "arith",
    [
        Rule(  # Add(x, 0) = Add(0, x) = x
            "AddZero",
            op.Add(a, b, _commute=False),
            check=lambda a, b: _either_side(a, b, 0),
            rewrite=lambda keep: keep,
        ),
        Rule(  # Sub(x, 0) = x
            "SubZero",
            op.Sub(x, c),
            check=lambda x, c: _is_neutral(x, c, 0),
            rewrite=lambda x: x,
        ),
        Rule(  # Mul(x, 1) = Mul(1, x) = x
            "MulOne",
            op.Mul(a, b, _commute=False),
            check=lambda a, b: _either_side(a, b, 1),
            rewrite=lambda keep: keep,
        ),
        Rule(  # (x @ W + b) · s = x @ (W · s) + b · s
            "ScaleIntoMatMulWeight",
            either(op.MatMul(x, w) + bias, op.MatMul(x, w)) * s,
            check=_scale_folds,
            rewrite=_fold_scale,
        ),
        Rule(  # Div(x, 1) = x
            "DivOne",
            op.Div(x, c),
            check=lambda x, c: _is_neutral(x, c, 1),
            rewrite=lambda x: x,
        ),
        Rule(  # (x + c) − c = x, (x + c)[None] − c = x[None]   (integers)
            "IntegerAddSub",
            op.Sub(
                either(op.Add(x, c), op.Unsqueeze(op.Add(x, c), var("axes")), tag="unsqueezed"),
                var("c2"),
            ),
            check=_cancels,
            rewrite=lambda op, x, axes, unsqueezed: op.Unsqueeze(x, axes) if unsqueezed else x,
        ),
        Rule(  # And(x, true) = And(true, x) = x
            "AndTrue",
            op.And(a, b, _commute=False),
            check=lambda a, b: _either_side(a, b, 1),
            rewrite=lambda keep: keep,
        ),
    ],
)
"""The arithmetic-identity rules."""
