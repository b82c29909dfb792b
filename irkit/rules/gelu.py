"""GELU from its decomposed forms → the ONNX ``Gelu`` op (opset ≥ 20).

Identities (``x`` any floating-point tensor):

- erf form:  ``0.5 · x · (1 + erf(x / √2)) = Gelu(x)``
- tanh form: ``0.5 · x · (1 + tanh(√(2/π) · (x + 0.044715 · x³))) = Gelu(x, approximate="tanh")``

Each is matched in the association orders exporters and hand-written code produce:
``(x·0.5)·t``, ``(x·t)·0.5``, ``x·(t·0.5)`` and ``(x·t)/2`` (products in either operand order);
``x/√2`` or ``x·(1/√2)``; ``x³`` as ``Pow(x, 3)``, ``x·x·x`` in either grouping.
Constants are compared with a relative tolerance of 1e-3, so float16-rounded constants match too.

Preconditions: graph opset ≥ 20; ``x`` has a floating-point dtype (implied by Erf / Tanh when
unknown, as in untyped function bodies).
"""

from __future__ import annotations

import math

import onnx_ir as ir

from irkit.rewriting import Const, Pattern, Rule, RuleSet, Verdict, either, fail, is_float, op, var

x = var("x")


def _c(value: float) -> Const:
    return Const(value, rtol=1e-3, atol=0.0)  # float16 rounding of e.g. 0.7071 / 0.0447


HALF, ONE, TWO, THREE = _c(0.5), _c(1.0), _c(2.0), _c(3.0)


def _half_x_times(term: Pattern) -> Pattern:
    """0.5 · x · term, in the association orders found in practice."""
    return either(x * HALF * term, x * term * HALF, x * (term * HALF), x * term / TWO)


_ERF_TERM = op.Erf(either(x / _c(math.sqrt(2.0)), x * _c(1.0 / math.sqrt(2.0)))) + ONE

_CUBE = either(x**THREE, x * x * x, x * (x * x))
_TANH_TERM = op.Tanh((x + _CUBE * _c(0.044715)) * _c(math.sqrt(2.0 / math.pi))) + ONE


def _float(x: ir.Value) -> Verdict:
    # Erf and Tanh accept only float types, so an unknown dtype (function bodies) is float too.
    if x.dtype is None or is_float(x):
        return True
    return fail(f"Gelu needs a float input, got {x.dtype}", x)


rules = RuleSet(
    "gelu",
    [
        Rule(  # 0.5·x·(1 + erf(x/√2)) = Gelu(x)
            "GeluErf",
            _half_x_times(_ERF_TERM),
            check=_float,
            rewrite=lambda op, x: op.Gelu(x),
            min_opset=20,
        ),
        Rule(  # 0.5·x·(1 + tanh(√(2/π)(x + 0.044715x³))) = Gelu(x, approximate="tanh")
            "GeluTanh",
            _half_x_times(_TANH_TERM),
            check=_float,
            rewrite=lambda op, x: op.Gelu(x, approximate="tanh"),
            min_opset=20,
        ),
    ],
)
"""The GELU rules."""
