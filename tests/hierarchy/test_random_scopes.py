"""Random dataflow graphs with random (often non-contiguous, non-convex) scope stamps: outlining
must always give a valid, sorted model with the same numbers, and inlining must undo it."""

from __future__ import annotations

import warnings

import numpy as np
import onnx_ir as ir
import pytest

import irkit
from irkit import metadata as md
from tests.helpers import run_ort
from tests.hierarchy import builders as B
from tests.hierarchy.test_outline_handbuilt import assert_sorted

UNARY = ["Relu", "Neg", "Sigmoid", "Tanh"]
BINARY = ["Add", "Mul", "Sub"]
SCOPES = [
    (),
    (md.Frame("a", 0, "m.A"),),
    (md.Frame("a", 0, "m.A"), md.Frame("a.x", 0, "m.X")),
    (md.Frame("a", 0, "m.A"), md.Frame("a.y", 0, "m.Y")),
    (md.Frame("a", 1, "m.A"),),
    (md.Frame("a", 1, "m.A"), md.Frame("a.x", 1, "m.X")),
    (md.Frame("b", 0, "m.B"),),
    (md.Frame("b", 0, "m.B"), md.Frame("b.x", 0, "m.X")),
]


def random_model(seed: int, n_nodes: int = 24):
    rng = np.random.default_rng(seed)
    b = B.Builder()
    values = [b.input("x", [2, 3]), b.input("y", [2, 3])]
    w = b.weight("w", [2, 3])
    values.append(w)
    with b.module("a", "m.A"):  # a constant every scope may share (as after CSE)
        values.append(b.op("Constant", value=ir.tensor(np.full((2, 3), 0.5, np.float32))))
    for _ in range(n_nodes):
        b.scope[:] = list(SCOPES[rng.integers(len(SCOPES))])
        # prefer recent values, so chains are long and regions interleave
        pick = lambda: values[max(0, len(values) - 1 - int(rng.geometric(0.4)))]  # noqa: E731
        if rng.random() < 0.5:
            values.append(b.op(UNARY[rng.integers(len(UNARY))], pick()))
        else:
            values.append(b.op(BINARY[rng.integers(len(BINARY))], pick(), pick()))
    b.scope[:] = []
    outputs = [values[-1], values[-5]]
    return b.model(outputs)


@pytest.mark.parametrize("seed", range(40))
def test_random_scopes_outline_and_inline(seed):
    rng = np.random.default_rng(100 + seed)
    feeds = [rng.standard_normal((2, 3)).astype(np.float32) for _ in range(2)]
    model = random_model(seed)
    expected = run_ort(model, feeds)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", irkit.OutlineWarning)
        irkit.outline(model)
    irkit.check(irkit.lint(model))
    assert_sorted(model)
    for got, want in zip(run_ort(model, feeds), expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    irkit.inline(model)
    assert len(model.functions) == 0
    irkit.check(irkit.lint(model))
    for got, want in zip(run_ort(model, feeds), expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
