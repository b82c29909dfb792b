"""Bad input gets irkit's own errors, naming what, where and how to fix; nothing is mutated."""

from __future__ import annotations

import copy
import functools

import onnx
import pytest
import torch

import irkit
from irkit import _runtime
from tests import zoo


@torch.library.custom_op("irkit_test::frob", mutates_args=())
def frob(x: torch.Tensor) -> torch.Tensor:
    return x * 2 + 1


@frob.register_fake
def _(x):
    return torch.empty_like(x)


@torch.library.custom_op("irkit_test::twiddle", mutates_args=())
def twiddle(x: torch.Tensor, k: int) -> torch.Tensor:
    return x + k


@twiddle.register_fake
def _(x, k):
    return torch.empty_like(x)


class TwoUnsupported(torch.nn.Module):
    def forward(self, x):
        y = torch.ops.irkit_test.frob(x)
        z = torch.ops.irkit_test.twiddle(y, 3)
        return torch.ops.irkit_test.frob(z).relu()


def test_unsupported_ops_are_all_listed_before_emitting():
    ep = torch.export.export(TwoUnsupported(), (torch.randn(2, 3),))
    with pytest.raises(irkit.UnsupportedOpError) as info:
        irkit.lower(ep)
    err = info.value
    assert [(name, count, node) for name, count, node, _ in err.ops] == [
        ("irkit_test::frob.default", 2, "frob"),
        ("irkit_test::twiddle.default", 1, "twiddle"),
    ]
    message = str(err)
    assert "2 op(s)" in message and "×2" in message
    assert "test_errors.py:" in message  # first occurrence's source line
    assert "custom_lowerings" in message  # how to fix


def test_lowering_error_names_node_module_and_source_and_chains_cause():
    class Inner(torch.nn.Module):
        def forward(self, x):
            return torch.ops.irkit_test.frob(x)

    class Outer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = Inner()

        def forward(self, x):
            return self.inner(x)

    def broken(x):
        raise RuntimeError("boom")

    ep = torch.export.export(Outer(), (torch.randn(2, 3),))
    with pytest.raises(irkit.LoweringError) as info:
        irkit.lower(ep, custom_lowerings={torch.ops.irkit_test.frob.default: broken})
    err = info.value
    assert err.fx_node == "frob"
    assert err.module_path == "inner"
    assert "test_errors.py:" in err.source
    assert isinstance(err.__cause__, RuntimeError)
    assert "boom" in str(err) and "inner" in str(err)
    # One spelling of op names in every error (as UnsupportedOpError lists them); the fix hint
    # is the Python a user writes.
    assert err.target == "irkit_test::frob.default"
    assert "custom_lowerings={torch.ops.irkit_test.frob.default: fn}" in str(err)


def test_not_an_exported_program():
    with pytest.raises(irkit.LoweringOptionsError, match="torch.export.export"):
        irkit.lower(torch.nn.Linear(2, 2))


def test_wrong_number_of_input_names():
    with pytest.raises(
        irkit.LoweringOptionsError, match="input_names has 2 names but the program has 1"
    ):
        irkit.lower(zoo.export("mlp"), input_names=["a", "b"])


def test_exported_program_is_not_mutated():
    ep = zoo.export("gpt2")
    before_graph = str(ep.graph)
    before_sig = copy.deepcopy(ep.graph_signature)
    before_state = {k: v.clone() for k, v in ep.state_dict.items()}
    irkit.lower(ep)
    assert str(ep.graph) == before_graph
    assert ep.graph_signature == before_sig
    assert all(torch.equal(before_state[k], v) for k, v in ep.state_dict.items())


@functools.cache
def _linear_program():
    return torch.export.export(torch.nn.Linear(4, 2), (torch.randn(3, 4),))


@pytest.mark.parametrize("opset", [99, 6])
def test_unsupported_opset_is_refused_up_front_naming_the_range(opset):
    from irkit.lowering._lower import supported_opsets

    supported, why = supported_opsets()
    assert supported[0] == 7 and "onnx " in why
    if _runtime.ort_version() is not None:  # (the installed onnxruntime bounds it, and onnx)
        assert supported[-1] == min(_runtime.newest_opset(""), onnx.defs.onnx_opset_version())
    with pytest.raises(irkit.LoweringOptionsError) as info:
        irkit.lower(_linear_program(), opset=opset)
    message = str(info.value)
    assert f"opset {opset} is not supported: irkit lowers to opsets 7 to {supported[-1]}" in message
    assert "Fix: pass an opset in that range, or leave it unset (default 23)" in message


@pytest.mark.parametrize("opset", ["23", True])
def test_opset_must_be_an_int(opset):
    with pytest.raises(irkit.LoweringOptionsError, match=r"give an int; irkit lowers to opsets 7"):
        irkit.lower(_linear_program(), opset=opset)


def test_newest_supported_opset_lowers_and_runs():
    from irkit.lowering._lower import supported_opsets
    from tests.helpers import run_ort

    newest = supported_opsets()[0][-1]
    model = irkit.lower(_linear_program(), opset=newest)
    assert model.opset_imports[""] == newest
    irkit.check(model)
    x = torch.randn(3, 4)
    assert run_ort(model, [x.numpy()])[0].shape == (3, 2)
