"""One body as plain drawable data: boxes with text lines, edges with labels, nothing laid out.

Both layout paths read this: :mod:`irkit.viz._svg` (laid out in Python, written as SVG) and the
HTML viewer (laid out in the page by the bundled dagre, only when a body is opened). Node ids
follow the DOT output of :func:`irkit.viz._dot.body_dot` (``i<k>`` inputs, ``n<k>`` nodes,
``o<k>`` outputs), so one id names one node in every format.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence

import onnx_ir as ir

from irkit.viz._summary import Body, ModelSummary, TensorInfo, function_key

__all__ = ["GraphData", "GraphNode", "TypeMemo", "body_graph", "region_graph", "text_width"]


@dataclasses.dataclass
class GraphNode:
    """One box: ``kind`` is ``op``, ``call`` (a function call), ``flow`` (a node owning
    subgraphs: If, Loop, Scan), ``region`` (part of a flat graph), ``input``, ``output`` or
    ``const``; ``mark`` is a diff colour (``added``, ``removed``, ``changed``)."""

    id: str
    lines: list[str]
    kind: str
    mark: str | None = None
    tooltip: str = ""

    def to_json(self) -> list[object]:
        return [self.id, self.lines, self.kind, self.mark, self.tooltip]


@dataclasses.dataclass
class GraphData:
    """A drawable body: ``edges`` are ``(source id, target id, label)`` in graph order."""

    title: str
    nodes: list[GraphNode]
    edges: list[tuple[str, str, str]]

    def to_json(self) -> dict[str, object]:
        return {
            "title": self.title,
            "nodes": [n.to_json() for n in self.nodes],
            "edges": [list(e) for e in self.edges],
        }


class TypeMemo(dict[ir.Value, TensorInfo]):
    """``{value: TensorInfo}`` filled on first lookup (a 20k-node page asks for each type
    several times)."""

    def __missing__(self, value: ir.Value) -> TensorInfo:
        info = self[value] = TensorInfo.of(value)
        return info


_CHAR_WIDTHS = {"i": 0.3, "l": 0.3, "j": 0.3, "t": 0.4, "f": 0.4, "r": 0.45, ".": 0.3, " ": 0.32}


def text_width(text: str, size: float) -> float:
    """An estimate of ``text``'s width in px in DejaVu Sans at ``size`` px (no font needed)."""
    wide = sum(_CHAR_WIDTHS.get(c, 0.72 if c.isupper() or c in "mwMW" else 0.6) for c in text)
    return wide * size


def call_lines(summary: ModelSummary, node: ir.Node, callee: Body) -> list[str]:
    """``q_proj`` / ``Linear`` / ``2 nodes · body ×4`` (see :func:`irkit.viz._dot.call_label`)."""
    from irkit.viz._dot import call_label

    return call_label(summary, node, callee).split("\n")


def _op_lines(node: ir.Node) -> list[str]:
    plain = node.domain in ("", "ai.onnx")
    return [node.op_type if plain else f"{node.domain}::{node.op_type}"]


def node_box(summary: ModelSummary, node: ir.Node, ident: str, mark: str | None) -> GraphNode:
    """The box of one node: a call box (its callee's label) or an op box."""
    function = summary.model.functions.get((node.domain, node.op_type, node.overload))
    tooltip = node.name or node.op_type
    if function is not None:
        callee = summary.bodies[function_key(function.identifier())]
        return GraphNode(ident, call_lines(summary, node, callee), "call", mark, tooltip)
    branches = (
        [label for (owner, label) in summary.subgraphs if owner is node] if node.attributes else []
    )
    if branches:  # If / Loop / Scan: opened like a call, one subgraph at a time
        lines = [*_op_lines(node), node.name or "", " · ".join(branches)]
        return GraphNode(ident, [line for line in lines if line], "flow", mark, tooltip)
    kind = "const" if node.op_type == "Constant" else "op"
    return GraphNode(ident, _op_lines(node), kind, mark, tooltip)


def _io(ident: str, info: TensorInfo, kind: str) -> GraphNode:
    return GraphNode(ident, [info.name, info.type_text()], kind, None, info.name)


def body_graph(
    summary: ModelSummary,
    body: Body,
    *,
    highlight: Mapping[ir.Node, str] | None = None,
    title: str | None = None,
) -> GraphData:
    """The drawable form of ``body`` (graph initializers are not drawn as inputs).

    Args:
        summary: The model summary (to recognise call nodes).
        body: The body to draw.
        highlight: ``{node: "added"|"removed"|"changed"}`` (used by the diff).
        title: Graph title (default: the body key).
    """
    highlight = highlight or {}
    initializers = set(summary.model.graph.initializers) if body.is_main else set()
    nodes: list[GraphNode] = []
    edges: list[tuple[str, str, str]] = []
    producer: dict[ir.Value, str] = {}
    infos: dict[ir.Value, TensorInfo] = {}
    for k, value in enumerate(body.graph.inputs):
        infos[value] = body.input_infos[k]
        if value.name in initializers:
            continue
        producer[value] = f"i{k}"
        nodes.append(_io(f"i{k}", body.input_infos[k], "input"))
    for k, node in enumerate(body.graph):
        nodes.append(node_box(summary, node, f"n{k}", highlight.get(node)))
        for arg in node.inputs:
            if arg is not None and arg in producer:
                label = (infos.get(arg) or TensorInfo.of(arg)).type_text()
                edges.append((producer[arg], f"n{k}", label))
        for value in node.outputs:
            producer[value] = f"n{k}"
    for k, value in enumerate(body.graph.outputs):
        nodes.append(_io(f"o{k}", TensorInfo.of(value), "output"))
        if value in producer:
            edges.append((producer[value], f"o{k}", ""))
    return GraphData(title or body.key, nodes, edges)


def region_graph(
    title: str,
    members: Sequence[tuple[str, ir.Node]],
    boxes: Sequence[tuple[str, list[str], Iterable[ir.Node]]],
    summary: ModelSummary,
    position: Mapping[ir.Node, int],
    types: TypeMemo | None = None,
) -> GraphData:
    """A region of a flat graph: its own ``members`` (``(id, node)``) and its sub-regions drawn
    as single boxes (``(id, label lines, nodes inside)``), in graph order (``position``);
    values from outside the region become inputs, values used outside become outputs.
    Parameters (graph initializers) are not drawn; they are listed on each node's card.
    """
    types = TypeMemo() if types is None else types
    owner: dict[ir.Node, str] = {}
    items: list[tuple[int, GraphNode, list[ir.Node]]] = []
    for ident, node in members:
        owner[node] = ident
        items.append((position[node], node_box(summary, node, ident, None), [node]))
    for ident, lines, box_nodes in boxes:
        inside_box = list(box_nodes)
        for node in inside_box:
            owner[node] = ident
        first = min((position[n] for n in inside_box), default=0)
        items.append((first, GraphNode(ident, lines, "region", None, lines[0]), inside_box))
    items.sort(key=lambda item: item[0])
    initializers = set(summary.model.graph.initializers.values())
    nodes: list[GraphNode] = []
    edges: list[tuple[str, str, str]] = []
    external: dict[ir.Value, str] = {}
    seen_edges: set[tuple[str, str]] = set()
    exported: dict[ir.Value, str] = {}
    for _, box, box_nodes in items:
        for node in box_nodes:
            for value in node.inputs:
                if value is None or value in initializers:
                    continue
                src_node = value.producer()
                src = owner.get(src_node) if src_node is not None else None
                if src is None:
                    src = external.get(value)
                    if src is None:
                        src = external[value] = f"x{len(external)}"
                        nodes.append(_io(src, types[value], "input"))
                if src == box.id or (src, box.id) in seen_edges:
                    continue
                seen_edges.add((src, box.id))
                edges.append((src, box.id, types[value].type_text()))
            for value in node.outputs:
                if value in exported:
                    continue
                if value.is_graph_output() or any(u.node not in owner for u in value.uses()):
                    exported[value] = box.id
        nodes.append(box)
    for k, (value, src) in enumerate(exported.items()):
        nodes.append(_io(f"y{k}", types[value], "output"))
        edges.append((src, f"y{k}", ""))
    return GraphData(title, nodes, edges)
