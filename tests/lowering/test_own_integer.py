"""Integer ``pow`` and int64 ``sum`` against eager: exact past 2**53, wrapping past int64.

onnxruntime computes both through doubles (blt's rolling hash ``sum(token · 1000000007 **
arange(n))`` came out rounded, then saturated); irkit's own lowerings stay in the integers.
"""

from __future__ import annotations

import collections

import numpy as np
import torch

import irkit
from tests import helpers


class Powers(torch.nn.Module):
    def forward(self, base, exponent, small):
        prime = torch.tensor(1000000007, dtype=torch.int64)
        return (
            prime ** torch.arange(base.shape[-1]),  # blt's hash: Tensor_Tensor, wraps from 3 on
            base**exponent,  # negative exponents too
            base**5,  # Tensor_Scalar: unrolled
            base**0,
            3**exponent,  # Scalar
            small ** exponent.to(torch.int32),  # int32 wraps at 2**32
        )


def _inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    base = torch.randint(-300, 300, (4, 7), generator=g)
    exponent = torch.randint(0, 70, (4, 7), generator=g)
    base[0, :4] = torch.tensor([1, -1, 0, 2])
    exponent[0, :4] = torch.tensor([-3, -5, 2, -1])  # 1, -1, 0 ** 2, 2 ** -1 = 0
    exponent[1, :2] = -2
    small = torch.randint(-50, 50, (7,), dtype=torch.int32, generator=g)
    return base, exponent, small


def test_integer_pow_is_exact_and_wraps_as_torch():
    inputs = _inputs()
    ep = torch.export.export(Powers(), inputs)
    model = irkit.lower(ep)
    ops = collections.Counter(node.op_type for node in model.graph)
    # four computed exponents: one Loop each; x ** 5 three Muls (x², x⁴, x·x⁴); x ** 0 an Expand
    assert ops["Loop"] == 4 and ops["Mul"] == 4 + 3 and ops["Expand"] == 1 and "Pow" not in ops
    expected = Powers()(*inputs)
    got = helpers.run_ort(model, inputs)
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        assert g.dtype == e.numpy().dtype
        np.testing.assert_array_equal(g, e.numpy())
    # the same after irkit.optimize: four Loop bodies that fold alike keep unique value names
    np.testing.assert_array_equal(
        helpers.run_ort(irkit.optimize(model), inputs)[0], expected[0].numpy()
    )


def test_float_pow_stays_onnx_pow():
    class FloatPow(torch.nn.Module):
        def forward(self, x, e):
            return x**e

    x, e = torch.rand(3) + 0.5, torch.rand(3)
    model = irkit.lower(torch.export.export(FloatPow(), (x, e)))
    assert [node.op_type for node in model.graph] == ["Pow"]
    np.testing.assert_allclose(helpers.run_ort(model, [x, e])[0], (x**e).numpy(), rtol=1e-6)


class Sums(torch.nn.Module):
    def forward(self, x):
        return x.sum(-1), x.sum(), torch.sum(x, dim=(0, 1), keepdim=True), (x * 1000000007).sum(1)


def test_int64_sum_is_exact_past_2_53_and_wraps():
    g = torch.Generator().manual_seed(0)
    x = torch.randint(-(2**60), 2**60, (3, 5, 7), generator=g)
    x[0, 0, 0] = -(2**63)  # the low half of INT64_MIN is 0, its high half -2**31
    x[1, 0, 0] = -1  # low half 2**32 - 1, high half -1
    model = irkit.lower(torch.export.export(Sums(), (x,)))
    ops = collections.Counter(node.op_type for node in model.graph)
    assert ops["ReduceSum"] == 2 * 4 and ops["Mod"] == 4 and ops["Div"] == 4
    got = helpers.run_ort(model, [x])
    for g_, e in zip(got, Sums()(x), strict=True):
        np.testing.assert_array_equal(g_, e.numpy())


def test_sums_of_other_dtypes_stay_one_reduce_sum():
    class Other(torch.nn.Module):
        def forward(self, x, mask):
            return x.sum(-1), mask.sum(-1)

    x, mask = torch.rand(2, 3), torch.rand(2, 3) > 0.5
    model = irkit.lower(torch.export.export(Other(), (x, mask)))
    assert collections.Counter(node.op_type for node in model.graph)["ReduceSum"] == 2
    got = helpers.run_ort(model, [x, mask])
    np.testing.assert_allclose(got[0], x.sum(-1).numpy(), rtol=1e-6)
    np.testing.assert_array_equal(got[1], mask.sum(-1).numpy())
