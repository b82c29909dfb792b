"""Graph dumps a person wants to read: call tree, DOT/SVG, one-file HTML, JSON, diff.

Works on any ONNX model (irkit's hierarchy metadata is used when present) and never imports
torch. The command line is :func:`irkit.viz.cli.main` (``irkit view``, ``irkit-viz``; in a
checkout also ``python tools/viz.py``).

Example:
    >>> import onnx_ir as ir
    >>> from irkit import viz
    >>> m = ir.from_onnx_text('<ir_version: 10, opset_import: ["" : 21]> g (float[2] x) => (float[2] y) { y = Relu(x) }')
    >>> s = viz.summarize(m)
    >>> "Relu 1" in viz.render_text(s)
    True
"""

from __future__ import annotations

from irkit.viz._diff import ModelDiff, diff_summaries, render_diff_text
from irkit.viz._dot import body_dot, layout_svg
from irkit.viz._graph import GraphData, body_graph
from irkit.viz._json import render_json, to_json_data
from irkit.viz._summary import Body, Call, ModelSummary, TensorInfo, summarize
from irkit.viz._text import TextOptions, render_function_text, render_text

__all__ = [
    "summarize",
    "ModelSummary",
    "Call",
    "Body",
    "TensorInfo",
    "TextOptions",
    "render_text",
    "render_function_text",
    "render_json",
    "to_json_data",
    "body_dot",
    "layout_svg",
    "body_graph",
    "GraphData",
    "layout_graph_svg",
    "render_html",
    "diff_summaries",
    "render_diff_text",
    "ModelDiff",
]


def render_html(summary: ModelSummary, *, title: str | None = None, layout: str = "builtin") -> str:
    """The one-file interactive HTML page (see :func:`irkit.viz._html.render_html`).

    ``layout="builtin"`` needs nothing installed (bodies are laid out in the page by the
    bundled dagre); ``"dot"`` lays them out now with Graphviz's ``dot`` program.
    """
    from irkit.viz import _html

    return _html.render_html(summary, title=title, layout=layout)


def layout_graph_svg(graph: GraphData) -> str:
    """An SVG of ``graph`` (from :func:`body_graph`) laid out by igraph; no system program."""
    from irkit.viz import _svg

    return _svg.layout_graph_svg(graph)
