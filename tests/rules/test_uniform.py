"""Rule family :mod:`irkit.rules.uniform`: reads of a broadcast axis, writes of what is there.

Hand-written graphs for each rule (fires: exact ops after, onnxruntime numbers unchanged; does
not fire: the reason), then transformers' Qwen3.5 rotary embedding (interleaved M-RoPE) lowered
by irkit: with text positions its seventy ``select_scatter``/``slice_scatter`` nodes go, with
three different position rows (real M-RoPE) they stay and the numbers still match torch.
"""

from __future__ import annotations

import numpy as np
import pytest

from irkit.rules import uniform
from tests.rewriting import util
from tests.rules.support import fire, no_fire
from tests.rules.support import parse as _parse


def parse(body: str):
    """The graph at opset 18, with the shapes ONNX shape inference gives its values."""
    return util.infer_shapes(_parse(body))


#: Positions (b, s) expanded to 3 identical rows, their angles: uniform along axis 0.
_ANGLES = (
    "  zero = Constant<value=int64[1] {0}>()  three = Constant<value=int64[1] {3}>()\n"
    "  last = Constant<value=int64[1] {-1}>()\n"
    "  p0 = Unsqueeze(pos, zero)  sh = Shape(pos)  full = Concat<axis=0>(three, sh)\n"
    "  p3 = Expand(p0, full)  p4 = Unsqueeze(p3, last)  pf = Cast<to=1>(p4)\n"
    "  inv = Constant<value=float[8] {1, 0.5, 0.25, 0.125, 0.0625, 0.03, 0.01, 0.001}>()\n"
    "  ang = Mul(pf, inv)  a = Sin(ang)\n"
)


def test_gather_of_a_broadcast_axis_reads_row_0():
    m = parse(
        "g (int64[b, s] pos) => (float[b, s, 8] y) {\n"
        + _ANGLES
        + "  two = Constant<value=int64 {2}>()  y = Gather<axis=0>(a, two)\n}"
    )
    fire(
        m,
        "UniformGather",
        {
            "Cast": 1,
            "Constant": 5,
            "Expand": 1,
            "Gather": 1,
            "Mul": 1,
            "Sin": 1,
            "Unsqueeze": 2,
        },
    )
    (gather,) = [n for n in m.graph if n.op_type == "Gather"]
    assert gather.inputs[1].const_value.numpy().tolist() == 0


def test_gather_of_an_axis_that_varies_keeps_its_index():
    m = parse(
        "g (float[3, 4] a) => (float[4] y) {\n"
        "  two = Constant<value=int64 {2}>()  y = Gather<axis=0>(a, two)\n}"
    )
    no_fire(m, "UniformGather", "not proved uniform along axis 0")


#: torchlib's ``slice_scatter(row0, row1[..., 1:8:3], dim=-1, 1, 8, 3)`` then
#: ``select_scatter(a, that, dim=0, 0)``: rebuild row 0 from row 1's interleaved columns.
_RECOMPOSED = (
    "  i0 = Constant<value=int64 {0}>()  i1 = Constant<value=int64 {1}>()\n"
    "  s1 = Constant<value=int64[1] {1}>()  e8 = Constant<value=int64[1] {8}>()\n"
    "  ax = Constant<value=int64[1] {2}>()  st = Constant<value=int64[1] {3}>()\n"
    "  two = Constant<value=int64 {2}>()  one = Constant<value=int64 {1}>()\n"
    "  row1 = Gather<axis=0>(a, i1)  picked = Slice(row1, s1, e8, ax, st)\n"
    "  row0 = Gather<axis=0>(a, i0)  rsh = Shape(row0)  n = Gather<axis=0>(rsh, two)\n"
    "  rng = Range(i0, n, one)  pos_ = Slice(rng, s1, e8, zero, st)  idx = Unsqueeze(pos_, s1)\n"
    "  tu = Transpose<perm=[2, 1, 0]>(picked)  td = Transpose<perm=[2, 1, 0]>(row0)\n"
    "  sc = ScatterND(td, idx, tu)  scattered = Transpose<perm=[2, 1, 0]>(sc)\n"
    "  up = Unsqueeze(scattered, zero)  ush = Shape(up)  ix = Expand(i0, ush)\n"
    "  rebuilt = ScatterElements<axis=0>(a, ix, up)\n"
)


def test_select_scatter_of_slice_scatter_of_the_same_rows_is_the_input():
    m = parse(
        "g (int64[b, s] pos) => (float[b, s, 8] y) {\n"
        + _ANGLES
        + _RECOMPOSED
        + "  y = Gather<axis=0>(rebuilt, i0)\n}"
    )
    report = fire(
        m,
        "WrittenBackScatterElements",
        {
            "Cast": 1,
            "Constant": 5,
            "Expand": 1,
            "Gather": 1,
            "Mul": 1,
            "Sin": 1,
            "Unsqueeze": 2,
        },
    )
    # the outer write is proved first (consumers first), through the inner one
    assert report.fired["WrittenBackScatterElements"] == 1
    assert "WrittenBackScatterND" not in report.fired


def test_slice_scatter_of_its_own_slice_is_the_input():
    m = parse(
        "g (float[4, 5, 8] row0) => (float[4, 5, 8] y) {\n"
        "  zero = Constant<value=int64[1] {0}>()\n"
        + _RECOMPOSED.split("\n  up =")[0]
        .replace("row1 = Gather<axis=0>(a, i1)  ", "")
        .replace("picked = Slice(row1,", "picked = Slice(row0,")
        .replace("  row0 = Gather<axis=0>(a, i0)  ", "  ")
        + "\n  y = Identity(scattered)\n}"
    )
    fire(m, "WrittenBackScatterND", {"Constant": 1, "Transpose": 1})  # (x → y: one node stays)


def test_rows_that_differ_are_written():
    m = parse(
        "g (float[3, 2, 5, 8] a) => (float[3, 2, 5, 8] y) {\n"
        "  zero = Constant<value=int64[1] {0}>()\n" + _RECOMPOSED + "  y = Identity(rebuilt)\n}"
    )
    report = no_fire(
        m, "WrittenBackScatterElements", "updates are not one row Unsqueeze(Gather(x, c))"
    )
    assert report.rules["WrittenBackScatterND"].failures == {
        "updates are sliced from another value than data": 1
    }


def test_a_scatter_that_adds_is_not_a_write_back():
    m = parse(
        "g (float[3, 4] a) => (float[3, 4] y) {\n"
        "  i0 = Constant<value=int64 {0}>()  zero = Constant<value=int64[1] {0}>()\n"
        "  row = Gather<axis=0>(a, i0)  up = Unsqueeze(row, zero)\n"
        "  ix = Constant<value=int64[1, 4] {0, 0, 0, 0}>()\n"
        '  y = ScatterElements<axis=0, reduction="add">(a, ix, up)\n}'
    )
    no_fire(m, "WrittenBackScatterElements", "reduction 'add'")


@pytest.fixture(scope="module")
def rotary():
    torch = pytest.importorskip("torch")
    # Qwen3.5 is newer than transformers' floor (4.54 has none)
    modeling = pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5")

    config = modeling.Qwen3_5TextConfig(
        hidden_size=64,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        num_hidden_layers=1,
        vocab_size=16,
    )
    config.rope_parameters["mrope_section"] = [3, 3, 2]
    config.rope_parameters["partial_rotary_factor"] = 0.5
    return modeling.Qwen3_5TextRotaryEmbedding(config), torch


@pytest.mark.parametrize("rows", [2, 3], ids=["text", "mrope"])
def test_qwen35_text_positions_need_no_scatters(rotary, rows):
    import irkit
    from tests.helpers import run_ort

    module, torch = rotary
    batch = torch.export.Dim("batch")
    seq = torch.export.Dim("seq")
    x = torch.zeros(2, 5, 64)
    pos = torch.arange(10).reshape(2, 5) if rows == 2 else torch.randint(0, 9, (3, 2, 5))
    dynamic = {0: batch, 1: seq} if rows == 2 else {1: batch, 2: seq}
    ep = torch.export.export(module, (x, pos), dynamic_shapes=({0: batch, 1: seq}, dynamic))
    m = irkit.lower(ep, functions=False)
    report = util.optimize(m)
    scatters = {k: v for k, v in util.ops(m).items() if k.startswith("Scatter")}
    if rows == 2:
        assert report.fired["WrittenBackScatterElements"] == 4
        assert scatters == {}
    else:
        assert "WrittenBackScatterElements" not in report.fired
        assert scatters == {"ScatterElements": 4, "ScatterND": 4}
    inputs = {"x": np.zeros((3, 4, 64), np.float32)}
    inputs["position_ids"] = (
        np.arange(12).reshape(3, 4)
        if rows == 2
        else np.random.default_rng(0).integers(0, 9, (3, 3, 4))
    )
    names = [v.name for v in m.graph.inputs]
    got = run_ort(m, [inputs[n] for n in names])
    want = module(torch.from_numpy(inputs["x"]), torch.from_numpy(inputs["position_ids"]))
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w.numpy(), atol=1e-6)


def test_rules_are_listed():
    assert uniform.rules.names() == [
        "UniformGather",
        "WrittenBackScatterND",
        "WrittenBackScatterElements",
    ]
