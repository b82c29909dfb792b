"""Python's ``|``, ``&``, ``^`` on tensors (``aten.__or__`` and kin, their Scalar and in-place
overloads) against eager, with operands of different dtypes.

torch computes ``int32 | bool`` in int32; torchlib's ``bitwise_or`` asserts equal dtypes (cpmant's
attention mask: ``context[:, None, :] | (… & directional_mask_2d)``). The ops are torch's aliases
of ``bitwise_*``: lowered through torch's decomposition, so the promotion rule of
``torch._refs.bitwise_*`` casts the operands first.
"""

from __future__ import annotations

import collections

import numpy as np
import torch

import irkit
from tests import helpers

aten = torch.ops.aten


class Bitwise(torch.nn.Module):
    def forward(self, a, b, c):
        # a: int32, b: bool, c: int64
        outs = [a | b, b & a, a ^ c, a | 3, b & True, c ^ 5, b | b, b ^ True]
        d = a.clone()
        d |= b
        e = c.clone()
        e &= 6
        f = b.clone()
        f ^= b.logical_not()
        return [*outs, d, e, f]


def test_mixed_dtype_and_scalar_and_inplace_overloads_equal_eager():
    a = torch.randint(0, 16, (2, 3, 4), dtype=torch.int32)
    b = torch.rand(2, 3, 4) > 0.5
    c = torch.randint(0, 16, (3, 4))
    ep = torch.export.export(Bitwise(), (a, b, c))
    targets = {node.target for node in ep.graph.nodes}
    assert {aten.__or__.Tensor, aten.__or__.Scalar, aten.__ior__.Tensor, aten.__iand__.Scalar} <= (
        targets
    )
    model = irkit.lower(ep)
    ops = collections.Counter(node.op_type for node in model.graph)
    # int32 | bool, bool & int32, int32 ^ int64, |= bool: one Cast of the narrower operand each;
    # integers take the Bitwise* ops, bools the logical ones; Identity: the clones
    assert ops == {
        "Cast": 4,
        "BitwiseOr": 3,
        "BitwiseAnd": 2,
        "BitwiseXor": 2,
        "Or": 1,
        "And": 1,
        "Xor": 2,
        "Not": 1,
        "Identity": 3,
        "Constant": 5,
    }
    got = helpers.run_ort(model, [a, b, c])
    expected = Bitwise()(a, b, c)
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        assert g.dtype == e.numpy().dtype
        np.testing.assert_array_equal(g, e.numpy())
