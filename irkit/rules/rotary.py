"""Rotary position embedding → the ONNX ``RotaryEmbedding`` op (opset ≥ 23).

Identities (``x`` ``(B, H, S, D)``, ``h = D/2``; ``c``/``s`` ``(B, S, h)`` the cos/sin of the
rotation angles):

- half rotation (HF's ``rotate_half``, Llama, Qwen, Mistral, …)::

    x · [c, c] + [-x[h:], x[:h]] · [s, s] = RotaryEmbedding(x, c, s)

- interleaved (GPT-J's ``rotate_every_two``)::

    x · c⊗2 + flatten(stack(-x[1::2], x[::2])) · s⊗2 = RotaryEmbedding(x, c, s, interleaved=1)

where ``[c, c]`` is ``c`` concatenated with itself on the last axis and ``c⊗2`` each element
repeated twice. HF hands the attention ``cos``/``sin`` of shape ``(B, S, D)`` (duplicated
halves) and unsqueezes them to ``(B, 1, S, D)`` (one ``Unsqueeze`` shared by the q and k
rotations, so it is not part of the match: the rewrite takes its input, or squeezes axis 1 when
the value is not an ``Unsqueeze``); the rewrite slices the first half (``[..., :h]``
for the half form, ``[..., ::2]`` for the interleaved one) to get the op's ``(B, S, h)`` caches —
two small ``Slice`` s per call, no position ids (the op's ``position_ids`` input stays empty).

Emitted form (what the ``"ort"`` target consumes): ``RotaryEmbedding(X, cos_cache, sin_cache)``
with 4-D ``X`` ``(B, H, S, D)``, 3-D caches ``(B, S, D/2)``, no ``position_ids``, attribute
``interleaved=1`` for the interleaved form only (no ``num_heads``, no ``rotary_embedding_dim``:
the whole head dim rotates).

Preconditions: opset ≥ 23; ``x`` 4-D with a static, even last dim ``D``; the slices are exactly
the two halves (``[0, h)`` and ``[h, D)``) or the even/odd lanes of the last axis; ``cos``/``sin``
``(B, 1, S, D)`` with the same sequence dim as ``x`` and its batch dim or 1 (onnxruntime
does not broadcast the caches' batch, so a batch-1 cache — positions shared by the batch — is
``Expand`` ed to ``Shape(x)[0]``) and ``x``'s dtype; and ``cos``/``sin`` provably duplicated: a
constant whose halves (interleaved: even/odd lanes) are equal, or (half form) computed by
``Cos``/``Sin`` of ``Concat(f, f)`` on the last axis, through scalar ``Mul``, ``Cast`` and —
across module boundaries — local-function inputs and outputs (every call site of the function is
checked, so the rule sees HF's ``LlamaRotaryEmbedding`` from inside ``LlamaAttention``). A
computed interleaved cache (``repeat_interleave``) is not verified yet, so that rule fires only
on constant caches.

- partial rotation (the first ``r`` of ``D`` lanes rotate, the rest pass through; Qwen3.5,
  Phi, GLM …), after the rules above rotated the slice::

    Concat(RotaryEmbedding(x[..., :r], c, s), x[..., r:]) = RotaryEmbedding(x, c, s,
                                                                  rotary_embedding_dim=r)

  (4-D ``x``, static ``D``, even ``r < D``, caches ``r/2`` wide; the op's own partial rotation
  passes the last ``D − r`` lanes through unchanged).

- heads merged after the rotation (what the ``"ort"`` target's 3-D attention ops leave:
  ``T = Transpose(perm=[0, 2, 1, 3])``, ``y`` ``(B, S, H, D)``)::

    Reshape(T(RotaryEmbedding(T(y), c, s)), [B, S, H·D]) = RotaryEmbedding(Reshape(y, [0, 0, H·D]),
                                                                     c, s, num_heads=H)

  (the op's 3-D form rotates each head's ``D`` lanes; static ``H``, ``D``; the result's batch and
  sequence dims ``y``'s; no ``num_heads`` yet). Two transposes fewer per rotated input.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import onnx_ir as ir

from irkit.rewriting import (
    Const,
    DerivedTensor,
    Match,
    MatchFailure,
    RewriteBuilder,
    RewriteContext,
    Rule,
    RuleSet,
    Verdict,
    attr,
    const_ints,
    const_value,
    dims,
    either,
    fail,
    matches,
    op,
    optional,
    rank,
    scalar,
    var,
)
from irkit.weights import Cast, Concat, Constant, Mul, Recipe, Reshape, Unary

x, cos, sin = var("x"), var("cos"), var("sin")  # cos/sin: (B, 1, S, D) as the attention sees them
a0, e0, a1, e1, ax0, ax1, st0, st1 = (
    var(n) for n in ("a0", "e0", "a1", "e1", "ax0", "ax1", "st0", "st1")
)

_X_LOW = op.Slice(x, a0, e0, optional(ax0), optional(st0))
_X_HIGH = op.Slice(x, a1, e1, optional(ax1), optional(st1))
_COS4, _SIN4 = cos, sin  # the (shared) Unsqueeze is not part of the match

_HALF = x * _COS4 + op.Concat(op.Neg(_X_HIGH), _X_LOW, axis=attr("cat_axis")) * _SIN4
_STACKED = op.Concat(
    op.Unsqueeze(op.Neg(_X_HIGH), Const(-1)), op.Unsqueeze(_X_LOW, Const(-1)), axis=-1
)
_INTERLEAVED = x * _COS4 + op.Reshape(_STACKED, var("flat")) * _SIN4


def _slice(
    x: ir.Value, start: ir.Value, end: ir.Value, axis: ir.Value | None, step: ir.Value | None
) -> tuple[int, int, int] | None:
    """``(start, end, step)`` of a last-axis slice of a 4-D ``x`` with constant bounds."""
    s, e = const_ints(start), const_ints(end)
    a = [-1] if axis is None else const_ints(axis)
    t = [1] if step is None else const_ints(step)
    if s is None or e is None or a is None or t is None or len(s) != 1 or len(a) != 1:
        return None
    if a[0] not in (-1, 3):
        return None
    d = dims(x)
    last = d[-1] if d else None
    if not isinstance(last, int):
        return None
    stop = min(e[0], last) if e[0] >= 0 else e[0] + last  # (an end past the dim: to the end)
    first = s[0] + last if s[0] < 0 else s[0]
    return first, stop, t[0]


def _check_common(x: ir.Value, cos: ir.Value, sin: ir.Value, match: Match) -> Verdict | int:
    xd = dims(x)
    if xd is None or len(xd) != 4:
        return fail(f"x must be 4-D (B, H, S, D), rank is {rank(x)}", x)
    d = xd[-1]
    if not isinstance(d, int) or d % 2:
        return fail(f"the head dim {d} is not a static even number", x)
    for c in (cos, sin):
        cd = dims(c)
        if cd is None or len(cd) != 4 or cd[1] != 1:
            return fail(f"cos/sin dims {cd} are not (B, 1, S, D)", c)
        if (cd[0] != xd[0] and cd[0] != 1) or cd[2] != xd[2] or cd[3] != d:
            return fail(f"cos/sin dims {cd} do not match x {xd} (batch, 1, sequence, head dim)", c)
    if x.dtype is not None and cos.dtype is not None and cos.dtype != x.dtype:
        return fail(f"cos dtype {cos.dtype} differs from x dtype {x.dtype}", cos)
    return d


def _check_half(
    x: ir.Value,
    cos: ir.Value,
    sin: ir.Value,
    a0: ir.Value,
    e0: ir.Value,
    ax0: ir.Value | None,
    st0: ir.Value | None,
    a1: ir.Value,
    e1: ir.Value,
    ax1: ir.Value | None,
    st1: ir.Value | None,
    cat_axis: int,
    match: Match,
    ctx: RewriteContext,
) -> Verdict:
    d = _check_common(x, cos, sin, match)
    if not isinstance(d, int):
        return d
    h = d // 2
    if cat_axis not in (-1, 3):
        return fail(f"rotate_half concatenates along axis {cat_axis}, not the last", x)
    low, high = _slice(x, a0, e0, ax0, st0), _slice(x, a1, e1, ax1, st1)
    if low != (0, h, 1) or high != (h, d, 1):
        return fail(f"slices {low} / {high} are not the halves [0, {h}) / [{h}, {d})", x)
    duplicated = _check_duplicated(cos, sin, False, match, ctx)
    return duplicated if duplicated is not True else {"head_dim": d}


def _check_interleaved(
    x: ir.Value,
    cos: ir.Value,
    sin: ir.Value,
    a0: ir.Value,
    e0: ir.Value,
    ax0: ir.Value | None,
    st0: ir.Value | None,
    a1: ir.Value,
    e1: ir.Value,
    ax1: ir.Value | None,
    st1: ir.Value | None,
    flat: ir.Value,
    match: Match,
    ctx: RewriteContext,
) -> Verdict:
    d = _check_common(x, cos, sin, match)
    if not isinstance(d, int):
        return d
    low, high = _slice(x, a0, e0, ax0, st0), _slice(x, a1, e1, ax1, st1)
    if low != (0, d, 2) or high != (1, d, 2):
        return fail(f"slices {low} / {high} are not the even / odd lanes of {d}", x)
    flat_dims = const_ints(flat)
    xd = dims(x)
    if flat_dims is None or xd is None:
        return fail("the flattening shape is not constant", flat)
    want = [v if isinstance(v, int) else None for v in xd]
    got = [v if v not in (0, -1) else None for v in flat_dims]
    if len(got) != 4 or any(
        w is not None and g is not None and w != g for w, g in zip(want, got, strict=True)
    ):
        return fail(f"reshape {flat_dims} does not restore x's shape {xd}", flat)
    duplicated = _check_duplicated(cos, sin, True, match, ctx)
    return duplicated if duplicated is not True else {"head_dim": d}


_UNSQUEEZED = op.Unsqueeze(var("cache3"), Const(1))  # (shared by the q and k rotations: kept)


def _cache3(op: RewriteBuilder, c: ir.Value, x: ir.Value, opset: int) -> ir.Value:
    """(B, 1, S, D) → (B, S, D): the Unsqueeze's input when there is one, else a Squeeze.

    A batch-1 cache (positions shared by the batch) is expanded to ``x``'s batch: onnxruntime's
    kernel does not broadcast it.
    """
    unsqueezed = matches(_UNSQUEEZED, c, opset)
    if isinstance(unsqueezed, dict):
        out: ir.Value = unsqueezed["cache3"]
    else:
        out = op.Squeeze(c, op.const([1], np.int64))
    cd, xd = dims(c), dims(x)
    if cd is not None and xd is not None and cd[0] == 1 and xd[0] != 1:
        batch = op.Shape(x, start=0, end=1)
        out = op.Expand(out, op.Concat(batch, op.const([1, 1], np.int64), axis=0))
    return out


def _half(
    op: RewriteBuilder, x: ir.Value, cos: ir.Value, sin: ir.Value, head_dim: int, match: Match
) -> ir.Value:
    """RotaryEmbedding(x, cos[..., :D/2], sin[..., :D/2])"""
    h = head_dim // 2
    start, end, axis = op.const([0], np.int64), op.const([h], np.int64), op.const([-1], np.int64)
    c, s = _cache3(op, cos, x, match.opset), _cache3(op, sin, x, match.opset)
    return op.RotaryEmbedding(x, op.Slice(c, start, end, axis), op.Slice(s, start, end, axis))


def _interleaved(
    op: RewriteBuilder, x: ir.Value, cos: ir.Value, sin: ir.Value, head_dim: int, match: Match
) -> ir.Value:
    """RotaryEmbedding(x, cos[..., ::2], sin[..., ::2], interleaved=1)"""
    d = head_dim
    start, end = op.const([0], np.int64), op.const([d], np.int64)
    axis, step = op.const([-1], np.int64), op.const([2], np.int64)
    return op.RotaryEmbedding(
        x,
        op.Slice(_cache3(op, cos, x, match.opset), start, end, axis, step),
        op.Slice(_cache3(op, sin, x, match.opset), start, end, axis, step),
        interleaved=1,
    )


# --- is cos/sin really duplicated? (may look through local-function boundaries) ----------------

_MAX_DEPTH = 12


def _call_sites(
    model: ir.Model, fn: ir.Function
) -> Iterator[tuple[ir.Node, ir.Graph | ir.Function]]:
    key = (fn.domain, fn.name, fn.overload)
    graphs: list[ir.Graph | ir.Function] = [model.graph, *model.functions.values()]
    for graph in graphs:
        for node in graph:
            if (node.domain, node.op_type, node.overload) == key:
                yield node, graph


def _duplicated(
    value: ir.Value, owner: ir.Graph | ir.Function, model: ir.Model, interleaved: bool, depth: int
) -> str | None:
    """``None`` if ``value`` provably has equal halves (lanes) on its last axis, else why not."""
    if depth > _MAX_DEPTH:
        return "cos/sin provenance too deep to verify"
    if isinstance(value.const_value, DerivedTensor):  # (weightless: proven from its recipe)
        if _equal_halves(value.const_value.recipe, interleaved):
            return None
        return "cos/sin derived from weightless weights: equal halves not provable"
    arr = const_value(value)
    if arr is not None:
        a = np.asarray(arr)
        if a.ndim == 0 or a.shape[-1] % 2:
            return "cos/sin constant has an odd last dim"
        h = a.shape[-1] // 2
        same = (
            np.array_equal(a[..., 0::2], a[..., 1::2])
            if interleaved
            else np.array_equal(a[..., :h], a[..., h:])
        )
        return None if same else f"cos/sin constant {'lanes' if interleaved else 'halves'} differ"
    node = value.producer()
    if node is None:
        if isinstance(owner, ir.Function) and value in owner.inputs:
            index = list(owner.inputs).index(value)
            sites = list(_call_sites(model, owner))
            if not sites:
                return "cos/sin is an input of an uncalled function"
            for call, graph in sites:
                arg = call.inputs[index] if index < len(call.inputs) else None
                if arg is None:
                    return "cos/sin argument absent at a call site"
                why = _duplicated(arg, graph, model, interleaved, depth + 1)
                if why:
                    return why
            return None
        return "cos/sin is a graph input: its halves cannot be verified"
    key = (node.domain, node.op_type, node.overload)
    fn = model.functions.get(key)
    if fn is not None:
        index = list(node.outputs).index(value)
        return _duplicated(fn.outputs[index], fn, model, interleaved, depth + 1)
    if node.domain not in ("", "ai.onnx"):
        return f"cos/sin computed by {node.domain}::{node.op_type}"
    if node.op_type in ("Unsqueeze", "Squeeze") and len(node.inputs) == 2:
        axes = const_ints(node.inputs[1])
        r = rank(value)
        if axes is None or -1 in axes or (r is not None and r - 1 in axes):
            return "cos/sin (un)squeezed on an unknown or the last axis"
        return _duplicated(node.inputs[0], owner, model, interleaved, depth + 1)  # type: ignore[arg-type]
    if node.op_type in ("Cast", "Identity", "Cos", "Sin"):
        return _duplicated(node.inputs[0], owner, model, interleaved, depth + 1)  # type: ignore[arg-type]
    if node.op_type == "Mul" and len(node.inputs) == 2:
        left, right = node.inputs
        if scalar(right) is not None and left is not None:
            return _duplicated(left, owner, model, interleaved, depth + 1)
        if scalar(left) is not None and right is not None:
            return _duplicated(right, owner, model, interleaved, depth + 1)
    if not interleaved and node.op_type == "Concat" and len(node.inputs) == 2:
        axis = node.attributes.get_int("axis", 0)
        r = rank(value)
        if node.inputs[0] is node.inputs[1] and (axis == -1 or (r is not None and axis == r - 1)):
            return None
    return f"cannot verify that cos/sin has duplicated halves ({node.op_type} found)"


def _equal_halves(recipe: Recipe, interleaved: bool) -> bool:
    """Whether a derived tensor's ``recipe`` provably makes the two halves of its last axis
    equal (``interleaved``: its even and odd lanes): ``Concat(a, a)`` on the last axis, seen
    through casts, elementwise functions, scalar multiplications and reshapes that keep the
    last axis; constants are checked by value. False when not provable."""
    shape = recipe.shape
    if not shape or shape[-1] % 2:
        return False
    if isinstance(recipe, Constant):
        a, h = recipe.value, shape[-1] // 2
        if interleaved:
            return bool(np.array_equal(a[..., 0::2], a[..., 1::2]))
        return bool(np.array_equal(a[..., :h], a[..., h:]))
    if isinstance(recipe, (Cast, Unary)):
        return _equal_halves(recipe.source, interleaved)
    if isinstance(recipe, Reshape):
        kept = recipe.source.shape and recipe.source.shape[-1] == shape[-1]
        return bool(kept) and _equal_halves(recipe.source, interleaved)
    if isinstance(recipe, Mul):
        for this, other in ((recipe.a, recipe.b), (recipe.b, recipe.a)):
            if int(np.prod(other.shape, dtype=np.int64)) == 1 and this.shape == shape:
                return _equal_halves(this, interleaved)
        return False
    if isinstance(recipe, Concat) and not interleaved:
        return (
            len(recipe.parts) == 2
            and recipe.axis == len(shape) - 1
            and recipe.parts[0] == recipe.parts[1]
        )
    return False


def _check_duplicated(
    cos: ir.Value, sin: ir.Value, interleaved: bool, match: Match, ctx: RewriteContext
) -> Verdict:
    """cos/sin provably duplicated, followed through the model (``ctx``) across functions."""
    for value in (cos, sin):
        why = _duplicated(value, ctx.graph, ctx.model, interleaved, 0)
        if why:
            return fail(why, value, match.nodes[0])
    return True


_ROTATED = op.RotaryEmbedding(
    op.Slice(x, var("r_start"), var("r_end"), var("r_axes"), optional(var("r_steps"))),
    cos,
    sin,
    interleaved=attr("interleaved"),
    rotary_embedding_dim=attr("rotary_embedding_dim"),
    num_heads=attr("num_heads"),
    _exact_attributes=True,
)
_PARTIAL = op.Concat(
    _ROTATED,
    op.Slice(x, var("p_start"), var("p_end"), var("p_axes"), optional(var("p_steps"))),
    axis=attr("cat_axis"),
)


def _rotated_lanes(
    head: int,
    r_start: ir.Value,
    r_end: ir.Value,
    r_axes: ir.Value,
    r_steps: ir.Value | None,
    p_start: ir.Value,
    p_end: ir.Value,
    p_axes: ir.Value,
    p_steps: ir.Value | None,
    cat_axis: int,
) -> int | MatchFailure:
    """``r`` when the slices are ``x[..., :r]`` and ``x[..., r:]`` (even ``r < head``) joined back
    on the last axis of a 4-D ``x``."""
    if cat_axis not in (3, -1):
        return fail("the halves are not joined on the last axis", r_axes)
    for axes, steps in ((r_axes, r_steps), (p_axes, p_steps)):
        if const_ints(axes) not in ([3], [-1]) or (steps is not None and const_ints(steps) != [1]):
            return fail("a slice is not on the last axis with step 1", axes)
    start, end, rest, last = (const_ints(v) for v in (r_start, r_end, p_start, p_end))
    if start != [0] or end is None or rest != end or last is None:
        return fail("the slices are not x[..., :r] and x[..., r:]", r_end)
    rotated = end[0]
    if not 0 < rotated < head or rotated % 2 or last[0] < head:
        return fail(f"the slices are not x[..., :r] and x[..., r:] for an even r < {head}", r_end)
    # (the caches are r/2 wide: the op rotating the r-lane slice reads half its lanes from them)
    return rotated


def _check_partial(
    x: ir.Value,
    r_start: ir.Value,
    r_end: ir.Value,
    r_axes: ir.Value,
    r_steps: ir.Value | None,
    p_start: ir.Value,
    p_end: ir.Value,
    p_axes: ir.Value,
    p_steps: ir.Value | None,
    rotary_embedding_dim: int | None,
    num_heads: int | None,
    cat_axis: int,
) -> Verdict:
    shape = dims(x)
    if shape is None or len(shape) != 4 or not isinstance(shape[-1], int):
        return fail("x is not 4-D with a static head dim", x)
    if rotary_embedding_dim or num_heads:
        return fail("the rotary already has a rotary_embedding_dim or num_heads", x)
    rotated = _rotated_lanes(
        shape[-1], r_start, r_end, r_axes, r_steps, p_start, p_end, p_axes, p_steps, cat_axis
    )
    return rotated if isinstance(rotated, MatchFailure) else {"rotated": rotated}


def _partial(
    op: RewriteBuilder,
    x: ir.Value,
    cos: ir.Value,
    sin: ir.Value,
    interleaved: int | None,
    rotated: int,
) -> ir.Value:
    """RotaryEmbedding(x, cos, sin, rotary_embedding_dim=r)"""
    out: ir.Value = op.RotaryEmbedding(
        x, cos, sin, interleaved=interleaved or None, rotary_embedding_dim=rotated
    )
    return out


_T_Y = op.Transpose(var("y"), perm=[0, 2, 1, 3])


def _rotary_of(value: Any) -> Any:
    return op.RotaryEmbedding(
        value,
        cos,
        sin,
        optional(var("positions")),
        interleaved=attr("interleaved"),
        rotary_embedding_dim=attr("rotary_embedding_dim"),
        num_heads=attr("num_heads"),
        _exact_attributes=True,
    )


_MERGED = op.Reshape(
    op.Transpose(
        either(
            _rotary_of(_T_Y),
            op.Concat(
                _rotary_of(
                    op.Slice(
                        _T_Y, var("r_start"), var("r_end"), var("r_axes"), optional(var("r_steps"))
                    )
                ),
                op.Slice(
                    _T_Y, var("p_start"), var("p_end"), var("p_axes"), optional(var("p_steps"))
                ),
                axis=attr("cat_axis"),
            ),
            tag="partial",
        ),
        perm=[0, 2, 1, 3],
    ),
    var("merged"),
    allowzero=attr("allowzero"),
)


def _check_merged(
    y: ir.Value,
    num_heads: int | None,
    rotary_embedding_dim: int | None,
    partial: int,
    match: Match,
    r_start: ir.Value | None = None,
    r_end: ir.Value | None = None,
    r_axes: ir.Value | None = None,
    r_steps: ir.Value | None = None,
    p_start: ir.Value | None = None,
    p_end: ir.Value | None = None,
    p_axes: ir.Value | None = None,
    p_steps: ir.Value | None = None,
    cat_axis: int | None = None,
) -> Verdict:
    shape, out = dims(y), dims(match.outputs[0])
    if shape is None or len(shape) != 4:
        return fail("y is not (B, S, H, D)", y)
    heads, size = shape[2], shape[3]
    if not isinstance(heads, int) or not isinstance(size, int):
        return fail("y's heads and head size are not static", y)
    if num_heads:
        return fail("the rotary already has num_heads", y)
    if out is None or len(out) != 3 or out[2] != heads * size:
        return fail(f"the result is not (B, S, {heads * size})", match.outputs[0])
    if any(d is None or d != e for d, e in zip(out[:2], shape[:2], strict=True)):
        return fail("the result's batch and sequence dims are not y's", match.outputs[0])
    rotated = rotary_embedding_dim
    if partial == 1:
        if rotary_embedding_dim:
            return fail("the rotated slice already has a rotary_embedding_dim", y)
        if r_start is None or r_end is None or r_axes is None:
            return fail("the rotated slice's starts, ends or axes are not bound", y)
        if p_start is None or p_end is None or p_axes is None:
            return fail("the passed-through slice's starts, ends or axes are not bound", y)
        lanes = _rotated_lanes(
            size, r_start, r_end, r_axes, r_steps, p_start, p_end, p_axes, p_steps, cat_axis or 0
        )
        if isinstance(lanes, MatchFailure):
            return lanes
        rotated = lanes
    return {"heads": heads, "width": heads * size, "rotated": rotated}


def _merged(
    op: RewriteBuilder,
    y: ir.Value,
    cos: ir.Value,
    sin: ir.Value,
    positions: ir.Value | None,
    interleaved: int | None,
    heads: int,
    width: int,
    rotated: int | None,
) -> ir.Value:
    """RotaryEmbedding(Reshape(y, [0, 0, H·D]), cos, sin, num_heads=H)"""
    flat = op.Reshape(y, op.const(np.array([0, 0, width], dtype=np.int64)))
    out: ir.Value = op.RotaryEmbedding(
        flat,
        cos,
        sin,
        positions,
        interleaved=interleaved or None,
        rotary_embedding_dim=rotated or None,
        num_heads=heads,
    )
    return out


rules = RuleSet(
    "rotary",
    [
        Rule(  # x·[c,c] + rotate_half(x)·[s,s] = RotaryEmbedding(x, c, s)
            "RotaryEmbedding",
            _HALF,
            check=_check_half,
            rewrite=_half,
            min_opset=23,
        ),
        Rule(  # x·c⊗2 + rotate_every_two(x)·s⊗2 = RotaryEmbedding(x, c, s, interleaved=1)
            "RotaryEmbeddingInterleaved",
            _INTERLEAVED,
            check=_check_interleaved,
            rewrite=_interleaved,
            min_opset=23,
        ),
        Rule(  # [RotaryEmbedding(x[..., :r], c, s), x[..., r:]] = RotaryEmbedding(x, c, s, dim=r)
            "PartialRotaryEmbedding",
            _PARTIAL,
            check=_check_partial,
            rewrite=_partial,
            min_opset=23,
        ),
        Rule(  # merge(Tᵀ(RotaryEmbedding(T(y)))) = RotaryEmbedding(merge(y), num_heads=H)
            "RotaryEmbeddingHeadsMerged",
            _MERGED,
            check=_check_merged,
            rewrite=_merged,
            min_opset=23,
        ),
    ],
)
"""The rotary rules (half rotation, interleaved)."""
