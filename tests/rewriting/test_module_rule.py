"""Module-level rules: replace every call of a module function by a kernel (custom op)."""

from __future__ import annotations

import json

import numpy as np
import onnx_ir as ir
import pytest

import irkit
from irkit import metadata
from irkit.errors import RuleDefinitionError
from irkit.rewriting import ModuleRule
from tests.rewriting import util

PKG = "transformers.models.llama"
CLS = f"{PKG}.modeling_llama.LlamaRMSNorm"

RMS_BODY = """
  ax = Constant<value=int64[1] {-1}>()  two = Constant<value=float {2.0}>()
  eps = Constant<value=float {1e-6}>()
  p = Pow(x, two)  v = ReduceMean(p, ax)  ve = Add(v, eps)  s = Sqrt(ve)  r = Reciprocal(s)
  n = Mul(x, r)  y = Mul(w, n)"""


def _model(n_layers: int = 3) -> ir.Model:
    calls = "  ".join(f"h{i + 1} = {PKG}.LlamaRMSNorm(h{i}, w{i % 2})" for i in range(n_layers))
    m = util.model(f"""<ir_version: 10, opset_import: ["" : 18, "{PKG}" : 1]>
g (float[2,4,8] h0, float[8] w0, float[8] w1) => (float[2,4,8] h{n_layers}) {{ {calls} }}
<domain: "{PKG}", opset_import: ["" : 18]>
LlamaRMSNorm (x, w) => (y) {{ {RMS_BODY} }}""")
    for i, node in enumerate(m.graph):
        frame = metadata.Frame(f"layers.{i}.input_layernorm", 0, CLS)
        node.metadata_props[metadata.CALL_MODULE] = json.dumps(frame.to_json())
        node.metadata_props[metadata.SCOPE] = metadata.encode_scope(
            [metadata.Frame(f"layers.{i}", 0, f"{PKG}.modeling_llama.LlamaDecoderLayer")]
        )
    return m


def test_replace_every_call_by_a_kernel():
    m = _model()
    before = util.clone(m)
    rule = ModuleRule(
        "RMSNormKernel",
        cls="LlamaRMSNorm",
        replace_with=("", "SimplifiedLayerNormalization"),  # ORT registers it in the ONNX domain
        attributes={"epsilon": 1e-6, "axis": -1},
    )
    report = util.rewrite(m, rule)
    assert report.fired == {"RMSNormKernel": 3}
    assert report.rules["RMSNormKernel"].where == {
        "layers.0.input_layernorm": 1,
        "layers.1.input_layernorm": 1,
        "layers.2.input_layernorm": 1,
    }
    assert util.ops(m) == {"SimplifiedLayerNormalization": 3}
    node = m.graph.node(1)
    assert json.loads(node.metadata_props[metadata.CALL_MODULE])[0] == "layers.1.input_layernorm"
    assert node.metadata_props[metadata.REWRITE_RULE] == "RMSNormKernel"
    util.assert_same_numbers(before, m, atol=1e-5)


def test_select_by_path_glob_and_custom_domain():
    m = _model()
    rule = ModuleRule("Flash", path="layers.[02].*", replace_with=("com.example", "FastRMS"))
    report = util.rewrite(m, rule)
    assert report.fired == {"Flash": 2}
    assert [n.op_type for n in m.graph] == ["FastRMS", "LlamaRMSNorm", "FastRMS"]
    assert m.opset_imports["com.example"] == 1
    assert set(report.rules["Flash"].failures) == {
        "module path layers.1.input_layernorm not selected"
    }


def test_select_by_function_and_build_replacement():
    def build(op, call):
        x, w = call.inputs
        return op.RMSNormalization(x, w, epsilon=1e-6)

    m = _model()
    m.opset_imports[""] = 23
    m.functions[(PKG, "LlamaRMSNorm", "")].opset_imports[""] = 23
    before = util.clone(m)
    rule = ModuleRule("ToOnnx", function=(PKG, "LlamaRMSNorm"), replace_with=build)
    assert rule.anchors == frozenset({(PKG, "LlamaRMSNorm")})
    assert util.rewrite(m, rule).fired == {"ToOnnx": 3}
    util.assert_same_numbers(before, m, atol=1e-5)


def test_optimize_drops_the_replaced_function_but_keeps_others():
    m = _model()
    rule = ModuleRule("K", cls="*.LlamaRMSNorm", replace_with=("com.example", "K"))
    irkit.optimize(m, rules=rule)
    assert list(m.functions) == []
    m = _model()
    irkit.optimize(m)  # default rules: the hierarchy survives
    assert list(m.functions) == [(PKG, "LlamaRMSNorm", "")]
    assert util.ops(m) == {"LlamaRMSNorm": 3}


def test_module_rule_needs_a_selector():
    with pytest.raises(RuleDefinitionError, match="selects nothing"):
        ModuleRule("X", replace_with=("a", "B"))


def test_calls_without_metadata_are_reported():
    m = _model(1)
    m.graph.node(0).metadata_props.pop(metadata.CALL_MODULE)
    report = util.rewrite(m, ModuleRule("X", cls="LlamaRMSNorm", replace_with=("a", "B")))
    assert report.rules["X"].failures == {"call node has no irkit.call metadata": 1}
    np.testing.assert_equal(len(m.graph), 1)


def _fired_layers(rule: ModuleRule) -> list[str]:
    m = _model()
    util.rewrite(m, rule)
    return [n.op_type for n in m.graph]


@pytest.mark.parametrize(
    "modules",
    [
        irkit.ModuleSelector(paths=["layers.[02].*"]),
        irkit.ModuleSelector(classes=["Nothing"], paths=["layers.[02].*"]),
        lambda path, cls: path.startswith(("layers.0.", "layers.2.")) and cls == CLS,
    ],
)
def test_modules_takes_the_selectors_outline_takes(modules):
    """``modules=`` speaks outline's ``functions=`` language; ``path=`` is sugar for it."""
    rule = ModuleRule("K", modules=modules, replace_with=("com.example", "K"))
    sugar = ModuleRule("K", path="layers.[02].*", replace_with=("com.example", "K"))
    assert _fired_layers(rule) == _fired_layers(sugar) == ["K", "LlamaRMSNorm", "K"]
    m = _model()
    report = util.rewrite(m, rule)
    assert set(report.rules["K"].failures) == {
        f"module call layers.1.input_layernorm ({CLS}) not selected"
    }


@pytest.mark.parametrize(
    "classes", [["LlamaRMSNorm"], [CLS], ["*.LlamaRMSNorm"], ["Llama*Norm"], True]
)
def test_class_spellings_select_every_call(classes):
    selections = [classes] if classes is True else [classes, irkit.ModuleSelector(classes)]
    for modules in selections:
        rule = ModuleRule("K", modules=modules, replace_with=("com.example", "K"))
        assert _fired_layers(rule) == ["K", "K", "K"]
    if classes is not True:
        sugar = ModuleRule("K", cls=classes[0], replace_with=("com.example", "K"))
        assert _fired_layers(sugar) == ["K", "K", "K"]


def test_all_given_selectors_must_agree():
    rule = ModuleRule("K", cls="LlamaRMSNorm", modules=["Other"], replace_with=("com.example", "K"))
    assert _fired_layers(rule) == ["LlamaRMSNorm"] * 3
    rule = ModuleRule("K", cls="Other", path="layers.*", replace_with=("com.example", "K"))
    m = _model()
    assert util.rewrite(m, rule).rules["K"].failures == {f"class {CLS} not selected": 3}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"modules": "layers.*"},
            "module rule 'X': modules='layers.*': a single string is ambiguous",
        ),
        ({"modules": [3]}, r"module rule 'X': modules=\.\.\.: 3 is neither a class"),
        ({"modules": 3}, "module rule 'X': modules=3 \\(int\\) is not supported"),
        ({"path": 3}, "module rule 'X': path=3 is not a string glob"),
        ({"cls": ""}, "module rule 'X': cls='' is neither a class nor a class name"),
    ],
)
def test_malformed_selectors_are_rule_definition_errors(kwargs, message):
    with pytest.raises(RuleDefinitionError, match=message):
        ModuleRule("X", replace_with=("a", "B"), **kwargs)
