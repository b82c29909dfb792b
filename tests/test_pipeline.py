"""Stages compose: each works in place and returns the model; layering is one-way."""

from __future__ import annotations

import pathlib
import shutil
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


def _lint_imports(root: pathlib.Path) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` (the contract in ``root/pyproject.toml``) on the ``irkit`` in ``root``."""
    code = "from importlinter.cli import lint_imports_command as main; main()"
    return subprocess.run(
        [sys.executable, "-c", code, "--no-cache"],
        capture_output=True,
        text=True,
        cwd=str(root),
        timeout=300,
    )


PROBES = {  # module: (source, the contract it breaks)
    # an upward import, even a lazy one
    "rewriting/_probe_rules.py": ("def f():\n    from irkit.rules import cleanup\n", "layers"),
    "weights/_probe_stage.py": ("from irkit.rewriting import op\n", "layers"),
    # a stage reaching into another stage's private module
    "viz/_probe_private.py": ("from irkit.hierarchy._outline import outline\n", "facades"),
    "weights/_probe_torch.py": ("import torch\n", "torch"),
}
CONTRACTS = {"layers": "irkit's layers", "facades": "facades", "torch": "Only lowering"}


def test_the_layering_contract_rejects_upward_private_and_torch_imports(tmp_path):
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    shutil.copytree(
        ROOT / "irkit", tmp_path / "irkit", ignore=shutil.ignore_patterns("__pycache__")
    )
    for probe, (source, _) in PROBES.items():
        (tmp_path / "irkit" / probe).write_text(source)
    result = _lint_imports(tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    report = result.stdout[result.stdout.index("Broken contracts") :]
    starts = {key: report.index(name) for key, name in CONTRACTS.items()}
    for probe, (_, contract) in PROBES.items():
        section = report[starts[contract] :]
        later = [start for start in starts.values() if start > starts[contract]]
        section = section[: min(later) - starts[contract]] if later else section
        assert f"irkit.{probe[:-3].replace('/', '.')}" in section, (probe, report)
