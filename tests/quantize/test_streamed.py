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
@pytest.mark.parametrize(
    "options",
    [{"symmetric": False, "block_size": 64, "embeddings": True}, {"bits": 8, "method": "kquant"}],
    ids=["int4-asym-64-embeddings", "int8-kquant"],
)
def test_streamed_save_packs_each_weight_once_to_the_same_bytes(
    llama, tmp_path, monkeypatch, options
):
    """From an fp16 checkpoint into the float32 model: each packed weight is read once and
    quantized once for its data, scales and zero points (its siblings kept only until written:
    they are adjacent initializers), and the files are byte-equal to the save that computes each
    part on its own from the converted tensor (what irkit.save did before the cache)."""
    import hashlib
    import shutil

    from safetensors.numpy import load_file, save_file

    from irkit.weights import _derived, _stream
    from irkit.weights._derived import PackCache

    meta_path, _, (folder, buffers) = llama
    half = tmp_path / "fp16"
    half.mkdir()
    for file in pathlib.Path(folder).iterdir():
        if file.suffix == ".safetensors":
            tensors = {k: v.astype(np.float16) for k, v in load_file(file).items()}
            save_file(tensors, half / file.name, metadata={"format": "np"})
        else:
            shutil.copy(file, half / file.name)
    model = irkit.load(meta_path, load_external_data=False)
    irkit.quantize(model, **options)
    packed = [
        t.recipe
        for t in (v.const_value for v in model.graph.initializers.values())
        if isinstance(t, DerivedTensor) and isinstance(t.recipe, Packed)
    ]
    weights = {r.source for r in packed}
    assert len(packed) >= 2 * len(weights) >= 10
    graph = irkit.save(model, tmp_path / "graph.onnx")

    def counting(patch, owner, attr, counts, key):
        function = getattr(owner, attr)

        def wrapper(*args, **kwargs):
            result = function(*args, **kwargs)
            counts.setdefault(key(args), []).append(result)
            return result

        patch.setattr(owner, attr, wrapper)

    def save(name, cached):
        reads, packs, kept = {}, {}, {}
        with monkeypatch.context() as patch:
            if not cached:  # (each part on its own, from the whole converted tensor)
                old = lambda recipe, read, packs, read_stored: _derived.evaluate(recipe, read)  # noqa: E731
                patch.setattr(_stream, "evaluate", old)
            counting(patch, _stream._Converted, "numpy", reads, lambda a: a[0].stored.name)
            counting(patch, _derived, "quantize_blockwise", packs, lambda a: "codes")
            counting(patch, _derived, "rtn_scales", packs, lambda a: "scales alone")
            counting(patch, PackCache, "part", kept, lambda a: a[0].kept_bytes)
            out = tmp_path / name / "model.onnx"
            out.parent.mkdir()
            loaded = irkit.load(graph, load_external_data=False)
            irkit.save(loaded, out, weights=[half, buffers], external_data=True)
        files = {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in out.parent.iterdir()}
        return out, files, reads, packs, kept

    out, files, reads, packs, kept = save("cached", cached=True)
    before, files_before, reads_before, packs_before, _ = save("before", cached=False)
    assert files == files_before and len(files) == 2
    # before: every part read, converted and quantized on its own
    assert max(len(r) for r in reads_before.values()) >= 2
    assert sum(len(p) for p in packs_before.values()) == len(packed)  # (kquant: codes each time)
    # now: one read and one quantization per weight, no scales computed again
    assert max(len(r) for r in reads.values()) == 1
    assert (len(packs["codes"]), packs.get("scales alone")) == (len(weights), None)
    # (fp16 leaves of packed weights reach the packing unconverted: converted per chunk)
    assert any(r[0].dtype == np.float16 for r in reads.values())
    # the siblings are written next to each other: at most one weight's scales and zero points
    largest = max(
        sum(int(np.prod(Packed(s, p, *_settings(packed, s)).shape)) * 4 for p in PackedPart)
        for s in weights
    )
    assert max(kept) <= largest and max(kept) > 0
    ids = np.array([[3, 17, 42, 250, 7, 99, 1, 0]], np.int64)
    np.testing.assert_array_equal(run_ort(out, [ids])[0], run_ort(before, [ids])[0])


def _settings(packed, source):
    r = next(r for r in packed if r.source == source)
    return r.bits, r.block_size, r.symmetric, r.method


def test_pack_cache_quantizes_once_and_keeps_only_the_pending_parts(monkeypatch):
    """Each part of a packed weight asked for once: one read, one quantization; the siblings
    are kept until asked for, then dropped; nothing is kept for parts nobody expects."""
    from irkit.weights import _derived
    from irkit.weights._derived import PackCache

    w = support.weights((48, 40))[0]
    leaf = Leaf("w", ir.DataType.FLOAT, (48, 40))
    recipes = {p: Packed(leaf, p, 4, 16, False) for p in PackedPart}
    packs = PackCache()
    for recipe in recipes.values():
        packs.expect(recipe)
    calls = []
    real = _derived.quantize_blockwise
    monkeypatch.setattr(
        _derived, "quantize_blockwise", lambda *a, **k: calls.append(1) or real(*a, **k)
    )
    reads = []

    def read(leaf):
        reads.append(leaf.name)
        return w

    expected = quantize_blockwise(w, bits=4, block_size=16, symmetric=False)
    arrays = {
        PackedPart.SCALES: expected.scales,
        PackedPart.DATA: expected.data,
        PackedPart.ZERO_POINTS: expected.zero_points,
    }
    for i, (part, array) in enumerate(arrays.items()):
        got = evaluate(recipes[part], read, packs)
        assert got.tobytes() == array.tobytes()
        assert packs.kept_bytes == sum(a.nbytes for a in list(arrays.values())[i + 1 :])
    assert (reads, len(calls)) == (["w"], 1)
    # asked again (nothing expects it any more): computed again, nothing kept
    assert evaluate(recipes[PackedPart.DATA], read, packs).tobytes() == expected.data.tobytes()
    assert (len(reads), packs.kept_bytes) == (2, 0)


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
