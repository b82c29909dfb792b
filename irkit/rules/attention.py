"""Decomposed scaled-dot-product attention → the ONNX ``Attention`` op (opset ≥ 23).

Identity (4-D tensors; ``q`` ``(B, Hq, S, D)``, ``k``/``v`` ``(B, Hkv, L, D)``, ``Hq % Hkv == 0``):

``softmax(q·kᵀ·scale + mask) · repeat(v) = Attention(q, k, v, mask, scale=scale)``

Three rules, applied in stages (each fires on what the previous one produced):

``Attention``
    The attention core. Matched forms: torchlib's SDPA expansion (``(q·√s) @ (kᵀ·√s)``, the
    additive mask — or the ``Where(bool_mask, 0, lowest)`` it builds from a boolean one — then
    ``Softmax`` and the ``Where(IsNaN(p), 0, p)`` guard), and eager attention (``(q @ kᵀ) · s``
    or ``/ c``, ``+ mask``, ``Softmax``, optionally between ``Cast`` s as HF's fp16 eager code
    does). ``kᵀ`` is ``Transpose(k, perm=[0, 1, 3, 2])`` or torchlib's
    ``Reshape(Transpose(Reshape(k, [-1, L, D]), [0, 2, 1]), [..., D, L])`` (symbolic shape
    from ``Shape(k)`` or a constant equal to ``k``'s static shape). ``mask`` (float, additive) is
    passed unchanged as ``attn_mask``; no mask, no ``attn_mask``.
``AttentionCausal``
    ``Attention(q, k, v, causal) = Attention(q, k, v, is_causal=1)`` where ``causal`` is
    torchlib's ``is_causal=True`` mask (``Where(Equal(Trilu(Expand(1, [S, L]), upper=0), 0),
    lowest, 0)`` on ``Shape(q)``/``Shape(k)``, or that mask folded to a constant): both are
    top-left aligned, as ``is_causal`` is without a cache. Runs before the GQA rule (the mask
    reads the shape of the repeated ``k``).
``AttentionGQA``
    ``Attention(q, repeat(k), repeat(v), …) = Attention(q, k, v, …)``: the K/V head repeat of
    grouped-query attention (``Reshape(Expand(Unsqueeze(x, 2), (B, Hkv, n, L, D)), (B, Hkv·n,
    L, D))``, HF's ``repeat_kv``, torchlib's ``enable_gqa``) is absorbed; the op repeats heads
    itself when ``Hq ≠ Hkv``.
``AttentionKVCache``
    ``(Attention(q, Concat(pk, k, axis=2), Concat(pv, v, axis=2), mask), Concat(pk, k),
    Concat(pv, v)) = Attention(q, k, v, mask, pk, pv)`` with outputs ``(y, present_key,
    present_value)``: HF's cache update becomes the op's ``past_key``/``past_value`` inputs and
    ``present_key``/``present_value`` outputs (which keep the concatenations' names, e.g.
    ``present.0.key``). Only a real cache update: both concatenations must leave the graph (or
    the function) as outputs. A concatenation used only by the attention (joint attention of
    image and text tokens, as in SD3) is no cache — the op would get past inputs and no present
    outputs, which onnxruntime refuses — and stays a ``Concat`` feeding a plain ``Attention``.

The form emitted (what the ``"ort"`` target's rules consume): **4-D** ``Attention`` with inputs
``(Q, K, V[, attn_mask[, past_key, past_value]])`` — ``Q`` ``(B, Hq, S, D)``, ``K``/``V``
``(B, Hkv, L, D)`` (no head repeat), ``attn_mask`` the original additive float mask (any shape
broadcastable to ``(B, Hq, S, past + L)``; absent when the model had none), ``past_*``
``(B, Hkv, P, D)`` — attributes ``scale`` (always set), ``is_causal=1`` only for the causal form (never together
with ``past_*``), and nothing else (
``q_num_heads``/``kv_num_heads`` unset as for 4-D inputs); outputs ``(Y)`` or
``(Y, present_key, present_value)`` with ``Y`` ``(B, Hq, S, D)``.

Preconditions: opset ≥ 23; ``q``, ``k``, ``v`` of known rank 4 (after the repeat: ``Hq`` =
``Hkv · n``, checked on the static or symbolic dims of the repeat's values); the two ``√s``
factors (or the one ``s``) scalar constants; ``Softmax`` over the last axis (fp16 eager: the
probabilities cast back to ``q``'s dtype); a mask of rank ≤ 4; every
intermediate value used only inside the match (the engine's rule). Not matched: dropout,
``softcap`` (``tanh`` capping), masks that are not added to the scores. The ``IsNaN`` guard of
torchlib's boolean-mask path only changes rows whose scores are all ``-inf``; onnxruntime's
``Attention`` returns 0 for such rows as the guard does (tested).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx_ir as ir

from irkit.rewriting import (
    Const,
    Match,
    Pattern,
    RewriteBuilder,
    Rule,
    RuleSet,
    Verdict,
    attr,
    const_ints,
    const_value,
    dims,
    either,
    fail,
    op,
    optional,
    rank,
    scalar,
    var,
)

q, k, v, mask, s1, s2 = var("q"), var("k"), var("v"), var("mask"), var("s1"), var("s2")
shape1, shape2 = var("shape1"), var("shape2")

_INT64_MAX, _INT64_MIN = 2**63 - 1, -(2**63)

# kᵀ as torchlib writes it: fold the leading dims, transpose the last two, unfold.
_SHP = op.Shape(k)
_LAST = op.Slice(_SHP, Const(-1), Const(_INT64_MAX))
_SECOND = op.Slice(_SHP, Const(-2), Const(-1))
_LEAD = op.Slice(_SHP, Const(_INT64_MIN), Const(-2))
_KT_SYMBOLIC = op.Reshape(
    op.Transpose(op.Reshape(k, op.Concat(Const(-1), _SECOND, _LAST, axis=0)), perm=[0, 2, 1]),
    op.Concat(_LEAD, _LAST, _SECOND, axis=0),
)
_KT_CONST = op.Reshape(op.Transpose(op.Reshape(k, shape1), perm=[0, 2, 1]), shape2)
_KT = either(op.Transpose(k, perm=[0, 1, 3, 2]), _KT_SYMBOLIC, _KT_CONST)

# torchlib's SDPA: √s on both operands, optional additive mask, softmax, NaN guard.
_SDPA_SCORES = op.MatMul(q * s1, _KT * s2)
_SDPA_PROBS = op.Softmax(either(_SDPA_SCORES + mask, _SDPA_SCORES), axis=attr("softmax_axis"))
_SDPA = op.MatMul(either(op.Where(op.IsNaN(_SDPA_PROBS), 0.0, _SDPA_PROBS), _SDPA_PROBS), v)

# Eager attention: (q @ kᵀ) · s (or / c), optional mask, softmax (maybe computed in float32).
_EAGER_SCORES = either(op.MatMul(q, _KT) * s1, op.MatMul(q, _KT) / s2)
_EAGER_LOGITS = either(_EAGER_SCORES + mask, _EAGER_SCORES)
_EAGER_PROBS = either(
    op.Cast(op.Softmax(op.Cast(_EAGER_LOGITS, to=1), axis=attr("softmax_axis")), to=attr("to")),
    op.Softmax(_EAGER_LOGITS, axis=attr("softmax_axis")),
)
_EAGER = op.MatMul(_EAGER_PROBS, v)


# Values computed inside torchlib's own expansions carry no shape; read what their producers say.


def _dims(value: ir.Value | None, depth: int = 0) -> tuple[int | str | None, ...] | None:
    """``dims(value)``, else the constant target shape of the ``Reshape``/``Expand`` producing it."""
    known = dims(value)
    if known is not None or value is None or depth > 4:
        return known
    node = value.producer()
    if node is None or node.domain not in ("", "ai.onnx"):
        return None
    if node.op_type == "Reshape" and len(node.inputs) > 1:
        shape = const_ints(node.inputs[1])
        if shape is not None and all(d > 0 for d in shape):
            return tuple(shape)
    if node.op_type == "Expand":
        shape, src = const_ints(node.inputs[1]), _dims(node.inputs[0], depth + 1)
        if shape is not None and src is not None and len(src) == len(shape):
            return tuple(t if t != 1 else d for t, d in zip(shape, src, strict=True))
        if shape is not None and all(d > 1 for d in shape):
            return tuple(shape)
    if node.op_type == "Unsqueeze" and len(node.inputs) > 1:
        src, axes = _dims(node.inputs[0], depth + 1), const_ints(node.inputs[1])
        if src is not None and axes is not None:
            out: list[int | str | None] = list(src)
            for a in sorted(a % (len(src) + len(axes)) for a in axes):
                out.insert(a, 1)
            return tuple(out)
    return None


def _length(value: ir.Value | None, depth: int = 0) -> int | None:
    """Number of elements of a 1-D shape tensor (constant, ``Shape``, ``Slice`` of it, ``Concat``)."""
    if value is None or depth > 6:
        return None
    arr = const_value(value)
    if arr is not None:
        return int(np.asarray(arr).size)
    node = value.producer()
    if node is None:
        return None
    if node.op_type == "Concat":
        parts = [_length(i, depth + 1) for i in node.inputs]
        return None if None in parts else sum(parts)  # type: ignore[arg-type]
    if node.op_type == "Shape":
        r = _rank(node.inputs[0]) if depth < 3 else rank(node.inputs[0])
        if r is None:
            return None
        start = node.attributes.get_int("start", 0)
        end = node.attributes.get_int("end", r)
        start, end = (start + r if start < 0 else start), (end + r if end < 0 else end)
        return max(0, min(end, r) - max(start, 0))
    return None


def _rank(value: ir.Value | None) -> int | None:
    d = _dims(value)
    if d is not None:
        return len(d)
    if rank(value) is not None:
        return rank(value)
    node = value.producer() if value is not None else None
    if node is not None and node.op_type in ("Reshape", "Expand") and len(node.inputs) > 1:
        return _length(node.inputs[1])  # a computed target shape of known length
    return None


def _rank4(*values: ir.Value | None) -> Verdict:
    for name, value in zip("qkv", values, strict=False):
        if _rank(value) != 4:
            return fail(f"{name} must be 4-D (B, H, S, D), rank is {_rank(value)}", value)
    return True


def _transpose_shapes_ok(k: ir.Value, shape1: ir.Value | None, shape2: ir.Value | None) -> Verdict:
    """For torchlib's constant-shape kᵀ: the reshapes must be (-1|B·H, L, D) and (B, H, D, L)."""
    if shape1 is None and shape2 is None:
        return True
    kd = dims(k)
    c1, c2 = const_value(shape1), const_value(shape2)
    if kd is None or c1 is None or c2 is None or not all(isinstance(d, int) for d in kd):
        return fail("the transpose of k uses non-constant shapes with unknown k dims", k)
    b, h, length, d = (int(x) for x in kd)  # type: ignore[arg-type]
    if list(np.asarray(c1).ravel()) not in ([-1, length, d], [b * h, length, d]):
        return fail(f"reshape {np.asarray(c1).tolist()} does not fold the leading dims of k", k)
    if list(np.asarray(c2).ravel()) != [b, h, d, length]:
        return fail(f"reshape {np.asarray(c2).tolist()} is not kᵀ's shape", k)
    return True


def _check_core(
    q: ir.Value,
    k: ir.Value,
    v: ir.Value,
    s1: ir.Value | None,
    s2: ir.Value | None,
    shape1: ir.Value | None,
    shape2: ir.Value | None,
    softmax_axis: int | None,
    mask: ir.Value | None,
    to: int | None,
) -> Verdict | dict[str, Any]:
    if s1 is not None and s2 is not None and scalar(q) is not None and scalar(s1) is None:
        q, s1 = s1, q  # ``q · √s`` matched with its operands the other way round
    if softmax_axis not in (None, -1, 3):
        return fail(f"softmax over axis {softmax_axis}, not the last (keys) axis", q)
    if to is not None and q.dtype is not None and to != q.dtype.value:
        return fail(f"the probabilities are cast to {ir.DataType(to)}, not to q's {q.dtype}", q)
    if mask is not None and (r := rank(mask)) is not None and r > 4:
        return fail(f"a rank-{r} mask would broadcast the scores beyond 4-D", mask)
    ok = _rank4(q, k, v)
    if ok is not True:
        return ok
    ok = _transpose_shapes_ok(k, shape1, shape2)
    if ok is not True:
        return ok
    a = 1.0 if s1 is None else scalar(s1)
    b = 1.0 if s2 is None else scalar(s2)
    if a is None or b is None:
        return fail("the attention scale is not a scalar constant", s1 if a is None else s2)
    is_div = s1 is None and s2 is not None  # eager (q @ kᵀ) / c
    if is_div and b == 0.0:
        return fail("division of the scores by zero", s2)
    return {"scale": a / b if is_div else a * b, "query": q}


def _core(
    op: RewriteBuilder,
    query: ir.Value,
    k: ir.Value,
    v: ir.Value,
    mask: ir.Value | None,
    scale: float,
) -> ir.Value:
    """Attention(q, k, v, mask, scale=s)"""
    inputs = [query, k, v] if mask is None else [query, k, v, mask]
    return op.Attention(*inputs, scale=scale)


# --- stage 1b: a causal mask becomes is_causal=1 -------------------------------------------------

cm = var("cmask")
_CAUSAL_ATTENTION = op.Attention(q, k, v, cm)


def _is_top_left_causal(mask: ir.Value, q: ir.Value, k: ir.Value) -> str | None:
    """``None`` if ``mask`` is torchlib's ``is_causal`` mask for ``q``/``k``, else why not.

    Constant: a 2-D ``(S, L)`` array with 0 on and below the diagonal and a value ≤ -1e4 (the
    dtype's lowest) above it. Computed: ``Where(Equal(Trilu(Expand(1, [S, L]), upper=0), 0),
    lowest, 0)`` with ``[S, L]`` read from ``Shape(q)[-2]`` and ``Shape(k)[-2]``.
    """
    arr = const_value(mask)
    if arr is not None:
        a = np.asarray(arr, dtype=np.float64)
        if a.ndim != 2:
            return "the constant mask is not 2-D"
        lower = np.tril(np.ones(a.shape, dtype=bool))
        if np.all(a[lower] == 0) and np.all(a[~lower] <= -1e4):
            return None
        return "the constant mask is not top-left causal"
    where = mask.producer()
    if where is None or where.op_type != "Where" or len(where.inputs) != 3:
        return "the mask is not a Where"
    lo, zero = scalar(where.inputs[1]), scalar(where.inputs[2])
    eq = where.inputs[0].producer() if where.inputs[0] is not None else None
    if lo is None or lo > -1e4 or zero != 0.0 or eq is None or eq.op_type != "Equal":
        return "the mask is not Where(Equal(·, 0), lowest, 0)"
    tri = eq.inputs[0].producer() if eq.inputs[0] is not None else None
    if tri is None or tri.op_type != "Trilu" or tri.attributes.get_int("upper", 1) != 0:
        return "the mask does not come from a lower Trilu"
    if len(tri.inputs) > 1 and tri.inputs[1] is not None and const_ints(tri.inputs[1]) != [0]:
        return "the Trilu has a diagonal offset"
    if scalar(eq.inputs[1]) != 0.0:
        return "the mask compares with a non-zero value"
    ones = tri.inputs[0].producer() if tri.inputs[0] is not None else None
    if ones is None or ones.op_type != "Expand" or scalar(ones.inputs[0]) != 1.0:
        return "the Trilu input is not Expand(1, shape)"
    cat = ones.inputs[1].producer() if ones.inputs[1] is not None else None
    if cat is None or cat.op_type != "Concat" or len(cat.inputs) != 2:
        return "the mask shape is not Concat(S, L)"
    for part, source in zip(cat.inputs, (q, k), strict=True):
        sl = part.producer() if part is not None else None
        shp = sl.inputs[0].producer() if sl is not None and sl.inputs[0] is not None else None
        if (
            sl is None
            or sl.op_type != "Slice"
            or const_ints(sl.inputs[1]) != [-2]
            or const_ints(sl.inputs[2]) != [-1]
            or shp is None
            or shp.op_type != "Shape"
            or shp.inputs[0] not in _origins(source)
        ):
            return "the mask shape is not (q.shape[-2], k.shape[-2])"
    return None


def _origins(value: ir.Value) -> list[ir.Value]:
    """``value`` and, if it is a head repeat ``Reshape(Expand(Unsqueeze(x)))``, ``x`` (same L)."""
    found = [value]
    node = value.producer()
    for op_type in ("Reshape", "Expand", "Unsqueeze"):
        if node is None or node.op_type != op_type or node.inputs[0] is None:
            return found
        value = node.inputs[0]
        node = value.producer()
    return [*found, value]


def _check_causal(q: ir.Value, k: ir.Value, cmask: ir.Value | None, match: Match) -> Verdict:
    att = match.nodes[0]
    if cmask is None:
        return fail("the Attention has no mask", att.outputs[0])
    if len(att.outputs) > 1 or _same_attrs(att).get("is_causal", 0):
        return fail("the Attention already has a cache, extra outputs or is_causal", cmask)
    why = _is_top_left_causal(cmask, q, k)
    return fail(why, cmask) if why else True


def _causal(op: RewriteBuilder, q: ir.Value, k: ir.Value, v: ir.Value, match: Match) -> ir.Value:
    """Attention(q, k, v, is_causal=1)"""
    return op.Attention(q, k, v, is_causal=1, **_same_attrs(match.nodes[0]))


# --- stage 2: the K/V head repeat of GQA ----------------------------------------------------------

kr, vr, e1, e2, r1, r2 = var("kr"), var("vr"), var("e1"), var("e2"), var("r1"), var("r2")


def _repeat(x: Pattern, e: Pattern, r: Pattern) -> Pattern:
    """HF's repeat_kv: (B, Hkv, L, D) → unsqueeze 2 → expand n → reshape (B, Hkv·n, L, D)."""
    return op.Reshape(op.Expand(op.Unsqueeze(x, Const(2)), e), r)


_GQA_ATTENTION = op.Attention(q, _repeat(kr, e1, r1), _repeat(vr, e2, r2), optional(mask))


def _repeat_factor(src: ir.Value, repeated: ir.Value) -> int | None | str:
    """``n`` with ``repeated = repeat_kv(src, n)`` judged from dims; a reason string if not."""
    sd, rd = _dims(src), _dims(repeated)
    if sd is None or rd is None or len(sd) != 4 or len(rd) != 4:
        return "repeat dims unknown"
    expanded = repeated.producer().inputs[0]  # type: ignore[union-attr]
    ed = _dims(expanded)
    if ed is None or len(ed) != 5:
        return "the expanded K/V dims are unknown"
    n = ed[2]
    if not isinstance(n, int):
        return "the head repeat factor is not static"
    same = (ed[0], ed[1], ed[3], ed[4]) == (sd[0], sd[1], sd[2], sd[3])
    if not same or (rd[0], rd[2], rd[3]) != (sd[0], sd[2], sd[3]):
        return f"dims {sd} → {ed} → {rd} are not a head repeat"
    if isinstance(sd[1], int) and rd[1] != sd[1] * n:
        return f"dims {sd} → {rd} are not a head repeat by {n}"
    return n


def _check_gqa(q: ir.Value, kr: ir.Value, vr: ir.Value, match: Match) -> Verdict:
    att = match.nodes[0]
    if len(att.inputs) > 4 or len(att.outputs) > 1:
        return fail("the Attention already has a cache or extra outputs", att.outputs[0])
    nk = _repeat_factor(kr, att.inputs[1])  # type: ignore[arg-type]
    nv = _repeat_factor(vr, att.inputs[2])  # type: ignore[arg-type]
    if isinstance(nk, str) or isinstance(nv, str):
        return fail(str(nk if isinstance(nk, str) else nv), kr)
    if nk != nv:
        return fail(f"K and V repeated {nk} and {nv} times", kr)
    qd = _dims(q)
    kd = _dims(kr)
    if (
        qd is not None
        and kd is not None
        and isinstance(qd[1], int)
        and isinstance(kd[1], int)
        and qd[1] != kd[1] * nk  # type: ignore[operator]
    ):
        return fail(f"{qd[1]} query heads are not {kd[1]} KV heads × {nk}", q)
    return True


def _same_attrs(node: ir.Node) -> dict[str, Any]:
    return {a.name: a.value for a in node.attributes.values()}


def _gqa(
    op: RewriteBuilder, q: ir.Value, kr: ir.Value, vr: ir.Value, mask: ir.Value | None, match: Match
) -> ir.Value:
    """Attention(q, k, v, mask) with Hq ≠ Hkv"""
    inputs = [q, kr, vr] if mask is None else [q, kr, vr, mask]
    return op.Attention(*inputs, **_same_attrs(match.nodes[0]))


# --- stage 3: the KV cache ------------------------------------------------------------------------

pk, pv, kn, vn = var("past_k"), var("past_v"), var("k_new"), var("v_new")
_PRESENT_K = op.Concat(pk, kn, axis=attr("axis_k"))
_PRESENT_V = op.Concat(pv, vn, axis=attr("axis_v"))
_KV_ATTENTION = op.Attention(q, _PRESENT_K, _PRESENT_V, optional(mask))


def _check_cache(
    past_k: ir.Value,
    past_v: ir.Value,
    k_new: ir.Value,
    v_new: ir.Value,
    axis_k: int,
    axis_v: int,
    match: Match,
) -> Verdict:
    att = match.nodes[0]
    if len(att.inputs) > 4 or len(att.outputs) > 1:
        return fail("the Attention already has a cache or extra outputs", att.outputs[0])
    attrs = _same_attrs(att)
    if attrs.get("is_causal", 0):
        return fail("is_causal=1: a cache would move the causal diagonal", att.outputs[0])
    for name, joined in (("key", att.inputs[1]), ("value", att.inputs[2])):
        if joined is None or not joined.is_graph_output():
            # Not a cache update: joint attention (SD3's image + text tokens) concatenates K/V
            # too. The op's past inputs need present outputs (onnxruntime refuses the node
            # otherwise), and only a present that leaves the graph is one.
            return fail(
                f"the concatenated {name} is not an output of the graph or function "
                "(no present to return): a concatenation, not a cache update",
                joined,
            )
    for name, value in (("past key", past_k), ("past value", past_v), ("k", k_new), ("v", v_new)):
        if _rank(value) not in (None, 4):
            return fail(f"{name} must be 4-D, rank is {_rank(value)}", value)
    if _rank(k_new) is None and _rank(past_k) is None:
        return fail("rank of the cached key unknown", k_new)
    for axis in (axis_k, axis_v):
        if axis not in (2, -2):
            return fail(f"the cache grows along axis {axis}, not the sequence axis 2", past_k)
    return True


def _cache(
    op: RewriteBuilder,
    q: ir.Value,
    past_k: ir.Value,
    past_v: ir.Value,
    k_new: ir.Value,
    v_new: ir.Value,
    mask: ir.Value | None,
    match: Match,
) -> tuple[ir.Value, ...]:
    """Attention(q, k, v, mask, past_k, past_v) → (y, present_k, present_v)"""
    inputs: Sequence[ir.Value | None] = [q, k_new, v_new, mask, past_k, past_v]
    return tuple(op.Attention(*inputs, _outputs=3, **_same_attrs(match.nodes[0])))


rules = RuleSet(
    "attention",
    [
        Rule(  # softmax((q·√s)(kᵀ·√s) + mask)·v, NaN-guarded = Attention(q, k, v, mask, scale=s)
            "Attention",
            either(_SDPA, _EAGER),
            check=_check_core,
            rewrite=_core,
            min_opset=23,
        ),
        Rule(  # Attention(q, k, v, causal mask) = Attention(q, k, v, is_causal=1)
            "AttentionCausal",
            _CAUSAL_ATTENTION,
            check=_check_causal,
            rewrite=_causal,
            min_opset=23,
        ),
        Rule(  # Attention(q, repeat(k), repeat(v)) = Attention(q, k, v)  (GQA: Hq ≠ Hkv)
            "AttentionGQA",
            _GQA_ATTENTION,
            check=_check_gqa,
            rewrite=_gqa,
            min_opset=23,
        ),
        Rule(  # Attention(q, [pk; k], [pv; v]) = Attention(q, k, v, ·, pk, pv) + presents
            "AttentionKVCache",
            (_KV_ATTENTION, _PRESENT_K, _PRESENT_V),
            check=_check_cache,
            rewrite=_cache,
            min_opset=23,
        ),
    ],
)
"""The attention rules (core, causal mask, GQA, KV cache)."""
