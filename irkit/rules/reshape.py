"""A ``Reshape`` whose computed target the known shapes already say → a constant target.

A decoder reshapes per step to shapes computed from ``Shape`` ops (``view(batch, seq, H, D)``
lowers to ``Reshape(x, Concat(batch, seq, H, D))``, the batch and sequence read from the
inputs); onnxruntime runs the ``Concat`` (and its pieces) every step. Where torch's symbolic
shapes (kept by the lowering) give every dim of the result, the target is a constant::

    Reshape(x, s) = Reshape(x, t)     t[i] = d_i   where the result's dim i is the int d_i
                                      t[i] = 0     where it is the symbol x has at dim i

(``allowzero=0``: a 0 copies ``x``'s dim ``i``). The rule declines when a result dim is neither
(a symbol ``x`` has elsewhere, or unknown), when an int dim is 0 (a 0 in the target would copy),
or when ``s`` is already a constant, or when the result has ``x``'s shape (the reshape is then an
identity: :mod:`irkit.rules.glue`'s ``ShapeKeepingReshape`` drops it).

Likewise ``Expand(x, s) = Expand(x, t)`` with ``t[i] = 1`` where ``x`` already has the result's
dim (right-aligned; the expand keeps it) and ``t[i] = d_i`` for the int dims it broadcasts to.

Valid at every opset and inside function bodies (where the body's values carry shapes).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from irkit.rewriting import Match, Rule, RuleSet, Verdict, attr, const_value, dims, fail, op, var

__all__ = ["rules"]

x, shape = var("x"), var("shape")


def _check(x: ir.Value, shape: ir.Value, match: Match) -> Verdict:
    if const_value(shape) is not None:
        return fail("the target is already a constant", shape)
    result = dims(match.outputs[0])
    source = dims(x)
    if result is None or source is None:
        return fail("the shape of the input or of the result is unknown", x)
    if tuple(result) == tuple(source) and None not in result:
        return fail("the result has x's shape (the reshape is an identity, glue's to drop)", shape)
    target = []
    for i, d in enumerate(result):
        if isinstance(d, int) and d > 0:
            target.append(d)
        elif isinstance(d, str) and i < len(source) and source[i] == d:
            target.append(0)
        else:
            return fail(f"the result's dim {i} ({d}) is neither an int nor x's dim {i}", shape)
    return {"target": np.array(target, dtype=np.int64)}


def _check_expand(x: ir.Value, shape: ir.Value, match: Match) -> Verdict:
    if const_value(shape) is not None:
        return fail("the target is already a constant", shape)
    result, source = dims(match.outputs[0]), dims(x)
    if result is None or source is None or len(result) < len(source):
        return fail("the shape of the input or of the result is unknown", x)
    if tuple(result) == tuple(source) and None not in result:
        return fail("the result has x's shape (the expand is an identity, glue's to drop)", shape)
    offset = len(result) - len(source)
    target = []
    for i, d in enumerate(result):
        if i >= offset and d is not None and source[i - offset] == d:
            target.append(1)  # (x has the dim already: 1 keeps it)
        elif isinstance(d, int) and d > 0:
            target.append(d)
        else:
            return fail(f"the result's dim {i} ({d}) is neither an int nor x's", shape)
    return {"target": np.array(target, dtype=np.int64)}


rules = RuleSet(
    "reshape",
    [
        Rule(  # Reshape(x, s) = Reshape(x, t): t the result's known dims (0: x's own)
            "KnownReshapeTarget",
            op.Reshape(x, shape, allowzero=attr("allowzero")),
            check=_check,
            rewrite=lambda op, x, target: op.Reshape(x, op.const(target)),
        ),
        Rule(  # Expand(x, s) = Expand(x, t): t the result's known dims (1: x has it)
            "KnownExpandTarget",
            op.Expand(x, shape),
            check=_check_expand,
            rewrite=lambda op, x, target: op.Expand(x, op.const(target)),
        ),
    ],
)
"""The reshape rule."""
