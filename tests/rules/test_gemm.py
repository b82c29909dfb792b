"""Rule family :mod:`irkit.rules.gemm`: each rule fires (golden, numbers) and declines (exact reason)."""

from __future__ import annotations

import pytest

from tests.rules.support import fire, no_fire, parse


def test_matmul_add_to_gemm():
    m = parse(
        "g (float[4,8] a, float[8,16] b, float[16] c) => (float[4,16] y) "
        "{ t = MatMul(a, b)  y = Add(c, t) }"
    )
    fire(m, "MatMulAddToGemm", {"Gemm": 1}, "gemm")


def test_gemm_2d_bias_from_input():
    m = parse(
        "g (float[4,8] a, float[8,16] b, float[4,1] c) => (float[4,16] y) "
        "{ t = MatMul(a, b)  y = Add(t, c) }"
    )
    fire(m, "MatMulAddToGemm", {"Gemm": 1})


def test_gemm_bias_of_unknown_shape():
    m = parse(
        "g (float[4,8] a, float[8,16] b, float[4,1] c) => (float[4,16] y) "
        "{ t = MatMul(a, b)  r = Relu(c)  y = Add(t, r) }"
    )
    no_fire(m, "MatMulAddToGemm", "bias shape unknown")


@pytest.mark.parametrize(
    ("sig", "reason"),
    [
        (
            "float[2,4,8] a, float[8,16] b, float[16] c) => (float[2,4,16] y",
            "A must have rank 2, has 3",
        ),
        (
            "float[4,8] a, float[8,16] b, float[3,4,16] c) => (float[3,4,16] y",
            "bias has rank 3 > 2",
        ),
        (
            "float[4,8] a, float[8,1] b, float[5] c) => (float[4,5] y",
            "bias dim 5 does not broadcast to the 4x1 product",
        ),
    ],
)
def test_gemm_illegal(sig, reason):
    m = parse(f"g ({sig}) {{ t = MatMul(a, b)  y = Add(t, c) }}")
    no_fire(m, "MatMulAddToGemm", reason)
