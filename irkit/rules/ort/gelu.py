"""``Gelu`` (+ bias) → onnxruntime's ``BiasGelu`` / ``FastGelu`` (``com.microsoft``).

Identities (``Gelu`` as the ``"onnx"`` fusions produce it, :mod:`irkit.rules.gelu`; ``bias``
1-D, added along the last axis):

- ``Gelu(x + bias) = BiasGelu(x, bias)``                      (exact, erf form)
- ``Gelu(x + bias, approximate="tanh") = FastGelu(x, bias)``
- ``Gelu(x, approximate="tanh") = FastGelu(x)``

Preconditions: opset ≥ 20 (``Gelu``); ``x`` float16/float32 of known rank; ``bias`` 1-D with
the size of ``x``'s last axis, same dtype (the ops broadcast it only along that axis).
"""

from __future__ import annotations

import onnx_ir as ir

from irkit.rewriting import Rule, RuleSet, Verdict, dims, fail, op, var
from irkit.rules._ort_types import ORT_FLOAT_TYPES

MS = "com.microsoft"

x, bias = var("x"), var("bias")


def _check_x(x: ir.Value) -> Verdict:
    if x.dtype not in ORT_FLOAT_TYPES:
        return fail(f"dtype {x.dtype}: the contrib op runs float16/float32", x)
    if dims(x) is None or not dims(x):
        return fail("input rank unknown or 0", x)
    return True


def _last_dim(x: ir.Value) -> int | str | None:
    """``x``'s last dim: from its shape, else from the weight of the product computing it."""
    d = dims(x)
    if d:
        return d[-1]
    p = x.producer()
    if p is None or p.op_type not in ("MatMul", "FusedMatMul") or len(p.inputs) != 2:
        return None
    w = dims(p.inputs[1])
    if not w or len(w) < 2:
        return None
    trans_b = p.attributes.get("transB")
    return w[-2] if trans_b is not None and trans_b.value else w[-1]


def _check_bias(x: ir.Value, bias: ir.Value) -> Verdict:
    if x.dtype not in ORT_FLOAT_TYPES and not (x.dtype is None and bias.dtype in ORT_FLOAT_TYPES):
        return fail(f"dtype {x.dtype}: the contrib op runs float16/float32", x)
    last, db = _last_dim(x), dims(bias)
    if last is None:
        return fail("input's last dim unknown", x)
    if db is None or len(db) != 1 or db[0] is None or db[0] != last:
        return fail(f"bias shape {db} is not [{last}] (the last axis of the input)", bias)
    if x.dtype is not None and bias.dtype != x.dtype:
        return fail(f"bias dtype {bias.dtype} differs from input dtype {x.dtype}", bias)
    return True


rules = RuleSet(
    "ort_gelu",
    [
        Rule(  # Gelu(x + bias) = BiasGelu(x, bias)
            "BiasGelu",
            op.Gelu(x + bias, approximate="none"),
            check=_check_bias,
            rewrite=lambda op, x, bias: op.domain(MS).BiasGelu(x, bias),
            min_opset=20,
        ),
        Rule(  # Gelu(x + bias, approximate="tanh") = FastGelu(x, bias)
            "FastGeluBias",
            op.Gelu(x + bias, approximate="tanh"),
            check=_check_bias,
            rewrite=lambda op, x, bias: op.domain(MS).FastGelu(x, bias),
            min_opset=20,
        ),
        Rule(  # Gelu(x, approximate="tanh") = FastGelu(x)
            "FastGelu",
            op.Gelu(x, approximate="tanh"),
            check=_check_x,
            rewrite=lambda op, x: op.domain(MS).FastGelu(x),
            min_opset=20,
        ),
    ],
)
"""The GELU contrib-op rules."""
