"""Custom lowerings, irkit's own lowerings, decompositions and in-place ops."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from onnxscript import opset18 as op

import irkit
from tests import helpers
from tests.lowering.test_errors import TwoUnsupported


def _check(module, args, model, atol=1e-5):
    with torch.no_grad():
        expected = helpers.flatten_outputs(module(*args))
    helpers.assert_close(helpers.run_ort(model, args), expected, atol)


def test_custom_lowering_of_torch_library_ops_end_to_end():
    def frob(x):
        return op.Add(op.Mul(x, op.CastLike(2.0, x)), op.CastLike(1.0, x))

    def twiddle(x, k):
        return op.Add(x, op.CastLike(float(k), x))

    module, args = TwoUnsupported(), (torch.randn(2, 3),)
    ep = torch.export.export(module, args)
    model = irkit.lower(
        ep,
        custom_lowerings={
            torch.ops.irkit_test.frob.default: frob,
            torch.ops.irkit_test.twiddle: twiddle,  # a packet means every overload
        },
        functions=False,
    )
    _check(module, args, model)
    assert helpers.op_histogram(model.graph) == {
        "Add": 3,
        "CastLike": 5,
        "Constant": 5,
        "Mul": 2,
        "Relu": 1,
    }


def test_custom_lowering_wins_over_torchlib():
    module, args = torch.nn.ReLU(), (torch.randn(3, 4),)
    model = irkit.lower(
        torch.export.export(module, args),
        custom_lowerings={torch.ops.aten.relu.default: lambda x: op.Max(x, op.CastLike(0.0, x))},
        functions=False,
    )
    assert helpers.op_histogram(model.graph) == {"CastLike": 1, "Constant": 1, "Max": 1}
    _check(module, args, model)


class InPlace(torch.nn.Module):
    def forward(self, x):
        y = x * 2
        y.add_(1)  # mutates a fresh intermediate: lowered by renaming
        y.mul_(y)
        return y + x


def test_inplace_ops_on_intermediates_are_renamed_not_functionalized(caplog):
    module, args = InPlace(), (torch.randn(4),)
    ep = torch.export.export(module, args)
    assert any(n.target == torch.ops.aten.add_.Tensor for n in ep.graph.nodes)
    with caplog.at_level("INFO", logger="irkit"):
        model = irkit.lower(ep, functions=False)
    assert "functionalizing" not in caplog.text
    _check(module, args, model)


class InPlaceOnView(torch.nn.Module):
    def forward(self, x):
        y = x.clone()
        y[0].add_(10)  # mutates a view: y changes too
        return y * 1


class RecomposedFrequencies(torch.nn.Module):
    """Qwen3.5's M-RoPE ``recomposition_frequencies``: writes through a view of a view, the
    base read again after both writes (``freq.sum``) and the view taken before them (``cat``)."""

    def forward(self, x):
        freq = x * 2
        thw = freq[0]
        early = thw.sum(-1)  # read before the writes: the old values
        for dim, offset in enumerate((1, 2), start=1):
            thw[..., offset:9:3] = freq[dim, ..., offset:9:3]
        return torch.cat((thw, thw), dim=-1), freq.sum(0), early


class WritesSeenByEarlierViews(torch.nn.Module):
    """A write into the base and one through its diagonal, both seen by views taken before."""

    def forward(self, x):
        y = x * 2
        first_row, diagonal = y[0], y.diagonal(0, -2, -1)
        y.add_(1)
        diagonal.mul_(3)
        return first_row + 0, y.sum(), diagonal * 1


class BroadcastCopies(torch.nn.Module):
    """``copy_`` of a scalar into a column and a row; the written base is an output."""

    def forward(self, x):
        y = x * 2
        y[1:, 2].copy_(x[0, 0])
        rows = y[:, 1:3]
        rows[0].zero_()
        z = x + 1
        z.copy_(x[1, 1])  # (into a fresh tensor: renamed, the scalar broadcast)
        return y, rows.sum(-1), z


class InPlaceOnTransposedView(torch.nn.Module):
    def forward(self, x):
        y = x.clone()
        y.t()[0].add_(10)  # a transposed view's row: a column of y
        y.permute(1, 0).unsqueeze(0)[0, 1].mul_(2)
        return y * 1


class InPlaceOnFlatView(torch.nn.Module):
    def forward(self, x):
        y = x.clone()
        y.view(-1)[0].add_(10)  # a view whose inverse needs y's (symbolic) shape: torch's
        return y * 1  # functionalization


@pytest.mark.parametrize(
    ("module", "shape"),
    [
        (InPlaceOnView(), (3, 2, 12)),
        (RecomposedFrequencies(), (3, 2, 12)),
        (WritesSeenByEarlierViews(), (3, 4, 4)),
        (BroadcastCopies(), (3, 4)),
        (InPlaceOnTransposedView(), (3, 2)),
    ],
    ids=["select", "mrope", "diagonal", "broadcast-copy", "transpose"],
)
def test_inplace_write_into_a_view_of_a_computed_tensor_is_functional_in_place(
    caplog, module, shape
):
    args = (torch.randn(*shape),)
    ep = torch.export.export(module, args)
    before = str(ep.graph)
    with caplog.at_level("INFO", logger="irkit"):
        model = irkit.lower(ep, functions=False)
    assert "made functional where they are" in caplog.text
    assert "functionalizing" not in caplog.text  # no retrace of the whole program
    assert str(ep.graph) == before
    _check(module, args, model)


def test_inplace_write_through_a_view_without_scatter_falls_back_to_functionalization(caplog):
    module, args = InPlaceOnFlatView(), (torch.randn(3, 2),)
    ep = torch.export.export(module, args)
    with caplog.at_level("INFO", logger="irkit"):
        model = irkit.lower(ep, functions=False)
    assert "functionalizing" in caplog.text
    _check(module, args, model)


def test_decomposition_is_per_node_and_only_where_needed(caplog):
    class Diff(torch.nn.Module):
        def forward(self, x):
            return torch.diff(x, dim=-1).relu()

    module, args = Diff(), (torch.randn(2, 5),)
    ep = torch.export.export(module, args)
    with caplog.at_level("INFO", logger="irkit"):
        model = irkit.lower(ep, functions=False)
    assert "decomposition: 1" in caplog.text
    _check(module, args, model)
    # The decomposition's nodes carry the FX node they came from.
    from irkit import metadata

    assert {n.metadata_props[metadata.FX_NODE] for n in model.graph if n.op_type != "Relu"} == {
        "diff"
    }


def test_batch_norm_and_adaptive_pool_own_lowerings():
    module = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.AdaptiveAvgPool2d((2, 3))
    ).eval()
    module[1].running_mean.uniform_(-1, 1)
    args = (torch.randn(2, 3, 6, 8),)
    model = irkit.lower(torch.export.export(module, args), functions=False)
    hist = helpers.op_histogram(model.graph)
    assert hist["BatchNormalization"] == 1 and hist["AveragePool"] == 1
    _check(module, args, model)


def test_bool_cumsum_promotes_like_torch():
    class M(torch.nn.Module):
        def forward(self, x):
            return torch.cumsum(x > 0, dim=-1)

    module, args = M(), (torch.randn(2, 6),)
    model = irkit.lower(torch.export.export(module, args), functions=False)
    out = helpers.run_ort(model, args)[0]
    assert out.dtype == np.int64
    np.testing.assert_array_equal(out, module(*args).numpy())


def test_opset_selection_and_downconversion():
    module, args = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.GELU()), (torch.randn(2, 4),)
    ep = torch.export.export(module, args)
    for opset in (17, 18, 21):
        model = irkit.lower(ep, opset=opset, functions=False)
        assert model.opset_imports[""] == opset
        _check(module, args, model)
    assert irkit.lower(ep, functions=False).opset_imports[""] == 23


def test_eval_dropout_emits_nothing_and_biasless_conv_is_one_node():
    module = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3, stride=2, padding=1, bias=False), torch.nn.Dropout(0.3)
    ).eval()
    args = (torch.randn(2, 3, 9, 9),)
    model = irkit.lower(torch.export.export(module, args), functions=False)
    assert helpers.op_histogram(model.graph) == {"Conv": 1}
    _check(module, args, model)


def test_docs_custom_lowering_example_runs():
    """The example in docs/lowering.md, verbatim apart from the model around it."""
    import pathlib
    import re

    text = (pathlib.Path(__file__).parents[2] / "docs" / "lowering.md").read_text()
    code = re.search(r"## Custom lowerings.*?```python\n(.*?)```", text, re.S).group(1)

    class Uses(torch.nn.Module):
        def forward(self, x):
            return torch.ops.mylib.scaled_gelu(x, 3.0)

    namespace: dict = {}
    prelude, _, last = code.rpartition("model = irkit.lower(")
    exec(prelude, namespace)  # defines the op and its lowering
    args = (torch.randn(2, 5),)
    namespace["ep"] = torch.export.export(Uses(), args)
    exec("model = irkit.lower(" + last, namespace)
    _check(Uses(), args, namespace["model"])


def test_functionalization_fallback_leaves_the_program_untouched():
    module, args = InPlaceOnFlatView(), (torch.randn(3, 2),)
    ep = torch.export.export(module, args)
    before = str(ep.graph)
    assert any(n.target == torch.ops.aten.add_.Tensor for n in ep.graph.nodes)
    irkit.lower(ep)
    assert str(ep.graph) == before  # run_decompositions made a new program; ours is as it was
