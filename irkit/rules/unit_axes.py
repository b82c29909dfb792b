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

- ``Reshape(Squeeze(s), [±1]) = s`` and ``Reshape(Neg(Squeeze(s)), [±1]) = Neg(s)`` for ``s``
  of static shape ``[1]`` (``ScalarRoundTrip``): a length read as a scalar
  (``Squeeze(Shape(x, a, a + 1))``: ``x.shape[a]`` under ``torch.export``), negated, and made a
  one-element vector again for a ``Slice`` bound — ``attention_mask[:, -S:]``, the decode
  step's mask of its new tokens: two kernels a step less.

They hold at every opset with ``Unsqueeze`` axes as an input (≥ 13), in function bodies too.
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

__all__ = ["ReduceKeepdims", "ReshapeAsUnsqueeze", "ScalarRoundTrip", "rules"]

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


def _one_element(s: ir.Value) -> bool:
    """``s`` is of shape ``[1]``: known so, or a ``Shape(x, start, end)`` of one dim."""
    if list(dims(s) or ()) == [1]:
        return True
    shape = s.producer()
    if shape is None or not _standard(shape, "Shape") or not shape.inputs:
        return False
    start, end = shape.attributes.get("start"), shape.attributes.get("end")
    if start is None or end is None:
        return False
    first, last = int(start.as_int()), int(end.as_int())
    rank = len(dims(shape.inputs[0]) or ()) or None
    if (first < 0) != (last < 0):  # (one bound from the end: the rank resolves it)
        if rank is None:
            return False
        first, last = first % rank, last % rank if last < 0 else last
    return last - first == 1


class ScalarRoundTrip(BaseRule):
    """``Reshape(Neg(Squeeze(s)), [±1])`` → ``Neg(s)`` (or without the ``Neg``: ``s``), ``s``
    of static shape ``[1]`` (module docstring). Only the ``Reshape`` is replaced: the scalar
    may have other readers (the mask sliced twice by ``-S``), and it goes with the last of them.
    """

    name = "ScalarRoundTrip"
    anchors = frozenset({("", "Reshape")})
    doc = "a one-element vector squeezed (and negated) then reshaped back to one element"

    def find(self, node: ir.Node, ctx: RewriteContext) -> Rewrite | MatchFailure:
        x = node.inputs[0] if node.inputs else None
        target = const_ints(node.inputs[1]) if len(node.inputs) > 1 else None
        if target not in ([1], [-1]):
            return fail("the Reshape target is not [1] or [-1]", x)
        inner = x.producer() if x is not None else None
        negated = _standard(inner, "Neg")
        squeezed = inner.inputs[0] if negated and inner is not None else x
        squeeze = squeezed.producer() if squeezed is not None else None
        if squeeze is None or not _standard(squeeze, "Squeeze"):
            return fail("the reshaped value is not a Squeeze (or its Neg)", x)
        s = squeeze.inputs[0] if squeeze.inputs else None
        axes = squeeze.inputs[1] if len(squeeze.inputs) > 1 else None
        if s is None or not _one_element(s):
            return fail("the squeezed value is not of static shape [1]", s)
        if axes is not None and const_ints(axes) not in ([0], [-1]):
            return fail("the Squeeze axes are not [0] (constant)", axes)
        out = node.outputs[0]
        if not negated:
            return Rewrite(Match([node], [out], {}, ctx.opset), [], [s])
        op = RewriteBuilder()
        y = op.Neg(s)
        y.type, y.shape = out.type, out.shape
        return Rewrite(Match([node], [out], {}, ctx.opset), op.nodes, [y])


rules = RuleSet("unit_axes", [ScalarRoundTrip(), ReshapeAsUnsqueeze(), ReduceKeepdims()])
"""The unit-axes rules."""
