"""One self-contained HTML page: every body laid out by Graphviz at generation time, inlined.

No server, no network: the CSS and JS (``irkit/viz/assets``) and the data (one JSON blob with
one pre-rendered SVG per body — a deduplicated body is drawn once however often it is called)
are inlined. The page inserts a body's SVG into the DOM only when it is opened.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import html
import json
from collections.abc import Mapping, Sequence
from importlib import resources

import onnx_ir as ir

from irkit import metadata
from irkit.errors import MetadataError, VizError
from irkit.viz import _diff, _dot, _graph, _regions, _svg
from irkit.viz._scopes import node_frames
from irkit.viz._style import (
    format_bytes,
    format_count,
    group_calls,
    indexed_successor,
)
from irkit.viz._summary import (
    Body,
    Call,
    ModelSummary,
    TensorInfo,
    function_key,
    function_origin,
)

__all__ = ["HtmlOptions", "render_html", "render_diff_html", "page", "node_info", "body_about"]

_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<style>{css}</style></head>
<body>
<header><h1>{title}</h1><span class="meta">{meta}</span>
{search}</header>
<div id="results"></div>
{body}
<script id="irkit-data" type="application/json">{data}</script>
<script>{js}</script>
</body></html>
"""

_MAIN = """<main><nav id="tree"></nav>
<section id="center"><div id="crumbs"><span id="crumbs-path"></span><span class="tools">
<button id="zoom-out" title="zoom out">−</button><button id="zoom-fit" title="fit">fit</button>
<button id="zoom-in" title="zoom in">+</button></span></div>
<div id="canvas"></div></section>
<aside id="side"></aside></main>"""


def asset(name: str) -> str:
    return (
        resources.files("irkit.viz").joinpath("assets").joinpath(name).read_text(encoding="utf-8")
    )


_SEARCH = (
    '<input id="search" type="search" placeholder="search node, op, module…" autocomplete="off">'
)


def page(title: str, meta: str, body: str, data: object, js: str) -> str:
    """Assemble the page; ``data`` becomes the inline JSON blob ``#irkit-data``; the search box
    is shown when there is a script to drive it."""
    blob = json.dumps(data, separators=(",", ":"), ensure_ascii=False).replace("</", "<\\/")
    return _PAGE.format(
        search=_SEARCH if js else "",
        title=html.escape(title),
        meta=html.escape(meta),
        body=body,
        css=asset("viewer.css"),
        data=blob,
        js=js,
    )


def _value_rows(
    values: Sequence[ir.Value | None], params: set[ir.Value], known: Mapping[ir.Value, TensorInfo]
) -> list[list[str]]:
    rows = []
    for v in values:
        if v is None:
            rows.append(["", "(none)"])
            continue
        info = known[v] if isinstance(known, _graph.TypeMemo) else known.get(v) or TensorInfo.of(v)
        rows.append([info.name, info.type_text() + ("  (parameter)" if v in params else "")])
    return rows


def node_info(
    summary: ModelSummary,
    node: ir.Node,
    params: set[ir.Value],
    known: Mapping[ir.Value, TensorInfo],
    origin: str | None = None,
) -> dict[str, object]:
    """The card shown for one node: title, fields, inputs, outputs, attributes, metadata.

    ``params`` are the values to mark as parameters; ``known`` overrides value types (function
    inputs, whose types come from call sites). ``origin`` is the module path a shared function
    body was built from: the card then re-roots the node's module under the opened instance.
    """
    function = summary.model.functions.get((node.domain, node.op_type, node.overload))
    op = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}::{node.op_type}"
    props = node.metadata_props
    fields = [["op", op], ["name", node.name or ""]]
    scope = node_frames(node)
    module_rel = None
    if scope:  # a call node's scope is its caller's module (its own is shown by the page)
        fields.append(["module" if function is None else "in module", scope[-1].call_id])
        fields.append(["class" if function is None else "in class", scope[-1].cls])
        path = scope[-1].call_id
        if origin is not None and (path == origin or path.startswith(origin + ".")):
            module_rel = path[len(origin) + 1 :]
    for key, label in (
        (metadata.SOURCE, "source"),
        (metadata.FX_NODE, "fx node"),
        (metadata.FX_TARGET, "fx target"),
        (metadata.REWRITE_RULE, "rule"),
    ):
        if key in props:
            fields.append([label, props[key]])
    if metadata.REWRITE_SOURCES in props:
        try:
            sources = ", ".join(metadata.decode_list(props[metadata.REWRITE_SOURCES]))
        except MetadataError:  # a broken model is still shown, with the raw text
            sources = props[metadata.REWRITE_SOURCES]
        fields.append(["rule sources", sources])
    info: dict[str, object] = {
        "op": op,
        "name": node.name or "",
        "title": f"{op}  {node.name or ''}",
        "fields": fields,
        "inputs": _value_rows(node.inputs, params, known),
        "outputs": _value_rows(node.outputs, set(), known),
        "attrs": [[a.name, attr_full(a)] for a in node.attributes.values()],
        "meta": [[k, v] for k, v in sorted(props.items())],
        "module_rel": module_rel,
    }
    if function is not None:
        callee = summary.bodies[function_key(function.identifier())]
        info["callee"] = callee.key
        info["label"] = summary.call_names.get(node, node.name or callee.key)
        info["fields"] = [
            *fields,
            ["function", callee.key],
            ["body calls", str(callee.calls)],
            ["nodes per call", str(callee.node_count)],
            ["flops per call", callee.flops.text()],
        ]
    param_rows = [
        [v.name or "", TensorInfo.of(v).type_text(), value_preview(v)]
        for v in dict.fromkeys(v for v in node.inputs if v is not None and v in params)
    ]
    if param_rows:
        info["params"] = param_rows
    branches = (
        [[key, label] for (owner, label), key in summary.subgraphs.items() if owner is node]
        if node.attributes
        else []
    )
    if branches:
        info["branches"] = branches
    text = " ".join([op, node.name or "", *(v for _, v in fields)])
    info["search"] = text.lower()
    return info


PREVIEW = 8
"""How many leading values of an initializer its card shows."""


def attr_full(attr: ir.Attr) -> str:
    """An attribute's value in full (tensors: type and first values; graphs: their size)."""
    value = attr.value
    if isinstance(value, ir.TensorProtocol):
        return f"tensor {value.dtype.short_name()}{list(value.shape)} " + _tensor_preview(value)
    if isinstance(value, (ir.Graph, ir.GraphProtocol)):
        return f"graph {value.name or ''} ({len(value)} nodes)".replace("  ", " ")
    if isinstance(value, Sequence) and value and isinstance(value[0], ir.GraphProtocol):
        return f"{len(value)} graphs"
    return repr(value)


def value_preview(value: ir.Value) -> str:
    """``[0.0123, -0.5, …] (of 4096)``: the first values of an initializer, read without loading
    all of it (external data: the first bytes of its file only). ``""`` if unavailable."""

    return "" if value.const_value is None else _tensor_preview(value.const_value)


def _tensor_preview(tensor: ir.TensorProtocol) -> str:
    import numpy as np

    try:
        total = tensor.size
        if isinstance(tensor, ir.ExternalTensor):
            dtype = tensor.dtype.numpy()
            count = min(total, PREVIEW)
            with open(tensor.path, "rb") as f:
                f.seek(tensor.offset or 0)
                raw = f.read(count * dtype.itemsize)
            first = np.frombuffer(raw, dtype=dtype, count=count)
        else:
            first = np.asarray(tensor.numpy()).reshape(-1)[:PREVIEW]
    except (OSError, ValueError, TypeError, NotImplementedError, AttributeError):
        return ""
    items = []
    for x in first.tolist():
        items.append(f"{x:.4g}" if isinstance(x, float) else str(x))
    more = f", … ] ({total} values)" if total > len(items) else "]"
    return "[" + ", ".join(items) + more


def body_about(summary: ModelSummary, body: Body) -> list[list[str]]:
    rows = [
        ["graph", body.key],
        ["stored nodes", str(body.stored_nodes)],
        ["nodes per call", str(body.node_count)],
        ["flops per call", body.flops.text()],
    ]
    if body.is_main:
        rows += [
            ["params", f"{format_count(summary.params)} ({format_bytes(summary.param_bytes)})"],
            ["inputs", ", ".join(f"{i.name}: {i.type_text()}" for i in summary.inputs)],
            ["outputs", ", ".join(f"{o.name}: {o.type_text()}" for o in summary.outputs)],
        ]
    elif body.owner is not None:
        rows.append(["owner", f"{body.owner.op_type} {body.owner.name or ''}"])
    else:
        rows.append(["calls", str(body.calls)])
    ops = sorted(body.ops.items(), key=lambda kv: (-kv[1], kv[0]))
    rows.append(["ops", ", ".join(f"{k} {n}" for k, n in ops)])
    return rows


@dataclasses.dataclass(frozen=True)
class HtmlOptions:
    """How :func:`render_html` opens the page (the CLI's ``--depth``, ``--expand``, ``--function``).

    Attributes:
        depth: Levels of the hierarchy panel open at first (default 2); deeper ones are folded.
        expand: Module-path globs whose grouped calls are listed one by one in the panel.
        function: The body shown first: a function name, ``domain::name``, a module path or
            ``main`` (see :meth:`ModelSummary.find_body`); default the main graph.
    """

    depth: int | None = None
    expand: tuple[str, ...] = ()
    function: str | None = None


@dataclasses.dataclass
class _TreeState:
    """Per-page state of the hierarchy panel: options, and the trail to every body and call."""

    options: HtmlOptions
    trails: dict[str, list[list[str]]] = dataclasses.field(default_factory=dict)
    paths: dict[str, list[list[str]]] = dataclasses.field(default_factory=dict)

    def is_open(self, depth: int) -> bool:
        return depth < (2 if self.options.depth is None else self.options.depth)


def _record_paths(state: _TreeState, call: Call, trail: list[list[str]]) -> None:
    state.paths.setdefault(call.path, trail)
    for child in call.children:
        _record_paths(state, child, [*trail, [child.body.key, child.path]])


def _tree(
    state: _TreeState, call: Call, trail: list[list[str]], label: str, count: int, depth: int = 0
) -> dict[str, object]:
    state.trails.setdefault(call.body.key, trail)
    state.paths.setdefault(call.path, trail)
    children = []
    for group in group_calls(call.children, state.options.expand):
        child = group.first
        for other in group.calls[1:]:  # every instance of a group can be opened by --function
            _record_paths(state, other, [*trail, [other.body.key, other.path]])
        children.append(
            _tree(
                state,
                child,
                [*trail, [child.body.key, child.path]],
                group.label(call.path),
                count * len(group.calls),
                depth + 1,
            )
        )
    cls = call.class_name if call.node is not None else ""
    return {
        "label": label,
        "cls": cls,
        "count": count,
        "trail": trail,
        "children": children,
        "open": state.is_open(depth),
    }


def _record_region(state: _TreeState, region: _regions.Region, trail: list[list[str]]) -> None:
    state.trails.setdefault(region.key, trail)
    if region.path:
        state.paths.setdefault(region.path, trail)
    for child in region.children.values():
        _record_region(state, child, [*trail, [child.key, child.path or child.label]])


def _region_tree(
    state: _TreeState,
    region: _regions.Region,
    trail: list[list[str]],
    label: str,
    count: int,
    depth: int,
) -> dict[str, object]:
    """The hierarchy panel of a flat model: its regions (module calls from the nodes' scope
    metadata, or runs of nodes); a click opens the region."""
    state.trails.setdefault(region.key, trail)
    if region.path:
        state.paths.setdefault(region.path, trail)
    children = []
    groups: list[list[_regions.Region]] = []
    for child in region.children.values():
        last = groups[-1][-1] if groups else None
        if (
            last is not None
            and child.cls
            and last.cls == child.cls
            and last.size == child.size
            and indexed_successor(last.path, child.path)
            and not any(fnmatch.fnmatchcase(child.path, p) for p in state.options.expand)
        ):
            groups[-1].append(child)
        else:
            groups.append([child])
    for group in groups:
        first = group[0]
        child_label = first.label if len(group) == 1 else f"{first.label} … {group[-1].label}"
        for other in group[1:]:  # every member of a group can be opened (--function, search)
            _record_region(state, other, [*trail, [other.key, other.path or other.label]])
        children.append(
            _region_tree(
                state,
                first,
                [*trail, [first.key, first.path or first.label]],
                child_label,
                count * len(group),
                depth + 1,
            )
        )
    return {
        "label": label,
        "cls": region.class_name,
        "count": count,
        "trail": trail,
        "children": children,
        "open": state.is_open(depth),
    }


def _body_params(summary: ModelSummary, body: Body) -> set[ir.Value]:
    if body.owner is not None or body.is_main:  # subgraphs may read the main graph's weights
        return set(summary.model.graph.initializers.values())
    return set()


def _origin(body: Body) -> str | None:
    """The module path a function body was built from (``irkit.outline.origin``)."""
    if not isinstance(body.graph, ir.Function):
        return None
    scope = function_origin(body.graph)
    return scope[-1].call_id if scope else None


def graph_entries(
    summary: ModelSummary,
    bodies: list[Body],
    highlight: Mapping[str, Mapping[ir.Node, str]] | None = None,
    layout: str = "builtin",
) -> dict[str, dict[str, object]]:
    """Describe ``bodies`` and their nodes for the page. ``layout="builtin"``: the drawable
    graph (laid out in the page when opened); ``"dot"``: an SVG from Graphviz (one process)."""
    highlight = highlight or {}
    graphs: dict[str, dict[str, object]] = {}
    drawn: list[tuple[dict[str, object], dict[ir.Node, str]]]
    if layout == "dot":
        dots = [_dot.body_dot(summary, b, highlight=highlight.get(b.key)) for b in bodies]
        svgs = _dot.layout_svg([d.source for d in dots])
        drawn = [
            ({"svg": _dot.strip_xml_header(svg)}, dot.node_ids)
            for dot, svg in zip(dots, svgs, strict=True)
        ]
    else:
        drawn = []
        for b in bodies:
            data = _graph.body_graph(summary, b, highlight=highlight.get(b.key))
            drawn.append(({"graph": data.to_json()}, {n: f"n{k}" for k, n in enumerate(b.graph)}))
    for body, (picture, node_ids) in zip(bodies, drawn, strict=True):
        params = _body_params(summary, body)
        known = dict(zip(body.graph.inputs, body.input_infos, strict=True))
        origin = _origin(body)
        nodes = {
            ident: node_info(summary, node, params, known, origin)
            for node, ident in node_ids.items()
        }
        if body.identifier is not None:
            short, title = body.identifier[1], body.key
        else:
            short = "main" if body.is_main else body.key.rsplit("/", 1)[-1]
            title = f"{summary.name} (main graph)" if body.is_main else body.key
        graphs[body.key] = {
            "title": title,
            "short": short,
            **picture,
            "nodes": nodes,
            "about": body_about(summary, body),
        }
    return graphs


def region_entries(summary: ModelSummary, root: _regions.Region) -> dict[str, dict[str, object]]:
    """Every region of a flat main graph as a page graph: its drawable graph (laid out in the
    page when opened), the cards of its own nodes and of its sub-region boxes."""
    params = set(summary.model.graph.initializers.values())
    types = _graph.TypeMemo()
    drawn = _regions.region_graphs(summary, root, types)
    main_about = body_about(summary, summary.root.body)
    graphs: dict[str, dict[str, object]] = {}
    for region in root.walk():
        nodes: dict[str, object] = {
            f"n{k}": node_info(summary, node, params, types) for k, node in region.direct
        }
        for child in region.children.values():
            lines = _regions.box_lines(child)
            fields = [["module", child.path]] if child.path else []
            if child.cls:
                fields.append(["class", child.cls])
            fields.append(["nodes", str(child.size)])
            nodes[f"r:{child.key}"] = {
                "op": "module" if child.cls else "region",
                "name": child.path or child.label,
                "title": " ".join(lines[:2]),
                "fields": fields,
                "callee": child.key,
                "path": child.path or child.label,
                "inputs": [],
                "outputs": [],
                "attrs": [],
                "meta": [],
                "search": " ".join([child.path, child.cls, child.label]).lower(),
            }
        about = (
            main_about
            if region.key == "main"
            else [
                ["region", region.path or region.label],
                ["class", region.cls],
                ["nodes", str(region.size)],
            ]
        )
        graphs[region.key] = {
            "title": drawn[region.key].title,
            "short": region.path or region.label,
            "graph": drawn[region.key].to_json(),
            "nodes": nodes,
            "about": about,
        }
    return graphs


def _start(summary: ModelSummary, state: _TreeState) -> list[list[str]]:
    """The trail of the body ``--function`` names (a module path opens that very instance)."""
    name = state.options.function
    if name is None or name == "main":
        return [["main", "main"]]
    if name in state.paths:
        return state.paths[name]
    body = summary.find_body(name)
    if body is None:
        names = ", ".join(sorted(summary.bodies))
        raise VizError(f"the model has no function or module {name!r}. Functions: {names}")
    return state.trails[body.key]


def render_html(
    summary: ModelSummary,
    *,
    title: str | None = None,
    options: HtmlOptions = HtmlOptions(),
    layout: str = "builtin",
) -> str:
    """The interactive page for ``summary`` as one self-contained HTML string.

    Args:
        summary: From :func:`irkit.viz.summarize`.
        title: Page title (default: the summary's name).
        options: Initial panel depth, expanded groups, and the body shown first.
        layout: ``"builtin"`` (default): bodies are laid out in the page, when opened, by the
            bundled dagre — nothing to install; a flat model is cut into regions (see
            :mod:`irkit.viz._regions`). ``"dot"``: every body is laid out by Graphviz now.

    Returns:
        The HTML text (no external resources).

    Raises:
        VizError: ``layout="dot"`` and Graphviz is not installed (see
            :data:`irkit.viz._dot.GRAPHVIZ_INSTALL_HINT`), or ``options.function`` names no body.

    Example:
        >>> import onnx_ir as ir
        >>> from irkit.viz import summarize
        >>> m = ir.from_onnx_text('<ir_version: 10, opset_import: ["" : 21]> g (float[2] x) => (float[2] y) { y = Relu(x) }')
        >>> '"Relu"' in render_html(summarize(m))
        True
    """
    title = title or summary.name
    state = _TreeState(options)
    bodies = list(summary.bodies.values())
    flat = not summary.root.children and layout != "dot"
    root = _regions.build_regions(summary.model.graph) if flat else None
    if root is not None and root.children:
        tree = _region_tree(state, root, [["main", "main"]], summary.name, 1, 0)
        graphs = region_entries(summary, root)
        graphs.update(graph_entries(summary, bodies[1:], layout=layout))
    else:
        tree = _tree(state, summary.root, [["main", "main"]], summary.name, 1)
        graphs = graph_entries(summary, bodies, layout=layout)
    for body in bodies:  # functions never called from main: reachable by search only
        state.trails.setdefault(body.key, [["main", "main"], [body.key, body.key]])
    data = {
        "title": title,
        "root": "main",
        "start": _start(summary, state),
        "tree": tree,
        "trails": state.trails,
        "graphs": graphs,
    }
    meta = (
        f"{summary.root.body.node_count} nodes · {len(summary.function_bodies())} functions · "
        f"{format_count(summary.params)} params ({format_bytes(summary.param_bytes)})"
    )
    return page(title, meta, _MAIN, data, asset("dagre.min.js") + "\n" + asset("viewer.js"))


def render_diff_html(diff: _diff.ModelDiff, *, layout: str = "builtin") -> str:
    """The diff as one page: per-module table, then each changed body before | after, laid
    out (igraph, or Graphviz with ``layout="dot"``) with removed nodes red, added green,
    changed yellow."""
    a, b = diff.a, diff.b
    rows = []
    for group in diff.grouped():
        m = group[0]
        label = html.escape(_diff.group_label(group))
        mult = f" ×{len(group)}" if len(group) > 1 else ""
        nodes = "".join(
            f'<div class="del">− {html.escape(_diff.node_text(n))}</div>' for n in m.body.removed
        )
        nodes += "".join(
            f'<div class="add">+ {html.escape(_diff.node_text(n))}</div>' for n in m.body.added
        )
        nodes += "".join(
            f"<div>~ {html.escape(_diff.node_text(x))} → {html.escape(y.op_type)}</div>"
            for x, y in m.body.changed
        )
        delta = (
            html.escape(_diff.delta_text(m.body.ops_delta)) if m.status == "changed" else m.status
        )
        rows.append(
            f"<tr><td class=mono>{label}</td><td>{html.escape(m.cls)}{mult}</td>"
            f"<td>{delta}</td><td class=mono>{nodes}</td></tr>"
        )
    pairs = _diff.changed_bodies(diff)
    pictures = []
    for body_a, body_b, d in pairs:
        hl_a = {n: "removed" for n in d.removed} | {x: "changed" for x, _ in d.changed}
        hl_b = {n: "added" for n in d.added} | {y: "changed" for _, y in d.changed}
        pictures.append((a, body_a, hl_a, f"before: {body_a.key}"))
        pictures.append((b, body_b, hl_b, f"after: {body_b.key}"))
    if layout == "dot":
        sources = [
            _dot.body_dot(s, body, highlight=h, title=t).source for s, body, h, t in pictures
        ]
        svgs = [_dot.strip_xml_header(svg) for svg in _dot.layout_svg(sources)]
    else:
        svgs = [
            _dot.strip_xml_header(
                _svg.layout_graph_svg(_graph.body_graph(s, body, highlight=h, title=t))
            )
            for s, body, h, t in pictures
        ]
    sides = "".join(
        f'<div class="pair"><div><h3>{html.escape(a.name)}</h3>{svgs[2 * i]}</div>'
        f"<div><h3>{html.escape(b.name)}</h3>{svgs[2 * i + 1]}</div></div>"
        for i in range(len(pairs))
    )
    ops = html.escape(_diff.delta_text(diff.ops_delta)) or "none"
    summary_text = "no differences" if not diff else f"{_diff.format_totals(diff)} · ops: {ops}"
    body = (
        '<div style="overflow:auto;flex:1">'
        f"<p style='margin:10px'>{html.escape(summary_text)}</p>"
        "<table class=diff-table><tr><th>module</th><th>class</th><th>op delta</th>"
        f"<th>nodes</th></tr>{''.join(rows)}</table>{sides}</div>"
    )
    title = f"diff {a.name} → {b.name}"
    return page(title, summary_text, body, {}, "")
