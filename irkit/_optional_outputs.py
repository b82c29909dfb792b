"""Unused optional outputs left out of a serialized model, so the runtime does not compute them.

A node output nothing reads still costs onnxruntime an allocation and, for most kernels, its
computation: the kernel fills every output the node names. ONNX lets a node leave an optional
output out (an empty name; trailing ones dropped). :func:`drop_unused_optional_outputs` does that
on a ``ModelProto`` as :func:`irkit.save` writes it (the in-memory model keeps its values, whose
names onnx-ir's name pass would give back): ``LayerNormalization``'s ``Mean`` and
``InvStdDev``, ``SkipSimplifiedLayerNormalization``'s ``mean``/``inv_std_var`` — what the
onnxruntime-genai builder leaves out too — and the sum of the last one, read by no later layer.

Which outputs are optional comes from onnx's schemas for its own domains, and from
:data:`CONTRIB_OPTIONAL_OUTPUTS` for the onnxruntime contrib ops irkit's rules write (onnx does
not know their schemas; onnxruntime is not a dependency of saving).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator

import onnx

__all__ = ["CONTRIB_OPTIONAL_OUTPUTS", "drop_unused_optional_outputs"]

CONTRIB_OPTIONAL_OUTPUTS: dict[tuple[str, str], frozenset[int]] = {
    ("com.microsoft", "SkipLayerNormalization"): frozenset({1, 2, 3}),
    ("com.microsoft", "SkipSimplifiedLayerNormalization"): frozenset({1, 2, 3}),
}
"""Optional outputs (indices) of onnxruntime contrib ops, as onnxruntime 1.32's schemas state."""


@functools.cache
def _optional(domain: str, op_type: str, version: int) -> frozenset[int]:
    contrib = CONTRIB_OPTIONAL_OUTPUTS.get((domain, op_type))
    if contrib is not None:
        return contrib
    if domain not in ("", "ai.onnx"):
        return frozenset()
    try:
        schema = onnx.defs.get_schema(op_type, version, "")
    except onnx.defs.SchemaError:
        return frozenset()
    optional = onnx.defs.OpSchema.FormalParameterOption.Optional
    if any(o.option == onnx.defs.OpSchema.FormalParameterOption.Variadic for o in schema.outputs):
        return frozenset()
    return frozenset(i for i, o in enumerate(schema.outputs) if o.option == optional)


def _subgraphs(node: onnx.NodeProto) -> Iterator[onnx.GraphProto]:
    for attribute in node.attribute:
        if attribute.HasField("g"):
            yield attribute.g
        yield from attribute.graphs


def _nodes(nodes: Iterable[onnx.NodeProto]) -> Iterator[onnx.NodeProto]:
    """``nodes`` and the nodes of every subgraph they hold, depth first."""
    for node in nodes:
        yield node
        for graph in _subgraphs(node):
            yield from _nodes(graph.node)


def _subgraph_outputs(nodes: Iterable[onnx.NodeProto]) -> Iterator[str]:
    for node in _nodes(nodes):
        for graph in _subgraphs(node):
            yield from (o.name for o in graph.output)


def _drop(nodes: list[onnx.NodeProto], kept: Iterable[str], opset: dict[str, int]) -> int:
    """Leave out the unused optional outputs of ``nodes`` (and their subgraphs'); how many."""
    read = set(kept) | set(_subgraph_outputs(nodes))
    every = list(_nodes(nodes))
    for node in every:
        read.update(node.input)
    dropped = 0
    for node in every:
        optional = _optional(node.domain, node.op_type, opset.get(node.domain or "", 1))
        if not optional:
            continue
        names = list(node.output)
        for i, name in enumerate(names):
            if name and i in optional and name not in read:
                names[i] = ""
                dropped += 1
        while names and not names[-1]:
            names.pop()
        if names != list(node.output):
            del node.output[:]
            node.output.extend(names)
    return dropped


def drop_unused_optional_outputs(proto: onnx.ModelProto) -> int:
    """Leave out every optional node output nothing reads, in the main graph and each function
    (subgraphs included); returns how many were left out.

    Args:
        proto: The serialized model, changed in place.

    Example:
        >>> import onnx
        >>> m = onnx.parser.parse_model('''<ir_version: 10, opset_import: ["" : 17]>
        ...     g (float[2, 4] x, float[4] w) => (float[2, 4] y) {
        ...         y, mean, inv = LayerNormalization(x, w) }''')
        >>> drop_unused_optional_outputs(m), list(m.graph.node[0].output)
        (2, ['y'])
    """
    opset = {o.domain or "": o.version for o in proto.opset_import}
    dropped = _drop(list(proto.graph.node), (o.name for o in proto.graph.output), opset)
    for function in proto.functions:
        local = {**opset, **{o.domain or "": o.version for o in function.opset_import}}
        dropped += _drop(list(function.node), function.output, local)
    return dropped
