"""Transposes folded into ``FusedMatMul`` (onnxruntime ``com.microsoft``).

Identities (``T`` = a ``Transpose`` that swaps the last two axes and keeps the others):

- ``MatMul(a, T(b)) = FusedMatMul(a, b, transB=1)`` — also torchlib's 3-D ``linear``,
  ``MatMul(x, Transpose(w))``, with ``w`` a parameter of the ``Linear`` function
- ``MatMul(T(a), b) = FusedMatMul(a, b, transA=1)``
- ``MatMul(T(a), T(b)) = FusedMatMul(a, b, transA=1, transB=1)``

Preconditions: float16/float32 (FusedMatMul's CPU kernels); the transposed operand has known
rank ≥ 2 and the ``perm`` swaps exactly its last two axes; the ``Transpose`` has no other use
(else the transposed tensor is computed anyway); the product is not attention scores — a
``Softmax`` within a few elementwise steps (scale, softcap, mask) — which are the attention rules'
to fuse: the rewrite visits nodes in graph order, so this rule would otherwise take
``q @ kᵀ`` of an eager attention (gemma2's) before ``Attention`` / ``GroupQueryAttention`` can.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import onnx_ir as ir

from irkit.rewriting import RewriteBuilder, Rule, RuleSet, Verdict, attr, fail, op, var
from irkit.rules._ort_types import ORT_FLOAT_TYPES

MS = "com.microsoft"

a, b = var("a"), var("b")
_TA = op.Transpose(a, perm=attr("perm_a"))
_TB = op.Transpose(b, perm=attr("perm_b"))


def _swaps_last_two(perm: Sequence[int] | None, value: ir.Value) -> bool:
    r = None if value.shape is None else len(value.shape)
    if r is None or r < 2:
        return False
    if perm is None:  # default: reverse all axes
        return r == 2
    return list(perm) == [*range(r - 2), r - 1, r - 2]


_SCORE_STEPS = frozenset({"Mul", "Div", "Add", "Sub", "Tanh", "Where", "Cast", "Softcap"})
"""Elementwise ops between attention's ``q @ kᵀ`` and its ``Softmax``: scale, softcap, mask."""


def _feeds_softmax(value: ir.Value, steps: int = 5) -> bool:
    """Whether ``value`` reaches a ``Softmax`` through at most ``steps`` elementwise ops."""
    frontier = [value]
    for _ in range(steps + 1):
        following: list[ir.Value] = []
        for v in frontier:
            for user, _ in v.uses():
                if user.domain == "" and user.op_type == "Softmax":
                    return True
                if user.domain == "" and user.op_type in _SCORE_STEPS:
                    following.extend(user.outputs)
        frontier = following
    return False


def _checker(trans_a: bool, trans_b: bool) -> Callable[..., Verdict]:
    """The check of the rule whose pattern transposes ``a`` and/or ``b``."""

    def check(a: ir.Value, b: ir.Value, product: ir.Value, **env: Any) -> Verdict:
        if _feeds_softmax(product):
            return fail(
                "the product is attention scores (a Softmax follows): left to the attention rules",
                product,
            )
        dtype = a.dtype or b.dtype
        if dtype is not None and dtype not in ORT_FLOAT_TYPES:
            return fail(f"dtype {dtype}: FusedMatMul runs float16/float32", a)
        for value, perm, transposed in ((a, "perm_a", trans_a), (b, "perm_b", trans_b)):
            if transposed and not _swaps_last_two(env.get(perm), value):
                rank = "unknown" if value.shape is None else len(value.shape)
                return fail(
                    f"Transpose perm {env.get(perm)} (rank {rank}) does not swap exactly the "
                    "last two axes",
                    value,
                )
        return True

    return check


def _rewriter(trans_a: bool, trans_b: bool) -> Callable[..., ir.Value]:
    def fused(op: RewriteBuilder, a: ir.Value, b: ir.Value) -> ir.Value:
        """FusedMatMul(a, b, transA, transB)"""
        return op.domain(MS).FusedMatMul(a, b, alpha=1.0, transA=int(trans_a), transB=int(trans_b))

    return fused


rules = RuleSet(
    "ort_matmul",
    [
        Rule(name, pattern, check=_checker(ta, tb), rewrite=_rewriter(ta, tb))
        for name, pattern, ta, tb in (
            # MatMul(T(a), T(b)) = FusedMatMul(a, b, transA=1, transB=1)
            ("FusedMatMulTransAB", op.MatMul(_TA, _TB, _name="product"), True, True),
            # MatMul(a, T(b)) = FusedMatMul(a, b, transB=1)
            ("FusedMatMul", op.MatMul(a, _TB, _name="product"), False, True),
            # MatMul(T(a), b) = FusedMatMul(a, b, transA=1)
            ("FusedMatMulTransA", op.MatMul(_TA, b, _name="product"), True, False),
        )
    ],
)
"""The FusedMatMul rule."""
