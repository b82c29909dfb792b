"""Arithmetic identities: an operand that is a neutral element disappears.

Identities (``0`` / ``1`` stand for a constant tensor whose every element is 0 / 1):

- ``Add(x, 0) = Add(0, x) = x``
- ``Sub(x, 0) = x``
- ``Mul(x, 1) = Mul(1, x) = x``
- ``Div(x, 1) = x``

Precondition (all rules): the constant is an initializer or a ``Constant`` output (not a graph
input, which a caller may override), and broadcasting it against ``x`` leaves ``x``'s shape
unchanged — its rank is at most ``x``'s and each of its dims (right-aligned) is 1 or equal to
``x``'s. A rank-0 constant always qualifies; otherwise ``x``'s shape must be known.

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

from irkit.rewriting import MatchFailure, Rule, RuleSet, Verdict, const_value, dims, fail, op, var

a, b, x, c = var("a"), var("b"), var("x"), var("c")


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
        Rule(  # Div(x, 1) = x
            "DivOne",
            op.Div(x, c),
            check=lambda x, c: _is_neutral(x, c, 1),
            rewrite=lambda x: x,
        ),
    ],
)
"""The arithmetic-identity rules."""
