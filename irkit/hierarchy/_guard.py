"""The hierarchy guard: rewrites on a model whose module calls were opened keep the calls of one
module alike, so that :func:`irkit.outline` can share one function between them again.

The rewrite engine knows nothing of modules: ``irkit.optimize`` (``target="ort"``, which opens
module calls, rewrites across them and outlines again) passes a :class:`HierarchyGuard` to
:func:`irkit.rewriting.optimize_with` (``guards=``) with the folding policy
:func:`keeps_weight_transposes`. See ``docs/fusion_across_modules.md``.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator, Sequence

import onnx_ir as ir

from irkit import metadata
from irkit._scope_tree import Scope, ScopeTree, common_scope

__all__ = ["HierarchyGuard", "ScopeIndex", "keeps_weight_transposes"]

GraphLike = ir.Graph | ir.Function


class HierarchyGuard:
    """Refuses a rewrite that would make calls of one module differ (an engine guard: see
    ``irkit.rewriting.Guard``).

    The replacement nodes get the deepest scope ``C`` that contains every replaced node (the
    engine's provenance); replaced nodes of child calls of ``C`` leave those calls. That is
    harmless when the call is replaced whole (``q_proj``/``k_proj``/``v_proj`` packed into one
    ``MatMul``), or when it is the only call of its class among ``C``'s children (the bias
    ``Add`` of ``intermediate.dense`` fused with the ``Gelu`` of ``intermediate.act``: every
    instance of ``C``'s body changes alike). It breaks sharing when the call is one of several
    sibling calls of one class — a stack of layers — unless the rewrite takes only the **seam**
    between calls: in each such call, only nodes at its edge — all of them *exits* (nodes whose
    outputs are read only outside the call or by other replaced nodes: layer *i*'s last residual
    ``Add``) or all of them *entries* (nodes reading only values from outside the call,
    constants or other replaced nodes: layer *i+1*'s input norm), at most one call of each kind.
    Every seam of a stack has the same nodes, so the rule rewrites them all alike and the fused
    node lands between the calls (in ``C``): the calls after the first lose their entry and exit
    alike and still share one function; the first keeps its entry (nothing before it fused) and
    gets a function of its own, as the builder's first layer is the one without
    ``SkipSimplifiedLayerNormalization``. A rewrite reaching inside a call — which would change
    some layers only — is refused. Constants feeding only replaced nodes count as replaced.

    One guard serves one :func:`irkit.rewrite` call: it keeps a :class:`ScopeIndex` per graph,
    built on the graph's first guarded rewrite and updated with each committed replacement.
    """

    def __init__(self) -> None:
        self._indexes: dict[GraphLike, ScopeIndex] = {}

    def refuse(self, graph: GraphLike, nodes: Sequence[ir.Node]) -> str | None:
        """Why replacing ``nodes`` in ``graph`` would break the sharing of a module's calls, or
        ``None`` when it would not."""
        index = self._indexes.get(graph)
        if index is None:
            index = self._indexes[graph] = ScopeIndex(graph)
        matched = set(nodes)
        scopes = [index.scope(n) for n in matched]
        scoped = (s for n, s in zip(matched, scopes, strict=True) if s or _scoped(n))
        common = common_scope(scoped) or ()
        depth = len(common)
        touched = {s[depth] for s in scopes if len(s) > depth and s[:depth] == common}
        if not touched:
            return None
        kept = {
            frame
            for frame in touched
            if any(
                node not in matched
                and (
                    node.inputs
                    or not all(u.node in matched for o in node.outputs for u in o.uses())
                )
                for node in index.live_nodes((*common, frame))
            )  # (a constant only the replaced nodes read counts as replaced)
        }
        classes = collections.Counter(c[-1].cls for c in index.children.get(common, ()))
        frames = [f for f in kept if classes[f.cls] > 1]
        if not frames or _at_a_seam(index, matched, [(*common, f) for f in frames]):
            return None
        repeated = sorted(f.call_id for f in frames)
        names = ", ".join(sorted(f.call_id for f in touched))
        return (
            f"spans module calls {names} but leaves other nodes in {', '.join(repeated)}, one of "
            "several sibling calls of its class: they would no longer share one function"
        )

    def committed(self, graph: GraphLike, nodes: Sequence[ir.Node]) -> None:
        """``nodes`` (a replacement) were inserted into ``graph``."""
        index = self._indexes.get(graph)
        if index is not None:  # (else built from the graph, with them, when first needed)
            index.add(nodes)


def keeps_weight_transposes(node: ir.Node) -> bool | None:
    """Constant folding policy for a model whose module calls were opened: leave
    ``Transpose(initializer)`` alone.

    In the outlined model the weight is a function parameter, so nothing folds its
    ``Transpose`` (torchlib's 3-D ``linear``); folding it in the opened model would copy every
    weight. Rules see ``MatMul(x, Transpose(w))`` and fold it without a copy (``FusedMatMul``).
    """
    if node.op_type == "Transpose" and node.domain == "" and node.inputs:
        weight = node.inputs[0]
        if weight is not None and weight.is_initializer():
            return False
    return None


class ScopeIndex(ScopeTree):
    """The module calls of one graph's nodes (a :class:`~irkit._scope_tree.ScopeTree`), kept
    current across rewrites: what :class:`HierarchyGuard` reads instead of scanning the graph.

    Removed nodes are dropped lazily (:meth:`live_nodes` skips a node whose ``graph`` is no longer
    the graph); replacement nodes are added with :meth:`add` after each commit.
    """

    def __init__(self, graph: GraphLike):
        self.owner = graph.graph if isinstance(graph, ir.Function) else graph
        super().__init__(graph)

    def live_nodes(self, scope: Scope) -> Iterator[ir.Node]:
        """The nodes of call ``scope`` (its sub-calls' included) still in the graph."""
        return self.live(scope, self.owner)


def _at_a_seam(index: ScopeIndex, matched: set[ir.Node], calls: list[Scope]) -> bool:
    """Whether the replaced nodes of each of ``calls`` are all exits or all entries of it, with
    at most one call of each kind (see :class:`HierarchyGuard`)."""
    kinds: list[bool] = []  # (per call: its nodes taken are exits, else entries)
    for call in calls:
        inside = set(index.live_nodes(call))
        taken = inside & matched
        outer = {  # (the call's nodes that stay; a constant only replaced nodes read goes too)
            n
            for n in inside - matched
            if n.inputs or not all(u.node in matched for o in n.outputs for u in o.uses())
        }
        exits = all(u.node not in outer for n in taken for o in n.outputs for u in o.uses())
        entries = all(
            v is None or v.producer() is None or v.producer() not in outer
            for n in taken
            for v in n.inputs
        )
        if exits == entries:  # (neither: reaches inside; both: the call taken whole)
            return False
        kinds.append(exits)
    return len(set(kinds)) == len(kinds)


def _scoped(node: ir.Node) -> bool:
    return metadata.SCOPE in node.metadata_props
