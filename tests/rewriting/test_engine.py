"""The engine: functions, subgraphs, provenance, graph outputs, fixed point, linear work."""

from __future__ import annotations

import json

import numpy as np
import onnx_ir as ir
import pytest

import irkit
from irkit import metadata
from irkit import rules as library
from irkit.errors import FixedPointError, RewriteError
from irkit.rewriting import Rule, op, var
from irkit.rewriting._acyclic import CYCLE
from tests.rewriting import util

x = var("x")

GELU_BODY = """
  c = Constant<value=float {0.70710678}>()  h = Constant<value=float {0.5}>()
  one = Constant<value=float {1.0}>()
  a = Mul(x, h)  b = Mul(x, c)  e = Erf(b)  f = Add(e, one)  y = Mul(a, f)"""


def _calls_model(n_calls: int) -> ir.Model:
    calls = "  ".join(f"v{i + 1} = pkg.Block(v{i})" for i in range(n_calls))
    return util.model(f"""<ir_version: 10, opset_import: ["" : 20, "pkg" : 1]>
g (float[2,8] v0) => (float[2,8] v{n_calls}) {{ {calls} }}
<domain: "pkg", opset_import: ["" : 20]>
Block (x) => (y) {{ {GELU_BODY} }}""")


def test_function_body_rewritten_once_for_64_calls():
    m = _calls_model(64)
    before = util.clone(m)
    report = util.rewrite(m, library.default_rules())
    assert report.fired == {"GeluErf": 1}
    assert report.rules["GeluErf"].where == {"pkg::Block": 1}
    body = m.functions[("pkg", "Block", "")]
    assert util.ops(body) == {"Gelu": 1}
    assert util.ops(m) == {"Block": 64}  # never inlined
    util.assert_valid(m)
    util.assert_same_numbers(before, m)


def test_constants_added_inside_function_bodies_are_constant_nodes():
    relu_to_max = Rule("ReluToMax", op.Relu(x), lambda op, x: op.Max(x, op.const(0.0, np.float32)))
    m = util.model("""<ir_version: 10, opset_import: ["" : 18, "pkg" : 1]>
g (float[2,8] v0) => (float[2,8] v2) { v1 = pkg.F(v0)  v2 = pkg.F(v1) }
<domain: "pkg", opset_import: ["" : 18]>
F (x) => (y) { y = Relu(x) }""")
    before = util.clone(m)
    irkit.rewrite(m, relu_to_max)
    body = m.functions[("pkg", "F", "")]
    assert util.ops(body) == {"Constant": 1, "Max": 1}
    assert not m.graph.initializers
    util.assert_valid(m)
    util.assert_same_numbers(before, m)


def test_if_branches_are_rewritten():
    m = util.model("""<ir_version: 10, opset_import: ["" : 18]>
g (bool c, float[2] x) => (float[2] y) {
  y = If(c) <then_branch = t () => (float[2] a) { a0 = Identity(x)  a = Relu(a0) },
             else_branch = e () => (float[2] b) { b = Neg(x) }>
}""")
    report = util.rewrite(m, library.cleanup.rules)
    assert report.fired == {"IdentityElimination": 1}
    then = m.graph.node(0).attributes["then_branch"].value
    assert util.ops(then) == {"Relu": 1}
    util.assert_valid(m)


def _stamp(node: ir.Node, scope, source: str) -> None:
    node.metadata_props[metadata.SCOPE] = metadata.encode_scope(scope)
    node.metadata_props[metadata.SOURCE] = source


def test_provenance_rule_sources_and_common_scope():
    m = util.model(
        '<ir_version: 10, opset_import: ["" : 20]>\ng (float[2,8] x) => (float[2,8] y) {'
        + GELU_BODY
        + " }"
    )
    block = metadata.Frame("layers.0", 0, "m.Block")
    mlp = metadata.Frame("layers.0.mlp", 0, "m.MLP")
    act = metadata.Frame("layers.0.mlp.act", 0, "m.GELU")
    for i, node in enumerate(m.graph):
        scope = (block, mlp, act) if node.op_type == "Erf" else (block, mlp)
        _stamp(node, scope, f"model.py:{10 + i % 2}")
    irkit.rewrite(m, library.gelu.rules)
    gelu = m.graph.node(0)
    props = gelu.metadata_props
    assert props[metadata.REWRITE_RULE] == "GeluErf"
    assert metadata.decode_list(props[metadata.REWRITE_SOURCES]) == ["model.py:10", "model.py:11"]
    assert metadata.node_scope(props) == (block, mlp)
    assert util.rewrite(m, library.gelu.rules).fired == {}


def test_fusion_at_graph_output_keeps_name_and_shape():
    m = util.model(
        '<ir_version: 10, opset_import: ["" : 20]>\ng (float[2,8] x) => (float[2,8] y) {'
        + GELU_BODY
        + " }"
    )
    irkit.rewrite(m, library.gelu.rules)
    (out,) = m.graph.outputs
    assert (out.name, out.dtype, list(out.shape)) == ("y", ir.DataType.FLOAT, [2, 8])
    assert out.producer().op_type == "Gelu"
    util.assert_valid(m)


def test_shape_changing_rule_is_rejected():
    wrong = Rule("Wrong", op.Relu(x), lambda op, x: op.Flatten(x))
    m = util.model(
        '<ir_version: 10, opset_import: ["" : 18]>\n'
        "g (float[2,3,4] x) => (float[2,3,4] y) { y = Relu(x) }"
    )
    m.graph.outputs[0].shape = ir.Shape([2, 3, 4])
    bad = Rule("Bad", op.Relu(x), lambda op, x: _with_shape(op.Flatten(x), [2, 12]))
    with pytest.raises(
        RewriteError,
        match=r"rule 'Bad' replaced 'y' \(shape \[2,3,4\]\) by a "
        r"value of shape \[2,12\]",
    ):
        irkit.rewrite(m, bad)
    del wrong


def _with_shape(v: ir.Value, shape) -> ir.Value:
    v.shape = ir.Shape(shape)
    return v


def test_rules_that_keep_firing_raise_fixed_point_error():
    flip = Rule("Flip", op.Neg(x), lambda op, x: op.Neg(op.Neg(op.Neg(x))))
    m = util.model(
        '<ir_version: 10, opset_import: ["" : 18]>\ng (float[2] x) => (float[2] y) { y = Neg(x) }'
    )
    with pytest.raises(FixedPointError) as info:
        irkit.rewrite(m, flip)
    assert info.value.rules == ["Flip"]
    assert "rules still firing: Flip (×64 of the last 64)" in str(info.value)


@pytest.mark.slow
def test_work_is_linear_in_graph_size():
    """Match attempts per node are the same for 50 and 1,000 blocks (time is in bench/)."""

    def chain(n):
        body = "  ".join(
            f"s{i} = Sigmoid(v{i})  m{i} = Mul(v{i}, s{i})  v{i + 1} = Relu(m{i})" for i in range(n)
        )
        return util.model(
            '<ir_version: 10, opset_import: ["" : 18]>\n'
            f"g (float[2] v0) => (float[2] v{n}) {{ {body} }}"
        )

    silu = Rule("SiLU", op.Mul(x, op.Sigmoid(x)), lambda op, x: op.Swish(x))
    per_node = []
    for n in (50, 1000):
        report = util.rewrite(chain(n), library.default_rules() + silu)
        tried = sum(s.tried for s in report.rules.values())
        per_node.append(tried / report.nodes_before)
        assert report.fired == {"SiLU": n}
    assert per_node[0] == pytest.approx(per_node[1], rel=0.02)


def test_every_default_rule_keeps_the_model_valid_one_at_a_time():
    """Apply rules one by one on a model exercising all of them; validate after each."""
    m = util.model("""<ir_version: 10, opset_import: ["" : 23]>
g (float[4,8] x, float[8,8] wm, float[8] bias, float[8] w, float[8] b) => (float[4,8] y, float[4,8] r) {
  ax = Constant<value=int64[1] {-1}>()  two = Constant<value=float {2.0}>()
  eps = Constant<value=float {1e-5}>()  sh = Constant<value=int64[2] {4, 8}>()
  x0 = Identity(x)  xc = Cast<to=1>(x0)  xr = Reshape(xc, sh)
  mm = MatMul(xr, wm)  g0 = Add(mm, bias)
  m = ReduceMean(g0, ax)  d = Sub(g0, m)  p = Pow(d, two)  v = ReduceMean(p, ax)  ve = Add(v, eps)
  s = Sqrt(ve)  n = Div(d, s)  nw = Mul(n, w)  ln = Add(nw, b)
  c7 = Constant<value=float {0.70710678}>()  h = Constant<value=float {0.5}>()
  one = Constant<value=float {1.0}>()
  ga = Mul(ln, h)  gb = Mul(ln, c7)  ge = Erf(gb)  gf = Add(ge, one)  y = Mul(ga, gf)
  q = Pow(y, two)  qm = ReduceMean(q, ax)  qe = Add(qm, eps)  qs = Sqrt(qe)  qr = Reciprocal(qs)
  qn = Mul(y, qr)  r = Mul(qn, w)
}""")
    m = util.infer_shapes(m)
    reference = util.clone(m)
    fired = set()
    for rule in library.default_rules():
        report = util.rewrite(m, rule)
        fired |= set(report.fired)
        util.assert_valid(m)
        util.assert_same_numbers(reference, m, atol=1e-4)
    assert fired == {
        "IdentityElimination",
        "NoOpCast",
        "NoOpReshape",
        "MatMulAddToGemm",
        "LayerNormalization",
        "GeluErf",
        "RMSNormalization",
    }


def test_call_metadata_is_json_frame():
    frame = metadata.Frame("layers.0", 0, "m.Block")
    assert metadata.Frame.from_json(json.loads(json.dumps(frame.to_json()))) == frame


@pytest.mark.slow
def test_rewriting_does_not_import_torch():
    import subprocess
    import sys

    code = (
        "import sys, irkit, irkit.rewriting, irkit.rules, onnx_ir as ir\n"
        'm = ir.from_onnx_text(\'<ir_version: 10, opset_import: ["" : 20]>\\n'
        "g (float[2] x) => (float[2] y) { t = Identity(x)  y = Relu(t) }')\n"
        "irkit.optimize(m)\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=str(util.GOLDEN.parents[2]))


def test_validity_check_catches_a_stale_shape():
    """The helper every rule test runs would reject a value whose recorded shape is stale."""
    m = util.model(
        '<ir_version: 10, opset_import: ["" : 18]>\n'
        "g (float[2,3] x) => (float[3,2] y) { t = Relu(x)  y = Transpose<perm=[1,0]>(t) }"
    )
    util.assert_valid(m)
    t = m.graph.node(0).outputs[0]
    t.type, t.shape = ir.TensorType(ir.DataType.FLOAT), ir.Shape([3, 2])  # stale: Relu keeps [2, 3]
    with pytest.raises(Exception, match="(?i)inferred shape and existing shape differ"):
        util.assert_valid(m)


def test_engine_keeps_the_last_node_between_graph_input_and_output_for_any_rule():
    """The guard is the engine's: a user rule that drops a node does not repeat it."""
    drop_neg = Rule("DropNeg", op.Neg(x), rewrite=lambda x: x)
    m = util.model(
        '<ir_version: 10, opset_import: ["" : 18]>\ng (float[2] x) => (float[2] y) { y = Neg(x) }'
    )
    report = util.rewrite(m, drop_neg)
    assert report.rules["DropNeg"].failures == {
        "needed: connects a graph input/initializer/output to a graph output": 1
    }
    assert util.ops(m) == {"Neg": 1}


def test_engine_guard_lets_a_shrinking_rewrite_through():
    """Neg(Neg(x)) → x at a graph output: two nodes become one Identity (progress)."""
    double_neg = Rule("DoubleNeg", op.Neg(op.Neg(x)), rewrite=lambda x: x)
    m = util.model(
        '<ir_version: 10, opset_import: ["" : 18]>\n'
        "g (float[2] x) => (float[2] y) { t = Neg(x)  y = Neg(t) }"
    )
    before = util.clone(m)
    assert util.rewrite(m, double_neg).fired == {"DoubleNeg": 1}
    assert util.ops(m) == {"Identity": 1}
    util.assert_same_numbers(before, m)


def test_a_bug_in_a_check_is_a_rewrite_error_naming_rule_node_and_graph():
    buggy = Rule("Buggy", op.Relu(x), check=lambda x: x.shape[5] == 1, rewrite=lambda x: x)
    m = util.model(
        '<ir_version: 10, opset_import: ["" : 18]>\n'
        "g (float[2] x) => (float[2] y) { t = Relu(x)  y = Neg(t) }"
    )
    m.graph.node(0).name = "relu_1"
    with pytest.raises(RewriteError) as info:
        irkit.rewrite(m, buggy)
    message = str(info.value)
    assert "rule 'Buggy' raised IndexError" in message
    assert "at node 'relu_1' (Relu) in graph" in message
    assert isinstance(info.value.__cause__, IndexError)


def test_a_bug_in_a_rewrite_inside_a_function_names_the_function():
    buggy = Rule("Buggy", op.Relu(x), rewrite=lambda op, x: op.Neg(x.nope))
    m = util.model(
        '<ir_version: 10, opset_import: ["" : 18, "pkg" : 1]>\n'
        "g (float[2] x) => (float[2] y) { y = pkg.F(x) }\n"
        '<domain: "pkg", opset_import: ["" : 18]> F (a) => (b) { b = Relu(a) }'
    )
    with pytest.raises(
        RewriteError, match=r"rule 'Buggy' raised AttributeError.* in pkg::F"
    ) as info:
        irkit.rewrite(m, buggy)
    assert isinstance(info.value.__cause__, AttributeError)


# --- the acyclicity invariant ----------------------------------------------------------------------

_ADD_NEG = (op.Add(x, var("m")), op.Neg(x))  # two roots: one fused node computes both


def _add_neg(op, x, m):
    """(x + m, -x) as one custom node with two outputs."""
    return tuple(op.AddNeg(x, m, _domain="test", _outputs=2))


def _sorted(graph: ir.Graph) -> bool:
    seen = set(graph.inputs) | set(graph.initializers.values())
    for node in graph:
        if any(v is not None and v.producer() is not None and v not in seen for v in node.inputs):
            return False
        seen.update(node.outputs)
    return True


def test_multi_root_replacement_reading_its_own_output_is_refused():
    """m is computed from -x: one node giving (x + m, -x) would read its own output."""
    fuse = Rule("AddNeg", _ADD_NEG, rewrite=_add_neg)
    m = util.model(
        '<ir_version: 10, opset_import: ["" : 18]>\n'
        "g (float[2] x) => (float[2] y, float[2] n) { n = Neg(x)  m = Exp(n)  y = Add(x, m) }"
    )
    report = util.rewrite(m, fuse, explain="AddNeg")
    assert report.fired == {}
    assert report.rules["AddNeg"].failures == {CYCLE: 1}
    assert [n.reason for n in report.near_misses] == [f"{CYCLE} [value 'm', node '' (Neg)]"]
    assert util.ops(m) == {"Add": 1, "Exp": 1, "Neg": 1} and _sorted(m.graph)
    util.assert_valid(m)


def test_multi_root_replacement_without_a_path_back_fires():
    """The same rule where m does not depend on -x: the fused node is fine."""
    fuse = Rule("AddNeg", _ADD_NEG, rewrite=_add_neg)
    m = util.model(
        '<ir_version: 10, opset_import: ["" : 18, "test" : 1]>\n'
        "g (float[2] x) => (float[2] y, float[2] n) { n = Neg(x)  m = Exp(x)  y = Add(x, m) }"
    )
    assert util.rewrite(m, fuse).fired == {"AddNeg": 1}
    assert util.ops(m) == {"AddNeg": 1, "Exp": 1} and _sorted(m.graph)


def test_replacement_reading_the_output_it_replaces_is_refused():
    """A rewrite that reads the matched output itself (here through ``match``) never fires."""
    reads_itself = Rule(
        "ReadsItself", op.Relu(x), rewrite=lambda op, x, match: op.Abs(match.outputs[0])
    )
    m = util.model(
        '<ir_version: 10, opset_import: ["" : 18]>\n'
        "g (float[2] x) => (float[2] y) { t = Relu(x)  y = Neg(t) }"
    )
    report = util.rewrite(m, reads_itself)
    assert report.rules["ReadsItself"].failures == {CYCLE: 1}
    assert util.ops(m) == {"Neg": 1, "Relu": 1} and _sorted(m.graph)
