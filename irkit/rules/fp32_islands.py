"""Float32 islands in a half-precision graph: a named list of ops computed in float32.

In a float16 graph a square, a sum or an exponential overflows long before its result would:
``Sqrt(ReduceMean(Pow(x, 2)))`` is ``inf`` in float16 once ``|x| > 256`` although the root mean
square is ``|x|``. :func:`keep_fp32` moves the nodes whose op type is in a named list
(:data:`OVERFLOW_OPS` by default) to float32: ``Cast(to=float)`` on their half inputs,
``Cast`` back to the half type after them, and between two such nodes the value stays float32
(consecutive listed nodes form one island, with Casts only at its border; a ``Cast`` to
float32 after the island reads the float32 value, without the round trip). Model inputs,
outputs and the other nodes keep their types; the pass works in the main graph and in every
local function body, in place. Values must carry their types (irkit's models do; run shape
inference on others).

Hugging Face's half-precision models already keep their own float32 islands (norm statistics,
rotary angles, softmax in float32 where they upcast); the fusions of :mod:`irkit.rules.rms_norm`
and :mod:`irkit.rules.layer_norm` read those as the fused ops' float32 ``stash_type``. This pass
is for the rest: graphs from elsewhere, or ops a model leaves in float16. (onnxruntime's CPU
EP has no float16 kernels for most of these ops and runs them in float32 with its own Casts;
the islands matter on EPs with float16 kernels, e.g. CUDA.)
"""

from __future__ import annotations

from collections.abc import Collection

import onnx_ir as ir

__all__ = ["OVERFLOW_OPS", "keep_fp32"]

#: Default ops kept in float32: squares, sums, means, exponentials and what follows them
#: directly in a norm (the ops whose intermediate values leave float16's range first).
OVERFLOW_OPS: tuple[str, ...] = (
    "Pow",
    "ReduceSumSquare",
    "ReduceSum",
    "ReduceMean",
    "ReduceL2",
    "Sqrt",
    "Reciprocal",
    "Exp",
    "Softmax",
    "LogSoftmax",
)

_HALF = frozenset({ir.DataType.FLOAT16, ir.DataType.BFLOAT16})


def keep_fp32(model: ir.Model, op_types: Collection[str] = OVERFLOW_OPS) -> int:
    """Compute the standard-domain nodes of ``op_types`` in float32 (in place).

    A node is moved when its floating-point outputs are all of one half type (float16 or
    bfloat16); its inputs of that type are widened, its other inputs (``Pow``'s exponent, axes)
    are passed as they are.

    Args:
        model: The model (main graph and local functions are rewritten in place).
        op_types: ONNX op types of the default domain to keep in float32.

    Returns:
        The number of nodes moved to float32.
    """
    wanted = frozenset(op_types)
    moved = _island_graph(model.graph, wanted)
    for function in model.functions.values():
        moved += _island_graph(function, wanted)
    return moved


def _half_type(node: ir.Node) -> ir.DataType | None:
    """The one half type of ``node``'s floating-point outputs, or None (none, or mixed).

    Inputs of that type are widened; inputs of other types (``Pow``'s float32 exponent, axes)
    are passed as they are.
    """
    types = {v.dtype for v in node.outputs if v.dtype is not None and v.dtype.is_floating_point()}
    if len(types) != 1:
        return None
    (only,) = types
    return only if only in _HALF else None


def _widen_float_casts(half: ir.Value, wide: ir.Value) -> None:
    """A ``Cast(half, to=float)`` after the island reads the float32 value (no round trip)."""
    for use in list(half.uses()):
        consumer = use.node
        if (
            consumer.op_type == "Cast"
            and consumer.domain in ("", "ai.onnx")
            and consumer.attributes.get_int("to") == ir.DataType.FLOAT
        ):
            consumer.replace_input_with(use.idx, wide)


def _island_graph(graph: ir.Graph | ir.Function, wanted: frozenset[str]) -> int:
    wide: dict[ir.Value, ir.Value] = {}  # half value → its float32 twin inside an island
    back_casts: list[ir.Node] = []
    moved = 0
    for node in list(graph):
        if node.domain not in ("", "ai.onnx") or node.op_type not in wanted:
            continue
        half = _half_type(node)
        if half is None:
            continue
        base = node.name or f"{node.op_type}_{moved}"
        inputs: list[ir.Value | None] = []
        new_nodes: list[ir.Node] = []
        for v in node.inputs:
            if v is None or v.dtype != half:
                inputs.append(v)
            elif v in wide:
                inputs.append(wide[v])
            else:
                cast = ir.node(
                    "Cast", [v], {"to": ir.DataType.FLOAT}, name=f"{base}/fp32_in_{len(new_nodes)}"
                )
                cast.outputs[0].dtype = ir.DataType.FLOAT
                cast.outputs[0].shape = v.shape
                new_nodes.append(cast)
                inputs.append(cast.outputs[0])
        wide_node = ir.Node(
            node.domain,
            node.op_type,
            inputs,
            attributes=list(node.attributes.values()),
            num_outputs=len(node.outputs),
            name=f"{base}/fp32",
            version=node.version,
            metadata_props=dict(node.metadata_props),
        )
        new_nodes.append(wide_node)
        old_values, new_values = [], []
        for old, out in zip(node.outputs, wide_node.outputs, strict=True):
            out.shape = old.shape
            if old.dtype != half:
                out.type = old.type
                old_values.append(old)
                new_values.append(out)
                continue
            out.dtype = ir.DataType.FLOAT
            cast = ir.node("Cast", [out], {"to": half}, name=f"{base}/fp32_out_{len(new_nodes)}")
            cast.outputs[0].dtype, cast.outputs[0].shape = half, old.shape
            new_nodes.append(cast)
            back_casts.append(cast)
            wide[old] = out
            old_values.append(old)
            new_values.append(cast.outputs[0])
        ir.convenience.replace_nodes_and_values(
            graph, node, [node], new_nodes, old_values, new_values
        )
        for new_value, old in zip(new_values, old_values, strict=True):
            if old in wide:  # the float32 twin is found from the Cast's output too
                wide[new_value] = wide.pop(old)
                _widen_float_casts(new_value, wide[new_value])
        moved += 1
    outputs = set(graph.outputs)
    for cast in back_casts:  # a Cast back whose every consumer is inside the island
        if not cast.outputs[0].uses() and cast.outputs[0] not in outputs:
            graph.remove(cast, safe=True)
    return moved
