"""Decomposed scaled-dot-product attention → the ONNX ``Attention`` op (opset ≥ 23).

Identity (4-D tensors; ``q`` ``(B, Hq, S, D)``, ``k``/``v`` ``(B, Hkv, L, D)``, ``Hq % Hkv == 0``):

``softmax(q·kᵀ·scale + mask) · repeat(v) = Attention(q, k, v, mask, scale=scale)``

and with logit softcapping (gemma2's ``attn_logit_softcapping``; ONNX ``Attention`` caps the
scaled scores *before* it adds the mask, as gemma2 does, so a masked score stays masked):

``softmax(tanh(q·kᵀ·scale / c)·c + mask) · repeat(v) = Attention(q, k, v, mask, scale=scale,
softcap=c)``

Four rules, applied in stages (each fires on what the previous one produced):

``Attention``
    The attention core. Matched forms: torchlib's SDPA expansion (``(q·√s) @ (kᵀ·√s)``, the
    additive mask — or the ``Where(bool_mask, 0, -inf)`` irkit's lowering builds from a
    boolean one (torchlib's ``lowest``: also matched) — then ``Softmax`` and the
    ``Where(IsNaN(p), 0, p)`` guard), and eager attention (``(q @ kᵀ) · s``
    or ``/ c``, optionally capped ``Tanh(x / c) · c`` with ``c`` the same positive constant,
    ``+ mask``, ``Softmax``, optionally between ``Cast`` s as HF's fp16 eager code does).
    ``kᵀ`` is ``Transpose(k, perm=[0, 1, 3, 2])`` or torchlib's ``Reshape(Transpose(Reshape(k,
    [-1, L, D]), [0, 2, 1]), [..., D, L])`` (symbolic shape from ``Shape(k)`` or a constant
    equal to ``k``'s static shape). ``mask`` (float, additive) becomes ``attn_mask`` in the
    form onnxruntime's ``Attention`` computes the graph's numbers with (no mask, no
    ``attn_mask``): a query or key axis of size 1 (BERT's ``(B, 1, 1, L)``, cross
    attention) is expanded to ``S``/``L`` (onnxruntime refuses a mask whose last two dims are
    not those), and a mask that may hold the dtype's lowest value at every key of a row
    (``finfo.min``: padding) is raised one step above it — ``Max(mask, floor)``, or only the
    lowest entries under torchlib's NaN guard — since onnxruntime returns 0 for such a row
    where ``softmax`` averages the values.
``AttentionCausal``
    ``Attention(q, k, v, causal) = Attention(q, k, v, is_causal=1)`` where ``causal`` is
    torchlib's ``is_causal=True`` mask (``Where(Equal(Trilu(Expand(1, [S, L]), upper=0), 0),
    lowest, 0)`` on ``Shape(q)``/``Shape(key)``, where ``key`` is ``k`` or — torchlib's
    ``enable_gqa`` — the key before its head repeat; or that mask folded to a constant): both
    are top-left aligned, as ``is_causal`` is without a cache. Runs before the GQA rule (the
    mask may read the shape of the repeated ``k``).
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
broadcastable to ``(B, Hq, S, past + L)`` with its last two dims those, raised above the
dtype's lowest value where needed; absent when the model had none), ``past_*``
``(B, Hkv, P, D)`` — attributes ``scale`` (always set), ``softcap`` (only for capped
scores), ``is_causal=1`` only for the causal form (never together with ``past_*``), and nothing
else (``q_num_heads``/``kv_num_heads`` unset as for 4-D inputs); outputs ``(Y)`` or
``(Y, present_key, present_value)`` with ``Y`` ``(B, Hq, S, D)``.

Preconditions: opset ≥ 23; ``q``, ``k``, ``v`` of known rank 4 (after the repeat: ``Hq`` =
``Hkv · n``, checked on the static or symbolic dims of the repeat's values); no batch or head
broadcast where the dims are known (one batch dim for ``q``, ``k``, ``v``; ``k``'s heads equal
``v``'s and divide ``q``'s: ``Attention`` does not broadcast as the matmuls do, and
onnxruntime refuses to load such a node); the two ``√s``
factors (or the one ``s``) scalar constants; ``Softmax`` over the last axis (fp16 eager: the
probabilities cast back to ``q``'s dtype); a mask of rank ≤ 4 whose known batch, head, query
and key dims are 1 or the scores' (a mask larger than the scores is declined); a mask that
needs a floor in float32, float16 or float64; every
intermediate value used only inside the match (the engine's rule); a softcap's divisor and
factor the same positive scalar constant. Not matched: dropout, a softcap in torchlib's SDPA
form (``scaled_dot_product_attention`` has none), masks that are not added to the scores. The
``IsNaN`` guard of torchlib's boolean-mask path only changes rows whose scores are all
``-inf``; onnxruntime's ``Attention`` returns 0 for such rows as the guard does (tested).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx_ir as ir

from irkit._irutil import node_attributes
from irkit._shapes import Dim, known_dims, known_rank, reshape_target, transposed
from irkit.rewriting import (
    Const,
    Match,
    MatchFailure,
    Pattern,
    RewriteBuilder,
    RewriteContext,
    Rule,
    RuleSet,
    Verdict,
    attr,
    const_ints,
    const_value,
    either,
    fail,
    matches,
    op,
    optional,
    outer_dims,
    scalar,
    var,
)

q, k, v, mask, s, s1, s2 = (var(n) for n in ("q", "k", "v", "mask", "s", "s1", "s2"))
shape1, shape2 = var("shape1"), var("shape2")

_INT64_MAX, _INT64_MIN = 2**63 - 1, -(2**63)


class _Form(enum.IntEnum):
    """Which spelling of attention the core rule matched (its ``form`` tag)."""

    SDPA = 0  # torchlib: (q·√s) @ (kᵀ·√s)
    EAGER = 1  # (q @ kᵀ)·s or (q @ kᵀ)/s


class _Guard(enum.IntEnum):
    """Whether torchlib's SDPA zeroes the rows whose every key is masked (the ``guard`` tag)."""

    NAN_GUARD = 0  # Where(IsNaN(p), 0, p): a row of -inf scores gives 0, as onnxruntime does
    NONE = 1


class _Scaling(enum.IntEnum):
    """How eager attention applies its scale (the ``scaling`` tag)."""

    MUL = 0
    DIV = 1


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
_SDPA = op.MatMul(
    either(op.Where(op.IsNaN(_SDPA_PROBS), 0.0, _SDPA_PROBS), _SDPA_PROBS, tag="guard"), v
)

# Eager attention: (q @ kᵀ) · s (or / s), optional mask, softmax (maybe computed in float32).
_EAGER_SCORES = either(op.MatMul(q, _KT) * s, op.MatMul(q, _KT) / s, tag="scaling")
# Logit softcapping (gemma2's attn_logit_softcapping): tanh(scores / c) · c, before the mask.
_EAGER_CAPPED = either(op.Tanh(_EAGER_SCORES / var("cap")) * var("cap2"), _EAGER_SCORES)
_EAGER_LOGITS = either(_EAGER_CAPPED + mask, _EAGER_CAPPED)
_EAGER_PROBS = either(
    op.Cast(op.Softmax(op.Cast(_EAGER_LOGITS, to=1), axis=attr("softmax_axis")), to=attr("to")),
    op.Softmax(_EAGER_LOGITS, axis=attr("softmax_axis")),
)
_EAGER = op.MatMul(_EAGER_PROBS, v)

_ATTENTION = either(_SDPA, _EAGER, tag="form")


def _rank4(*values: ir.Value | None) -> Verdict:
    for name, value in zip("qkv", values, strict=False):
        if (r := known_rank(value)) != 4:
            return fail(f"{name} must be 4-D (B, H, S, D), rank is {r}", value)
    return True


def _no_broadcast(q: ir.Value, k: ir.Value, v: ir.Value) -> Verdict:
    """Attention takes one batch for Q, K and V and K/V heads dividing Q's, where matmuls
    broadcast: a shared query ``(1, H, S, D)`` against keys ``(B, H, L, D)`` (BLIP-2's Q-Former
    with one set of learned queries, granite_speech's projector) stays decomposed."""
    dims = [known_dims(x) for x in (q, k, v)]
    batch = {d[0] for d in dims if d is not None}
    if len(batch) > 1:
        shown = ", ".join(str(d[0]) if d is not None else "?" for d in dims)
        return fail(f"q, k, v batch dims differ ({shown}): the matmuls broadcast them", q)
    heads = [d[1] if d is not None else None for d in dims]
    hq, hk, hv = heads
    if isinstance(hk, int) and isinstance(hv, int) and hk != hv:
        return fail(f"k has {hk} heads, v {hv}: the matmuls broadcast them", k)
    if isinstance(hq, int) and isinstance(hk, int) and hq % hk:
        return fail(f"q's {hq} heads are not a multiple of k's {hk}: the matmuls broadcast", q)
    return True


def _transpose_shapes_ok(k: ir.Value, shape1: ir.Value | None, shape2: ir.Value | None) -> Verdict:
    """For torchlib's constant-shape kᵀ: the reshapes fold k to (B·H, L, D) and unfold the
    transposed (B·H, D, L) to (B, H, D, L)."""
    if shape1 is None and shape2 is None:
        return True
    kd = known_dims(k)
    c1, c2 = const_ints(shape1), const_ints(shape2)
    if kd is None or c1 is None or c2 is None or not all(isinstance(d, int) for d in kd):
        return fail("the transpose of k uses non-constant shapes with unknown k dims", k)
    b, h, length, d = (int(x) for x in kd)  # type: ignore[arg-type]
    folded = reshape_target(kd, c1)
    if folded != (b * h, length, d):
        return fail(f"reshape {c1} does not fold the leading dims of k", k)
    if reshape_target(transposed(folded, [0, 2, 1]) or (), c2) != (b, h, d, length):
        return fail(f"reshape {c2} is not kᵀ's shape", k)
    return True


def _scale(
    form: int, scaling: int | None, s: ir.Value | None, s1: ir.Value | None, s2: ir.Value | None
) -> float | MatchFailure:
    """The attention scale: √s·√s (torchlib), s or 1/s (eager); why not if not constant."""
    values: list[float] = []
    for factor in (s1, s2) if form == _Form.SDPA else (s,):
        value = scalar(factor)
        if value is None:
            return fail("the attention scale is not a scalar constant", factor)
        values.append(value)
    if form == _Form.SDPA:
        return values[0] * values[1]
    if scaling == _Scaling.DIV:
        if values[0] == 0.0:
            return fail("division of the scores by zero", s)
        return 1.0 / values[0]
    return values[0]


def _softcap(cap: ir.Value | None, cap2: ir.Value | None) -> float | MatchFailure:
    """``c`` of ``tanh(x / c) · c`` (0.0: no capping); why not if not one positive constant."""
    if cap is None:
        return 0.0
    c, c2 = scalar(cap), scalar(cap2)
    if c is None or c2 is None:
        return fail("the softcap is not a scalar constant", cap if c is None else cap2)
    if c != c2:
        return fail(f"the scores are divided by {c} but multiplied by {c2}: not a softcap", cap)
    if c <= 0.0:
        return fail(f"softcap {c} is not positive", cap)
    return c


def _check_core(
    form: int,
    scaling: int | None,
    guard: int | None,
    q: ir.Value,
    k: ir.Value,
    v: ir.Value,
    s: ir.Value | None,
    s1: ir.Value | None,
    s2: ir.Value | None,
    shape1: ir.Value | None,
    shape2: ir.Value | None,
    softmax_axis: int | None,
    mask: ir.Value | None,
    to: int | None,
    cap: ir.Value | None,
    cap2: ir.Value | None,
    match: Match,
    ctx: RewriteContext,
) -> Verdict | dict[str, Any]:
    if softmax_axis not in (None, -1, 3):
        return fail(f"softmax over axis {softmax_axis}, not the last (keys) axis", q)
    if to is not None and q.dtype is not None and to != q.dtype.value:
        return fail(f"the probabilities are cast to {ir.DataType(to)}, not to q's {q.dtype}", q)
    ok = _rank4(q, k, v)
    if ok is not True:
        return ok
    ok = _no_broadcast(q, k, v)
    if ok is not True:
        return ok
    layout = _mask_layout(mask, q, k, ctx)
    if isinstance(layout, MatchFailure):
        return layout
    floor = _mask_floor(guard, mask, q, match)
    if isinstance(floor, MatchFailure):
        return floor
    ok = _transpose_shapes_ok(k, shape1, shape2)
    if ok is not True:
        return ok
    scale = _scale(form, scaling, s, s1, s2)
    if isinstance(scale, MatchFailure):
        return scale
    softcap = _softcap(cap, cap2)
    if isinstance(softcap, MatchFailure):
        return softcap
    return {"scale": scale, "softcap": softcap, **floor, **layout}


def _core(
    op: RewriteBuilder,
    q: ir.Value,
    k: ir.Value,
    v: ir.Value,
    mask: ir.Value | None,
    scale: float,
    softcap: float,
    floor: np.ndarray | None,
    floor_exact: bool,
    expand_query: bool,
    expand_key: bool,
) -> ir.Value:
    """Attention(q, k, v, mask, scale=s[, softcap=c])"""
    if mask is not None:
        mask = _runnable_mask(op, q, k, mask, floor, floor_exact, expand_query, expand_key)
    inputs = [q, k, v] if mask is None else [q, k, v, mask]
    if softcap:
        return op.Attention(*inputs, scale=scale, softcap=softcap)
    return op.Attention(*inputs, scale=scale)


# --- the mask as onnxruntime's Attention runs it --------------------------------------------------


def _broadcast(mask_dim: Dim, size: Dim) -> bool:
    """Whether a mask axis of ``mask_dim`` broadcasts to the scores' ``size`` (a 1 there,
    where the scores' dim is not known to be 1): onnxruntime wants it expanded."""
    return mask_dim == 1 and size != 1


def _mask_layout(
    mask: ir.Value | None, q: ir.Value, k: ir.Value, ctx: RewriteContext
) -> dict[str, bool] | MatchFailure:
    """Which of the mask's query and key axes must be expanded; why the mask cannot be passed.

    ONNX lets ``attn_mask`` broadcast to ``(B, Hq, S, L)``; onnxruntime's ``Attention`` (and
    ``MultiHeadAttention``'s ``attention_bias``) wants a mask of rank 2 to 4 whose last two
    dims *are* ``S`` and ``L`` (``(B, 1, 1, L)``, BERT's extended mask, is refused: "inconsistent
    q_sequence_length"), its head dim 1 or ``Hq``, its batch dim 1 or ``B``. Findings:
    ``expand_query``/``expand_key``: the mask's ``S``/``L`` axis is 1 where ``q``'s/``k``'s
    length is not known to be 1, so the rewrite expands it. A mask of unknown dims is passed
    as it is."""
    if mask is None:
        return {"expand_query": False, "expand_key": False}
    r = known_rank(mask)
    if r is not None and r > 4:
        return fail(f"a rank-{r} mask would broadcast the scores beyond 4-D", mask)
    md = outer_dims(mask, ctx.graph, ctx.model)
    if md is None:  # (nothing to check: the graph's own broadcast is all that is known)
        return {"expand_query": False, "expand_key": False}
    qd, kd = known_dims(q) or (None,) * 4, known_dims(k) or (None,) * 4
    full = (1,) * (4 - len(md)) + tuple(md)
    wanted = (("batch", qd[0]), ("head", qd[1]), ("query", qd[2]), ("key", kd[2]))
    for (axis, size), d in zip(wanted, full, strict=True):
        if isinstance(d, int) and d != 1 and isinstance(size, int) and d != size:
            return fail(
                f"the mask's {axis} dim {d} is neither 1 nor the scores' {size}: the scores "
                "broadcast to the mask's shape, not the Attention output's",
                mask,
            )
    return {"expand_query": _broadcast(full[2], qd[2]), "expand_key": _broadcast(full[3], kd[2])}


def _no_empty_row(arr: np.ndarray) -> bool:
    """Whether every row of a constant mask keeps a key (an entry above the dtype's lowest)."""
    if arr.dtype.kind != "f":
        return False
    return bool(np.all(np.any(arr > np.finfo(arr.dtype).min, axis=-1)))


def _fills(mask: ir.Value) -> set[float] | None:
    """The values a ``Where(c, a, b)`` mask of scalar constants takes (Hugging Face's and
    torchlib's masks from a boolean one), or ``None`` for another mask."""
    p = mask.producer()
    if p is None or (p.domain, p.op_type) != ("", "Where") or len(p.inputs) != 3:
        return None
    values = [const_value(v) for v in p.inputs[1:]]
    if any(v is None or v.size != 1 for v in values):
        return None
    return {float(np.asarray(v).reshape(())) for v in values}


def _mask_floor(
    guard: int | None, mask: ir.Value | None, q: ir.Value, match: Match
) -> dict[str, Any] | MatchFailure:
    """The floor the mask is raised to, so that onnxruntime computes what the graph does.

    onnxruntime's CPU ``Attention`` returns 0 for a query whose every key is masked with the
    dtype's lowest value (``finfo.min``, Hugging Face's fill; measured on 1.32) or ``-inf``
    (irkit's fill for a boolean SDPA mask, zeroed by the NaN guard as torch does), where ``softmax(scores + lowest)`` averages the values
    (``lowest + score`` rounds to ``lowest``: a left-padded query, a padded patch). Raised to
    the next value up, the mask masks the same keys and such a row averages as in the graph.
    Findings: ``floor`` (``None``: none needed — no mask, torchlib's causal mask, a constant
    mask that keeps a key in every row, a ``Where`` mask whose fills are not the lowest) and
    ``floor_exact``: raise only the lowest entries (``Where(mask = lowest, floor, mask)``)
    where ``-inf`` may occur and torchlib's NaN guard makes its empty rows 0, as onnxruntime
    does; elsewhere ``Max(mask, floor)``."""
    none: dict[str, Any] = {"floor": None, "floor_exact": False}
    if mask is None:
        return none
    arr = const_value(mask)
    if arr is not None and _no_empty_row(np.asarray(arr)):
        return none
    if matches(_CAUSAL_MASK, mask, match.opset, q=q):
        return none
    if q.dtype not in (ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.DOUBLE):
        return fail(f"q's dtype {q.dtype}: the mask's floor cannot be written", q)
    dtype = q.dtype.numpy()
    lowest = float(np.finfo(dtype).min)
    fills = _fills(mask)
    if fills is not None and lowest not in fills:
        return none
    exact = guard == _Guard.NAN_GUARD and (fills is None or -np.inf in fills)
    floor = np.nextafter(np.finfo(dtype).min, 0, dtype=dtype).reshape(())
    return {"floor": floor, "floor_exact": exact}


def _length_of(op: RewriteBuilder, x: ir.Value) -> ir.Value:
    """``x.shape[2:3]`` (a constant where it is static)."""
    d = known_dims(x)
    if d is not None and isinstance(d[2], int):
        return op.const(np.array([d[2]], dtype=np.int64))
    return op.Shape(x, start=2, end=3)


def _runnable_mask(
    op: RewriteBuilder,
    q: ir.Value,
    k: ir.Value,
    mask: ir.Value,
    floor: np.ndarray | None,
    floor_exact: bool,
    expand_query: bool,
    expand_key: bool,
) -> ir.Value:
    """``Expand(Max(mask, floor), (…, S, L))``: the same mask in the layout and with the fill
    onnxruntime's ``Attention`` computes the graph's numbers with (see :func:`_mask_layout`,
    :func:`_mask_floor`); each step only where needed."""
    out = mask
    if floor is not None and floor_exact:
        lowest = op.const(np.finfo(floor.dtype).min.reshape(()))
        out = op.Where(op.Equal(out, lowest), op.const(floor), out)
        out.type, out.shape = mask.type or q.type, mask.shape
    elif floor is not None:
        out = op.Max(out, op.const(floor))
        out.type, out.shape = mask.type or q.type, mask.shape
    if expand_query or expand_key:
        one = op.const(np.array([1], dtype=np.int64))
        target = op.Concat(
            _length_of(op, q) if expand_query else one,
            _length_of(op, k) if expand_key else one,
            axis=0,
        )
        expanded: ir.Value = op.Expand(out, target)
        md, qd, kd = known_dims(mask), known_dims(q), known_dims(k)
        if md is not None and qd is not None and kd is not None:
            full = (1,) * (4 - len(md)) + tuple(md)
            query = qd[2] if expand_query else full[2]
            key = kd[2] if expand_key else full[3]
            expanded.shape = ir.Shape([*md[:-2], query, key])
        expanded.type = mask.type or q.type
        out = expanded
    return out


def _repeat(x: Pattern, e: Pattern, r: Pattern, name: str | None = None) -> Pattern:
    """HF's repeat_kv: (B, Hkv, L, D) → unsqueeze 2 → expand n → reshape (B, Hkv·n, L, D).

    ``name``: bind the expanded value to ``<name>_expanded`` and the result to
    ``<name>_repeated``."""
    expanded = op.Expand(op.Unsqueeze(x, Const(2)), e, _name=name and f"{name}_expanded")
    return op.Reshape(expanded, r, _name=name and f"{name}_repeated")


# --- stage 1b: a causal mask becomes is_causal=1 -------------------------------------------------


class _MaskForm(enum.IntEnum):
    """Which causal mask the causal rule matched (its ``mask_form`` tag)."""

    COMPUTED = 0  # torchlib's Where(Equal(Trilu(Expand(1, [S, L])), 0), lowest, 0)
    OTHER = 1  # anything else: causal if a constant with the same values (folded)


def _length(x: Pattern) -> Pattern:
    """``x.shape[-2]`` as torchlib reads it (a 1-element tensor)."""
    return op.Slice(op.Shape(x), Const(-2), Const(-1))


# torchlib's is_causal mask: ones(S, L), lower triangle kept, 0 there and the lowest value above.
# ``mask_key`` is k, or the key before torchlib's enable_gqa head repeat (same length L).
_CAUSAL_MASK = op.Where(
    op.Equal(
        op.Trilu(
            op.Expand(1.0, op.Concat(_length(q), _length(var("mask_key")))),
            optional(Const(0)),
            upper=0,
        ),
        0.0,
    ),
    var("lowest"),
    0.0,
)
_CAUSAL_ATTENTION = op.Attention(
    q, k, v, either(_CAUSAL_MASK, var("cmask"), tag="mask_form"), is_causal=0
)
_REPEATED_KEY = _repeat(var("mask_key"), var("expand_shape"), var("reshape_shape"))


def _is_constant_causal(cmask: ir.Value | None) -> Verdict:
    """A constant 2-D ``(S, L)`` mask with 0 on and below the diagonal and a value ≤ -1e4 (the
    dtype's lowest) above it."""
    if cmask is None:
        return fail("the Attention has no mask")
    arr = const_value(cmask)
    if arr is None:
        return fail("the mask is neither torchlib's causal mask nor a constant", cmask)
    a = np.asarray(arr, dtype=np.float64)
    if a.ndim != 2:
        return fail("the constant mask is not 2-D", cmask)
    lower = np.tril(np.ones(a.shape, dtype=bool))
    if np.all(a[lower] == 0) and np.all(a[~lower] <= -1e4):
        return True
    return fail("the constant mask is not top-left causal", cmask)


def _check_causal(
    mask_form: int,
    k: ir.Value,
    cmask: ir.Value | None,
    mask_key: ir.Value | None,
    lowest: ir.Value | None,
    match: Match,
) -> Verdict:
    if mask_form == _MaskForm.OTHER:
        return _is_constant_causal(cmask)
    if (fill := scalar(lowest)) is None or fill > -1e4:
        return fail("the mask's fill value is not the dtype's lowest", lowest)
    if mask_key is not k and not matches(_REPEATED_KEY, k, match.opset, mask_key=mask_key):
        return fail("the mask's key length is not k's (nor the key's before its head repeat)", k)
    return True


def _causal(op: RewriteBuilder, q: ir.Value, k: ir.Value, v: ir.Value, match: Match) -> ir.Value:
    """Attention(q, k, v, is_causal=1)"""
    return op.Attention(q, k, v, **{**node_attributes(match.nodes[0]), "is_causal": 1})


# --- stage 2: the K/V head repeat of GQA ----------------------------------------------------------

kr, vr, e1, e2, r1, r2 = var("kr"), var("vr"), var("e1"), var("e2"), var("r1"), var("r2")

_GQA_ATTENTION = op.Attention(q, _repeat(kr, e1, r1, "k"), _repeat(vr, e2, r2, "v"), optional(mask))


def _repeat_factor(src: ir.Value, expanded: ir.Value, repeated: ir.Value) -> int | None | str:
    """``n`` with ``repeated = repeat_kv(src, n)`` judged from dims; a reason string if not."""
    sd, rd = known_dims(src), known_dims(repeated)
    if sd is None or rd is None or len(sd) != 4 or len(rd) != 4:
        return "repeat dims unknown"
    ed = known_dims(expanded)
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


def _check_gqa(
    q: ir.Value,
    kr: ir.Value,
    vr: ir.Value,
    k_expanded: ir.Value,
    v_expanded: ir.Value,
    k_repeated: ir.Value,
    v_repeated: ir.Value,
    match: Match,
) -> Verdict:
    att = match.nodes[0]
    if len(att.outputs) > 1:
        return fail("the Attention already has a cache or extra outputs", att.outputs[0])
    nk = _repeat_factor(kr, k_expanded, k_repeated)
    nv = _repeat_factor(vr, v_expanded, v_repeated)
    if isinstance(nk, str) or isinstance(nv, str):
        return fail(str(nk if isinstance(nk, str) else nv), kr)
    if nk != nv:
        return fail(f"K and V repeated {nk} and {nv} times", kr)
    qd = known_dims(q)
    kd = known_dims(kr)
    if (
        qd is not None
        and kd is not None
        and isinstance(qd[1], int)
        and isinstance(kd[1], int)
        and qd[1] != kd[1] * nk  # type: ignore[operator]
    ):
        return fail(f"{qd[1]} query heads are not {kd[1]} KV heads × {nk}", q)
    return True


def _gqa(
    op: RewriteBuilder, q: ir.Value, kr: ir.Value, vr: ir.Value, mask: ir.Value | None, match: Match
) -> ir.Value:
    """Attention(q, k, v, mask) with Hq ≠ Hkv"""
    inputs = [q, kr, vr] if mask is None else [q, kr, vr, mask]
    return op.Attention(*inputs, **node_attributes(match.nodes[0]))


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
    attrs = node_attributes(att)
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
        if known_rank(value) not in (None, 4):
            return fail(f"{name} must be 4-D, rank is {known_rank(value)}", value)
    if known_rank(k_new) is None and known_rank(past_k) is None:
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
    return tuple(op.Attention(*inputs, _outputs=3, **node_attributes(match.nodes[0])))


rules = RuleSet(
    "attention",
    [
        Rule(  # softmax((q·√s)(kᵀ·√s) + mask)·v, NaN-guarded = Attention(q, k, v, mask, scale=s)
            "Attention",
            _ATTENTION,
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
