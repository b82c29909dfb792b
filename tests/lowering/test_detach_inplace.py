"""``detach_`` lowers as the identity: it changes autograd metadata, never values.

transformers' ``DynamicCache`` detaches empty placeholder constants in place; before, that
in-place op on a lifted constant sent the whole program through functionalization (a re-trace,
which fails for a program whose constants are on the ``meta`` device).
"""

from __future__ import annotations

import numpy as np
import torch

import irkit
from tests.helpers import run_ort


class DetachConstant(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = torch.tensor([1.0, 2.0, 3.0])  # a plain attribute: a lifted constant

    def forward(self, x):
        self.scale.detach_()
        return x * self.scale


def test_detach_on_a_constant_is_not_functionalized(caplog):
    module, x = DetachConstant(), torch.randn(2, 3)
    ep = torch.export.export(module, (x,))
    assert any(n.target == torch.ops.aten.detach_.default for n in ep.graph.nodes)
    with caplog.at_level("INFO", logger="irkit"):
        model = irkit.lower(ep, functions=False)
    assert "functionalizing" not in caplog.text
    (got,) = run_ort(model, [x.numpy()])
    np.testing.assert_array_equal(got, module(x).numpy())
