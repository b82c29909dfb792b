"""``irkit.optimize(target="ort")`` end to end on the zoo's Llama with a KV cache.

The calls are opened for the rewrite and re-outlined: one decoder-layer function called N
times, holding the fused contrib ops; numbers within 1e-4 of eager PyTorch.
"""

from __future__ import annotations

import collections

import numpy as np
import pytest

import irkit
from irkit.rules import ort
from tests import arch_zoo
from tests.helpers import assert_close, run_ort

pytestmark = pytest.mark.slow


def _lowered(functions: bool = True):
    zm = arch_zoo.load("llama_kv")
    ep = arch_zoo.export("llama_kv")
    return irkit.lower(
        ep, functions=functions, input_names=zm.input_names, output_names=zm.output_names
    )


def _feeds(size: int) -> list[np.ndarray]:
    zm = arch_zoo.load("llama_kv")
    return [t.numpy() for t in zm.feeds(zm.sizes()[size])]


def _calls(model) -> collections.Counter:
    return collections.Counter(
        n.op_type for g in (model.graph, *(f for f in model.functions.values())) for n in g
    )


def test_llama_kv_ort_fuses_every_residual_add_and_keeps_the_layers_alike():
    """Each layer's residual ``Add`` + its second norm fuse inside the layer; a layer's last
    ``Add`` + the next layer's first norm (or the final norm) fuse at their seam, in
    ``LlamaModel``. The layers after the first share one body; the first keeps its first norm."""
    model = _lowered()
    report = irkit.RewriteReport()
    irkit.optimize(model, target="ort", rules=ort.default_rules(skip_norm=True), report=report)
    assert report.fired["SkipSimplifiedLayerNormalization"] == 2 * arch_zoo.LAYERS
    layers = [f for f in model.functions.values() if f.name.startswith("LlamaDecoderLayer")]
    assert [f.name for f in layers] == ["LlamaDecoderLayer", "LlamaDecoderLayer_1"]
    assert _calls(model)["LlamaDecoderLayer"] == 1
    assert _calls(model)["LlamaDecoderLayer_1"] == arch_zoo.LAYERS - 1
    later = {"LlamaAttention": 1, "LlamaMLP": 1, "SkipSimplifiedLayerNormalization": 1}
    assert collections.Counter(n.op_type for n in layers[0]) == {**later, "LlamaRMSNorm": 1}
    assert collections.Counter(n.op_type for n in layers[1]) == later
    (parent,) = [f for f in model.functions.values() if f.name == "LlamaModel"]
    assert collections.Counter(n.op_type for n in parent)["SkipSimplifiedLayerNormalization"] == (
        arch_zoo.LAYERS
    )
    attention = model.functions[("transformers.models.llama", "LlamaAttention", "")]
    attention_ops = collections.Counter(n.op_type for n in attention)
    # Packed QKV (one MatMul + Split); QK and PV are inside the opset-23 Attention the "onnx"
    # fusions make first (GroupQueryAttention is opt-in for this dynamic-batch, masked form).
    assert (attention_ops["Split"], attention_ops["MatMul"], attention_ops["Attention"]) == (
        1,
        1,
        1,
    )
    assert report.fired["PackedMatMul"] == arch_zoo.LAYERS  # QKV per layer (gate/up stay two)
    # o_proj, down_proj (shared functions) and lm_head: the transposed weight folded, no copy
    linears = [f for f in model.functions.values() if f.name.startswith("Linear")]
    assert [collections.Counter(n.op_type for n in f) for f in linears] == [{"FusedMatMul": 1}] * 3
    call = next(n for n in model.graph if n.op_type == "LlamaModel")
    passed = {v.name for v in call.inputs if v is not None and v.is_initializer()}
    # the parameters themselves are passed down (not transposed copies) …
    assert {f"model.layers.{i}.self_attn.o_proj.weight" for i in range(arch_zoo.LAYERS)} <= passed
    # … and the packed QKV weights replace q_proj/k_proj/v_proj's
    assert not any(".q_proj." in name for name in passed)
    for size in (0, 1):
        actual = run_ort(model, _feeds(size))
        assert_close(actual, arch_zoo.expected_outputs("llama_kv", size), atol=1e-4)


def test_llama_kv_ort_flat_stays_flat():
    model = _lowered(functions=False)
    irkit.optimize(model, target="ort", rules=ort.default_rules(skip_norm=True))
    assert not model.functions
    ops = collections.Counter(n.op_type for n in model.graph)
    assert ops["SkipSimplifiedLayerNormalization"] == 2 * arch_zoo.LAYERS
    assert ops["Split"] >= arch_zoo.LAYERS
    actual = run_ort(model, _feeds(1))
    assert_close(actual, arch_zoo.expected_outputs("llama_kv", 1), atol=1e-4)


def test_cli_optimize_target_ort(tmp_path):
    from irkit.cli import main

    source, optimized = tmp_path / "llama.onnx", tmp_path / "llama_ort.onnx"
    irkit.save(_lowered(), source)
    assert main(["optimize", str(source), "-o", str(optimized), "--target", "ort", "-q"]) == 0
    model = irkit.load(optimized)
    layer = model.functions[("transformers.models.llama", "LlamaDecoderLayer", "")]
    assert collections.Counter(n.op_type for n in layer)["SkipSimplifiedLayerNormalization"] == 0
    contrib = {
        n.op_type for f in model.functions.values() for n in f if n.domain == "com.microsoft"
    }
    assert contrib == {"FusedMatMul"}  # (the skip-norm fusions are opt-in; see above)
    actual = run_ort(model, _feeds(0))
    assert_close(actual, arch_zoo.expected_outputs("llama_kv", 0), atol=1e-4)


def test_llama_kv_default_ort_target_keeps_add_and_rms_norm():
    """The skip-norm fusions are opt-in: the default target leaves each residual ``Add`` and
    ``RMSNormalization`` (faster on onnxruntime's CPU kernels), and the numbers hold."""
    model = _lowered()
    irkit.optimize(model, target="ort")
    ops = _calls(model)
    assert ops["SkipSimplifiedLayerNormalization"] == 0
    layers = [f for f in model.functions.values() if f.name.startswith("LlamaDecoderLayer")]
    assert [f.name for f in layers] == ["LlamaDecoderLayer"]
    body = collections.Counter(n.op_type for n in layers[0])
    assert body["Add"] == 2 and body["LlamaRMSNorm"] == 2
    for size in (0, 1):
        actual = run_ort(model, _feeds(size))
        assert_close(actual, arch_zoo.expected_outputs("llama_kv", size), atol=1e-4)
