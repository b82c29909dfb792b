"""transformers' short convolution over ``cat(state, x)`` → onnxruntime's ``CausalConvWithState``:
LFM2's form (a leading zero column padded onto the state, no activation) and the gated delta
net's (the state as is, SiLU between the slices) fire with onnxruntime's numbers unchanged; a
conv whose slices keep other outputs, or whose padding reads past the state, is declined. The
last ``K − 1`` columns of the same ``cat`` (the new state, as irkit's export keeps it where every
row's last token is real) become the op's second output."""

from __future__ import annotations

import pytest

from tests.rules.ort.support import fire, no_fire, parse


def conv_text(
    *,
    padded: bool = True,
    silu: bool = False,
    first: int | None = None,
    pads: int = 3,
    state: int = 3,
    last: int | None = None,
) -> str:
    """A width-4 depthwise conv over ``cat(state, x)`` (6 channels, 5 new columns) as torchlib
    writes ``conv1d(cat, padding=3)[..., :c₁ + S]`` then ``[..., -S:]``; ``cat`` is an output
    too (irkit's export gathers the next state from it), or, with ``last``, its columns from
    ``-last`` on (the new state where every row's last token is real)."""
    zeros = 1 if padded else 0
    first = state + zeros if first is None else first
    width = state + zeros
    join = (
        "  pp = Constant<value=int64[6] {0, 0, 1, 0, 0, 0}>()  p = Pad(state, pp)\n"
        "  c = Concat<axis=-1>(p, x)\n"
        if padded
        else "  c = Concat<axis=-1>(state, x)\n"
    )
    act = "  sg = Sigmoid(s1)  a = Mul(s1, sg)\n" if silu else "  a = Identity(s1)\n"
    second = f"float[2, 6, {5 + width}] c"
    if last is not None:
        second = f"float[2, 6, {last}] kept"
        act += f"  lk = Constant<value=int64[1] {{{-last}}}>()  kept = Slice(c, lk, big, ax)\n"
    return (
        f"g (float[2, 6, 5] x, float[2, 6, {state}] state, float[6, 1, 4] w)"
        f" => (float[2, 6, 5] y, {second}) {{\n"
        + join
        + f"  conv = Conv<group=6, pads=[{pads}, {pads}]>(c, w)\n"
        "  sh = Shape<start=2, end=3>(x)  v = Squeeze(sh)\n"
        f"  k = Constant<value=int64 {{{first}}}>()  e = Add(k, v)\n"
        "  one = Constant<value=int64[1] {1}>()  e1 = Reshape(e, one)\n"
        "  z = Constant<value=int64[1] {0}>()  ax = Constant<value=int64[1] {-1}>()\n"
        "  big = Constant<value=int64[1] {9223372036854775807}>()\n"
        "  s1 = Slice(conv, z, e1, ax)\n" + act + "  n = Neg(v)  s2 = Reshape(n, one)\n"
        "  y = Slice(a, s2, big, ax)\n}"
    )


@pytest.mark.parametrize("silu", [False, True], ids=["plain", "silu"])
def test_lfm2_padded_state_conv_becomes_causal_conv(silu):
    m = parse(conv_text(silu=silu))
    report = fire(
        m, "CausalConvWithState", {"CausalConvWithState": 1, "Concat": 1, "Constant": 1, "Pad": 1}
    )
    (node,) = [n for n in m.graph if n.op_type == "CausalConvWithState"]
    assert node.attributes["activation"].value == ("silu" if silu else "none")
    assert report.fired["CausalConvWithState"] == 1  # (the slices, Shape, Add, Neg: gone)


def test_gated_delta_state_conv_becomes_causal_conv():
    m = parse(conv_text(padded=False, silu=True))
    fire(m, "CausalConvWithState", {"CausalConvWithState": 1, "Concat": 1})


def test_outputs_that_read_the_padding_are_not_a_causal_conv():
    no_fire(
        parse(conv_text(first=2)),
        "CausalConvWithState",
        "the kept outputs do not start at K − 1 + 1",
    )


def test_a_conv_padded_otherwise_is_not_a_causal_conv():
    no_fire(
        parse(conv_text(pads=2)),
        "CausalConvWithState",
        "pads [2, 2] are not K − 1 = 3 on both sides",
    )


def test_a_state_of_another_width_is_not_a_causal_conv():
    no_fire(
        parse(conv_text(padded=False, state=4)), "CausalConvWithState", "the state is not 3 columns"
    )


@pytest.mark.parametrize("padded", [True, False], ids=["lfm2", "gated_delta"])
def test_the_last_columns_of_the_state_and_x_are_the_ops_new_state(padded):
    m = parse(conv_text(padded=padded, silu=not padded, last=3))
    report = fire(m, "CausalConvWithStatePresent", {"CausalConvWithState": 1})
    (node,) = [n for n in m.graph if n.op_type == "CausalConvWithState"]
    assert m.graph.outputs[1] is node.outputs[1]  # (no Concat, Pad or Slice left)
    assert report.fired["CausalConvWithState"] == 1


def test_columns_other_than_the_last_k_minus_1_are_not_the_new_state():
    no_fire(
        parse(conv_text(last=4)),
        "CausalConvWithStatePresent",
        "the slice does not start at −(K − 1), the state's length",
    )
