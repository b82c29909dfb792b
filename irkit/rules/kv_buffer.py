"""A KV cache in one shared buffer (onnxruntime-genai's ``past_present_share_buffer``), opset 24.

A lowered causal LM (:func:`irkit.llm.export_causal_lm` + :func:`irkit.lower` +
:func:`irkit.optimize`) carries its cache with *concatenation* semantics: each
``Attention(q, k, v, mask, past_key, past_value)`` returns ``present = [past; new]``, and the
graph derives the past length from ``Shape(past_key)[2]``. Under a shared buffer the past and the
present are one static tensor of ``max_length`` positions that onnxruntime-genai binds to both the
input and the output: its length is the capacity, not the number of past tokens.

:func:`share_kv_buffer` turns such a model into the shared-buffer form (in place):

- the opset becomes 24 (``TensorScatter``), in the model and in every function;
- the rule :data:`rules` (``AttentionSharedBuffer``) rewrites each cached ``Attention``::

      present_k = TensorScatter(past_key, k, write_indices)        # new keys at their positions
      present_v = TensorScatter(past_value, v, write_indices)
      y = Attention(q, present_k[:, :, :T], present_v[:, :, :T], mask)

  where ``T`` is the mask's last dimension (the total length ``attention_mask`` gives) and
  ``write_indices = T - S`` for every row (``S``: the new tokens). Both are computed once at the
  top of the main graph (from ``attention_mask`` and ``input_ids``) and reach an attention in a
  layer function as two more function inputs (``kv_buffer.total``, ``kv_buffer.write_indices``,
  threaded through the callers by :class:`irkit.rules.hoist.Threader`), so a layer adds only the
  head split around the 4-D buffer, two ``TensorScatter`` and two ``Slice`` views. The buffer's
  first ``T``
  positions then hold exactly what the concatenation held (the right-padded prompt's pads
  included, masked by ``attention_mask`` as before), so the graph's own mask, sliding windows
  and softcaps are untouched; only the capacity beyond ``T`` is never read;
- a cache the fusions left unfused (``Concat(past, new)`` feeding a decomposed attention the
  :mod:`irkit.rules.attention` rules do not match) is handled in the main graph: the consumer
  of each past input gets the buffer's first ``T - S`` positions (``Slice``), and the last ``S``
  positions of the present it returns are scattered into the buffer, which becomes the present
  output;
- every ``Shape`` of a past input in the main graph that reads the sequence axis (the past
  length the graph derives its positions and mask from) reads ``T - S`` instead, from the
  ``attention_mask`` and ``input_ids`` inputs: nothing derives from the buffer's capacity;
- an ALiBi bias that slices a constant table by buffer slot (mpt:
  ``slope_h · (j + 1 - T)`` for slot ``j``) becomes ``slope_h · (p_j + 1 - n)`` with ``p_j`` the
  token position of slot ``j`` and ``n`` the row's token count (``CumSum(attention_mask) -
  ReduceSum(attention_mask)``, computed once in the main graph as ``kv_buffer.alibi_positions``
  and threaded into the functions that add the bias). A right-padded prompt's pads keep their
  slots, so a generated token's slot is not its position: by slot the bias would count the pads
  as distance. For the tokens of a left-padded or unpadded row both are the same numbers
  (softmax drops the per-row offset anyway). Only a bias whose every use is an ``Add`` to 4-D
  scores (through function calls) is rewritten; bloom computes its bias from
  ``attention_mask`` already. genai right-pads a concatenated cache alike:
  :func:`alibi_by_position` is the same rewrite without the shared buffer.

Preconditions (else :class:`~irkit.errors.LoweringOptionsError`, naming what is missing): the
graph has ``input_ids`` and ``attention_mask`` inputs and ``past_key_values.*`` inputs, each
with its ``present.*`` output; a fused cached ``Attention`` has a mask (its last dimension is
the total length); a past input does not feed both a fused ``Attention`` and something else.
The KV layout is genai's: a batch is right-padded, and row ``b``'s tokens sit at the positions
where ``attention_mask[b]`` is 1 (the pads of a prompt keep their slots, masked).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import numpy as np
import onnx_ir as ir

from irkit._irutil import node_attributes
from irkit.errors import LoweringOptionsError
from irkit.rewriting import (
    Match,
    MatchFailure,
    RewriteBuilder,
    Rule,
    RuleSet,
    Verdict,
    fail,
    rewrite,
)
from irkit.rules._alibi import alibi_slopes
from irkit.rules.hoist import FunctionKey, Threader

__all__ = ["SHARED_BUFFER_OPSET", "alibi_by_position", "rules", "share_kv_buffer"]

#: The opset the shared buffer needs (``TensorScatter``).
SHARED_BUFFER_OPSET = 24
_PAST_PREFIX = "past_key_values."
_SEQUENCE_AXIS = 2
_log = logging.getLogger(__name__)


def _cached_attention(
    op: RewriteBuilder,
    q: ir.Value,
    k: ir.Value,
    v: ir.Value,
    mask: ir.Value,
    pk: ir.Value,
    pv: ir.Value,
) -> tuple[ir.Value, ...]:
    return op.Attention(q, k, v, mask, pk, pv, _outputs=3)


def _check(mask: ir.Value, match: Match) -> Verdict:
    node = match.nodes[0]
    if len(node.inputs) > 6:
        return fail("the Attention has nonpad_kv_seqlen already", node.outputs[0])
    if len(node.outputs) < 3 or any(o is None for o in node.outputs[1:3]):
        return fail("the Attention returns no present key/value", node.outputs[0])
    if node_attributes(node).get("is_causal", 0):
        return fail("is_causal=1 without a mask: the total length is unknown", mask)
    return True


def _heads(op: RewriteBuilder, t: ir.Value, heads: int) -> ir.Value:
    """[B, S, H·D] → [B, H, S, D]."""
    split = op.Reshape(t, op.Constant(value_ints=[0, 0, heads, -1]))
    return op.Transpose(split, perm=[0, 2, 1, 3])


def _shared(
    op: RewriteBuilder,
    q: ir.Value,
    k: ir.Value,
    v: ir.Value,
    mask: ir.Value,
    pk: ir.Value,
    pv: ir.Value,
    match: Match,
) -> tuple[ir.Value, ir.Value, ir.Value]:
    """Attention(q, k, v, mask, pk, pv) → Attention(q, scatter(pk, k)[:T], …), the buffers.

    3-D q/k/v (``q_num_heads``/``kv_num_heads`` set: the heads folded into the last axis) are
    split into heads first, as the 4-D buffer needs, and the output folded back.
    """
    attributes = node_attributes(match.nodes[0])
    q_heads = attributes.pop("q_num_heads", None)
    kv_heads = attributes.pop("kv_num_heads", None)
    folded = q_heads is not None and kv_heads is not None
    if folded:
        q, k, v = (_heads(op, t, h) for t, h in ((q, q_heads), (k, kv_heads), (v, kv_heads)))
    total = op.Shape(mask, start=-1)  # [T]
    new = op.Shape(k, start=_SEQUENCE_AXIS, end=_SEQUENCE_AXIS + 1)  # [S]
    write = op.Expand(op.Sub(total, new), op.Shape(k, start=0, end=1))  # [B] = T - S
    present_k = op.TensorScatter(pk, k, write, axis=_SEQUENCE_AXIS)
    present_v = op.TensorScatter(pv, v, write, axis=_SEQUENCE_AXIS)
    zero = op.Constant(value_ints=[0])
    axis = op.Constant(value_ints=[_SEQUENCE_AXIS])
    keys = op.Slice(present_k, zero, total, axis)
    values = op.Slice(present_v, zero, total, axis)
    y = op.Attention(q, keys, values, mask, **attributes)
    if folded:  # [B, H, S, D] → [B, S, H·D]
        y = op.Reshape(op.Transpose(y, perm=[0, 2, 1, 3]), op.Constant(value_ints=[0, 0, -1]))
    return y, present_k, present_v


rules = RuleSet(
    "kv_buffer",
    [
        Rule(  # Attention(q, k, v, m, pk, pv) = Attention(q, scatter(pk, k)[:T], …) + buffers
            "AttentionSharedBuffer",
            _cached_attention,
            check=_check,
            rewrite=_shared,
            min_opset=SHARED_BUFFER_OPSET,
        ),
    ],
)
"""The shared-buffer rule (opset ≥ 24)."""


def _input(graph: ir.Graph, name: str) -> ir.Value:
    for value in graph.inputs:
        if value.name == name:
            return value
    raise LoweringOptionsError(
        f"share_kv_buffer: the graph has no {name!r} input (inputs: "
        f"{', '.join(str(v.name) for v in graph.inputs)}); the shared buffer derives the past "
        "length from attention_mask and input_ids (export with irkit.llm.export_causal_lm)"
    )


def _bump_opset(model: ir.Model) -> None:
    if model.opset_imports.get("", 1) < SHARED_BUFFER_OPSET:
        model.opset_imports[""] = SHARED_BUFFER_OPSET
    for function in model.functions.values():
        if function.opset_imports.get("", SHARED_BUFFER_OPSET) < SHARED_BUFFER_OPSET:
            function.opset_imports[""] = SHARED_BUFFER_OPSET


class _Builder:
    """Appends nodes before an anchor node of the main graph (names under ``kv_buffer/``)."""

    def __init__(self, graph: ir.Graph) -> None:
        self.graph = graph
        self.count = 0

    def __call__(
        self, before: ir.Node | None, op_type: str, *inputs: ir.Value, **attrs: Any
    ) -> ir.Value:
        """A new ``op_type`` node before ``before`` (None: at the end); its output."""
        name = f"kv_buffer/{op_type}_{self.count}"
        self.count += 1
        node = ir.node(op_type, list(inputs), attrs, name=name)
        node.outputs[0].name = f"{name}/0"
        if before is None:
            self.graph.append(node)
        else:
            self.graph.insert_before(before, node)
        return node.outputs[0]

    def ints(self, before: ir.Node | None, values: list[int]) -> ir.Value:
        """A ``Constant`` of ``values`` (int64)."""
        return self(before, "Constant", value_ints=values)


def _lengths(graph: ir.Graph, add: _Builder) -> tuple[ir.Value, ir.Value, ir.Value]:
    """``[T]``, ``[T - S]`` and the write index ``[T - S] * B`` from ``attention_mask`` and
    ``input_ids`` (int64, shapes [1], [1] and [B]), computed once at the top of the main graph."""
    mask, ids = _input(graph, "attention_mask"), _input(graph, "input_ids")
    first = graph.node(0)
    total = add(first, "Shape", mask, start=1, end=2)
    past_length = add(first, "Sub", total, add(first, "Shape", ids, start=1, end=2))
    write = add(first, "Expand", past_length, add(first, "Shape", ids, start=0, end=1))
    int64 = ir.TensorType(ir.DataType.INT64)
    total.type, total.shape = int64, ir.Shape([1])
    write.type, write.shape = int64, ir.Shape([ids.shape[0] if ids.shape else "batch"])
    return total, past_length, write


def _past_length_shapes(
    model: ir.Model, pasts: Iterable[ir.Value], past_length: ir.Value, add: _Builder
) -> None:
    """``Shape(past, start, end)`` over the sequence axis → the same slice of the past's shape
    with the sequence axis ``T - S``."""
    graph = model.graph
    shapes = [
        use.node
        for past in pasts
        for use in past.uses()
        if use.node.op_type == "Shape" and use.node.domain == "" and use.node.graph is graph
    ]
    for node in shapes:
        attrs = node_attributes(node)
        past = node.inputs[0]
        if past is None or past.shape is None:
            raise LoweringOptionsError(
                f"share_kv_buffer: {node.name!r} reads the shape of a past input of unknown rank"
            )
        rank = len(past.shape)
        start = int(attrs.get("start", 0))
        end = int(attrs.get("end", rank))
        start, end = (start + rank if start < 0 else start), (end + rank if end < 0 else end)
        if not start <= _SEQUENCE_AXIS < end:
            continue  # batch, heads or head size: the buffer has the same
        pieces: list[ir.Value] = []
        if start < _SEQUENCE_AXIS:
            pieces.append(add(node, "Shape", past, start=start, end=_SEQUENCE_AXIS))
        pieces.append(past_length)
        if end > _SEQUENCE_AXIS + 1:
            pieces.append(add(node, "Shape", past, start=_SEQUENCE_AXIS + 1, end=end))
        shape = pieces[0] if len(pieces) == 1 else add(node, "Concat", *pieces, axis=0)
        old = node.outputs[0]
        name = old.name
        if old.is_graph_output():  # the output keeps its name
            shape = add(node, "Identity", shape)
        old.replace_all_uses_with(shape, replace_graph_outputs=True)
        graph.remove(node, safe=True)
        if shape.is_graph_output():
            shape.name = name


def _ends(model: ir.Model, past: ir.Value) -> tuple[set[str], list[ir.Node]]:
    """The op types a past input ends in (through function calls), and its other users."""
    ends: set[str] = set()
    other: list[ir.Node] = []
    stack = [past]
    while stack:
        value = stack.pop()
        for use in value.uses():
            node = use.node
            function = model.functions.get((node.domain, node.op_type, node.overload))
            if function is not None:
                stack.append(function.inputs[use.idx])
            elif node.op_type in ("TensorScatter", "Shape") and node.domain == "":
                ends.add(node.op_type)
            else:
                ends.add(node.op_type)
                other.append(node)
    return ends, other


def _present_name(past: ir.Value) -> str:
    return "present." + str(past.name)[len(_PAST_PREFIX) :]


def _scatter_outside(
    model: ir.Model, past: ir.Value, past_length: ir.Value, write: ir.Value, add: _Builder
) -> None:
    """An unfused cache (``Concat(past, new)`` in a decomposed attention): the callee gets the
    buffer's first ``T - S`` positions, and the new positions of what it returns as the present
    are scattered into the buffer, which becomes the present output."""
    graph = model.graph
    present = next((v for v in graph.outputs if v.name == _present_name(past)), None)
    producer = present.producer() if present is not None else None
    if present is None or producer is None:
        raise LoweringOptionsError(
            f"share_kv_buffer: no graph output {_present_name(past)!r} computed in the graph for "
            f"{past.name!r}: the graph cannot share its KV buffer; export without share_buffer"
        )
    first = graph.node(0)
    zero = add.ints(first, [0])
    axis = add.ints(first, [_SEQUENCE_AXIS])
    for use in [u for u in past.uses() if u.node.op_type != "Shape"]:
        view = add(use.node, "Slice", past, zero, past_length, axis)
        use.node.replace_input_with(use.idx, view)
    index = list(graph).index(producer) + 1
    anchor = graph.node(index) if index < len(graph) else None
    name = str(present.name)
    present.name = f"kv_buffer/{name}/joined"
    big = add.ints(anchor, [2**62])
    new = add(anchor, "Slice", present, past_length, big, axis)
    buffer = add(anchor, "TensorScatter", past, new, write, axis=_SEQUENCE_AXIS)
    buffer.name = name
    buffer.shape, buffer.type = past.shape, past.type
    graph.outputs[graph.outputs.index(present)] = buffer


def _shape_of(value: ir.Value | None, start: int, end: int | None) -> ir.Value | None:
    """The input of ``value``'s producer if it is ``Shape<start, end>``, else None."""
    node = value.producer() if value is not None else None
    if node is None or node.op_type != "Shape" or node.domain != "":
        return None
    attrs = node_attributes(node)
    if int(attrs.get("start", 0)) != start or attrs.get("end") != end:
        return None
    return node.inputs[0]


def _index_nodes(scatter: ir.Node) -> tuple[ir.Node, ...] | None:
    """The nodes of :func:`_shared`'s per-layer write index ``Expand(T - S, B)`` feeding
    ``scatter`` (``Expand``, ``Sub``, ``Shape(mask)``, ``Shape(k)`` ×2), or None."""
    expand = scatter.inputs[2].producer() if scatter.inputs[2] is not None else None
    if expand is None or expand.op_type != "Expand" or expand.domain != "":
        return None
    sub = expand.inputs[0].producer() if expand.inputs[0] is not None else None
    if sub is None or sub.op_type != "Sub" or sub.domain != "":
        return None
    k = scatter.inputs[1]
    if (
        _shape_of(sub.inputs[0], -1, None) is None
        or _shape_of(sub.inputs[1], _SEQUENCE_AXIS, _SEQUENCE_AXIS + 1) is not k
        or _shape_of(expand.inputs[1], 0, 1) is not k
    ):
        return None
    values = (sub.inputs[0], sub.inputs[1], expand.inputs[1])
    shapes = [v.producer() for v in values if v is not None]
    return (expand, sub, *(n for n in shapes if n is not None))


def _drop_unused(graph: ir.Graph | ir.Function, values: Iterable[ir.Value]) -> None:
    """Remove the producers of ``values`` that nothing reads any more, and then theirs."""
    owner = graph.graph if isinstance(graph, ir.Function) else graph
    stack = list(values)[::-1]
    while stack:
        node = stack.pop().producer()
        if node is None or node.graph is not owner:
            continue
        if any(o.uses() or o.is_graph_output() for o in node.outputs):
            continue
        inputs = [v for v in node.inputs if v is not None]
        graph.remove(node, safe=True)
        stack.extend(inputs)


class _Hoist:
    """Each layer's ``T`` and write index, computed once in the main graph.

    :func:`_shared` derives both from the mask and the new keys inside each attention (five
    nodes a layer); the function that holds them reads the main graph's ``[T]`` and
    ``[T - S] * B`` (from ``attention_mask`` and ``input_ids``) from two more inputs instead,
    threaded through its callers (:class:`~irkit.rules.hoist.Threader`).
    """

    def __init__(self, model: ir.Model, total: ir.Value, write: ir.Value) -> None:
        self.model = model
        self.main = (total, write)
        self.threader = Threader(model)

    def run(self) -> None:
        """Rewrite every scatter of :func:`_shared` in the main graph and the functions."""
        owners: list[tuple[FunctionKey | None, ir.Graph | ir.Function]] = [(None, self.model.graph)]
        owners += list(self.model.functions.items())
        for key, graph in owners:
            for node in list(graph):
                if node.op_type != "TensorScatter" or node.domain != "":
                    continue
                nodes = _index_nodes(node)
                if nodes is None:
                    continue
                total = self.threader.formal(
                    key, (None, self.main[0]), "kv_buffer.total", self.main[0]
                )
                write = self.threader.formal(
                    key, (None, self.main[1]), "kv_buffer.write_indices", self.main[1]
                )
                mask_total = nodes[1].inputs[0]
                nodes[0].outputs[0].replace_all_uses_with(write)
                if mask_total is not None:
                    mask_total.replace_all_uses_with(total)
                _drop_unused(graph, [n.outputs[0] for n in nodes])


def _score_adds(model: ir.Model, value: ir.Value, formals: list[ir.Value]) -> str | None:
    """None when every use of ``value`` (through function calls: their inputs are appended to
    ``formals``) is an ``Add`` whose other operand is 4-D; else why not."""
    if value.is_graph_output():
        return f"{value.name!r} is an output of its graph or function"
    for use in value.uses():
        node = use.node
        function = model.functions.get((node.domain, node.op_type, node.overload))
        if function is not None:
            formal = function.inputs[use.idx]
            formals.append(formal)
            reason = _score_adds(model, formal, formals)
            if reason is not None:
                return reason
            continue
        if node.op_type != "Add" or node.domain != "":
            return f"{value.name!r} feeds {node.op_type} {node.name!r}, not an Add to the scores"
        other = node.inputs[1 - use.idx]
        if other is None or other.shape is None or len(other.shape) != 4:
            return f"{value.name!r} is added to {other and other.name!r}, not to 4-D scores"
    return None


class _AlibiPositions:
    """ALiBi biases by buffer slot → by token position (see the module docstring)."""

    def __init__(self, model: ir.Model, threader: Threader, add: _Builder) -> None:
        self.model = model
        self.threader = threader
        self.add = add
        self.positions: dict[ir.DataType, ir.Value] = {}

    def _positions(self, dtype: ir.DataType) -> ir.Value:
        """``CumSum(mask) - ReduceSum(mask)`` as ``dtype``, ``(B, 1, 1, T)``, in the main graph."""
        if dtype not in self.positions:
            graph, add = self.model.graph, self.add
            mask = _input(graph, "attention_mask")
            first = graph.node(0)
            axis = add(first, "Constant", value_int=1)
            cumulative = add(first, "CumSum", mask, axis)
            count = add(first, "ReduceSum", mask, add.ints(first, [1]), keepdims=1)
            relative = add(first, "Cast", add(first, "Sub", cumulative, count), to=dtype)
            positions = add(first, "Unsqueeze", relative, add.ints(first, [1, 2]))
            batch, total = (mask.shape or ir.Shape(["batch", "total_sequence"]))[:2]
            positions.type, positions.shape = ir.TensorType(dtype), ir.Shape([batch, 1, 1, total])
            self.positions[dtype] = positions
        return self.positions[dtype]

    def _bound(self, value: ir.Value) -> ir.Value:
        """The value a function input stands for (every call passes it), else ``value``."""
        for sources in self.threader.bound.values():
            if id(value) in sources:
                return sources[id(value)][1]
        return value

    def run(self) -> None:
        """Rewrite every ALiBi bias of the main graph and the functions."""
        owners: list[tuple[FunctionKey | None, ir.Graph | ir.Function]] = [(None, self.model.graph)]
        owners += list(self.model.functions.items())
        for key, graph in owners:
            for node in list(graph):
                if node.op_type == "Slice" and node.domain == "":
                    self._rewrite(key, graph, node)

    def _rewrite(
        self, key: FunctionKey | None, graph: ir.Graph | ir.Function, node: ir.Node
    ) -> None:
        bias = node.outputs[0]
        if any(u.node.op_type == "Slice" and u.node.domain == "" for u in bias.uses()):
            return  # (a slice inside the chain: its last slice is the bias)
        slopes = alibi_slopes(bias, bound=self._bound)
        if isinstance(slopes, MatchFailure) or bias.dtype is None:
            return
        formals: list[ir.Value] = []
        reason = _score_adds(self.model, bias, formals)
        if reason is not None:
            _log.info("share_kv_buffer: ALiBi bias %r kept by slot: %s", bias.name, reason)
            return
        main = self._positions(bias.dtype)
        positions = self.threader.formal(key, (None, main), "kv_buffer.alibi_positions", main)
        heads = len(slopes)
        value = np.asarray(slopes, dtype=bias.dtype.numpy()).reshape(1, heads, 1, 1)
        slope = ir.node("Constant", [], {"value": ir.tensor(value)}, name=f"{node.name}/slopes")
        scaled = ir.node("Mul", [positions, slope.outputs[0]], name=f"{node.name}/positions")
        graph.insert_before(node, [slope, scaled])
        new = scaled.outputs[0]
        new.name = f"{bias.name}/by_position"
        new.type = bias.type
        batch, _, _, total = main.shape or ir.Shape(["batch", 1, 1, "total_sequence"])
        new.shape = ir.Shape([batch, heads, 1, total])
        bias.replace_all_uses_with(new)
        for formal in formals:
            formal.shape = new.shape
        _drop_unused(graph, [bias])


def alibi_by_position(model: ir.Model) -> ir.Model:
    """Count a slot-indexed ALiBi bias by token position (the module docstring's last item),
    in place, on a cache concatenated as genai lays it out (a right-padded prompt's pads keep
    their slots): what :func:`share_kv_buffer` does for the shared buffer, for
    ``past_present_share_buffer: false``.

    Args:
        model: A lowered, optimized causal LM with an ``attention_mask`` input.

    Returns:
        ``model``.

    Raises:
        LoweringOptionsError: The model has an ALiBi bias and no ``attention_mask`` input.
    """
    _AlibiPositions(model, Threader(model), _Builder(model.graph)).run()
    return model


def share_kv_buffer(model: ir.Model) -> ir.Model:
    """Rewrite a lowered causal LM's KV cache into one shared buffer (opset 24), in place.

    Args:
        model: A model from :func:`irkit.llm.export_causal_lm`, lowered and optimized (its
            cached attention fused into ``Attention`` with past inputs and present outputs).

    Returns:
        ``model``, with ``past_key_values.*`` / ``present.*`` the same buffers of any capacity.

    Raises:
        LoweringOptionsError: A precondition of the module docstring does not hold.
    """
    pasts = [v for v in model.graph.inputs if str(v.name).startswith(_PAST_PREFIX)]
    if not pasts:
        raise LoweringOptionsError(
            "share_kv_buffer: the graph has no past_key_values.* inputs (no KV cache to share); "
            "export with irkit.llm.export_causal_lm"
        )
    _bump_opset(model)
    rewrite(model, rules)
    add = _Builder(model.graph)
    total, past_length, write = _lengths(model.graph, add)
    _past_length_shapes(model, pasts, past_length, add)
    hoist = _Hoist(model, total, write)
    hoist.run()
    _AlibiPositions(model, hoist.threader, add).run()
    for past in pasts:
        ends, other = _ends(model, past)
        if "TensorScatter" in ends and other:
            raise LoweringOptionsError(
                f"share_kv_buffer: {past.name!r} feeds a fused cached Attention and also "
                f"{other[0].op_type} {other[0].name!r}: the graph cannot share its KV buffer; "
                "export without share_buffer"
            )
        if other:
            _scatter_outside(model, past, past_length, write, add)
    _drop_unused(model.graph, (write, past_length, total))
    for present in model.graph.outputs:  # the buffer: the past's shape, whatever its capacity
        source = next((p for p in pasts if _present_name(p) == present.name), None)
        if source is not None:
            present.shape = source.shape
    return model
