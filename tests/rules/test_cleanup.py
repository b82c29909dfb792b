"""Rule family :mod:`irkit.rules.cleanup`: each rule fires (golden, numbers) and declines (exact reason)."""

from __future__ import annotations

from tests.rewriting import util
from tests.rules.support import fire, no_fire, parse


def test_identity_fires():
    m = parse("g (float[2,3] x) => (float[2,3] y) { t = Identity(x)  y = Relu(t) }")
    fire(m, "IdentityElimination", {"Relu": 1}, "identity")


def test_identity_kept_between_graph_input_and_output():
    m = parse("g (float[2,3] x) => (float[2,3] y) { y = Identity(x) }")
    no_fire(
        m,
        "IdentityElimination",
        "needed: connects a graph input/initializer/output to a graph output",
    )
    assert util.ops(m) == {"Identity": 1}


def test_identity_before_graph_output_moves_the_name():
    m = parse("g (float[2,3] x) => (float[2,3] y) { t = Relu(x)  y = Identity(t) }")
    fire(m, "IdentityElimination", {"Relu": 1})
    assert [o.name for o in m.graph.outputs] == ["y"]
    assert m.graph.outputs[0].producer().op_type == "Relu"


def test_noop_cast():
    m = parse("g (float[2,3] x) => (float[2,3] y) { t = Cast<to=1>(x)  y = Relu(t) }")
    fire(m, "NoOpCast", {"Relu": 1})


def test_real_cast_kept():
    m = parse("g (float[2,3] x) => (float16[2,3] y) { y = Cast<to=10>(x) }")
    no_fire(m, "NoOpCast", "casts FLOAT to FLOAT16")


def test_noop_reshape():
    m = parse(
        "g (float[2,3] x) => (float[2,3] y) "
        "{ s = Constant<value=int64[2] {2, -1}>()  t = Reshape(x, s)  y = Relu(t) }"
    )
    fire(m, "NoOpReshape", {"Relu": 1})


def test_real_reshape_kept():
    m = parse(
        "g (float[2,3] x) => (float[3,2] y) "
        "{ s = Constant<value=int64[2] {3, 2}>()  y = Reshape(x, s) }"
    )
    no_fire(m, "NoOpReshape", "target [3, 2] differs from input shape [2, 3]")


def test_reshape_reshape():
    m = parse(
        "g (float[2,3] x) => (float[3,2] y) { s1 = Constant<value=int64[1] {6}>() "
        "s2 = Constant<value=int64[2] {3, 2}>()  t = Reshape(x, s1)  y = Reshape(t, s2) }"
    )
    fire(m, "ReshapeReshape", {"Constant": 1, "Reshape": 1}, "reshape_reshape")


def test_reshape_reshape_with_zero_kept():
    m = parse(
        "g (float[2,3] x) => (float[6] y) { s1 = Constant<value=int64[2] {3, 2}>() "
        "s2 = Constant<value=int64[2] {0, -1}>()  t = Reshape(x, s1)  y = Reshape(t, s2) }"
    )
    no_fire(m, "ReshapeReshape", "outer shape copies a dim (0) of the inner result")


def test_transpose_transpose_cancels():
    m = parse(
        "g (float[2,3,4] x) => (float[2,3,4] y) "
        "{ t = Transpose<perm=[1,0,2]>(x)  u = Transpose<perm=[1,0,2]>(t)  y = Relu(u) }"
    )
    report = fire(m, "TransposeTranspose", {"Relu": 1})
    assert report.fired == {"TransposeTranspose": 1, "NoOpTranspose": 1}


def test_transpose_transpose_composes():
    m = parse(
        "g (float[2,3,4] x) => (float[4,2,3] y) "
        "{ t = Transpose<perm=[1,0,2]>(x)  y = Transpose<perm=[2,1,0]>(t) }"
    )
    fire(m, "TransposeTranspose", {"Transpose": 1}, "transpose_compose")
    assert list(m.graph.node(0).attributes["perm"].value) == [2, 0, 1]


def test_transpose_without_perm_kept():
    m = parse("g (float[2,3] x) => (float[2,3] y) { t = Transpose(x)  y = Transpose(t) }")
    no_fire(m, "TransposeTranspose", "a Transpose without explicit perm")


def test_noop_transpose_kept_when_permuting():
    m = parse("g (float[2,3] x) => (float[3,2] y) { y = Transpose<perm=[1,0]>(x) }")
    no_fire(m, "NoOpTranspose", "perm (1, 0) is not the identity")


def test_noop_expand():
    m = parse(
        "g (float[2,3] x) => (float[2,3] y) "
        "{ s = Constant<value=int64[2] {1, 3}>()  t = Expand(x, s)  y = Relu(t) }"
    )
    fire(m, "NoOpExpand", {"Relu": 1})


def test_real_expand_kept():
    m = parse(
        "g (float[2,3] x) => (float[4,2,3] y) "
        "{ s = Constant<value=int64[3] {4, 2, 3}>()  y = Expand(x, s) }"
    )
    no_fire(m, "NoOpExpand", "expand adds dimensions")
