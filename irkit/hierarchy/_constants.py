"""Copy small constant subgraphs into every module call that uses them.

After common-subexpression elimination one ``Constant`` (or a ``Concat`` of constants computing a
reshape target) serves every layer: it lives in ``layers.0``'s scope and is used by ``layers.1`` …
``layers.63``. Outlined as is, ``layers.0`` would export it as an extra output and every other
layer would import it, so the first layer's body differs from the rest and deduplication finds
two block functions instead of one. Copying such *constant cones* to each consuming scope keeps
function bodies self-contained (backends see the constant) and identical layers identical.
"""

from __future__ import annotations

from collections.abc import Sequence

import onnx_ir as ir

from irkit import metadata as md
from irkit._irutil import fresh_name
from irkit.errors import OutlineError
from irkit.hierarchy._analysis import has_subgraph

__all__ = ["localize_constants", "constant_cones", "MAX_CONSTANT_ELEMENTS", "MAX_CONE_NODES"]

MAX_CONSTANT_ELEMENTS = 4096
"""``Constant`` nodes with larger tensors are never copied (they stay shared function inputs)."""

MAX_CONE_NODES = 8
"""Constant cones (a value computed only from constants) with more nodes are not copied."""

_NO_COPY = frozenset(
    {
        "RandomNormal",
        "RandomUniform",
        "RandomNormalLike",
        "RandomUniformLike",
        "Multinomial",
        "Bernoulli",
    }
)


def _small_constant(node: ir.Node) -> bool:
    value = node.attributes.data.get("value")  # (the plain dict: Mapping.get is slow)
    if value is None:  # value_float / value_ints / ...: tiny by construction
        return True
    return value.type != ir.AttributeType.TENSOR or value.value.size <= MAX_CONSTANT_ELEMENTS


def constant_cones(nodes: Sequence[ir.Node]) -> dict[ir.Node, int] | None:
    """Node → size of its constant cone, for nodes computed from small constants only.

    One pass that also checks the order: ``None`` if ``nodes`` are not topologically sorted
    (a node reads a value produced by a node that comes later).
    """
    cone: dict[ir.Node, int] = {}
    seen: set[ir.Node] = set()
    add = seen.add
    for node in nodes:
        inputs = node.inputs
        candidate = not node.domain and node.op_type not in _NO_COPY
        size = 1  # of the cone, if a candidate: itself plus its distinct producers' cones
        producers: set[ir.Node] | None = None
        for value in inputs:
            producer = value.producer() if value is not None else None
            if producer is None:
                candidate = candidate and value is None
                continue
            if producer not in seen:
                return None
            if candidate:
                if producer not in cone:
                    candidate = False
                elif producers is None:
                    producers = {producer}
                    size += cone[producer]
                elif producer not in producers:
                    producers.add(producer)
                    size += cone[producer]
        add(node)
        if not candidate:
            continue
        if node.op_type == "Constant":
            if _small_constant(node):
                cone[node] = 1
        elif inputs and size <= MAX_CONE_NODES and not has_subgraph(node):
            cone[node] = size
    return cone


def localize_constants(graph: ir.Graph, cones: dict[ir.Node, int] | None = None) -> int:
    """Give each scope that uses a shared constant cone its own copy. In place.

    Copies are inserted before *a* consumer in their scope; sort the graph afterwards if any
    were made.

    Args:
        graph: A topologically sorted graph whose nodes carry ``irkit.scope``.
        cones: Its :func:`constant_cones`, if already computed.

    Returns:
        The number of nodes copied.

    Example:
        >>> g = ir.from_onnx_text('<ir_version: 10, opset_import: ["" : 21]> g (float x) => (float y) {'
        ...     ' c = Constant <value_float: float = 2.0> () y = Mul(x, c) }').graph
        >>> g.node(1).metadata_props["irkit.scope"] = '[["m",0,"p.M"]]'
        >>> localize_constants(g), [n.op_type for n in g]
        (1, ['Constant', 'Mul'])
    """
    cone = constant_cones(list(graph)) if cones is None else cones
    if cone is None:
        raise OutlineError("localize_constants needs a topologically sorted graph; sort it first.")
    copies: dict[tuple[ir.Node, str], ir.Node] = {}
    used_names: set[str] = set()
    count = 0
    dead = False  # a cone node nobody uses (before copying)
    for producer in list(cone):  # topological order; only uses of cone nodes are visited
        own_scope = producer.metadata_props.get(md.SCOPE, "")
        for value in producer.outputs:
            uses = value.uses()
            if not uses and not value.is_graph_output():
                dead = True
            for use in uses:
                node = use.node
                scope = node.metadata_props.get(md.SCOPE, "")
                if scope == own_scope or node.graph is not graph:
                    continue
                if not used_names:
                    used_names = {v.name for n in graph for v in n.outputs if v.name}
                    used_names |= {n.name for n in graph if n.name}
                copy, made = _copy(graph, producer, scope, copies, used_names, before=node)
                node.replace_input_with(use.idx, copy.outputs[value.index() or 0])
                count += made
    if not count and not dead:
        return 0
    for node in reversed(list(cone)):  # drop originals nobody uses any more
        if not any(v.uses() or v.is_graph_output() for v in node.outputs):
            graph.remove(node, safe=True)
    return count


def _copy(
    graph: ir.Graph,
    node: ir.Node,
    scope: str,
    copies: dict[tuple[ir.Node, str], ir.Node],
    used_names: set[str],
    before: ir.Node,
) -> tuple[ir.Node, int]:
    """The copy of ``node``'s cone in ``scope`` (made once per scope), inserted before ``before``."""
    key = (node, scope)
    if key in copies:
        return copies[key], 0
    made, inputs = 1, list[ir.Value | None]()
    for value in node.inputs:
        producer = value.producer() if value is not None else None
        if value is None or producer is None:  # (a cone's inputs are produced in it)
            inputs.append(value)
            continue
        copy, n = _copy(graph, producer, scope, copies, used_names, before)
        made += n
        inputs.append(copy.outputs[value.index() or 0])
    meta = dict(node.metadata_props)
    meta[md.SCOPE] = scope
    clone = ir.Node(
        node.domain,
        node.op_type,
        inputs,
        attributes=[ir.Attr(a.name, a.type, a.value) for a in node.attributes.values()],
        num_outputs=len(node.outputs),
        version=node.version,
        metadata_props=meta,
        name=fresh_name(node.name, used_names, keep=False) if node.name else None,
    )
    for old, new in zip(node.outputs, clone.outputs, strict=True):
        new.name, new.type, new.shape = (
            fresh_name(old.name or "const", used_names, keep=False),
            old.type,
            old.shape,
        )
        new.const_value = old.const_value
    graph.insert_before(before, clone)
    copies[key] = clone
    return clone, made
