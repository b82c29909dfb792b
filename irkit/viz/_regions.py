"""A flat main graph cut into regions the HTML page lays out one at a time.

A model without call nodes (``irkit.lower(..., functions=False)``, or any exporter's flat
output) can have tens of thousands of nodes: no in-page layout draws that at once, and nobody
reads it at once. The regions are the module calls recorded in the nodes' scope metadata (see
:func:`irkit.viz._scopes.node_frames`): the top level shows each top module call as one box,
and opening a box shows its own nodes with its sub-calls as boxes again. A region with more than
:data:`CHUNK` direct nodes (a model without metadata, or a module with many inline ops) is cut
into consecutive runs of nodes, ``nodes 0–399``, ``nodes 400–799``, ….
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import onnx_ir as ir

from irkit.viz._graph import GraphData, TypeMemo, region_graph
from irkit.viz._scopes import node_frames
from irkit.viz._style import format_count
from irkit.viz._summary import ModelSummary

__all__ = ["Region", "build_regions", "CHUNK", "region_graphs"]

CHUNK = 400
"""At most this many items (nodes and sub-region boxes) are drawn in one region."""


@dataclasses.dataclass
class Region:
    """One region: a module call (``path``/``cls``), a run of nodes, or the whole main graph.

    Attributes:
        key: The page's graph key: ``"main"``, ``"scope:<call id>"`` or ``"chunk:<a>-<b>"``.
        path: The module call id (``""`` for the root and for chunks of it).
        label: The box's first line (the path relative to the parent, or ``nodes a–b``).
        cls: Qualified class name (``""`` when unknown).
        direct: ``(index in the main graph, node)`` of the nodes directly in this region.
        children: Sub-regions in order of first node.
        size: Nodes in this region, sub-regions included.
    """

    key: str
    path: str
    label: str
    cls: str = ""
    direct: list[tuple[int, ir.Node]] = dataclasses.field(default_factory=list)
    children: dict[str, Region] = dataclasses.field(default_factory=dict)
    size: int = 0
    first: int = 0

    @property
    def class_name(self) -> str:
        return self.cls.rsplit(".", 1)[-1]

    def walk(self) -> Iterator[Region]:
        yield self
        for child in self.children.values():
            yield from child.walk()

    def nodes(self) -> list[ir.Node]:
        """Every node under this region (sub-regions included), unordered."""
        out = [n for _, n in self.direct]
        for child in self.children.values():
            out += child.nodes()
        return out


def _relative(path: str, parent: str) -> str:
    return path[len(parent) + 1 :] if parent and path.startswith(parent + ".") else path


def build_regions(graph: ir.Graph) -> Region:
    """The region tree of ``graph`` (the main graph of a model without call nodes)."""
    root = Region("main", "", "main")
    for k, node in enumerate(graph):
        region = root
        region.size += 1
        for frame in node_frames(node):
            child = region.children.get(frame.call_id)
            if child is None:
                label = _relative(frame.call_id, region.path)
                child = Region(f"scope:{frame.call_id}", frame.call_id, label, frame.cls, first=k)
                region.children[frame.call_id] = child
            region = child
            region.size += 1
        region.direct.append((k, node))
    for region in list(root.walk()):
        _chunk(region)
    return root


def _chunk(region: Region) -> None:
    """Cut a region with too many direct nodes into runs of :data:`CHUNK` nodes."""
    if len(region.direct) + len(region.children) <= CHUNK:
        return
    direct, region.direct = region.direct, []
    runs: list[Region] = []
    for start in range(0, len(direct), CHUNK):
        run = direct[start : start + CHUNK]
        a, b = run[0][0], run[-1][0]
        key = f"chunk:{region.path}:{a}-{b}" if region.path else f"chunk:{a}-{b}"
        runs.append(Region(key, region.path, f"nodes {a}–{b}", "", run, size=len(run), first=a))
    merged = list(region.children.values()) + runs
    merged.sort(key=lambda r: r.first)
    region.children = {r.key: r for r in merged}
    if len(region.children) > CHUNK:  # thousands of runs: one more level of runs of runs
        groups = list(region.children.values())
        region.children = {}
        for start in range(0, len(groups), CHUNK):
            part = groups[start : start + CHUNK]
            a = part[0].first
            key = f"chunk:{region.path}:group{a}"
            group = Region(key, region.path, f"part from node {a}", "", size=0, first=a)
            for r in part:
                group.children[r.key] = r
                group.size += r.size
            region.children[key] = group


def box_lines(region: Region) -> list[str]:
    """``layers.3`` / ``LlamaDecoderLayer`` / ``120 nodes``."""
    lines = [region.label]
    if region.cls:
        lines.append(region.class_name)
    lines.append(f"{format_count(region.size)} nodes" if region.size != 1 else "1 node")
    return lines


def region_graphs(
    summary: ModelSummary, root: Region, types: TypeMemo | None = None
) -> dict[str, GraphData]:
    """The drawable graph of every region, keyed like :attr:`Region.key`; ``types`` caches
    value types across regions."""
    types = TypeMemo() if types is None else types
    position = {node: k for k, node in enumerate(summary.model.graph)}
    graphs: dict[str, GraphData] = {}
    for region in root.walk():
        title = summary.name + " (main graph)" if region.key == "main" else region.key
        if region.key != "main" and region.cls:
            title = f"{region.path}  {region.class_name}"
        elif region.key.startswith("chunk:"):
            title = f"{region.path or 'main'} › {region.label}"
        members = [(f"n{k}", node) for k, node in region.direct]
        boxes = [
            (f"r:{child.key}", box_lines(child), child.nodes())
            for child in region.children.values()
        ]
        graphs[region.key] = region_graph(title, members, boxes, summary, position, types)
    return graphs
