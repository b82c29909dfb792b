"""Stages compose: each works in place and returns the model; layering is one-way."""

from __future__ import annotations

import subprocess
import sys

import irkit
from tests.hierarchy import builders
from tests.rewriting import util

ROOT = util.GOLDEN.parents[2]


def test_stages_return_the_model_and_compose(tmp_path):
    model = builders.stack(3)
    reference = util.clone(model)
    report = irkit.RewriteReport()
    outlined = irkit.lint(irkit.outline(model))
    path = irkit.save(irkit.lint(irkit.optimize(outlined, report=report)), tmp_path / "m.onnx")
    assert report.nodes_before > report.nodes_after > 0
    loaded = irkit.load(path)
    assert sorted(f.name for f in loaded.functions.values()) == ["Block", "Linear", "ReLU"]
    assert irkit.inline(irkit.rewrite(loaded, irkit.rules.cleanup.rules)) is loaded
    util.assert_same_numbers(reference, loaded)


def test_rewrite_fills_the_report_it_is_given():
    model = util.model(
        '<ir_version: 10, opset_import: ["" : 18]>\n'
        "g (float[2] x) => (float[2] y) { t = Identity(x)  y = Relu(t) }"
    )
    report = irkit.RewriteReport()
    assert irkit.rewrite(model, irkit.rules.cleanup.rules, report=report) is model
    assert report.fired == {"IdentityElimination": 1}
    assert [n.op_type for n in model.graph] == ["Relu"]


def test_the_engine_imports_without_the_rule_library():
    code = (
        "import sys, irkit.rewriting\n"
        "assert 'irkit.rules' not in sys.modules, sorted(m for m in sys.modules if 'irkit' in m)\n"
        "assert 'irkit._pipeline' not in sys.modules\n"
    )
    # irkit.rewriting's own imports pull in the package root; measure the engine alone.
    code = (
        "import sys, types\n"
        + (
            "sys.modules['irkit'] = types.ModuleType('irkit'); sys.modules['irkit'].__path__ = ['irkit']\n"
        )
        + code
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=str(ROOT))


def test_the_layering_lint_rejects_an_upward_import():
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "ruff",
            "check",
            "--no-cache",
            "--select",
            "TID251",
            "--stdin-filename",
            "irkit/rewriting/_probe.py",
            "-",
        ],
        input="from irkit.rules import cleanup\n\n__all__ = ['cleanup']\n",
        capture_output=True,
        text=True,
        cwd=str(ROOT),
    )
    assert result.returncode == 1
    assert "`irkit.rules` is banned" in result.stdout
