"""``errors.py``'s promise: every error a user can cause is an irkit error, of a specific class.

Each public entry point gets bad input; the test asserts the exact class (and that it is an
``IrkitError``). A convention test checks that no bare ``IrkitError`` is raised anywhere in
``irkit``.
"""

from __future__ import annotations

import ast
import pathlib

import onnx_ir as ir
import pytest

import irkit
from irkit import errors
from irkit import metadata as md
from irkit.llm import generate_greedy
from tests.hierarchy import builders

ROOT = pathlib.Path(__file__).resolve().parents[1]
RELU = '<ir_version: 10, opset_import: ["" : 21]> g (float[2] x) => (float[2] y) { y = Relu(x) }'


def _relu() -> ir.Model:
    return ir.from_onnx_text(RELU)


def _missing_call() -> ir.Model:
    m = builders.stack(1)
    irkit.outline(m)
    del m.functions[("mypkg", "Block", "")]
    return m


x = irkit.var("x")
CASES = {
    "outline: negative max_depth": (
        lambda: irkit.outline(_relu(), max_depth=-1),
        errors.OutlineError,
    ),
    "outline: one string for functions=": (
        lambda: irkit.outline(_relu(), "layers.*"),
        errors.OutlineError,
    ),
    "outline: malformed scope metadata": (
        lambda: irkit.outline(_with_scope(_relu(), "{")),
        errors.MetadataError,
    ),
    "inline: one string for modules=": (
        lambda: irkit.inline(_relu(), modules="layers.*"),
        errors.OutlineError,
    ),
    "rewrite: explain names no rule": (
        lambda: irkit.rewrite(_relu(), irkit.rules.cleanup.rules, explain="Nope"),
        errors.RewriteError,
    ),
    "rewrite: not a rule": (lambda: irkit.rewrite(_relu(), 42), errors.RuleDefinitionError),
    "rewrite: a buggy check": (
        lambda: irkit.rewrite(
            _relu(),
            irkit.Rule("Bug", irkit.op.Relu(x), check=lambda x: x.shape[9], rewrite=lambda x: x),
        ),
        errors.RewriteError,
    ),
    "optimize: unknown target": (lambda: irkit.optimize(_relu(), "tpu"), errors.RewriteError),
    "save: missing directory": (
        lambda: irkit.save(_relu(), ROOT / "no_such_dir" / "m.onnx"),
        errors.SaveError,
    ),
    "load: missing file": (lambda: irkit.load(ROOT / "no_such_file.onnx"), errors.ModelLoadError),
    "load: not ONNX": (lambda: irkit.load(ROOT / "README.md"), errors.ModelLoadError),
    "check: call to a missing function": (lambda: irkit.check(_missing_call()), errors.CheckError),
    "lint: call to a missing function": (lambda: irkit.lint(_missing_call()), errors.CheckError),
    "Rule: parameter that is not a variable": (
        lambda: irkit.Rule("R", irkit.op.Relu(x), rewrite=lambda y: y),
        errors.RuleDefinitionError,
    ),
    "Rule: empty name": (
        lambda: irkit.Rule("", irkit.op.Relu(x), rewrite=lambda x: x),
        errors.RuleDefinitionError,
    ),
    "pattern: a string input": (lambda: irkit.op.Mul(x, "s"), errors.RuleDefinitionError),
    "either: one alternative": (lambda: irkit.either(x), errors.RuleDefinitionError),
    "RuleSet: not a rule": (lambda: irkit.RuleSet("s", [lambda: 0]), errors.RuleDefinitionError),
    "RuleSet: unknown name": (lambda: irkit.rules.cleanup.rules["Nope"], errors.UnknownRuleError),
    "ModuleRule: selects nothing": (
        lambda: irkit.ModuleRule("M", replace_with=("a", "B")),
        errors.RuleDefinitionError,
    ),
    "function_tree: malformed call metadata": (
        lambda: irkit.function_tree(_with_call(irkit.outline(builders.stack(2)), "[1]")),
        errors.MetadataError,
    ),
    "ModuleSelector: a path that is not a string": (
        lambda: irkit.ModuleSelector(paths=[3]),
        errors.OutlineError,
    ),
    "llm.generate_greedy: 1-d input_ids": (
        lambda: generate_greedy(None, [1, 2], max_new_tokens=1),
        errors.LoweringOptionsError,
    ),
    "quantize: unsupported bits": (
        lambda: irkit.quantize(_relu(), bits=3),
        errors.QuantizationError,
    ),
    "quantize: unsupported block size": (
        lambda: irkit.quantize(_relu(), block_size=48),
        errors.QuantizationError,
    ),
    "metadata: malformed call": (lambda: md.decode_call("[1]"), errors.MetadataError),
    "metadata: malformed scope": (lambda: md.decode_scope("[[1]]"), errors.MetadataError),
    "metadata: malformed signatures": (
        lambda: md.decode_call_signatures("[]"),
        errors.MetadataError,
    ),
}


def _with_call(m: ir.Model, text: str) -> ir.Model:
    next(n for n in m.graph if md.CALL_MODULE in n.metadata_props).metadata_props[
        md.CALL_MODULE
    ] = text
    return m


def _with_scope(m: ir.Model, text: str) -> ir.Model:
    m.graph.node(0).metadata_props[md.SCOPE] = text
    return m


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_raises_the_specific_irkit_error(case):
    call, cls = CASES[case]
    with pytest.raises(errors.IrkitError) as info:
        call()
    assert type(info.value) is cls, f"{type(info.value).__name__}: {info.value}"
    assert str(info.value)


def _no_schema(x):
    from onnxscript import values as osv

    return osv.Op(osv.Opset("com.example", 1), "Frob")(x)


def _split_of_unknown_sizes(x):
    from onnxscript import opset18 as op

    return op.Split(x, op.Shape(x))


@pytest.mark.parametrize(
    ("lowering", "message"),
    [
        (_no_schema, "the ONNX op 'com.example'::Frob (opset 1) has no schema"),
        (_split_of_unknown_sizes, "cannot tell the number of outputs of Split"),
    ],
)
def test_an_op_the_recorder_cannot_record_is_a_lowering_error_naming_the_node(lowering, message):
    """The recorder raises :class:`~irkit.errors.OpCallError` (it cannot tell which FX node it
    records); lowering that node chains it under a :class:`~irkit.errors.LoweringError`."""
    import torch

    ep = torch.export.export(torch.nn.ReLU(), (torch.randn(3),))
    with pytest.raises(errors.LoweringError) as info:
        irkit.lower(ep, custom_lowerings={torch.ops.aten.relu.default: lowering})
    assert info.value.fx_node == "relu"
    assert isinstance(info.value.__cause__, errors.OpCallError)
    assert message in str(info.value)
    assert "custom_lowerings={torch.ops.aten.relu.default: fn}" in str(info.value)


def test_unknown_rule_is_also_a_key_error_with_a_plain_message():
    with pytest.raises(KeyError) as info:
        irkit.rules.cleanup.rules["Nope"]
    assert str(info.value).startswith("no rule 'Nope' in 'cleanup'")


def _bare_irkit_error_raises(path: pathlib.Path) -> list[int]:
    tree = ast.parse(path.read_text())
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
            func = node.exc.func
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
            if name == "IrkitError":
                lines.append(node.lineno)
    return lines


def test_no_bare_irkit_error_anywhere():
    offenders = {
        str(p.relative_to(ROOT)): lines
        for p in sorted((ROOT / "irkit").rglob("*.py"))
        if (lines := _bare_irkit_error_raises(p))
    }
    assert offenders == {}
