r"""Packed QKV into ``GroupQueryAttention``: the op splits its query input itself.

Identity (``PackedQKVAttention``; ``PackedQKVAttentionSlices`` for the three ``Slice``\ s a
model's own packed projection is cut with, phi3's ``qkv_proj``)::

    q, k, v = Split(P, axis=-1)        # or P[..., 0:a], P[..., a:a+b], P[..., a+b:a+2b]
    GroupQueryAttention(q, k, v, past_k, past_v, …) = GroupQueryAttention(P, , , past_k, past_v, …)

``GroupQueryAttention`` reads a query of ``(num_heads + 2 · kv_num_heads) · head_size`` channels
with no key and value as the packed ``[Q | K | V]`` projection and splits it inside the kernel,
as in the models onnxruntime-genai's builder writes. The packed projection comes from
:mod:`irkit.rules.ort.packed` (one ``MatMul`` for the three).

A wider pack is cut in two (``PackedQKVAttentionOfWiderPack``): where the packing rule took
the attention's input projections together with others of the same input — a parallel block's
first MLP projection (phi's ``fc1``, GPT-J's ``fc_in``, Cohere's gate and up) — the ``Split``
copies every output, and the attention cannot read its part whole. Identity (``W`` the packed
constant weight of ``n`` columns, ``c`` the Q/K/V columns, the first of the ``Split``; ``b`` its
packed bias, if any)::

    GroupQueryAttention(Split(x @ W + b)[0..2], …), Split(x @ W + b)[3..]
        = GroupQueryAttention(x @ W[:, :c] + b[:c], , , …), Split(x @ W[:, c:] + b[c:])

the rest a bare product where it is one output, and as many bare products as outputs where it is
two (two packed are no fewer kernels, :mod:`irkit.rules.packed`). A phi-shaped int4 folder
(hidden 512, 4 layers) in onnxruntime-genai: per token 1.018 → 0.987 of the builder's, prefill
0.984 → 0.969 (8 processes of 10 interleaved rounds each).

Preconditions: Q, K and V are the three outputs, in order, of one ``Split`` on the last axis of
rank-3 values (or three step-1 slices of the last axis that tile ``P`` from 0 to its end) of known widths ``num_heads · h``, ``kv_num_heads · h`` and ``kv_num_heads · h``
for one ``h``; the node carries no attribute beyond those listed in :data:`_GQA` (one of a newer
onnxruntime stops the rewrite).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx_ir as ir

from irkit import metadata
from irkit.rewriting import (
    BaseRule,
    Match,
    MatchFailure,
    Rewrite,
    RewriteBuilder,
    RewriteContext,
    Rule,
    RuleSet,
    Verdict,
    attr,
    const_ints,
    dims,
    fail,
    optional,
    var,
    weight_constant,
)
from irkit.rewriting import op as pat
from irkit.rules.ort.attention._base import MS
from irkit.weights import narrow

__all__ = [
    "PACKED_QKV_ATTENTION",
    "PACKED_QKV_ATTENTION_SLICES",
    "PackedQKVAttentionOfWiderPack",
    "rules",
]

_ATTRIBUTES = (
    "num_heads",
    "kv_num_heads",
    "scale",
    "softcap",
    "local_window_size",
    "do_rotary",
    "rotary_interleaved",
    "smooth_softmax",
    "qk_output",
)
_TAIL = (
    "past_key",
    "past_value",
    "seqlens_k",
    "total_sequence_length",
    "cos_cache",
    "sin_cache",
    "position_ids",
    "attention_bias",
    "head_sink",
)

_CAPTURED: dict[str, Any] = {name: attr(name) for name in _ATTRIBUTES}
_packed = var("packed")
_q, _k, _v = pat.Split(_packed, optional(var("split")), axis=attr("axis"), _outputs=3)
_SLICES = [
    pat.Slice(_packed, var(f"start{i}"), var(f"end{i}"), var(f"axes{i}"), optional(var(f"step{i}")))
    for i in range(3)
]


def _gqa(q: Any, k: Any, v: Any) -> Any:
    return pat.domain(MS).GroupQueryAttention(
        q,
        k,
        v,
        *(optional(var(name)) for name in _TAIL),
        _outputs=3,
        _exact_attributes=True,
        **_CAPTURED,
    )


_GQA_SLICES = _gqa(*_SLICES)
"""``GroupQueryAttention(packed[…, a:b] ×3, …)`` with every attribute captured."""

_GQA = pat.domain(MS).GroupQueryAttention(
    _q,
    _k,
    _v,
    *(optional(var(name)) for name in _TAIL),
    _outputs=3,
    _exact_attributes=True,
    **_CAPTURED,
)
"""``GroupQueryAttention(Split(packed, axis)[0..2], …)`` with every attribute captured."""


def _rank(*values: ir.Value | None) -> int | None:
    return next((len(v.shape) for v in values if v is not None and v.shape is not None), None)


def _heads_fit(widths: list[Any], num_heads: int, kv_num_heads: int, q: ir.Value) -> Verdict:
    h = widths[0] // num_heads if isinstance(widths[0], int) and num_heads else 0
    if not h or widths != [num_heads * h, kv_num_heads * h, kv_num_heads * h]:
        return fail(
            f"Q/K/V widths {widths} are not {num_heads}/{kv_num_heads} heads of one size", q
        )
    return True


def _check(
    packed: ir.Value,
    split: ir.Value | None,
    axis: int,
    num_heads: int,
    kv_num_heads: int,
    match: Match,
) -> Verdict:
    q, k, v = next(n for n in match.nodes if n.op_type == "Split").outputs
    rank = _rank(packed, q)
    if rank != 3 or axis not in (-1, 2):
        return fail(f"the Split is on axis {axis} of a rank-{rank} value, not the last of 3", q)
    sizes = const_ints(split) if split is not None else None
    widths = list(sizes) if sizes else [d[-1] if (d := dims(t)) else None for t in (q, k, v)]
    return _heads_fit(widths, num_heads, kv_num_heads, q)


def _check_slices(packed: ir.Value, num_heads: int, kv_num_heads: int, match: Match) -> Verdict:
    gqa = next(n for n in match.nodes if n.op_type == "GroupQueryAttention")
    q = gqa.inputs[0]
    bounds: list[int] = []
    for slice_ in (v.producer() for v in gqa.inputs[:3] if v is not None):
        if slice_ is None:
            return fail("Q, K or V is not a slice", q)
        start, end, axes = (const_ints(slice_.inputs[i]) for i in (1, 2, 3))
        steps = const_ints(slice_.inputs[4]) if len(slice_.inputs) > 4 and slice_.inputs[4] else [1]
        if start is None or end is None or axes is None or steps != [1] or len(start) != 1:
            return fail(
                "a slice with non-constant bounds, several axes or a step", slice_.outputs[0]
            )
        if axes[0] not in (-1, 2) or _rank(packed, q) != 3:
            return fail(
                f"a slice on axis {axes[0]}, not the last of a 3-D value", slice_.outputs[0]
            )
        if start[0] != (bounds[-1] if bounds else 0):
            return fail("the slices do not tile the packed projection in order", slice_.outputs[0])
        bounds += [start[0], end[0]]
    width = (dims(packed) or [None])[-1]
    if not isinstance(width, int) or bounds[-1] < width:
        return fail(f"the slices end at {bounds[-1]}, not at the packed width {width}", packed)
    bounds[-1] = width
    widths = [bounds[i + 1] - bounds[i] for i in range(0, 6, 2)]
    if q is None or len(bounds) != 6:
        return fail("Q, K or V is missing", None, gqa)
    return _heads_fit(widths, num_heads, kv_num_heads, q)


def _packed_gqa(op: RewriteBuilder, packed: ir.Value, **bound: Any) -> Any:
    """``GroupQueryAttention(packed, , , …)`` with the matched tail inputs and attributes."""
    tail = [bound[name] for name in _TAIL]
    while tail and tail[-1] is None:
        tail.pop()
    return op.domain(MS).GroupQueryAttention(
        packed, None, None, *tail, **{name: bound[name] for name in _ATTRIBUTES}, _outputs=3
    )


PACKED_QKV_ATTENTION = Rule(
    "PackedQKVAttention",
    _GQA,
    check=_check,
    rewrite=_packed_gqa,
    doc="GroupQueryAttention reads the packed [Q | K | V] projection and splits it inside",
)
"""``GroupQueryAttention(Split(P))`` → ``GroupQueryAttention(P)`` (see the module docstring)."""

PACKED_QKV_ATTENTION_SLICES = Rule(
    "PackedQKVAttentionSlices",
    _GQA_SLICES,
    check=_check_slices,
    rewrite=_packed_gqa,
    doc="GroupQueryAttention reads the packed projection its Q/K/V were sliced from",
)
"""``GroupQueryAttention(P[…, 0:a], P[…, a:b], P[…, b:c])`` → ``GroupQueryAttention(P)``."""


class PackedQKVAttentionOfWiderPack(BaseRule):
    """Q/K/V the first three outputs of a wider pack: the pack cut in two (module docstring)."""

    name = "PackedQKVAttentionOfWiderPack"
    anchors = frozenset({(MS, "GroupQueryAttention")})
    doc = "a pack wider than Q/K/V cut so that GroupQueryAttention reads its part whole"

    def find(self, node: ir.Node, ctx: RewriteContext) -> Rewrite | MatchFailure:
        q = node.inputs[0] if node.inputs else None
        split = q.producer() if q is not None else None
        if q is None or split is None or split.op_type != "Split" or split.domain != "":
            return fail("the query is not an output of a Split", q, node)
        if len(split.outputs) <= 3 or list(node.inputs[:3]) != list(split.outputs[:3]):
            return fail("Q, K, V are not the first three outputs of a Split of more", q)
        if any(len(v.uses()) != 1 or v.is_graph_output() for v in split.outputs[:3]):
            return fail("Q, K or V is read by more than the attention", q)
        axis = split.attributes.get_int("axis", 0)
        sizes = const_ints(split.inputs[1]) if len(split.inputs) > 1 else None
        packed = split.inputs[0]
        if packed is None or sizes is None or _rank(packed, q) != 3 or axis not in (-1, 2):
            return fail("the Split is not on the last axis of a 3-D value, sizes constant", q)
        heads = {a: node.attributes.get_int(a, 0) for a in ("num_heads", "kv_num_heads")}
        fits = _heads_fit(sizes[:3], heads["num_heads"], heads["kv_num_heads"], q)
        if fits is not True:
            return fits  # type: ignore[return-value]
        product = _packed_product(packed)
        if isinstance(product, MatchFailure):
            return product
        x, weight, bias, nodes = product
        op = RewriteBuilder()
        width = sum(sizes[:3])
        total = sum(sizes)

        def project(start: int, length: int) -> ir.Value:
            y: ir.Value = op.MatMul(x, weight_constant(op, narrow(weight, 1, start, length)))
            if bias is not None:
                y = op.Add(y, weight_constant(op, narrow(bias, 0, start, length)))
            return y

        tail = list(node.inputs[3:])
        while tail and tail[-1] is None:
            tail.pop()
        attributes = {name: a.value for name, a in node.attributes.items()}
        outs = op.domain(MS).GroupQueryAttention(
            project(0, width), None, None, *tail, **attributes, _outputs=len(node.outputs)
        )
        # the op and its projection stay in the attention's scope (its module call one region);
        # the rest gets the engine's deepest common scope of the matched nodes
        scope = node.metadata_props.get(metadata.SCOPE)
        if scope is not None:
            for made in op.nodes:
                made.metadata_props[metadata.SCOPE] = scope
        rest = sizes[3:]
        if len(rest) >= 3:  # (packed rest: fewer kernels, as the packing rule decides)
            parts = op.Split(
                project(width, total - width),
                op.const(np.array(rest, dtype=np.int64)),
                axis=-1,
                _outputs=len(rest),
            )
            others = list(parts) if isinstance(parts, (list, tuple)) else [parts]
        else:
            starts = np.cumsum([width, *rest[:-1]]).tolist()
            others = [project(int(a), int(n)) for a, n in zip(starts, rest, strict=True)]
        match = Match([node, split, *nodes], [*node.outputs, *split.outputs[3:]], {}, ctx.opset)
        return Rewrite(match, op.nodes, [*(outs if len(node.outputs) > 1 else [outs]), *others])


def _packed_product(
    packed: ir.Value,
) -> tuple[ir.Value, ir.TensorProtocol, ir.TensorProtocol | None, list[ir.Node]] | MatchFailure:
    """``x @ W`` or ``x @ W + b`` with constant 2-D ``W`` (and 1-D ``b``), read only by the Split:
    ``(x, W, b, nodes)``."""
    node = packed.producer()
    if node is None or len(list(packed.uses())) != 1:
        return fail("the packed projection is not a node's output read only by the Split", packed)
    bias = None
    nodes = [node]
    if node.op_type == "Add" and node.domain == "":
        tensor = node.inputs[1].const_value if node.inputs[1] is not None else None
        inner = node.inputs[0]
        if tensor is None or len(tensor.shape) != 1 or inner is None:
            return fail("the packed projection's Add is not of a constant 1-D bias", packed)
        product = inner.producer()
        if len(list(inner.uses())) != 1 or product is None:
            return fail("the packed product has other readers than its bias Add", inner)
        bias, node = tensor, product
        nodes.append(node)
    if node.op_type != "MatMul" or node.domain != "":
        return fail("the packed projection is not a MatMul", packed)
    weight = node.inputs[1].const_value if node.inputs[1] is not None else None
    if weight is None or len(weight.shape) != 2 or node.inputs[0] is None:
        return fail("the packed MatMul's weight is not a constant matrix", packed)
    return node.inputs[0], weight, bias, nodes


rules = RuleSet(
    "ort_packed_qkv",
    [PACKED_QKV_ATTENTION, PACKED_QKV_ATTENTION_SLICES, PackedQKVAttentionOfWiderPack()],
)
"""The packed-QKV rule."""
