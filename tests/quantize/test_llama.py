"""irkit.quantize on a tiny Llama lowered with functions: every Linear, shared bodies kept."""

from __future__ import annotations

import functools

import numpy as np
import onnx_ir as ir
import pytest

import irkit
from tests import zoo
from tests.helpers import op_histogram, run_ort

pytestmark = pytest.mark.slow

LINEARS_PER_LAYER = 7  # q, k, v, o, gate, up, down


@functools.cache
def _lowered() -> tuple[bytes, np.ndarray, np.ndarray, int]:
    """The lowered model (serialized: each test gets its own copy), input, fp32 output, layers."""
    import torch

    zm = zoo.llama()
    model = irkit.lower(torch.export.export(zm.module, zm.args))
    ids = zm.args[0].numpy()
    (reference,) = run_ort(model, [ids])
    proto = ir.serde.serialize_model(model).SerializeToString()
    return proto, ids, reference, zm.module.config.num_hidden_layers


def _model() -> ir.Model:
    import onnx

    return ir.serde.deserialize_model(onnx.load_from_string(_lowered()[0]))


def _linear_bodies(model: ir.Model) -> list[ir.Function]:
    return [f for f in model.functions.values() if f.name.startswith("Linear")]


@pytest.mark.parametrize(
    ("accuracy_level", "max_abs", "min_cosine"), [(0, 0.6, 0.99), (4, 0.6, 0.99)]
)
def test_every_linear_becomes_matmulnbits_and_the_output_stays_close(
    accuracy_level, max_abs, min_cosine
):
    _, ids, reference, layers = _lowered()
    model = _model()
    functions = sorted(model.functions)
    linear_bodies = len(_linear_bodies(model))
    report = irkit.QuantizeReport()
    irkit.quantize(model, accuracy_level=accuracy_level, report=report)

    assert sorted(model.functions) == functions  # deduplicated bodies stay deduplicated
    for body in _linear_bodies(model):
        assert op_histogram(body) == {"com.microsoft::MatMulNBits": 1}
    assert len(report.quantized) == linear_bodies
    assert sum(len(q.modules) for q in report.quantized) == LINEARS_PER_LAYER * layers
    assert all(q.modules[0].startswith("layers.") for q in report.quantized)
    # the two attention MatMuls (scores, weighted values) multiply activations
    assert len(report.skipped) == 2
    assert all(s.reason.endswith("not a constant") for s in report.skipped)
    assert report.bytes_after < report.bytes_before / 3

    (out,) = run_ort(model, [ids])
    delta = float(np.abs(out - reference).max())
    cosine = float(
        out.ravel() @ reference.ravel() / np.linalg.norm(out) / np.linalg.norm(reference)
    )
    assert delta < max_abs and cosine > min_cosine, (delta, cosine)


def test_exclude_a_module_and_int8_for_another():
    _, ids, reference, layers = _lowered()
    model = _model()
    report = irkit.QuantizeReport()
    irkit.quantize(model, exclude="*.down_proj", bits_for={"*.self_attn": 8}, report=report)
    excluded = [s for s in report.skipped if s.reason == "excluded by exclude="]
    down = tuple(f"layers.{i}.mlp.down_proj" for i in range(layers))
    assert [s.modules for s in excluded] == [down]
    bits = {q.modules[0].rsplit(".", 1)[-1]: q.bits for q in report.quantized}
    assert bits == {"q_proj": 8, "k_proj": 8, "gate_proj": 4}  # (bodies shared: o/q, v/k, up/gate)
    (out,) = run_ort(model, [ids])
    assert np.abs(out - reference).max() < 0.6


def test_layer_0_in_float_and_up_proj_in_int8_get_their_own_function_copies():
    """Settings that differ between calls of shared bodies (gate/up share one Linear body; the
    layers share one decoder-layer body): the bodies are copied where the calls part."""
    _, ids, reference, layers = _lowered()
    model = _model()
    before = len(model.functions)
    report = irkit.QuantizeReport()
    irkit.quantize(model, exclude="layers.0", bits_for={"*.up_proj": 8}, report=report)
    excluded = sorted(
        m for s in report.skipped if s.reason.startswith("excluded") for m in s.modules
    )
    assert excluded == sorted(
        f"layers.0.{m}"
        for m in (
            "self_attn.q_proj",
            "self_attn.k_proj",
            "self_attn.v_proj",
            "self_attn.o_proj",
            "mlp.gate_proj",
            "mlp.up_proj",
            "mlp.down_proj",
        )
    )
    quantized = {m: q.bits for q in report.quantized for m in q.modules}
    assert len(quantized) == LINEARS_PER_LAYER * (layers - 1)
    assert {m: b for m, b in quantized.items() if b == 8} == {"layers.1.mlp.up_proj": 8}
    assert all(not s.reason.startswith("a shared") for s in report.skipped)
    assert len(model.functions) > before and report.notes
    (out,) = run_ort(model, [ids])
    assert np.abs(out - reference).max() < 0.6


def test_after_the_ort_target_every_projection_is_quantized():
    """``target="ort"`` packs q/k/v and writes ``FusedMatMul(transB=1)``: onnxruntime's
    quantizer takes none of those; irkit.quantize takes all."""
    _, ids, reference, layers = _lowered()
    model = irkit.optimize(_model(), "ort")
    report = irkit.QuantizeReport()
    irkit.quantize(model, report=report)
    assert report.skipped == []
    kinds = sorted({q.op_type for q in report.quantized})
    assert kinds == ["FusedMatMul", "MatMul"]
    assert sum(len(q.modules) for q in report.quantized) == 5 * layers  # qkv, o, gate, up, down
    for owner in [model.graph, *model.functions.values()]:
        assert not [n for n in owner if n.op_type in ("MatMul", "FusedMatMul", "Gemm")]
    (out,) = run_ort(model, [ids])
    assert np.abs(out - reference).max() < 0.6


def test_dynamic_int8_inside_the_deduplicated_layers():
    """activations="dynamic": the Linear bodies shared by every layer stay shared, each one
    DynamicQuantizeMatMul fed its int8 weight and scales by the calls (no weight skipped)."""
    _, ids, reference, layers = _lowered()
    model = _model()
    functions = sorted(model.functions)
    linear_bodies = len(_linear_bodies(model))
    report = irkit.QuantizeReport()
    irkit.quantize(model, bits=8, activations="dynamic", report=report)
    assert sorted(model.functions) == functions
    for body in _linear_bodies(model):
        assert op_histogram(body) == {"com.microsoft::DynamicQuantizeMatMul": 1}
    assert len(report.quantized) == linear_bodies
    assert sum(len(q.modules) for q in report.quantized) == LINEARS_PER_LAYER * layers
    assert len(report.skipped) == 2  # the attention products of two activations
    assert all(s.reason.endswith("not a constant") for s in report.skipped)
    assert report.bytes_after < report.bytes_before / 2  # (int8; the embedding stays float)
    (out,) = run_ort(model, [ids])
    delta = float(np.abs(out - reference).max())
    cosine = float(
        out.ravel() @ reference.ravel() / np.linalg.norm(out) / np.linalg.norm(reference)
    )
    assert delta < 0.6 and cosine > 0.99, (delta, cosine)
