"""0-d tensors reduced, scanned or indexed along ``dim`` 0 / -1 (``irkit/lowering/_rank0.py``).

torchlib writes ``axes=[0]`` on the rank-0 value, which onnxruntime refuses to load; irkit
lowers the op on the one-element 1-D tensor torch treats the scalar as, and reshapes back.
"""

from __future__ import annotations

import numpy as np
import torch

import irkit
from tests import helpers


class Reductions(torch.nn.Module):
    def forward(self, x, i):
        values, indices = torch.max(x, 0)
        return (
            torch.amax(x, 0),
            torch.amin(x, -1),
            torch.prod(x, 0),
            torch.argmax(x, 0),
            torch.softmax(x, 0),
            torch.cumsum(x, 0),
            values,
            indices,
            torch.logsumexp(x, 0),
            torch.sum(x, [0]),
            torch.var(x, 0, correction=0),
            torch.mean(x, [-1], keepdim=True),
            torch.gather(x, 0, i),
            torch.amax(x, 0, keepdim=True),
        )


def test_rank0_reductions_match_eager_and_stay_0d():
    x, i = torch.tensor(1.5), torch.tensor(0)
    model = irkit.lower(torch.export.export(Reductions(), (x, i)))
    actual = helpers.run_ort(model, [x.numpy(), i.numpy()])
    expected = helpers.flatten_outputs(Reductions()(x, i))
    assert [a.shape for a in actual] == [()] * len(expected)
    helpers.assert_close(actual, expected, 0.0)


class Var(torch.nn.Module):
    def forward(self, x):
        return torch.var(x, 0), torch.std(x, -1)


def test_rank0_unbiased_variance_is_nan_as_in_torch():
    x = torch.tensor(2.0)
    model = irkit.lower(torch.export.export(Var(), (x,)))
    actual = helpers.run_ort(model, [x.numpy()])
    expected = [t.numpy() for t in Var()(x)]
    assert all(np.isnan(a) and a.shape == () for a in actual)
    assert all(np.isnan(e) for e in expected)


class Rank1(torch.nn.Module):
    def forward(self, x):
        return torch.amax(x, 0)


def test_rank1_reduction_is_lowered_as_before():
    model = irkit.lower(torch.export.export(Rank1(), (torch.ones(3),)))
    assert helpers.op_histogram(model.graph) == {"ReduceMax": 1, "Constant": 1}
