"""The terminal dump: call tree, op histogram, inputs/outputs; and one function body."""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from collections.abc import Sequence

import onnx_ir as ir

from irkit import metadata
from irkit.viz import _scopes
from irkit.viz._style import CallGroup, Style, format_bytes, format_count, group_calls, plural
from irkit.viz._summary import Body, Call, ModelSummary, TensorInfo, call_sites

__all__ = ["TextOptions", "render_text", "render_function_text"]

_WIDTH = 100


@dataclasses.dataclass(frozen=True)
class TextOptions:
    """How :func:`render_text` draws the tree.

    Attributes:
        depth: Deepest call level shown (``None``: all; 1: only the main graph's calls).
        expand: Module-path globs whose grouped calls are listed one by one.
        stats: Add FLOPs and op counts to every call line, and a per-function table.
        color: Use ANSI colours.
    """

    depth: int | None = None
    expand: tuple[str, ...] = ()
    stats: bool = False
    color: bool = False


def _outputs_text(outputs: Sequence[TensorInfo]) -> str:
    return ", ".join(o.type_text() for o in outputs)


def _params_text(params: int, nbytes: int) -> str:
    return f"{format_count(params)} params ({format_bytes(nbytes)})" if params else ""


def _top_ops(ops: Counter[str], limit: int = 6) -> str:
    items = sorted(ops.items(), key=lambda kv: (-kv[1], kv[0]))
    text = ", ".join(op if n == 1 else f"{op} ×{n}" for op, n in items[:limit])
    return text + (", …" if len(items) > limit else "")


class _TreeWriter:
    def __init__(self, options: TextOptions):
        self.options = options
        self.s = Style(options.color)
        self.lines: list[str] = []

    def call_line(self, group: CallGroup, parent: Call, mult: int) -> str:
        s, call = self.s, group.first
        count = mult * len(group.calls)
        parts = [s(group.label(parent.path), "bold"), s(call.class_name, "yellow")]
        if count > 1:
            parts[-1] += s(f" ×{count}", "green", "bold")
        each = " each" if count > 1 else ""
        detail = [plural(call.body.node_count, "node")]
        if call.params:
            detail.append(_params_text(call.params, call.param_bytes))
        line = "  ".join(parts) + "  " + s(" · ".join(detail) + each, "dim")
        if call.outputs:
            line += "  → " + s(_outputs_text(call.outputs), "cyan")
        if note := body_note(call, count):
            line += s(f"  [{note}]", "dim")
        return line

    def stats_line(self, call: Call) -> str:
        flops = call.body.flops
        return self.s(f"flops {flops.text()} · ops {_top_ops(call.body.ops)}", "dim")

    def write_children(self, call: Call, prefix: str, mult: int) -> None:
        depth = self.options.depth
        if depth is not None and call.depth >= depth:
            return
        groups = group_calls(call.children, self.options.expand)
        items: list[CallGroup | None] = [*groups]
        if call.children and call.body.own_ops:
            items.append(None)  # the body's own ops, summarised last
        for i, group in enumerate(items):
            last = i == len(items) - 1
            branch, cont = ("└─ ", "   ") if last else ("├─ ", "│  ")
            if group is None:
                n = sum(call.body.own_ops.values())
                text = f"· {n} op{'s' if n > 1 else ''}: {_top_ops(call.body.own_ops)}"
                self.lines.append(prefix + branch + self.s(text, "dim"))
                continue
            self.lines.append(prefix + branch + self.call_line(group, call, mult))
            if self.options.stats:
                self.lines.append(prefix + cont + "  " + self.stats_line(group.first))
            self.write_children(group.first, prefix + cont, mult * len(group.calls))


def body_note(call: Call, count: int) -> str:
    """``"body Linear_1 shared by 4 calls"``: the function's name when it is not the class's
    (a variant such as ``Linear_1``, for ``--function``), and how many calls share the body
    when more than the ``count`` a line stands for."""
    name = call.function_name if call.function_name != call.class_name else ""
    shared = call.body.calls > count
    if not name and not shared:
        return ""
    text = f"body {name}" if name else "body"
    return f"{text} shared by {call.body.calls} calls" if shared else text


_INDEX = re.compile(r"(?<=\.)\d+(?=\.|$)|^\d+(?=\.|$)")


def callers_text(sites: Sequence[Call], limit: int = 3) -> str:
    """The call sites' module paths with indices as ``*``: ``layers.*.attn.k_proj, …``."""
    patterns = list(dict.fromkeys(_INDEX.sub("*", c.path) for c in sites))
    return ", ".join(patterns[:limit]) + (", …" if len(patterns) > limit else "")


def _io_lines(title: str, values: Sequence[TensorInfo], s: Style) -> list[str]:
    lines = [s(f"{title}:", "bold")]
    width = max((len(v.name) for v in values), default=0)
    lines.extend(f"  {v.name.ljust(width)}  {s(v.type_text(), 'cyan')}" for v in values)
    if not values:
        lines.append("  (none)")
    return lines


def _histogram_lines(ops: Counter[str], s: Style) -> list[str]:
    cells = [f"{op} {n}" for op, n in sorted(ops.items(), key=lambda kv: (-kv[1], kv[0]))]
    width = max((len(c) for c in cells), default=0) + 3
    per_line = max(1, (_WIDTH - 2) // width)
    lines = []
    for i in range(0, len(cells), per_line):
        lines.append("  " + "".join(c.ljust(width) for c in cells[i : i + per_line]).rstrip())
    return lines


def _function_table(summary: ModelSummary, s: Style) -> list[str]:
    lines = [s("functions:", "bold")]
    bodies = sorted(summary.function_bodies(), key=lambda b: b.key)
    width = max((len(b.key) for b in bodies), default=0)
    for b in bodies:
        flops = f"flops/call {b.flops.text()}"
        line = (
            f"  {b.key.ljust(width)}  calls {b.calls:<4} nodes {b.node_count:<6} "
            f"stored {b.stored_nodes:<5} {flops:<20} {callers_text(call_sites(summary, b.key))}"
        )
        lines.append(line.rstrip())
    return lines


def render_text(summary: ModelSummary, options: TextOptions = TextOptions()) -> str:
    """The default dump: call tree, op histogram, inputs and outputs.

    Args:
        summary: From :func:`irkit.viz.summarize`.
        options: Depth, expansion, stats, colour.

    Returns:
        The text, ending with a newline. Without colour the output is deterministic.

    Example:
        >>> import onnx_ir as ir
        >>> from irkit.viz import summarize
        >>> m = ir.from_onnx_text('<ir_version: 10, opset_import: ["" : 21]> g (float[2] x) => (float[2] y) { y = Relu(x) }')
        >>> print(render_text(summarize(m)).splitlines()[0])
        g  1 node (1 stored in 1 graph)
    """
    s = Style(options.color)
    root = summary.root
    stored = sum(b.stored_nodes for b in summary.bodies.values())
    graphs = len(summary.bodies)
    head = f"{plural(root.body.node_count, 'node')} ({stored} stored in {plural(graphs, 'graph')})"
    if summary.function_bodies():
        head += ", " + plural(len(summary.function_bodies()), "function")
    if summary.params:
        head += ", " + _params_text(summary.params, summary.param_bytes)
    writer = _TreeWriter(options)
    writer.lines.append(f"{s(summary.name, 'bold')}  {s(head, 'dim')}")
    if options.stats:
        writer.lines.append("   " + writer.stats_line(root))
    writer.write_children(root, "", 1)
    lines = writer.lines
    if not root.children:
        scopes = _scopes.scope_tree(summary.model.graph)
        if scopes is not None:
            source = _scopes.scope_source(summary.model.graph)
            lines.append(s(f"modules (from {source}; not outlined into functions):", "dim"))
            lines += _scopes.scope_lines(scopes, s, options.depth, options.expand)
    lines += ["", s("ops:", "bold"), *_histogram_lines(root.body.ops, s), ""]
    if options.stats and summary.function_bodies():
        lines += [*_function_table(summary, s), ""]
    lines += _io_lines("inputs", summary.inputs, s)
    lines += _io_lines("outputs", summary.outputs, s)
    return "\n".join(lines) + "\n"


def attr_text(attr: ir.Attr) -> str:
    value = attr.value
    if isinstance(value, ir.TensorProtocol):
        text = f"tensor {value.dtype.short_name()}{list(value.shape)}"
    elif isinstance(value, (ir.Graph, ir.GraphProtocol)):
        text = "graph"
    else:
        text = repr(value)
    return f"{attr.name}={text if len(text) <= 40 else text[:37] + '...'}"


def node_line(node: ir.Node, s: Style, summary: ModelSummary) -> str:
    """``out = Op(in1, in2) <attr=...>  # f32[..]  @ file:line  [rule]``."""
    outs = ", ".join(v.name or "_" for v in node.outputs)
    ins = ", ".join("" if v is None else (v.name or "_") for v in node.inputs)
    key = (node.domain, node.op_type, node.overload)
    is_call = key in summary.model.functions
    op = f"{node.domain}::{node.op_type}" if node.domain not in ("", "ai.onnx") else node.op_type
    text = f"{outs} = {s(op, 'yellow' if is_call else 'cyan')}({ins})"
    if node.attributes:
        text += " <" + ", ".join(attr_text(a) for a in node.attributes.values()) + ">"
    notes = [_outputs_text([TensorInfo.of(v) for v in node.outputs])]
    if source := node.metadata_props.get(metadata.SOURCE):
        notes.append(f"@ {source}")
    if is_call and (name := summary.call_names.get(node)):
        notes.append(f"call {name}")
    if rule := node.metadata_props.get(metadata.REWRITE_RULE):
        notes.append(f"[rule {rule}]")
    return f"  {text}  " + s("# " + "  ".join(notes), "dim")


def render_function_text(summary: ModelSummary, body: Body, color: bool = False) -> str:
    """One body (a function or ``main``) node by node, with shapes and provenance."""
    s = Style(color)
    sites = call_sites(summary, body.key)
    title = "graph main" if body.is_main else f"function {body.key}"
    if body.owner is not None:
        title = f"subgraph {body.key} of {body.owner.op_type}"
    head = f"{body.stored_nodes} nodes stored, {body.node_count} executed per call"
    if sites:
        groups = group_calls(sites)
        head += f", called {len(sites)}×: " + ", ".join(g.label("") for g in groups[:4])
        head += ", …" if len(groups) > 4 else ""
    lines = [f"{s(title, 'bold')}  {s(head, 'dim')}"]
    initializers = set(summary.model.graph.initializers) if body.is_main else set()
    inputs = [i for i in body.input_infos if i.name not in initializers]
    lines += _io_lines("inputs", inputs, s)
    lines.append(s("nodes:", "bold"))
    lines.extend(node_line(node, s, summary) for node in body.graph)
    lines += _io_lines("outputs", [TensorInfo.of(v) for v in body.graph.outputs], s)
    return "\n".join(lines) + "\n"
