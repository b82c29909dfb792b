"""Uniform values and writes that put back what is there.

A value is **uniform along axis a** when all its slices along ``a`` are equal — it was broadcast
there (``Expand`` of a size-1 axis, a new ``Unsqueeze`` axis, a broadcasting operand) and only
ops that treat every slice alike (elementwise ops, ``Slice``, ``Transpose``, ``MatMul``'s batch
axes, ``Gather``/``Concat`` along another axis) came after. :func:`uniform` proves it by walking
the producers. Transformers' interleaved M-RoPE (Qwen2-VL … Qwen3.5) expands the text positions
to three identical rows (t, h, w) and then rebuilds one row from slices of the others with
``select_scatter`` / ``slice_scatter``: with text positions every write puts back what is
already there, some seventy nodes a step that compute nothing.

Identities (each rule's comment states its precondition):

- ``Gather(x, i, axis=a) = Gather(x, 0, axis=a)``   (x uniform along a, i constant and not 0:
  every index reads the same slice; the graphs' later ``CSE`` merges the reads)
- ``ScatterND(d, idx, Gather(d, idx)) = d``  in the form torchlib writes ``slice_scatter``:
  ``d = Transpose(x, p)``, ``idx = Unsqueeze(Slice(Range(0, dim(x, p[0]), 1), s, e, 0, t), -1)``,
  updates ``Transpose(Slice(x, s, e, p[0], t), p)`` (the transposes optional, together)
- ``ScatterElements(x, c, Unsqueeze(Gather(x, c, axis=a), a), axis=a) = x``  (every index the one
  constant ``c``: ``select_scatter`` of the row that is there)

"The same value" is proved structurally (:func:`same`): the same node, equal constants, or
nodes of one deterministic op with equal attributes on the same inputs, looking through the
writes above and through transpose pairs that cancel, and treating reads of a uniform axis at
any index as equal. So the rules fire in any visiting order (the engine visits consumers first:
the outer ``select_scatter`` is proved while the inner ``slice_scatter`` is still there).

All rules are valid at every opset (``ScatterND``/``ScatterElements`` with ``reduction="none"``,
the default) and inside function bodies, where a function input is followed to every call of
the function (``ctx.model``): uniform where every call passes a uniform argument.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx_ir as ir

from irkit._shapes import known_rank
from irkit.rewriting import (
    Const,
    Pattern,
    RewriteContext,
    Rule,
    RuleSet,
    Verdict,
    attr,
    const_ints,
    const_value,
    fail,
    matches,
    op,
    optional,
    var,
)

__all__ = ["rules", "uniform", "same"]

DEPTH = 24
"""How far (in producers) the proofs look; beyond it a value counts as unknown."""

_OPSET = 21
"""The opset the proofs' sub-patterns read attribute defaults at (theirs are the same since
opset 15: ``Shape(start=0)``, ``Gather(axis=0)``)."""

#: Elementwise ops whose output slice along any axis depends only on the input's same slice.
_UNARY = frozenset(
    [
        "Abs",
        "Acos",
        "Acosh",
        "Asin",
        "Asinh",
        "Atan",
        "Atanh",
        "BitwiseNot",
        "Cast",
        "Ceil",
        "Celu",
        "Cos",
        "Cosh",
        "Elu",
        "Erf",
        "Exp",
        "Floor",
        "Gelu",
        "HardSigmoid",
        "HardSwish",
        "Identity",
        "IsInf",
        "IsNaN",
        "LeakyRelu",
        "Log",
        "Mish",
        "Neg",
        "Not",
        "Reciprocal",
        "Relu",
        "Round",
        "Selu",
        "Sigmoid",
        "Sign",
        "Sin",
        "Sinh",
        "Softplus",
        "Softsign",
        "Sqrt",
        "Tan",
        "Tanh",
        "ThresholdedRelu",
    ]
)
#: Elementwise ops with multidirectional broadcasting.
_BROADCAST = frozenset(
    [
        "Add",
        "And",
        "BitShift",
        "BitwiseAnd",
        "BitwiseOr",
        "BitwiseXor",
        "Div",
        "Equal",
        "Greater",
        "GreaterOrEqual",
        "Less",
        "LessOrEqual",
        "Max",
        "Mean",
        "Min",
        "Mod",
        "Mul",
        "Or",
        "Pow",
        "Sub",
        "Sum",
        "Where",
        "Xor",
    ]
)
#: Ops whose equal inputs need not give equal outputs.
_NONDETERMINISTIC = frozenset(
    [
        "Bernoulli",
        "Dropout",
        "Multinomial",
        "RandomNormal",
        "RandomNormalLike",
        "RandomUniform",
        "RandomUniformLike",
    ]
)


@dataclasses.dataclass
class _Budget:
    """The steps one proof may still take (so a proof stays small on any graph), and the model
    whose call sites a function input is followed to (``None``: a function input is unknown)."""

    left: int = 2000
    model: ir.Model | None = None
    calls: dict[tuple[str, str, str], list[ir.Node]] | None = None

    def spend(self) -> bool:
        self.left -= 1
        return self.left >= 0


def _attr(node: ir.Node, name: str, default: Any = None) -> Any:
    a = node.attributes.get(name)
    return default if a is None else a.value


def _axes_of(node: ir.Node, position: int) -> list[int] | None:
    """A constant ``axes`` input (or attribute, older opsets)."""
    if len(node.inputs) > position and node.inputs[position] is not None:
        return const_ints(node.inputs[position])
    found = _attr(node, "axes")
    return None if found is None else [int(a) for a in found]


def uniform(
    value: ir.Value | None, axis: int, depth: int = DEPTH, budget: _Budget | None = None
) -> bool:
    """Whether every slice of ``value`` along ``axis`` (non-negative) is the same.

    Example:
        >>> m = ir.from_onnx_text('''<ir_version: 10, opset_import: ["" : 18]>
        ... g (float[1, 4] x) => (float[3, 4] y) {
        ...   s = Constant<value=int64[2] {3, 4}>()  e = Expand(x, s)  y = Cos(e) }''')
        >>> y = m.graph.outputs[0]
        >>> uniform(y, 0), uniform(y, 1)
        (True, False)
    """
    budget = budget or _Budget()
    if value is None or depth <= 0 or not budget.spend():
        return False
    value = through(value, depth, budget)
    r = known_rank(value)
    if r is None or not 0 <= axis < r:
        return False
    if value.shape is not None and value.shape[axis] == 1:
        return True
    node = value.producer()
    if node is None:
        return _uniform_at_every_call(value, axis, depth - 1, budget)
    down = depth - 1
    kind = node.op_type if node.domain == "" else ""
    if kind in _UNARY or kind == "CastLike":
        return uniform(node.inputs[0], axis, down, budget)
    if kind in _BROADCAST or kind == "Expand":
        operands = node.inputs[:1] if kind == "Expand" else node.inputs
        for operand in operands:
            rank = known_rank(operand)
            if rank is None:
                return False
            if axis >= r - rank and not uniform(operand, axis - (r - rank), down, budget):
                return False
        return True
    if kind == "Slice":
        return uniform(node.inputs[0], axis, down, budget)
    if kind == "Transpose":
        perm = _attr(node, "perm")
        return perm is not None and uniform(node.inputs[0], int(perm[axis]), down, budget)
    if kind == "Unsqueeze":
        axes = _axes_of(node, 1)
        if axes is None:
            return False
        added = sorted(a % r for a in axes)
        return axis in added or uniform(
            node.inputs[0], axis - sum(a < axis for a in added), down, budget
        )
    if kind == "Squeeze":
        rank = known_rank(node.inputs[0])
        axes = _axes_of(node, 1)
        if rank is None or axes is None:
            return False
        kept = [a for a in range(rank) if a not in {b % rank for b in axes}]
        return uniform(node.inputs[0], kept[axis], down, budget)
    if kind == "Concat":
        along = _attr(node, "axis")
        return (
            along is not None
            and int(along) % r != axis
            and all(uniform(v, axis, down, budget) for v in node.inputs)
        )
    if kind == "Gather":
        along = int(_attr(node, "axis", 0)) % r
        indices = known_rank(node.inputs[1])
        if indices is None:
            return False
        if axis < along:
            return uniform(node.inputs[0], axis, down, budget)
        if axis >= along + indices:
            return uniform(node.inputs[0], axis - indices + 1, down, budget)
        return False
    if kind == "MatMul":
        a, b = node.inputs
        ra, rb = known_rank(a), known_rank(b)
        if ra is None or rb is None or ra < 2 or rb < 2:
            return False
        if axis == r - 2:
            return uniform(a, ra - 2, down, budget)
        if axis == r - 1:
            return uniform(b, rb - 1, down, budget)
        for operand, rank in ((a, ra), (b, rb)):
            if axis >= r - rank and not uniform(operand, axis - (r - rank), down, budget):
                return False
        return True
    return False


def _uniform_at_every_call(value: ir.Value, axis: int, depth: int, budget: _Budget) -> bool:
    """A local function's input is uniform where every call passes a uniform argument."""
    model = budget.model
    if model is None or value.graph is None:
        return False
    owner = next((f for f in model.functions.values() if f.graph is value.graph), None)
    if owner is None:
        return False
    position = next(i for i, v in enumerate(owner.inputs) if v is value)
    if budget.calls is None:
        budget.calls = {}
        for graph in (model.graph, *(f.graph for f in model.functions.values())):
            for node in graph:
                budget.calls.setdefault((node.domain, node.op_type, node.overload), []).append(node)
    calls = budget.calls.get((owner.domain, owner.name, owner.overload), [])
    return bool(calls) and all(
        position < len(call.inputs) and uniform(call.inputs[position], axis, depth, budget)
        for call in calls
    )


def through(value: ir.Value, depth: int = DEPTH, budget: _Budget | None = None) -> ir.Value:
    """``value`` with the writes that put back what is there, and cancelling transpose pairs,
    looked through (the value they compute is the one returned)."""
    budget = budget or _Budget()
    while depth > 0 and budget.spend():
        node = value.producer()
        if node is None or node.domain != "":
            return value
        if node.op_type in ("ScatterND", "ScatterElements") and _written_back(
            node, depth - 1, budget
        ):
            value = node.inputs[0] or value  # (_written_back: all three inputs are there)
        elif node.op_type == "Transpose" and (cancelled := _cancelled(node, depth - 1, budget)):
            value = cancelled
        else:
            return value
        depth -= 1
    return value


def _cancelled(node: ir.Node, depth: int, budget: _Budget) -> ir.Value | None:
    """The input of ``Transpose(Transpose(x, p), q)`` when ``p∘q`` is the identity."""
    outer, first = _attr(node, "perm"), node.inputs[0]
    if first is None:
        return None
    inner_value = through(first, depth, budget)
    inner = inner_value.producer()
    if outer is None or inner is None or inner.op_type != "Transpose" or inner.domain != "":
        return None
    p = _attr(inner, "perm")
    if p is None or len(p) != len(outer):
        return None
    composed = [p[i] for i in outer]
    return inner.inputs[0] if composed == list(range(len(composed))) else None


def _written_back(node: ir.Node, depth: int, budget: _Budget) -> bool:
    if len(node.inputs) != 3:
        return False
    data, indices, updates = node.inputs
    if data is None or indices is None or updates is None:
        return False
    proof = (
        _scatter_nd_written_back if node.op_type == "ScatterND" else _scatter_elements_written_back
    )
    return proof(data, indices, updates, node, depth, budget) is True


def _equal_constants(a: np.ndarray | None, b: np.ndarray | None) -> bool:
    return (
        a is not None
        and b is not None
        and a.dtype == b.dtype
        and a.shape == b.shape
        and bool(np.array_equal(a, b))
    )


def _attributes(node: ir.Node) -> dict[str, object] | None:
    """The attributes as comparable values, or ``None`` if one holds a graph or tensor."""
    out: dict[str, object] = {}
    for name, a in node.attributes.items():
        if a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS):
            return None
        v = a.value
        if isinstance(v, ir.TensorProtocol):
            v = (str(v.dtype), tuple(v.shape), v.numpy().tobytes())
        elif isinstance(v, Sequence) and not isinstance(v, str):
            v = tuple(v)
        out[name] = v
    return out


def same(
    a: ir.Value | None, b: ir.Value | None, depth: int = DEPTH, budget: _Budget | None = None
) -> bool:
    """Whether ``a`` and ``b`` provably hold the same tensor (``False``: not proved).

    Example:
        >>> m = ir.from_onnx_text('''<ir_version: 10, opset_import: ["" : 18]>
        ... g (float[4] x) => (float[4] y, float[4] z) { y = Exp(x)  z = Exp(x) }''')
        >>> same(*m.graph.outputs)
        True
    """
    budget = budget or _Budget()
    if a is None or b is None:
        return a is b
    if a is b:
        return True
    if depth <= 0 or not budget.spend():
        return False
    a, b = through(a, depth, budget), through(b, depth, budget)
    if a is b:
        return True
    ca, cb = const_value(a), const_value(b)
    if ca is not None or cb is not None:
        return _equal_constants(ca, cb)
    pa, pb = a.producer(), b.producer()
    if (
        pa is None
        or pb is None
        or (pa.domain, pa.op_type, pa.overload) != (pb.domain, pb.op_type, pb.overload)
        or pa.domain not in ("", "ai.onnx")  # (a call or contrib op: its body is not looked at)
        or pa.op_type in _NONDETERMINISTIC
        or a.index() != b.index()
        or len(pa.inputs) != len(pb.inputs)
    ):
        return False
    attributes = _attributes(pa)
    if attributes is None or attributes != _attributes(pb):
        return False
    down = depth - 1
    if (
        pa.op_type == "Gather"
        and pa.domain == ""
        and same(pa.inputs[0], pb.inputs[0], down, budget)
    ):
        if same(pa.inputs[1], pb.inputs[1], down, budget):
            return True
        ia, ib = const_value(pa.inputs[1]), const_value(pb.inputs[1])
        r = known_rank(pa.inputs[0])
        return (
            ia is not None
            and ib is not None
            and ia.shape == ib.shape
            and r is not None
            and uniform(pa.inputs[0], int(_attr(pa, "axis", 0)) % r, down, budget)
        )
    return all(same(x, y, down, budget) for x, y in zip(pa.inputs, pb.inputs, strict=True))


# ---------------------------------------------------------------------------------------------
# The writes

data, indices, updates = var("data"), var("indices"), var("updates")
x, start, end, step, picked_axes = var("x"), var("start"), var("end"), var("step"), var("picked")
limit, i_start, i_end, i_step, i_axes = (
    var("limit"),
    var("i_start"),
    var("i_end"),
    var("i_step"),
    var("i_axes"),
)

#: ``slice_scatter``'s index column: the positions ``s:e:t`` of an axis of length ``limit``.
_SLICED_POSITIONS = op.Unsqueeze(
    op.Slice(
        op.Range(Const(0), limit, Const(1)), i_start, i_end, optional(i_axes), optional(i_step)
    ),
    var("column"),
)
_PICKED = op.Slice(x, start, end, picked_axes, optional(step))
_TRANSPOSED_PICKED = op.Transpose(_PICKED, perm=attr("perm"))
_DIM = op.Gather(op.Shape(var("shaped"), start=attr("shape_start")), var("dim_index"))


def _bound(pattern: Pattern, value: ir.Value | None) -> dict[str, Any] | None:
    """The bindings of ``pattern`` matched at ``value`` (its producers stay), or ``None``."""
    found = matches(pattern, value, _OPSET)
    return found if isinstance(found, dict) else None


def _same_int(a: ir.Value | None, b: ir.Value | None, default: int | None = None) -> bool:
    """Equal constant integers (an absent input reads as ``default``), or the same value."""
    va = const_ints(a) if a is not None else ([default] if default is not None else None)
    vb = const_ints(b) if b is not None else ([default] if default is not None else None)
    if va is not None and vb is not None:
        return va == vb
    return a is not None and b is not None and same(a, b)


def _scatter_nd_written_back(
    data: ir.Value,
    indices: ir.Value,
    updates: ir.Value,
    node: ir.Node,
    depth: int = DEPTH,
    budget: _Budget | None = None,
) -> Verdict:
    """Whether ``ScatterND(data, indices, updates)`` writes at ``indices`` what ``data`` holds there
    (the ``slice_scatter`` form of the module docstring)."""
    budget = budget or _Budget()
    if _attr(node, "reduction", "none") != "none":
        return fail(f"reduction {_attr(node, 'reduction')!r}", node.outputs[0])
    positions = _bound(_SLICED_POSITIONS, indices)
    if not positions:
        return fail("indices are not the positions Slice(Range(0, n, 1)) of one axis", indices)
    if const_ints(positions["column"]) not in ([1], [-1]):
        return fail("indices are not one column of positions", indices)
    if positions["i_axes"] is not None and const_ints(positions["i_axes"]) not in ([0], [-1]):
        return fail("the positions are not a slice of the Range", indices)
    perm: list[int] | None = None
    found = _bound(_TRANSPOSED_PICKED, updates)
    if found:
        perm = [int(p) for p in found["perm"]]
        inner = data.producer()
        if inner is None or inner.op_type != "Transpose" or _attr(inner, "perm") is None:
            return fail("updates are transposed, data is not", data)
        if [int(p) for p in _attr(inner, "perm")] != perm:
            return fail("data and updates are transposed differently", data)
        source = inner.inputs[0]
    else:
        found = _bound(_PICKED, updates)
        source = data
    if not found:
        return fail("updates are not a Slice", updates)
    r = known_rank(found["x"])
    axes = const_ints(found["picked"])
    if r is None or axes is None or len(axes) != 1:
        return fail("updates slice more than one axis, or an input of unknown rank", updates)
    axis = axes[0] % r
    if axis != (perm[0] if perm else 0):
        return fail("the sliced axis is not the one the indices address", updates)
    if not same(found["x"], source, depth, budget):
        return fail("updates are sliced from another value than data", updates)
    if not (
        _same_int(found["start"], positions["i_start"])
        and _same_int(found["end"], positions["i_end"])
        and _same_int(found["step"], positions["i_step"], default=1)
    ):
        return fail("updates and indices slice different positions", updates)
    limit = positions["limit"]
    dim = _bound(_DIM, limit)
    if dim:
        start, index = int(dim["shape_start"] or 0), const_ints(dim["dim_index"])
        if start < 0 or index is None or len(index) != 1 or index[0] < 0:
            return fail("the Range's limit is not one dim of a shape", limit)
        if start + index[0] != axis or not same(dim["shaped"], found["x"], depth, budget):
            return fail("the Range's limit is not the length of the sliced axis", limit)
        return True
    n = const_ints(limit)
    shape = found["x"].shape
    if n is None or shape is None or [shape[axis]] != n:
        return fail("the Range's limit is not the length of the sliced axis", limit)
    return True


row_index, shape_of = var("row_index"), var("shape_of")
_SAME_INDEX = op.Expand(row_index, shape_of)
_ROW = op.Unsqueeze(var("row"), var("axes"))
_READ = op.Gather(var("rows"), var("read_index"), axis=attr("read_axis"))


def _scatter_elements_written_back(
    data: ir.Value,
    indices: ir.Value,
    updates: ir.Value,
    node: ir.Node,
    depth: int = DEPTH,
    budget: _Budget | None = None,
) -> Verdict:
    """Whether ``ScatterElements(data, indices, updates, axis=a)`` writes row ``c`` of ``data`` at
    index ``c`` (every index the constant ``c``)."""
    budget = budget or _Budget()
    if _attr(node, "reduction", "none") != "none":
        return fail(f"reduction {_attr(node, 'reduction')!r}", node.outputs[0])
    r = known_rank(data)
    if r is None:
        return fail("data's rank is unknown", data)
    axis = int(_attr(node, "axis", 0)) % r
    spread = _bound(_SAME_INDEX, indices)
    every = const_value(spread["row_index"]) if spread else const_value(indices)
    if every is None or every.size == 0 or not np.all(every == every.flat[0]):
        return fail("the indices are not all one constant", indices)
    row = _bound(_ROW, updates)
    read_row = _bound(_READ, through(row["row"], depth, budget)) if row else row
    if not row or not read_row:
        return fail("updates are not one row Unsqueeze(Gather(x, c))", updates)
    row.update(read_row)
    read_axis = int(row["read_axis"] or 0) % r
    read = const_value(row["read_index"])
    if read_axis != axis or const_ints(row["axes"]) not in ([axis], [axis - r]):
        return fail("updates are a row of another axis", updates)
    if read is None or read.size != 1:
        return fail("updates read a row at an index that is not one constant", updates)
    if not same(row["rows"], data, depth, budget):
        return fail("updates are a row of another value", updates)
    if int(read.flat[0]) != int(every.flat[0]) and not uniform(data, axis, depth, budget):
        return fail("updates are another row than the one written", updates)
    return True


def _gather_reads_uniform(
    x: ir.Value, i: ir.Value, axis: int | None, ctx: RewriteContext
) -> Verdict:
    index = const_value(i)
    if index is None or index.dtype.kind not in "iu":
        return fail("the index is not a constant", i)
    if not np.any(index):
        return fail("the index is already 0", i)
    r = known_rank(x)
    if r is None:
        return fail("input rank unknown", x)
    if not uniform(x, (axis or 0) % r, budget=_Budget(model=ctx.model)):
        return fail(f"not proved uniform along axis {axis or 0}", x)
    return {"zeros": np.zeros_like(index)}


rules = RuleSet(
    "uniform",
    [
        Rule(  # Gather(x, i, axis=a) = Gather(x, 0, axis=a) when every slice along a is the same
            "UniformGather",
            op.Gather(x, var("i"), axis=attr("axis")),
            check=_gather_reads_uniform,
            rewrite=lambda op, x, axis, zeros: op.Gather(x, op.const(zeros), axis=axis),
        ),
        Rule(  # ScatterND(d, idx, GatherND(d, idx)) = d (slice_scatter of the slice that is there)
            "WrittenBackScatterND",
            op.ScatterND(data, indices, updates),
            check=lambda data, indices, updates, match, ctx: _scatter_nd_written_back(
                data, indices, updates, match.nodes[0], budget=_Budget(model=ctx.model)
            ),
            rewrite=lambda data: data,
        ),
        Rule(  # ScatterElements(x, c, Unsqueeze(Gather(x, c, a), a), axis=a) = x
            "WrittenBackScatterElements",
            op.ScatterElements(data, indices, updates),
            check=lambda data, indices, updates, match, ctx: _scatter_elements_written_back(
                data, indices, updates, match.nodes[0], budget=_Budget(model=ctx.model)
            ),
            rewrite=lambda data: data,
        ),
    ],
)
"""The rules, in priority order."""
