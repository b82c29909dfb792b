"""``GroupQueryAttention`` on onnxruntime-genai's shared KV buffer (see :class:`SharedBuffer`)."""

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
    const_value,
    dims,
    fail,
)
from irkit.rules.ort.attention._base import (
    _ATTENTION_WITH_PAST,
    MS,
    SharedBuffer,
    _common,
    _graph_input,
    _Heads,
    _reaches,
    _to3,
    _to4,
)
from irkit.rules.ort.attention.rotary import RotaryCaches, _rotary_caches

_SHAPE_ONLY = frozenset({"Expand", "Unsqueeze", "Reshape", "Identity", "Squeeze"})


def _keeps_or_drops(node: ir.Node) -> bool:
    """A shape-only op, or ``Max(x, floor ≤ -1e4)`` (the floor :mod:`irkit.rules.attention`
    gives a mask): the mask keeps and drops the keys ``x`` does."""
    if node.op_type == "Max" and len(node.inputs) == 2:
        floor = const_value(node.inputs[1])
        return floor is not None and floor.size == 1 and float(floor.reshape(())) <= -1e4
    return node.op_type in _SHAPE_ONLY


def _keep_mask(mask: ir.Value) -> str | None:
    """``None`` when ``mask`` only keeps or drops keys (a boolean mask, or
    ``Where(keep, 0, ≤ -1e4)``, through shape-only ops); otherwise why not: an additive bias
    (ALiBi, relative positions) that ``GroupQueryAttention`` on the shared buffer would lose."""
    v = mask
    while (p := v.producer()) is not None and p.domain == "" and _keeps_or_drops(p):
        if p.inputs[0] is None:
            break
        v = p.inputs[0]
    if v.dtype == ir.DataType.BOOL:
        return None
    p = v.producer()
    if p is not None and p.op_type == "Where" and p.domain == "" and len(p.inputs) == 3:
        keep, drop = const_value(p.inputs[1]), const_value(p.inputs[2])
        scalars = keep is not None and drop is not None and keep.size == drop.size == 1
        if scalars and float(keep.reshape(())) == 0.0 and float(drop.reshape(())) <= -1e4:  # type: ignore[union-attr]
            return None
    return (
        "the mask adds more than 0 / -inf (ALiBi or another bias): GroupQueryAttention on "
        "the shared buffer would drop it"
    )


def _sliding_window(mask: ir.Value, limit: int = 400) -> int | None | MatchFailure:
    """The window ``W`` of a Hugging Face sliding-window mask (``kv_idx > q_idx - W``: the query
    sees itself and the ``W - 1`` keys before it), ``None`` for a mask without one."""
    found: set[int] = set()
    seen: set[int] = set()
    stack = [mask]
    while stack and len(seen) < limit:
        v = stack.pop()
        if id(v) in seen:
            continue
        seen.add(id(v))
        p = v.producer()
        if p is None:
            continue
        if p.op_type == "Greater" and p.domain == "" and len(p.inputs) == 2:
            sub = p.inputs[1].producer() if p.inputs[1] is not None else None
            if sub is not None and sub.op_type == "Sub" and sub.inputs[1] is not None:
                w = const_value(sub.inputs[1])
                if w is not None and w.size == 1:
                    found.add(int(w.reshape(())))
        stack.extend(i for i in p.inputs if i is not None)
    if stack:
        return fail(f"the mask's computation has over {limit} values: its window is unknown", mask)
    if len(found) > 1:
        return fail(f"the mask has several windows {sorted(found)}", mask)
    return found.pop() if found else None


def _check_shared(
    q: ir.Value, k: ir.Value, mask: ir.Value | None, match: Match, shared: SharedBuffer
) -> Verdict:
    """The preconditions of the shared-buffer form; findings: ``heads``, ``window``,
    ``rotary`` (or ``None``: the rotation stays outside), ``attention_mask``."""
    node = match.nodes[0]
    heads = _common(node)
    if isinstance(heads, MatchFailure):
        return heads
    if heads.head_size % 8:
        return fail(
            f"head size {heads.head_size} is not a multiple of 8 (onnxruntime CPU)", None, node
        )
    attention_mask = _graph_input(node, shared.mask_input)
    if attention_mask is None:
        return fail(f"the graph has no input {shared.mask_input!r}", None, node)
    if mask is None and not node_attributes(node).get("is_causal", 0):
        return fail("not causal and no mask", None, node)
    if mask is not None and not _reaches(mask, attention_mask):
        return fail(f"the mask is not computed from {shared.mask_input!r}", mask)
    if mask is not None and (why := _keep_mask(mask)) is not None:
        return fail(why, mask)
    window = None if mask is None else _sliding_window(mask)
    if isinstance(window, MatchFailure):
        return window
    if window is not None and window < 1:
        return fail(f"sliding window {window} < 1", mask)
    dq, dk = dims(q), dims(k)
    if dq is None or dk is None or dq[2] != dk[2]:
        return fail(f"query length {dq and dq[2]} and new key length {dk and dk[2]} differ", k)
    rotary = _rotary_caches(node, q, k, heads.head_size, shared)
    return {
        "heads": heads,
        "window": window,
        "rotary": None if isinstance(rotary, MatchFailure) else rotary,
        "attention_mask": attention_mask,
    }


def _gqa_shared(
    op: RewriteBuilder,
    q: ir.Value,
    k: ir.Value,
    v: ir.Value,
    past_key: ir.Value,
    past_value: ir.Value,
    scale: float | None,
    softcap: float,
    heads: _Heads,
    window: int | None,
    rotary: RotaryCaches | None,
    attention_mask: ir.Value,
) -> tuple[ir.Value, ir.Value, ir.Value]:
    """``to4(GroupQueryAttention(to3(Q), to3(K), to3(V), past_key, past_value, seqlens_k,
    total_sequence_length, cos_cache?, sin_cache?))`` fed from the attention-mask input (see
    :class:`SharedBuffer`)."""
    i32 = ir.DataType.INT32
    ones = op.ReduceSum(attention_mask, op.const(np.array([1], dtype=np.int64)), keepdims=0)
    seqlens = op.Cast(op.Sub(ones, op.const(np.array(1, dtype=np.int64))), to=i32)
    # (a 1-element vector: every GroupQueryAttention kernel takes a scalar or one element)
    total = op.Cast(op.Shape(attention_mask, start=1, end=2), to=i32)
    cos = sin = None
    interleaved = 0
    if rotary is not None:
        q, k, interleaved = rotary.q, rotary.k, rotary.interleaved
        cos, sin = op.const(rotary.cos), op.const(rotary.sin)
        if rotary.switch is not None and rotary.short_cos is not None:
            # longrope: the long factors once the batch's total length reaches the switch
            long = op.GreaterOrEqual(total, op.const(np.array(rotary.switch, dtype=np.int32)))
            cos = op.Where(long, cos, op.const(rotary.short_cos))
            sin = op.Where(long, sin, op.const(rotary.short_sin))
    y, present_k, present_v = op.domain(MS).GroupQueryAttention(
        _to3(op, q),
        _to3(op, k),
        _to3(op, v),
        past_key,
        past_value,
        seqlens,
        total,
        cos,
        sin,
        num_heads=heads.q_heads,
        kv_num_heads=heads.kv_heads,
        scale=scale,
        softcap=softcap or None,
        # measured (tests/llm/test_genai_ort.py, mistral): W, not W - 1 nor W + 1
        local_window_size=window,
        do_rotary=None if cos is None else 1,
        rotary_interleaved=None if cos is None else interleaved,
        _outputs=3,
    )
    return _to4(op, y, heads.q_heads, like=q), present_k, present_v


def shared_buffer_rule(shared: SharedBuffer) -> Rule:
    """The ``GroupQueryAttention`` rule for onnxruntime-genai's shared buffer."""

    def check(q: ir.Value, k: ir.Value, mask: ir.Value | None, match: Match) -> Verdict:
        return _check_shared(q, k, mask, match, shared)

    return Rule(
        "GroupQueryAttentionKVCache",
        _ATTENTION_WITH_PAST,
        check=check,
        rewrite=_gqa_shared,
        min_opset=23,
    )
