"""Non-causal ``Attention`` → ``MultiHeadAttention``."""

from __future__ import annotations

import onnx_ir as ir

from irkit._irutil import node_attributes
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
    _bias4,
    _common,
    _Heads,
    _input,
    _mask_rank,
    _no_inf_bias,
    _to3,
    _to4,
)


def _bias_fits(mask: ir.Value, q: ir.Value, k: ir.Value, past: ir.Value | None) -> Verdict:
    """``attention_bias`` is ``(B or 1, H or 1, S, past + L)`` exactly (onnxruntime checks its
    last two dims: "dimension 2 should be same as sequence_length"); where the dims are known,
    the mask's must be those."""
    md, qd, kd = dims(mask), dims(q), dims(k)
    if md is None or qd is None or kd is None:
        return True
    md = (1,) * (2 - len(md)) + tuple(md)  # (a rank-0/1 mask is unsqueezed to 4-D)
    past_len = 0 if past is None else (dims(past) or (None,) * 4)[2]
    total = kd[2] + past_len if isinstance(kd[2], int) and isinstance(past_len, int) else None
    for name, d, want in (("query", md[-2], qd[2]), ("key", md[-1], total)):
        if isinstance(d, int) and isinstance(want, int) and d != want:
            return fail(
                f"the mask's {name} dim {d} is not {want}: attention_bias takes no broadcast there",
                mask,
            )
    return True


def _check_mha(
    q: ir.Value,
    k: ir.Value,
    mask: ir.Value | None,
    softcap: float,
    match: Match,
) -> Verdict:
    """The preconditions of ``MultiHeadAttention``; findings: ``heads``, ``mask_rank``."""
    node = match.nodes[0]
    heads = _common(node)
    if isinstance(heads, MatchFailure):
        return heads
    if node_attributes(node).get("is_causal", 0):
        return fail("causal (is_causal=1): left to GroupQueryAttention", None, node)
    if softcap:
        return fail("softcap: MultiHeadAttention has none", None, node)
    if heads.q_heads != heads.kv_heads:
        return fail(f"{heads.q_heads} query heads but {heads.kv_heads} key/value heads", None, node)
    mask_rank = None if mask is None else _mask_rank(mask, q)
    if isinstance(mask_rank, MatchFailure):
        return mask_rank
    fits = True if mask is None else _bias_fits(mask, q, k, _input(node, 4))
    if fits is not True:
        return fits
    finite = True if mask is None else _no_inf_bias(mask, "MultiHeadAttention")
    if finite is not True:
        return finite
    return {"heads": heads, "mask_rank": mask_rank}


def _mha(
    op: RewriteBuilder,
    q: ir.Value,
    k: ir.Value,
    v: ir.Value,
    mask: ir.Value | None,
    past_key: ir.Value | None,
    past_value: ir.Value | None,
    scale: float | None,
    heads: _Heads,
    mask_rank: int | None,
) -> tuple[ir.Value, ir.Value, ir.Value]:
    """``to4(MultiHeadAttention(to3(Q), to3(K), to3(V), , , bias?, past_key?, past_value?))``,
    the presents."""
    y, present_k, present_v = op.domain(MS).MultiHeadAttention(
        _to3(op, q),
        _to3(op, k),
        _to3(op, v),
        None,
        None,
        _bias4(op, mask, mask_rank),
        past_key,
        past_value,
        num_heads=heads.q_heads,
        scale=scale,
        _outputs=3,
    )
    return _to4(op, y, heads.q_heads), present_k, present_v


def _mha_y(
    op: RewriteBuilder,
    q: ir.Value,
    k: ir.Value,
    v: ir.Value,
    mask: ir.Value | None,
    scale: float | None,
    heads: _Heads,
    mask_rank: int | None,
) -> ir.Value:
    """``to4(MultiHeadAttention(to3(Q), to3(K), to3(V), , , bias?))``."""
    return _mha(op, q, k, v, mask, None, None, scale, heads, mask_rank)[0]


MULTI_HEAD_ATTENTION = RuleSet(
    "ort_mha",
    [
        Rule(  # (Y, presents) = Attention(Q, K, V, bias?, past?) = to4(MHA(to3(Q), …))
            "MultiHeadAttentionKVCache",
            _ATTENTION_KV_CACHE,
            check=_check_mha,
            rewrite=_mha,
            min_opset=23,
        ),
        Rule(  # Y = Attention(Q, K, V, bias?) = to4(MHA(to3(Q), to3(K), to3(V), , , bias))
            "MultiHeadAttention",
            _ATTENTION,
            check=_check_mha,
            rewrite=_mha_y,
            min_opset=23,
        ),
    ],
)
"""The non-causal ``Attention`` → ``MultiHeadAttention`` rules (with and without a cache)."""
