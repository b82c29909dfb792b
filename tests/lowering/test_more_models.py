"""Beyond the public zoo: encoder-decoders, vision, in-place ops, complex numbers."""

from __future__ import annotations

import pytest
import torch

import irkit
from irkit.lowering._registry import LoweringTable, Via
from tests import helpers, zoo


@pytest.mark.parametrize("name", sorted(zoo.MORE))
def test_more_models_match_eager(name):
    zm = zoo.load(name)
    model = irkit.lower(zoo.export(name))
    inputs = list(zm.args) + list(zm.kwargs.values())
    helpers.assert_close(
        helpers.run_ort(model, inputs), helpers.flatten_outputs(zm.eager()), helpers.FP32_ATOL
    )


def test_t5_uses_inplace_renaming_and_a_per_node_decomposition():
    ep = zoo.export("t5")
    table = LoweringTable(None)
    vias = {n.name: table.choose(n).via for n in ep.graph.nodes if n.op == "call_function"}
    assert vias["add_"] is Via.INPLACE
    assert [name for name, via in vias.items() if via is Via.DECOMPOSE] == [
        "min_1",
        "min_2",
        "min_3",
    ]


class ComplexSquare(torch.nn.Module):
    def forward(self, x):
        c = torch.view_as_complex(x)
        return torch.view_as_real(c * c).abs()


def test_complex_inputs_choose_torchlibs_complex_overload():
    x = torch.randn(3, 4, 2)
    ep = torch.export.export(ComplexSquare(), (x,))
    mul = next(n for n in ep.graph.nodes if n.target == torch.ops.aten.mul.Tensor)
    table = LoweringTable(None)
    assert table.choose(mul).fn.name == "aten_mul_complex"
    model = irkit.lower(ep)
    # complex (a+bi)^2 as real arithmetic: 4 Mul, one Sub (real part), one Add (imaginary part)
    hist = helpers.op_histogram(model.graph)
    assert (hist["Mul"], hist["Sub"], hist["Add"]) == (4, 1, 1)
    helpers.assert_close(helpers.run_ort(model, [x]), [ComplexSquare()(x).numpy()], 1e-5)


def test_verbose_reports_progress_when_not_a_terminal(capsys):
    irkit.lower(zoo.export("mlp"), verbose=True)
    err = capsys.readouterr().err
    assert "irkit.lower: 9/9 FX nodes lowered" in err
