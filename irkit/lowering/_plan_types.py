"""The planner's records, shared by the modules that build and read them.

:class:`Via` and :class:`Choice` (one node's lowering, from ``_registry``), :class:`Plan` and
:class:`Decomposition` (from ``_plan``), and the emitter's :class:`Frame`. They live here, below
the registry, the planner, control flow and the emitter, so that those modules import each other
in one direction only.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
from collections.abc import Callable
from typing import Any

import onnx_ir as ir
import torch

__all__ = ["Via", "Choice", "Decomposition", "Plan", "Frame", "Env"]

Env = dict[torch.fx.Node, Any]
"""FX node → its lowered value (an ``ir.Value``, a tuple of them, or a Python constant)."""


class Via(enum.Enum):
    """How a node is lowered."""

    CUSTOM = "custom lowering"
    IRKIT = "irkit lowering"
    TORCHLIB = "torchlib"
    INPLACE = "functional counterpart of an in-place op"
    DECOMPOSE = "decomposition"
    GETITEM = "tuple element"
    REGION = "context region (body inlined)"
    CONTROL_FLOW = "control flow (If/Loop/Scan, or a local function)"
    SKIP = "no computation"


@dataclasses.dataclass(frozen=True)
class Choice:
    """The planner's decision for one node."""

    via: Via
    fn: Callable[..., Any] | None = None
    # An in-place op lowered as its functional counterpart; later reads see the result.
    functional: torch._ops.OpOverload | None = None
    # Via.DECOMPOSE: every decomposition torch has for the op, tried in order.
    candidates: tuple[Callable[..., Any], ...] = ()
    identity: bool = False  # the lowering returns its input unchanged


@dataclasses.dataclass
class Decomposition:
    """A node's decomposition traced into a small FX graph, with that graph's own plan.

    Also a context region's body and a control-flow body: any FX graph emitted in place.
    """

    graph_module: torch.fx.GraphModule
    plan: Plan
    custom_op: bool = False
    """Traced from a ``torch.library.custom_op``'s own Python implementation
    (``decompose_custom_ops``): emitted as a local function named after the op."""


@dataclasses.dataclass
class Plan:
    """Node → how it is lowered; decomposed nodes also carry their traced sub-graph."""

    choices: dict[torch.fx.Node, Choice] = dataclasses.field(default_factory=dict)
    decompositions: dict[torch.fx.Node, Decomposition] = dataclasses.field(default_factory=dict)
    bodies: dict[torch.fx.Node, dict[str, Decomposition]] = dataclasses.field(default_factory=dict)

    def histogram(self) -> collections.Counter[Via]:
        """How many nodes take each way, decompositions' nodes included."""
        counts: collections.Counter[Via] = collections.Counter(c.via for c in self.choices.values())
        for sub in self.decompositions.values():
            counts.update(sub.plan.histogram())
        return counts


@dataclasses.dataclass
class Frame:
    """One graph being emitted: the top-level program, or a traced decomposition inside it."""

    plan: Plan
    env: Env
    prefix: str = ""  # prepended to value/node names of a decomposition
    stamp_from: torch.fx.Node | None = None  # a decomposition's nodes carry their parent's stamp
    graph: ir.Graph | None = None  # where nodes go: the main graph, or a control-flow body
