"""The module tree of a flat model, read from the scope metadata of its nodes.

``irkit.lower`` output (before outlining into functions) has no call nodes, but every node
knows its module call chain (``irkit.scope``); other exporters write it too: PyTorch's
``torch.onnx.export(..., dynamo=True)`` writes ``pkg.torch.onnx.name_scopes`` (``['',
'layers.0', 'layers.0.l', 'linear']``: the root, the module paths, then the FX node) with
``pkg.torch.onnx.class_hierarchy`` beside it, and ``namespace`` (``": M/layers.0: A/linear:
aten.linear.default"``). This tree shows that hierarchy in the text dump, the JSON and the HTML.
"""

from __future__ import annotations

import ast
import dataclasses
import fnmatch
import json
import logging
from collections import Counter
from collections.abc import Iterable

import onnx_ir as ir

from irkit import metadata
from irkit._scope_tree import Scope, ScopeTree
from irkit.viz._style import Style, indexed_successor, plural
from irkit.viz._summary import relative_name, scope_of

logger = logging.getLogger(__name__)

__all__ = ["ScopeNode", "scope_tree", "scope_lines", "scope_groups", "node_frames", "scope_source"]

TORCH_NAME_SCOPES = "pkg.torch.onnx.name_scopes"
TORCH_CLASS_HIERARCHY = "pkg.torch.onnx.class_hierarchy"
NAMESPACE = "namespace"


def _literal_list(text: str) -> list[str] | None:
    """A Python-repr list of strings (``"['', 'layers.0']"``), the way torch writes them."""
    if '"' not in text and "\\" not in text:  # the usual case: a JSON list once quoted "
        try:
            value = json.loads(text.replace("'", '"'))
        except ValueError:
            value = None
        if isinstance(value, list) and all(isinstance(x, str) for x in value):
            return value
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None
    if isinstance(value, (list, tuple)) and all(isinstance(x, str) for x in value):
        return list(value)
    return None


def scope_source(nodes: Iterable[ir.Node]) -> str:
    """The metadata key the scopes of ``nodes`` are read from (the first node that has one)."""
    for node in nodes:
        for key in (metadata.SCOPE, TORCH_NAME_SCOPES, NAMESPACE):
            if key in node.metadata_props:
                return key
    return metadata.SCOPE


def node_frames(node: ir.Node) -> tuple[metadata.Frame, ...]:
    """The module calls enclosing ``node``, outermost first: from ``irkit.scope``, else from
    PyTorch's ``pkg.torch.onnx.name_scopes`` (+ ``class_hierarchy``), else from ``namespace``.
    Malformed metadata counts as none (logged at debug level)."""
    props = node.metadata_props
    if metadata.SCOPE in props:
        return scope_of(node)
    if TORCH_NAME_SCOPES in props:
        names = _literal_list(props[TORCH_NAME_SCOPES]) or []
        classes = _literal_list(props.get(TORCH_CLASS_HIERARCHY, "[]")) or []
        if len(classes) != len(names):
            classes = [""] * len(names)
        # First entry: the root module; last: the FX node itself.
        return tuple(
            metadata.Frame(name, 0, cls)
            for name, cls in zip(names[1:-1], classes[1:-1], strict=True)
            if name
        )
    if NAMESPACE in props:
        parts = [p.split(": ", 1) for p in props[NAMESPACE].split("/")]
        return tuple(
            metadata.Frame(p[0].strip(), 0, p[1].strip() if len(p) > 1 else "")
            for p in parts[1:-1]
            if p[0].strip()
        )
    return ()


@dataclasses.dataclass
class ScopeNode:
    """One module call: its frame, the nodes under it (recursive), and its sub-calls in order."""

    frame: metadata.Frame | None
    nodes: int = 0
    ops: Counter[str] = dataclasses.field(default_factory=Counter)
    children: dict[str, ScopeNode] = dataclasses.field(default_factory=dict)
    members: list[ir.Node] = dataclasses.field(default_factory=list)
    """Every node under this call (sub-calls included), in graph order."""

    @property
    def path(self) -> str:
        return self.frame.call_id if self.frame else ""

    @property
    def cls(self) -> str:
        """The module's class, qualified (``""`` for the root)."""
        return self.frame.cls if self.frame else ""

    @property
    def class_name(self) -> str:
        """The module's class name (``""`` for the root)."""
        return self.frame.class_name if self.frame else ""


def scope_tree(nodes: Iterable[ir.Node]) -> ScopeNode | None:
    """The call tree of ``nodes``' scopes (see :func:`node_frames`); ``None`` if no node
    carries scope metadata."""
    ordered = list(nodes)
    tree = ScopeTree(ordered, scope_of=node_frames)
    if not tree.children[()]:
        return None
    position = {node: i for i, node in enumerate(ordered)}
    root = ScopeNode(None)
    _add_children(root, tree.children[()], tree, position)
    root.nodes = sum(child.nodes for child in root.children.values())
    return root


def _add_children(
    parent: ScopeNode, calls: list[Scope], tree: ScopeTree, position: dict[ir.Node, int]
) -> None:
    """Add the child ``calls`` of ``parent``, calls with one call id (``layers.0``) as one node,
    in the order of their first node."""
    groups: dict[str, list[Scope]] = {}
    for call in calls:
        groups.setdefault(call[-1].call_id, []).append(call)
    children = []
    for group in groups.values():
        child = ScopeNode(group[0][-1])
        child.members = sorted(
            (n for call in group for n in tree.nodes(call)), key=position.__getitem__
        )
        child.nodes = len(child.members)
        child.ops.update(n.op_type for call in group for n in tree.members[call])
        _add_children(child, [c for call in group for c in tree.children[call]], tree, position)
        children.append(child)
    for child in sorted(children, key=lambda c: position[c.members[0]]):
        parent.children[child.path] = child


def scope_groups(children: list[ScopeNode], expand: tuple[str, ...] = ()) -> list[list[ScopeNode]]:
    """Runs of sibling calls of one class and size with indexed paths (``h.0 … h.11``)."""

    groups: list[list[ScopeNode]] = []
    for child in children:
        last = groups[-1][-1] if groups else None
        same = (
            last is not None
            and last.frame is not None
            and child.frame is not None
            and last.frame.cls == child.frame.cls
            and last.nodes == child.nodes
            and indexed_successor(last.path, child.path)
            and not any(fnmatch.fnmatchcase(child.path, p) for p in expand)
        )
        if same:
            groups[-1].append(child)
        else:
            groups.append([child])
    return groups


def scope_lines(
    root: ScopeNode, s: Style, depth: int | None = None, expand: tuple[str, ...] = ()
) -> list[str]:
    """Tree lines like the call tree: ``layers.0 … layers.3  Block ×4  25 nodes each``."""
    lines: list[str] = []

    def walk(node: ScopeNode, prefix: str, level: int, mult: int) -> None:
        if depth is not None and level >= depth:
            return
        groups = scope_groups(list(node.children.values()), expand)
        for i, group in enumerate(groups):
            last = i == len(groups) - 1
            first = group[0]
            label = relative_name(first.path, node.path)
            if len(group) > 1:
                label += f" … {relative_name(group[-1].path, node.path)}"
            count = mult * len(group)
            cls = s(first.class_name, "yellow") + (s(f" ×{count}", "green") if count > 1 else "")
            detail = plural(first.nodes, "node") + (" each" if count > 1 else "")
            lines.append(
                f"{prefix}{'└─ ' if last else '├─ '}{s(label, 'bold')}  {cls}  " + s(detail, "dim")
            )
            walk(first, prefix + ("   " if last else "│  "), level + 1, count)

    walk(root, "", 0, 1)
    return lines
