"""``GroupQueryAttention`` on onnxruntime-genai's shared KV buffer (see :class:`SharedBuffer`)."""

from __future__ import annotations

from collections.abc import Callable

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
from irkit.rules.hoist import FunctionKey, Threader
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


def _keep_mask(mask: ir.Value) -> str | None:
    """``None`` when ``mask`` only keeps or drops keys (a boolean mask, or
    ``Where(keep, 0, ≤ -1e4)``, through shape-only ops); otherwise why not: an additive bias
    (ALiBi, relative positions) that ``GroupQueryAttention`` on the shared buffer would lose."""
    v = mask
    while (p := v.producer()) is not None and p.domain == "" and p.op_type in _SHAPE_ONLY:
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
    total = op.Cast(op.Squeeze(op.Shape(attention_mask, start=1, end=2)), to=i32)
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
    return _to4(op, y, heads.q_heads), present_k, present_v


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


def _through_reshapes(
    value: ir.Value | None, constant: Callable[[ir.Value | None], np.ndarray | None]
) -> tuple[ir.Value, list[ir.Node]] | None:
    """The value a chain of ``Reshape`` nodes starts from (and the chain), when the chain keeps
    the first two axes (batch, sequence) and ends in ``Reshape(·, [0, 0, -1])``: then it only
    splits and merges the last axis, and the data it ends in is its start's, in the same shape."""
    if value is None:
        return None
    chain: list[ir.Node] = []
    first = value.producer()
    if first is None or first.op_type != "Reshape" or first.domain != "":
        return None
    target = constant(first.inputs[1])
    if target is None or target.tolist() != [0, 0, -1]:
        return None
    while (p := value.producer()) is not None and p.op_type == "Reshape" and p.domain == "":
        if p.inputs[0] is None:
            return None
        chain.append(p)
        value = p.inputs[0]
    outer = value.shape
    if outer is None or len(outer) != 3:
        return None
    for node in chain[1:]:  # the inner reshapes: their outputs' first two axes are value's
        inner = node.outputs[0].shape
        if inner is None or len(inner) < 3 or list(inner)[:2] != list(outer)[:2]:
            return None
    return value, chain


def pack_qkv(model: ir.Model) -> int:
    """``GroupQueryAttention(q, k, v, …)`` whose ``q``, ``k``, ``v`` are the three outputs of one
    ``Split`` of a packed projection along its last axis (through reshapes that only split and
    merge heads, :func:`_through_reshapes`) → ``GroupQueryAttention(packed, , , …)``: the op
    splits the packed QKV itself (as onnxruntime-genai's builder writes it), and the ``Split``
    and the reshapes go. In place, in the main graph and every function.

    Returns:
        How many attention nodes now take a packed QKV.
    """
    packed = 0
    threader = Threader(model)
    graphs: list[tuple[FunctionKey | None, ir.Graph | ir.Function]] = [(None, model.graph)]
    graphs += list(model.functions.items())
    for key, graph in graphs:

        def constant(value: ir.Value | None, key: FunctionKey | None = key) -> np.ndarray | None:
            source = threader.source(key, value)  # a function input bound to a constant
            return None if source is None else const_value(source[1])

        for node in list(graph):
            if node.op_type != "GroupQueryAttention" or node.domain != MS or len(node.inputs) < 3:
                continue
            found = [_through_reshapes(v, constant) for v in node.inputs[:3]]
            if any(f is None for f in found):
                continue
            starts = [f[0] for f in found if f is not None]
            split = starts[0].producer()
            if (
                split is None
                or split.op_type != "Split"
                or split.domain != ""
                or len(split.outputs) != 3
                or list(split.outputs) != starts
                or node_attributes(split).get("axis") not in (-1, 2)
            ):
                continue
            source = split.inputs[0]
            if source is None:
                continue
            node.replace_input_with(0, source)
            node.replace_input_with(1, None)
            node.replace_input_with(2, None)
            for f in found:
                if f is not None:
                    for reshape in f[1]:
                        if not any(o.uses() for o in reshape.outputs):
                            graph.remove(reshape, safe=True)
            if not any(o.uses() for o in split.outputs):
                graph.remove(split, safe=True)
            packed += 1
    return packed
