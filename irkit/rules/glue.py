"""Decode-step glue: the shape plumbing around ``Attention`` that a decoder recomputes per token.

irkit lowers a Hugging Face attention as ``Linear → Reshape → Transpose (→ RotaryEmbedding)``
for each of Q, K and V and ``Attention → Transpose → Reshape`` after it, the ``Reshape`` targets
computed per step from ``Shape`` ops. Opset 23's ``RotaryEmbedding`` and ``Attention`` also take
3-D ``(batch, sequence, heads · head_size)`` inputs (``num_heads`` / ``q_num_heads``,
``kv_num_heads``), which removes all of it. Identities:

- ``Reshape(x, s) = x`` when ``x``'s shape and the output's shape are both known and equal dim
  for dim (an int equal to an int, a symbolic dim equal only to the same name): the shape the
  step computes is then the one ``x`` already has (torch's symbolic shapes, kept by the
  lowering, say so).
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

The family runs after the fusions (see :func:`irkit.rules.default_rules`). Valid in function
bodies; in a model lowered with functions the attention body holds the whole chain, so the
rewrite happens in the body, once for all layers.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import onnx_ir as ir

from irkit.rewriting import (
    BaseRule,
    Match,
    MatchFailure,
    Rewrite,
    RewriteBuilder,
    RewriteContext,
    RuleSet,
    dims,
    fail,
    same_dims,
)

__all__ = ["HeadReshapesIntoAttention", "ShapeKeepingReshape", "rules"]

_HEADS_FIRST = [0, 2, 1, 3]


def _is(node: ir.Node | None, op_type: str) -> bool:
    return node is not None and node.op_type == op_type and node.domain in ("", "ai.onnx")


def _single_use(value: ir.Value) -> bool:
    return len(value.uses()) == 1 and not value.is_graph_output()


def _perm(node: ir.Node) -> list[int] | None:
    perm = node.attributes.get("perm")
    return None if perm is None else list(perm.as_ints())


class ShapeKeepingReshape(BaseRule):
    """``Reshape(x, s) = x`` when the output's known shape is ``x``'s (see the module docstring)."""

    name = "ShapeKeepingReshape"
    anchors = frozenset({("", "Reshape")})
    doc = "Reshape to the shape the input already has (symbolic dims by name)"

    def find(self, node: ir.Node, ctx: RewriteContext) -> Rewrite | MatchFailure:
        x = node.inputs[0] if node.inputs else None
        y = node.outputs[0]
        if x is None:
            return fail("no input", None, node)
        dx, dy = dims(x), dims(y)
        if dx is None or dy is None:
            return fail("input or output shape unknown", y)
        if not same_dims(dx, dy):
            return fail(f"output shape {list(dy)} differs from input shape {list(dx)}", y)
        if x.dtype is None or x.dtype != y.dtype:
            return fail("input and output dtypes unknown or different", y)
        match = Match([node], [y], {}, ctx.opset)
        return Rewrite(match, [], [x])


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


rules = RuleSet("glue", [ShapeKeepingReshape(), HeadReshapesIntoAttention()])
"""The glue rules, in priority order."""
