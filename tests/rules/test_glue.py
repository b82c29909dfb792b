"""Rule families :mod:`irkit.rules.glue` and :mod:`irkit.rules.packed` (the ``"onnx"`` target).

Hand-written graphs (fast): exact ops after the rewrite, onnxruntime numbers unchanged, the
reasons a rule declines. The tiny Llama's decode graph exported with its KV cache (slow): exact
op histograms before (the standard fusions only) and after (glue + packing), then after
``irkit.quantize``; onnxruntime against eager transformers for a prefill and decode steps.
"""

from __future__ import annotations

import functools

import numpy as np
import onnx_ir as ir
import pytest

import irkit
from irkit import rules as library
from tests.rewriting import util

H = '<ir_version: 10, opset_import: ["" : 23]>\n'


def attention_text(*, rotary: bool = True, out_perm: str = "0, 2, 1, 3", hidden: int = 32) -> str:
    """HF-style attention on 3-D projections: Reshape → Transpose (→ rotary) → Attention with a
    past, then Transpose → Reshape; 4 query heads, 2 KV heads of size 8; symbolic batch/seq."""
    rot_q = "qr = RotaryEmbedding(qt, cos, sin)" if rotary else "qr = Identity(qt)"
    rot_k = "kr = RotaryEmbedding(kt, cos, sin)" if rotary else "kr = Identity(kt)"
    return H + (
        "g (float[b, s, 32] xq, float[b, s, 16] xk, float[b, s, 16] xv, float[b, s, 4] cos,"
        " float[b, s, 4] sin, float[b, 2, p, 8] pk, float[b, 2, p, 8] pv)"
        " => (float[b, s, 32] y, float[b, 2, t, 8] presk, float[b, 2, t, 8] presv) {\n"
        "  sq = Constant<value=int64[4] {0, 0, 4, 8}>()  skv = Constant<value=int64[4] {0, 0, 2, 8}>()\n"
        f"  so = Constant<value=int64[3] {{0, 0, {hidden}}}>()\n"
        "  q4 = Reshape(xq, sq)  qt = Transpose<perm=[0, 2, 1, 3]>(q4)\n"
        "  k4 = Reshape(xk, skv)  kt = Transpose<perm=[0, 2, 1, 3]>(k4)\n"
        "  v4 = Reshape(xv, skv)  vt = Transpose<perm=[0, 2, 1, 3]>(v4)\n"
        f"  {rot_q}  {rot_k}\n"
        "  a, presk, presv = Attention<scale=0.35>(qr, kr, vt, , pk, pv)\n"
        f"  at = Transpose<perm=[{out_perm}]>(a)  y = Reshape(at, so)\n"
        "}"
    )


def _shaped(text: str) -> ir.Model:
    return util.infer_shapes(util.model(text))


def _onnx_target(m: ir.Model, **kwargs):
    return util.rewrite(m, library.onnx_target_rules(), **kwargs)


@pytest.mark.parametrize("rotary", [True, False])
def test_head_reshapes_fold_into_a_3d_attention(rotary):
    m = _shaped(attention_text(rotary=rotary))
    before = util.clone(m)
    report = _onnx_target(m)
    assert report.fired["HeadReshapesIntoAttention"] == 1
    assert util.ops(m) == ({"Attention": 1, "RotaryEmbedding": 2} if rotary else {"Attention": 1})
    (att,) = [n for n in m.graph if n.op_type == "Attention"]
    assert att.attributes.get_int("q_num_heads") == 4
    assert att.attributes.get_int("kv_num_heads") == 2
    assert att.attributes.get_float("scale") == pytest.approx(0.35)
    assert [n.attributes.get_int("num_heads") for n in m.graph if n.op_type != "Attention"] == (
        [4, 2] if rotary else []
    )
    util.assert_same_numbers(before, m)


def test_head_reshapes_stay_when_the_output_is_not_merged_back():
    m = _shaped(attention_text(out_perm="0, 1, 2, 3"))
    report = _onnx_target(m, explain="HeadReshapesIntoAttention")
    stats = report.rules["HeadReshapesIntoAttention"]
    assert stats.fired == 0
    assert any("not followed by Transpose" in r for r in stats.failures), dict(stats.failures)


def test_head_reshapes_stay_when_the_merge_is_not_the_heads():
    m = _shaped(attention_text(hidden=-1))  # Reshape to [b, s, -1]: shape inference gives 32
    assert _onnx_target(m).fired["HeadReshapesIntoAttention"] == 1
    m = util.model(attention_text())  # no shapes on the intermediate values: nothing is known
    report = _onnx_target(m)
    stats = report.rules["HeadReshapesIntoAttention"]
    assert stats.fired == 0
    assert "Reshape is not rank 3 → rank 4 with known shapes" in stats.failures


RESHAPE_TEXT = H + (
    "g (float[b, 4] x) => (float[b, 4] z, float[b, 2, 2] w) {\n"
    "  s = Shape(x)  y = Reshape(x, s)  z = Relu(y)\n"
    "  two = Constant<value=int64[3] {0, 2, 2}>()  v = Reshape(x, two)  w = Relu(v)\n"
    "}"
)


def test_a_reshape_to_the_shape_it_has_goes():
    m = _shaped(RESHAPE_TEXT)
    before = util.clone(m)
    report = _onnx_target(m, explain="ShapeKeepingReshape")
    stats = report.rules["ShapeKeepingReshape"]
    assert stats.fired == 1 and report.fired.get("NoOpReshape", 0) == 0
    assert any("differs from input shape" in r for r in stats.failures), dict(stats.failures)
    assert util.ops(m) == {"Constant": 1, "Relu": 2, "Reshape": 1}
    util.assert_same_numbers(before, m)


def test_a_reshape_chain_back_to_its_input_goes():
    """``Reshape(Reshape(x, [b, s, 2, 4]), [b, s, 8]) = x`` (shapes by name, the outer shape
    computed, so no constant folding or ``ReshapeReshape`` sees it); a chain to another shape
    stays."""
    m = _shaped(
        H + "g (float[b, s, 8] x) => (float[b, s, 8] z, float[b, s, 2, 4] u) {\n"
        "  four = Constant<value=int64[4] {0, 0, 2, 4}>()  h = Reshape(x, four)\n"
        "  n = Shape<start=0, end=2>(x)  e = Constant<value=int64[1] {8}>()\n"
        "  back = Concat<axis=0>(n, e)  y = Reshape(h, back)  z = Relu(y)\n"
        "  other = Reshape(y, four)  u = Relu(other)\n}"
    )
    before = util.clone(m)
    report = _onnx_target(m)
    assert report.fired["ShapeKeepingReshape"] == 2  # (y, then ``other`` = h's reshape of x)
    assert util.ops(m) == {"Constant": 1, "Relu": 2, "Reshape": 1}
    relu = next(n for n in m.graph if n.op_type == "Relu" and n.outputs[0].name == "z")
    assert relu.inputs[0] is m.graph.inputs[0]
    util.assert_same_numbers(before, m)


def test_a_reshape_of_unknown_shapes_stays():
    m = util.model(RESHAPE_TEXT)  # (no inference: y's shape is unknown)
    report = _onnx_target(m)
    assert report.rules["ShapeKeepingReshape"].fired == 0
    assert "input or output shape unknown" in report.rules["ShapeKeepingReshape"].failures


def test_an_expand_to_the_shape_it_has_goes():
    m = _shaped(
        H + "g (float[b, 4] x) => (float[b, 4] z) {\n"
        "  s = Shape(x)  y = Expand(x, s)  z = Relu(y)\n}"
    )
    before = util.clone(m)
    report = _onnx_target(m)
    assert report.fired["ShapeKeepingExpand"] == 1
    assert util.ops(m) == {"Relu": 1}
    util.assert_same_numbers(before, m)


def test_unsqueeze_chains_become_one():
    m = _shaped(
        H + "g (float[b] x) => (float[1, 1, b, 1] z) {\n"
        "  a0 = Constant<value=int64[1] {0}>()  a1 = Constant<value=int64[1] {1}>()\n"
        "  a3 = Constant<value=int64[1] {-1}>()\n"
        "  u = Unsqueeze(x, a0)  v = Unsqueeze(u, a1)  w = Unsqueeze(v, a3)  z = Relu(w)\n}"
    )
    before = util.clone(m)
    report = _onnx_target(m)
    assert report.fired["UnsqueezeUnsqueeze"] == 2
    assert util.ops(m) == {"Constant": 1, "Relu": 1, "Unsqueeze": 1}
    (axes,) = [n for n in m.graph if n.op_type == "Constant"]
    assert axes.attributes["value"].as_tensor().numpy().tolist() == [0, 1, 3]
    util.assert_same_numbers(before, m)


def padding_text(cols: str = "t") -> str:
    """transformers' ``attention_mask[batch_idx, kv_idx]`` as torch.export lowers it."""
    return H + (
        f"g (bool[b, t] m, int64 n, int64 k) => (bool[b, 1, 1, {cols}] y) {{\n"
        "  zero = Constant<value=int64 {0}>()  one = Constant<value=int64 {1}>()\n"
        "  ri = Range(zero, n, one)  rj = Range(zero, k, one)\n"
        "  a1 = Constant<value=int64[3] {1, 2, 3}>()  a0 = Constant<value=int64[3] {0, 1, 2}>()\n"
        "  i = Unsqueeze(ri, a1)  j = Unsqueeze(rj, a0)\n"
        "  mx = Max(i, j)  s = Shape(mx)  ie = Expand(i, s)  je = Expand(j, s)\n"
        "  last = Constant<value=int64[1] {-1}>()\n"
        "  iu = Unsqueeze(ie, last)  ju = Unsqueeze(je, last)\n"
        "  idx = Concat<axis=-1>(iu, ju)  y = GatherND(m, idx)\n}"
    )


def _declare(m: ir.Model, name: str, shape: list) -> None:
    """Give ``name`` the symbolic shape the lowering would (inference cannot see a Range's
    length)."""
    for node in m.graph:
        for v in node.outputs:
            if v.name == name:
                v.shape = ir.Shape(shape)


@pytest.mark.parametrize("known", [True, False])
def test_the_padding_mask_gather_becomes_an_unsqueeze(known):
    m = _shaped(padding_text())
    _declare(m, "ri", ["b"])
    _declare(m, "i", ["b", 1, 1, 1])
    _declare(m, "rj", ["t" if known else "k"])
    _declare(m, "j", [1, 1, 1, "t" if known else "k"])
    m.graph.outputs[0].shape = ir.Shape(["b", 1, 1, "t" if known else "k"])
    report = _onnx_target(m)
    assert report.fired["PaddingMaskGather"] == 1
    ops = util.ops(m)
    assert "GatherND" not in ops and ops["Unsqueeze"] == 1
    assert ops.get("Slice", 0) == (0 if known else 1)  # a length not provably m's: sliced
    from tests.helpers import run_ort

    rng = np.random.default_rng(0)
    mask = rng.integers(0, 2, (3, 6)).astype(bool)
    for k in [6] if known else [6, 4]:
        (got,) = run_ort(m, {"m": mask, "n": np.array(3), "k": np.array(k)})
        np.testing.assert_array_equal(got, mask[:, None, None, :k])


def test_and_with_true_goes():
    m = _shaped(
        H + "g (bool[b, 4] x, bool[b, 4] w) => (bool[b, 4] z) {\n"
        "  t = Constant<value=bool {1}>()  y = And(t, x)  z = Or(y, w)\n}"
    )
    before = util.clone(m)
    report = _onnx_target(m)
    assert report.fired["AndTrue"] == 1
    assert util.ops(m) == {"Or": 1}
    util.assert_same_numbers(before, m)


def slice_text(end: int = 4, second: str = "f") -> str:
    """The rotary tables as transformers computes them, sliced to the half opset 23 takes."""
    return H + (
        "g (float[b, s, 4] f, float[b, s, 4] g) => (float[b, s, 4] c, float[b, s, 4] d) {\n"
        f"  e = Concat<axis=-1>(f, {second})  co = Cos(e)  si = Sin(e)\n"
        f"  z = Constant<value=int64[1] {{0}}>()  n = Constant<value=int64[1] {{{end}}}>()\n"
        "  ax = Constant<value=int64[1] {-1}>()\n"
        "  c0 = Slice(co, z, n, ax)  d0 = Slice(si, z, n, ax)  c = Relu(c0)  d = Relu(d0)\n}"
    )


def test_the_half_of_a_duplicated_rotary_table_is_computed_once():
    m = _shaped(slice_text())
    before = util.clone(m)
    report = _onnx_target(m)
    assert report.fired["SliceOfConcat"] == 2
    assert util.ops(m) == {"Cos": 1, "Relu": 2, "Sin": 1}
    util.assert_same_numbers(before, m)


def test_a_slice_that_is_not_the_first_operand_stays():
    m = _shaped(slice_text(end=3))
    report = _onnx_target(m, explain="SliceOfConcat")
    stats = report.rules["SliceOfConcat"]
    assert stats.fired == 0
    assert any("does not take exactly the first operand" in r for r in stats.failures)


def test_projections_of_one_input_are_packed_in_the_onnx_target():
    rng = np.random.default_rng(0)
    w0 = rng.standard_normal((6, 8)).astype(np.float32)  # (out, in): used through Transpose
    w1 = rng.standard_normal((8, 4)).astype(np.float32)
    w2 = rng.standard_normal((8, 2)).astype(np.float32)

    def constant(name, w):
        dims = ", ".join(str(d) for d in w.shape)
        values = ", ".join(f"{v:.6f}" for v in w.ravel())
        return f"  {name} = Constant<value=float[{dims}] {{{values}}}>()\n"

    m = util.model(
        H
        + "g (float[2, 3, 8] x) => (float[2, 3, 6] a, float[2, 3, 4] b, float[2, 3, 2] c) {\n"
        + constant("w0", w0)
        + constant("w1", w1)
        + constant("w2", w2)
        + "  t = Transpose<perm=[1, 0]>(w0)  a = MatMul(x, t)  b = MatMul(x, w1)"
        "  c = MatMul(x, w2)\n}"
    )
    m = util.infer_shapes(m)
    before = util.clone(m)
    report = util.optimize(m)  # (folding gives the Constant outputs their values)
    assert report.fired["PackedMatMul"] == 1
    assert util.ops(m) == {"MatMul": 1, "Split": 1}
    assert [tuple(v.shape) for v in m.graph.initializers.values()] == [(8, 12), (3,)]
    util.assert_same_numbers(before, m)


# --- the tiny Llama's decode step ----------------------------------------------------------------
# (one Max is the attention mask's floor: torchlib fills a boolean mask with finfo.min, whose
# all-masked rows onnxruntime's Attention would zero; see irkit.rules.attention)

BEFORE = {  # irkit.optimize with the standard fusions only (irkit.rules.default_rules)
    "Add": 6, "And": 1, "Attention": 2, "Cast": 2, "Concat": 4, "Cos": 1, "Expand": 3,
    "Gather": 1, "GatherND": 1, "LessOrEqual": 1, "MatMul": 15, "Max": 1, "Mul": 5,
    "RMSNormalization": 5, "Range": 3, "Reshape": 13, "RotaryEmbedding": 4, "Shape": 4,
    "Sigmoid": 2, "Sin": 1, "Slice": 2, "Squeeze": 3, "Transpose": 8, "Unsqueeze": 12,
    "Where": 1,
}  # fmt: skip
AFTER = {  # irkit.optimize(target="onnx"): the glue rules and packing
    "Add": 6, "And": 1, "Attention": 2, "Cast": 2, "Cos": 1, "Gather": 1, "LessOrEqual": 1,
    "MatMul": 11, "Mul": 5, "RMSNormalization": 5, "Range": 2, "Reshape": 1,
    "RotaryEmbedding": 4, "Shape": 2, "Sigmoid": 2, "Sin": 1, "Slice": 1, "Split": 2,
    "Squeeze": 2, "Unsqueeze": 4, "Where": 1,
}  # fmt: skip


@functools.cache
def _tiny_llama():
    import torch
    import transformers

    from irkit.llm import export_causal_lm

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=128,
        max_position_embeddings=256,
    )
    lm = transformers.LlamaForCausalLM(cfg).eval()
    exported = export_causal_lm(lm)
    flat = irkit.lower(exported.program, functions=False, **exported.lower_kwargs())
    with_functions = irkit.lower(exported.program, **exported.lower_kwargs())
    return lm, flat, with_functions


def _eager_check(lm, model: ir.Model, atol: float) -> None:
    from irkit.llm import causal_lm_feeds, run_eager
    from tests.helpers import assert_close, ort_session

    session = ort_session(model)
    for batch, seq, past in [(1, 1, 7), (2, 4, 0), (2, 1, 9), (2, 5, 3)]:
        feeds = causal_lm_feeds(lm, batch=batch, seq=seq, past=past, seed=past)
        if past == 3:  # the first sequence left-padded by 2: the padding mask is read
            feeds["attention_mask"][0, :2] = 0
            positions = np.maximum(np.cumsum(feeds["attention_mask"], -1) - 1, 0)
            feeds["position_ids"] = positions[:, past:]
        assert_close(session.run(None, feeds), run_eager(lm, feeds), atol=atol)


@pytest.mark.slow
def test_tiny_llama_decode_graph_before_and_after():
    from tests.helpers import FP32_ATOL

    lm, flat, _ = _tiny_llama()
    before = irkit.optimize(util.clone(flat), rules=library.default_rules())
    assert util.ops(before) == BEFORE
    assert sum(BEFORE.values()) == 101 and sum(AFTER.values()) == 57
    after = util.clone(flat)
    report = irkit.RewriteReport()
    irkit.optimize(after, report=report)
    assert util.ops(after) == AFTER
    assert report.fired["HeadReshapesIntoAttention"] == 2  # one per layer
    assert report.fired["PackedMatMul"] == 2  # q/k/v per layer (gate/up: two stay two)
    _eager_check(lm, after, FP32_ATOL)

    quantized = irkit.quantize(util.clone(after))
    assert util.ops(quantized) == {
        **{k: v for k, v in AFTER.items() if k != "MatMul"},
        "MatMulNBits": 11,
    }
    _eager_check(lm, quantized, 0.6)


@pytest.mark.slow
def test_tiny_llama_with_functions_rewrites_the_attention_body_once():
    from tests.helpers import FP32_ATOL

    lm, _, with_functions = _tiny_llama()
    model = util.clone(with_functions)
    report = irkit.RewriteReport()
    irkit.optimize(model, report=report)
    assert report.fired["HeadReshapesIntoAttention"] == 1  # the shared attention body
    (body,) = [f for f in model.functions.values() if f.name == "LlamaAttention"]
    assert util.ops(body) == {
        "Attention": 1, "Constant": 5, "Linear": 2, "Linear_1": 2,
        "RotaryEmbedding": 2, "Slice": 2, "Where": 1,
    }  # fmt: skip
    # the weights are the body's inputs: packing declines and says why
    assert report.rules["PackedMatMul"].fired == 0
    _eager_check(lm, model, FP32_ATOL)
