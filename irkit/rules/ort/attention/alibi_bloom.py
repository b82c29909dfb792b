"""Eager ALiBi attention in the ``(batch·heads, S, T)`` layout (bloom's ``baddbmm``) on
onnxruntime-genai's shared KV buffer → ``GroupQueryAttention`` with ``attention_bias``.

transformers' bloom merges batch and heads for its products and adds the ALiBi bias (computed
from the attention mask: ``slope_h · (cumsum(mask) - 1) · mask``, shape ``(batch·heads, 1,
T)``) to the scaled scores, then adds the causal + padding mask in 4-D. Identity (``r3`` a
``Reshape`` of ``(B, H, S, D)`` to ``(B·H, S, D)``, ``r4`` back; the cache as in
:mod:`~irkit.rules.ort.attention.alibi`)::

    r4(r3(Softmax(r4((r3(Q) @ r3(Concat(past_k, K))ᵀ) · scale + alibi) + mask))
       @ r3(Concat(past_v, V)))
      = to4(GroupQueryAttention(…, attention_bias = slope_h · j))

The slopes are read by evaluating the bias from the attention mask (ones of one row: ``slope_h
· j``, linear per head); on kept keys of a right-padded row ``cumsum(mask) - 1 = j``, and the
padded keys are dropped by ``seqlens_k``. The reshapes are checked to merge only batch and
heads: their trailing dimensions are ``(S, D)`` / ``(S, T)`` of the 4-D tensors (symbolic
dimensions compared as written by the exporter).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from irkit.rewriting import (
    Match,
    MatchFailure,
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
from irkit.rules.ort.attention._base import MS, SharedBuffer, _graph_input, _reaches
from irkit.rules.ort.attention.alibi import _KEYS, _VALUES, _layout, _q, _rewrite
from irkit.rules.ort.attention.rotary import _cone, _evaluate
from irkit.rules.ort.attention.shared_buffer import _keep_mask, _sliding_window

_Q3 = pat.Reshape(_q, var("q_shape"))
_K3 = pat.Reshape(_KEYS, var("k_shape"))
_SCORES3 = either(
    pat.domain(MS).FusedMatMul(_Q3, _K3),
    pat.MatMul(_Q3, pat.Transpose(_K3, perm=attr("perm"))),
    tag="form",
)
_SCORES4 = pat.Reshape(pat.Add(pat.Mul(_SCORES3, var("scale")), var("bias")), var("s4_shape"))
_PROBS = pat.Softmax(pat.Add(_SCORES4, var("mask")), axis=attr("softmax_axis"))
_CAST = pat.Cast(_PROBS, to=attr("cast_to"))  # (transformers' softmax in float32, cast back)
_Y3 = pat.MatMul(
    pat.Reshape(either(_CAST, _PROBS), var("p3_shape")), pat.Reshape(_VALUES, var("v_shape"))
)
_Y = pat.Reshape(_Y3, var("y_shape"))
_PATTERN = (_Y, _KEYS, _VALUES)
"""``Y, present_key, present_value``: bloom's attention over the concatenated cache."""


def _merges_batch_and_heads(match: Match, q: ir.Value, y: ir.Value) -> str | None:
    """``None`` when every 3-D ``Reshape`` of the match keeps the last two dimensions of its
    4-D input and the 4-D ones restore ``(B, H, S, ·)``; otherwise why not."""
    dq, dy = dims(q), dims(y)
    if dq is None or dy is None or list(dy) != list(dq):
        return f"the output {dy} is not of Q's shape {dq}"
    for node in match.nodes:
        if node.op_type != "Reshape" or node.inputs[0] is None:
            continue
        before, after = dims(node.inputs[0]), dims(node.outputs[0])
        if before is None or after is None or None in (*before, *after):
            return f"a Reshape of unknown shape {before} → {after}"
        if len(before) == 4 and len(after) == 3 and list(after[1:]) != list(before[2:]):
            return f"a Reshape {before} → {after} that does not merge batch and heads alone"
        if len(before) == 3 and len(after) == 4 and list(after[:3]) != [*dq[:2], before[1]]:
            return f"a Reshape {before} → {after} that does not split batch and heads back"
        if sorted((len(before), len(after))) != [3, 4]:
            return f"a Reshape {before} → {after}"
    return None


def _shape_feeds(
    bias: ir.Value, attention_mask: ir.Value, batch: object
) -> dict[ir.Value, np.ndarray] | str:
    """Zeros for the graph inputs besides ``attention_mask`` that the bias reads only the shape
    of (the batch size, ``batch``: 1; other symbolic dimensions, the past: 0)."""
    graph = attention_mask.graph
    others = [] if graph is None else [v for v in graph.inputs if v is not attention_mask]
    reached = _cone([bias], attention_mask, also=frozenset(others))
    if isinstance(reached, str):
        return f"the bias is not a function of the graph's inputs: {reached}"
    feeds: dict[ir.Value, np.ndarray] = {}
    for node in reached:
        for value in node.inputs:
            if value is None or value not in others or value in feeds:
                continue
            if any(u.op_type != "Shape" for u, _ in value.uses() if u in reached):
                return f"the bias reads {value.name!r} beyond its shape"
            sizes = dims(value)
            if sizes is None or value.dtype is None:
                return f"the bias reads the shape of {value.name!r}, unknown"
            shape = [d if isinstance(d, int) else int(d == batch) for d in sizes]
            feeds[value] = np.zeros(shape, dtype=value.dtype.numpy())
    return feeds


def _evaluated_slopes(bias: ir.Value, attention_mask: ir.Value, heads: int) -> np.ndarray | str:
    """The slopes of a ``(batch·heads, 1, T)`` ALiBi bias computed from ``attention_mask``:
    evaluated for one row of ones, linear along the keys per head; otherwise why not."""
    batch = (dims(attention_mask) or (None,))[0]
    feeds = _shape_feeds(bias, attention_mask, batch)
    if isinstance(feeds, str):
        return feeds
    nodes = _cone([bias], attention_mask, also=frozenset(feeds))
    if isinstance(nodes, str):
        return f"the bias is not a function of {attention_mask.name!r}: {nodes}"
    try:
        (value,) = _evaluate(
            nodes, attention_mask, [bias], np.ones((1, 8), dtype=np.int64), also=feeds
        )
    except Exception as exc:  # (the evaluator's own errors: kept, said why)
        return f"the bias could not be evaluated: {type(exc).__name__}: {exc}"
    if value.shape != (heads, 1, 8):
        return f"the bias for one row of 8 has shape {value.shape}, not ({heads}, 1, 8)"
    steps = np.diff(value.reshape(heads, 8).astype(np.float64), axis=1)
    if not np.allclose(steps, steps[:, :1], rtol=1e-5, atol=1e-6):
        return "the bias is not linear along the keys (not ALiBi)"
    return steps[:, 0]


def _check(
    q: ir.Value,
    k: ir.Value,
    v: ir.Value,
    mask: ir.Value,
    scale: ir.Value,
    bias: ir.Value,
    key_axis: int,
    value_axis: int,
    softmax_axis: int,
    form: int,
    perm: list[int] | None,
    cast_to: int | None,
    match: Match,
    shared: SharedBuffer,
) -> Verdict:
    """The preconditions (module docstring); findings as :mod:`~irkit.rules.ort.attention.alibi`'s."""
    node = match.nodes[0]
    layout = _layout(q, k, v, key_axis, value_axis, softmax_axis, form, perm, match)
    if isinstance(layout, MatchFailure):
        return layout
    heads, kv_heads = layout
    if cast_to is not None and (q.dtype is None or cast_to != q.dtype.value):
        return fail(f"the probabilities cast to data type {cast_to}, not Q's {q.dtype}", q)
    if heads != kv_heads:
        return fail(f"{heads} query heads but {kv_heads} key/value heads (one batch·heads)", k)
    why = _merges_batch_and_heads(match, q, node.outputs[0])
    if why is not None:
        return fail(why, None, node)
    scale_value = const_value(scale)
    if scale_value is None or scale_value.size != 1:
        return fail("the score scale is not a constant scalar", scale)
    attention_mask = _graph_input(node, shared.mask_input)
    if attention_mask is None:
        return fail(f"the graph has no input {shared.mask_input!r}", None, node)
    if not _reaches(mask, attention_mask):
        return fail(f"the mask is not computed from {shared.mask_input!r}", mask)
    if (why := _keep_mask(mask)) is not None:
        return fail(why, mask)
    if _sliding_window(mask) is not None:
        return fail("a sliding window besides ALiBi", mask)
    slopes = _evaluated_slopes(bias, attention_mask, heads)
    if isinstance(slopes, str):
        return fail(slopes, bias)
    return {
        "heads": heads,
        "kv_heads": kv_heads,
        "slopes": slopes,
        "scale_value": float(scale_value.reshape(())),
        "attention_mask": attention_mask,
    }


def alibi_bloom_rule(shared: SharedBuffer) -> Rule:
    """Bloom's eager ALiBi attention → ``GroupQueryAttention`` for genai's shared buffer."""

    def check(
        q: ir.Value,
        k: ir.Value,
        v: ir.Value,
        mask: ir.Value,
        scale: ir.Value,
        bias: ir.Value,
        key_axis: int,
        value_axis: int,
        softmax_axis: int,
        form: int,
        perm: list[int] | None,
        cast_to: int | None,
        match: Match,
    ) -> Verdict:
        return _check(
            q, k, v, mask, scale, bias, key_axis, value_axis, softmax_axis, form, perm, cast_to,
            match, shared,
        )  # fmt: skip

    return Rule(
        "GroupQueryAttentionALiBiBatchHeads", _PATTERN, check=check, rewrite=_rewrite, min_opset=23
    )
