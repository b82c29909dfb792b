"""Mish, written by hand: ``x · tanh(softplus(x)) = Mish(x)`` (ONNX opset ≥ 18).

``softplus(x)`` comes as the ``Softplus`` op or spelled out as ``log(1 + exp(x))``; ``either``
lists both forms, and ``Add``/``Mul`` match their operands in either order.
"""

from irkit import Rule, either, op, var

x = var("x")
softplus = either(op.Softplus(x), op.Log(op.Exp(x) + 1.0))

mish = Rule(
    "Mish",
    x * op.Tanh(softplus),
    rewrite=lambda op, x: op.Mish(x),
    min_opset=18,
)
