"""irkit.check reports what the installed onnxruntime (CPU) cannot run; irkit._runtime is where
irkit asks onnxruntime (optional: without it nothing is reported)."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime
import pytest

import irkit
from irkit import _runtime
from irkit.cli import main
from tests.helpers import ort_session

_MODEL = '<ir_version: 10, opset_import: ["" : {opset}]> g (float[2] x, float[2] y) => (float[2] z) {{ {body} }}'


def _model(opset: int, body: str = "z = Add(x, y)") -> ir.Model:
    return ir.from_onnx_text(_MODEL.format(opset=opset, body=body))


def test_newest_opset_is_what_onnxruntime_loads():
    newest = _runtime.newest_opset("")
    assert newest is not None and newest >= 23
    ort_session(_model(newest))  # loads
    with pytest.raises(
        Exception, match=f"official support for domain ai.onnx is till opset {newest}"
    ):
        ort_session(_model(newest + 1))
    assert _runtime.newest_opset("ai.onnx.ml") is not None
    assert _runtime.newest_opset("some.custom.domain") is None  # (no kernels: not checked)


def test_check_reports_an_opset_onnxruntime_refuses():
    model = _model(99)
    irkit.check(model, runtime=False)  # (the ONNX checker accepts it)
    with pytest.raises(irkit.CheckError) as info:
        irkit.check(model)
    newest = _runtime.newest_opset("")
    assert info.value.problems[0] == (
        f"the model imports opset 99 of the default domain; onnxruntime "
        f"{onnxruntime.__version__} loads opsets up to {newest} of it (it refuses the file)."
    )
    assert str(info.value).startswith("onnxruntime cannot run the model (")


def test_check_reports_an_op_version_without_kernel():
    model = _model(6)  # Add-6: onnxruntime's kernels start at Add-7
    with pytest.raises(irkit.CheckError) as info:
        irkit.check(model)
    (problem,) = info.value.problems
    assert problem.startswith(
        f"onnxruntime {onnxruntime.__version__} has no CPU kernel for Add version 6 (opset 6); "
        "its kernels implement versions 7-12, 13, 14"
    ), problem
    with pytest.raises(Exception, match="Could not find an implementation for Add"):
        ort_session(model)  # (what onnxruntime says)


def test_check_accepts_what_onnxruntime_runs():
    model = _model(13, "c = Constant<value=float[2] {1.0, 2.0}>()  s = Add(x, c)  z = Mul(s, y)")
    ort_session(model)
    assert irkit.check(model) is model
    assert _runtime.runtime_problems(model) == []


def test_without_onnxruntime_nothing_is_reported(monkeypatch):
    monkeypatch.setattr(_runtime, "ort_version", lambda: None)
    assert _runtime.runtime_problems(_model(99)) == []
    irkit.check(_model(99))


def test_irkit_check_command_lists_the_problems(tmp_path, capsys):
    irkit.save(_model(99), tmp_path / "m.onnx")
    assert main(["check", str(tmp_path / "m.onnx")]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.splitlines()
    assert lines[0] == f"irkit check: error: '{tmp_path / 'm.onnx'}': 1 problem(s)"
    assert lines[1].startswith("  the model imports opset 99 of the default domain; onnxruntime")
    assert main(["check", "--no-runtime-check", str(tmp_path / "m.onnx")]) == 0


_CONTRIB = """<ir_version: 10, opset_import: ["" : 21, "pkg" : 1]>
g (float[2,3] x, float[3,4] w) => (float[2,4] y) {{ y = pkg.Outer(x, w) }}
<domain: "pkg", opset_import: ["" : 21, "pkg" : 1]>
Outer (a, b) => (c) {{ m = pkg.Block(a, b)  c = Relu(m) }}
<domain: "pkg", opset_import: ["" : 21, "com.microsoft" : 1]>
Block (a, b) => (c) {{ c = com.microsoft.FusedMatMul<alpha: float = {alpha}>({inputs}) }}"""


def test_check_types_contrib_ops_in_function_bodies_with_onnxruntime():
    # onnx's strict inference leaves FusedMatMul's output untyped, so the Relu of the calling
    # function fails; onnxruntime's inference knows the contrib op and is the strict check
    model = ir.from_onnx_text(_CONTRIB.format(alpha="2.0", inputs="a, b"))
    with pytest.raises(onnx.shape_inference.InferenceError, match="expected to have type"):
        onnx.checker.check_model(ir.serde.serialize_model(model), full_check=True)
    assert _runtime.unknown_to_onnx(model) == ["com.microsoft::FusedMatMul"]
    assert irkit.check(model) is model
    session = ort_session(model)
    x, w = np.ones((2, 3), np.float32), np.ones((3, 4), np.float32)
    np.testing.assert_array_equal(session.run(None, {"x": x, "w": w})[0], np.full((2, 4), 6.0))


def test_check_reports_what_onnxruntime_inference_rejects_in_a_contrib_op():
    model = ir.from_onnx_text(_CONTRIB.format(alpha="1.0", inputs="a, a"))  # (2,3) @ (2,3)
    with pytest.raises(irkit.CheckError, match=r"onnxruntime's type and shape inference "
                       r"rejected the model \(it uses com.microsoft::FusedMatMul"):  # fmt: skip
        irkit.check(model)
    irkit.check(model, runtime=False)  # (onnx's checker alone: no schema, nothing to refuse)
