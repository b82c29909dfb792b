"""The matcher: finds where a pattern occurs, anchored at one node.

Matching is a depth-first search written with generators: every sub-matcher *yields* once per
consistent way to match and undoes its bindings when resumed, so the search backtracks exactly
where a choice was made — two operand orders of a commutative op, the branches of
:func:`~irkit.rewriting._pattern.either`, the candidate consumers of a second pattern output — and
never enumerates permutations of the whole pattern.

A failed match is a value, :class:`MatchFailure`, carrying a reason, the offending value or node
and how far the match got (used to rank near misses in ``explain`` mode).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import onnx_ir as ir

from irkit._irutil import const_tensor
from irkit.errors import RuleDefinitionError
from irkit.rewriting._pattern import (
    AttrVar,
    Const,
    Either,
    NodeOutput,
    NodePattern,
    OptionalInput,
    Pattern,
    Var,
    root_nodes,
)

__all__ = [
    "MatchFailure",
    "Match",
    "Matcher",
    "fail",
    "matches",
    "const_value",
    "const_tensor",
]

_UNBOUND = object()
MAX_SOLUTIONS = 16
"""Structural matches tried per anchor before giving up (bounds pathological backtracking)."""
MAX_STEPS = 4096
"""Node comparisons per anchor before giving up (bounds backtracking over commutative chains)."""


@dataclasses.dataclass(frozen=True)
class MatchFailure:
    """Why a pattern did not match (or a check rejected it). Falsy, so ``if not result:`` works.

    Attributes:
        reason: Human-readable reason (stable text, used to group failures in reports).
        value: The value that caused it, if any.
        node: The graph node where it happened, if any.
        depth: How many pattern nodes had matched before this failure.
        variable: The pattern variable ``value`` was bound to, if it was (a check's failure).
    """

    reason: str
    value: ir.Value | None = None
    node: ir.Node | None = None
    depth: int = 0
    variable: str | None = None

    def __bool__(self) -> bool:
        return False

    def describe(self) -> str:
        """The reason plus where (value and node names)."""
        where = []
        if self.value is not None and self.variable is not None:
            where.append(f"{self.variable} = value {self.value.name!r}")
        elif self.value is not None:
            where.append(f"value {self.value.name!r}")
        if self.node is not None:
            where.append(f"node {self.node.name!r} ({self.node.op_type})")
        return self.reason + (f" [{', '.join(where)}]" if where else "")


def fail(reason: str, value: ir.Value | None = None, node: ir.Node | None = None) -> MatchFailure:
    """Return (not raise) a failure from a rule's ``check``: ``return fail("rank 3", x)``."""
    return MatchFailure(reason, value, node)


@dataclasses.dataclass
class Match:
    """A successful match.

    Attributes:
        nodes: Matched graph nodes, anchor first.
        outputs: Graph values matched by the pattern outputs (the values to replace).
        bindings: Variable name → ``ir.Value`` (or ``None``) / captured attribute value.
        opset: The ONNX opset version of the graph or function being rewritten.
    """

    nodes: list[ir.Node]
    outputs: list[ir.Value]
    bindings: dict[str, Any]
    opset: int


@functools.lru_cache(maxsize=1024)
def _schema_default(domain: str, op_type: str, name: str, opset: int) -> Any:
    import onnx

    try:
        schema = onnx.defs.get_schema(op_type, opset, domain)
    except Exception:  # unknown op or domain: no default
        return None
    attribute = schema.attributes.get(name)
    if attribute is None or not attribute.default_value.name:
        return None
    return _normalize(onnx.helper.get_attribute_value(attribute.default_value))


def _normalize(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, float):
        # ONNX stores float attributes as float32: compare at that precision (1/6 == 0.16666667).
        return float(np.float32(value))
    if isinstance(value, (list, tuple)):
        return tuple(_normalize(v) for v in value)
    return value


def const_value(value: ir.Value | None) -> np.ndarray | None:
    """The constant held by ``value`` (initializer or ``Constant`` output) as numpy, else None."""
    tensor = const_tensor(value)
    if tensor is None:
        return None
    try:
        return tensor.numpy()
    except Exception:  # external data not loaded, unsupported dtype
        return None


class _State:
    __slots__ = ("bindings", "nodes", "depth", "failure", "opset", "steps")

    def __init__(self, opset: int):
        self.bindings: dict[str, Any] = {}
        self.nodes: dict[NodePattern, ir.Node] = {}
        self.depth = 0
        self.failure: MatchFailure | None = None
        self.opset = opset
        self.steps = 0

    def fail(self, reason: str, value: ir.Value | None = None, node: ir.Node | None = None) -> None:
        if self.failure is None or self.depth > self.failure.depth:
            self.failure = MatchFailure(reason, value, node, self.depth)


class Matcher:
    """Matches one pattern (one or more outputs) anchored at a node.

    Args:
        outputs: The pattern's outputs; the node of the first one is the anchor.
    """

    def __init__(self, outputs: Sequence[Pattern]):
        self.outputs = tuple(outputs)
        if not isinstance(self.outputs[0], (NodeOutput, Either)):
            raise RuleDefinitionError("a pattern's first output must be produced by an op")
        anchor = self.outputs[0].node if isinstance(self.outputs[0], NodeOutput) else None
        self.roots = [r for r in root_nodes(self.outputs[1:]) if r is not anchor]
        # Variables of each Either / OptionalInput, computed once (not per attempt).
        self._vars: dict[int, tuple[str, ...]] = {}
        for o in self.outputs:
            self._collect_vars(o)

    def _collect_vars(self, p: Pattern | None) -> None:
        if isinstance(p, (Either, OptionalInput)) and id(p) not in self._vars:
            self._vars[id(p)] = tuple(dict.fromkeys(p.variables()))
        children: tuple[Pattern | None, ...] = ()
        if isinstance(p, NodeOutput):
            children = p.node.inputs
        elif isinstance(p, Either):
            children = p.alternatives
        elif isinstance(p, OptionalInput):
            children = (p.inner,)
        for c in children:
            self._collect_vars(c)

    def solutions(self, node: ir.Node, opset: int) -> Iterator[Match | MatchFailure]:
        """Yield each complete structural match anchored at ``node`` (then the last failure)."""
        st = _State(opset)
        count = 0
        anchor = self.outputs[0]
        first = anchor.node if isinstance(anchor, NodeOutput) else None
        gen = (
            self._match_node(first, node, st)
            if first
            else self._match_value(anchor, node.outputs[0], st)
        )
        for _ in gen:
            for _ in self._match_roots(0, st):
                result = self._validate(st)
                if isinstance(result, MatchFailure):
                    st.failure = result
                    continue
                yield result
                count += 1
                if count >= MAX_SOLUTIONS:
                    return
        if count == 0:
            yield st.failure if st.failure is not None else MatchFailure("no match", None, node)

    def match_value(
        self, value: ir.Value | None, opset: int, bindings: dict[str, Any]
    ) -> dict[str, Any] | MatchFailure:
        """The first way the (single-output) pattern matches ``value`` given ``bindings``:
        all bindings then, or why it does not match. Nothing is validated about uses (the
        nodes are looked at, not replaced)."""
        st = _State(opset)
        st.bindings.update(bindings)
        for _ in self._match_value(self.outputs[0], value, st):
            return dict(st.bindings)
        return st.failure if st.failure is not None else MatchFailure("no match", value)

    # --- roots beyond the anchor (multi-output patterns) ----------------------------------
    def _match_roots(self, i: int, st: _State) -> Iterator[None]:
        if i == len(self.roots):
            yield
            return
        root = self.roots[i]
        if root in st.nodes:
            yield from self._match_roots(i + 1, st)
            return
        matched = set(st.nodes.values())
        candidates: dict[ir.Node, None] = {}
        for n in matched:
            for v in (*n.inputs, *n.outputs):
                if v is None:
                    continue
                for use in v.uses():
                    c = use.node
                    if c not in matched and c.op_type == root.op_type and c.domain == root.domain:
                        candidates[c] = None
        if not candidates:
            st.fail(f"no {root.qualified_name} node next to the match for a second output")
        for c in candidates:
            for _ in self._match_node(root, c, st):
                yield from self._match_roots(i + 1, st)

    # --- values ----------------------------------------------------------------------------
    def _match_value(self, p: Pattern | None, v: ir.Value | None, st: _State) -> Iterator[None]:
        kind = type(p)
        if kind is Var:
            name = p.name  # type: ignore[union-attr]
            bound = st.bindings.get(name, _UNBOUND)
            if bound is _UNBOUND:
                st.bindings[name] = v
                yield
                del st.bindings[name]
            elif bound is v:
                yield
            else:
                st.fail(f"variable {name!r} bound to two different values", v)
        elif kind is NodeOutput:
            producer = v.producer() if v is not None else None
            if producer is None:
                what = "absent" if v is None else "not computed by a node"
                st.fail(f"expected {p.node.qualified_name} output, input is {what}", v)  # type: ignore[union-attr]
                return
            if v.index() != p.index:  # type: ignore[union-attr]
                if producer.op_type == p.node.op_type:  # type: ignore[union-attr]
                    st.fail(f"expected output {p.index} of {p.node.op_type}", v)  # type: ignore[union-attr]
                else:
                    st.fail(
                        f"expected {p.node.qualified_name}, found {_qualified(producer)}",  # type: ignore[union-attr]
                        None,
                        producer,
                    )
                return
            yield from self._match_node(p.node, producer, st)  # type: ignore[union-attr]
        elif kind is Const:
            if self._const_ok(p, v):  # type: ignore[arg-type]
                yield
            else:
                st.fail(f"expected constant {p}", v)
        elif kind is Either:
            yield from self._match_either(p, v, st)  # type: ignore[arg-type]
        elif kind is OptionalInput:
            if v is None:
                new = [n for n in self._vars[id(p)] if n not in st.bindings]
                for n in new:
                    st.bindings[n] = None
                yield
                for n in new:
                    del st.bindings[n]
            else:
                yield from self._match_value(p.inner, v, st)  # type: ignore[union-attr]
        elif p is None:
            if v is None:
                yield
            else:
                st.fail("expected an absent input", v)
        else:  # pragma: no cover - patterns are validated at definition time
            raise AssertionError(f"unknown pattern {p!r}")

    def _match_either(self, p: Either, v: ir.Value | None, st: _State) -> Iterator[None]:
        """Each alternative in turn; binds ``p.tag`` to its index and the variables of the
        other alternatives to ``None``."""
        for index, alt in enumerate(p.alternatives):
            added = [n for n in self._vars[id(p)] if n not in st.bindings]
            if p.tag is not None:
                if p.tag in st.bindings and st.bindings[p.tag] != index:
                    st.fail(f"tag {p.tag!r} chose alternative {st.bindings[p.tag]}", v)
                    continue
                st.bindings[p.tag] = index
            for _ in self._match_value(alt, v, st):
                missing = [n for n in added if n not in st.bindings]
                for n in missing:
                    st.bindings[n] = None
                yield
                for n in missing:
                    del st.bindings[n]
            if p.tag is not None and p.tag in added:
                del st.bindings[p.tag]

    @staticmethod
    def _const_ok(p: Const, v: ir.Value | None) -> bool:
        arr = const_value(v)
        if arr is None:
            return False
        expected = np.asarray(p.value)
        if expected.ndim == 0:
            if arr.size != 1 or arr.ndim > 1:
                return False
            arr = arr.reshape(())
        elif arr.shape != expected.shape:
            return False
        if arr.dtype.kind not in "biuf" or expected.dtype.kind not in "biuf":
            return bool(np.array_equal(arr, expected))
        return bool(np.allclose(arr.astype(np.float64), expected, rtol=p.rtol, atol=p.atol))

    # --- nodes -----------------------------------------------------------------------------
    def _match_node(self, p: NodePattern, node: ir.Node, st: _State) -> Iterator[None]:
        st.steps += 1
        if st.steps > MAX_STEPS:
            st.fail(f"match abandoned after {MAX_STEPS} steps", None, node)
            return
        seen = st.nodes.get(p)
        if seen is not None:
            if seen is node:
                yield
            else:
                st.fail(f"{p.op_type} must be the same node at both uses", None, node)
            return
        if node.op_type != p.op_type or node.domain != p.domain:
            st.fail(f"expected {p.qualified_name}, found {_qualified(node)}", None, node)
            return
        if len(node.outputs) < p.num_outputs:
            st.fail(
                f"{p.op_type} has {len(node.outputs)} outputs, pattern uses {p.num_outputs}",
                None,
                node,
            )
            return
        added = self._match_attributes(p, node, st)
        if added is None:
            return
        if p.name is not None:
            bound = st.bindings.get(p.name, _UNBOUND)
            if bound is _UNBOUND:
                st.bindings[p.name] = node.outputs[0]
                added.append(p.name)
            elif bound is not node.outputs[0]:
                st.fail(f"variable {p.name!r} bound to two different values", node.outputs[0])
                for n in added:
                    del st.bindings[n]
                return
        inputs = list(node.inputs)
        while inputs and inputs[-1] is None:
            inputs.pop()
        n_pat = len(p.inputs)
        if len(inputs) > n_pat:
            st.fail(f"{p.op_type} has {len(inputs)} inputs, pattern expects {n_pat}", None, node)
            for n in added:
                del st.bindings[n]
            return
        inputs += [None] * (n_pat - len(inputs))
        st.nodes[p] = node
        st.depth += 1
        yield from self._match_inputs(p.inputs, inputs, 0, st)
        if p.commutative and n_pat == 2 and inputs[0] is not inputs[1]:
            yield from self._match_inputs(p.inputs, inputs[::-1], 0, st)
        st.depth -= 1
        del st.nodes[p]
        for n in added:
            del st.bindings[n]

    def _match_inputs(
        self, pats: Sequence[Pattern | None], vals: Sequence[ir.Value | None], i: int, st: _State
    ) -> Iterator[None]:
        if i == len(pats):
            yield
            return
        for _ in self._match_value(pats[i], vals[i], st):
            yield from self._match_inputs(pats, vals, i + 1, st)

    @staticmethod
    def _match_attributes(p: NodePattern, node: ir.Node, st: _State) -> list[str] | None:
        """Check attributes and bind captures; returns the names bound, or None on failure."""
        added: list[str] = []
        for name, expected in p.attributes.items():
            a = node.attributes.get(name)
            actual = (
                _normalize(a.value)
                if a is not None
                else _schema_default(node.domain, node.op_type, name, st.opset)
            )
            if isinstance(expected, AttrVar):
                bound = st.bindings.get(expected.name, _UNBOUND)
                if bound is _UNBOUND:
                    st.bindings[expected.name] = actual
                    added.append(expected.name)
                    continue
                expected = bound
            if actual != _normalize(expected):
                st.fail(f"attribute {name}={actual!r}, pattern requires {expected!r}", None, node)
                for n in added:
                    del st.bindings[n]
                return None
        if p.exact_attributes:
            extra = sorted(set(node.attributes) - set(p.attributes))
            if extra:
                st.fail(f"{p.op_type} has unexpected attributes {extra}", None, node)
                for n in added:
                    del st.bindings[n]
                return None
        return added

    # --- whole match -----------------------------------------------------------------------
    def _validate(self, st: _State) -> Match | MatchFailure:
        matched = st.nodes
        nodes = list(dict.fromkeys(matched.values()))
        outputs = []
        for o in self.outputs:
            if isinstance(o, NodeOutput):
                outputs.append(matched[o.node].outputs[o.index])
            else:  # Either at the root: the anchor's first output
                outputs.append(nodes[0].outputs[0])
        keep = set(outputs)
        node_set = set(nodes)
        for n in nodes:
            for out in n.outputs:
                if out in keep:
                    continue
                if out.is_graph_output():
                    return MatchFailure(
                        "an intermediate value of the match is a graph output", out, n, st.depth
                    )
                for use in out.uses():
                    if use.node not in node_set and not _dead(use.node, n):
                        return MatchFailure(
                            "an intermediate value of the match is used outside it",
                            out,
                            use.node,
                            st.depth,
                        )
        return Match(nodes, outputs, dict(st.bindings), st.opset)


def unread(node: ir.Node) -> bool:
    """Whether nothing reads ``node``'s outputs (dead code)."""
    return not any(o.uses() or o.is_graph_output() for o in node.outputs)


def _dead(node: ir.Node, beside: ir.Node) -> bool:
    """Whether nothing reads ``node``, in the graph of ``beside`` (a node left for dead-code
    removal: not a real use)."""
    return node.graph is not None and node.graph is beside.graph and unread(node)


def matches(
    pattern: Pattern, value: ir.Value | None, opset: int, **bindings: Any
) -> dict[str, Any] | MatchFailure:
    """Whether ``value`` looks like ``pattern``: a pattern in a check, for what the rule's match
    leaves outside (a value whose producers must stay, such as a repeated key other nodes use).

    Args:
        pattern: An op pattern (or an :func:`~irkit.rewriting.either` of them).
        value: The value to look at; its producers are looked at, never changed.
        opset: The graph's ONNX opset (``match.opset``), for attributes' schema defaults.
        **bindings: Variables already known (the rule's own bindings): the pattern must agree.

    Returns:
        The bindings of the first match (``bindings`` included), or the :class:`MatchFailure`
        of the nearest miss.

    Raises:
        RuleDefinitionError: ``pattern`` is not produced by an op.

    Example:
        >>> from irkit.rewriting._pattern import op, var
        >>> x = ir.val("x", ir.DataType.FLOAT, [2])
        >>> y = ir.node("Neg", [ir.node("Relu", [x]).outputs[0]]).outputs[0]
        >>> matches(op.Neg(op.Relu(var("a"))), y, 18, a=x)["a"] is x
        True
        >>> matches(op.Neg(op.Sigmoid(var("a"))), y, 18).reason
        'expected Sigmoid, found Relu'
    """
    return Matcher([pattern]).match_value(value, opset, bindings)


def _qualified(node: ir.Node) -> str:
    return f"{node.domain}::{node.op_type}" if node.domain else node.op_type
