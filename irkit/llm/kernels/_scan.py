"""``scan(step, init, xs, dim)`` through torch's scan operator itself.

torch's ``scan`` function (``torch._higher_order_ops.scan.scan``) compiles its body with dynamo
before the operator traces it: under ``torch.export`` that compile was most of a state model's
export (profiled: RWKV 8.7 of 11.7 s, Mamba 4.8 of 8.6 s). :func:`scan_along` takes the same
``step(carry, x) -> (carry, y)`` over pytrees and calls the operator (``scan_op``) with flat,
token-major operands; the program is the same ``scan`` node.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["scan_along"]


def scan_along(step: Callable[[Any, Any], tuple[Any, Any]], init: Any, xs: Any, dim: int) -> Any:
    """``(final carry, ys stacked on axis dim)`` of ``step`` over axis ``dim`` of ``xs``.

    Args:
        step: ``step(carry, x) -> (carry, y)``; ``carry``, ``x`` and ``y`` tensors or pytrees
            of tensors (``x``: ``xs`` sliced at one index of ``dim``).
        init: The first carry.
        xs: The scanned tensors (a tensor or a pytree of them), all of one length on ``dim``.
        dim: The scanned axis of every tensor of ``xs`` (and of every ``y``, stacked).

    Returns:
        ``(carry, ys)`` in ``init``'s and ``step``'s ``y`` structure.
    """
    import torch.utils._pytree as pytree
    from torch._higher_order_ops.scan import scan_op

    carries, carry_spec = pytree.tree_flatten(init)
    leaves, xs_spec = pytree.tree_flatten(xs)
    count = len(carries)
    out_spec: list[Any] = []

    def flat_step(*args: Any) -> list[Any]:
        carry = pytree.tree_unflatten(list(args[:count]), carry_spec)
        x = pytree.tree_unflatten(list(args[count : count + len(leaves)]), xs_spec)
        new, y = step(carry, x)
        ys, spec = pytree.tree_flatten(y)
        out_spec[:] = [spec]
        return _unaliased([*pytree.tree_leaves(new), *ys], args)

    result = scan_op(flat_step, carries, [leaf.movedim(dim, 0) for leaf in leaves], ())
    final = pytree.tree_unflatten(list(result[:count]), carry_spec)
    ys = [y.movedim(0, dim) for y in result[count:]]
    return final, pytree.tree_unflatten(ys, out_spec[0])


def _unaliased(outputs: list[Any], inputs: Sequence[Any]) -> list[Any]:
    """``outputs``, each one that is an input or an earlier output cloned (the operator
    refuses a body whose outputs alias its inputs or each other)."""
    seen: list[Any] = list(inputs)
    out = []
    for t in outputs:
        if any(t is s for s in seen):
            t = t.clone()
        seen.append(t)
        out.append(t)
    return out
