"""SVG pictures without any system program: a layered layout from igraph, drawn here.

``igraph``'s ``layout_sugiyama`` (a C library with wheels for every platform) assigns layers,
orders each layer to reduce crossings and routes long edges through bend points; this module
only turns the positions into SVG (boxes, text, polyline edges). It never computes a layout
itself. ``--layout dot`` keeps Graphviz (see :func:`irkit.viz._dot.layout_svg`) for those who
have it.

The SVG follows the classes of the HTML viewer: ``<g class="node op|call|input|output|const">``
with the id of the node (``n<k>``), one ``<text>`` per label line, ``<g class="edge">``, and the
graph title as the first ``<text>`` of ``<g class="graph">``.
"""

from __future__ import annotations

import html
import logging
import math

from irkit.errors import VizError
from irkit.viz._graph import GraphData, GraphNode, text_width

logger = logging.getLogger(__name__)

__all__ = ["layout_graph_svg", "box_size", "IGRAPH_INSTALL_HINT"]

IGRAPH_INSTALL_HINT = (
    "Reinstall irkit (`pip install irkit`) so that its igraph dependency is present."
)

FONT = "DejaVu Sans, Verdana, Arial, sans-serif"
_LINE = 13.0
_PAD_X, _PAD_Y = 10.0, 5.0
_LARGE = 600
"""Bodies with more nodes draw their edges' shapes as tooltips instead of labels."""

_FILL = {
    "op": ("#eef3fb", "#5b7db1"),
    "call": ("#fff4d6", "#b07d00"),
    "region": ("#f4f0fb", "#7a5bb1"),
    "input": ("#e6f4ea", "#4c9a5f"),
    "output": ("#fdecea", "#c0504d"),
    "const": ("#f2f2f2", "#aaaaaa"),
    "flow": ("#e8f6f8", "#16808f"),
}
_MARKS = {"added": "#d4f7d4", "removed": "#ffd6d6", "changed": "#fff0b3"}


def box_size(node: GraphNode) -> tuple[float, float]:
    """Width and height in px of ``node``'s box (text estimated, no font needed)."""
    size = 9.0 if node.kind == "const" else 10.0
    width = max((text_width(line, size) for line in node.lines), default=20.0) + 2 * _PAD_X
    if node.kind in ("input", "output"):
        width += 14.0
    return max(width, 40.0), _LINE * len(node.lines) + 2 * _PAD_Y


def _layers(n: int, edges: list[tuple[int, int]]) -> list[int] | None:
    """Layer indices for igraph: longest path from the sources, except that a source (a graph
    input, a Constant) sits just above its first consumer instead of at the top — weights are
    not drawn a hundred layers above their MatMul. ``None`` (igraph decides) if there is a
    cycle."""
    succ: list[list[int]] = [[] for _ in range(n)]
    indeg = [0] * n
    for a, b in edges:
        succ[a].append(b)
        indeg[b] += 1
    order = [v for v in range(n) if indeg[v] == 0]
    sources = set(order)
    layer = [0] * n
    for v in order:  # grows while it is read: Kahn's topological order
        for w in succ[v]:
            layer[w] = max(layer[w], layer[v] + 1)
            indeg[w] -= 1
            if indeg[w] == 0:
                order.append(w)
    if len(order) < n:
        return None
    for v in sources:
        if succ[v]:
            layer[v] = max(0, min(layer[w] for w in succ[v]) - 1)
    return layer


_Routing = list[list[tuple[float, float]]]


def _layout(
    graph: GraphData, sizes: list[tuple[float, float]]
) -> tuple[list[tuple[float, ...]], _Routing, float]:
    """igraph's Sugiyama layout: node centres, edge routes (bend points), the column gap."""
    try:
        import igraph
    except ImportError as exc:  # a broken install: igraph is a dependency
        raise VizError(f"SVG output needs the igraph package. {IGRAPH_INSTALL_HINT}") from exc
    index = {n.id: k for k, n in enumerate(graph.nodes)}
    edges = [(index[a], index[b]) for a, b, _ in graph.edges]
    g = igraph.Graph(n=len(graph.nodes), edges=edges, directed=True)
    hgap = max((w for w, _ in sizes), default=40.0) + 16.0
    vgap = max((h for _, h in sizes), default=20.0) + (22.0 if len(graph.nodes) > _LARGE else 30.0)
    layout = g.layout_sugiyama(layers=_layers(len(graph.nodes), edges), hgap=hgap, vgap=vgap)
    return [tuple(c) for c in layout.coords], layout.edge_routing, hgap


def _node_svg(node: GraphNode, x: float, y: float, w: float, h: float) -> str:
    fill, stroke = _FILL.get(node.kind, _FILL["op"])
    if node.mark is not None:
        fill = _MARKS.get(node.mark, fill)
    classes = f"node {node.kind}" + (f" {node.mark}" if node.mark else "")
    parts = [f'<g id="{html.escape(node.id)}" class="{classes}">']
    parts.append(f"<title>{html.escape(node.tooltip)}</title>")
    if node.kind in ("input", "output"):
        parts.append(
            f'<ellipse cx="{x:.1f}" cy="{y:.1f}" rx="{w / 2:.1f}" ry="{h / 2:.1f}" '
            f'fill="{fill}" stroke="{stroke}"/>'
        )
    else:
        bold = ' stroke-width="2"' if node.kind in ("call", "region", "flow") else ""
        parts.append(
            f'<rect x="{x - w / 2:.1f}" y="{y - h / 2:.1f}" width="{w:.1f}" height="{h:.1f}" '
            f'rx="4" fill="{fill}" stroke="{stroke}"{bold}/>'
        )
    size = 9 if node.kind == "const" else 10
    top = y - _LINE * len(node.lines) / 2 + _LINE * 0.75
    for k, line in enumerate(node.lines):
        weight = ' font-weight="bold"' if k == 0 and node.kind in ("call", "region", "flow") else ""
        parts.append(
            f'<text x="{x:.1f}" y="{top + k * _LINE:.1f}" text-anchor="middle" '
            f'font-size="{size}"{weight}>{html.escape(line)}</text>'
        )
    parts.append("</g>")
    return "".join(parts)


def layout_graph_svg(graph: GraphData) -> str:
    """Lay ``graph`` out (top to bottom) with igraph's Sugiyama layout and return the SVG.

    Raises:
        VizError: igraph is not installed (a broken install).
    """
    sizes = [box_size(n) for n in graph.nodes]
    coords, routing, _ = _layout(graph, sizes) if graph.nodes else ([], [], 0.0)
    margin, title_h = 12.0, 24.0
    min_x = min(x - w / 2 for (x, _), (w, _) in zip(coords, sizes, strict=True)) if coords else 0
    max_x = max(x + w / 2 for (x, _), (w, _) in zip(coords, sizes, strict=True)) if coords else 0
    max_y = max((y + h / 2 for (_, y), (_, h) in zip(coords, sizes, strict=True)), default=0.0)
    min_y = min((y - h / 2 for (_, y), (_, h) in zip(coords, sizes, strict=True)), default=0.0)
    title_w = text_width(graph.title, 12) + 2 * margin
    dx = margin - min_x
    dy = margin + title_h - min_y
    width = max(max_x - min_x + 2 * margin, title_w)
    height = max_y - min_y + 2 * margin + title_h
    index = {n.id: k for k, n in enumerate(graph.nodes)}
    large = len(graph.nodes) > _LARGE
    out = [
        '<?xml version="1.0" encoding="UTF-8" standalone="no"?>',
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}pt" height="{height:.0f}pt" '
        f'viewBox="0 0 {width:.1f} {height:.1f}" font-family="{FONT}">',
        '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="6" '
        'markerHeight="6" orient="auto-start-reverse"><path d="M0,0L10,5L0,10z" '
        'fill="#8a8a8a"/></marker></defs>',
        '<g id="graph0" class="graph">',
        f'<text x="{width / 2:.1f}" y="{margin + 12:.1f}" text-anchor="middle" '
        f'font-size="12">{html.escape(graph.title)}</text>',
    ]
    for (src, dst, label), bends in zip(graph.edges, routing, strict=True):
        (x1, y1), (_, h1) = coords[index[src]], sizes[index[src]]
        (x2, y2), (_, h2) = coords[index[dst]], sizes[index[dst]]
        points = [(x1 + dx, y1 + h1 / 2 + dy)]
        points += [(bx + dx, by + dy) for bx, by in bends]
        points.append((x2 + dx, y2 - h2 / 2 + dy))
        path = " ".join(f"{px:.1f},{py:.1f}" for px, py in points)
        tip = f"<title>{html.escape(label)}</title>" if label else ""
        out.append(
            f'<g class="edge">{tip}<polyline points="{path}" fill="none" stroke="#8a8a8a" '
            'marker-end="url(#arrow)"/>'
        )
        if label and not large:
            # The label sits beside the edge's first segment, where the edge leaves its source.
            (ax, ay), (bx, by) = points[0], points[1]
            mx, my = ax + (bx - ax) * 0.5, ay + (by - ay) * 0.5
            if math.dist((ax, ay), (bx, by)) > 30:
                out.append(
                    f'<text x="{mx + 3:.1f}" y="{my + 3:.1f}" font-size="8" '
                    f'fill="#555555">{html.escape(label)}</text>'
                )
        out.append("</g>")
    for node, (x, y), (w, h) in zip(graph.nodes, coords, sizes, strict=True):
        out.append(_node_svg(node, x + dx, y + dy, w, h))
    out.append("</g></svg>")
    return "\n".join(out) + "\n"
