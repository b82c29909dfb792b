"""``squeeze`` (``irkit/lowering/_own_squeeze.py``): only the dims torch squeezed.

torch squeezes a requested dim only if its size is 1, and decides that at export time
(``guard_or_false``): a static size that is not 1 is a no-op (PixArt's ``squeeze(1)`` on 16
tokens, which torchlib wrote as a ``Squeeze`` onnxruntime refuses), and a dynamic dim stays
(torch assumed it is not 1). Each case: exact op histogram, onnxruntime vs eager at two sizes.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import irkit
from tests import helpers


class Squeeze(torch.nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        y = x * 2
        return y.squeeze() if self.dim is None else y.squeeze(self.dim)


BATCH = torch.export.Dim("batch", min=2, max=64)


@pytest.mark.parametrize(
    ("shape", "dim", "dynamic", "squeezes"),
    [
        ((2, 16, 3), 1, False, 0),  # a dim of 16: a no-op in torch
        ((2, 1, 3), 1, False, 1),
        ((2, 1, 3), -2, False, 1),
        ((1, 16, 1), [0, 1, 2], False, 1),  # squeeze.dims: the two 1s only
        ((1, 16, 1), None, False, 1),  # squeeze(): every static 1
        ((4, 1, 3), 0, True, 0),  # a dynamic dim stays: torch assumed it is not 1
        ((4, 1, 3), [0, 1], True, 1),  # the dynamic dim stays, the static 1 goes
        ((4, 1, 3), None, True, 1),  # squeeze() leaves the dynamic dim, even when it is 1
        ((), 0, False, None),  # 0-d: lifted to 1-D and back (_rank0.py), numbers only
    ],
    ids=[
        "static16",
        "static1",
        "negative",
        "dims",
        "all",
        "dynamic",
        "dynamic-dims",
        "dynamic-all",
        "scalar",
    ],
)
def test_squeeze_only_the_dims_torch_squeezed(shape, dim, dynamic, squeezes):
    module = Squeeze(dim)
    x = torch.randn(shape)
    dynamic_shapes = ({0: BATCH},) if dynamic else None
    model = irkit.lower(torch.export.export(module, (x,), dynamic_shapes=dynamic_shapes))
    ops = helpers.op_histogram(model.graph)
    if squeezes is not None:
        assert ops.get("Squeeze", 0) == squeezes
        assert ops.get("Identity", 0) == (1 if squeezes == 0 else 0)
    sizes = [x, torch.randn((7, *shape[1:]))] if dynamic else [x]
    for inp in sizes:
        (actual,) = helpers.run_ort(model, [inp.numpy()])
        expected = module(inp).numpy()
        assert actual.shape == expected.shape
        np.testing.assert_allclose(actual, expected)
