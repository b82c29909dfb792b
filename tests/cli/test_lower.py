"""``irkit lower`` options on real ``.pt2`` files, outputs run in onnxruntime against eager."""

from __future__ import annotations

import pytest

import irkit
from tests import helpers
from tests.cli.conftest import run

pytestmark = pytest.mark.slow


def test_flat_opset_18_external_data_quiet(files, tmp_path):
    before = files.digests()
    r = run(
        "lower",
        str(files.dir / "stack2.pt2"),
        "-o",
        "flat.onnx",
        "--no-functions",
        "--opset",
        "18",
        "--external-data",
        "-q",
        cwd=tmp_path,
    )
    assert (r.returncode, r.stdout, r.stderr) == (0, "", "")
    model = irkit.load(tmp_path / "flat.onnx")
    assert len(model.functions) == 0
    assert model.opset_imports[""] == 18
    assert (tmp_path / "flat.onnx.data").stat().st_size > 300_000  # 100K float32 weights
    out = helpers.run_ort(tmp_path / "flat.onnx", [files.x])
    helpers.assert_close(out, files.expected, 1e-4)
    assert files.digests() == before


def test_custom_op_is_reported_then_decomposed(files, tmp_path):
    custom = str(files.dir / "custom.pt2")
    imported = ("--import", "tests.cli.custom_ops")
    unsupported = run("lower", custom, "-o", "c.onnx", *imported, cwd=tmp_path)
    assert unsupported.returncode == 1
    lines = unsupported.stderr.splitlines()
    assert lines[0] == (
        f"irkit lower: error: {custom!r}: 1 op(s) in the ExportedProgram have no lowering to ONNX:"
    )
    assert lines[1].startswith("  - irkit_cli_test::scaled_tanh.default  ×1  (first: FX node")
    assert lines[-1] == (
        "  or, on the command line: --decompose-custom-ops traces the Python implementation of "
        "irkit_cli_test::scaled_tanh.default"
    )
    assert not (tmp_path / "c.onnx").exists()

    ok = run("lower", custom, "-o", "c.onnx", *imported, "--decompose-custom-ops", cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    assert "inputs      x  f32[3,8]" in ok.stdout
    out = helpers.run_ort(tmp_path / "c.onnx", [files.custom_x])
    helpers.assert_close(out, files.custom_expected, 1e-5)
