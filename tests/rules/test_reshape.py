"""Rule family :mod:`irkit.rules.reshape`: a computed ``Reshape`` target the known shapes give
becomes a constant (onnxruntime numbers unchanged); a dim the shapes do not tie to the input
keeps the computed target (reason)."""

from __future__ import annotations

from tests.rules.support import fire, no_fire, parse

_VIEW = (
    "g (float[b, s, 32] x) => (float[b, s, 4, 8] y) {{\n"
    "  sh = Shape<start=0, end=2>(x)  heads = Constant<value=int64[2] {{4, 8}}>()\n"
    "  t = Concat<axis=0>(sh, heads)\n"
    "  y = Reshape{attrs}(x, t)\n}}"
)


def test_view_to_heads_gets_a_constant_target():
    m = parse(_VIEW.format(attrs="<allowzero=1>"))
    fire(m, "KnownReshapeTarget", {"Constant": 1, "Reshape": 1})
    (reshape,) = [n for n in m.graph if n.op_type == "Reshape"]
    assert reshape.inputs[1].const_value.numpy().tolist() == [0, 0, 4, 8]
    assert "allowzero" not in reshape.attributes


def test_a_dim_not_the_inputs_keeps_the_computed_target():
    text = _VIEW.format(attrs="").replace("float[b, s, 4, 8] y", "float[s, b, 4, 8] y")
    no_fire(
        parse(text), "KnownReshapeTarget", "the result's dim 0 (s) is neither an int nor x's dim 0"
    )


def test_expand_to_a_computed_shape_gets_a_constant_target():
    m = parse(
        "g (int64[b, 1, 3] i) => (int64[b, 8, 3] y) {\n"
        "  sh = Shape<start=0, end=1>(i)  rest = Constant<value=int64[2] {8, 3}>()\n"
        "  t = Concat<axis=0>(sh, rest)  y = Expand(i, t)\n}"
    )
    fire(m, "KnownExpandTarget", {"Constant": 1, "Expand": 1})
    (expand,) = [n for n in m.graph if n.op_type == "Expand"]
    assert expand.inputs[1].const_value.numpy().tolist() == [1, 8, 1]
