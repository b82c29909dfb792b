"""Eager ALiBi attention on onnxruntime-genai's shared KV buffer → ``GroupQueryAttention`` with
``attention_bias`` (see :class:`SharedBuffer`).

transformers computes ALiBi attention eagerly (mpt): the cache concatenated, scores
``(Q @ Kᵀ) · scale + bias``, the causal + padding mask by ``Where``, ``Softmax``, ``@ V``; the
bias slices a constant table ``slope_h · j + c`` on its last axis. Identity (the shared
buffer's inputs as in :mod:`~irkit.rules.ort.attention.shared_buffer`)::

    Y, Concat(past_k, K), Concat(past_v, V) with
    Y = Softmax(Where(drop(attention_mask), ≤ -1e4, (Q @ Concat(past_k, K)ᵀ) · scale + bias))
        @ Concat(past_v, V)
      = to4(GroupQueryAttention(to3(Q), to3(K), to3(V), past_k, past_v, seqlens_k,
            total_sequence_length, attention_bias = slope_h · j  (1, heads, S, total)))

Softmax drops a per-row constant, so the table's offset ``c`` and the slice's start do not
matter; only the slopes (the table's step along its last axis, one per head) do. Measured:
onnxruntime 1.32's CPU kernel adds ``attention_bias`` on the shared buffer (batch 2
right-padded, prefill then decode: 3.6e-7 from numpy ALiBi attention).

Preconditions: float16/float32 4-D ``Q``/``K``/``V`` with static head counts and one head size
(a multiple of 8); the mask a ``Where`` whose condition is computed from the attention-mask
input without a sliding window and whose fill is ≤ -1e4; ``scale`` a constant; the bias a
chain of step-1 ``Slice`` s on the last axis of a constant ``(heads, 1, M)`` or
``(1, heads, 1, M)`` table, linear along that axis per head.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from irkit._irutil import node_attributes
from irkit.rewriting import (
    Match,
    MatchFailure,
    RewriteBuilder,
    Rule,
    Verdict,
    attr,
    const_value,
    dims,
    either,
    fail,
    var,
)
from irkit.rewriting import op as pat
from irkit.rules._alibi import alibi_slopes
from irkit.rules._ort_types import ORT_FLOAT_TYPES
from irkit.rules.ort.attention._base import MS, SharedBuffer, _graph_input, _reaches, _to3, _to4
from irkit.rules.ort.attention.shared_buffer import _sliding_window

_q, _k, _v = var("q"), var("k"), var("v")
_past_key, _past_value = var("past_key"), var("past_value")
_KEYS = pat.Concat(_past_key, _k, axis=attr("key_axis"))
_VALUES = pat.Concat(_past_value, _v, axis=attr("value_axis"))
_SCORES = either(
    pat.domain(MS).FusedMatMul(_q, _KEYS),  # (the "ort" target's FusedMatMul rule first)
    pat.MatMul(_q, pat.Transpose(_KEYS, perm=attr("perm"))),
    tag="form",
)
_PROBS = pat.Softmax(
    pat.Where(var("drop"), var("fill"), pat.Add(pat.Mul(_SCORES, var("scale")), var("bias"))),
    axis=attr("softmax_axis"),
)
_PATTERN = (pat.MatMul(_PROBS, _VALUES), _KEYS, _VALUES)
"""``Y, present_key, present_value``: eager attention over the concatenated cache."""


def _layout(
    q: ir.Value,
    k: ir.Value,
    v: ir.Value,
    key_axis: int,
    value_axis: int,
    softmax_axis: int,
    form: int,
    perm: list[int] | None,
    match: Match,
) -> tuple[int, int] | MatchFailure:
    """``(heads, kv_heads)`` of 4-D ``Q``/``K``/``V`` concatenated on the sequence axis and
    multiplied as ``Q @ Kᵀ`` (``form`` 0: ``FusedMatMul``, 1: ``MatMul`` of a ``Transpose``)."""
    if q.dtype not in ORT_FLOAT_TYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        return fail(f"dtype {q.dtype}: GroupQueryAttention runs float16/float32", q)
    dq, dk, dv = dims(q), dims(k), dims(v)
    if dq is None or dk is None or dv is None or not len(dq) == len(dk) == len(dv) == 4:
        return fail("Q, K, V must be 4-D (batch, heads, seq, head_size)", q)
    layout = (dq[1], dk[1], dq[3], dk[3], dv[3])
    if not all(isinstance(d, int) for d in layout) or len(set(layout[2:])) != 1:
        return fail(f"head counts / sizes {layout} not static or not one head size", q)
    heads, kv_heads, size = int(dq[1]), int(dk[1]), int(dq[3])  # type: ignore[arg-type]
    if dv[1] != kv_heads or heads % kv_heads or size % 8:
        return fail(f"{heads} query heads over {kv_heads} key/value heads, head size {size}", k)
    if dq[2] != dk[2]:
        return fail(f"query length {dq[2]} and new key length {dk[2]} differ", k)
    if (key_axis % 4, value_axis % 4, softmax_axis % 4) != (2, 2, 3):
        return fail("the cache is not concatenated on the sequence axis", k)
    if form == 0:
        fused = node_attributes(next(n for n in match.nodes if n.op_type == "FusedMatMul"))
        defaults = {"alpha": 1.0, "transA": 0, "transB": 0, "transBatchA": 0, "transBatchB": 0}
        if {**defaults, **fused} != {**defaults, "transB": 1}:
            return fail(f"FusedMatMul {fused}: not Q @ Kᵀ", q)
    elif (
        perm is None
        or list(perm)[-2:] != [len(perm) - 1, len(perm) - 2]
        or list(perm)[:-2] != list(range(len(perm) - 2))
    ):
        return fail(f"Transpose perm {perm}: not Kᵀ", k)
    return heads, kv_heads


def _check(
    q: ir.Value,
    k: ir.Value,
    v: ir.Value,
    drop: ir.Value,
    fill: ir.Value,
    scale: ir.Value,
    bias: ir.Value,
    key_axis: int,
    value_axis: int,
    softmax_axis: int,
    form: int,
    perm: list[int] | None,
    match: Match,
    shared: SharedBuffer,
) -> Verdict:
    """The preconditions (module docstring); findings: ``heads``, ``kv_heads``, ``slopes``,
    ``scale_value``, ``attention_mask``."""
    node = match.nodes[0]
    layout = _layout(q, k, v, key_axis, value_axis, softmax_axis, form, perm, match)
    if isinstance(layout, MatchFailure):
        return layout
    heads, kv_heads = layout
    scale_value = const_value(scale)
    fill_value = const_value(fill)
    if scale_value is None or scale_value.size != 1:
        return fail("the score scale is not a constant scalar", scale)
    if fill_value is None or fill_value.size != 1 or float(fill_value.reshape(())) > -1e4:
        return fail("the mask's fill is not a constant ≤ -1e4", fill)
    attention_mask = _graph_input(node, shared.mask_input)
    if attention_mask is None:
        return fail(f"the graph has no input {shared.mask_input!r}", None, node)
    if not _reaches(drop, attention_mask):  # (Where's condition: boolean by the op's type)
        return fail(f"the mask is not a condition computed from {shared.mask_input!r}", drop)
    window = _sliding_window(drop)
    if window is not None:
        return fail("a sliding window besides ALiBi", drop)
    slopes = alibi_slopes(bias, heads)
    if isinstance(slopes, MatchFailure):
        return slopes
    return {
        "heads": heads,
        "kv_heads": kv_heads,
        "slopes": slopes,
        "scale_value": float(scale_value.reshape(())),
        "attention_mask": attention_mask,
    }


def _rewrite(
    op: RewriteBuilder,
    q: ir.Value,
    k: ir.Value,
    v: ir.Value,
    past_key: ir.Value,
    past_value: ir.Value,
    heads: int,
    kv_heads: int,
    slopes: np.ndarray,
    scale_value: float,
    attention_mask: ir.Value,
) -> tuple[ir.Value, ir.Value, ir.Value]:
    """``to4(GroupQueryAttention(…, attention_bias=slope_h · j))`` and the presents."""
    i32 = ir.DataType.INT32
    dtype = q.dtype.numpy() if q.dtype is not None else np.dtype(np.float32)
    ones = op.ReduceSum(attention_mask, op.const(np.array([1], dtype=np.int64)), keepdims=0)
    seqlens = op.Cast(op.Sub(ones, op.const(np.array(1, dtype=np.int64))), to=i32)
    width = op.Shape(attention_mask, start=1, end=2)  # (1,) int64: total_sequence_length
    total = op.Cast(width, to=i32)  # (one element, as GroupQueryAttention takes it)
    zero, one = (op.const(np.array(x, dtype=np.int64)) for x in (0, 1))
    keys = op.Cast(op.Range(zero, op.Squeeze(width), one), to=ir.DataType.from_numpy(dtype))
    per_head = op.const(slopes.astype(dtype).reshape(1, heads, 1, 1))
    shape = op.Concat(
        op.const(np.array([1, heads], dtype=np.int64)), op.Shape(q, start=2, end=3), width, axis=0
    )
    bias = op.Expand(op.Mul(per_head, keys), shape)  # (1, heads, S, total)
    y, present_k, present_v = op.domain(MS).GroupQueryAttention(
        _to3(op, q),
        _to3(op, k),
        _to3(op, v),
        past_key,
        past_value,
        seqlens,
        total,
        None,
        None,
        None,
        bias,
        num_heads=heads,
        kv_num_heads=kv_heads,
        scale=scale_value,
        _outputs=3,
    )
    return _to4(op, y, heads, like=q), present_k, present_v


def alibi_rule(shared: SharedBuffer) -> Rule:
    """The eager ALiBi attention → ``GroupQueryAttention`` rule for genai's shared buffer."""

    def check(
        q: ir.Value,
        k: ir.Value,
        v: ir.Value,
        drop: ir.Value,
        fill: ir.Value,
        scale: ir.Value,
        bias: ir.Value,
        key_axis: int,
        value_axis: int,
        softmax_axis: int,
        form: int,
        perm: list[int] | None,
        match: Match,
    ) -> Verdict:
        return _check(
            q,
            k,
            v,
            drop,
            fill,
            scale,
            bias,
            key_axis,
            value_axis,
            softmax_axis,
            form,
            perm,
            match,
            shared,
        )

    return Rule("GroupQueryAttentionALiBi", _PATTERN, check=check, rewrite=_rewrite, min_opset=23)
