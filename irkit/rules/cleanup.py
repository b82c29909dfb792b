"""Cleanup: ops that do nothing, and pairs that collapse into one.

Identities (each rule's comment states its precondition):

- ``Identity(x) = x``
- ``Cast(x, to=dtype(x)) = x``                 (x's dtype known)
- ``Reshape(x, s) = x``                        (s constant and resolves to x's known shape)
- ``Reshape(Reshape(x, s1), s2) = Reshape(x, s2)``   (s2 constant without 0 entries, or allowzero)
- ``Transpose(x, perm=[0..n-1]) = x``
- ``Transpose(Transpose(x, p1), p2) = Transpose(x, p1∘p2)``   (both perms explicit)
- ``Expand(x, s) = x``                         (s constant and broadcasting it leaves x's shape unchanged)

All rules are valid at every opset and inside function bodies. None needs to guard the
last node between a graph input and a graph output: the engine keeps it (see
:func:`irkit.rewriting.graph_io_guard`).
"""

from __future__ import annotations

from collections.abc import Sequence

import onnx_ir as ir

from irkit._shapes import Dims, reshape_target
from irkit.rewriting import (
    MatchFailure,
    Rule,
    RuleSet,
    Verdict,
    attr,
    const_ints,
    dims,
    fail,
    op,
    var,
)

x, shape, s1, s2 = var("x"), var("shape"), var("s1"), var("s2")


def _target_and_dims(x: ir.Value, shape: ir.Value) -> tuple[list[int], Dims] | MatchFailure:
    """(constant target shape, dims of x), or a failure."""
    target = const_ints(shape)
    if target is None:
        return fail("shape is not a constant", shape)
    xd = dims(x)
    if xd is None:
        return fail("input shape unknown", x)
    return target, xd


def _reshape_is_noop(x: ir.Value, shape: ir.Value, allowzero: int | None) -> Verdict:
    known = _target_and_dims(x, shape)
    if isinstance(known, MatchFailure):
        return known
    target, xd = known
    if len(target) != len(xd):
        return fail("reshape changes the rank", shape)
    resolved = reshape_target(xd, target, allowzero or 0)
    if resolved is None:
        return fail(f"target {target} does not fit input shape {list(xd)}", shape)
    if any(d is None for d in xd) or resolved != xd:
        return fail(f"target {list(resolved)} differs from input shape {list(xd)}", shape)
    return True


def _expand_is_noop(x: ir.Value, shape: ir.Value) -> Verdict:
    known = _target_and_dims(x, shape)
    if isinstance(known, MatchFailure):
        return known
    target, xd = known
    if len(target) > len(xd):
        return fail("expand adds dimensions", shape)
    for t, d in zip(reversed(target), reversed(xd), strict=False):
        if t != 1 and t != d:
            return fail(f"expand changes a dim {d} to {t}", shape)
    return True


def _compose(p1: Sequence[int], p2: Sequence[int]) -> list[int]:
    return [p1[i] for i in p2]


def _transpose_pair_ok(p1: Sequence[int] | None, p2: Sequence[int] | None) -> Verdict:
    if p1 is None or p2 is None:
        return fail("a Transpose without explicit perm")
    if len(p1) != len(p2):
        return fail("perms of different ranks")
    return True


def _cast_is_noop(x: ir.Value, to: int) -> Verdict:
    if x.dtype is None:
        return fail("input dtype unknown", x)
    if x.dtype != to:
        return fail(f"casts {x.dtype} to {ir.DataType(to)}", x)
    return True


def _outer_shape_ok(s2: ir.Value, az2: int | None) -> Verdict:
    target = const_ints(s2)
    if target is None:
        return fail("outer shape is not a constant", s2)
    if not az2 and 0 in target:
        return fail("outer shape copies a dim (0) of the inner result", s2)
    return True


def _is_identity_perm(x: ir.Value, perm: Sequence[int] | None) -> Verdict:
    if perm is None or list(perm) != list(range(len(perm))):
        return fail(f"perm {perm} is not the identity", x)
    return True


# The engine never drops the last node between a graph input and a graph output
# (irkit.rewriting's graph-I/O guard), so these rules need not check for it.
rules = RuleSet(
    "cleanup",
    [
        Rule(  # Identity(x) = x
            "IdentityElimination",
            op.Identity(x),
            rewrite=lambda x: x,
        ),
        Rule(  # Cast(x, to=dtype(x)) = x
            "NoOpCast",
            op.Cast(x, to=attr("to")),
            check=_cast_is_noop,
            rewrite=lambda x: x,
        ),
        Rule(  # Reshape(Reshape(x, s1), s2) = Reshape(x, s2)
            "ReshapeReshape",
            op.Reshape(op.Reshape(x, s1, allowzero=attr("az1")), s2, allowzero=attr("az2")),
            check=_outer_shape_ok,
            rewrite=lambda op, x, s2, az2: op.Reshape(x, s2, allowzero=az2 or None),
        ),
        Rule(  # Reshape(x, shape(x)) = x
            "NoOpReshape",
            op.Reshape(x, shape, allowzero=attr("allowzero")),
            check=_reshape_is_noop,
            rewrite=lambda x: x,
        ),
        Rule(  # Transpose(Transpose(x, p1), p2) = Transpose(x, p1∘p2)
            "TransposeTranspose",
            op.Transpose(op.Transpose(x, perm=attr("p1")), perm=attr("p2")),
            check=_transpose_pair_ok,
            rewrite=lambda op, x, p1, p2: op.Transpose(x, perm=_compose(p1, p2)),
            doc="Transpose(x, perm=[p1[i] for i in p2])",
        ),
        Rule(  # Transpose(x, perm=identity) = x
            "NoOpTranspose",
            op.Transpose(x, perm=attr("perm")),
            check=_is_identity_perm,
            rewrite=lambda x: x,
        ),
        Rule(  # Expand(x, s) = x when broadcasting to s leaves x unchanged
            "NoOpExpand",
            op.Expand(x, shape),
            check=_expand_is_noop,
            rewrite=lambda x: x,
        ),
    ],
)
"""The cleanup rules, in priority order."""
