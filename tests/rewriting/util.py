"""Helpers for the rewriting tests: build, validate, compare, golden text."""

from __future__ import annotations

import collections
import pathlib

import numpy as np
import onnx
import onnx_ir as ir

import irkit
from irkit.rewriting import RewriteReport
from tests import helpers
from tests.helpers import run_ort

GOLDEN = pathlib.Path(__file__).parent.parent / "golden" / "rewriting"


def rewrite(m: ir.Model, rules, **kwargs) -> RewriteReport:
    """``irkit.rewrite`` (in place), returning the report it fills."""
    report = RewriteReport()
    assert irkit.rewrite(m, rules, report=report, **kwargs) is m
    return report


def optimize(m: ir.Model, **kwargs) -> RewriteReport:
    """``irkit.optimize`` (in place), returning the report it fills."""
    report = RewriteReport()
    assert irkit.optimize(m, report=report, **kwargs) is m
    return report


def model(text: str) -> ir.Model:
    """A model from ONNX text (shapes as declared)."""
    return ir.from_onnx_text(text)


def clone(m: ir.Model) -> ir.Model:
    return ir.serde.deserialize_model(ir.serde.serialize_model(m))


def infer_shapes(m: ir.Model) -> ir.Model:
    """A copy of ``m`` with ONNX shape inference applied (intermediate values get shapes)."""
    proto = onnx.shape_inference.infer_shapes(ir.serde.serialize_model(m), data_prop=True)
    return ir.serde.deserialize_model(proto)


def ops(m: ir.Model | ir.Function | ir.Graph) -> dict[str, int]:
    """Exact op histogram of a graph-like (or a model's main graph)."""
    g = m.graph if isinstance(m, ir.Model) else m
    return dict(sorted(collections.Counter(n.op_type for n in g).items()))


def assert_valid(m: ir.Model) -> None:
    """irkit.lint, then the checker with strict shape inference (stale or conflicting shapes)."""
    irkit.lint(m)
    proto = ir.serde.serialize_model(m)
    onnx.checker.check_model(proto, full_check=True)
    onnx.shape_inference.infer_shapes(proto, check_type=True, strict_mode=True, data_prop=True)


def random_inputs(m: ir.Model, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    for v in m.graph.inputs:
        shape = [d if isinstance(d, int) else 3 for d in v.shape]
        dtype = v.dtype.numpy()
        if dtype.kind == "f":
            out.append(rng.standard_normal(shape).astype(dtype))
        else:
            out.append(rng.integers(0, 4, shape).astype(dtype))
    return out


def assert_same_numbers(before: ir.Model, after: ir.Model, atol: float = 1e-5, seed: int = 0):
    inputs = random_inputs(before, seed)
    expected = run_ort(before, inputs)
    actual = run_ort(after, inputs)
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected, strict=True):
        assert a.shape == e.shape and a.dtype == e.dtype
        np.testing.assert_allclose(a, e, atol=atol, rtol=1e-4)


def assert_golden(m: ir.Model, name: str) -> None:
    """Compare the deterministic text dump with tests/golden/rewriting/<name>.txt."""
    helpers.assert_golden(ir.to_onnx_text(m, exclude_initializers=True), f"rewriting/{name}.txt")
