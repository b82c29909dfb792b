"""Planning: decide every node's lowering before emitting anything.

The plan finds *all* unsupported ops at once (one :class:`UnsupportedOpError` listing each op,
its count and first occurrence), decomposes exactly the nodes that have no direct lowering
(tracing the decomposition on the node's fake inputs, recursively planned), and tells whether
the program's in-place ops can be handled by renaming or need functionalization.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import torch

from irkit.errors import LoweringError, UnsupportedOpError
from irkit.lowering._control_flow import plan_bodies
from irkit.lowering._plan_types import Choice, Decomposition, Plan, Via
from irkit.lowering._regions import region_body, region_op
from irkit.lowering._registry import LoweringTable, custom_op_implementation
from irkit.lowering._source import node_location
from irkit.lowering._source import op_name as _op_name
from irkit.lowering._trace import ASSUMPTIONS, trace_decomposition

__all__ = ["Plan", "make_plan", "needs_functionalization", "Decomposition"]

logger = logging.getLogger(__name__)

_MAX_DECOMPOSITION_DEPTH = 4


@dataclasses.dataclass
class _Missing:
    """Ops without a lowering, in order of first occurrence, with why decomposing failed."""

    nodes: dict[str, list[torch.fx.Node]] = dataclasses.field(default_factory=dict)
    reasons: dict[str, str] = dataclasses.field(default_factory=dict)

    def add(self, node: torch.fx.Node, reason: str = "") -> None:
        name = _op_name(node.target)
        self.nodes.setdefault(name, []).append(node)
        if reason:
            self.reasons.setdefault(name, reason)

    def __bool__(self) -> bool:
        return bool(self.nodes)


def make_plan(graph: torch.fx.Graph, table: LoweringTable) -> Plan:
    """Plan every ``call_function`` node of ``graph``.

    Raises:
        UnsupportedOpError: Listing every op without a lowering, in order of first occurrence.
    """
    missing = _Missing()
    plan = _plan_graph(graph, table, missing, depth=0)
    if missing:
        raise UnsupportedOpError(
            [
                (name, len(nodes), nodes[0].name, node_location(nodes[0]))
                for name, nodes in missing.nodes.items()
            ],
            reasons=missing.reasons,
        )
    return plan


def _plan_graph(
    graph: torch.fx.Graph,
    table: LoweringTable,
    missing: _Missing,
    depth: int,
    decomposing: frozenset[Any] = frozenset(),
) -> Plan:
    plan = Plan()
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        choice = table.choose(node)
        if choice is not None and choice.via is Via.INPLACE:
            choice = _functional_choice(node, choice, table)
        if choice is None:
            missing.add(node)
            continue
        plan.choices[node] = choice
        if choice.via is Via.REGION:
            region = region_op(node.target)
            if region is None:  # (the table chose REGION for it)
                raise _not_a_region(node)
            body = region_body(node, region)
            plan.decompositions[node] = Decomposition(
                body, _plan_graph(body.graph, table, missing, depth, decomposing)
            )
        elif choice.via is Via.CONTROL_FLOW:

            def plan_one(g: torch.fx.GraphModule) -> tuple[Decomposition, _Missing]:
                sub = _Missing()
                return Decomposition(g, _plan_graph(g.graph, table, sub, depth, decomposing)), sub

            plan.bodies[node] = plan_bodies(node, plan_one, missing)
        elif choice.via is Via.DECOMPOSE:
            found = _plan_decomposition(node, choice, table, depth, decomposing)
            if isinstance(found, Decomposition):
                plan.decompositions[node] = found
            else:
                missing.add(node, found)  # the op the user wrote, with what stopped it
    return plan


def _functional_choice(node: torch.fx.Node, choice: Choice, table: LoweringTable) -> Choice | None:
    """An in-place op lowered as its functional counterpart (directly or decomposed)."""
    if choice.functional is None:
        raise LoweringError(
            "the in-place op was planned through its functional counterpart, but the lowering "
            "table names none. This is likely a bug in irkit; please report it with this message.",
            fx_node=node.name,
            target=_op_name(node.target),
            source=node_location(node),
        )
    functional = table.choose(node, target=choice.functional)
    if functional is None or functional.via is Via.INPLACE:
        return None
    via = Via.DECOMPOSE if functional.via is Via.DECOMPOSE else Via.INPLACE
    return dataclasses.replace(functional, via=via, functional=choice.functional)


def _plan_decomposition(
    node: torch.fx.Node,
    choice: Choice,
    table: LoweringTable,
    depth: int,
    decomposing: frozenset[Any],
) -> Decomposition | str:
    """The first of torch's decompositions of ``node`` that lowers entirely, or why none did."""
    if depth >= _MAX_DECOMPOSITION_DEPTH:
        return f"decompositions nest deeper than {_MAX_DECOMPOSITION_DEPTH} levels"
    if node.target in decomposing:
        return "its decomposition leads back to itself"
    decomposing = decomposing | {node.target}
    reasons = []
    candidates = choice.candidates or tuple(f for f in (choice.fn,) if f is not None)
    for fn in candidates:
        try:
            gm = trace_decomposition(node, fn)
        except LoweringError as exc:
            reasons.append(f"tracing a decomposition failed ({_first_line(exc.__cause__ or exc)})")
            continue
        sub_missing = _Missing()
        sub_plan = _plan_graph(gm.graph, table, sub_missing, depth + 1, decomposing)
        if not sub_missing:
            own = isinstance(node.target, torch._ops.OpOverload) and (
                fn in custom_op_implementation(node.target)
            )
            return Decomposition(gm, sub_plan, custom_op=own)
        inner = ", ".join(
            f"{name} ({sub_missing.reasons[name]})" if name in sub_missing.reasons else name
            for name in sub_missing.nodes
        )
        reasons.append(f"a decomposition needs {inner}")
    return "; ".join(reasons)


def _not_a_region(node: torch.fx.Node) -> LoweringError:
    return LoweringError(
        "planned as a context region, but its target is none. This is a bug in irkit; please "
        "report it with this message.",
        fx_node=node.name,
        target=_op_name(node.target),
        source=node_location(node),
    )


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:160]}" if text else type(exc).__name__


def _is_view(target: Any) -> bool:
    return isinstance(target, torch._ops.OpOverload) and bool(getattr(target, "is_view", False))


def needs_functionalization(graph: torch.fx.Graph, plan: Plan) -> list[torch.fx.Node]:
    """In-place nodes that renaming cannot handle (they mutate an input or an aliased tensor).

    Renaming — later uses of the mutated tensor read the in-place op's result — is exact when
    the mutated tensor is a fresh intermediate that no view shares. Otherwise the program must be
    functionalized first.
    """
    bad = []
    for node, choice in plan.choices.items():
        if choice.functional is None or choice.identity:
            continue  # not in place, or computes nothing (``dropout_`` in eval mode)
        mutated = node.args[0]
        if (
            not isinstance(mutated, torch.fx.Node)
            or mutated.op != "call_function"
            or _is_view(mutated.target)
            or any(_is_view(user.target) for user in mutated.users if user is not node)
        ):
            bad.append(node)
    return bad


def assumptions(plan: Plan) -> list[tuple[torch.fx.Node, Any, str]]:
    """(program node, op decomposed, condition) for every condition on symbolic sizes a traced
    decomposition followed without the program guaranteeing it (nested ones included)."""
    found = []
    for node, decomposition in plan.decompositions.items():
        found += [
            (node, node.target, a) for a in decomposition.graph_module.meta.get(ASSUMPTIONS, ())
        ]
        found += [(node, target, a) for _, target, a in assumptions(decomposition.plan)]
    return found


def describe(plan: Plan) -> str:
    counts = plan.histogram()
    return ", ".join(
        f"{via.value}: {n}" for via, n in sorted(counts.items(), key=lambda kv: kv[0].name)
    )
