"""irkit's own ``squeeze``: only the dims torch squeezed, which the export already decided.

torch squeezes a requested dim only if its size is 1 (``squeeze(1)`` on a dim of 16 is a no-op);
for a symbolic size it asks ``guard_or_false(size == 1)`` at export time, so a dim that stays
symbolic in the program was *not* squeezed (had torch decided otherwise, the size would have been
specialized to the constant 1). torchlib writes ``Squeeze(axes=[dim])`` for every requested dim,
which onnxruntime refuses when the dim is not 1 (PixArt's ``squeeze(1)`` on 16 tokens), and its
``squeeze()`` without dims squeezes at run time every dim that happens to be 1 — a symbolic one
included, which changes the rank the program promised. Here: ``Squeeze`` of exactly the dims of
static size 1 among those requested, ``Identity`` when there are none. The plan-time test checks
that this gives the rank torch computed; otherwise the node keeps torchlib's lowering.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import onnx_ir as ir
import torch
from onnxscript import opset18 as op

from irkit.lowering._own_common import ints
from irkit.lowering._registration import own

__all__: list[str] = []  # (lowerings registered with @own, collected by _own.own_lowerings)

aten = torch.ops.aten


def _requested(rank: int, dim: int | Sequence[int] | None) -> list[int]:
    if dim is None:
        return list(range(rank))
    return sorted({d % rank for d in _as_list(dim)}) if rank else []


def _as_list(dim: int | Sequence[int]) -> list[int]:
    return [dim] if isinstance(dim, int) else list(dim)


def _squeezed(shape: Sequence[Any], dim: int | Sequence[int] | None) -> list[int]:
    """The requested dims torch squeezes: those of static size 1."""
    return [d for d in _requested(len(shape), dim) if isinstance(shape[d], int) and shape[d] == 1]


def _applies(node: torch.fx.Node) -> bool:
    """The input's rank is known and squeezing its static 1s gives the output's rank."""
    source, out = node.args[0], node.meta.get("val")
    value = source.meta.get("val") if isinstance(source, torch.fx.Node) else None
    if not isinstance(value, torch.Tensor) or not isinstance(out, torch.Tensor):
        return False
    dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    shape = [int(s) if isinstance(s, int) else s for s in value.shape]
    return value.dim() - len(_squeezed(shape, dim)) == out.dim()


@own(aten.squeeze.default, applies=_applies)
@own(aten.squeeze.dim, applies=_applies)
@own(aten.squeeze.dims, applies=_applies)
def _squeeze(self: ir.Value, dim: int | Sequence[int] | None = None) -> ir.Value:
    if self.shape is None:  # unknown rank: torchlib's form, every requested dim
        return op.Squeeze(self) if dim is None else op.Squeeze(self, ints(*_as_list(dim)))
    axes = _squeezed(list(self.shape), dim)
    return op.Squeeze(self, ints(*axes)) if axes else op.Identity(self)
