"""The pattern language and rule definitions: matching features, printing, definition errors."""

from __future__ import annotations

import pytest

import irkit
from irkit.errors import RuleDefinitionError
from irkit.rewriting import (
    Const,
    NodeRule,
    Rule,
    RuleSet,
    attr,
    either,
    fail,
    matches,
    node_rule,
    op,
    optional,
    scalar,
    var,
)
from tests.rewriting import util

H = '<ir_version: 10, opset_import: ["" : 18, "com.microsoft" : 1, "pkg" : 1]>'
x, y = var("x"), var("y")

SILU = Rule("SiLU", lambda op, x: op.Mul(x, op.Sigmoid(x)), lambda op, x: op.Swish(x))


def _m(body: str):
    return util.model(H + body)


@pytest.mark.parametrize("product", ["Mul(x, s)", "Mul(s, x)"])
def test_commutative_either_order(product):
    m = _m(f"g (float[4] x) => (float[4] z) {{ s = Sigmoid(x)  z = {product} }}")
    report = util.rewrite(m, SILU)
    assert report.fired == {"SiLU": 1}
    assert util.ops(m) == {"Swish": 1}


def test_commutative_backtracks_into_inner_choice():
    # Add(Mul(a, b), a): the Mul's operand order must be revisited when the Add's second input fails.
    rule = Rule(
        "R",
        op.Add(op.Mul(x, y), x),  # x·y + x = x·(y + 1)
        lambda op, x, y: op.Mul(x, op.Add(y, op.const(1.0, "float32"))),
    )
    m = _m("g (float[4] a, float[4] b) => (float[4] z) { t = Mul(b, a)  z = Add(t, a) }")
    before = util.clone(m)
    assert util.rewrite(m, rule).fired == {"R": 1}
    (mul,) = [n for n in m.graph if n.op_type == "Mul"]
    assert mul.inputs[0].name == "a"
    util.assert_same_numbers(before, m)


def test_same_variable_must_bind_same_value():
    m = _m("g (float[4] a, float[4] b) => (float[4] z) { s = Sigmoid(b)  z = Mul(a, s) }")
    report = util.rewrite(m, SILU)
    assert report.fired == {}
    assert report.rules["SiLU"].failures == {"variable 'x' bound to two different values": 1}


def test_constant_with_tolerance():
    rule = Rule(
        "Half", op.Mul(x, Const(0.5, rtol=1e-3)), lambda op, x: op.Div(x, op.const(2.0, "float32"))
    )
    ok = _m(
        "g (float[4] x) => (float[4] z) { c = Constant<value=float {0.50001}>()  z = Mul(x, c) }"
    )
    bad = _m("g (float[4] x) => (float[4] z) { c = Constant<value=float {0.51}>()  z = Mul(x, c) }")
    assert util.rewrite(ok, rule).fired == {"Half": 1}
    assert util.rewrite(bad, rule).rules["Half"].failures == {"expected constant 0.5": 1}


def test_attribute_literal_capture_and_default():
    rule = Rule(
        "SoftmaxLast",
        op.Softmax(x, axis=attr("axis")),
        check=lambda axis: axis == -1 or fail(f"axis {axis}"),
        rewrite=lambda op, x: op.LogSoftmax(x),
    )
    m = _m("g (float[2,4] x) => (float[2,4] z) { z = Softmax(x) }")  # default axis=-1 (opset 13+)
    assert util.rewrite(m, rule).fired == {"SoftmaxLast": 1}
    m = _m("g (float[2,4] x) => (float[2,4] z) { z = Softmax<axis=0>(x) }")
    assert util.rewrite(m, rule).rules["SoftmaxLast"].failures == {"axis 0": 1}


def test_either_and_optional():
    rule = Rule(
        "ClipToRelu",
        op.Clip(x, either(0.0, Const(0)), optional(var("hi"))),
        lambda op, x, hi: op.Relu(x) if hi is None else None,
    )
    m = _m("g (float[4] x) => (float[4] z) { lo = Constant<value=float {0.0}>()  z = Clip(x, lo) }")
    assert util.rewrite(m, rule).fired == {"ClipToRelu": 1}
    m = _m(
        "g (float[4] x) => (float[4] z) { lo = Constant<value=float {0.0}>() "
        "hi = Constant<value=float {6.0}>()  z = Clip(x, lo, hi) }"
    )
    assert util.rewrite(m, rule).rules["ClipToRelu"].failures == {"rewrite declined": 1}


def test_other_domain_and_function_call_patterns():
    rule = Rule(
        "MsGelu",
        op.domain("com.microsoft").FastGelu(x),
        lambda op, x: op.domain("pkg").MyGelu(x),
    )
    m = _m("g (float[4] x) => (float[4] z) { z = com.microsoft.FastGelu(x) }")
    assert util.rewrite(m, rule).fired == {"MsGelu": 1}
    assert (m.graph.node(0).domain, m.graph.node(0).op_type) == ("pkg", "MyGelu")


def test_multi_output_pattern_found_through_shared_input():
    rule = Rule(
        "ReluAndSigmoid",
        (op.Relu(x), op.Sigmoid(x)),
        lambda op, x: op.domain("com.example").ReluSigmoid(x, _outputs=2),
    )
    m = _m("g (float[4] x) => (float[4] a, float[4] b) { b = Sigmoid(x)  t = Neg(x)  a = Relu(x) }")
    assert util.rewrite(m, rule).fired == {"ReluAndSigmoid": 1}
    assert util.ops(m) == {"Neg": 1, "ReluSigmoid": 1}
    assert [o.name for o in m.graph.outputs] == ["a", "b"]
    assert m.opset_imports["com.example"] == 1


def test_intermediate_used_outside_is_not_matched():
    m = _m("g (float[4] x) => (float[4] z, float[4] s) { s = Sigmoid(x)  z = Mul(x, s) }")
    report = util.rewrite(m, SILU)
    assert report.rules["SiLU"].failures == {
        "an intermediate value of the match is a graph output": 1
    }


def test_rule_prints_as_identity():
    assert str(SILU) == "SiLU: Mul(x, Sigmoid(x)) ⇒ Swish(x)"
    rules = RuleSet("act", [SILU]) + NodeRule("Drop", ["Identity"], lambda op, n: n.inputs[0])
    assert rules.names() == ["SiLU", "Drop"]
    assert str(rules) == (
        "RuleSet 'act+Drop' (2 rules)\n  SiLU: Mul(x, Sigmoid(x)) ⇒ Swish(x)\n  Drop"
    )


def test_unknown_rewrite_parameter_is_a_definition_error():
    with pytest.raises(RuleDefinitionError) as info:
        Rule("Bad", op.Relu(x), lambda op, z: op.Relu(z))
    assert str(info.value) == (
        "rule 'Bad': rewrite parameter 'z' is not a pattern variable (variables: x). "
        "Fix: rename it to one of the variables, or use it in the pattern."
    )


def test_unknown_check_parameter_is_a_definition_error():
    with pytest.raises(RuleDefinitionError, match="check parameter 'op' is not a pattern"):
        Rule("Bad", op.Relu(x), check=lambda op: True, rewrite=lambda op, x: x)


def test_duplicate_rule_names_rejected():
    with pytest.raises(RuleDefinitionError, match="two rules are named 'SiLU'"):
        RuleSet("s", [SILU]) + SILU


def test_plain_function_rule():
    @node_rule("Neg")
    def double_neg(op, node):
        inner = node.inputs[0].producer()
        if inner is None or inner.op_type != "Neg":
            return fail("not Neg(Neg(x))", node.inputs[0])
        return op.Identity(inner.inputs[0])

    m = _m("g (float[4] x) => (float[4] z) { t = Neg(x)  u = Neg(t)  v = Neg(u)  z = Relu(v) }")
    report = util.rewrite(m, double_neg)
    assert report.fired == {"double_neg": 1}  # v = Neg(Neg(t)); then Neg(x) is alone
    assert report.rules["double_neg"].failures == {"not Neg(Neg(x))": 1}
    assert util.ops(m) == {"Identity": 1, "Neg": 1, "Relu": 1}


def test_explain_lists_near_misses():
    m = _m("g (float[4] x, float[4] a) => (float[4] z) { s = Sigmoid(a)  z = Mul(x, s) }")
    report = util.rewrite(m, SILU, explain="SiLU")
    assert [(n.node, n.reason) for n in report.near_misses] == [
        (m.graph.node(1).name, "variable 'x' bound to two different values [value 'a']")
    ]
    assert "depth 2" in report.explain()


def test_explain_names_the_variable_and_value_whose_check_failed():
    """Mul(a, b) also matches Mul(x, w) commuted; the report keeps the written order's failure
    and names the variable the failing value is bound to (before: the commuted binding's
    failure, 'a has rank 1 [value 'w']', while the user's a is x, of rank 2)."""
    from irkit.rewriting import RuleSet, fail, rank

    def check(a, b):
        if rank(a) != 2:
            return fail(f"a has rank {rank(a)}, not 2", a)
        if rank(b) != 2:
            return fail(f"b has rank {rank(b)}, not 2", b)
        return True

    rule = Rule(
        "MulAdd",
        lambda op, a, b, c: op.Add(op.Mul(a, b), c),
        check=check,
        rewrite=lambda op, a, b, c: op.Sum(op.Mul(a, b), c),
    )
    m = _m(
        "g (float[2,8] x, float[8] w, float[2,8] c) => (float[2,8] y) { m = Mul(x, w)  y = Add(m, c) }"
    )
    report = util.rewrite(m, RuleSet("mine", [rule]), explain="MulAdd")
    assert report.fired == {}
    assert [n.reason for n in report.near_misses] == ["b has rank 1, not 2 [b = value 'w']"]
    assert report.rules["MulAdd"].failures == {"b has rank 1, not 2": 1}
    assert report.explain().endswith(": b has rank 1, not 2 [b = value 'w']")


def test_explain_unknown_rule():
    m = _m("g (float[4] x) => (float[4] z) { z = Relu(x) }")
    with pytest.raises(irkit.RewriteError, match="explain='Nope' names no rule"):
        irkit.rewrite(m, SILU, explain="Nope")


def test_commutative_chain_backtracking_is_local():
    """Add(Add(Add(Add(a, b), c), d), e) matched against the mirrored graph order."""
    names = "abcde"
    pat = var("a")
    for v in names[1:]:
        pat = op.Add(pat, var(v))
    rule = Rule("Sum5", pat, lambda op, a, b, c, d, e: op.Sum(a, b, c, d, e))
    body, prev = [], "a"
    for i, v in enumerate(names[1:]):
        body.append(f"s{i} = Add({v}, {prev})")
        prev = f"s{i}"
    m = _m(
        f"g ({', '.join(f'float[4] {v}' for v in names)}) => (float[4] {prev}) "
        f"{{ {'  '.join(body)} }}"
    )
    before = util.clone(m)
    assert util.rewrite(m, rule).fired == {"Sum5": 1}
    util.assert_same_numbers(before, m)


# --- tagged alternatives, the rewrite context, patterns inside checks ---------------------------

c = var("c")
SCALE = Rule(  # x·c = x/(1/c) = Scale(x, factor)
    "Scale",
    either(x * c, x / c, tag="divided"),
    check=lambda c, divided: (
        {"factor": 1 / v if divided else v}
        if (v := scalar(c))
        else fail("c is not a non-zero number", c)
    ),
    rewrite=lambda op, x, factor: op.domain("com.example").Scale(x, factor=factor),
)


@pytest.mark.parametrize(
    ("product", "factor"), [("Mul(a, c)", 4.0), ("Mul(c, a)", 4.0), ("Div(a, c)", 0.25)]
)
def test_either_tag_binds_the_index_of_the_alternative(product, factor):
    m = _m(
        f"g (float[4] a) => (float[4] z) {{ c = Constant<value=float {{4.0}}>()  z = {product} }}"
    )
    assert util.rewrite(m, SCALE).fired == {"Scale": 1}
    (node,) = [n for n in m.graph if n.op_type == "Scale"]
    assert node.inputs[0].name == "a"
    assert node.attributes["factor"].value == factor


def test_either_tag_prints_and_is_a_variable():
    assert str(either(x, op.Neg(x), tag="negated")) == "either(x | Neg(x), tag=negated)"
    assert SCALE.variables == ("divided", "x", "c")
    assert SCALE.pattern_text() == "either(Mul(x, c) | Div(x, c), tag=divided)"
    with pytest.raises(RuleDefinitionError, match="non-empty"):
        either(x, op.Neg(x), tag="")


def test_same_tag_chooses_the_same_alternative_and_nested_tags_bind_none():
    act = either(op.Relu(x), op.Sigmoid(x), tag="kind")
    twin = either(op.Relu(y), op.Sigmoid(y), tag="kind")
    seen: list[tuple[int, int | None]] = []
    rule = Rule(
        "Twin",
        op.Add(act, either(twin, op.Neg(either(y, op.Abs(y), tag="inner")), tag="right")),
        check=lambda kind, right, inner: seen.append((kind, right, inner)) or True,
        rewrite=lambda op, x, y, kind: op.domain("com.example").Twin(x, y, kind=kind),
    )
    m = _m(
        "g (float[4] a, float[4] b) => (float[4] z) { r = Sigmoid(a)  s = Sigmoid(b)  z = Add(r, s) }"
    )
    assert util.rewrite(m, rule).fired == {"Twin": 1}
    assert seen == [(1, 0, None)]
    assert m.graph.node(0).attributes["kind"].value == 1
    mixed = _m(
        "g (float[4] a, float[4] b) => (float[4] z) { r = Relu(a)  s = Sigmoid(b)  z = Add(r, s) }"
    )
    assert util.rewrite(mixed, rule).fired == {}
    negated = _m(
        "g (float[4] a, float[4] b) => (float[4] z) { r = Relu(a)  s = Neg(b)  z = Add(r, s) }"
    )
    seen.clear()
    assert util.rewrite(negated, rule).fired == {"Twin": 1}
    assert seen == [(0, 1, 0)]


def test_check_and_rewrite_take_the_rewrite_context():
    rule = Rule(  # relu(x) = Marked(x) where x is a graph input
        "MarkInputRelu",
        op.Relu(x),
        check=lambda x, ctx: x in ctx.graph.inputs or fail("x is computed", x),
        rewrite=lambda op, x, ctx: op.domain("com.example").Marked(x, opset=ctx.opset),
    )
    m = _m("g (float[4] a) => (float[4] z, float[4] w) { z = Relu(a)  n = Neg(a)  w = Relu(n) }")
    report = util.rewrite(m, rule)
    assert report.fired == {"MarkInputRelu": 1}
    assert report.rules["MarkInputRelu"].failures == {"x is computed": 1}
    (marked,) = [n for n in m.graph if n.op_type == "Marked"]
    assert marked.attributes["opset"].value == 18


def test_special_names_are_not_pattern_variables():
    with pytest.raises(RuleDefinitionError, match="'ctx' has the name of a special"):
        Rule("Bad", lambda op, ctx: op.Relu(ctx), rewrite=lambda op: None)


def test_matches_looks_at_values_outside_the_match():
    # x · (-x) = -(x·x), where -x is also a graph output: its Neg stays, so it cannot be part of
    # the pattern (an intermediate used outside); the check looks at it with a pattern instead.
    negated = op.Neg(x)  # (a pattern: inside the check, x is the bound value)
    rule = Rule(
        "TimesNegated",
        x * y,
        check=lambda x, y, match: (
            bool(matches(negated, y, match.opset, x=x)) or fail("y is not -x", y)
        ),
        rewrite=lambda op, x: op.Neg(op.Mul(x, x)),
    )
    text = "g (float[4] a) => (float[4] z, float[4] n) { n = Neg(a)  z = Mul(a, n) }"
    m = _m(text)
    before = util.clone(m)
    assert util.rewrite(m, rule).fired == {"TimesNegated": 1}
    assert util.ops(m) == {"Mul": 1, "Neg": 2}
    util.assert_same_numbers(before, m)
    other = _m(text.replace("Neg(a)", "Abs(a)"))
    assert util.rewrite(other, rule).rules["TimesNegated"].failures == {"y is not -x": 1}
    assert matches(op.Neg(x), other.graph.outputs[1], 18).reason == "expected Neg, found Abs"


def test_name_binds_an_intermediate_value_for_the_check():
    seen: list[str] = []
    rule = Rule(  # relu(-x) = NegRelu(x), where -x is 2-D
        "NegRelu",
        op.Relu(op.Neg(x, _name="negated")),
        check=lambda negated: seen.append(negated.name) or len(negated.shape) == 2,
        rewrite=lambda op, x: op.domain("com.example").NegRelu(x),
    )
    assert rule.variables == ("x", "negated")
    assert rule.pattern_text() == "Relu(Neg(x) as negated)"
    m = util.infer_shapes(
        _m(
            "g (float[2,4] a, float[4] b) => (float[2,4] y, float[4] z) "
            "{ n = Neg(a)  y = Relu(n)  nb = Neg(b)  z = Relu(nb) }"
        )
    )
    report = util.rewrite(m, rule)
    assert report.fired == {"NegRelu": 1}
    assert sorted(seen) == ["n", "nb"]
    assert util.ops(m) == {"Neg": 1, "NegRelu": 1, "Relu": 1}
    with pytest.raises(RuleDefinitionError, match="a name binds the one output"):
        op.Split(x, _outputs=2, _name="parts")
