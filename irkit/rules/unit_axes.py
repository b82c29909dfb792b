"""Unit axes added by a ``Reshape`` or after a reduction, written the way that costs no kernel.

The decode step of a state model computes its padding mask and the index of each row's last
real token from ``attention_mask`` with a few tiny ops; two of them are spelled so that they
cost a kernel each where none is needed. Identities:

- ``Reshape(x, [0, …, 0, 1, …, 1]) = Unsqueeze(x, [r, …, r + k - 1])``: ``x`` of known rank
  ``r``, ``allowzero`` 0, the target's first ``r`` entries ``0`` (copy the dim) or ``x``'s
  static dim there, the ``k ≥ 1`` entries after them ``1``. Written as ``Unsqueeze`` it is
  the same node as an ``Unsqueeze`` of ``x`` the model already has (transformers' ``m[..., None]``
  beside a ``view(b, s, 1)`` of the same mask), and common-subexpression elimination (irkit's
  after re-outlining, onnxruntime's at load) keeps one of the two, and one of the ``Cast``\\ s
  after them.
- ``Unsqueeze(Reduce(x, axes, keepdims=0), axes) = Reduce(x, axes, keepdims=1)``: a reduction
  whose dropped axes are put back at the same places (``x``'s rank known; ``axes`` constant,
  the reduction's as an input or an attribute; the reduction's output used only there):
  ``amax(m · arange, dim=1).unsqueeze(1)``.

Both hold at every opset with ``Unsqueeze`` axes as an input (≥ 13), in function bodies too.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from irkit.rewriting import (
    BaseRule,
    Match,
    MatchFailure,
    Rewrite,
    RewriteBuilder,
    RewriteContext,
    RuleSet,
    const_ints,
    dims,
    fail,
)

__all__ = ["ReduceKeepdims", "ReshapeAsUnsqueeze", "rules"]

#: The reductions whose ``keepdims=1`` form keeps the reduced axes as 1s.
_REDUCTIONS = frozenset(
    {
        "ReduceMax",
        "ReduceMin",
        "ReduceSum",
        "ReduceMean",
        "ReduceProd",
        "ReduceL1",
        "ReduceL2",
        "ReduceLogSum",
        "ReduceLogSumExp",
        "ReduceSumSquare",
    }
)


def _standard(node: ir.Node | None, op_type: str) -> bool:
    return node is not None and node.op_type == op_type and node.domain in ("", "ai.onnx")


def _int_attr(node: ir.Node, name: str, default: int) -> int:
    value = node.attributes.get(name)
    return default if value is None else int(value.as_int())


class ReshapeAsUnsqueeze(BaseRule):
    """``Reshape(x, [0, …, 0, 1, …])`` → ``Unsqueeze(x, trailing axes)`` (module docstring)."""

    name = "ReshapeAsUnsqueeze"
    anchors = frozenset({("", "Reshape")})
    min_opset = 13  # (Unsqueeze's axes as an input)
    doc = "a Reshape that only appends unit axes, as the Unsqueeze it is"

    def find(self, node: ir.Node, ctx: RewriteContext) -> Rewrite | MatchFailure:
        x = node.inputs[0] if node.inputs else None
        target = const_ints(node.inputs[1]) if len(node.inputs) > 1 else None
        dx = dims(x)
        if x is None or dx is None:
            return fail("input rank unknown", x)
        if target is None:
            return fail("target shape is not a constant", node.inputs[1] if node.inputs else None)
        if _int_attr(node, "allowzero", 0):
            return fail("allowzero=1: a 0 in the target is a zero-sized dim", x)
        rank = len(dx)
        head, tail = target[:rank], target[rank:]
        if not tail or any(t != 1 for t in tail):
            return fail(f"target {target} does not end in unit dims after x's {rank}", x)
        if any(t != 0 and t != d for t, d in zip(head, dx, strict=True)):
            return fail(f"target {target} does not keep x's dims {list(dx)} in place", x)
        op = RewriteBuilder()
        axes = np.arange(rank, rank + len(tail), dtype=np.int64)
        y = op.Unsqueeze(x, op.const(axes))
        out = node.outputs[0]
        y.type, y.shape = out.type, out.shape
        return Rewrite(Match([node], [out], {}, ctx.opset), op.nodes, [y])


class ReduceKeepdims(BaseRule):
    """``Unsqueeze(Reduce(x, a, keepdims=0), a)`` → ``Reduce(x, a, keepdims=1)``."""

    name = "ReduceKeepdims"
    anchors = frozenset({("", "Unsqueeze")})
    min_opset = 13  # (Unsqueeze's axes as an input)
    doc = "a reduction whose dropped axes are unsqueezed back, with keepdims"

    def find(self, node: ir.Node, ctx: RewriteContext) -> Rewrite | MatchFailure:
        reduced = node.inputs[0] if node.inputs else None
        reduce = reduced.producer() if reduced is not None else None
        if reduced is None or reduce is None or reduce.domain not in ("", "ai.onnx"):
            return fail("input is not a reduction", reduced)
        if reduce.op_type not in _REDUCTIONS:
            return fail(f"input is {reduce.op_type}, not a reduction", reduced)
        if len(reduced.uses()) != 1 or reduced.is_graph_output():
            return fail("the reduction's output is used elsewhere", reduced)
        if _int_attr(reduce, "keepdims", 1):
            return fail("the reduction keeps its dims already", reduced)
        x = reduce.inputs[0] if reduce.inputs else None
        dx = dims(x)
        if x is None or dx is None:
            return fail("the reduced input's rank is unknown", x)
        rank = len(dx)
        from_input = len(reduce.inputs) > 1 and reduce.inputs[1] is not None
        attribute = reduce.attributes.get("axes")
        axes = (
            const_ints(reduce.inputs[1])
            if from_input
            else (None if attribute is None else list(attribute.as_ints()))
        )
        if not axes or any(not -rank <= a < rank for a in axes):
            return fail("the reduced axes are not constant (or all axes)", reduced)
        reduced_axes = sorted(a % rank for a in axes)
        unsqueezed = const_ints(node.inputs[1]) if len(node.inputs) > 1 else None
        if unsqueezed is None or any(not -rank <= a < rank for a in unsqueezed):
            return fail("the Unsqueeze axes are not constant (or invalid)", node.inputs[1])
        if sorted(a % rank for a in unsqueezed) != reduced_axes:
            return fail(f"unsqueezes {unsqueezed}, not the reduced axes {reduced_axes}", reduced)
        attributes = {k: a.value for k, a in reduce.attributes.items() if k != "keepdims"}
        op = RewriteBuilder()
        kept = op.node("", reduce.op_type, list(reduce.inputs), {**attributes, "keepdims": 1})
        y = kept.outputs[0]
        out = node.outputs[0]
        y.type, y.shape = out.type, out.shape
        return Rewrite(Match([node, reduce], [out], {}, ctx.opset), op.nodes, [y])


rules = RuleSet("unit_axes", [ReshapeAsUnsqueeze(), ReduceKeepdims()])
"""The unit-axes rules."""
