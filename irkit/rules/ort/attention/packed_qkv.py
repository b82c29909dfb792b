r"""Packed QKV into ``GroupQueryAttention``: the op splits its query input itself.

Identity (``PackedQKVAttention``; ``PackedQKVAttentionSlices`` for the three ``Slice``\ s a
model's own packed projection is cut with, phi3's ``qkv_proj``)::

    q, k, v = Split(P, axis=-1)        # or P[..., 0:a], P[..., a:a+b], P[..., a+b:a+2b]
    GroupQueryAttention(q, k, v, past_k, past_v, …) = GroupQueryAttention(P, , , past_k, past_v, …)

``GroupQueryAttention`` reads a query of ``(num_heads + 2 · kv_num_heads) · head_size`` channels
with no key and value as the packed ``[Q | K | V]`` projection and splits it inside the kernel,
as in the models onnxruntime-genai's builder writes. The packed projection comes from
:mod:`irkit.rules.ort.packed` (one ``MatMul`` for the three).

Preconditions: Q, K and V are the three outputs, in order, of one ``Split`` on the last axis of
rank-3 values (or three step-1 slices of the last axis that tile ``P`` from 0 to its end) of known widths ``num_heads · h``, ``kv_num_heads · h`` and ``kv_num_heads · h``
for one ``h``; the node carries no attribute beyond those listed in :data:`_GQA` (one of a newer
onnxruntime stops the rewrite).
"""

from __future__ import annotations

from typing import Any

import onnx_ir as ir

from irkit.rewriting import (
    Match,
    RewriteBuilder,
    Rule,
    RuleSet,
    Verdict,
    attr,
    const_ints,
    dims,
    fail,
    optional,
    var,
)
from irkit.rewriting import op as pat
from irkit.rules.ort.attention._base import MS

__all__ = ["PACKED_QKV_ATTENTION", "PACKED_QKV_ATTENTION_SLICES", "rules"]

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

rules = RuleSet("ort_packed_qkv", [PACKED_QKV_ATTENTION, PACKED_QKV_ATTENTION_SLICES])
"""The packed-QKV rule."""
