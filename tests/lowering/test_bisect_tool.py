"""``bench/bisect_lowering.py`` finds the first node whose lowering is wrong."""

from __future__ import annotations

import torch
from onnxscript import opset18 as op

import irkit.lowering
from bench import bisect_lowering


class Chain(torch.nn.Module):
    def forward(self, x):
        a = x * 2
        b = torch.sin(a)
        return b + 1


def test_a_wrong_lowering_is_the_first_difference(monkeypatch):
    x = torch.rand(3, 4) + 0.5
    ep = torch.export.export(Chain(), (x,))
    assert bisect_lowering.differences(ep, (x,)) == []
    real = irkit.lowering.lower

    def wrong_sin(ep, **kwargs):
        return real(ep, custom_lowerings={torch.ops.aten.sin.default: op.Cos}, **kwargs)

    monkeypatch.setattr(bisect_lowering.irkit.lowering, "lower", wrong_sin)
    found = bisect_lowering.differences(ep, (x,))
    assert [d.node for d in found] == ["sin", "add"]
    assert found[0].target == "aten.sin.default" and found[0].max_abs > 0.1
    assert "torch.sin(a)" in found[0].source
