"""Rule family :mod:`irkit.rules.attention`: fires (exact ops, onnxruntime numbers), declines (reason).

The graphs are written the way torchlib lowers ``scaled_dot_product_attention`` (kᵀ through
``Shape``/``Reshape``/``Transpose``, √scale on both operands, the bool-mask ``Where`` and the
``IsNaN`` guard) and the way HF's eager attention lowers, with HF's ``repeat_kv`` and cache
``Concat``; hypothesis draws the sizes, the head grouping, the mask kind and the dtype.
"""

from __future__ import annotations

import math
import re

import numpy as np
import onnx_ir as ir
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from irkit import rules as library
from irkit.rewriting._acyclic import CYCLE
from tests.rewriting import util

SETTINGS = settings(max_examples=10, deadline=None, derandomize=True)
FLOAT, FLOAT16 = 1, 10
LOWEST = {"float": -3.4028234663852886e38, "float16": -65504.0}


def attention_text(
    b=2,
    hq=4,
    hkv=2,
    s=3,
    p=5,
    d=8,
    *,
    form="sdpa",
    mask="float",
    cache=True,
    dtype="float",
    opset=23,
    softmax_axis=-1,
    cat_axis=-2,
    scale=None,
    softcap=None,
    kv_len=None,
    mask_shape=None,
) -> str:
    """ONNX text of one attention block as the exporters write it (fp16: constants converted later).

    ``softcap`` (eager only): gemma2's ``tanh(scores / c) · c`` between the scale and the mask.
    ``kv_len``: the new keys' length (cross attention: not ``s``); ``mask_shape``: the mask's
    dims (default ``(b, 1, s, total)``; any shape that broadcasts to the scores).
    """
    kv = s if kv_len is None else kv_len
    total = p + kv if cache else kv
    ins = [
        f"float[{b},{hq},{s},{d}] q",
        f"float[{b},{hkv},{kv},{d}] k",
        f"float[{b},{hkv},{kv},{d}] v",
    ]
    outs = [f"float[{b},{hq},{s},{d}] y"]
    body = []
    kk, vv = "k", "v"
    if cache:
        ins += [f"float[{b},{hkv},{p},{d}] pk", f"float[{b},{hkv},{p},{d}] pv"]
        outs += [f"float[{b},{hkv},{total},{d}] kc", f"float[{b},{hkv},{total},{d}] vc"]
        body.append(f"kc = Concat<axis={cat_axis}>(pk, k)  vc = Concat<axis={cat_axis}>(pv, v)")
        kk, vv = "kc", "vc"
    if hq != hkv:
        n = hq // hkv
        body.append(
            f"two = Constant<value=int64[1] {{2}}>()"
            f"  es = Constant<value=int64[5] {{{b},{hkv},{n},{total},{d}}}>()"
            f"  rs = Constant<value=int64[4] {{{b},{hq},{total},{d}}}>()"
            f"  ku = Unsqueeze({kk}, two)  ke = Expand(ku, es)  kr = Reshape(ke, rs)"
            f"  vu = Unsqueeze({vv}, two)  ve = Expand(vu, es)  vr = Reshape(ve, rs)"
        )
        kk, vv = "kr", "vr"
    dims = ",".join(str(x) for x in (mask_shape or (b, 1, s, total)))
    if mask == "float":
        ins.append(f"float[{dims}] m")
    elif mask == "bool":
        ins.append(f"bool[{dims}] m")
    scale = 1 / math.sqrt(d) if scale is None else scale
    if form == "sdpa" or mask == "bool":
        body.append("z = Constant<value=float {0.0}>()")
    if mask == "bool":
        body.append(f"lo = Constant<value=float {{{LOWEST[dtype]}}}>()")
    if form == "sdpa":
        body.append(
            "m1 = Constant<value=int64[1] {-1}>()  m2 = Constant<value=int64[1] {-2}>()"
            "  big = Constant<value=int64[1] {9223372036854775807}>()"
            "  small = Constant<value=int64[1] {-9223372036854775808}>()"
            f"  shp = Shape({kk})  last = Slice(shp, m1, big)  second = Slice(shp, m2, m1)"
            "  lead = Slice(shp, small, m2)  s1 = Concat<axis=0>(m1, second, last)"
            f"  kf = Reshape({kk}, s1)  kt = Transpose<perm=[0,2,1]>(kf)"
            "  s2 = Concat<axis=0>(lead, last, second)  kT = Reshape(kt, s2)"
            f"  sc = Constant<value=float {{{math.sqrt(scale)}}}>()  qs = Mul(q, sc)  ks = Mul(kT, sc)"
            "  a = MatMul(qs, ks)"
        )
    else:
        body.append(
            f"kT = Transpose<perm=[0,1,3,2]>({kk})  a0 = MatMul(q, kT)"
            f"  sc = Constant<value=float {{{scale}}}>()  a = Mul(a0, sc)"
        )
    if softcap is not None:
        body.append(
            f"cap = Constant<value=float {{{softcap}}}>()  ad = Div(a, cap)  at = Tanh(ad)"
            "  ac = Mul(at, cap)"
        )
    logits = "ac" if softcap is not None else "a"
    if mask == "float":
        body.append(f"a2 = Add({logits}, m)")
        logits = "a2"
    elif mask == "bool":
        body.append(f"mf = Where(m, z, lo)  a2 = Add({logits}, mf)")
        logits = "a2"
    if form == "sdpa":
        body.append(
            f"pr = Softmax<axis={softmax_axis}>({logits})  nan = IsNaN(pr)  pg = Where(nan, z, pr)"
            f"  y = MatMul(pg, {vv})"
        )
    elif dtype == "float16":  # HF eager: softmax(..., dtype=float32).to(query.dtype)
        body.append(
            f"c32 = Cast<to=1>({logits})  pr = Softmax<axis={softmax_axis}>(c32)"
            f"  pc = Cast<to=10>(pr)  y = MatMul(pc, {vv})"
        )
    else:
        body.append(f"pr = Softmax<axis={softmax_axis}>({logits})  y = MatMul(pr, {vv})")
    header = f'<ir_version: 10, opset_import: ["" : {opset}]>\n'
    return (
        header + f"g ({', '.join(ins)}) => ({', '.join(outs)}) {{\n  " + "\n  ".join(body) + "\n}"
    )


def build(text: str, dtype: str = "float") -> ir.Model:
    m = util.model(text)
    if dtype == "float16":
        for v in (*m.graph.inputs, *m.graph.outputs):
            if v.dtype == ir.DataType.FLOAT:
                v.type = ir.TensorType(ir.DataType.FLOAT16)
        for node in m.graph:
            if node.op_type == "Constant" and "value" in node.attributes:
                t = node.attributes["value"].value
                if t.dtype == ir.DataType.FLOAT:
                    arr = t.numpy().astype(np.float16)
                    node.attributes["value"] = ir.AttrTensor("value", ir.tensor(arr))
    return util.infer_shapes(m)


def run(m: ir.Model, dtype: str = "float", explain: str | None = None):
    before = util.clone(m)
    report = util.rewrite(m, library.default_rules(), explain=explain)
    util.assert_valid(m)
    util.assert_same_numbers(before, m, atol=1e-2 if dtype == "float16" else 1e-4)
    return report


#: The ops of the mask's floor (irkit.rules.attention: rows masked with finfo.min at every
#: key): eager ``Max(mask, floor)``; torchlib's NaN-guarded SDPA raises only the lowest
#: entries, ``Where(Equal(mask, lowest), floor, mask)`` (its ``-inf`` rows stay 0).
_FLOOR = {
    "eager": {"Constant": 1, "Max": 1},
    "sdpa": {"Constant": 2, "Equal": 1, "Where": 1},
}


def fired(report) -> dict[str, int]:
    return {k: v for k, v in report.fired.items() if k.startswith("Attention")}


# --- positive ------------------------------------------------------------------------------------


@pytest.mark.parametrize("form", ["sdpa", "eager"])
def test_gqa_with_cache_becomes_one_attention(form):
    m = build(attention_text(form=form))
    report = run(m)
    assert fired(report) == {"Attention": 1, "AttentionGQA": 1, "AttentionKVCache": 1}
    # a float mask that may hold finfo.min rows gets the floor (_FLOOR)
    assert util.ops(m) == {"Attention": 1, **_FLOOR[form]}
    (node,) = [n for n in m.graph if n.op_type == "Attention"]
    mask = node.inputs[3].producer().inputs[0 if form == "eager" else 2]
    assert [v.name for v in (*node.inputs[:3], mask, *node.inputs[4:])] == [
        "q", "k", "v", "m", "pk", "pv"
    ]  # fmt: skip
    assert [v.name for v in node.outputs] == ["y", "kc", "vc"]
    assert node.attributes["scale"].value == pytest.approx(1 / math.sqrt(8), rel=1e-6)


def test_bool_mask_keeps_its_additive_form():
    m = build(attention_text(mask="bool", cache=False, hkv=4))
    report = run(m)
    assert fired(report) == {"Attention": 1}
    # torchlib's Where(mask, 0, finfo.min): the floor is a Max
    assert util.ops(m) == {"Attention": 1, "Constant": 3, "Max": 1, "Where": 1}


def test_no_mask_and_custom_scale():
    m = build(attention_text(mask="none", cache=False, hkv=4, scale=0.3, form="eager"))
    run(m)
    (node,) = list(m.graph)
    assert len(node.inputs) == 3
    assert node.attributes["scale"].value == pytest.approx(0.3, rel=1e-6)


@pytest.mark.parametrize("cache", [True, False], ids=["cache", "no-cache"])
@pytest.mark.parametrize("mask", ["float", "bool", "none"])
@pytest.mark.parametrize("dtype", ["float", "float16"])
def test_softcap_becomes_an_attribute(cache, mask, dtype):
    # gemma2's tanh(scores / c) · c comes before the mask; onnxruntime's Attention caps before it
    # adds the mask too, else a masked (lowest) score would be capped to -c and leak probability:
    # run() compares the numbers in onnxruntime (the bool mask fills with the dtype's lowest).
    m = build(attention_text(form="eager", mask=mask, cache=cache, dtype=dtype, softcap=1.5), dtype)
    report = run(m, dtype)
    expect = {"Attention": 1, "AttentionGQA": 1}
    if cache:
        expect["AttentionKVCache"] = 1
    assert fired(report) == expect
    ops = util.ops(m)
    assert ops.pop("Attention") == 1 and not {"Tanh", "Div", "Softmax", "MatMul"} & set(ops)
    (att,) = [n for n in m.graph if n.op_type == "Attention"]
    assert att.attributes["softcap"].value == pytest.approx(1.5)
    assert att.attributes["scale"].value == pytest.approx(1 / math.sqrt(8), rel=1e-3)  # fp16


@SETTINGS
@given(
    b=st.integers(1, 3),
    hkv=st.integers(1, 3),
    n_rep=st.integers(1, 3),
    s=st.integers(1, 4),
    p=st.integers(1, 6),
    d=st.sampled_from([4, 8, 16]),
    form=st.sampled_from(["sdpa", "eager"]),
    mask=st.sampled_from(["float", "bool", "none"]),
    cache=st.booleans(),
    dtype=st.sampled_from(["float", "float16"]),
)
def test_property_numbers(b, hkv, n_rep, s, p, d, form, mask, cache, dtype):
    text = attention_text(
        b, hkv * n_rep, hkv, s, p, d, form=form, mask=mask, cache=cache, dtype=dtype
    )
    m = build(text, dtype)
    report = run(m, dtype)
    expect = {"Attention": 1}
    if n_rep > 1:
        expect["AttentionGQA"] = 1
    if cache:
        expect["AttentionKVCache"] = 1
    assert fired(report) == expect
    assert util.ops(m).get("Attention") == 1
    assert not {"Softmax", "MatMul", "Expand", "Concat"} & set(util.ops(m))


# --- negative ------------------------------------------------------------------------------------


def _reason(m: ir.Model, rule: str) -> dict[str, int]:
    report = util.rewrite(m, library.default_rules(), explain=rule)
    assert report.rules[rule].fired == 0
    assert report.near_misses or report.rules[rule].failures
    return dict(report.rules[rule].failures)


def test_needs_opset_23():
    failures = _reason(build(attention_text(opset=22)), "Attention")
    assert failures.get("needs opset >= 23, graph has 22", 0) >= 1


def test_softmax_over_another_axis():
    failures = _reason(build(attention_text(softmax_axis=-2, form="eager")), "Attention")
    assert "softmax over axis -2, not the last (keys) axis" in failures


def test_cache_grown_along_heads_is_not_a_kv_cache():
    m = build(attention_text(cat_axis=1, hq=2, hkv=2, p=2, s=2, b=2))
    failures = _reason(m, "AttentionKVCache")
    assert "the cache grows along axis 1, not the sequence axis 2" in failures


def _without_outputs(text: str, *names: str) -> str:
    """``text`` with graph outputs ``names`` dropped (their values stay, used inside)."""
    for name in names:
        text = re.sub(rf", float\[[^\]]*\] {name}\b", "", text)
    return text


@pytest.mark.parametrize("dropped", [("kc", "vc"), ("vc",)], ids=["both", "value"])
def test_joint_attention_concat_is_no_cache(dropped):
    # SD3's joint attention concatenates image and text K/V: no present leaves the graph. The
    # cache form (past inputs without present outputs) is a node onnxruntime refuses to run;
    # the Concat stays and feeds a plain Attention (run() checks the numbers in onnxruntime).
    text = _without_outputs(attention_text(), *dropped)
    m = build(text)
    assert [v.name for v in m.graph.outputs] == [n for n in ("y", "kc", "vc") if n not in dropped]
    report = run(m)
    assert fired(report) == {"Attention": 1, "AttentionGQA": 1}
    assert util.ops(m) == {"Concat": 2, "Attention": 1, **_FLOOR["sdpa"]}
    (att,) = [n for n in m.graph if n.op_type == "Attention"]
    assert [v.name for v in att.inputs[:3]] == ["q", "kc", "vc"]
    assert att.inputs[3].producer().inputs[2].name == "m"  # (its floor)
    assert len(att.outputs) == 1
    failures = _reason(build(text), "AttentionKVCache")
    name = "key" if "kc" in dropped else "value"
    assert (
        f"the concatenated {name} is not an output of the graph or function (no present to "
        "return): a concatenation, not a cache update"
    ) in failures


def _mask_from_present_value(form: str) -> str:
    """doge's dynamic mask: computed from the concatenated (present) value, not a graph input."""
    text = attention_text(form=form)  # b=2, s=3, p+s=8
    text = re.sub(r", float\[[^\]]*\] m\)", ")", text)  # the mask input (the last one)
    return text.replace(
        "vc = Concat<axis=-2>(pv, v)",
        "vc = Concat<axis=-2>(pv, v)  ax = Constant<value=int64[2] {1, 3}>()"
        "  ms = ReduceMean<keepdims=1>(vc, ax)  mt = Transpose<perm=[0,1,3,2]>(ms)"
        "  ws = Constant<value=int64[4] {2, 1, 3, 8}>()  m = Expand(mt, ws)",
    )


def _topologically_sorted(graph: ir.Graph) -> bool:
    seen = {v for v in graph.inputs} | set(graph.initializers.values())
    for node in graph:
        if any(v is not None and v.producer() is not None and v not in seen for v in node.inputs):
            return False
        seen.update(node.outputs)
    return True


@pytest.mark.parametrize("form", ["sdpa", "eager"])
def test_mask_computed_from_the_present_is_no_kv_cache(form):
    # One Attention with present outputs would read its own present_value through the mask: the
    # engine refuses a replacement that makes the graph cyclic, and says why.
    text = _mask_from_present_value(form)
    m = build(text)
    report = run(m)  # valid, and the same numbers in onnxruntime
    assert fired(report) == {"Attention": 1, "AttentionGQA": 1}
    assert util.ops(m)["Concat"] == 2 and util.ops(m)["Attention"] == 1
    assert _topologically_sorted(m.graph)
    report = util.rewrite(build(text), library.default_rules(), explain="AttentionKVCache")
    (miss,) = [n for n in report.near_misses if n.reason.startswith("would create a cycle")]
    # read (the mask, or its floor in the eager form); produced from
    assert miss.reason.endswith(
        f"[value '{'val_3' if form == 'sdpa' else 'val_1'}', node '' (Concat)]"
    )
    assert report.rules["AttentionKVCache"].failures == {CYCLE: 1}


@pytest.mark.parametrize("present", [True, False], ids=["presents", "no-presents"])
def test_cache_inside_a_function_needs_function_outputs(present):
    # The block as a local function called once: a present leaves the function, not the graph.
    text = attention_text() if present else _without_outputs(attention_text(), "kc", "vc")
    body = build(text).graph
    function = ir.Function("test", "Block", graph=body, attributes=[])
    inputs = [ir.Value(name=v.name, type=v.type, shape=v.shape) for v in body.inputs]
    call = ir.Node("test", "Block", inputs, num_outputs=len(body.outputs))
    for out, inner in zip(call.outputs, body.outputs, strict=True):
        out.name, out.type, out.shape = inner.name, inner.type, inner.shape
    graph = ir.Graph(
        inputs, list(call.outputs), nodes=[call], opset_imports={"": 23, "test": 1}, name="g"
    )
    m = ir.Model(graph, ir_version=10, functions=[function])
    report = run(m)
    expect = {"Attention": 1, "AttentionGQA": 1}
    if present:
        expect["AttentionKVCache"] = 1
    assert fired(report) == expect


def test_q_of_rank_3_is_not_matched():
    text = attention_text(form="eager", mask="none", cache=False, hkv=4).replace(
        "float[2,4,3,8] q", "float[8,3,8] q"
    )
    failures = _reason(build(text), "Attention")
    assert "q must be 4-D (B, H, S, D), rank is 3" in failures


def test_query_shared_across_the_batch_is_not_matched():
    # BLIP-2's Q-Former: one set of learned queries (batch 1) against every item's keys
    text = attention_text(form="eager", mask="none", cache=False, hkv=4)
    failures = _reason(build(text.replace("float[2,4,3,8] q", "float[1,4,3,8] q")), "Attention")
    assert "q, k, v batch dims differ (1, 2, 2): the matmuls broadcast them" in failures


def test_query_heads_broadcast_over_key_heads_is_not_matched():
    text = attention_text(form="eager", mask="none", cache=False, hkv=4, hq=4)
    failures = _reason(build(text.replace("float[2,4,3,8] q", "float[2,1,3,8] q")), "Attention")
    assert "q's 1 heads are not a multiple of k's 4: the matmuls broadcast" in failures


def test_broadcast_sdpa_lowered_by_torchlib_stays_decomposed_and_loads():
    torch = pytest.importorskip("torch")
    import irkit
    from tests.helpers import ort_session

    class SharedQuery(torch.nn.Module):
        def forward(self, q, k, v):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v)

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(b, 4, s, 8, generator=g) for b, s in ((1, 2), (3, 5), (3, 5)))
    model = irkit.lower(torch.export.export(SharedQuery(), (q, k, v)))
    report = irkit.RewriteReport()
    irkit.optimize(model, report=report)
    assert fired(report) == {}
    assert "Attention" not in util.ops(model) and util.ops(model)["Softmax"] == 1
    got = ort_session(model).run(None, {"q": q.numpy(), "k": k.numpy(), "v": v.numpy()})[0]
    assert got.shape == (3, 4, 2, 8)
    np.testing.assert_allclose(got, SharedQuery()(q, k, v).numpy(), atol=1e-5)


def test_scale_not_constant():
    text = attention_text(form="eager", mask="none", cache=False, hkv=4)
    text = text.replace("g (", "g (float[1] sc, ").replace(
        "  sc = Constant<value=float {0.35355339059327373}>()", ""
    )
    failures = _reason(build(text), "Attention")
    assert "the attention scale is not a scalar constant" in failures


def _capped_text(**kw) -> str:
    return attention_text(form="eager", mask="float", cache=False, hkv=4, softcap=1.5, **kw)


def test_softcap_multiplied_by_another_constant_is_not_matched():
    text = _capped_text().replace(
        "ac = Mul(at, cap)", "cap2 = Constant<value=float {2.0}>()  ac = Mul(at, cap2)"
    )
    failures = _reason(build(text), "Attention")
    assert "the scores are divided by 1.5 but multiplied by 2.0: not a softcap" in failures


def test_softcap_not_constant():
    text = _capped_text().replace("g (", "g (float[1] cap, ")
    text = text.replace("cap = Constant<value=float {1.5}>()  ", "")
    failures = _reason(build(text), "Attention")
    assert "the softcap is not a scalar constant" in failures


def test_negative_softcap_is_not_matched():
    failures = _reason(build(_capped_text().replace("{1.5}", "{-1.5}")), "Attention")
    assert "softcap -1.5 is not positive" in failures


def test_inconsistent_repeat_is_not_gqa():
    m = build(attention_text(cache=False, mask="none"))
    for node in m.graph:  # claim V's expand repeats 3 times: the dims no longer describe repeat_kv
        if node.op_type == "Expand" and node.inputs[0].name == "vu":
            node.outputs[0].shape = ir.Shape([2, 2, 3, 3, 8])
    failures = _reason(m, "AttentionGQA")
    assert "dims (2, 2, 3, 8) → (2, 4, 3, 8) are not a head repeat by 3" in failures


# --- the real thing: transformers decoders exported with their KV cache ------------------------


def _histogram(model: ir.Model, fn: ir.Function) -> dict[str, int]:
    """Ops of ``fn`` including every function it calls (recursively), calls themselves excluded."""
    counts: dict[str, int] = {}
    for node in fn:
        callee = model.functions.get((node.domain, node.op_type, node.overload))
        items = _histogram(model, callee).items() if callee is not None else [(node.op_type, 1)]
        for op_type, n in items:
            counts[op_type] = counts.get(op_type, 0) + n
    return counts


#: Extra config per architecture: gemma2's window (sliding layers alternate with full ones) is
#: shorter than the longest past fed below, so the sliding layers' mask cuts keys off.
_EXTRA_CONFIG: dict[str, dict[str, object]] = {"Gemma2": {"sliding_window": 4}}


def _decoder(arch: str, impl: str):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = getattr(transformers, f"{arch}Config")(
        **_EXTRA_CONFIG.get(arch, {}),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=128,
        max_position_embeddings=256,
        attn_implementation=impl,
    )
    return getattr(transformers, f"{arch}ForCausalLM")(cfg).eval()


@pytest.mark.parametrize(
    ("arch", "impl"),
    [
        pytest.param("Llama", "sdpa", id="llama-sdpa", marks=pytest.mark.slow),
        pytest.param("Llama", "eager", id="llama-eager", marks=pytest.mark.slow),
        pytest.param("Qwen2", "sdpa", id="qwen2-sdpa", marks=pytest.mark.slow),
        # softcapped attention (Attention's softcap); the final logit softcap is outside the layer
        pytest.param("Gemma2", "eager", id="gemma2-eager", marks=pytest.mark.slow),
    ],
)
def test_decoder_with_kv_cache(arch, impl):
    import irkit
    from irkit.llm import causal_lm_feeds, export_causal_lm, run_eager
    from tests.helpers import FP32_ATOL, assert_close, ort_session

    lm = _decoder(arch, impl)
    exported = export_causal_lm(lm)
    model = irkit.lower(exported.program, **exported.lower_kwargs())
    report = irkit.RewriteReport()
    irkit.optimize(model, report=report)
    assert report.fired["Attention"] == report.fired["AttentionKVCache"] == 1  # once per function
    assert report.fired["AttentionGQA"] == 1 and report.fired["RotaryEmbedding"] == 2
    layers = [f for f in model.functions.values() if f.name == f"{arch}DecoderLayer"]
    assert len(layers) == 1  # still one decoder-layer function...
    (layer,) = layers
    calls = [
        n
        for fn in (model.graph, *model.functions.values())
        for n in fn
        if (n.domain, n.op_type) == (layer.domain, layer.name)
    ]
    assert len(calls) == 2  # ...called once per layer
    ops = _histogram(model, layer)
    assert ops["Attention"] == 1 and ops["RotaryEmbedding"] == 2
    assert not {"Softmax", "IsNaN", "Expand", "Neg", "Tanh"} & set(ops)
    assert ops.get("MatMul", 0) == 7  # q, k, v, o projections and the MLP: no attention MatMul
    (att,) = [n for f in model.functions.values() for n in f if n.op_type == "Attention"]
    cap = getattr(lm.config, "attn_logit_softcapping", None)
    assert att.attributes.get_float("softcap", 0.0) == pytest.approx(cap or 0.0)
    if arch == "Gemma2":  # the whole layer: 4 norms, the attention, the gated-GELU MLP
        assert ops == {
            "Add": 6,  # 4 norms' 1 + w, 2 residuals
            "Attention": 1,
            "Constant": 8,  # (7, and the mask's floor)
            "Max": 1,  # the mask's floor: eager attention's finfo.min rows (irkit.rules.attention)
            "Gelu": 1,
            "MatMul": 7,
            "Mul": 1,
            "RMSNormalization": 4,
            "RotaryEmbedding": 2,
            "Slice": 2,
            "Transpose": 7,
        }
    session = ort_session(model)
    for batch, seq, past in [(2, 4, 0), (1, 1, 6), (2, 3, 9)]:
        feeds = causal_lm_feeds(lm, batch=batch, seq=seq, past=past, seed=past)
        assert_close(session.run(None, feeds), run_eager(lm, feeds), atol=FP32_ATOL)


@pytest.mark.parametrize(
    ("causal", "gqa", "dynamic", "expect"),
    [
        (True, False, False, {"Attention": 1, "AttentionCausal": 1}),
        (True, False, True, {"Attention": 1, "AttentionCausal": 1}),
        (False, True, False, {"Attention": 1, "AttentionGQA": 1}),
        (True, True, False, {"Attention": 1, "AttentionCausal": 1, "AttentionGQA": 1}),
        # torchlib's own enable_gqa repeat on dynamic shapes has no static repeat factor: the
        # Attention takes the repeated K/V (still one op), the causal mask still folds.
        (True, True, True, {"Attention": 1, "AttentionCausal": 1}),
    ],
)
def test_torch_sdpa_lowered_by_torchlib(causal, gqa, dynamic, expect):
    torch = pytest.importorskip("torch")
    import irkit
    from tests.helpers import ort_session

    class Sdpa(torch.nn.Module):
        def forward(self, q, k, v):
            return torch.nn.functional.scaled_dot_product_attention(
                q, k, v, is_causal=causal, enable_gqa=gqa
            )

    def inputs(b, s):
        g = torch.Generator().manual_seed(b * 10 + s)
        kv = 2 if gqa else 4
        return [torch.randn(n, h, s, 8, generator=g) for n, h in ((b, 4), (b, kv), (b, kv))]

    dims = None
    if dynamic:
        dims = ({0: torch.export.Dim("batch"), 2: torch.export.Dim("seq")},) * 3
    model = irkit.lower(torch.export.export(Sdpa(), tuple(inputs(2, 5)), dynamic_shapes=dims))
    report = irkit.RewriteReport()
    irkit.optimize(model, report=report)
    assert fired(report) == expect
    assert util.ops(model).get("Attention") == 1 and "Softmax" not in util.ops(model)
    (att,) = [n for n in model.graph if n.op_type == "Attention"]
    assert att.attributes.get_int("is_causal", 0) == int(causal)
    session = ort_session(model)
    for b, s in [(2, 5), (3, 4)] if dynamic else [(2, 5)]:
        q, k, v = inputs(b, s)
        got = session.run(None, {"q": q.numpy(), "k": k.numpy(), "v": v.numpy()})[0]
        np.testing.assert_allclose(got, Sdpa()(q, k, v).numpy(), atol=1e-5)


def test_attention_without_mask_is_not_causal():
    m = build(attention_text(form="eager", mask="none", cache=False, hkv=4))
    report = util.rewrite(m, library.default_rules(), explain="AttentionCausal")
    assert report.rules["AttentionCausal"].failures == {"the Attention has no mask": 1}


def test_mask_from_a_graph_input_is_not_causal():
    m = build(attention_text(form="sdpa", mask="float", cache=False, hkv=4))
    report = util.rewrite(m, library.default_rules(), explain="AttentionCausal")
    assert report.rules["AttentionCausal"].failures == {
        "the mask is neither torchlib's causal mask nor a constant": 1
    }


def _causal_text(lowest: float = LOWEST["float"], key: str = "k") -> str:
    """An Attention with torchlib's ``is_causal`` mask built on ``Shape(q)``/``Shape(key)``."""
    return (
        '<ir_version: 10, opset_import: ["" : 23]>\n'
        "g (float[1,2,3,4] q, float[1,2,5,4] k, float[1,2,5,4] v, float[1,2,7,4] w)"
        " => (float[1,2,3,4] y) {\n"
        "  m2 = Constant<value=int64[1] {-2}>()  m1 = Constant<value=int64[1] {-1}>()"
        f"  sq = Shape(q)  lq = Slice(sq, m2, m1)  sk = Shape({key})  lk = Slice(sk, m2, m1)"
        "  size = Concat<axis=0>(lq, lk)  one = Constant<value=float {1.0}>()"
        "  ones = Expand(one, size)  tri = Trilu<upper=0>(ones)"
        "  zero = Constant<value=float {0.0}>()  eq = Equal(tri, zero)"
        f"  lo = Constant<value=float {{{lowest}}}>()  mask = Where(eq, lo, zero)"
        "  y = Attention(q, k, v, mask)\n}"
    )


def test_torchlib_causal_mask_becomes_is_causal():
    m = util.model(_causal_text())
    before = util.clone(m)
    report = util.rewrite(m, library.default_rules())
    assert fired(report) == {"AttentionCausal": 1}
    assert util.ops(m) == {"Attention": 1}
    assert m.graph.node(0).attributes["is_causal"].value == 1
    util.assert_same_numbers(before, m, atol=1e-5)


@pytest.mark.parametrize(
    ("lowest", "key", "reason"),
    [
        (-1.0, "k", "the mask's fill value is not the dtype's lowest"),
        (
            LOWEST["float"],
            "w",
            "the mask's key length is not k's (nor the key's before its head repeat)",
        ),
    ],
)
def test_causal_mask_of_another_fill_or_key_is_not_causal(lowest, key, reason):
    m = util.model(_causal_text(lowest, key))
    report = util.rewrite(m, library.default_rules(), explain="AttentionCausal")
    assert report.rules["AttentionCausal"].fired == 0
    assert report.rules["AttentionCausal"].failures == {reason: 1}


# --- the mask as onnxruntime runs it (issue 32) --------------------------------------------------

# Each layout the encoders of issue 32 pass: onnxruntime's Attention wants the mask's last two
# dims to be S and L exactly (layoutlm/markuplm/big_bird: BERT's (B, 1, 1, L); lxmert: the same
# in cross attention, L ≠ S), so a broadcast axis is expanded; every other layout passes as is.
LAYOUTS = {
    "extended-b11l": ((2, 1, 1, 5), {"Expand": 1}),
    "batch-1-1s-l": ((1, 1, 3, 5), {}),
    "per-head": ((2, 4, 3, 5), {}),
    "2d-sl": ((3, 5), {}),
    "2d-1l": ((1, 5), {"Expand": 1}),
    "1d-l": ((5,), {"Expand": 1}),
    "per-query-b1s1": ((2, 1, 3, 1), {"Expand": 1}),
}


@pytest.mark.parametrize("form", ["sdpa", "eager"])
@pytest.mark.parametrize("cross", [False, True], ids=["self", "cross"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_mask_layouts_run_in_onnxruntime(layout, cross, form):
    shape, added = LAYOUTS[layout]
    kv_len = 5 if cross else 3
    if not cross:  # the keys are the queries' 3
        shape = tuple(3 if x == 5 else x for x in shape)
    m = build(attention_text(hkv=4, cache=False, form=form, kv_len=kv_len, mask_shape=shape))
    report = run(m)  # onnxruntime runs it, with the unfused graph's numbers
    assert fired(report) == {"Attention": 1}
    ops = util.ops(m)
    assert ops["Attention"] == 1 and ops.get("Expand", 0) == added.get("Expand", 0)
    (att,) = [n for n in m.graph if n.op_type == "Attention"]
    mask = att.inputs[3]
    assert mask.shape is not None and list(mask.shape)[-2:] == [3, kv_len]


def test_mask_whose_batch_exceeds_the_queries_is_declined():
    # q has batch 1, the mask batch 2: the scores broadcast up to the mask, the op cannot
    text = attention_text(b=1, hkv=4, cache=False, form="eager", mask_shape=(2, 1, 3, 3))
    report = util.rewrite(build(text), library.default_rules(), explain="Attention")
    (miss,) = [n for n in report.near_misses if "batch dim 2" in n.reason]
    assert miss.reason.startswith("the mask's batch dim 2 is neither 1 nor the scores' 1")


def _lowest_rows(dtype: str = "float") -> np.ndarray:
    """A (2, 1, 3, 3) mask whose query 0 of batch 1 sees no key (the dtype's lowest
    everywhere: a padded patch, a left-padded token), the rest random keep/drop."""
    mask = np.where(np.random.default_rng(0).random((2, 1, 3, 3)) < 0.3, LOWEST[dtype], 0.0)
    mask[..., 0] = 0.0
    mask[1, 0, 0, :] = LOWEST[dtype]
    return mask.astype(np.float32)


@pytest.mark.parametrize("form", ["sdpa", "eager"])
def test_rows_masked_with_the_lowest_value_average_as_in_the_graph(form):
    # onnxruntime's CPU Attention gives 0 for a row masked with finfo.min at every key; the
    # graph averages the values there (lowest + score = lowest): timesfm's padded patches.
    # The fused mask is raised one step above the lowest value, which masks the same keys.
    from tests.helpers import run_ort

    m = build(attention_text(hkv=4, cache=False, form=form))
    before = util.clone(m)
    util.rewrite(m, library.default_rules())
    assert util.ops(m)["Attention"] == 1
    feeds = util.random_inputs(before, 0)
    feeds[-1] = _lowest_rows()
    expected, actual = run_ort(before, feeds), run_ort(m, feeds)
    assert np.abs(expected[0][1, :, 0]).max() > 0.1  # the empty row: an average, not 0
    np.testing.assert_allclose(actual[0], expected[0], atol=1e-5, rtol=1e-4)
    (floor,) = [n for n in m.graph if n.op_type in ("Max", "Where") and n.outputs[0].uses()
                and n.outputs[0].uses()[0].node.op_type == "Attention"]  # fmt: skip
    # sdpa (torchlib's NaN guard, a mask that may hold -inf: its empty rows are 0, as in
    # onnxruntime): only the lowest entries are raised; eager: Max(mask, floor)
    assert floor.op_type == ("Where" if form == "sdpa" else "Max")


def test_a_boolean_mask_needs_no_floor_when_its_fill_is_not_the_lowest():
    # torchlib's Where(mask, 0, fill) with another fill: nothing to raise
    text = attention_text(hkv=4, cache=False, mask="bool").replace(
        f"lo = Constant<value=float {{{LOWEST['float']}}}>()", "lo = Constant<value=float {-1e9}>()"
    )
    m = build(text)
    run(m)
    assert not {"Max", "Equal"} & set(util.ops(m))
