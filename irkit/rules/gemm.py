"""MatMul + Add → Gemm.

Identity: ``Add(MatMul(a, b), c) = Gemm(a, b, c)``   (Add is matched in either operand order)

Preconditions (``Gemm`` computes ``a @ b + c`` with ``c`` *unidirectionally* broadcast to the
``(M, N)`` result, so the Add must not broadcast the product to a larger shape):

- ``a`` and ``b`` have rank 2 (``a`` is ``(M, K)``, ``b`` is ``(K, N)``);
- ``c`` has a known shape of rank ≤ 2 whose dims (right-aligned) are 1 or equal to ``M`` / ``N``;
- the dtype is one Gemm supports (float16/32/64, bfloat16, (u)int32/64).

``c`` may be a constant or a computed value.
"""

from __future__ import annotations

import onnx_ir as ir

from irkit.rewriting import Rule, RuleSet, Verdict, dims, fail, var

a, b, c = var("a"), var("b"), var("c")

_GEMM_TYPES = frozenset(
    {
        ir.DataType.FLOAT,
        ir.DataType.FLOAT16,
        ir.DataType.DOUBLE,
        ir.DataType.BFLOAT16,
        ir.DataType.INT32,
        ir.DataType.INT64,
        ir.DataType.UINT32,
        ir.DataType.UINT64,
    }
)


def _check(a: ir.Value, b: ir.Value, c: ir.Value) -> Verdict:
    da, db, dc = dims(a), dims(b), dims(c)
    if da is None or len(da) != 2:
        return fail(f"A must have rank 2, has {'unknown rank' if da is None else len(da)}", a)
    if db is None or len(db) != 2:
        return fail(f"B must have rank 2, has {'unknown rank' if db is None else len(db)}", b)
    if dc is None:
        return fail("bias shape unknown", c)
    if len(dc) > 2:
        return fail(f"bias has rank {len(dc)} > 2", c)
    if a.dtype not in _GEMM_TYPES:
        return fail(f"dtype {a.dtype} not supported by Gemm", a)
    m, n = da[0], db[1]
    for d, want in zip(reversed(dc), (n, m), strict=False):
        if d != 1 and (d is None or d != want):
            return fail(f"bias dim {d} does not broadcast to the {m}x{n} product", c)
    return True


rules = RuleSet(
    "gemm",
    [
        Rule(  # a @ b + c = Gemm(a, b, c)
            "MatMulAddToGemm",
            a @ b + c,
            check=_check,
            rewrite=lambda op, a, b, c: op.Gemm(a, b, c),
        ),
    ],
)
