"""Bad input gets irkit's own errors, naming what, where and how to fix; nothing is mutated."""

from __future__ import annotations

import copy

import pytest
import torch

import irkit
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
