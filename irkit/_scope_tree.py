"""The module call tree of a set of ONNX nodes, read once from their scope metadata.

One tree serves every stage that asks "which module call ran this node": outlining
(:func:`irkit.outline` walks it bottom-up), the hierarchy guard of the rewrite engine
(:class:`irkit.hierarchy.ScopeIndex`: the nodes of each call, kept current across rewrites) and
viz's module tree of a flat model. It has one node per module *call*, keyed by its full scope (a
tuple of :class:`~irkit.metadata.Frame`, outermost first; ``()`` is the root): ``a`` and ``a@1``
are two calls of one module and so two tree nodes. Each ONNX node is a *direct member* of its
innermost call; a call *owns* its direct members and everything its descendants own.

Scopes are decoded with :func:`irkit.metadata.decode_scope`, once per distinct metadata string,
and **interned**: one :class:`Frame` per distinct frame and one tuple per distinct scope, so the
tree of a large model holds a few hundred small objects, not one per node.

This module imports no stage; it sits just above :mod:`irkit.metadata`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

import onnx_ir as ir

from irkit import metadata
from irkit.errors import MetadataError

__all__ = ["Scope", "ScopeTree", "common_scope"]

Scope = tuple[metadata.Frame, ...]
"""A node's module calls, outermost first (``()``: the root)."""


class ScopeTree:
    """The module calls of ``nodes`` (from their :data:`irkit.metadata.SCOPE`), their child
    calls, and each call's direct members.

    Args:
        nodes: The nodes to index, in order (more can be added with :meth:`add`).
        scope_of: Reads a node's scope where it is not irkit's own metadata (viz reads other
            exporters' scope keys); by default :meth:`scope`.

    Attributes:
        members: Scope → the nodes whose innermost call it is, in the order added. Every call
            on the way from the root has an entry (``members[()]`` always exists).
        children: Scope → its child calls (full scopes), in the order first seen; ``[]`` for a
            leaf. Same keys as ``members``.

    Example:
        >>> a, b = metadata.Frame("a", 0, "m.A"), metadata.Frame("a.b", 0, "m.B")
        >>> n1, n2 = ir.node("Relu", []), ir.node("Neg", [])
        >>> n1.metadata_props[metadata.SCOPE] = metadata.encode_scope([a, b])
        >>> tree = ScopeTree([n1, n2])
        >>> tree.children[()], [n.op_type for n in tree.members[()]]
        ([(Frame(path='a', call_index=0, cls='m.A'),)], ['Neg'])
        >>> [len(s) for s in tree.calls()], [n.op_type for n in tree.nodes((a,))]
        ([1, 2], ['Relu'])
    """

    def __init__(
        self,
        nodes: Iterable[ir.Node] = (),
        *,
        scope_of: Callable[[ir.Node], Scope] | None = None,
    ) -> None:
        self.members: dict[Scope, list[ir.Node]] = {(): []}
        self.children: dict[Scope, list[Scope]] = {(): []}
        self._scope_of = scope_of
        self._texts: dict[str, Scope] = {}  # many nodes share one scope string
        self._frames: dict[metadata.Frame, metadata.Frame] = {}  # and strings share frames
        self._scopes: dict[Scope, Scope] = {(): ()}
        self.add(nodes)

    def scope(self, node: ir.Node) -> Scope:
        """``node``'s scope from its :data:`irkit.metadata.SCOPE` (``()`` if absent), interned.

        Raises:
            MetadataError: The metadata is not what :func:`irkit.metadata.encode_scope` writes.
        """
        text = node.metadata_props.get(metadata.SCOPE)
        if not text:
            return ()
        scope = self._texts.get(text)
        if scope is None:
            try:
                decoded = metadata.decode_scope(text)
            except MetadataError as exc:
                raise MetadataError(
                    f"Node {node.name!r} ({node.op_type}) has {exc}. Expected a JSON list of "
                    "[path, call_index, class] triples as written by "
                    "irkit.metadata.encode_scope; fix the rewrite that set it or delete the key."
                ) from exc
            scope = self._texts[text] = self.intern(decoded)
        return scope

    def intern(self, scope: Scope) -> Scope:
        """The tree's one copy of ``scope`` (its frames shared with every other scope)."""
        known = self._scopes.get(scope)
        if known is None:
            frames = self._frames
            known = tuple(frames.setdefault(f, f) for f in scope)
            self._scopes[known] = known
        return known

    def add(self, nodes: Iterable[ir.Node]) -> None:
        """Index ``nodes`` (e.g. a rewrite's replacement nodes) as direct members of their calls."""
        scope_of = self.scope if self._scope_of is None else self._scope_of
        members = self.members
        last_scope: Scope | None = None
        bucket: list[ir.Node] = []
        for node in nodes:
            scope = scope_of(node)
            if scope is not last_scope:  # (consecutive nodes mostly share their scope)
                found = members.get(scope)
                if found is None:
                    found = self._add_call(self.intern(scope))
                bucket, last_scope = found, scope
            bucket.append(node)

    def _add_call(self, scope: Scope) -> list[ir.Node]:
        """Enter ``scope`` and the calls on the way to it; its (new) member list."""
        for depth in range(1, len(scope) + 1):
            prefix = self.intern(scope[:depth])
            if prefix not in self.members:
                self.members[prefix] = []
                self.children[prefix] = []
                self.children[prefix[:-1]].append(prefix)
        return self.members[scope]

    def calls(self) -> Iterator[Scope]:
        """Every call (the root excluded), each after its parent."""
        return (scope for scope in self.members if scope)

    def subtree(self, scope: Scope) -> Iterator[Scope]:
        """``scope`` and every call below it, depth first, children in order."""
        stack = [scope]
        while stack:
            current = stack.pop()
            yield current
            stack.extend(reversed(self.children.get(current, ())))

    def nodes(self, scope: Scope) -> Iterator[ir.Node]:
        """Every node the call ``scope`` owns (its sub-calls' included), call by call."""
        for call in self.subtree(scope):
            yield from self.members.get(call, ())

    def live(self, scope: Scope, graph: ir.Graph) -> Iterator[ir.Node]:
        """The nodes of :meth:`nodes` still in ``graph`` (removed nodes are dropped lazily)."""
        return (node for node in self.nodes(scope) if node.graph is graph)


def common_scope(scopes: Iterable[Scope]) -> Scope | None:
    """The deepest scope that contains each of ``scopes`` (their longest common prefix);
    ``None`` when there are none.

    Example:
        >>> a, b, c = (metadata.Frame(p, 0, "m.M") for p in ("a", "a.b", "a.c"))
        >>> common_scope([(a, b), (a, c), (a, b)]) == (a,), common_scope([])
        (True, None)
    """
    common: Scope | None = None
    for scope in scopes:
        if common is None:
            common = scope
            continue
        k, limit = 0, min(len(common), len(scope))
        while k < limit and common[k] == scope[k]:
            k += 1
        common = common[:k]
    return common
