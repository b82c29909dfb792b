"""The L2 norm, written by hand: ``sqrt(sum(x², axes)) = ReduceL2(x, axes)`` (opset ≥ 18).

``x.pow(2).sum(-1, keepdim=True).sqrt()`` exports as ``Sqrt(ReduceSum(Pow(x, 2), axes))``;
``x * x`` is the same square. The reduction's attributes are captured with ``attr`` and carried
over, so ``keepdims`` and the empty-axes behaviour stay what they were.
"""

from irkit import Rule, attr, either, op, var

x, axes = var("x"), var("axes")

l2_norm = Rule(
    "ReduceL2",
    op.Sqrt(
        op.ReduceSum(
            either(x * x, x**2.0),
            axes,
            keepdims=attr("keepdims"),
            noop_with_empty_axes=attr("noop"),
        )
    ),
    rewrite=lambda op, x, axes, keepdims, noop: op.ReduceL2(
        x, axes, keepdims=keepdims, noop_with_empty_axes=noop
    ),
    min_opset=18,
)
