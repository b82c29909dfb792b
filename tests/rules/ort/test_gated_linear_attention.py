"""irkit's gated linear kernel (``irkit_kernels::gated_linear``, MiniMax's lightning attention;
a local function of standard ops) → onnxruntime's ``LinearAttention(update_rule="gated")``:
fires with the same numbers as the kernel's own body at prefill and decode, and declines
float16 operands, saying why."""

from __future__ import annotations

import numpy as np
import pytest

import irkit
from irkit.rewriting import RewriteReport
from irkit.rules import ort
from tests.helpers import run_ort

torch = pytest.importorskip("torch")
from irkit.llm.kernels.lightning import gated_linear  # noqa: E402

HEADS, DIM = 4, 6


class Mixer(torch.nn.Module):
    """The recurrence between two ops of its own, as the lightning attention calls it."""

    def forward(self, q, k, v, g, state):
        out, final = gated_linear(q * 0.5, k, v, g, state)
        return out + 1.0, final


def _inputs(batch: int, tokens: int, dtype=None, seed: int = 0) -> tuple:
    gen = torch.Generator().manual_seed(seed)
    dtype = dtype or torch.float32

    def rand(*shape):
        return torch.randn(*shape, generator=gen).to(dtype)

    return (
        rand(batch, tokens, HEADS, DIM),
        rand(batch, tokens, HEADS, DIM),
        rand(batch, tokens, HEADS, DIM),
        -torch.rand(batch, tokens, HEADS, generator=gen).to(dtype),
        rand(batch, HEADS, DIM, DIM),
    )


def _lowered(dtype=None):
    batch, tokens = torch.export.Dim("batch"), torch.export.Dim("tokens")
    dyn = ({0: batch, 1: tokens},) * 4 + ({0: batch},)
    program = torch.export.export(Mixer(), _inputs(2, 4, dtype), dynamic_shapes=dyn)
    return irkit.lower(program, decompose_custom_ops=True)


def _ops(model) -> dict[str, int]:
    counts: dict[str, int] = {}
    for graph in (model.graph, *(f.graph for f in model.functions.values())):
        for node in graph.all_nodes():
            key = f"{node.domain}::{node.op_type}" if node.domain else node.op_type
            counts[key] = counts.get(key, 0) + 1
    return counts


@pytest.mark.parametrize(("batch", "tokens"), [(1, 1), (2, 1), (2, 9)])
def test_gated_linear_attention_fires_with_the_kernels_numbers(batch: int, tokens: int) -> None:
    inputs = _inputs(batch, tokens, seed=batch * 10 + tokens)
    want = [t.numpy() for t in Mixer()(*inputs)]
    standard, contrib = _lowered(), _lowered()
    irkit.optimize(standard, target="onnx")
    report = RewriteReport()
    irkit.optimize(contrib, target="ort", report=report)
    irkit.check(contrib)
    assert report.rules["GatedLinearAttention"].fired == 1
    assert _ops(standard)["irkit_kernels::gated_linear"] == 1 and _ops(standard)["Scan"] == 1
    counts = _ops(contrib)
    assert counts["com.microsoft::LinearAttention"] == 1
    assert "Scan" not in counts and not contrib.functions  # the kernel's function is gone
    for model in (standard, contrib):
        got = run_ort(model, [t.numpy() for t in inputs])
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w, atol=2e-5, rtol=1e-5)


def test_gated_linear_attention_declines_float16_and_says_why() -> None:
    model = _lowered(torch.float16)
    report = RewriteReport()
    irkit.rewrite(model, ort.default_rules(), explain="GatedLinearAttention", report=report)
    assert report.rules["GatedLinearAttention"].fired == 0
    assert "operand dtype FLOAT16: the rule writes float32 only" in report.explain(limit=50)
    assert _ops(model)["irkit_kernels::gated_linear"] == 1
