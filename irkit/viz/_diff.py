"""Hierarchy-aware diff of two models: per module, the nodes of its own body that changed.

Modules are matched by their instance path (``layers.3.mlp``); within a body, nodes are matched
by name first, then by op type. A module's *own* body is compared (its callees are modules of
their own), so a fusion inside ``MLP`` is reported at ``layers.*.mlp`` and nowhere else.
Identical bodies shared by many modules are compared once.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from collections.abc import Sequence

import onnx_ir as ir

from irkit import metadata
from irkit.viz._style import Style, format_count, indexed_successor
from irkit.viz._summary import Body, Call, ModelSummary

__all__ = [
    "BodyDiff",
    "ModuleDiff",
    "ModelDiff",
    "diff_summaries",
    "render_diff_text",
    "diff_json_data",
]


MAX_NODE_LINES = 12
"""Node lines shown per module in the text diff."""


def _signature(node: ir.Node) -> tuple[object, ...]:
    attrs = tuple(sorted((a.name, repr(a.value)) for a in node.attributes.values()))
    return (node.domain, node.op_type, node.overload, attrs, len(node.inputs), len(node.outputs))


def _op(node: ir.Node) -> str:
    return node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}::{node.op_type}"


@dataclasses.dataclass
class BodyDiff:
    """Node-level differences between two bodies (``a`` before, ``b`` after).

    Attributes:
        removed: Nodes of ``a`` with no counterpart in ``b``.
        added: Nodes of ``b`` with no counterpart in ``a``.
        changed: ``(a node, b node)`` pairs with the same name but another op or attributes.
    """

    removed: list[ir.Node] = dataclasses.field(default_factory=list)
    added: list[ir.Node] = dataclasses.field(default_factory=list)
    changed: list[tuple[ir.Node, ir.Node]] = dataclasses.field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.removed or self.added or self.changed)

    @property
    def ops_delta(self) -> Counter[str]:
        delta: Counter[str] = Counter()
        for node in self.added:
            delta[_op(node)] += 1
        for node in self.removed:
            delta[_op(node)] -= 1
        for a, b in self.changed:
            delta[_op(a)] -= 1
            delta[_op(b)] += 1
        return Counter({k: v for k, v in delta.items() if v})


def diff_bodies(a: ir.Graph | ir.Function, b: ir.Graph | ir.Function) -> BodyDiff:
    """Match the nodes of two bodies (by name, then by op type in order) and list the rest."""
    result = BodyDiff()
    a_named = {n.name: n for n in a if n.name}
    b_named = {n.name: n for n in b if n.name}
    rest_a = [n for n in a if not n.name or n.name not in b_named]
    rest_b = [n for n in b if not n.name or n.name not in a_named]
    for name, node in a_named.items():
        other = b_named.get(name)
        if other is not None and _signature(node) != _signature(other):
            result.changed.append((node, other))
    pool: dict[tuple[object, ...], list[ir.Node]] = {}
    for node in rest_b:
        pool.setdefault(_signature(node), []).append(node)
    for node in rest_a:
        candidates = pool.get(_signature(node))
        if candidates:
            candidates.pop(0)
        else:
            result.removed.append(node)
    matched_b = {id(n) for nodes in pool.values() for n in nodes}
    result.added = [n for n in rest_b if id(n) in matched_b]
    return result


@dataclasses.dataclass
class ModuleDiff:
    """One module (call instance) whose own body differs, or that exists on one side only.

    Attributes:
        path: Instance path (``""`` for the main graph).
        cls: Class name (from whichever side has it).
        status: ``"changed"``, ``"added"`` (only in ``b``) or ``"removed"`` (only in ``a``).
        body: The node-level diff (empty for added/removed modules).
        a: The call in model ``a`` (``None`` if added).
        b: The call in model ``b`` (``None`` if removed).
    """

    path: str
    cls: str
    status: str
    body: BodyDiff
    a: Call | None
    b: Call | None

    def key(self) -> tuple[object, ...]:
        keys = (self.a.body.key if self.a else None, self.b.body.key if self.b else None)
        return (self.status, keys, tuple(sorted(self.body.ops_delta.items())))


@dataclasses.dataclass
class ModelDiff:
    """The diff of two models. Empty (falsy) when the models have the same hierarchy and bodies.

    Attributes:
        a: Summary of the first model (before).
        b: Summary of the second model (after).
        modules: Differing modules in tree order (``a``'s order, then modules only in ``b``).
        ops_delta: Executed-op histogram of ``b`` minus ``a`` (zeros dropped).
    """

    a: ModelSummary
    b: ModelSummary
    modules: list[ModuleDiff]
    ops_delta: Counter[str]

    def __bool__(self) -> bool:
        return bool(self.modules or self.ops_delta)

    def grouped(self) -> list[list[ModuleDiff]]:
        """Runs like ``layers.0.mlp … layers.63.mlp`` with the same change, merged."""
        groups: list[list[ModuleDiff]] = []
        for m in self.modules:
            last = groups[-1][-1] if groups else None
            if last is not None and last.key() == m.key() and _successor(last.path, m.path):
                groups[-1].append(m)
            else:
                groups.append([m])
        return groups


def _successor(prev: str, path: str) -> bool:
    """``layers.4.mlp`` follows ``layers.3.mlp`` (one index component one higher)."""
    pa, pb = prev.split("."), path.split(".")
    if len(pa) != len(pb):
        return False
    diffs = [(x, y) for x, y in zip(pa, pb, strict=True) if x != y]
    return len(diffs) == 1 and indexed_successor(*diffs[0])


def diff_summaries(a: ModelSummary, b: ModelSummary) -> ModelDiff:
    """Compare two models module by module (neither is modified).

    Example:
        >>> import onnx_ir as ir
        >>> from irkit.viz import summarize
        >>> m = ir.from_onnx_text('<ir_version: 10, opset_import: ["" : 21]> g (float[2] x) => (float[2] y) { y = Relu(x) }')
        >>> bool(diff_summaries(summarize(m), summarize(m)))
        False
    """
    calls_a = {c.path: c for c in a.root.walk()}
    calls_b = {c.path: c for c in b.root.walk()}
    cache: dict[tuple[str, str], BodyDiff] = {}
    modules: list[ModuleDiff] = []
    for path, ca in calls_a.items():
        cb = calls_b.get(path)
        if cb is None:
            modules.append(ModuleDiff(path, ca.class_name, "removed", BodyDiff(), ca, None))
            continue
        pair = (ca.body.key, cb.body.key)
        if pair not in cache:
            cache[pair] = diff_bodies(ca.body.graph, cb.body.graph)
        if not cache[pair]:
            continue
        module = ModuleDiff(path, cb.class_name, "changed", cache[pair], ca, cb)
        modules.extend(_split_by_scope(module) if ca.node is None else [module])
    modules += [
        ModuleDiff(path, cb.class_name, "added", BodyDiff(), None, cb)
        for path, cb in calls_b.items()
        if path not in calls_a
    ]
    delta = Counter(b.root.body.ops)
    delta.subtract(a.root.body.ops)
    return ModelDiff(a, b, modules, Counter({k: v for k, v in delta.items() if v}))


def _scope_key(node: ir.Node) -> tuple[str, str]:
    from irkit.viz._scopes import node_frames

    scope = node_frames(node)
    return (scope[-1].call_id, scope[-1].class_name) if scope else ("", "")


def _split_by_scope(main: ModuleDiff) -> list[ModuleDiff]:
    """Attribute main-graph changes to the modules named by the nodes' ``irkit.scope`` (a flat
    model, or nodes left inline); nodes without scope stay with the main graph."""
    parts: dict[str, ModuleDiff] = {}

    def part(node: ir.Node) -> BodyDiff:
        path, cls = _scope_key(node)
        if path not in parts:
            parts[path] = ModuleDiff(path, cls or main.cls, "changed", BodyDiff(), main.a, main.b)
        return parts[path].body

    for node in main.body.removed:
        part(node).removed.append(node)
    for node in main.body.added:
        part(node).added.append(node)
    for old, new in main.body.changed:
        part(new).changed.append((old, new))
    return list(parts.values())


def delta_text(delta: Counter[str]) -> str:
    return ", ".join(f"{k} {v:+d}" for k, v in sorted(delta.items(), key=lambda kv: (kv[1], kv[0])))


def node_text(node: ir.Node) -> str:
    """``Op  name  [rule r]``."""
    text = f"{_op(node)}  {node.name or '(unnamed)'}"
    rule = node.metadata_props.get(metadata.REWRITE_RULE)
    return text + (f"  [rule {rule}]" if rule else "")


def group_label(group: Sequence[ModuleDiff]) -> str:
    first = group[0].path or "(main graph)"
    return first if len(group) == 1 else f"{first} … {group[-1].path}"


def render_diff_text(diff: ModelDiff, color: bool = False) -> str:
    """The diff as text: totals, op histogram delta, then each differing module (grouped)."""
    s = Style(color)
    a, b = diff.a, diff.b
    lines = [s(f"diff {a.name} → {b.name}", "bold")]
    if not diff:
        return "\n".join([*lines, "no differences"]) + "\n"
    na, nb = a.root.body.node_count, b.root.body.node_count
    sa = sum(x.stored_nodes for x in a.bodies.values())
    sb = sum(x.stored_nodes for x in b.bodies.values())
    lines.append(
        f"nodes {na} → {nb} ({nb - na:+d}) · stored {sa} → {sb} ({sb - sa:+d}) · "
        f"functions {len(a.function_bodies())} → {len(b.function_bodies())}"
    )
    if diff.ops_delta:
        lines.append("ops: " + delta_text(diff.ops_delta))
    lines.append(s("modules:", "bold"))
    for group in diff.grouped():
        m = group[0]
        mult = s(f" ×{len(group)}", "green") if len(group) > 1 else ""
        head = f"  {s(group_label(group), 'bold')}  {s(m.cls, 'yellow')}{mult}  "
        if m.status != "changed":
            lines.append(
                head + s(f"module {m.status}", "red" if m.status == "removed" else "green")
            )
            continue
        lines.append(head + delta_text(m.body.ops_delta) + (" each" if len(group) > 1 else ""))
        items = [s(f"    - {node_text(n)}", "red") for n in m.body.removed]
        items += [s(f"    + {node_text(n)}", "green") for n in m.body.added]
        items += [s(f"    ~ {node_text(x)} → {_op(y)}", "yellow") for x, y in m.body.changed]
        lines.extend(items[:MAX_NODE_LINES])
        if len(items) > MAX_NODE_LINES:
            lines.append(
                s(f"    … {len(items) - MAX_NODE_LINES} more (--format json lists all)", "dim")
            )
    return "\n".join(lines) + "\n"


def diff_json_data(diff: ModelDiff) -> dict[str, object]:
    """The diff as JSON-able data (schema ``irkit.viz.diff/1``, see docs/viz.md)."""

    def nodes(items: Sequence[ir.Node]) -> list[dict[str, str]]:
        return [{"op": _op(n), "name": n.name or ""} for n in items]

    modules = []
    for m in diff.modules:
        modules.append(
            {
                "path": m.path,
                "class": m.cls,
                "status": m.status,
                "ops_delta": dict(sorted(m.body.ops_delta.items())),
                "removed": nodes(m.body.removed),
                "added": nodes(m.body.added),
                "changed": [
                    {"from": nodes([x])[0], "to": nodes([y])[0]} for x, y in m.body.changed
                ],
            }
        )
    return {
        "schema": "irkit.viz.diff/1",
        "a": diff.a.name,
        "b": diff.b.name,
        "nodes": [diff.a.root.body.node_count, diff.b.root.body.node_count],
        "ops_delta": dict(sorted(diff.ops_delta.items())),
        "modules": modules,
    }


def render_diff_json(diff: ModelDiff) -> str:
    return json.dumps(diff_json_data(diff), indent=1, ensure_ascii=False) + "\n"


def changed_bodies(diff: ModelDiff) -> list[tuple[Body, Body, BodyDiff]]:
    """Distinct ``(body a, body b, diff)`` pairs among the changed modules."""
    seen: dict[tuple[str, str], tuple[Body, Body, BodyDiff]] = {}
    for m in diff.modules:
        if m.status == "changed" and m.a is not None and m.b is not None:
            seen.setdefault((m.a.body.key, m.b.body.key), (m.a.body, m.b.body, m.body))
    return list(seen.values())


def format_totals(diff: ModelDiff) -> str:
    na, nb = diff.a.root.body.node_count, diff.b.root.body.node_count
    return f"{format_count(na)} → {format_count(nb)} nodes ({nb - na:+d})"
