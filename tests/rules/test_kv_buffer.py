""":mod:`irkit.rules.kv_buffer`: a concatenating KV cache → one shared buffer (opset 24).

Hand-written graphs hold one cached attention the way irkit lowers a causal LM: the fused
``Attention(q, k, v, mask, past_key, past_value)`` (rule ``AttentionSharedBuffer``) and the
unfused ``Concat(past, new)`` of a decomposed attention (scattered outside). The mask comes from
``attention_mask`` (right-padded rows, as onnxruntime-genai pads them) and the graph reads its
past length from ``Shape(past_key)``. The rewritten graph runs in onnxruntime on a buffer of
capacity 8 holding the past in its first positions and garbage after them: the attention equals
a numpy reference, the buffer gets the new keys and values right after the past, the rest of the
buffer is untouched, and the graph's past length is the mask's, not the capacity.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import onnxruntime as ort
import pytest

from irkit.errors import LoweringOptionsError
from irkit.rules.kv_buffer import SHARED_BUFFER_OPSET, alibi_by_position, share_kv_buffer
from tests.rewriting import util

B, H, S, P, D, CAPACITY = 2, 2, 3, 4, 8, 8
T = P + S

_HEAD = '<ir_version: 10, opset_import: ["" : 23]>'
_INPUTS = (
    f"(int64[{B},{S}] input_ids, int64[{B},{T}] attention_mask, float[{B},{H},{S},{D}] q, "
    f"float[{B},{H},{S},{D}] k, float[{B},{H},{S},{D}] v, "
    f"float[{B},{H},past,{D}] pk, float[{B},{H},past,{D}] pv)"
)
_OUTPUTS = (
    f"(float[{B},{H},{S},{D}] y, float[{B},{H},total,{D}] prk, "
    f"float[{B},{H},total,{D}] prv, int64[1] past_length)"
)
_MASK = f"""
    axes = Constant<value_ints=[1, 2]>()
    m4 = Unsqueeze(attention_mask, axes)
    full = Constant<value_ints=[{B}, 1, {S}, {T}]>()
    m4s = Expand(m4, full)
    keep = Cast<to=9>(m4s)
    zero = Constant<value=float {{0.0}}>()
    low = Constant<value=float {{-1e9}}>()
    mask = Where(keep, zero, low)
    past_length = Shape<start=2, end=3>(pk)
"""
FUSED = f"""{_HEAD}
g {_INPUTS} => {_OUTPUTS} {{
    {_MASK}
    y, prk, prv = Attention<scale=0.5>(q, k, v, mask,
        pk, pv)
}}"""
CAP = 0.7
#: gemma2's softcapped attention as irkit.rules.attention fuses it (the cap comes before the mask).
FUSED_SOFTCAP = FUSED.replace("Attention<scale=0.5>", f"Attention<scale=0.5, softcap={CAP}>")
UNFUSED = f"""{_HEAD}
g {_INPUTS} => {_OUTPUTS} {{
    {_MASK}
    prk = Concat<axis=2>(pk, k)
    prv = Concat<axis=2>(pv, v)
    kt = Transpose<perm=[0, 1, 3, 2]>(prk)
    raw = MatMul(q, kt)
    half = Constant<value=float {{0.5}}>()
    scores = Mul(raw, half)
    masked = Add(scores, mask)
    probs = Softmax<axis=-1>(masked)
    y = MatMul(probs, prv)
}}"""


NAMES = {
    "pk": "past_key_values.0.key",
    "pv": "past_key_values.0.value",
    "prk": "present.0.key",
    "prv": "present.0.value",
}


def _model(text: str) -> ir.Model:
    """The model of ``text`` with the cache named as irkit.llm names it (dots: not in ONNX text)."""
    model = util.model(text)
    for value in [*model.graph.inputs, *model.graph.outputs]:
        value.name = NAMES.get(str(value.name), value.name)
    return model


def _feeds(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    mask = np.ones((B, T), np.int64)
    mask[1, 2:P] = 0  # row 1: a right-padded prompt of 2 tokens, then its pads
    return {
        "input_ids": np.zeros((B, S), np.int64),
        "attention_mask": mask,
        **{n: rng.standard_normal((B, H, S, D)).astype(np.float32) for n in ("q", "k", "v")},
        "past_key_values.0.key": rng.standard_normal((B, H, P, D)).astype(np.float32),
        "past_key_values.0.value": rng.standard_normal((B, H, P, D)).astype(np.float32),
    }


def _reference(feeds: dict[str, np.ndarray], softcap: float | None = None) -> np.ndarray:
    keys = np.concatenate([feeds["past_key_values.0.key"], feeds["k"]], axis=2)
    values = np.concatenate([feeds["past_key_values.0.value"], feeds["v"]], axis=2)
    scores = feeds["q"] @ keys.transpose(0, 1, 3, 2) * 0.5
    if softcap is not None:
        scores = np.tanh(scores / softcap) * softcap
    scores = scores + np.where(feeds["attention_mask"][:, None, None, :] > 0, 0.0, -1e9)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    return (probs / probs.sum(-1, keepdims=True)) @ values  # type: ignore[no-any-return]


def _run(model: ir.Model, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    proto = ir.serde.serialize_model(model)
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(None, feeds), strict=True))


def _buffer(past: np.ndarray) -> np.ndarray:
    """A buffer of CAPACITY positions: the past first, then garbage."""
    buffer = np.full((B, H, CAPACITY, D), 1e4, np.float32)
    buffer[:, :, :P] = past
    return buffer


@pytest.mark.parametrize(
    "text", [FUSED, FUSED_SOFTCAP, UNFUSED], ids=["fused", "fused-softcap", "unfused"]
)
def test_shared_buffer_matches_numpy(text):
    model = _model(text)
    feeds = _feeds()
    cap = CAP if text is FUSED_SOFTCAP else None
    before = _run(model, feeds)
    np.testing.assert_allclose(before["y"], _reference(feeds, cap), rtol=1e-5, atol=1e-5)
    share_kv_buffer(model)
    assert model.opset_imports[""] == SHARED_BUFFER_OPSET
    assert util.ops(model).get("TensorScatter") == 2
    assert "Concat" not in util.ops(model) or text is UNFUSED
    shared = dict(feeds)
    for name in ("past_key_values.0.key", "past_key_values.0.value"):
        shared[name] = _buffer(feeds[name])
    after = _run(model, shared)
    np.testing.assert_allclose(after["y"], _reference(feeds, cap), rtol=1e-5, atol=1e-5)
    assert after["past_length"].tolist() == [P]  # the mask's past, not the capacity
    for kind, new in (("key", "k"), ("value", "v")):
        buffer = after[f"present.0.{kind}"]
        assert buffer.shape == (B, H, CAPACITY, D)
        assert model.graph.outputs[1 if kind == "key" else 2].shape == ir.Shape([B, H, "past", D])
        np.testing.assert_array_equal(buffer[:, :, :T], before[f"present.0.{kind}"])
        np.testing.assert_array_equal(buffer[:, :, P:T], feeds[new])
        assert (buffer[:, :, T:] == 1e4).all()  # beyond the total: untouched


@pytest.mark.parametrize("text", [FUSED, FUSED_SOFTCAP], ids=["plain", "softcap"])
def test_fused_rule_fires_in_place_of_the_cached_attention(text):
    model = _model(text)
    share_kv_buffer(model)
    attention = [n for n in model.graph if n.op_type == "Attention"]
    assert len(attention) == 1
    assert len(attention[0].inputs) == 4 and len(attention[0].outputs) == 1  # no past, no present
    expect = {"scale": 0.5} if text is FUSED else {"scale": 0.5, "softcap": CAP}
    assert {a.name: a.value for a in attention[0].attributes.values()} == pytest.approx(expect)
    ops = dict(util.ops(model))
    del ops["Constant"]
    assert ops == {  # exact: T, T - S and the write index once (Shape ×3, Sub, Expand)
        "Unsqueeze": 1,
        "Expand": 2,  # the mask's, the write index
        "Cast": 1,
        "Where": 1,
        "Shape": 3,  # attention_mask's length; input_ids' length and batch
        "Sub": 1,
        "Identity": 1,  # the graph's past_length output, now T - S
        "TensorScatter": 2,
        "Slice": 2,
        "Attention": 1,
    }
    assert [n.op_type for n in model.graph if n.op_type in ("TensorScatter", "Slice")] == [
        "TensorScatter",
        "TensorScatter",
        "Slice",
        "Slice",
    ]


SLOPES = (0.5, 0.25)
M = 16  # the ALiBi table's columns (mpt: max_seq_len)
_TABLE = ", ".join(str(s * (c + 1 - M)) for s in SLOPES for c in range(M))
#: mpt's ALiBi: slope_h · (c + 1 - M) for the table's columns c, the last T sliced as the keys'.
ALIBI = UNFUSED.replace(
    "    masked = Add(scores, mask)",
    f"""    table = Constant<value=float[{H},1,{M}] {{{_TABLE}}}>()
    total = Shape<start=1, end=2>(attention_mask)
    first = Neg(total)
    end = Constant<value_ints=[{M}]>()
    key_axis = Constant<value_ints=[2]>()
    bias = Slice(table, first, end, key_axis)
    biased = Add(scores, bias)
    masked = Add(biased, mask)""",
)


def _alibi_reference(feeds: dict[str, np.ndarray], by_position: bool) -> np.ndarray:
    """ALiBi attention in numpy, the distance counted by buffer slot or by token position."""
    keys = np.concatenate([feeds["past_key_values.0.key"], feeds["k"]], axis=2)
    values = np.concatenate([feeds["past_key_values.0.value"], feeds["v"]], axis=2)
    mask = feeds["attention_mask"]
    slot = np.broadcast_to(np.arange(T) + 1 - T, mask.shape)
    where = np.cumsum(mask, -1) - mask.sum(-1, keepdims=True) if by_position else slot
    bias = np.asarray(SLOPES)[None, :, None, None] * where[:, None, None, :]
    scores = feeds["q"] @ keys.transpose(0, 1, 3, 2) * 0.5 + bias
    scores = scores + np.where(mask[:, None, None, :] > 0, 0.0, -1e9)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    return (probs / probs.sum(-1, keepdims=True)) @ values  # type: ignore[no-any-return]


def _alibi_model(text: str) -> ir.Model:
    """The model of ``text``, its scores and bias typed (as lowering types them)."""
    model = _model(text)
    shapes = {"scores": [B, H, S, "total"], "bias": [H, 1, "total"]}
    for node in model.graph:
        if node.outputs and node.outputs[0].name in shapes:
            node.outputs[0].shape = ir.Shape(shapes[str(node.outputs[0].name)])
            node.outputs[0].type = ir.TensorType(ir.DataType.FLOAT)
    return model


def test_alibi_counts_token_positions_not_buffer_slots():
    """Row 1 is a right-padded prompt (2 tokens, 2 pads) and 3 new tokens: by slot its new
    tokens sit 2 further from the prompt than they are; the shared buffer's bias counts
    positions (as transformers does on the left-padded batch), row 0 (no pads) unchanged."""
    model = _alibi_model(ALIBI)
    feeds = _feeds()
    before = _run(model, feeds)["y"]
    np.testing.assert_allclose(before, _alibi_reference(feeds, False), rtol=1e-5, atol=1e-5)
    share_kv_buffer(model)
    assert "Slice" not in [
        n.op_type
        for n in model.graph
        if n.inputs and n.inputs[0] is not None and n.inputs[0].name == "table"
    ]
    shared = dict(feeds)
    for name in ("past_key_values.0.key", "past_key_values.0.value"):
        shared[name] = _buffer(feeds[name])
    after = _run(model, shared)["y"]
    np.testing.assert_allclose(after, _alibi_reference(feeds, True), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(after[0], before[0], rtol=1e-5, atol=1e-5)
    assert np.abs(after[1] - before[1]).max() > 1e-2  # the padded row: other numbers


def test_alibi_by_position_on_the_concatenated_cache():
    """The concatenated cache (no shared buffer) keeps the pads' slots too: the same rewrite."""
    model = alibi_by_position(_alibi_model(ALIBI))
    assert model.opset_imports[""] == 23 and "TensorScatter" not in util.ops(model)
    feeds = _feeds()
    np.testing.assert_allclose(
        _run(model, feeds)["y"], _alibi_reference(feeds, True), rtol=1e-5, atol=1e-5
    )


def test_alibi_bias_used_elsewhere_is_kept():
    """A bias that also leaves the graph is not only added to the scores: kept by slot."""
    text = ALIBI.replace("int64[1] past_length)", "int64[1] past_length, float[2,1,7] bias)")
    model = _alibi_model(text)
    share_kv_buffer(model)
    assert "CumSum" not in util.ops(model)


def test_no_cache_is_refused():
    text = f"""{_HEAD}
    g (float[2] x) => (float[2] y) {{ y = Relu(x) }}"""
    with pytest.raises(LoweringOptionsError, match="no past_key_values"):
        share_kv_buffer(_model(text))


def test_no_attention_mask_is_refused():
    text = FUSED.replace("int64[2,7] attention_mask", "int64[2,7] am").replace(
        "Unsqueeze(attention_mask", "Unsqueeze(am"
    )
    with pytest.raises(LoweringOptionsError, match="no 'attention_mask' input"):
        share_kv_buffer(_model(text))


@pytest.mark.slow
def test_gemma2_scatters_inside_its_layer():
    # gemma2's softcapped attention is fused (irkit.rules.attention): its cache is scattered in
    # the attention function like every other decoder's, not outside in the main graph.
    import irkit
    from irkit.llm import export_causal_lm
    from tests.llm_zoo import BY_NAME

    lm = BY_NAME["gemma2"].model()
    exported = export_causal_lm(lm)
    model = irkit.optimize(irkit.lower(exported.program, **exported.lower_kwargs()))
    share_kv_buffer(model)
    assert "TensorScatter" not in util.ops(model)  # the main graph
    (attention,) = [f for f in model.functions.values() if f.name == "Gemma2Attention"]
    ops = {n.op_type: 0 for n in attention}
    for node in attention:
        ops[node.op_type] += 1
    del ops["Constant"]
    # exact: the layer's T and write index come from the main graph (two inputs), not from
    # Shape/Sub/Expand in every layer; only the head split around the 4-D buffer is left
    assert ops == {
        "Linear": 2,
        "Linear_1": 2,
        "RotaryEmbedding": 2,
        "Reshape": 4,
        "Transpose": 4,
        "TensorScatter": 2,
        "Slice": 4,  # two views of the buffer, and the rotary cos/sin
        "Attention": 1,
        "Max": 1,  # the mask's floor (eager attention: irkit.rules.attention)
    }
    names = [str(v.name) for v in attention.inputs]
    assert names[-2:] == ["kv_buffer.total", "kv_buffer.write_indices"]
    assert util.ops(model)["Expand"] == 1  # the write index, once, in the main graph
    (node,) = [n for n in attention if n.op_type == "Attention"]
    assert node.attributes.get_float("softcap") == lm.config.attn_logit_softcapping
