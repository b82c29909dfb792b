"""DOT source for one body (main graph or function), and layout to SVG with Graphviz ``dot``.

The DOT text is written here (no dependency). Laying it out with Graphviz is optional
(``--layout dot``; the default layout is :mod:`irkit.viz._svg`): it needs the ``graphviz``
Python package (the ``irkit[graphviz]`` extra) and the ``dot`` program, both imported/located
only then. Function
calls are drawn as double-bordered boxes with SVG id ``n<k>`` and class ``call``; primitive
nodes get class ``op``; edges carry the value's type and shape (as a tooltip only in bodies
larger than :data:`LARGE_BODY`).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence

import onnx_ir as ir

from irkit import metadata
from irkit.errors import VizError
from irkit.viz._summary import Body, ModelSummary, TensorInfo, call_frame, function_key

__all__ = ["DotGraph", "body_dot", "layout_svg", "GRAPHVIZ_INSTALL_HINT"]

GRAPHVIZ_INSTALL_HINT = (
    "Install Graphviz's layout program `dot` (Debian/Ubuntu: apt-get install graphviz; "
    "macOS: brew install graphviz) and the Python binding (pip install 'irkit[graphviz]'), "
    "or leave out --layout dot: the built-in layout needs nothing else."
)

_HEADER = """digraph {{
  graph [rankdir=TB, nodesep=0.25, ranksep=0.35, fontname="DejaVu Sans", bgcolor="white", label={label}, labelloc=t, fontsize=12];
  node [fontname="DejaVu Sans", fontsize=10, shape=box, style="rounded,filled", fillcolor="#eef3fb", color="#5b7db1", height=0.3, margin="0.12,0.04"];
  edge [fontname="DejaVu Sans", fontsize=8, color="#8a8a8a", fontcolor="#555555", arrowsize=0.6];
"""

LARGE_BODY = 600
"""Bodies with more nodes are laid out with cheaper settings and without edge labels: ``dot``
takes ~40 s on a 3,300-node chain with labels and default effort, ~2 s like this."""

_FAST = "  graph [splines=line, nslimit=0.2, nslimit1=0.2, mclimit=0.01, remincross=false];\n"

_COLORS = {"added": "#d4f7d4", "removed": "#ffd6d6", "changed": "#fff0b3"}


def quote(text: str) -> str:
    """A DOT double-quoted string."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


@dataclasses.dataclass
class DotGraph:
    """The DOT source of one body and the SVG id given to each of its nodes.

    Attributes:
        source: DOT text.
        node_ids: ``{node: "n<k>"}`` in graph order.
        input_ids: ``{value: "i<k>"}`` for the drawn graph inputs.
    """

    source: str
    node_ids: dict[ir.Node, str]
    input_ids: dict[ir.Value, str]


def _attrs(**kwargs: str) -> str:
    return "[" + ", ".join(f"{k}={quote(v)}" for k, v in kwargs.items()) + "]"


def _io_node(ident: str, info: TensorInfo, kind: str) -> str:
    fill, color = ("#e6f4ea", "#4c9a5f") if kind == "input" else ("#fdecea", "#c0504d")
    label = f"{info.name}\n{info.type_text()}"
    attrs = {
        "id": ident,
        "label": label,
        "shape": "ellipse",
        "fillcolor": fill,
        "color": color,
        "class": kind,
    }
    return f"  {ident} {_attrs(**attrs)};"


def call_label(summary: ModelSummary, node: ir.Node, callee: Body) -> str:
    """``q_proj`` / ``Linear`` / ``2 nodes · body ×4``: the instance, its module class (or the
    function's name without irkit metadata), and how many calls share the drawn body."""
    name = summary.call_names.get(node, node.name or "")
    frame = call_frame(node)
    function_name = node.op_type  # (the name of the function ``callee`` is the body of)
    cls = frame.class_name if frame is not None else function_name
    if frame is not None and function_name != cls:
        cls += f" ({function_name})"
    node_name = node.name or ""
    if frame is not None and node_name.startswith(frame.call_id + "/part"):
        name += f" [{node_name[len(frame.call_id) + 1 :]}]"  # a split call: "enc [part0]"
    shared = f" · body ×{callee.calls}" if callee.calls > 1 else ""
    return f"{name}\n{cls}\n{callee.node_count} nodes{shared}"


CLUSTER_DEPTH = 2
"""Main-graph nodes are boxed by their ``irkit.scope`` module calls down to this depth."""


def _scope(node: ir.Node) -> tuple[metadata.Frame, ...]:
    from irkit.viz._scopes import node_frames

    return node_frames(node)[:CLUSTER_DEPTH]


@dataclasses.dataclass
class _Cluster:
    """Nested Graphviz clusters, one per module call (``id="c:<call id>"``)."""

    statements: list[str] = dataclasses.field(default_factory=list)
    children: dict[str, tuple[metadata.Frame, _Cluster]] = dataclasses.field(default_factory=dict)
    """Call id → the call's frame and its cluster."""

    def at(self, frames: tuple[metadata.Frame, ...]) -> _Cluster:
        cluster = self
        for frame in frames:
            _, cluster = cluster.children.setdefault(frame.call_id, (frame, _Cluster()))
        return cluster

    def emit(self, indent: str) -> list[str]:
        lines = [indent + s.strip() for s in self.statements]
        for call_id, (frame, child) in self.children.items():
            label = f"{call_id}  {frame.class_name}"
            attrs = _attrs(
                id=f"c:{call_id}",
                label=label,
                style="rounded,dashed",
                color="#9aa7b8",
                fontcolor="#55606e",
                fontsize="9",
                labeljust="l",
            )
            lines.append(f"{indent}subgraph {quote('cluster_' + call_id)} {{")
            lines.append(f"{indent}  graph {attrs};")
            lines.extend(child.emit(indent + "  "))
            lines.append(f"{indent}}}")
        return lines


def _node_stmt(summary: ModelSummary, node: ir.Node, ident: str, mark: str | None) -> str:
    """The DOT statement of one node: a call box or an op box, optionally diff-coloured."""
    callee_fn = summary.model.functions.get((node.domain, node.op_type, node.overload))
    extra: dict[str, str] = {"id": ident, "tooltip": node.name or node.op_type}
    if callee_fn is not None:
        callee = summary.bodies[function_key(callee_fn.identifier())]
        extra.update(
            label=call_label(summary, node, callee),
            style="filled,bold",
            fillcolor="#fff4d6",
            color="#b07d00",
            peripheries="2",
            shape="box",
        )
        extra["class"] = "call"
    else:
        plain = node.domain in ("", "ai.onnx")
        extra["label"] = node.op_type if plain else f"{node.domain}::{node.op_type}"
        extra["class"] = "op"
        if node.op_type == "Constant":
            extra.update(fontsize="8", fillcolor="#f2f2f2", color="#aaaaaa")
    if mark is not None:
        extra["fillcolor"] = _COLORS[mark]
        extra["class"] += " " + mark
    return f"  {ident} {_attrs(**extra)};"


def body_dot(
    summary: ModelSummary,
    body: Body,
    *,
    highlight: Mapping[ir.Node, str] | None = None,
    title: str | None = None,
) -> DotGraph:
    """The DOT source of ``body``.

    Args:
        summary: The model summary (to recognise call nodes).
        body: The body to draw.
        highlight: ``{node: "added"|"removed"|"changed"}`` fill colours (used by the diff).
        title: Graph label (default: the body key).

    Returns:
        The :class:`DotGraph`.
    """
    highlight = highlight or {}
    initializers = set(summary.model.graph.initializers) if body.is_main else set()
    large = body.stored_nodes > LARGE_BODY
    lines = [_HEADER.format(label=quote(title or body.key))]
    if large:
        lines.append(_FAST)
    producer: dict[ir.Value, str] = {}
    input_ids: dict[ir.Value, str] = {}
    for k, value in enumerate(body.graph.inputs):
        if value.name in initializers:
            continue
        ident = f"i{k}"
        input_ids[value] = producer[value] = ident
        info = body.input_infos[k]
        lines.append(_io_node(ident, info, "input"))
    node_ids: dict[ir.Node, str] = {}
    clusters = _Cluster()
    for k, node in enumerate(body.graph):
        ident = f"n{k}"
        node_ids[node] = ident
        statement = _node_stmt(summary, node, ident, highlight.get(node))
        frames = _scope(node) if body.is_main and not large else ()
        clusters.at(frames).statements.append(statement)
        for output in node.outputs:
            producer[output] = ident
    lines.extend(clusters.emit("  "))
    for node, ident in node_ids.items():
        lines.extend(_subgraph_clusters(summary, node, ident, "  "))
    input_index = {v: i for i, v in enumerate(body.graph.inputs)}
    for node, ident in node_ids.items():
        for arg in node.inputs:
            if arg is not None and arg in producer:
                info = TensorInfo.of(arg)
                if arg in input_index:
                    info = body.input_infos[input_index[arg]]
                label = info.type_text()
                attr = "edgetooltip" if large else "label"
                lines.append(f"  {producer[arg]} -> {ident} [{attr}={quote(label)}];")
    for k, value in enumerate(body.graph.outputs):
        ident = f"o{k}"
        info = TensorInfo.of(value)
        lines.append(_io_node(ident, info, "output"))
        if value in producer:
            lines.append(f"  {producer[value]} -> {ident};")
    lines.append("}")
    return DotGraph("\n".join(lines) + "\n", node_ids, input_ids)


def _subgraph_clusters(summary: ModelSummary, owner: ir.Node, ident: str, indent: str) -> list[str]:
    """The subgraphs of an If/Loop/Scan node as dashed clusters (``id="g:<body key>"``), nodes
    ``<owner id>_<k>_<j>``, joined to their owner by a dashed edge; nested ones inside."""
    lines: list[str] = []
    labels = [label for (node, label) in summary.subgraphs if node is owner]
    for k, label in enumerate(labels):
        body = summary.bodies[summary.subgraphs[(owner, label)]]
        attrs = _attrs(
            id=f"g:{body.key}",
            label=f"{owner.name or owner.op_type}.{label}",
            style="rounded,dashed",
            color="#16808f",
            fontcolor="#16808f",
            fontsize="9",
            labeljust="l",
        )
        lines.append(f"{indent}subgraph {quote(f'cluster_{ident}_{k}')} {{")
        lines.append(f"{indent}  graph {attrs};")
        producer: dict[ir.Value, str] = {}
        inner_ids: dict[ir.Node, str] = {}
        for j, node in enumerate(body.graph):
            inner = f"{ident}_{k}_{j}"
            inner_ids[node] = inner
            lines.append(indent + _node_stmt(summary, node, inner, None).strip())
            for value in node.outputs:
                producer[value] = inner
        for node, inner in inner_ids.items():
            for arg in node.inputs:
                if arg is not None and arg in producer:
                    lines.append(f"{indent}  {producer[arg]} -> {inner};")
            lines.extend(_subgraph_clusters(summary, node, inner, indent + "  "))
        lines.append(f"{indent}}}")
        if inner_ids:
            first = next(iter(inner_ids.values()))
            lines.append(
                f'{indent}{ident} -> {first} [style=dashed, color="#16808f", label={quote(label)}];'
            )
    return lines


_XML_HEAD = re.compile(r"<\?xml[^>]*>\s*(<!DOCTYPE[^>]*>\s*)?(<!--.*?-->\s*)*", re.S)


def layout_svg(sources: Sequence[str]) -> list[str]:
    """Lay out DOT sources with Graphviz ``dot`` (one process for all) and return the SVGs.

    Raises:
        VizError: The ``graphviz`` Python package or the ``dot`` program is missing, or
            ``dot`` failed.
    """
    if not sources:
        return []
    try:
        import graphviz
    except ImportError as exc:
        raise VizError(
            f"--layout dot needs the graphviz Python package. {GRAPHVIZ_INSTALL_HINT}"
        ) from exc
    try:
        out = graphviz.pipe("dot", "svg", "".join(sources).encode(), quiet=True)
    except graphviz.ExecutableNotFound as exc:
        raise VizError(
            f"Graphviz's `dot` program was not found on PATH. {GRAPHVIZ_INSTALL_HINT}"
        ) from exc
    except graphviz.CalledProcessError as exc:
        stderr = (exc.stderr or b"").decode(errors="replace").strip()
        raise VizError(f"Graphviz `dot` failed: {stderr or exc}") from exc
    text = out.decode("utf-8")
    starts = [m.start() for m in re.finditer(r"<\?xml", text)]
    svgs = [text[a:b] for a, b in zip(starts, [*starts[1:], len(text)], strict=True)]
    if len(svgs) != len(sources):
        raise VizError(
            f"Graphviz `dot` returned {len(svgs)} SVG documents for {len(sources)} graphs. "
            "Check the Graphviz installation (`dot -V`), or leave out --layout dot."
        )
    return svgs


def strip_xml_header(svg: str) -> str:
    """The ``<svg>`` element alone (to inline it in HTML)."""
    return _XML_HEAD.sub("", svg, count=1).strip()
