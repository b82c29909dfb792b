"""Three or more projections of one input packed into one ``MatMul`` (Q/K/V), and a packed pair
unpacked (gate/up), for ``target="ort"``.

The rules are :class:`irkit.rules.packed.PackedMatMul` and
:class:`~irkit.rules.packed.UnpackedMatMulPair` (standard ONNX ops: ``MatMul`` +
``Split``; it also takes ``FusedMatMul(x, w, transB=1)``); see :mod:`irkit.rules.packed` for the
identity and preconditions. With ``irkit.optimize(target="ort")`` the module calls are opened
for the rewrite, so weights that were function parameters are initializers here; the
re-outlined function takes the packed weight as an input passed at each call site. The ``"ort"``
rule set runs it before ``FusedMatMul`` (:func:`irkit.rules.ort.contrib_rules`).
"""

from __future__ import annotations

from irkit.rewriting import RuleSet
from irkit.rules.packed import PackedMatMul, UnpackedMatMulPair, weight_tensor

__all__ = ["PackedMatMul", "UnpackedMatMulPair", "weight_tensor", "rules"]

rules = RuleSet("ort_packed", [PackedMatMul(), UnpackedMatMulPair()])
"""The packing rule and its converse for a pair."""
