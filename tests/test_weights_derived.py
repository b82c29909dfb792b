"""Weight transforms on weightless models: derived tensors planned by rules and constant folding,
computed per tensor while the weights stream into the saved model."""

from __future__ import annotations

import collections
import json
import logging
import os
import subprocess
import sys
import textwrap

import numpy as np
import onnx_ir as ir
import pytest
import torch
import transformers
from safetensors.numpy import save_file

import irkit
from irkit import metadata, weights
from irkit.rewriting import DerivedTensor, concat_weights, transpose_weight
from irkit.weights import WeightlessTensor
from tests.helpers import FP32_ATOL, run_ort
from tests.scale.test_meta_llama import CONFIG as LLAMA

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IDS = torch.tensor([[3, 17, 42, 250, 7, 99, 1, 0]])


def _histogram(model: ir.Model) -> collections.Counter[tuple[str, str]]:
    counts = collections.Counter((n.domain, n.op_type) for n in model.graph)
    for function in model.functions.values():
        counts.update((n.domain, n.op_type) for n in function)
    return counts


def _initializers(model: ir.Model) -> list[tuple[str, tuple[int, ...]]]:
    values = model.graph.initializers.values()
    return sorted((v.const_value.dtype.name, tuple(v.const_value.shape)) for v in values)


def _kinds(recipe: weights.Recipe) -> set[type]:
    return {type(recipe)}.union(*(_kinds(s) for s in recipe.sources()))


def _leaf(name: str, shape: list[int], dtype: ir.DataType = ir.DataType.FLOAT) -> WeightlessTensor:
    return WeightlessTensor(dtype, shape, name=name)


# --- the meta-device Llama, optimized like the real one -------------------------------------------


def _llama(meta: bool) -> ir.Model:
    config = transformers.LlamaConfig(**LLAMA)
    torch.manual_seed(0)
    if meta:
        with torch.device("meta"):
            module = transformers.LlamaForCausalLM(config).eval()
        ids = torch.zeros(1, 8, dtype=torch.long, device="meta")
    else:
        module = transformers.LlamaForCausalLM(config).eval()
        with torch.no_grad():  # norm weights not all ones: deduplication must not merge them
            for p in module.parameters():
                if p.ndim == 1:
                    p.uniform_(0.5, 1.5)
        ids = torch.zeros(1, 8, dtype=torch.long)
    return irkit.lower(torch.export.export(module, (ids,), kwargs={"use_cache": False}))


@pytest.fixture(scope="module")
def real():
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA)).eval()


@pytest.fixture(scope="module")
def shards(real, tmp_path_factory):
    folder = tmp_path_factory.mktemp("llama")
    real.save_pretrained(folder, max_shard_size="100KB")
    return folder


@pytest.mark.slow
@pytest.mark.parametrize("target", ["onnx", "ort"])
def test_optimized_meta_llama_has_the_real_graph_and_saves_with_streamed_weights(
    target, real, shards, tmp_path
):
    meta = irkit.optimize(_llama(meta=True), target=target)
    real_model = irkit.optimize(_llama(meta=False), target=target)
    expected = _histogram(real_model)
    assert _histogram(meta) == expected
    assert _initializers(meta) == _initializers(real_model)  # (deduplicated alike, too)
    recipes = [
        v.const_value.recipe
        for v in meta.graph.initializers.values()
        if isinstance(v.const_value, DerivedTensor)
    ]
    if target == "ort":  # Q/K/V packed per layer (gate/up stay two); the rotary caches folded
        assert expected[("", "Split")] == 1 and expected[("", "RotaryEmbedding")] == 2
        packed = [r for r in recipes if isinstance(r, weights.Concat) and len(r.parts) in (2, 3)]
        assert sorted(len(r.parts) for r in packed) == [3, 3], recipes
        assert {type(p) for r in packed for p in r.parts} == {weights.Transpose}
        assert any(weights.Unary in _kinds(r) for r in recipes)  # cos/sin of inv_freq
    path = irkit.save(
        meta, tmp_path / "m.onnx", weights=[shards, dict(real.named_buffers())], external_data=True
    )
    (got,) = run_ort(path, [IDS.numpy()])
    with torch.no_grad():
        want = real(IDS, use_cache=False).logits.numpy()
    np.testing.assert_allclose(got, want, atol=FP32_ATOL, rtol=0)


# --- each recipe against numpy --------------------------------------------------------------------

RNG = np.random.default_rng(0)
A = RNG.standard_normal((4, 3)).astype(np.float32)
B = RNG.standard_normal((4, 2)).astype(np.float32)
S = np.array([0.5, -2.0, 4.0], dtype=np.float32)


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (lambda a, b: weights.transpose(a, [1, 0]), A.T),
        (lambda a, b: weights.concat([a, b], axis=1), np.concatenate([A, B], axis=1)),
        (lambda a, b: weights.concat([a, b], axis=-1), np.concatenate([A, B], axis=1)),
        (lambda a, b: weights.cast(a, ir.DataType.FLOAT16), A.astype(np.float16)),
        (lambda a, b: weights.reshape(a, [2, -1]), A.reshape(2, 6)),
        (lambda a, b: weights.multiply(a, S), A * S),
        (lambda a, b: weights.add(a, S), A + S),  # (Gemma's norm weight 1 + w)
        (lambda a, b: weights.unary(a, weights.Function.COS), np.cos(A)),
        (lambda a, b: weights.unary(a, weights.Function.NEG), -A),
        (
            lambda a, b: weights.transpose(weights.concat([a, a], axis=1), [1, 0]),
            np.concatenate([A, A], axis=1).T,
        ),
    ],
    ids=[
        "transpose",
        "concat",
        "concat-neg",
        "cast",
        "reshape",
        "mul",
        "add",
        "cos",
        "neg",
        "nested",
    ],
)
def test_recipe_values_match_numpy(make, expected):
    real = make(ir.tensor(A), ir.tensor(B))  # all inputs have data: a real tensor at once
    assert isinstance(real, ir.Tensor)
    np.testing.assert_array_equal(real.numpy(), expected)
    lazy = make(_leaf("a", [4, 3]), _leaf("b", [4, 2]))  # weightless: a derived tensor
    assert isinstance(lazy, DerivedTensor) and not isinstance(lazy, ir.Tensor)
    assert (lazy.dtype.numpy(), tuple(lazy.shape)) == (expected.dtype, expected.shape)
    with pytest.raises(irkit.WeightsError, match="has no data"):
        lazy.numpy()
    leaves = {"a": A, "b": B}
    values = weights.evaluate(lazy.recipe, lambda leaf: leaves[leaf.name])
    np.testing.assert_array_equal(values, expected)
    again = weights.recipe_from_json(lazy.metadata_props[metadata.DERIVED_KEY], "x")  # JSON form
    np.testing.assert_array_equal(weights.evaluate(again, lambda leaf: leaves[leaf.name]), expected)


def test_helpers_refuse_what_does_not_fit():
    with pytest.raises(irkit.WeightsError, match="differ off axis"):
        weights.concat([_leaf("a", [4, 3]), _leaf("b", [3, 2])], axis=1)
    with pytest.raises(irkit.WeightsError, match="cannot become"):
        weights.reshape(_leaf("a", [4, 3]), [5, -1])
    with pytest.raises(irkit.WeightsError, match="do not broadcast"):
        weights.multiply(_leaf("a", [4, 3]), np.ones(2, np.float32))


def test_unknown_recipe_text_is_a_weights_error():
    with pytest.raises(irkit.WeightsError, match="'p': its irkit.derived metadata"):
        weights.recipe_from_json('{"version": 1, "recipe": {"op": "fft"}}', "p")


# --- constant folding and the scale fold on weightless weights ---------------------------------

FOLDS = """<ir_version: 10, opset_import: ["" : 21]>
g (float[2, 4] x) => (float[2, 6] y, float[2, 8] z, float[2, 2] u) {
  wt = Transpose<perm=[1, 0]>(w)
  y0 = MatMul(x, wt)
  wh = Mul(wt, half)
  ws = Add(wh, half)
  y1 = MatMul(x, ws)
  y = Concat<axis=1>(y0, y1)
  v16 = Cast<to=10>(v)
  v32 = Cast<to=1>(v16)
  shape = Constant<value_ints=[4, 8]>()
  vr = Reshape(v32, shape)
  z = MatMul(x, vr)
  c = Concat<axis=1>(k, k)
  cu = Unsqueeze(c, zero)
  cs = Squeeze(cu, zero)
  cc = Cos(cs)
  u = MatMul(x, cc)
}"""


FOLD_DATA = {
    "w": RNG.standard_normal((3, 4)).astype(np.float32),
    "v": RNG.standard_normal((32,)).astype(np.float32),
    "k": RNG.standard_normal((4, 1)).astype(np.float32),
}


def _folds(weightless: bool) -> ir.Model:
    model = ir.from_onnx_text(FOLDS)
    data = FOLD_DATA
    constants = {"half": np.float32(0.5), "zero": np.array([0], np.int64)}
    users = {v.name: v for n in model.graph for v in n.inputs if v is not None}
    for name, array in [*data.items(), *constants.items()]:
        value = users[name]
        value.type, value.shape = (
            ir.TensorType(ir.DataType.from_numpy(array.dtype)),
            ir.Shape(array.shape),
        )
        if weightless and name in data:
            value.const_value = WeightlessTensor(value.dtype, list(array.shape), name=name)
        else:
            value.const_value = ir.tensor(np.asarray(array), name=name)
        model.graph.register_initializer(value)
    return model


def test_folding_weightless_weights_gives_the_real_graph_and_values(tmp_path):
    real, meta = _folds(weightless=False), _folds(weightless=True)
    for model in (real, meta):  # (without the onnx target's packing: the four folds stay apart)
        irkit.optimize(model, target="onnx", rules=irkit.rules.default_rules())
    assert _histogram(meta) == _histogram(real) == {("", "MatMul"): 4, ("", "Concat"): 1}
    kinds = {v.name: type(v.const_value).__name__ for v in meta.graph.initializers.values()}
    assert sorted(kinds.values()) == ["DerivedTensor"] * 4, kinds
    x = RNG.standard_normal((2, 4)).astype(np.float32)
    expected = run_ort(irkit.save(real, tmp_path / "real.onnx"), [x])
    got = run_ort(irkit.save(meta, tmp_path / "meta.onnx", weights=FOLD_DATA), [x])
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_array_equal(g, e)


def test_scale_folds_into_a_weightless_weight(tmp_path):
    text = """<ir_version: 10, opset_import: ["" : 21]>
    g (float[2, 4] x) => (float[2, 3] y) { p = MatMul(x, w)  q = Add(p, b)  y = Mul(q, s) }"""
    w = RNG.standard_normal((4, 3)).astype(np.float32)
    b = RNG.standard_normal(3).astype(np.float32)
    s = np.array([0.5, 3.0, -1.5], dtype=np.float32)
    models = []
    for weightless in (False, True):
        model = ir.from_onnx_text(text)
        users = {v.name: v for n in model.graph for v in n.inputs if v is not None}
        for name, array in (("w", w), ("b", b), ("s", s)):
            value = users[name]
            value.type, value.shape = ir.TensorType(ir.DataType.FLOAT), ir.Shape(array.shape)
            held = weightless and name != "s"
            value.const_value = _leaf(name, list(array.shape)) if held else ir.tensor(array)
            model.graph.register_initializer(value)
        irkit.optimize(model, target="onnx")
        models.append(model)
    real, meta = models
    assert _histogram(meta) == _histogram(real) == {("", "Gemm"): 1}  # (folded, then fused)
    scaled = [v.const_value for v in meta.graph.initializers.values()]
    assert sorted(type(t).__name__ for t in scaled) == ["DerivedTensor", "DerivedTensor"]
    x = RNG.standard_normal((2, 4)).astype(np.float32)
    (got,) = run_ort(irkit.save(meta, tmp_path / "m.onnx", weights={"w": w, "b": b}), [x])
    np.testing.assert_allclose(got, (x @ w + b) * s, atol=1e-5, rtol=0)


# --- save without weights, load, save with weights ----------------------------------------------


def _packed_model() -> ir.Model:
    """y = x @ Concat(Transpose(q), Transpose(k)): q, k weightless (the packed-QKV shape)."""
    model = ir.from_onnx_text(
        '<ir_version: 10, opset_import: ["" : 21]> g (float[2, 4] x) => (float[2, 5] y) '
        "{ y = MatMul(x, p) }"
    )
    q, k = _leaf("layer.q.weight", [3, 4]), _leaf("layer.k.weight", [2, 4])
    packed = concat_weights([transpose_weight(q, [1, 0]), transpose_weight(k, [1, 0])], axis=1)
    p = model.graph.node(0).inputs[1]
    p.type, p.shape = ir.TensorType(ir.DataType.FLOAT), ir.Shape([4, 5])
    p.const_value = DerivedTensor(packed.recipe, name="p")
    model.graph.register_initializer(p)
    return model


def test_round_trip_keeps_the_recipe_and_saves_with_weights_later(tmp_path):
    q = RNG.standard_normal((3, 4)).astype(np.float32)
    k = RNG.standard_normal((2, 4)).astype(np.float32)
    save_file({"layer.q.weight": q, "layer.k.weight": k}, tmp_path / "w.safetensors")
    graph_only = irkit.save(_packed_model(), tmp_path / "g.onnx")
    loaded = irkit.load(graph_only, load_external_data=False)
    tensor = loaded.graph.initializers["p"].const_value
    assert isinstance(tensor, DerivedTensor)
    assert json.loads(tensor.metadata_props[metadata.DERIVED_KEY]) == {
        "version": 1,
        "recipe": {
            "op": "concat",
            "axis": 1,
            "sources": [
                {"op": "transpose", "perm": [1, 0], "source": {
                    "op": "leaf", "name": "layer.q.weight", "dtype": "FLOAT", "shape": [3, 4]}},
                {"op": "transpose", "perm": [1, 0], "source": {
                    "op": "leaf", "name": "layer.k.weight", "dtype": "FLOAT", "shape": [2, 4]}},
            ],
        },
    }  # fmt: skip
    with pytest.raises(irkit.ModelLoadError, match="saved without weights"):
        irkit.load(graph_only)
    out = irkit.save(loaded, tmp_path / "m.onnx", weights=tmp_path / "w.safetensors")
    x = RNG.standard_normal((2, 4)).astype(np.float32)
    (got,) = run_ort(out, [x])
    np.testing.assert_array_equal(got, x @ np.concatenate([q.T, k.T], axis=1))
    assert isinstance(loaded.graph.initializers["p"].const_value, DerivedTensor)  # unchanged


def test_missing_leaf_names_the_derived_initializer_and_the_leaf(tmp_path):
    q = np.zeros((3, 4), np.float32)
    with pytest.raises(irkit.WeightsError) as info:
        irkit.save(_packed_model(), tmp_path / "m.onnx", weights={"layer.q.weight": q})
    message = str(info.value)
    assert (
        "  - 'layer.k.weight' (a leaf of derived initializer 'p') FLOAT[2, 4] "
        "(closest key: 'layer.q.weight')"
    ) in message, message
    assert info.value.names == ["layer.k.weight"]
    assert not (tmp_path / "m.onnx").exists()
    with pytest.raises(irkit.WeightsError, match=r"'layer.q.weight' \(a leaf of derived .*"
                       r"expects FLOAT\[3, 4\], 'the state_dict' holds 'layer.q.weight' as "
                       r"FLOAT\[4, 3\]"):  # fmt: skip
        irkit.save(
            _packed_model(),
            tmp_path / "m.onnx",
            weights={"layer.q.weight": q.T.copy(), "layer.k.weight": np.zeros((2, 4), np.float32)},
        )


# --- checkpoint dtype conversion ------------------------------------------------------------------


def _fp16_model() -> ir.Model:
    model = ir.from_onnx_text(
        '<ir_version: 10, opset_import: ["" : 21]> g (float16[2, 4] x) => (float16[2, 3] y) '
        "{ y = MatMul(x, w) }"
    )
    w = model.graph.node(0).inputs[1]
    w.type, w.shape = ir.TensorType(ir.DataType.FLOAT16), ir.Shape([4, 3])
    w.const_value = _leaf("w", [4, 3], ir.DataType.FLOAT16)
    model.graph.register_initializer(w)
    return model


def test_float32_checkpoint_converts_to_a_float16_model(tmp_path, caplog):
    w = RNG.standard_normal((4, 3)).astype(np.float32)
    save_file({"w": w}, tmp_path / "w.safetensors")
    with caplog.at_level(logging.INFO, logger="irkit.weights._stream"):
        path = irkit.save(_fp16_model(), tmp_path / "m.onnx", weights=tmp_path / "w.safetensors")
    assert "converted to the model's dtype while streaming (first: 'w' FLOAT → FLOAT16)" in (
        caplog.text
    )
    saved = irkit.load(path).graph.initializers["w"].const_value.numpy()
    assert saved.dtype == np.float16
    np.testing.assert_array_equal(saved, w.astype(np.float16))
    bf16 = torch.from_numpy(w).to(torch.bfloat16)  # a bf16 state_dict converts too
    path = irkit.save(_fp16_model(), tmp_path / "b.onnx", weights={"w": bf16})
    saved = irkit.load(path).graph.initializers["w"].const_value.numpy()
    np.testing.assert_array_equal(saved, bf16.to(torch.float16).numpy())
    x = RNG.standard_normal((2, 4)).astype(np.float16)
    (got,) = run_ort(path, [x])
    np.testing.assert_allclose(got, x.astype(np.float32) @ w, atol=2e-2, rtol=0)


def test_leaves_of_a_derived_tensor_convert_too(tmp_path):
    q = RNG.standard_normal((3, 4)).astype(np.float16)
    k = RNG.standard_normal((2, 4)).astype(np.float16)
    checkpoint = {"layer.q.weight": q, "layer.k.weight": k}  # float16 leaves for a float32 model
    out = irkit.save(_packed_model(), tmp_path / "m.onnx", weights=checkpoint)
    saved = irkit.load(out).graph.initializers["p"].const_value.numpy()
    assert saved.dtype == np.float32
    np.testing.assert_array_equal(saved, np.concatenate([q.T, k.T], axis=1).astype(np.float32))


@pytest.mark.parametrize("external_data", [False, True])
def test_conversion_overflow_is_a_weights_error_naming_the_tensor(tmp_path, external_data):
    w = np.ones((40, 30), np.float32)
    w[1, 2] = 1e6  # float16 tops out at 65504
    model = _fp16_model()
    held = model.graph.initializers["w"]
    held.shape, held.const_value = ir.Shape([40, 30]), _leaf("w", [40, 30], ir.DataType.FLOAT16)
    with pytest.raises(irkit.WeightsError) as info:
        irkit.save(model, tmp_path / "m.onnx", weights={"w": w}, external_data=external_data)
    assert "'w': converting the checkpoint's FLOAT tensor to the model's FLOAT16 creates 1 " in (
        str(info.value)
    )
    assert info.value.names == ["w"]


# --- memory: derived tensors are computed one at a time -------------------------------------------

ELEMENTS = 1 << 20  # float32 [1024, 1024]: 4 MiB per checkpoint tensor, 8 MiB per packed one
PACKED = 12  # 24 checkpoint tensors, 96 MiB written
# the packed tensor being written, the next one computed ahead (irkit.weights._writer._Computed)
# and one of its sources (20 MiB), and some slack
TRACED_BUDGET = 24 << 20
RSS_BUDGET = 48 << 20

SAVE = textwrap.dedent(
    """
    import json, sys, tracemalloc
    import onnx_ir as ir
    import irkit
    from irkit.weights import WeightlessTensor
    from irkit.rewriting import DerivedTensor, concat_weights, transpose_weight

    def peak_rss():
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024

    count, weights, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    adds = " ".join(f"s{i + 1} = Add(s{i}, p{i})" for i in range(count))
    model = ir.from_onnx_text(
        f'<ir_version: 10, opset_import: ["" : 21]> g (float[1024, 2048] s0) '
        f"=> (float[1024, 2048] s{count}) {{ {adds} }}"
    )
    for i, node in enumerate(model.graph):
        leaves = [WeightlessTensor(ir.DataType.FLOAT, [1024, 1024], name=f"w{2 * i + j}")
                  for j in range(2)]
        packed = concat_weights([transpose_weight(t, [1, 0]) for t in leaves], axis=1)
        p = node.inputs[1]
        p.shape, p.type = ir.Shape([1024, 2048]), ir.TensorType(ir.DataType.FLOAT)
        p.const_value = DerivedTensor(packed.recipe, name=p.name)
        model.graph.register_initializer(p)
    rss_before = peak_rss()
    tracemalloc.start()
    irkit.save(model, out, weights=weights, external_data=True)
    traced = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    print(json.dumps({"traced": traced, "rss_growth": peak_rss() - rss_before}))
    """
)


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads VmHWM (Linux)")
def test_streamed_save_of_packed_tensors_stays_within_a_fixed_budget(tmp_path):
    rng = np.random.default_rng(0)
    arrays = {f"w{i}": rng.standard_normal((1024, 1024), dtype=np.float32) for i in range(4)}
    save_file(arrays, tmp_path / "a.safetensors")  # (written in two files, 24 tensors)
    more = {
        f"w{i}": rng.standard_normal((1024, 1024), dtype=np.float32) for i in range(4, 2 * PACKED)
    }
    save_file(more, tmp_path / "b.safetensors")
    last = np.concatenate([more["w22"].T, more["w23"].T], axis=1)  # p11 = [w22ᵀ | w23ᵀ]
    del arrays, more
    out = tmp_path / "m.onnx"
    result = subprocess.run(
        [sys.executable, "-c", SAVE, str(PACKED), str(tmp_path), str(out)],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": ROOT}, timeout=300,
        check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    measured = json.loads(result.stdout.strip().splitlines()[-1])
    assert PACKED * 2 * ELEMENTS * 4 >= 4 * TRACED_BUDGET
    assert measured["traced"] < TRACED_BUDGET, measured
    assert measured["rss_growth"] < RSS_BUDGET, measured
    saved = irkit.load(out).graph.initializers[f"p{PACKED - 1}"].const_value.numpy()
    np.testing.assert_array_equal(saved, last)


def test_narrow_recipe_evaluates_round_trips_and_refuses_out_of_range() -> None:
    data = np.arange(24, dtype=np.float32).reshape(6, 4)
    leaf = weights.DerivedTensor(weights.Leaf("w", ir.DataType.FLOAT, (6, 4)))
    part = weights.narrow(leaf, 0, 2, 3)
    assert tuple(part.shape) == (3, 4)
    recipe = weights.as_recipe(part)
    again = weights.recipe_from_json(part.metadata_props[metadata.DERIVED_KEY], "test")
    assert again == recipe
    np.testing.assert_array_equal(weights.evaluate(again, lambda _leaf: data), data[2:5])
    real = weights.narrow(ir.tensor(data), 1, 1, 2)  # data in, data out
    np.testing.assert_array_equal(real.numpy(), data[:, 1:3])
    with pytest.raises(irkit.WeightsError, match="does not fit"):
        weights.narrow(leaf, 0, 4, 3)
