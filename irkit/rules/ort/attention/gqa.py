"""``Attention`` → ``GroupQueryAttention`` (causal; opt-in: masked, dynamic past)."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from irkit.rewriting import (
    Match,
    MatchFailure,
    RewriteBuilder,
    Rule,
    RuleSet,
    Verdict,
    dims,
    fail,
)
from irkit.rules.ort.attention._base import (
    _ATTENTION,
    _ATTENTION_KV_CACHE,
    MS,
    SharedBuffer,
    _bias4,
    _common,
    _Heads,
    _mask_rank,
    _no_inf_bias,
    _to3,
    _to4,
)
from irkit.rules.ort.attention.alibi import alibi_rule
from irkit.rules.ort.attention.alibi_bloom import alibi_bloom_rule
from irkit.rules.ort.attention.rotary import _fold_rotary, _Folded
from irkit.rules.ort.attention.shared_buffer import shared_buffer_rule


def _check_gqa(
    q: ir.Value,
    k: ir.Value,
    mask: ir.Value | None,
    past_key: ir.Value | None,
    is_causal: int,
    match: Match,
    dynamic_past: bool,
    masked: bool,
) -> Verdict:
    """The preconditions of ``GroupQueryAttention`` (see the module docstring); findings:
    ``heads``, ``mask_rank`` (of the mask passed as ``attention_bias``) and ``rotary`` (the
    rotations the op absorbs, or ``None``)."""
    node = match.nodes[0]
    heads = _common(node)
    if isinstance(heads, MatchFailure):
        return heads
    if not masked and not is_causal:
        return fail(
            "not causal (is_causal=0): GroupQueryAttention is causal "
            "(ort.default_rules(gqa_masked=True) sets causal=0: onnxruntime > 1.20)",
            None,
            node,
        )
    if not masked and mask is not None:
        return fail(
            "has an attention mask besides the causal one (ort.default_rules(gqa_masked=True) "
            "passes it as attention_bias: onnxruntime > 1.20)",
            mask,
        )
    mask_rank = None if mask is None else _mask_rank(mask, q)
    if isinstance(mask_rank, MatchFailure):
        return mask_rank
    if mask is not None and not is_causal:  # (causal: 0 for such a row, measured)
        finite = _no_inf_bias(mask, "GroupQueryAttention with causal=0")
        if finite is not True:
            return finite
    if heads.head_size % 8:
        return fail(
            f"head size {heads.head_size} is not a multiple of 8 (onnxruntime CPU)", None, node
        )
    dq, dk = dims(q), dims(k)
    if dq is None or dk is None or dq[2] is None or dq[2] != dk[2]:
        return fail(f"query length {dq and dq[2]} and new key length {dk and dk[2]} differ", k)
    if past_key is not None and dq[0] != 1 and dq[2] != 1 and not dynamic_past:
        return fail(
            f"batch {dq[0]} and {dq[2]} new tokens with a past: onnxruntime's "
            "GroupQueryAttention runs a past only with batch 1 or one new token "
            "(ort.default_rules(gqa_dynamic_past=True) fuses anyway)",
            q,
        )
    if mask is not None and past_key is not None and q.dtype == ir.DataType.FLOAT16 and dq[0] != 1:
        # Measured (tests/rules/ort/test_attention.py): onnxruntime 1.32's CPU kernel gives
        # wrong numbers for every batch row but the first (max error 0.85).
        return fail(
            f"float16 with an attention_bias, a past and batch {dq[0]}: onnxruntime's CPU "
            "GroupQueryAttention computes rows after the first wrongly in this form",
            q,
        )
    return {"heads": heads, "mask_rank": mask_rank, "rotary": _fold_rotary(q, k, heads.head_size)}


def _gqa(
    op: RewriteBuilder,
    q: ir.Value,
    k: ir.Value,
    v: ir.Value,
    mask: ir.Value | None,
    past_key: ir.Value | None,
    past_value: ir.Value | None,
    scale: float | None,
    softcap: float,
    is_causal: int,
    heads: _Heads,
    mask_rank: int | None,
    rotary: _Folded | None,
) -> tuple[ir.Value, ir.Value, ir.Value]:
    """``to4(GroupQueryAttention(to3(Q), to3(K), to3(V), past_key, past_value, seqlens_k,
    total_len, cos?, sin?, position_ids?, attention_bias?))``, the presents."""
    cos = sin = pos = None
    interleaved = 0
    if rotary is not None:
        q, k, cos, sin, pos, interleaved = rotary
    i32 = ir.DataType.INT32
    new = op.Shape(k, start=2, end=3)
    total = new if past_key is None else op.Add(new, op.Shape(past_key, start=2, end=3))
    total32 = op.Cast(total, to=i32)
    batch = op.Shape(q, start=0, end=1)
    one = op.const(np.array([1], dtype=np.int32))
    seqlens = op.Expand(op.Sub(total32, one), batch)
    y, present_k, present_v = op.domain(MS).GroupQueryAttention(
        _to3(op, q),
        _to3(op, k),
        _to3(op, v),
        past_key,
        past_value,
        seqlens,
        total32,  # (one element: the kernels take a scalar or a 1-element vector)
        cos,
        sin,
        pos,
        _bias4(op, mask, mask_rank),
        num_heads=heads.q_heads,
        kv_num_heads=heads.kv_heads,
        causal=None if is_causal else 0,
        scale=scale,
        softcap=softcap or None,
        do_rotary=1 if rotary is not None else None,
        rotary_interleaved=interleaved if rotary is not None else None,
        _outputs=3,
    )
    return _to4(op, y, heads.q_heads, like=q), present_k, present_v


def _gqa_y(
    op: RewriteBuilder,
    q: ir.Value,
    k: ir.Value,
    v: ir.Value,
    mask: ir.Value | None,
    scale: float | None,
    softcap: float,
    is_causal: int,
    heads: _Heads,
    mask_rank: int | None,
    rotary: _Folded | None,
) -> ir.Value:
    """``to4(GroupQueryAttention(to3(Q), to3(K), to3(V), , , seqlens_k, total_len, …))``."""
    args = (scale, softcap, is_causal, heads, mask_rank, rotary)
    return _gqa(op, q, k, v, mask, None, None, *args)[0]


def group_query_attention(
    dynamic_past: bool = False, masked: bool = False, shared: SharedBuffer | None = None
) -> RuleSet:
    """The ``GroupQueryAttention`` rules (by default: causal ``Attention`` without a mask):
    ``GroupQueryAttentionKVCache`` for an ``Attention`` with present outputs (and a past or
    not), ``GroupQueryAttention`` for one without.

    Args:
        dynamic_past: Also fuse when batch and new-token count are dynamic and there is a past.
            onnxruntime then runs prefill (empty past) and decoding (one new token) at any batch
            size, but raises an error for a step with several new tokens, a non-empty past and
            batch > 1 (chunked prefill in a batch). Off by default: the fusion must not make a
            valid input fail.
        masked: Also fuse ``Attention`` with an additive float mask (HF's causal + padding
            mask) or without ``is_causal``: the mask becomes the op's ``attention_bias`` input
            and ``causal`` is the node's ``is_causal``. Both are newer than onnxruntime 1.20
            (tested with 1.32), so this is opt-in.
        shared: Write the op for onnxruntime-genai's shared KV buffer (see
            :class:`SharedBuffer`): every ``Attention`` with a past whose mask, if any, is
            computed from the attention-mask input (the one rule
            ``GroupQueryAttentionKVCache``, :func:`shared_buffer_rule`).
    """
    if shared is not None:
        return RuleSet(
            "ort_gqa", [shared_buffer_rule(shared), alibi_rule(shared), alibi_bloom_rule(shared)]
        )

    def check(
        q: ir.Value,
        k: ir.Value,
        mask: ir.Value | None,
        past_key: ir.Value | None,
        is_causal: int,
        match: Match,
    ) -> Verdict:
        return _check_gqa(q, k, mask, past_key, is_causal, match, dynamic_past, masked)

    return RuleSet(
        "ort_gqa",
        [
            Rule(  # (Y, presents) = Attention(Q, K, V, mask?, past?) = to4(GQA(to3(Q), …))
                "GroupQueryAttentionKVCache",
                _ATTENTION_KV_CACHE,
                check=check,
                rewrite=_gqa,
                min_opset=23,
            ),
            Rule(  # Y = Attention(Q, K, V, mask?) = to4(GQA(to3(Q), to3(K), to3(V), …))
                "GroupQueryAttention",
                _ATTENTION,
                check=lambda q, k, mask, is_causal, match: check(
                    q, k, mask, None, is_causal, match
                ),
                rewrite=_gqa_y,
                min_opset=23,
            ),
        ],
    )
