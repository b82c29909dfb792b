"""irkit's own ``copy`` (the source broadcast to the destination's shape) and ``diagonal_scatter``.

``aten.copy(self, src)`` — the functional form of ``self.copy_(src)`` — is a tensor of
``self``'s shape and dtype holding ``src`` broadcast to it (``y[1:, 2].copy_(x[0, 0])`` writes
one value into a column). torchlib writes ``CastLike(src, self)``, which keeps ``src``'s shape:
a lower-rank source then gives a lower-rank result, and onnxruntime refuses what reads it (a
``select_scatter``'s ``Unsqueeze`` of a scalar). Here, where the shapes differ:
``Expand(CastLike(src, self), Shape(self))``; equal shapes keep torchlib's lowering.
"""

from __future__ import annotations

import onnx_ir as ir
import torch
from onnxscript import opset18 as op

from irkit.lowering._registration import own

__all__: list[str] = []  # (lowerings registered with @own, collected by _own.own_lowerings)

aten = torch.ops.aten


def _broadcasts(node: torch.fx.Node) -> bool:
    """``src`` may have another shape than ``self`` (torchlib's ``CastLike`` would keep it)."""
    self, src = node.args[0], node.args[1]
    if not isinstance(self, torch.fx.Node) or not isinstance(src, torch.fx.Node):
        return False
    a, b = self.meta.get("val"), src.meta.get("val")
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        return False
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    if a.dim() != b.dim():
        return True
    return not all(statically_known_true(x == y) for x, y in zip(a.shape, b.shape, strict=True))


@own(aten.copy.default, applies=_broadcasts)
def _copy(self: ir.Value, src: ir.Value, non_blocking: bool = False) -> ir.Value:
    return op.Expand(op.CastLike(src, self), op.Shape(self))


def _ranked(node: torch.fx.Node) -> bool:
    value = node.args[0].meta.get("val") if isinstance(node.args[0], torch.fx.Node) else None
    return isinstance(value, torch.Tensor)


@own(aten.diagonal_scatter.default, applies=_ranked)
def _diagonal_scatter(
    self: ir.Value, src: ir.Value, offset: int = 0, dim1: int = 0, dim2: int = 1
) -> ir.Value:
    """``self`` with its ``offset`` diagonal over ``(dim1, dim2)`` replaced by ``src``.

    torchlib has no lowering, and torch's decomposition (a ``copy_`` into the diagonal view of
    a clone) loses the write. With the two dims moved last (``[..., A, B]``; ``src`` is
    ``[..., n]``, the diagonal last as ``torch.diagonal`` gives it): element ``(r, c)`` is on
    the diagonal where ``c - r == offset``, and there takes ``src[..., r - max(-offset, 0)]``
    (gathered per row, its index clipped into ``src``, which gets one padding element so an
    empty diagonal gathers too); elsewhere ``self``'s.
    """
    rank = len(self.shape) if self.shape is not None else 0
    d1, d2 = dim1 % rank, dim2 % rank
    rest = [d for d in range(rank) if d not in (d1, d2)]
    perm = [*rest, d1, d2]
    inverse = [perm.index(d) for d in range(rank)]
    moved = op.Transpose(self, perm=perm)
    rows = op.Shape(moved, start=rank - 2, end=rank - 1)
    cols = op.Shape(moved, start=rank - 1, end=rank)
    zero, one = op.Constant(value_int=0), op.Constant(value_int=1)
    row = op.Range(zero, op.Squeeze(rows), one)  # [A]
    col = op.Range(zero, op.Squeeze(cols), one)  # [B]
    on_diagonal = op.Equal(
        op.Sub(op.Unsqueeze(col, [0]), op.Unsqueeze(row, [1])),
        op.Constant(value_int=offset),
    )  # [A, B]
    padded = op.Concat(
        src,
        op.Expand(
            op.CastLike(op.Constant(value_int=0), src),
            op.Concat(op.Shape(src, end=-1), op.Constant(value_ints=[1]), axis=0),
        ),
        axis=-1,
    )
    index = op.Clip(
        op.Sub(row, op.Constant(value_int=max(-offset, 0))),
        zero,
        op.Squeeze(op.Shape(src, start=-1)),
    )  # [A]: the padding element where a row has no diagonal element
    per_row = op.Unsqueeze(op.Gather(padded, index, axis=-1), [-1])  # [..., A, 1]
    return op.Transpose(op.Where(on_diagonal, per_row, moved), perm=inverse)
