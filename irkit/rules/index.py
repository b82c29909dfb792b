"""Index ops: a slice of ``GatherElements``' result is the gather of the sliced indices.

``GatherElements(d, i, axis=a)`` has ``i``'s shape and reads, at every position ``p``,
``d`` at ``p`` with its axis-``a`` coordinate replaced by ``i[p]``: position for position it
follows ``i``. So slicing the result (any axes, starts, ends, steps) is gathering with the same
slice of ``i``::

    Slice(GatherElements(d, i, axis=a), s, e, axes, t) = GatherElements(d, Slice(i, s, e, axes, t), axis=a)

Where several gathers share their indices (irkit's export reads each layer's convolution state
at the same columns, ``present = gather(...)[..., 1:]``), the sliced indices are one value that
``CSE`` computes once, instead of one ``Slice`` per layer (and the gather reads fewer columns).

Valid at every opset (``GatherElements`` ≥ 11) and inside function bodies.
"""

from __future__ import annotations

from irkit.rewriting import Rule, RuleSet, attr, op, optional, var

__all__ = ["rules"]

d, i = var("d"), var("i")
starts, ends, axes, steps = var("starts"), var("ends"), var("axes"), var("steps")

rules = RuleSet(
    "index",
    [
        Rule(  # Slice(GatherElements(d, i), …) = GatherElements(d, Slice(i, …))
            "SliceOfGatherElements",
            op.Slice(
                op.GatherElements(d, i, axis=attr("axis")),
                starts,
                ends,
                optional(axes),
                optional(steps),
            ),
            rewrite=lambda op, d, i, starts, ends, axes, steps, axis: op.GatherElements(
                d, op.Slice(i, starts, ends, axes, steps), axis=axis
            ),
            min_opset=11,
        ),
    ],
)
"""The index rules."""
