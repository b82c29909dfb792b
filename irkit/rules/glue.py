"""Decode-step glue: the shape plumbing around ``Attention`` that a decoder recomputes per token.

irkit lowers a Hugging Face attention as ``Linear → Reshape → Transpose (→ RotaryEmbedding)``
for each of Q, K and V and ``Attention → Transpose → Reshape`` after it, the ``Reshape`` targets
computed per step from ``Shape`` ops. Opset 23's ``RotaryEmbedding`` and ``Attention`` also take
3-D ``(batch, sequence, heads · head_size)`` inputs (``num_heads`` / ``q_num_heads``,
``kv_num_heads``), which removes all of it. Identities:

- ``Reshape(x, s) = x`` when ``x``'s shape and the output's shape are both known and equal dim
  for dim (an int equal to an int, a symbolic dim equal only to the same name): the shape the
  step computes is then the one ``x`` already has (torch's symbolic shapes, kept by the
  lowering, say so); likewise ``Reshape(Reshape(x, s₁), s₂) = x`` (any chain of reshapes that
  comes back to ``x``'s shape, e.g. heads split and merged around an attention op).
- ``Expand(x, s) = x`` likewise, when the output's known shape is ``x``'s.
- ``Unsqueeze(Unsqueeze(x, a₁), a₂) = Unsqueeze(x, a)`` (constant axes; ``a`` the final
  positions of both sets of new dims; the inner output used only by the outer).
- ``GatherND(m, Concat(Unsqueeze(Expand(i, S), -1), Unsqueeze(Expand(j, S), -1)))`` with
  ``i = arange(n)`` along axis ``p`` and ``j = arange(k)`` along axis ``q > p`` (every other
  dim 1): ``y[…, i_p, …, j_q, …] = m[i_p, j_q]``, i.e. ``Unsqueeze(m[:n, :k])`` — how
  transformers' mask code reads the padding mask (``attention_mask[batch_idx, kv_idx]``). A
  ``Slice`` is kept on an axis whose length is not provably ``m``'s (by dim name).
- ``Slice(u(Concat(a, b, …)), 0, n, axis) = u(a)`` for a unary elementwise ``u`` (``Cos``,
  ``Sin``, ``Neg``, ``Exp``, ``Sigmoid``, ``Tanh``, ``Relu``, ``Identity``; or none) when the slice takes exactly ``a`` (``n`` = ``a``'s known size along the concat
  axis, step 1) and ``u``'s output feeds only such slices: the rotary tables
  ``Cos(Concat(f, f))`` sliced to their first half by every layer (opset 23's
  ``RotaryEmbedding`` takes the half table) become ``Cos(f)``.
- ``Transpose₀₂₁₃(Reshape(x, [b, s, H, D]))`` → ``Attention`` / ``RotaryEmbedding`` with a
  3-D input and ``H`` heads, and ``Reshape(Transpose₀₂₁₃(Attention(…)), [b, s, H · D])`` →
  the 3-D ``Attention`` output:

  ``Attention(T(R(q)), T(R(k)), T(R(v)), …)`` with ``T(R(·))`` through an optional
  ``RotaryEmbedding`` ``= Attention₃(Rot₃(q), Rot₃(k), v, …, q_num_heads=Hq, kv_num_heads=Hkv)``
  followed by the inverse ``T``, ``R``.

Preconditions (``HeadReshapesIntoAttention``): opset ≥ 23; each of Q, K, V is ``Transpose(perm=[0, 2, 1, 3])``
of a ``Reshape`` of a rank-3 value ``x`` into ``[b, s, H, D]`` (``H``, ``D`` ints,
``x``'s last dim ``H · D``, its first two dims those of the reshape's output), optionally
followed by a 4-D ``RotaryEmbedding`` (no ``num_heads`` attribute); every intermediate value
used only along the chain; the output ``Y`` read only by ``Transpose(perm=[0, 2, 1, 3])`` then a
``Reshape`` to a rank-3 value whose last dim is ``Hq · D``; ``qk_matmul_output`` unused. The
present key/value outputs are 4-D in both forms and are kept. onnxruntime's CPU kernels compute
the same numbers either way (they transpose internally).

The rules that write ``Unsqueeze``/``Slice`` need opset ≥ 13 (axes as inputs). The family runs after
the fusions, in the ``"onnx"`` target only (:func:`irkit.rules.onnx_target_rules`: the ``"ort"``
target's attention fusions take the 4-D form). Valid in function
bodies; in a model lowered with functions the attention body holds the whole chain, so the
rewrite happens in the body, once for all layers.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import onnx_ir as ir

from irkit.rewriting import (
    BaseRule,
    Match,
    MatchFailure,
    Rewrite,
    RewriteBuilder,
    RewriteContext,
    RuleSet,
    const_ints,
    dims,
    fail,
    same_dims,
)

__all__ = [
    "HeadReshapesIntoAttention",
    "PaddingMaskGather",
    "SliceOfConcat",
    "ShapeKeepingExpand",
    "ShapeKeepingReshape",
    "UnsqueezeUnsqueeze",
    "rules",
]

_HEADS_FIRST = [0, 2, 1, 3]


def _is(node: ir.Node | None, op_type: str) -> bool:
    return node is not None and node.op_type == op_type and node.domain in ("", "ai.onnx")


def _single_use(value: ir.Value) -> bool:
    return len(value.uses()) == 1 and not value.is_graph_output()


def _perm(node: ir.Node) -> list[int] | None:
    perm = node.attributes.get("perm")
    return None if perm is None else list(perm.as_ints())


class _ShapeKeeping(BaseRule):
    """``op(x, s) = x`` when the output's known shape is ``x``'s (dims compared by name)."""

    #: Also look through a chain of ops of this type: ``op(op(x, s₁), s₂) = x`` when the
    #: outer output's known shape is ``x``'s (a reshape chain that comes back to where it began).
    through: str | None = None

    def find(self, node: ir.Node, ctx: RewriteContext) -> Rewrite | MatchFailure:
        x = node.inputs[0] if node.inputs else None
        y = node.outputs[0]
        if x is None:
            return fail("no input", None, node)
        dx, dy = dims(x), dims(y)
        source: ir.Value | None = x
        while source is not None and dy is not None:
            ds = dims(source)
            if ds is not None and same_dims(ds, dy):
                if source.dtype is None or source.dtype != y.dtype:
                    return fail("input and output dtypes unknown or different", y)
                return Rewrite(Match([node], [y], {}, ctx.opset), [], [source])
            inner = source.producer()
            through = inner is not None and self.through is not None and _is(inner, self.through)
            source = inner.inputs[0] if inner is not None and through else None
        if dx is None or dy is None:
            return fail("input or output shape unknown", y)
        return fail(f"output shape {list(dy)} differs from input shape {list(dx)}", y)


class ShapeKeepingReshape(_ShapeKeeping):
    """``Reshape(x, s) = x`` when the output's known shape is ``x``'s (see the module docstring)."""

    name = "ShapeKeepingReshape"
    anchors = frozenset({("", "Reshape")})
    through = "Reshape"
    doc = "Reshape to the shape the input already has (symbolic dims by name)"


class ShapeKeepingExpand(_ShapeKeeping):
    """``Expand(x, s) = x`` when the output's known shape is ``x``'s."""

    name = "ShapeKeepingExpand"
    anchors = frozenset({("", "Expand")})
    doc = "Expand to the shape the input already has (symbolic dims by name)"


def _axes(node: ir.Node, rank: int) -> list[int] | None:
    """The constant, normalized axes of an ``Unsqueeze`` whose output has ``rank`` dims."""
    axes = const_ints(node.inputs[1]) if len(node.inputs) > 1 else None
    if axes is None or any(not -rank <= a < rank for a in axes):
        return None
    normalized = sorted(a % rank for a in axes)
    return normalized if len(set(normalized)) == len(normalized) else None


class UnsqueezeUnsqueeze(BaseRule):
    """``Unsqueeze(Unsqueeze(x, a₁), a₂) = Unsqueeze(x, a)`` (see the module docstring)."""

    name = "UnsqueezeUnsqueeze"
    anchors = frozenset({("", "Unsqueeze")})
    min_opset = 13  # (axes as an input)
    doc = "two Unsqueeze in a row as one"

    def find(self, node: ir.Node, ctx: RewriteContext) -> Rewrite | MatchFailure:
        inner_out = node.inputs[0] if node.inputs else None
        inner = inner_out.producer() if inner_out is not None else None
        if inner_out is None or inner is None or not _is(inner, "Unsqueeze"):
            return fail("input is not an Unsqueeze", inner_out)
        if not _single_use(inner_out):
            return fail("the inner Unsqueeze is used elsewhere", inner_out)
        x = inner.inputs[0]
        mid, out = dims(inner_out), dims(node.outputs[0])
        if x is None or mid is None or out is None:
            return fail("ranks unknown", inner_out)
        outer_axes, inner_axes = _axes(node, len(out)), _axes(inner, len(mid))
        if outer_axes is None or inner_axes is None:
            return fail("axes not constant (or invalid)", inner_out)
        kept = [i for i in range(len(out)) if i not in outer_axes]  # the mid dims' final places
        merged = sorted([*outer_axes, *(kept[a] for a in inner_axes)])
        op = RewriteBuilder()
        y = op.Unsqueeze(x, op.const(np.array(merged, dtype=np.int64)))
        y.type, y.shape = node.outputs[0].type, node.outputs[0].shape
        match = Match([node, inner], [node.outputs[0]], {}, ctx.opset)
        return Rewrite(match, op.nodes, [y])


def _arange_axis(value: ir.Value) -> tuple[ir.Value, int] | MatchFailure:
    """``value`` as ``arange(n)`` along one axis (``Unsqueeze``s of ``Range(0, n, 1)``, the other
    dims 1): ``n`` and the axis."""
    d = dims(value)
    if d is None:
        return fail("index shape unknown", value)
    source: ir.Value | None = value
    producer = value.producer()
    while source is not None and producer is not None and _is(producer, "Unsqueeze"):
        source = producer.inputs[0]
        producer = source.producer() if source is not None else None
    if source is value or producer is None or not _is(producer, "Range"):
        return fail("index is not an Unsqueeze of a Range", value)
    start, limit, delta = (list(producer.inputs) + [None, None, None])[:3]
    if const_ints(start) != [0] or const_ints(delta) != [1] or limit is None:
        return fail("the Range does not count 0, 1, 2, …", source)
    wide = [i for i, n in enumerate(d) if n != 1]
    if len(wide) != 1:
        return fail(f"index of shape {list(d)} does not vary along exactly one axis", value)
    return limit, wide[0]


def _index_operand(value: ir.Value | None) -> tuple[ir.Value, list[ir.Node]] | MatchFailure:
    """``Unsqueeze(Expand(index, S), -1)``: the index and the two nodes."""
    unsqueeze = value.producer() if value is not None else None
    if value is None or unsqueeze is None or not _is(unsqueeze, "Unsqueeze"):
        return fail("GatherND index part is not an Unsqueeze", value)
    axes = const_ints(unsqueeze.inputs[1]) if len(unsqueeze.inputs) > 1 else None
    expanded = unsqueeze.inputs[0]
    expand = expanded.producer() if expanded is not None else None
    if axes != [-1] or expanded is None or expand is None or not _is(expand, "Expand"):
        return fail("GatherND index part is not Unsqueeze(Expand(i, S), -1)", value)
    index = expand.inputs[0]
    if index is None:
        return fail("Expand without input", expanded)
    return index, [unsqueeze, expand]


class PaddingMaskGather(BaseRule):
    """``GatherND`` of a 2-D mask at ``(arange, arange)`` → ``Unsqueeze`` (module docstring)."""

    name = "PaddingMaskGather"
    anchors = frozenset({("", "GatherND")})
    min_opset = 13  # (Unsqueeze axes as an input)
    doc = "m[arange(n)[:, None…], arange(k)[None…, :]] as Unsqueeze(m[:n, :k])"

    def find(self, node: ir.Node, ctx: RewriteContext) -> Rewrite | MatchFailure:
        m, indices = (list(node.inputs) + [None, None])[:2]
        y = node.outputs[0]
        dm, dy = dims(m), dims(y)
        if m is None or indices is None or dm is None or len(dm) != 2 or dy is None:
            return fail("data is not a 2-D value of known shape (or output shape unknown)", m)
        if node.attributes.get_int("batch_dims", 0) != 0:
            return fail("batch_dims != 0", None, node)
        concat = indices.producer()
        if concat is None or not _is(concat, "Concat") or len(concat.inputs) != 2:
            return fail("indices are not a Concat of two index parts", indices)
        if concat.attributes.get_int("axis", 0) != -1 and concat.attributes.get_int(
            "axis", 0
        ) != len(dy):
            return fail("indices not concatenated on the last axis", indices)
        parts = [_index_operand(v) for v in concat.inputs]
        ranges = []
        nodes: list[ir.Node] = [node, concat]
        for part in parts:
            if isinstance(part, MatchFailure):
                return part
            found = _arange_axis(part[0])
            if isinstance(found, MatchFailure):
                return found
            ranges.append(found)
            nodes += part[1]  # (the index chains may be read elsewhere: left to dead-code removal)
        (n_rows, p), (n_cols, q) = ranges
        if not p < q:
            return fail(
                "the row index does not vary along an earlier axis than the column's", indices
            )
        if any(size != 1 for i, size in enumerate(dy) if i not in (p, q)):
            return fail(f"output shape {list(dy)} broadcasts beyond the two indices", y)
        op = RewriteBuilder()
        source = m
        for axis, (limit, size) in enumerate([(n_rows, dy[p]), (n_cols, dy[q])]):
            if size is not None and size == dm[axis]:
                continue  # the whole axis (same dim by name)
            end = op.Reshape(limit, op.const(np.array([1], dtype=np.int64)))
            zero, ax = op.const(np.array([0], np.int64)), op.const(np.array([axis], np.int64))
            source = op.Slice(source, zero, end, ax)
        others = [i for i in range(len(dy)) if i not in (p, q)]
        out = op.Unsqueeze(source, op.const(np.array(others, dtype=np.int64)))
        out.type, out.shape = y.type, y.shape
        unique = list(dict.fromkeys(nodes))
        shared = [
            n for n in unique[1:] if any(u.node not in unique for o in n.outputs for u in o.uses())
        ]
        if shared:
            return fail(
                f"{shared[0].op_type} {shared[0].name!r} is used outside the gather", indices
            )
        match = Match(unique, [y], {}, ctx.opset)
        return Rewrite(match, op.nodes, [out])


_ELEMENTWISE = frozenset({"Cos", "Sin", "Neg", "Exp", "Sigmoid", "Tanh", "Relu", "Identity"})
_ELEMENTWISE_OR_CAST = _ELEMENTWISE | {"Cast"}  # (an fp16 model casts the fp32 rotary tables)
_CHAIN = 3


class SliceOfConcat(BaseRule):
    """``Slice(u(Concat(a, …)), 0, len(a), axis) = u(a)`` (see the module docstring), ``u`` a
    chain of up to three elementwise ops (``Cast`` too: an fp16 model's rotary tables)."""

    name = "SliceOfConcat"
    anchors = frozenset({("", "Slice")})
    min_opset = 13  # (starts/ends/axes as inputs from 10; one floor for the family)
    doc = "a slice that takes back the first operand of a Concat (through Cos/Sin/Cast/…)"

    def find(self, node: ir.Node, ctx: RewriteContext) -> Rewrite | MatchFailure:
        inputs = list(node.inputs) + [None] * (5 - len(node.inputs))
        data, starts, ends, axes, steps = inputs[:5]
        if data is None:
            return fail("no input", None, node)
        nodes = [node]
        chain: list[
            ir.Node
        ] = []  # the elementwise ops between the Concat and the Slice, last first
        concat_out = data
        while len(chain) < _CHAIN and (unary := concat_out.producer()) is not None:
            if unary.domain != "" or unary.op_type not in _ELEMENTWISE_OR_CAST:
                break
            if not unary.inputs or unary.inputs[0] is None:
                return fail("elementwise op without input", concat_out)
            if chain and (concat_out.is_graph_output() or len(concat_out.uses()) != 1):
                return fail(f"{unary.op_type} output read elsewhere too", concat_out)
            chain.append(unary)
            concat_out = unary.inputs[0]
        concat = concat_out.producer()
        if concat is None or not _is(concat, "Concat") or not concat.inputs:
            return fail("the sliced value is not a Concat (through elementwise ops)", data)
        first = concat.inputs[0]
        d, d_first = dims(concat_out), dims(first)
        if first is None or d is None or d_first is None:
            return fail("Concat shapes unknown", concat_out)
        axis = concat.attributes.get_int("axis", 0) % len(d)
        if (
            const_ints(starts) != [0]
            or (steps is not None and const_ints(steps) != [1])
            or const_ints(ends) != [d_first[axis]]
            or not isinstance(d_first[axis], int)
        ):
            return fail(
                f"the slice does not take exactly the first operand ({d_first})", node.outputs[0]
            )
        slice_axes = [0] if axes is None else const_ints(axes)
        if slice_axes is None or len(slice_axes) != 1 or slice_axes[0] % len(d) != axis:
            return fail("the slice is not along the Concat axis", node.outputs[0])
        if chain and (
            data.is_graph_output() or any(use.node.op_type != "Slice" for use in data.uses())
        ):
            return fail(f"{chain[0].op_type} output read by more than slices", data)
        op = RewriteBuilder()
        out = first
        for unary in reversed(chain):  # rebuilt on the first operand alone, in the same order
            typed = unary.outputs[0].type
            out = op.node("", unary.op_type, [out], _attributes(unary)).outputs[0]
            out.type, out.shape = typed, node.outputs[0].shape
        match = Match(nodes, [node.outputs[0]], {}, ctx.opset)
        return Rewrite(match, op.nodes, [out])


@dataclasses.dataclass
class _HeadsInput:
    """One Q/K/V input as ``[Rotary](Transpose(Reshape(x)))``: its nodes, ``x``, heads."""

    x: ir.Value
    heads: int
    head_size: int
    nodes: list[ir.Node]
    rotary: ir.Node | None


def _heads_input(value: ir.Value | None) -> _HeadsInput | MatchFailure:
    if value is None:
        return fail("Q, K or V absent")
    producer = value.producer()
    rotary = None
    if producer is not None and producer.op_type == "RotaryEmbedding" and producer.domain == "":
        if "num_heads" in producer.attributes or not _single_use(value):
            return fail("RotaryEmbedding already 3-D or its output used elsewhere", value)
        rotary = producer
        value = producer.inputs[0]
        if value is None:
            return fail("RotaryEmbedding without input")
        producer = value.producer()
    if not _is(producer, "Transpose") or producer is None or _perm(producer) != _HEADS_FIRST:
        return fail("not Transpose(perm=[0, 2, 1, 3]) of the heads", value)
    if not _single_use(value):
        return fail("the heads-first Transpose is used elsewhere", value)
    split = producer.inputs[0]
    reshape = split.producer() if split is not None else None
    if split is None or reshape is None or not _is(reshape, "Reshape"):
        return fail("Transpose input is not a Reshape", split)
    if not _single_use(split):
        return fail("the heads Reshape is used elsewhere", split)
    x = reshape.inputs[0]
    d4, d3 = dims(split), dims(x)
    if x is None or d4 is None or d3 is None or len(d4) != 4 or len(d3) != 3:
        return fail("Reshape is not rank 3 → rank 4 with known shapes", split)
    heads, size = d4[2], d4[3]
    if not isinstance(heads, int) or not isinstance(size, int) or d3[2] != heads * size:
        return fail(f"Reshape {list(d3)} → {list(d4)} does not split the last dim into heads", x)
    if not same_dims(d3[:2], d4[:2]):
        return fail(f"Reshape {list(d3)} → {list(d4)} changes batch or sequence", x)
    nodes = [producer, reshape] if rotary is None else [rotary, producer, reshape]
    return _HeadsInput(x, heads, size, nodes, rotary)


def _merged_output(y: ir.Value, hidden: int) -> tuple[list[ir.Node], ir.Value] | MatchFailure:
    """``Reshape(Transpose₀₂₁₃(y), [b, s, hidden])``: its nodes and output."""
    if not _single_use(y):
        return fail("Attention output read by more than one node", y)
    transpose = next(iter(y.uses())).node
    if not _is(transpose, "Transpose") or _perm(transpose) != _HEADS_FIRST:
        return fail("Attention output not followed by Transpose(perm=[0, 2, 1, 3])", y)
    t = transpose.outputs[0]
    if not _single_use(t):
        return fail("the output Transpose is used elsewhere", t)
    reshape = next(iter(t.uses())).node
    out = reshape.outputs[0]
    d = dims(out)
    if not _is(reshape, "Reshape") or d is None or len(d) != 3 or d[2] != hidden:
        return fail(f"output Transpose not followed by a Reshape to [b, s, {hidden}]", t)
    return [transpose, reshape], out


def _attributes(node: ir.Node) -> dict[str, Any]:
    return {k: a.value for k, a in node.attributes.items()}


class HeadReshapesIntoAttention(BaseRule):
    """4-D ``Attention`` with its head reshapes → 3-D ``Attention`` (see the module docstring)."""

    name = "HeadReshapesIntoAttention"
    anchors = frozenset({("", "Attention")})
    min_opset = 23
    doc = "Attention and RotaryEmbedding on 3-D (batch, sequence, hidden) inputs"

    def find(self, node: ir.Node, ctx: RewriteContext) -> Rewrite | MatchFailure:
        if "q_num_heads" in node.attributes:
            return fail("Attention is already 3-D", None, node)
        if len(node.outputs) > 3 and node.outputs[3].uses():
            return fail("qk_matmul_output is used", node.outputs[3])
        found: list[_HeadsInput] = []
        for i in range(3):
            one = _heads_input(node.inputs[i] if len(node.inputs) > i else None)
            if isinstance(one, MatchFailure):
                return one
            found.append(one)
        q, k, v = found
        if k.heads != v.heads:
            return fail(f"K has {k.heads} heads, V {v.heads}", node.inputs[2])
        merged = _merged_output(node.outputs[0], q.heads * v.head_size)
        if isinstance(merged, MatchFailure):
            return merged
        tail, y = merged
        op = RewriteBuilder()
        inputs = [self._rotated(op, f) for f in (q, k, v)]
        outputs = list(node.outputs[1:3])
        new = op.Attention(
            *inputs,
            *node.inputs[3:],
            _outputs=1 + len(outputs),
            **{**_attributes(node), "q_num_heads": q.heads, "kv_num_heads": k.heads},
        )
        new = new if isinstance(new, tuple) else (new,)
        new[0].type, new[0].shape = y.type, y.shape
        nodes = [node, *q.nodes, *k.nodes, *v.nodes, *tail]
        match = Match(nodes, [y, *outputs], {}, ctx.opset)
        return Rewrite(match, op.nodes, list(new))

    @staticmethod
    def _rotated(op: RewriteBuilder, found: _HeadsInput) -> ir.Value:
        if found.rotary is None:
            return found.x
        attrs = {**_attributes(found.rotary), "num_heads": found.heads}
        out: ir.Value = op.RotaryEmbedding(found.x, *found.rotary.inputs[1:], **attrs)
        out.type, out.shape = found.x.type, found.x.shape
        return out


rules = RuleSet(
    "glue",
    [
        ShapeKeepingReshape(),
        ShapeKeepingExpand(),
        UnsqueezeUnsqueeze(),
        PaddingMaskGather(),
        SliceOfConcat(),
        HeadReshapesIntoAttention(),
    ],
)
"""The glue rules, in priority order."""
