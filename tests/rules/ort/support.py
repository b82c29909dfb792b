"""What the ``"ort"`` rule tests share: models from ONNX text, fire / no_fire with onnxruntime."""

from __future__ import annotations

import collections

import numpy as np
import onnx_ir as ir

import irkit
from irkit.rewriting import RewriteReport
from irkit.rules import ort
from tests.helpers import run_ort

HEADER = '<ir_version: 10, opset_import: ["" : {opset}, "com.microsoft" : 1]>'
TYPES = {"float": np.float32, "float16": np.float16}
ATOL = {"float": 1e-4, "float16": 2e-2}


def parse(body: str, opset: int = 23) -> ir.Model:
    """A model from a graph body in ONNX text at ``opset`` (``com.microsoft`` imported)."""
    return ir.from_onnx_text(HEADER.format(opset=opset) + body)


def ops(model: ir.Model) -> dict[str, int]:
    """Exact op histogram of the main graph."""
    return dict(sorted(collections.Counter(n.op_type for n in model.graph).items()))


def clone(model: ir.Model) -> ir.Model:
    return ir.serde.deserialize_model(ir.serde.serialize_model(model))


def feeds(model: ir.Model, seed: int = 0) -> list[np.ndarray]:
    """Random inputs for every graph input (all shapes must be static)."""
    rng = np.random.default_rng(seed)
    out = []
    for v in model.graph.inputs:
        shape = [int(d) for d in v.shape]
        dtype = v.dtype.numpy()
        if dtype.kind == "f":
            out.append(rng.standard_normal(shape).astype(dtype))
        else:  # (position ids: small non-negative)
            out.append(rng.integers(0, 8, shape).astype(dtype))
    return out


def rewrite(model: ir.Model, explain: str | None = None) -> RewriteReport:
    report = RewriteReport()
    irkit.rewrite(model, ort.default_rules(skip_norm=True), report=report, explain=explain)
    return report


def fire(model: ir.Model, rule: str, expect_ops: dict[str, int], dtype: str = "float"):
    """The ``"ort"`` rules rewrite ``model``: ``rule`` fires, the ops are exactly ``expect_ops``,
    and onnxruntime computes the same numbers before and after."""
    before = clone(model)
    report = rewrite(model)
    assert report.fired.get(rule, 0) >= 1, str(report)
    assert ops(model) == expect_ops
    inputs = feeds(before)
    expected = run_ort(before, inputs)
    actual = run_ort(model, inputs)
    for a, e in zip(actual, expected, strict=True):
        assert a.shape == e.shape and a.dtype == e.dtype
        np.testing.assert_allclose(
            a.astype(np.float64), e.astype(np.float64), atol=ATOL[dtype], rtol=ATOL[dtype]
        )
    return report


def no_fire(model: ir.Model, rule: str, reason: str) -> RewriteReport:
    """``rule`` is tried and declines with ``reason``, which ``explain`` shows too."""
    report = rewrite(model, explain=rule)
    stats = report.rules[rule]
    assert stats.fired == 0 and stats.tried >= 1, str(report)
    assert any(reason in r for r in stats.failures), dict(stats.failures)
    assert reason in report.explain(limit=100)
    return report
