"""The module tree of a flat irkit model, read from the ``irkit.scope`` metadata of its nodes.

``irkit.lower`` output (before outlining into functions) has no call nodes, but every node
knows its module call chain; this tree shows that hierarchy in the text dump.
"""

from __future__ import annotations

import dataclasses
import fnmatch
from collections import Counter
from collections.abc import Iterable

import onnx_ir as ir

from irkit import metadata
from irkit.viz._style import Style, indexed_successor, plural, relative_path

__all__ = ["ScopeNode", "scope_tree", "scope_lines", "scope_groups"]


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


def scope_tree(nodes: Iterable[ir.Node]) -> ScopeNode | None:
    """The call tree of ``nodes``' scopes; ``None`` if no node carries ``irkit.scope``."""
    root = ScopeNode(None)
    found = False
    for node in nodes:
        if metadata.SCOPE not in node.metadata_props:
            continue
        found = True
        current = root
        current.nodes += 1
        for frame in metadata.node_scope(node.metadata_props):
            current = current.children.setdefault(frame.call_id, ScopeNode(frame))
            current.nodes += 1
            current.members.append(node)
        current.ops[node.op_type] += 1
    return root if found and root.children else None


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
            assert first.frame is not None
            label = relative_path(first.path, node.path)
            if len(group) > 1:
                label += f" … {relative_path(group[-1].path, node.path)}"
            count = mult * len(group)
            cls = s(first.frame.class_name, "yellow") + (
                s(f" ×{count}", "green") if count > 1 else ""
            )
            detail = plural(first.nodes, "node") + (" each" if count > 1 else "")
            lines.append(
                f"{prefix}{'└─ ' if last else '├─ '}{s(label, 'bold')}  {cls}  " + s(detail, "dim")
            )
            walk(first, prefix + ("   " if last else "│  "), level + 1, count)

    walk(root, "", 0, 1)
    return lines
