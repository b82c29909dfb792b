"""Nesting analysis: the dataflow DAG of the ONNX nodes (the scope tree of module calls is
:class:`irkit._scope_tree.ScopeTree`, shared with the rewrite engine's guard and viz).

* The **dataflow DAG** has one node per ONNX node, an edge producer → consumer. It is the graph
  itself (values know their producer and uses); only the span of a non-contiguous region is
  copied into a small :class:`networkx.DiGraph` for the cycle and reachability checks.

Outlining contracts regions of the DAG bottom-up (:meth:`Dataflow.plan` / :meth:`Dataflow.contract`).
Contracting a set of nodes keeps a DAG acyclic exactly when the set is *convex*: no path leaves
it and comes back. Every path that leaves a region R and re-enters it runs through nodes whose
positions in any topological order lie between the first and last node of R, so the check only
looks at that *span*: the span's outside nodes plus R contracted to one node must be acyclic.
For the usual contiguous region the span holds no outside node and the check is O(|R|); the
positions are kept as a valid topological order after each contraction, so the total cost stays
about O(nodes x depth) with a small constant.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from collections.abc import Set as AbstractSet
from typing import TYPE_CHECKING

import onnx_ir as ir

from irkit._irutil import node_subgraphs
from irkit._scope_tree import Scope

if TYPE_CHECKING:
    import networkx as nx

__all__ = [
    "Scope",
    "Dataflow",
    "ContractionPlan",
    "has_subgraph",
    "used_outside",
    "SUBGRAPH_OPS",
    "captured_uses",
    "nested_nodes",
]

_REGION = "<region>"


_SUBGRAPH = (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS)


def has_subgraph(node: ir.Node) -> bool:
    """Whether ``node`` owns a subgraph (If, Loop, Scan, or any op with a graph attribute)."""
    for attr in node.attributes.data.values():  # noqa: SIM110 (no generator: runs per node)
        if attr.type in _SUBGRAPH:
            return True
    return False


SUBGRAPH_OPS = frozenset({"If", "Loop", "Scan"})
"""Standard ops whose subgraphs outlining and dedupe see through (their reads of outer values
count as inputs of the op). A module holding another op with a graph attribute is left inline."""


def nested_nodes(node: ir.Node) -> list[ir.Node]:
    """Every node inside ``node``'s subgraphs, at any depth, in order."""
    return [
        inner
        for graph in node_subgraphs(node)
        for inner in ir.traversal.RecursiveGraphIterator(graph)
    ]


def captured_uses(node: ir.Node) -> list[tuple[ir.Node, int, ir.Value]]:
    """Each read, inside ``node``'s subgraphs, of a value defined outside ``node``.

    ONNX subgraphs read values of enclosing graphs by name (an ``If`` branch has no inputs);
    for outlining such a read is an input of ``node``. Returns ``(inner node, input index,
    value)`` in node order.
    """
    inner = nested_nodes(node)
    defined: set[ir.Value] = set()
    for graph in _all_subgraphs(node):
        defined.update(graph.inputs)
        defined.update(graph.initializers.values())
    for n in inner:
        defined.update(n.outputs)
    return [
        (n, i, v)
        for n in inner
        for i, v in enumerate(n.inputs)
        if v is not None and v not in defined
    ]


def _all_subgraphs(node: ir.Node) -> list[ir.Graph]:
    graphs = []
    for graph in node_subgraphs(node):
        graphs.append(graph)
        for inner in ir.traversal.RecursiveGraphIterator(graph):
            graphs.extend(node_subgraphs(inner))
    return graphs


def used_outside(value: ir.Value, region: AbstractSet[ir.Node]) -> bool:
    """Whether ``value`` is a graph output or read by a node that is not in ``region``."""
    if value.is_graph_output():
        return True
    for use in value.uses():  # noqa: SIM110 (no generator: runs per value)
        if use.node not in region:
            return True
    return False


@dataclasses.dataclass
class ContractionPlan:
    """What :meth:`Dataflow.plan` found out about a region (only built for convex regions)."""

    region: set[ir.Node]
    lo: int
    hi: int
    before: list[ir.Node]  # outside nodes of the span that must stay before the region
    after: list[ir.Node]  # outside nodes of the span that may follow it


class Dataflow:
    """The dataflow DAG of a graph's nodes, contracted region by region.

    The DAG is the graph itself: an edge producer → consumer per use of a value (``ir.Value``
    tracks its uses), where a use inside an If/Loop/Scan body counts as a use by the node that
    owns the body. Outlining rewires the graph as it contracts regions, so the edges stay
    current for free; this class keeps the positions of a topological order and, for the rare
    non-contiguous region, builds a small :class:`networkx.DiGraph` of the span.

    Args:
        nodes: The graph's nodes in a topological order.
    """

    def __init__(self, nodes: Sequence[ir.Node]):
        self.order: list[ir.Node | None] = list(nodes)
        self.pos: dict[ir.Node, int] = {n: i for i, n in enumerate(nodes)}
        self.reordered = False
        self.control_flow: set[ir.Node] = {n for n in nodes if has_subgraph(n)}
        self._owner: dict[ir.Node, ir.Node] = {}  # node inside a subgraph → its top-level node
        for node in self.control_flow:
            for graph in node_subgraphs(node):
                for inner in ir.traversal.RecursiveGraphIterator(graph):
                    self._owner[inner] = node

    def successors(self, node: ir.Node) -> set[ir.Node]:
        """The current nodes that use an output of ``node``."""
        owner, pos = self._owner, self.pos
        result = set()
        for value in node.outputs:
            for use in value.uses():
                user = owner.get(use.node, use.node) if owner else use.node
                if user in pos:
                    result.add(user)
        return result

    def _span_graph(self, span: Sequence[ir.Node], merged: set[ir.Node]) -> nx.DiGraph:
        """The DAG restricted to ``span``, with the nodes of ``merged`` contracted to one node."""
        import networkx as nx  # (imported on use: keeps `import irkit` fast)

        inside = set(span)
        graph = nx.DiGraph()
        graph.add_node(_REGION)
        graph.add_nodes_from(n for n in span if n not in merged)
        for node in span:
            src = _REGION if node in merged else node
            for succ in self.successors(node):
                if succ in inside:
                    dst = _REGION if succ in merged else succ
                    if dst != src:
                        graph.add_edge(src, dst)
        return graph

    def plan(self, region: Iterable[ir.Node]) -> ContractionPlan | list[ir.Node]:
        """Check that ``region`` is convex.

        Returns:
            A :class:`ContractionPlan` if it is, else the outside nodes on a path that leaves the
            region and re-enters it (a witness for the note).
        """
        import networkx as nx

        region = set(region)
        positions = [self.pos[n] for n in region]
        lo, hi = min(positions), max(positions)
        outside = [n for n in self.order[lo : hi + 1] if n is not None and n not in region]
        if not outside:
            return ContractionPlan(region, lo, hi, [], [])
        small = self._span_graph([*outside, *region], region)
        if not nx.is_directed_acyclic_graph(small):
            cycle = nx.find_cycle(small, _REGION)
            return [u for u, _ in cycle if u != _REGION]
        must_precede = nx.ancestors(small, _REGION)
        before = [n for n in outside if n in must_precede]
        after = [n for n in outside if n not in must_precede]
        return ContractionPlan(region, lo, hi, before, after)

    def contract(self, plan: ContractionPlan, new_node: ir.Node) -> None:
        """Replace the planned region by ``new_node``, keeping ``order`` topological.

        A region whose span held outside nodes sets :attr:`reordered`: the graph's own node
        list (where the new node took the region's first place) needs a sort afterwards.
        """
        if plan.before or plan.after:
            self.reordered = True
        for n in plan.region:
            del self.pos[n]
        new_span = [*plan.before, new_node, *plan.after]
        self.order[plan.lo : plan.hi + 1] = new_span + [None] * (
            plan.hi + 1 - plan.lo - len(new_span)
        )
        for offset, node in enumerate(new_span):
            self.pos[node] = plan.lo + offset

    def first_convex_part(self, region: Iterable[ir.Node]) -> set[ir.Node]:
        """The largest convex *prefix* of a non-convex region.

        A region node is *late* if it can be reached from an outside node that the region
        reaches (the path left and came back); the others are *early*. The early nodes form a
        convex set (a path leaving them and coming back would end at a late node), and it is
        never empty (the region's first node in topological order cannot be late). Splitting
        the late rest again, after contracting the early part, yields convex parts in order.

        Example:
            >>> x = ir.Value(name="x")
            >>> a = ir.Node("", "Relu", [x]); n = ir.Node("", "Neg", a.outputs)
            >>> b = ir.Node("", "Add", [n.outputs[0], a.outputs[0]])
            >>> [m.op_type for m in Dataflow([a, n, b]).first_convex_part([a, b])]
            ['Relu']
        """
        import networkx as nx

        region = set(region)
        positions = [self.pos[n] for n in region]
        lo, hi = min(positions), max(positions)
        span = [n for n in self.order[lo : hi + 1] if n is not None]
        reach = self._span_graph(span, set())
        escapes = {s for n in region for s in reach.successors(n) if s not in region}
        reach.add_edges_from((_REGION, s) for s in escapes)
        late = nx.descendants(reach, _REGION) if escapes else set()
        return {n for n in region if n not in late}
