"""The gallery of custom rules in ``rewrites/``: each rule fires on a model built for it, the op
histogram after is exact, onnxruntime gives the same numbers before and after (where the new op
is a standard one), a near miss says why; and ``docs/rules.md`` shows each file verbatim.
"""

from __future__ import annotations

import pathlib
import re

import numpy as np
import onnx_ir as ir
import pytest

import irkit
from irkit import metadata as md
from rewrites.hard_swish import hard_swish
from rewrites.l2_norm import l2_norm
from rewrites.leaky_relu import leaky_relu
from rewrites.mish import mish
from rewrites.rms_norm_kernel import rms_norm_kernel
from tests.hierarchy.builders import Builder
from tests.rewriting import util

ROOT = pathlib.Path(__file__).resolve().parents[1]
GALLERY = ROOT / "rewrites"
H = '<ir_version: 10, opset_import: ["" : 18]>\n'


def _fires(text: str, rule: irkit.Rule, expected_ops: dict[str, int]) -> ir.Model:
    """``rule`` fires once on the model of ``text``: exact histogram, same onnxruntime numbers."""
    model = util.model(H + text)
    before = util.clone(model)
    report = util.rewrite(model, rule)
    assert report.fired == {rule.name: 1}, str(report)
    assert util.ops(model) == expected_ops
    util.assert_valid(model)
    util.assert_same_numbers(before, model)
    return model


def _near_miss(text: str, rule: irkit.Rule, reason: str) -> None:
    report = util.rewrite(util.model(H + text), rule)
    stats = report.rules[rule.name]
    assert stats.fired == 0 and reason in stats.failures, dict(stats.failures)


RELU6 = "<float three = {3.0}, float zero = {0.0}, float six = {6.0}, float sixth = {0.16666667}>"


@pytest.mark.parametrize(
    "scale", ["y = Div(xr, six)", "y = Mul(xr, sixth)", "y = Mul(sixth, xr)"], ids=str
)
def test_hard_swish_from_relu6(scale):
    text = f"""g (float[2,8] x) => (float[2,8] y) {RELU6} {{
      a = Add(x, three)
      r = Clip(a, zero, six)
      xr = Mul(r, x)
      {scale}
    }}"""
    _fires(text, hard_swish, {"HardSwish": 1})


def test_hard_swish_needs_relu6():
    text = f"""g (float[2,8] x) => (float[2,8] y) {RELU6} {{
      a = Add(x, three)
      r = Clip(a, zero, three)
      xr = Mul(r, x)
      y = Div(xr, six)
    }}"""
    report = util.rewrite(util.model(H + text), hard_swish)
    assert report.fired == {}


@pytest.mark.parametrize(
    "softplus",
    ["sp = Softplus(x)", "e = Exp(x)\n sp1 = Add(e, one)\n sp = Log(sp1)"],
    ids=["Softplus", "log(1+exp)"],
)
def test_mish(softplus):
    text = f"""g (float[2,8] x) => (float[2,8] y) <float one = {{1.0}}> {{
      {softplus}
      t = Tanh(sp)
      y = Mul(x, t)
    }}"""
    _fires(text, mish, {"Mish": 1})


def test_leaky_relu_reads_the_slope_in_its_check():
    text = """g (float[2,8] x) => (float[2,8] y) <float zero = {0.0}, float a = {0.1}> {
      p = Greater(x, zero)
      s = Mul(x, a)
      y = Where(p, x, s)
    }"""
    model = _fires(text, leaky_relu, {"LeakyRelu": 1})
    assert model.graph.node(0).attributes["alpha"].as_float() == pytest.approx(0.1)


def test_leaky_relu_near_miss_says_why():
    text = """g (float[2,8] x) => (float[2,8] y) <float zero = {0.0}, float[8] a = {1,2,3,4,5,6,7,8}> {
      p = Greater(x, zero)
      s = Mul(x, a)
      y = Where(p, x, s)
    }"""
    _near_miss(text, leaky_relu, "the slope is not a one-element constant")


@pytest.mark.parametrize(
    ("square", "keepdims", "out"),
    [("q = Mul(x, x)", 1, "float[2,1] y"), ("q = Pow(x, two)", 0, "float[2] y")],
    ids=["x*x", "Pow"],
)
def test_l2_norm(square, keepdims, out):
    text = f"""g (float[2,8] x) => ({out}) <float two = {{2.0}}, int64[1] axes = {{-1}}> {{
      {square}
      s = ReduceSum<keepdims={keepdims}>(q, axes)
      y = Sqrt(s)
    }}"""
    model = _fires(text, l2_norm, {"ReduceL2": 1})
    assert model.graph.node(0).attributes["keepdims"].as_int() == keepdims


def _two_norms(epsilons: tuple[float, float]) -> ir.Model:
    """Two ``mypkg.RMSNorm`` calls (each x / sqrt(mean(x²) + eps) · weight) around a ReLU,
    outlined."""
    b = Builder(opset=18)
    h = b.input("x", [2, 8])
    for i, eps in enumerate(epsilons):
        weight = b.weight(f"norm{i}.weight", [8])
        with b.module(f"norm{i}", "mypkg.RMSNorm"):
            two = b.op("Constant", value=ir.tensor(np.array(2.0, np.float32)))
            axes = b.op("Constant", value=ir.tensor(np.array([-1], np.int64)))
            epsilon = b.op("Constant", value=ir.tensor(np.array(eps, np.float32)))
            mean = b.op("ReduceMean", b.op("Pow", h, two), axes, keepdims=1)
            h = b.op("Mul", b.op("Div", h, b.op("Sqrt", b.op("Add", mean, epsilon))), weight)
        with b.module(f"act{i}", "torch.nn.modules.activation.ReLU"):
            h = b.op("Relu", h)
    return irkit.outline(b.model([h]))


def test_rms_norm_kernel_replaces_each_module_call():
    model = _two_norms((1e-6, 1e-5))
    assert util.ops(model.graph) == {"RMSNorm": 1, "RMSNorm_1": 1, "ReLU": 2}  # (2 bodies)
    report = util.rewrite(model, rms_norm_kernel)
    assert report.fired == {"FastRMSNorm": 2}
    assert util.ops(model.graph) == {"FastRMSNorm": 2, "ReLU": 2}
    kernels = [n for n in model.graph if n.op_type == "FastRMSNorm"]
    assert [n.domain for n in kernels] == ["com.example"] * 2
    assert [n.attributes["epsilon"].as_float() for n in kernels] == pytest.approx([1e-6, 1e-5])
    assert [md.node_call(n.metadata_props).path for n in kernels] == ["norm0", "norm1"]
    assert [v.name for v in kernels[0].inputs] == ["x", "norm0.weight"]


def test_rms_norm_kernel_declines_another_body():
    model = _two_norms((1e-6, 1e-6))
    rms = next(f for f in model.functions.values() if f.name == "RMSNorm")
    for node in rms:
        if node.op_type == "Add":  # no epsilon: not the norm the kernel implements
            node.replace_input_with(1, node.inputs[0])
    report = util.rewrite(model, rms_norm_kernel)
    assert report.fired == {}
    assert report.rules["FastRMSNorm"].failures["replacement declined"] == 2


# --- The gallery in docs/rules.md ------------------------------------------------------------

_SECTION = re.compile(r"^### `rewrites/(\w+\.py)`\n.*?```python\n(.*?)```", flags=re.S | re.M)


def test_docs_show_each_gallery_file_verbatim():
    """Each ``rewrites/*.py`` (but ``__init__``) is in docs/rules.md's Gallery, as it is."""
    doc = (ROOT / "docs" / "rules.md").read_text(encoding="utf-8")
    gallery = doc[doc.index("## Gallery") :]
    shown = dict(_SECTION.findall(gallery))
    files = {p.name: p.read_text(encoding="utf-8") for p in GALLERY.glob("*.py")}
    files.pop("__init__.py")
    assert sorted(shown) == sorted(files) and len(files) >= 4
    for name, code in files.items():
        assert shown[name] == code, f"docs/rules.md shows another rewrites/{name}: copy it again"


def test_each_gallery_file_is_tested_here():
    """A new gallery file needs its test here (and its place in the table below)."""
    tested = {
        "hard_swish": hard_swish,
        "mish": mish,
        "leaky_relu": leaky_relu,
        "l2_norm": l2_norm,
        "rms_norm_kernel": rms_norm_kernel,
    }
    assert sorted(tested) == sorted(p.stem for p in GALLERY.glob("*.py") if p.stem != "__init__")
