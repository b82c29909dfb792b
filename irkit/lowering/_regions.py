"""Higher-order ops that only open a context region: their body is inlined.

``torch.export`` keeps ``@torch.no_grad()``/``torch.enable_grad()`` regions as
``wrap_with_set_grad_enabled(enabled, body, *operands)`` and ``torch.autocast(...)`` regions as
``wrap_with_autocast(device, dtype, enabled, cache_enabled, body, *operands)``, with ``body`` a
``get_attr`` submodule. For an inference graph the grad mode changes nothing, and autocast's effect
is already recorded in the body's FakeTensor dtypes (the lowering casts to them like everywhere
else), so both lower as their body, inline, node by node, each body node keeping its own module
scope and source line.
"""

from __future__ import annotations

import dataclasses
import functools

import torch

from irkit.errors import LoweringError
from irkit.lowering._source import node_location, op_name

__all__ = ["RegionOp", "region_op", "region_body", "region_operands"]


@dataclasses.dataclass(frozen=True)
class RegionOp:
    """Where the body submodule and its operands sit in a context HOP's arguments."""

    body_index: int


@functools.cache
def _table() -> dict[torch._ops.HigherOrderOperator, RegionOp]:
    hop = torch.ops.higher_order
    return {
        hop.wrap_with_set_grad_enabled: RegionOp(body_index=1),
        hop.wrap_with_autocast: RegionOp(body_index=4),
    }


def region_op(target: object) -> RegionOp | None:
    """The :class:`RegionOp` of a context higher-order op, or None for any other target."""
    if not isinstance(target, torch._ops.HigherOrderOperator):
        return None
    return _table().get(target)


def region_body(node: torch.fx.Node, region: RegionOp) -> torch.fx.GraphModule:
    """The body ``GraphModule`` of a context HOP node (its ``get_attr`` argument resolved)."""
    attr = node.args[region.body_index]
    owner = node.graph.owning_module
    if not (isinstance(attr, torch.fx.Node) and attr.op == "get_attr" and owner is not None):
        raise LoweringError(
            f"expected a get_attr submodule as argument {region.body_index}, got {attr!r}. "
            "Fix: export the model with torch.export.export (bodies are then submodules).",
            fx_node=node.name,
            target=op_name(node.target),
            source=node_location(node),
        )
    body: object = owner
    for part in str(attr.target).split("."):
        body = getattr(body, part)
    if not isinstance(body, torch.fx.GraphModule):
        raise LoweringError(
            f"argument {region.body_index} names {attr.target!r}, a {type(body).__name__}, "
            "not a torch.fx.GraphModule. Fix: export the model with torch.export.export.",
            fx_node=node.name,
            target=op_name(node.target),
            source=node_location(node),
        )
    return body


def region_operands(node: torch.fx.Node, region: RegionOp) -> tuple[object, ...]:
    """The arguments the body receives, in placeholder order."""
    return tuple(node.args[region.body_index + 1 :])
