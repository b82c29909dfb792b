"""HardSwish, written by hand: ``x · relu6(x + 3) / 6 = HardSwish(x)`` (ONNX opset ≥ 14).

MobileNetV3-style code spells the activation out (``x * F.relu6(x + 3) / 6``); the exporter
writes ``Clip(x + 3, 0, 6)`` for ``relu6``, and the division by 6 may be a multiplication by
1/6. One ``HardSwish`` node computes the same (its ``alpha = 1/6, beta = 1/2``).
"""

from irkit import Const, Rule, either, op, var

x = var("x")
relu6 = op.Clip(x + 3.0, 0.0, 6.0)

hard_swish = Rule(
    "HardSwishFromRelu6",
    either(x * relu6 / 6.0, x * relu6 * Const(1 / 6, rtol=1e-6)),
    rewrite=lambda op, x: op.HardSwish(x),
    min_opset=14,
)
