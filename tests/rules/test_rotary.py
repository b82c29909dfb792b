"""Rule family :mod:`irkit.rules.rotary`: fires (exact ops, onnxruntime numbers), declines (reason).

The half form is written as HF's ``apply_rotary_pos_emb`` lowers (``Slice``/``Neg``/``Concat``,
cos/sin ``(B, S, D)`` unsqueezed at 1, computed as ``Cos(Concat(f, f))``); the interleaved form
as GPT-J's ``rotate_every_two`` (step-2 slices, stack, flatten) with constant caches.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from irkit import rules as library
from tests.rewriting import util
from tests.rules.test_attention import build

SETTINGS = settings(max_examples=10, deadline=None, derandomize=True)


def half_text(b=2, h=4, s=3, d=8, *, opset=23, angles="dup", swap=False, cat_axis=-1) -> str:
    """x·cos + rotate_half(x)·sin; ``angles``: "dup" Concat(f, f), "other" Concat(f, g), "input"."""
    hh = d // 2
    ins = [f"float[{b},{h},{s},{d}] x"]
    body = []
    if angles == "input":
        ins += [f"float[{b},{s},{d}] cos", f"float[{b},{s},{d}] sin"]
    else:
        ins.append(f"float[{b},{s},{hh}] f")
        second = "f"
        if angles == "other":
            ins.append(f"float[{b},{s},{hh}] g")
            second = "g"
        body.append(
            f"e = Concat<axis=-1>(f, {second})  c0 = Cos(e)  s0 = Sin(e)"
            "  one = Constant<value=float {1.0}>()  cos = Mul(c0, one)  sin = Mul(s0, one)"
        )
    lo, hi = (f"{hh}", f"{d}") if swap else ("0", f"{hh}")
    lo2, hi2 = ("0", f"{hh}") if swap else (f"{hh}", "9223372036854775807")
    body.append(
        "ax1 = Constant<value=int64[1] {1}>()  c4 = Unsqueeze(cos, ax1)  s4 = Unsqueeze(sin, ax1)"
        f"  a = Constant<value=int64[1] {{{lo}}}>()  bnd = Constant<value=int64[1] {{{hi}}}>()"
        f"  a2 = Constant<value=int64[1] {{{lo2}}}>()  b2 = Constant<value=int64[1] {{{hi2}}}>()"
        "  last = Constant<value=int64[1] {3}>()  step = Constant<value=int64[1] {1}>()"
        "  x1 = Slice(x, a, bnd, last, step)  x2 = Slice(x, a2, b2, last, step)"
        f"  n = Neg(x2)  r = Concat<axis={cat_axis}>(n, x1)"
        "  xc = Mul(x, c4)  rs = Mul(r, s4)  y = Add(xc, rs)"
    )
    header = f'<ir_version: 10, opset_import: ["" : {opset}]>\n'
    sig = f"g ({', '.join(ins)}) => (float[{b},{h},{s},{d}] y)"
    return header + sig + " {\n  " + "\n  ".join(body) + "\n}"


def interleaved_text(b=2, h=4, s=3, d=8, *, distinct=False, seed=0) -> str:
    rng = np.random.default_rng(seed)
    ang = rng.standard_normal((b, s, d // 2))
    lanes = np.repeat(ang, 2, axis=-1)
    if distinct:
        lanes[..., 1] += 0.5
    cos, sin = np.cos(lanes), np.sin(lanes)

    def lit(a):
        return ", ".join(f"{v:.9g}" for v in a.ravel())

    return (
        '<ir_version: 10, opset_import: ["" : 23]>\n'
        f"g (float[{b},{h},{s},{d}] x) => (float[{b},{h},{s},{d}] y) {{\n"
        f"  cos = Constant<value=float[{b},{s},{d}] {{{lit(cos)}}}>()"
        f"  sin = Constant<value=float[{b},{s},{d}] {{{lit(sin)}}}>()"
        "  ax1 = Constant<value=int64[1] {1}>()  c4 = Unsqueeze(cos, ax1)  s4 = Unsqueeze(sin, ax1)"
        "  z = Constant<value=int64[1] {0}>()  o = Constant<value=int64[1] {1}>()"
        "  big = Constant<value=int64[1] {9223372036854775807}>()"
        "  last = Constant<value=int64[1] {-1}>()  two = Constant<value=int64[1] {2}>()"
        "  x1 = Slice(x, z, big, last, two)  x2 = Slice(x, o, big, last, two)  n = Neg(x2)"
        "  u1 = Unsqueeze(n, last)  u2 = Unsqueeze(x1, last)  st = Concat<axis=-1>(u1, u2)"
        f"  fl = Constant<value=int64[4] {{{b},{h},{s},{d}}}>()  r = Reshape(st, fl)"
        "  xc = Mul(x, c4)  rs = Mul(r, s4)  y = Add(xc, rs)\n}"
    )


def run(m: ir.Model, dtype: str = "float"):
    before = util.clone(m)
    report = util.rewrite(m, library.default_rules())
    util.assert_valid(m)
    util.assert_same_numbers(before, m, atol=1e-2 if dtype == "float16" else 1e-4)
    return report


def _reason(m: ir.Model, rule: str) -> dict[str, int]:
    report = util.rewrite(m, library.default_rules(), explain=rule)
    assert report.rules[rule].fired == 0
    return dict(report.rules[rule].failures)


def test_half_rotation():
    m = build(half_text())
    report = run(m)
    assert report.fired.get("RotaryEmbedding") == 1
    ops = util.ops(m)
    assert ops["RotaryEmbedding"] == 1 and not {"Neg", "Add"} & set(ops)
    rot = next(n for n in m.graph if n.op_type == "RotaryEmbedding")
    assert len(rot.inputs) == 3 and not rot.attributes.get("interleaved")
    assert [d for d in rot.inputs[1].producer().inputs[0].shape] == [2, 3, 8]  # the (B, S, D) cos


@SETTINGS
@given(
    b=st.integers(1, 3),
    h=st.integers(1, 4),
    s=st.integers(1, 5),
    d=st.sampled_from([2, 4, 8, 16]),
    dtype=st.sampled_from(["float", "float16"]),
)
def test_property_half(b, h, s, d, dtype):
    m = build(half_text(b, h, s, d), dtype)
    report = run(m, dtype)
    assert report.fired.get("RotaryEmbedding") == 1
    assert util.ops(m).get("RotaryEmbedding") == 1


@pytest.mark.parametrize("size", [(2, 4, 3, 8), (1, 2, 5, 4)])
def test_interleaved_constant_caches(size):
    m = build(interleaved_text(*size))
    report = run(m)
    assert report.fired.get("RotaryEmbeddingInterleaved") == 1
    rot = next(n for n in m.graph if n.op_type == "RotaryEmbedding")
    assert rot.attributes["interleaved"].value == 1


def test_interleaved_fp16():
    m = build(interleaved_text(), "float16")
    report = run(m, "float16")
    assert report.fired.get("RotaryEmbeddingInterleaved") == 1


# --- negative ------------------------------------------------------------------------------------


def test_needs_opset_23():
    assert "needs opset >= 23, graph has 22" in _reason(
        build(half_text(opset=22)), "RotaryEmbedding"
    )


def test_cos_not_duplicated():
    failures = _reason(build(half_text(angles="other")), "RotaryEmbedding")
    assert "cannot verify that cos/sin has duplicated halves (Concat found)" in failures


def test_cos_from_graph_input_cannot_be_verified():
    failures = _reason(build(half_text(angles="input")), "RotaryEmbedding")
    assert "cos/sin is a graph input: its halves cannot be verified" in failures


def test_swapped_halves():
    failures = _reason(build(half_text(swap=True)), "RotaryEmbedding")
    assert "slices (4, 8, 1) / (0, 4, 1) are not the halves [0, 4) / [4, 8)" in failures


def test_interleaved_lanes_differ():
    failures = _reason(build(interleaved_text(distinct=True)), "RotaryEmbeddingInterleaved")
    assert "cos/sin constant lanes differ" in failures


def test_cos_batch_must_match():
    m = build(half_text(b=2))
    for node in m.graph:  # claim the caches have batch 3: neither x's batch nor 1
        if node.op_type == "Unsqueeze":
            node.outputs[0].shape = ir.Shape([3, 1, 3, 8])
    failures = _reason(m, "RotaryEmbedding")
    assert (
        "cos/sin dims (3, 1, 3, 8) do not match x (2, 4, 3, 8) (batch, 1, sequence, head dim)"
        in failures
    )


def test_batch_1_cache_is_expanded_to_the_batch():
    m = build(half_text(b=2).replace("float[2,3,4] f", "float[1,3,4] f"))
    report = run(m)
    assert report.fired.get("RotaryEmbedding") == 1
    assert util.ops(m)["Expand"] == 2 and util.ops(m)["RotaryEmbedding"] == 1


def partial_text(rotated: int = 8, rest_start: int | None = None, interleaved: int = 0) -> str:
    """The first ``rotated`` of 16 lanes rotated by a ``RotaryEmbedding``, the rest passed through."""
    rest = rotated if rest_start is None else rest_start
    return (
        '<ir_version: 10, opset_import: ["" : 23]>\n'
        f"g (float[2, 3, 4, 16] x, float[2, 4, {rotated // 2}] c, float[2, 4, {rotated // 2}] s)"
        " => (float[2, 3, 4, 16] y) {\n"
        "  z = Constant<value=int64[1] {0}>()  ax = Constant<value=int64[1] {-1}>()\n"
        f"  r = Constant<value=int64[1] {{{rotated}}}>()  p = Constant<value=int64[1] {{{rest}}}>()\n"
        "  end = Constant<value=int64[1] {9223372036854775807}>()\n"
        f"  lo = Slice(x, z, r, ax)  hi = Slice(x, p, end, ax)\n"
        f"  ro = RotaryEmbedding<interleaved={interleaved}>(lo, c, s)  y = Concat<axis=-1>(ro, hi)\n}}"
    )


@pytest.mark.parametrize("interleaved", [0, 1])
def test_partial_rotation_is_the_ops_rotary_embedding_dim(interleaved):
    m = util.model(partial_text(interleaved=interleaved))
    before = util.clone(m)
    report = util.rewrite(m, library.default_rules())
    assert report.fired == {"PartialRotaryEmbedding": 1}
    assert util.ops(m) == {"RotaryEmbedding": 1}
    (node,) = m.graph
    assert node.attributes["rotary_embedding_dim"].value == 8
    util.assert_same_numbers(before, m)


def test_partial_rotation_with_a_gap_is_kept():
    m = util.model(partial_text(rest_start=10))
    report = util.rewrite(m, library.default_rules(), explain="PartialRotaryEmbedding")
    assert report.rules["PartialRotaryEmbedding"].failures == {
        "the slices are not x[..., :r] and x[..., r:]": 1
    }


def merged_text(partial: bool) -> str:
    """``(B, S, H, D)`` heads transposed, rotated (all 16 lanes or the first 8), transposed back
    and merged to ``(B, S, H·D)``, as the ``"ort"`` target's 3-D attention ops leave them."""
    rotated = 8 if partial else 16
    rotate = (
        "  z = Constant<value=int64[1] {0}>()  ax = Constant<value=int64[1] {-1}>()\n"
        "  r = Constant<value=int64[1] {8}>()  e = Constant<value=int64[1] {16}>()\n"
        "  lo = Slice(t, z, r, ax)  hi = Slice(t, r, e, ax)\n"
        "  ro = RotaryEmbedding(lo, c, s)  rot = Concat<axis=-1>(ro, hi)\n"
        if partial
        else "  rot = RotaryEmbedding(t, c, s)\n"
    )
    return (
        '<ir_version: 10, opset_import: ["" : 23]>\n'
        f"g (float[b, n, 3, 16] y, float[b, n, {rotated // 2}] c, float[b, n, {rotated // 2}] s)"
        " => (float[b, n, 48] out) {\n"
        "  t = Transpose<perm=[0, 2, 1, 3]>(y)\n"
        + rotate
        + "  back = Transpose<perm=[0, 2, 1, 3]>(rot)\n"
        "  m = Constant<value=int64[3] {0, 0, 48}>()  out = Reshape(back, m)\n}"
    )


@pytest.mark.parametrize("partial", [False, True], ids=["full", "partial"])
def test_rotation_between_head_transposes_is_the_3d_op(partial):
    m = util.model(merged_text(partial))
    before = util.clone(m)
    report = util.rewrite(m, library.default_rules())
    assert report.fired == {"RotaryEmbeddingHeadsMerged": 1}
    assert util.ops(m) == {"Constant": 1, "Reshape": 1, "RotaryEmbedding": 1}
    (node,) = [n for n in m.graph if n.op_type == "RotaryEmbedding"]
    assert node.attributes["num_heads"].value == 3
    dim = node.attributes.get("rotary_embedding_dim")
    assert (dim.value if dim else None) == (8 if partial else None)
    util.assert_same_numbers(before, m)
