"""Quantizing a weightless (meta-device) model: the packed weights are derived tensors, packed per
tensor while ``irkit.save`` streams the checkpoint, to the bytes of the in-memory quantization.
The 7B-shaped slice measures the streamed save's peak RSS and projects the whole 7B."""

from __future__ import annotations

import json
import os
import pathlib
import sys

import numpy as np
import onnx_ir as ir
import pytest

import irkit
from irkit.metadata import DERIVED_KEY
from irkit.weights import (
    DerivedTensor,
    Leaf,
    Packed,
    PackedPart,
    WeightlessTensor,
    evaluate,
    packed_parts,
    recipe_from_json,
)
from irkit.weights.packing import Method, quantize_blockwise
from tests.helpers import run_ort
from tests.quantize import support

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("method", list(Method))
def test_packed_recipes_round_trip_and_compute_the_packing(symmetric, method):
    (w,) = support.weights((80, 24))  # (N, K) as a Linear stores it: K = 24 is not a block
    leaf = WeightlessTensor(ir.DataType.FLOAT, [80, 24], name="fc.weight")
    from irkit.weights import transpose

    parts = packed_parts(
        transpose(leaf, (1, 0)), bits=4, block_size=16, symmetric=symmetric, method=method
    )
    expected = quantize_blockwise(w.T, bits=4, block_size=16, symmetric=symmetric, method=method)
    arrays = [expected.data, expected.scales, expected.zero_points]
    assert (parts[2] is None) == symmetric
    for part, array in zip(parts, arrays, strict=True):
        if part is None:
            continue
        assert isinstance(part, DerivedTensor) and isinstance(part.recipe, Packed)
        assert (part.dtype.numpy(), tuple(part.shape)) == (array.dtype, array.shape)
        stored = part.metadata_props[DERIVED_KEY]
        recipe = recipe_from_json(stored, "x")
        assert recipe == part.recipe
        got = evaluate(recipe, lambda leaf: w if leaf.name == "fc.weight" else None)
        assert got.tobytes() == array.tobytes()
    real = packed_parts(w.T.copy(), bits=4, block_size=16, symmetric=symmetric, method=method)
    for tensor, array in zip(real, arrays, strict=True):
        assert (tensor is None) if array is None else tensor.numpy().tobytes() == array.tobytes()


def test_packed_recipe_shapes():
    leaf = Leaf("w", ir.DataType.FLOAT16, (100, 7))
    shapes = {p: Packed(leaf, p, 4, 32, False).shape for p in PackedPart}
    assert shapes == {
        PackedPart.DATA: (7, 4, 16),
        PackedPart.SCALES: (7, 4),
        PackedPart.ZERO_POINTS: (7, 2),
    }
    assert Packed(leaf, PackedPart.SCALES, 4, 32, False).dtype == ir.DataType.FLOAT16
    assert Packed(leaf, PackedPart.DATA, 8, 32, True).shape == (7, 4, 32)


# --- a meta Llama, quantized weightless and saved from its shards ---------------------------------

CONFIG = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=160,  # (down_proj: K = 160, not a multiple of 64)
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
)


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    import torch
    import transformers

    cfg = transformers.LlamaConfig(**CONFIG)
    torch.manual_seed(0)
    real = transformers.LlamaForCausalLM(cfg).eval()
    folder = tmp_path_factory.mktemp("llama")
    real.save_pretrained(folder, max_shard_size="100KB")
    with torch.device("meta"):
        meta = transformers.LlamaForCausalLM(cfg).eval()
    ids = torch.zeros(1, 8, dtype=torch.long)
    kwargs = {"use_cache": False}
    meta_model = irkit.lower(torch.export.export(meta, (ids.to("meta"),), kwargs=kwargs))
    real_model = irkit.lower(torch.export.export(real, (ids,), kwargs=kwargs))
    # (copies through a weightless save: each test quantizes its own)
    graphs = tmp_path_factory.mktemp("graphs")
    buffers = {k: v.numpy() for k, v in real.named_buffers()}
    return (
        irkit.save(meta_model, graphs / "meta.onnx"),
        irkit.save(real_model, graphs / "real.onnx"),
        [folder, buffers],
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    "options",
    [{"embeddings": True}, {"symmetric": False, "block_size": 64}, {"bits": 8, "method": "kquant"}],
    ids=["int4-embeddings", "int4-asym-64", "int8-kquant"],
)
def test_streamed_quantization_equals_the_in_memory_one(llama, tmp_path, options):
    meta_path, real_path, weights = llama
    meta = irkit.load(meta_path, load_external_data=False)
    real = irkit.load(real_path)
    reports = irkit.QuantizeReport(), irkit.QuantizeReport()
    irkit.quantize(meta, report=reports[0], **options)
    irkit.quantize(real, report=reports[1], **options)
    assert len(reports[0].quantized) == len(reports[1].quantized) >= 5
    assert [s.node for s in reports[0].skipped] == [s.node for s in reports[1].skipped]
    packed = [
        v.name
        for v in meta.graph.initializers.values()
        if isinstance(v.const_value, DerivedTensor) and isinstance(v.const_value.recipe, Packed)
    ]
    assert len(packed) >= 10  # data and scales of each quantized weight
    # the recipes survive a weightless save and load, then the shards stream in
    graph = irkit.save(meta, tmp_path / "graph.onnx")
    loaded = irkit.load(graph, load_external_data=False)
    streamed = irkit.save(loaded, tmp_path / "streamed.onnx", weights=weights, external_data=True)
    in_memory = irkit.save(real, tmp_path / "memory.onnx", external_data=True)
    a = irkit.load(streamed).graph.initializers
    b = irkit.load(in_memory).graph.initializers
    assert sorted(a) == sorted(b)
    for name in packed:
        x, y = a[name].const_value, b[name].const_value
        assert x.dtype == y.dtype and x.numpy().tobytes() == y.numpy().tobytes(), name
    ids = np.array([[3, 17, 42, 250, 7, 99, 1, 0]], np.int64)
    (got,) = run_ort(streamed, [ids])
    (expected,) = run_ort(in_memory, [ids])
    np.testing.assert_array_equal(got, expected)


@pytest.mark.slow
def test_dynamic_int8_refuses_the_meta_model_and_names_the_fix(llama):
    """DynamicQuantizeMatMul's int8 weights are not derived tensors: a meta-device Llama is
    refused before any change (the weight-only path streams it, above)."""
    meta_path, _, _ = llama
    meta = irkit.load(meta_path, load_external_data=False)
    before = ir.serde.serialize_model(meta).SerializeToString()
    with pytest.raises(irkit.QuantizationError, match=r"has no data .* Fix: lower the model with"):
        irkit.quantize(meta, bits=8, activations="dynamic")
    assert ir.serde.serialize_model(meta).SerializeToString() == before


# --- the 7B-shaped slice: peak RSS of the streamed int4 save, projected to the whole 7B ----------

RSS_7B_TARGET = 2 * 10**9


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads VmHWM (Linux)")
def test_7b_slice_streamed_int4_save_peak_rss_projects_under_2_gb(tmp_path):
    """Llama-2-7B's shapes (hidden 4096, intermediate 11008, vocab 32000: its largest tensor,
    the lm_head, is in the slice) with 1 and 2 layers; fp16 shards (1.3 GB), a float32 model.
    Projection (bench/bench_quantize_7b.py's docstring): ``peak(32) = base(2) + 30 × (base(2)
    - base(1)) + growth``, growth = the largest per-tensor working set measured."""
    sys.path.insert(0, str(ROOT))
    from bench import bench_quantize_7b as bench

    folder = tmp_path / "ckpt"
    bench.write_checkpoint(folder, bench.llama_shapes(2))
    extra = tmp_path / "buffers.safetensors"
    bench.write_buffers(extra)
    figures = {}
    for layers in (1, 2):  # (1 layer: only the loaded graph's footprint, for the slope)
        graph = tmp_path / f"graph{layers}.onnx"
        line = bench.quantized_graph(layers, graph)
        assert line.startswith("quantize: 4 node(s) → MatMulNBits, 2 skipped"), line
        out = tmp_path / f"out{layers}" / "model.onnx"
        out.parent.mkdir()
        figures[layers] = bench.streamed_save(graph, out, folder if layers == 2 else "-", extra)
        assert not figures[layers]["torch"]
    # int4 + float32 scales: 7 projections × 2 layers + lm_head; the embedding stays float32
    q_bytes = (4 * 4096 * 4096 + 3 * 4096 * 11008) * 2 + 32000 * 4096
    expected = q_bytes * (0.5 + 4 / 32) + 32000 * 4096 * 4
    assert abs(figures[2]["written"] - expected) < 0.01 * expected, figures[2]
    base = {n: f["before"] for n, f in figures.items()}
    growth = figures[2]["peak"] - figures[2]["before"]
    projected = base[2] + 30 * max(base[2] - base[1], 0) + growth
    print(json.dumps({"figures": figures, "projected_7b_peak": projected}))
    assert growth < 1.5 * 10**9, figures
    assert projected < RSS_7B_TARGET, (projected, figures)


# --- the call `irkit export --precision int4` makes: on the optimized weightless KV-cache model ---


@pytest.mark.slow
@pytest.mark.parametrize("target", ["onnx", "ort"])
def test_export_path_quantizes_the_meta_kv_cache_model_like_the_real_one(tmp_path, target):
    """``export_causal_lm`` on the meta model, ``irkit.optimize`` (packed QKV and gate/up are
    derived weights with ``"ort"``), ``irkit.quantize(model, bits=4, embeddings=True)``, saved
    from the checkpoint: onnxruntime gives exactly the in-memory model's outputs; the tied
    embedding and lm_head share one packed initializer."""
    import torch
    import transformers

    from irkit.llm._causal_lm import causal_lm_feeds, export_causal_lm
    from irkit.llm._meta import meta_causal_lm

    cfg = transformers.LlamaConfig(**{**CONFIG, "tie_word_embeddings": True})
    torch.manual_seed(0)
    real = transformers.LlamaForCausalLM(cfg).eval()
    real.save_pretrained(tmp_path / "hf")

    def build(module):
        exported = export_causal_lm(module)
        model = irkit.lower(
            exported.program,
            input_names=exported.input_names,
            output_names=exported.output_names,
        )
        irkit.optimize(model, target=target)
        report = irkit.QuantizeReport()
        irkit.quantize(model, bits=4, embeddings=True, report=report)
        return model, exported, report

    meta = meta_causal_lm(cfg, dtype=torch.float32)
    weightless, exported, report = build(meta.model)
    assert report.skipped == [] or target == "onnx"
    assert "tied 'model.embed_tokens.weight': one packed initializer" in report.notes[-1]
    streamed = irkit.save(
        weightless, tmp_path / "m.onnx", weights=[tmp_path / "hf", meta.buffers], external_data=True
    )
    in_memory = irkit.save(build(real)[0], tmp_path / "r.onnx", external_data=True)
    feeds = causal_lm_feeds(real, batch=2, seq=3, past=5, layout=exported.cache)
    for got, expected in zip(run_ort(streamed, feeds), run_ort(in_memory, feeds), strict=True):
        np.testing.assert_array_equal(got, expected)
