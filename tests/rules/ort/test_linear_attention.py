"""irkit's linear-attention kernels (local functions of standard ops) → onnxruntime's
``LinearAttention``: the gated delta rule (``irkit_kernels::gated_delta``: Qwen3-Next, Qwen3.5,
…; two value heads per query/key head, the op's grouping) as ``LinearAttention``, and the gated
linear recurrence (``irkit_kernels::gated_linear``: MiniMax's lightning attention) as
``LinearAttention(update_rule="gated")``. Each rule fires with the same numbers as the kernel's
own body at prefill and decode, and declines float16 operands, saying why (``explain``)."""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import irkit
from irkit.rewriting import RewriteReport
from irkit.rules import ort
from tests.helpers import run_ort

torch = pytest.importorskip("torch")
from irkit.llm.kernels._ops import gated_delta  # noqa: E402
from irkit.llm.kernels.lightning import gated_linear  # noqa: E402

K_HEADS, HEADS, K_DIM, V_DIM = 2, 4, 8, 5


class DeltaMixer(torch.nn.Module):
    """The gated delta recurrence between two ops of its own, as a mixer calls it."""

    def forward(self, q, k, v, g, beta, state):
        out, final = gated_delta(q * 0.5, k, v, g, beta, state)
        return out + 1.0, final


class LinearMixer(torch.nn.Module):
    """The gated linear recurrence between two ops of its own, as the lightning attention
    calls it."""

    def forward(self, q, k, v, g, state):
        out, final = gated_linear(q * 0.5, k, v, g, state)
        return out + 1.0, final


def _delta_inputs(rand: Callable[..., Any], batch: int, tokens: int, dtype: Any) -> tuple:
    k = torch.nn.functional.normalize(rand(batch, tokens, K_HEADS, K_DIM).float(), dim=-1)
    return (
        rand(batch, tokens, K_HEADS, K_DIM),
        k.to(dtype),
        rand(batch, tokens, HEADS, V_DIM),
        -rand(batch, tokens, HEADS, uniform=True),
        rand(batch, tokens, HEADS, uniform=True),
        rand(batch, HEADS, K_DIM, V_DIM),
    )


def _linear_inputs(rand: Callable[..., Any], batch: int, tokens: int, dtype: Any) -> tuple:
    return (
        rand(batch, tokens, HEADS, K_DIM),
        rand(batch, tokens, HEADS, K_DIM),
        rand(batch, tokens, HEADS, K_DIM),
        -rand(batch, tokens, HEADS, uniform=True),
        rand(batch, HEADS, K_DIM, K_DIM),
    )


@dataclasses.dataclass(frozen=True)
class Case:
    """One kernel and the rule that rewrites it."""

    mixer: type
    inputs: Callable[..., tuple]
    rule: str
    kernel: str

    def make_inputs(self, batch: int, tokens: int, dtype: Any = None, seed: int = 0) -> tuple:
        gen = torch.Generator().manual_seed(seed)
        dtype = dtype or torch.float32

        def rand(*shape: int, uniform: bool = False) -> Any:
            draw = torch.rand if uniform else torch.randn
            return draw(*shape, generator=gen).to(dtype)

        return self.inputs(rand, batch, tokens, dtype)

    def lowered(self, dtype: Any = None) -> Any:
        batch, tokens = torch.export.Dim("batch"), torch.export.Dim("tokens")
        inputs = self.make_inputs(2, 4, dtype)
        dyn = ({0: batch, 1: tokens},) * (len(inputs) - 1) + ({0: batch},)
        program = torch.export.export(self.mixer(), inputs, dynamic_shapes=dyn)
        return irkit.lower(program, decompose_custom_ops=True)


CASES = {
    "delta": Case(DeltaMixer, _delta_inputs, "LinearAttention", "irkit_kernels::gated_delta"),
    "linear": Case(
        LinearMixer, _linear_inputs, "GatedLinearAttention", "irkit_kernels::gated_linear"
    ),
}


def _ops(model: Any) -> dict[str, int]:
    counts: collections.Counter[str] = collections.Counter()
    for graph in (model.graph, *(f.graph for f in model.functions.values())):
        for node in graph.all_nodes():
            counts[f"{node.domain}::{node.op_type}" if node.domain else node.op_type] += 1
    return dict(counts)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize(("batch", "tokens"), [(1, 1), (2, 1), (2, 9)])
def test_linear_attention_fires_with_the_kernels_numbers(
    case: str, batch: int, tokens: int
) -> None:
    kind = CASES[case]
    inputs = kind.make_inputs(batch, tokens, seed=batch * 10 + tokens)
    want = [t.numpy() for t in kind.mixer()(*inputs)]
    standard, contrib = kind.lowered(), kind.lowered()
    irkit.optimize(standard, target="onnx")
    report = RewriteReport()
    irkit.optimize(contrib, target="ort", report=report)
    irkit.check(contrib)
    assert report.rules[kind.rule].fired == 1
    assert _ops(standard)[kind.kernel] == 1 and _ops(standard)["Scan"] == 1
    counts = _ops(contrib)
    assert counts["com.microsoft::LinearAttention"] == 1
    assert "Scan" not in counts and not contrib.functions  # the kernel's function is gone
    for model in (standard, contrib):
        got = run_ort(model, [t.numpy() for t in inputs])
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("case", CASES)
def test_linear_attention_declines_float16_and_says_why(case: str) -> None:
    kind = CASES[case]
    model = kind.lowered(torch.float16)
    report = RewriteReport()
    irkit.rewrite(model, ort.default_rules(), explain=kind.rule, report=report)
    assert report.rules[kind.rule].fired == 0
    assert "operand dtype FLOAT16: the rule writes float32 only" in report.explain(limit=50)
    assert _ops(model)[kind.kernel] == 1
