"""The engine's acyclicity invariant: a replacement never reads what it computes.

A rewrite replaces the matched outputs ``O`` by the replacement's outputs and removes the matched
nodes. The result has a cycle exactly when the replacement reads (directly, or from a subgraph it
owns) a value ``v`` that is computed from some ``o`` in ``O`` by nodes that survive the rewrite:
``o' → … → v → replacement → o'``. A single-root match cannot do it with the values its pattern
bound — ``v`` feeds a matched node upstream of ``o``, so the path would already be a cycle — but
a multi-root match can: doge computes its attention mask from the present value, so
``(Attention(q, [pk; k], [pv; v], mask(Concat(pv, v))), Concat(pk, k), Concat(pv, v))`` turned
into one ``Attention`` with ``present_value`` as an output would read its own output through
the mask. So can a rewrite that reads a value its pattern did not bind, or a matched output
itself.

:func:`cycle_guard` decides it before :func:`~irkit.rewriting._apply.commit`, by a forward search
from each replaced output that stops at the first such ``v``, and only for the values that
the argument above does not already rule out: for the usual multi-root match (a KV-cache
``Attention`` whose presents leave the graph) the searches end at the graph outputs.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable

import onnx_ir as ir

from irkit._irutil import node_subgraphs
from irkit.rewriting._match import MatchFailure
from irkit.rewriting._rule import Rewrite

__all__ = ["cycle_guard", "CYCLE"]

CYCLE = (
    "would create a cycle: the replacement reads a value computed from an output it replaces "
    "(the value, and the matched node whose output it is computed from)"
)
"""The failure reason (stable text: reports group failures by it)."""


def cycle_guard(result: Rewrite, owner: ir.Graph) -> MatchFailure | None:
    """Whether committing ``result`` in ``owner`` would make the graph cyclic.

    Args:
        result: The rule's replacement (its nodes are not in the graph yet).
        owner: The graph being rewritten (a function's ``graph`` for a function body).

    Returns:
        A :class:`MatchFailure` with reason :data:`CYCLE`, the value the replacement must not
        read and the matched node it is computed from; ``None`` if the rewrite is safe.

    Example:
        >>> import onnx_ir as ir
        >>> from irkit.rewriting import Match, Rewrite
        >>> g = ir.from_onnx_text('''
        ...   <ir_version: 10, opset_import: ["" : 18]>
        ...   g (float[2] x) => (float[2] y) { t = Neg(x)  y = Relu(t) }''').graph
        >>> neg, relu = g
        >>> bad = ir.node("Abs", [relu.outputs[0]])  # reads the output it would replace
        >>> match = Match([relu], [relu.outputs[0]], {}, 18)
        >>> cycle_guard(Rewrite(match, [bad], bad.outputs), g).describe()[:27]
        'would create a cycle: the r'
    """
    match = result.match
    matched = set(match.nodes)
    replaced = [
        old for old, new in zip(match.outputs, result.outputs, strict=True) if new is not old
    ]
    if not replaced:
        return None
    reads = _external_reads(result.nodes)
    for v in reads:
        if v in replaced:  # reads its own output: o → replacement → o
            return MatchFailure(CYCLE, v, v.producer())
    reads = [v for v in reads if (p := v.producer()) is not None and p not in matched]
    if not reads:
        return None
    owners = _SubgraphOwners(owner)
    for old in replaced:
        producer = old.producer()
        suspects = _unexplained(reads, producer, matched)
        if not suspects:
            continue
        found = _first_downstream(old, {v.producer(): v for v in suspects}, matched, owners)
        if found is not None:
            return MatchFailure(CYCLE, found, producer)
    return None


def _external_reads(nodes: Iterable[ir.Node]) -> list[ir.Value]:
    """Values the replacement reads from outside itself (its subgraphs' captures included)."""
    inside: set[ir.Node] = set()
    stack = list(nodes)
    while stack:
        n = stack.pop()
        if n in inside:
            continue
        inside.add(n)
        for g in node_subgraphs(n):
            stack.extend(g)
    seen: set[ir.Value] = set()
    reads: list[ir.Value] = []
    for n in inside:
        for v in n.inputs:
            if v is None or v in seen or v.producer() in inside:
                continue
            seen.add(v)
            reads.append(v)
    return reads


def _unexplained(
    reads: list[ir.Value], producer: ir.Node | None, matched: set[ir.Node]
) -> list[ir.Value]:
    """The reads that could be downstream of ``producer``'s outputs.

    A value that a matched node upstream of ``producer`` (or ``producer`` itself) reads cannot
    be computed from ``producer``'s outputs: that would be a cycle of the graph before the rewrite.
    """
    upstream: set[ir.Value] = set()
    stack = [producer] if producer is not None and producer in matched else []
    seen: set[ir.Node] = set()
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        for v in n.inputs:
            if v is None:
                continue
            upstream.add(v)
            if (p := v.producer()) is not None and p in matched:
                stack.append(p)
    return [v for v in reads if v not in upstream]


class _SubgraphOwners:
    """The node of the rewritten graph that owns a (nested) subgraph, built on first use."""

    def __init__(self, owner: ir.Graph):
        self._owner = owner
        self._by_graph: dict[ir.Graph, ir.Node] | None = None

    def node_in_owner(self, node: ir.Node) -> ir.Node | None:
        if node.graph is self._owner:
            return node
        if self._by_graph is None:
            self._by_graph = {}
            for n in self._owner:
                stack = node_subgraphs(n)
                while stack:
                    g = stack.pop()
                    self._by_graph[g] = n
                    for inner in g:
                        stack.extend(node_subgraphs(inner))
        graph = node.graph
        return self._by_graph.get(graph) if isinstance(graph, ir.Graph) else None


def _first_downstream(
    start: ir.Value,
    targets: dict[ir.Node | None, ir.Value],
    matched: set[ir.Node],
    owners: _SubgraphOwners,
) -> ir.Value | None:
    """The first target value whose producer is computed from ``start`` outside the match."""
    queue = collections.deque([start])
    seen: set[ir.Node] = set()
    while queue:
        value = queue.popleft()
        for use in value.uses():
            node = owners.node_in_owner(use.node)  # None: a replacement node, or no graph
            if node is None or node in matched or node in seen:
                continue
            seen.add(node)
            if node in targets:
                return targets[node]
            queue.extend(node.outputs)
    return None
