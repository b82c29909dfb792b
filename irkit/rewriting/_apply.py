"""The rewrite engine: rules indexed by anchor op, a worklist, a fixed point.

Every graph-like (the main graph, each local function body once, each If/Loop/Scan body) is
rewritten by one worklist pass: nodes are visited in graph order; each node tries only the rules
whose pattern root has its ``(domain, op_type)`` (plus the few rules that may anchor anywhere);
after a rewrite the neighbourhood — the new nodes, the producers of their inputs, the
consumers of their outputs and those consumers' consumers, and the other consumers of what the
replaced nodes read — is re-enqueued. Work is proportional to the graph size times the
(bounded) pattern size, so time per node stays flat as models grow.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Protocol

import onnx_ir as ir

from irkit import metadata
from irkit._irutil import nested_subgraphs
from irkit._scope_tree import common_scope
from irkit.errors import FixedPointError, IrkitError, RewriteError, RuleDefinitionError
from irkit.rewriting._acyclic import cycle_guard
from irkit.rewriting._match import MatchFailure, unread
from irkit.rewriting._report import NearMiss, RewriteReport, RuleStats
from irkit.rewriting._rule import BaseRule, Rewrite, RewriteContext, RuleSet

__all__ = ["rewrite", "Guard", "DEFAULT_MAX_REWRITES_PER_NODE"]

logger = logging.getLogger(__name__)

DEFAULT_MAX_REWRITES_PER_NODE = 4
"""Iteration cap: at most this many rewrites per node of a graph (plus a constant) before
:class:`~irkit.errors.FixedPointError`."""

GraphLike = ir.Graph | ir.Function


class Guard(Protocol):
    """A veto on rewrites that the caller of :func:`rewrite` injects (``guards=``): the engine
    asks every guard before it commits a rewrite (after its own checks) and tells it after.

    ``irkit.hierarchy.HierarchyGuard`` is one: ``irkit.optimize`` passes it when module calls
    were opened to be outlined again, so the engine itself knows nothing of modules.
    """

    def refuse(self, graph: GraphLike, nodes: Sequence[ir.Node]) -> str | None:
        """Why replacing ``nodes`` (the matched nodes) in ``graph`` must not happen, or ``None``.
        The reason is reported as the rule's match failure."""

    def committed(self, graph: GraphLike, nodes: Sequence[ir.Node]) -> None:
        """``nodes`` (a replacement) were inserted into ``graph``."""


def _as_rules(rules: RuleSet | BaseRule | Iterable[BaseRule | RuleSet]) -> RuleSet:
    if isinstance(rules, RuleSet):
        return rules
    if isinstance(rules, BaseRule):
        return RuleSet(rules.name, [rules])
    if isinstance(rules, (str, bytes)) or not isinstance(rules, Iterable):
        raise RuleDefinitionError(
            f"expected a RuleSet, a rule or an iterable of them, got {type(rules).__name__} "
            f"{rules!r}. Fix: build rules with Rule(...) / node_rule and pass them in a RuleSet."
        )
    return RuleSet("rules", list(rules))


class _RuleIndex:
    """Rules by the ``(domain, op_type)`` of their anchor; wildcard rules apply everywhere."""

    def __init__(self, rules: RuleSet):
        self._by_op: dict[tuple[str, str], list[BaseRule]] = collections.defaultdict(list)
        self._any: list[BaseRule] = []
        order = {r.name: i for i, r in enumerate(rules)}
        for r in rules:
            if r.anchors is None:
                self._any.append(r)
            else:
                for key in r.anchors:
                    self._by_op[key].append(r)
        if self._any:  # keep rule-set order when merging wildcard rules in
            for key, lst in self._by_op.items():
                self._by_op[key] = sorted(lst + self._any, key=lambda r: order[r.name])
        self._by_op = dict(self._by_op)

    def get(self, node: ir.Node) -> list[BaseRule]:
        return self._by_op.get((node.domain, node.op_type), self._any)


def rewrite(
    model: ir.Model,
    rules: RuleSet | BaseRule | Iterable[BaseRule | RuleSet],
    *,
    explain: str | None = None,
    max_opset: int | None = None,
    max_rewrites_per_node: int = DEFAULT_MAX_REWRITES_PER_NODE,
    report: RewriteReport | None = None,
    guards: Sequence[Guard] = (),
) -> ir.Model:
    """Apply ``rules`` to ``model`` **in place** until no rule fires.

    The main graph, every local function body (once, however many calls it has) and every
    If/Loop/Scan body are rewritten. Functions are never inlined. Replacement nodes get
    provenance metadata (:data:`~irkit.metadata.REWRITE_RULE`,
    :data:`~irkit.metadata.REWRITE_SOURCES`, and the matched nodes' common
    :data:`~irkit.metadata.SCOPE`).

    Args:
        model: The model; modified in place.
        rules: A :class:`RuleSet`, a rule, or an iterable of them (earlier rules win).
        explain: Name of a rule whose failed attempts are recorded in
            ``report.near_misses`` (see :meth:`RewriteReport.explain`).
        max_opset: Rules needing a newer ONNX opset than this do not fire.
        max_rewrites_per_node: Iteration cap per graph: ``max_rewrites_per_node × nodes + 64``.
        report: If given, filled with the :class:`RewriteReport` (per-rule statistics).
        guards: Vetoes on rewrites (see :class:`Guard`), e.g. ``irkit.hierarchy.HierarchyGuard()``
            when module calls were inlined to be re-outlined after the rewrite.

    Returns:
        ``model`` itself, so stages compose.

    Raises:
        FixedPointError: The cap was hit (rules keep undoing/redoing each other); it names them.
        RewriteError: A rule produced an invalid replacement (e.g. a different output type).

    Example:
        >>> import onnx_ir as ir
        >>> from irkit.rewriting import Rule, RewriteReport, op, var
        >>> m = ir.from_onnx_text('''
        ...   <ir_version: 10, opset_import: ["" : 18]>
        ...   g (float[2] x) => (float[2] y) { t = Neg(x)  u = Neg(t)  y = Relu(u) }''')
        >>> report = RewriteReport()
        >>> m = rewrite(m, Rule("DoubleNeg", op.Neg(op.Neg(var("x"))), rewrite=lambda x: x),
        ...             report=report)
        >>> report.fired, [n.op_type for n in m.graph]
        ({'DoubleNeg': 1}, ['Relu'])
    """
    rule_set = _as_rules(rules)
    if explain is not None and explain not in rule_set.names():
        raise RewriteError(
            f"explain={explain!r} names no rule of {rule_set.name!r}; rules: {rule_set.names()}"
        )
    start = time.perf_counter()
    result = RewriteReport(rules={r.name: RuleStats(r.name) for r in rule_set})
    result.nodes_before = count_nodes(model)
    index = _RuleIndex(rule_set)
    main_opset = model.opset_imports.get("", 1)
    for graph_like, where in _graph_likes(model):
        opset = (
            graph_like.opset_imports.get("", main_opset)
            if isinstance(graph_like, ir.Function)
            else main_opset
        )
        ctx = RewriteContext(model, graph_like, opset, max_opset)
        worklist = _Worklist(ctx, index, result, explain, where, max_rewrites_per_node)
        worklist.guards = guards
        worklist.run()
        result.graphs += 1
    result.nodes_after = count_nodes(model)
    result.seconds = time.perf_counter() - start
    logger.info("%s", result)
    if report is not None:
        report.fill_from(result)
    return model


def count_nodes(model: ir.Model) -> int:
    """Nodes of the main graph plus all function bodies (subgraphs included)."""
    return sum(len(g) for g, _ in _graph_likes(model))


def _graph_likes(model: ir.Model) -> Iterator[tuple[GraphLike, str | None]]:
    """Subgraphs first (inner before outer), then the main graph, then each function once."""
    for g in nested_subgraphs(model.graph):
        yield g, None
    yield model.graph, None
    for f in list(model.functions.values()):
        where = f"{f.domain}::{f.name}"
        for g in nested_subgraphs(f):
            yield g, where
        yield f, where


def _where(node: ir.Node, fallback: str | None) -> str:
    """Where a node is, for reports: its function, else the module call it is or belongs to."""
    if fallback is not None:
        return fallback
    call = metadata.node_call(node.metadata_props)
    if call is not None:
        return call.call_id
    scope = metadata.node_scope(node.metadata_props)
    return scope[-1].call_id if scope else ""


class _Worklist:
    def __init__(
        self,
        ctx: RewriteContext,
        index: _RuleIndex,
        report: RewriteReport,
        explain: str | None,
        where: str | None,
        per_node: int,
    ):
        self.ctx = ctx
        self.index = index
        self.report = report
        self.explain = explain
        self.where = where
        self.per_node = per_node
        graph = ctx.graph
        self.owner = graph.graph if isinstance(graph, ir.Function) else graph
        # Consumers first: patterns are anchored at their root (output), so visiting in reverse
        # order lets the largest pattern (LayerNorm with bias) win over its sub-patterns.
        self.queue: collections.deque[ir.Node] = collections.deque(reversed(graph))
        self.queued = set(self.queue)
        self.needs_sort = False
        self.guards: Sequence[Guard] = ()

    def run(self) -> None:
        budget = self.per_node * len(self.queue) + 64
        recent: collections.deque[str] = collections.deque(maxlen=64)
        stats = self.report.rules
        perf = time.perf_counter
        while self.queue:
            node = self.queue.popleft()
            self.queued.discard(node)
            if node.graph is not self.owner:
                continue  # removed by an earlier rewrite
            for rule in self.index.get(node):
                if rule.anchors is None and not rule.applies_to(node, self.ctx):
                    continue
                s = stats[rule.name]
                t0 = perf()
                result = self._find(rule, node)
                s.tried += 1
                if not isinstance(result, MatchFailure):
                    refused = graph_io_guard(result)  # (a MatchFailure is falsy: no `or`)
                    if refused is None:
                        refused = cycle_guard(result, self.owner)
                    if refused is None and self.guards:
                        refused = self._refused(result)
                    result = result if refused is None else refused
                if isinstance(result, MatchFailure):
                    s.seconds += perf() - t0
                    s.failures[result.reason] += 1
                    if rule.name == self.explain:
                        self._near_miss(node, result)
                    continue
                where = _where(node, self.where)
                read = [v for n in result.match.nodes for v in n.inputs if v is not None]
                commit(self.ctx.graph, node, result, rule.name, self.ctx.model)
                for guard in self.guards:
                    guard.committed(self.ctx.graph, result.nodes)
                s.seconds += perf() - t0
                s.fired += 1
                s.where[where] += 1
                # A multi-root match inserts before its anchor; later roots may need reordering.
                self.needs_sort |= len({v.producer() for v in result.match.outputs}) > 1
                self._enqueue_neighbourhood(result, read)
                recent.append(rule.name)
                budget -= 1
                if budget < 0:
                    self._raise_fixed_point(recent)
                break
        if self.needs_sort:
            self.ctx.graph.sort()

    def _refused(self, result: Rewrite) -> MatchFailure | None:
        for guard in self.guards:
            reason = guard.refuse(self.ctx.graph, result.match.nodes)
            if reason is not None:
                return MatchFailure(reason)
        return None

    def _find(self, rule: BaseRule, node: ir.Node) -> Rewrite | MatchFailure:
        """``rule.find``; a bug in the rule becomes a :class:`RewriteError` that says where."""
        try:
            return rule.find(node, self.ctx)
        except IrkitError:
            raise
        except Exception as exc:
            graph = self.where or f"graph {self.ctx.graph.name or 'main'!r}"
            raise RewriteError(
                f"rule {rule.name!r} raised {type(exc).__name__}: {exc} at node "
                f"{node.name or node.op_type!r} ({node.op_type}) in {graph}. Fix the rule's "
                "check or rewrite (the original exception is chained below)."
            ) from exc

    def _near_miss(self, node: ir.Node, failure: MatchFailure) -> None:
        self.report.near_misses.append(
            NearMiss(node.name or "", _where(node, self.where), failure.describe(), failure.depth)
        )

    def _enqueue_neighbourhood(self, result: Rewrite, read: Sequence[ir.Value] = ()) -> None:
        """Re-enqueue what a rewrite may have made matchable. ``read``: the values the matched
        nodes read — their other consumers lost a use of them (a pattern refused because an
        intermediate value had another use may match now)."""
        push = [use.node for v in read for use in v.uses()]
        for n in result.nodes:
            push.append(n)
            for v in n.inputs:
                if v is not None and (p := v.producer()) is not None:
                    push.append(p)
        for v in result.outputs:
            if v is None:
                continue
            if (p := v.producer()) is not None:
                push.append(p)
            for use in v.uses():  # (and theirs: a pattern may reach two nodes down)
                push.append(use.node)
                push.extend(u.node for out in use.node.outputs for u in out.uses())
        for n in push:
            if n not in self.queued:
                self.queued.add(n)
                self.queue.append(n)

    def _raise_fixed_point(self, recent: Iterable[str]) -> None:
        counts = collections.Counter(recent)
        names = [n for n, _ in counts.most_common()]
        graph = self.where or (self.ctx.graph.name or "main graph")
        raise FixedPointError(
            f"rewriting {graph!r} did not reach a fixed point after "
            f"{self.per_node}×nodes+64 rewrites; rules still firing: "
            + ", ".join(
                f"{n} (×{c} of the last {sum(counts.values())})" for n, c in counts.most_common()
            )
            + ". Fix: a rule's replacement matches its own pattern, or two rules undo each "
            "other; make the check reject its own output or drop one of the rules.",
            names,
        )


def provenance(nodes: Iterable[ir.Node], rule_name: str) -> dict[str, str]:
    """Metadata for replacement nodes: rule, union of sources, deepest common scope."""
    sources: set[str] = set()
    scopes: list[tuple[metadata.Frame, ...]] = []
    for n in nodes:
        props = n.metadata_props
        if src := props.get(metadata.SOURCE):
            sources.add(src)
        sources.update(metadata.decode_list(props.get(metadata.REWRITE_SOURCES)))
        if metadata.SCOPE in props:
            scopes.append(metadata.node_scope(props))
    common = common_scope(scopes)
    meta = {metadata.REWRITE_RULE: rule_name}
    if sources:
        meta[metadata.REWRITE_SOURCES] = metadata.encode_list(sorted(sources))
    if common is not None:
        meta[metadata.SCOPE] = metadata.encode_scope(common)
    return meta


def _needs_identity(old: ir.Value, new: ir.Value, new_nodes: set[ir.Node], anchor: ir.Node) -> bool:
    """Whether graph output ``old`` replaced by ``new`` needs an ``Identity`` to keep its name.

    True when ``new`` is a graph input, an initializer, an outer-scope value or another graph
    output: ONNX forbids one value under two names, so the output cannot simply be renamed.
    """
    if not old.is_graph_output():
        return False
    producer = new.producer()
    fresh = producer in new_nodes
    renamable = producer is not None and producer.graph is anchor.graph
    return new.is_graph_output() or not (fresh or renamable)


def graph_io_guard(result: Rewrite) -> MatchFailure | None:
    """The engine's invariant for graph outputs, checked before every :func:`commit`.

    A rewrite whose replacement of a graph output must be an ``Identity`` (see
    :func:`_needs_identity`) only makes progress if it removes more nodes than it adds. Without
    this check ``Identity(x) = x`` would fire forever on ``y = Identity(x)`` with ``x`` a graph
    input and ``y`` a graph output (the engine would put the Identity back). Rules need not
    repeat it.

    Returns:
        A failure (the rule does not fire here) or ``None``.
    """
    match = result.match
    new_nodes = set(result.nodes)
    anchor = match.nodes[0]
    needed = [
        new
        for old, new in zip(match.outputs, result.outputs, strict=True)
        if new is not None and new is not old and _needs_identity(old, new, new_nodes, anchor)
    ]
    if needed and len(new_nodes) + len(needed) >= len(match.nodes):
        return MatchFailure(
            "needed: connects a graph input/initializer/output to a graph output", needed[0]
        )
    return None


def commit(
    graph: GraphLike, anchor: ir.Node, result: Rewrite, rule_name: str, model: ir.Model
) -> None:
    """Insert the replacement before ``anchor``, reroute uses, remove the matched nodes."""
    match = result.match
    new_nodes = result.nodes
    meta = provenance(match.nodes, rule_name)
    for n in new_nodes:
        for k, v in meta.items():
            n.metadata_props.setdefault(k, v)
    _import_domains(graph, model, {n.domain for n in new_nodes})
    extra: list[ir.Node] = []
    new_set = set(new_nodes)
    renames: list[tuple[ir.Value, str]] = []
    for old, new in zip(match.outputs, result.outputs, strict=True):
        if new is old:
            continue
        if new is None:
            raise RewriteError(
                f"rule {rule_name!r} returned None for output {old.name!r}. Fix: return one value "
                "per pattern output, or decline as a whole (return None or fail(...))."
            )
        _merge_type(old, new, rule_name)
        if old.is_graph_output():
            if _needs_identity(old, new, new_set, anchor):
                ident = ir.Node("", "Identity", [new], metadata_props=dict(meta))
                extra.append(ident)
                out = ident.outputs[0]
                out.type, out.shape = old.type, old.shape
                new = out
            renames.append((new, old.name or ""))
        old.replace_all_uses_with(new, replace_graph_outputs=True)
    if new_nodes or extra:
        graph.insert_before(anchor, [*new_nodes, *extra])
    inputs = [v for n in match.nodes for v in n.inputs if v is not None]
    readers = {u.node for n in match.nodes for o in n.outputs for u in o.uses()}
    owner = match.nodes[0].graph
    dead = [r for r in readers - set(match.nodes) if r.graph is owner and unread(r)]
    graph.remove(dead, safe=True)
    graph.remove(match.nodes, safe=True)
    for value, name in renames:
        value.name = name
    _remove_dead_producers(graph, inputs)


def _remove_dead_producers(graph: GraphLike, values: list[ir.Value]) -> None:
    """Local dead-code removal: producers of ``values`` left without any use (transitively)."""
    owner = graph.graph if isinstance(graph, ir.Function) else graph
    stack = list(values)
    while stack:
        v = stack.pop()
        node = v.producer()
        if node is None or node.graph is not owner:
            continue
        if any(o.uses() or o.is_graph_output() for o in node.outputs):
            continue
        stack.extend(i for i in node.inputs if i is not None)
        graph.remove(node, safe=True)


def _merge_type(old: ir.Value, new: ir.Value, rule_name: str) -> None:
    """The replacement computes the same tensor: same dtype, same shape. Never leave stale info."""
    if old.type is not None and new.type is not None and old.type != new.type:
        raise RewriteError(
            f"rule {rule_name!r} replaced {old.name!r} ({old.type}) by a value of type {new.type}; "
            "a rewrite must preserve types. Fix the rule's rewrite."
        )
    if (
        old.shape is not None
        and new.shape is not None
        and _static(old.shape)
        and _static(new.shape)
        and tuple(old.shape) != tuple(new.shape)
    ):
        raise RewriteError(
            f"rule {rule_name!r} replaced {old.name!r} (shape {old.shape}) by a value of shape "
            f"{new.shape}; a rewrite must preserve shapes. Fix the rule's pattern or check."
        )
    # Same tensor: fill in what the replacement does not know (never keep conflicting info).
    if new.type is None:
        new.type = old.type
    if new.shape is None and old.shape is not None:
        new.shape = old.shape


def _static(shape: ir.Shape) -> bool:
    return all(isinstance(d, int) for d in shape)


def _import_domains(graph: GraphLike, model: ir.Model, domains: set[str]) -> None:
    for d in domains:
        if d == "" or d in graph.opset_imports:
            continue
        version = model.opset_imports.get(d, 1)
        graph.opset_imports[d] = version
        model.opset_imports.setdefault(d, version)
