"""The ``functions=`` option, ``max_depth``, errors, and ``irkit.inline``."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest

import irkit
from irkit import metadata as md
from irkit.errors import MetadataError, OutlineError
from tests.helpers import run_ort
from tests.hierarchy import builders as B

X = np.random.default_rng(2).standard_normal((3, B.STACK_D)).astype(np.float32)


class Block:  # stands in for the nn.Module class; only its qualified name matters
    pass


def names(model: ir.Model) -> list[str]:
    return sorted(f"{d}::{n}" for d, n, _ in model.functions)


def called(model: ir.Model) -> list[str]:
    return [n.name for n in model.graph if n.op_identifier() in model.functions]


@pytest.mark.parametrize(
    ("functions", "expected"),
    [
        (True, ["mypkg::Block", "torch.nn.modules::Linear", "torch.nn.modules::ReLU"]),
        (["Linear"], ["torch.nn.modules::Linear"]),
        (["torch.nn.modules.activation.ReLU", "Block"], ["mypkg::Block", "torch.nn.modules::ReLU"]),
        (irkit.ModuleSelector(paths=["*.fc?"]), ["torch.nn.modules::Linear"]),
        (
            irkit.ModuleSelector(classes=["ReLU"], paths=["layers.1"]),
            ["mypkg::Block", "torch.nn.modules::ReLU"],
        ),
        (lambda path, cls: path.endswith(".act"), ["torch.nn.modules::ReLU"]),
    ],
)
def test_functions_option(functions, expected):
    model = B.stack(2)
    ref = run_ort(model, [X])
    irkit.outline(model, functions)
    assert names(model) == expected
    np.testing.assert_allclose(run_ort(model, [X])[0], ref[0], atol=1e-5)


def test_python_type_matches_by_qualified_name():
    b = B.Builder()
    x = b.input("x", [3, B.STACK_D])
    with b.module("blk", f"{Block.__module__}.{Block.__qualname__}"):
        y = b.op("Relu", x)
    model = irkit.outline(b.model([y]), [Block])
    assert names(model) == ["tests.hierarchy::Block"]


def test_max_depth_one_outlines_only_top_level_calls():
    model = irkit.outline(B.stack(2), max_depth=1)
    assert names(model) == ["mypkg::Block"]
    block = model.functions[("mypkg", "Block", "")]
    assert [n.op_type for n in block] == ["MatMul", "Add", "Relu", "MatMul", "Add", "Add"]


def test_single_string_is_rejected_with_a_fix():
    with pytest.raises(OutlineError) as err:
        irkit.outline(B.stack(1), "layers.*")
    assert str(err.value) == (
        "functions='layers.*': a single string is ambiguous. Pass a list of class names "
        "(['layers.*']) or ModuleSelector(paths=['layers.*']) for a path glob."
    )


def test_bad_elements_and_depth_are_rejected():
    with pytest.raises(
        OutlineError, match=r"functions=\.\.\.: 3 is neither a class nor a class name"
    ):
        irkit.outline(B.stack(1), [3])
    with pytest.raises(OutlineError, match=r"max_depth=-1: expected a non-negative int or None"):
        irkit.outline(B.stack(1), max_depth=-1)


def test_inline_everything_round_trips_scopes_and_numbers():
    flat = B.stack(3)
    ref = run_ort(flat, [X])
    flat_scopes = [n.metadata_props[md.SCOPE] for n in flat.graph]
    model = irkit.inline(irkit.outline(B.stack(3)))
    assert model.functions == {} or len(model.functions) == 0
    assert [n.metadata_props[md.SCOPE] for n in model.graph] == flat_scopes
    assert all(md.CALL_MODULE not in n.metadata_props for n in model.graph)
    irkit.check(model)
    np.testing.assert_allclose(run_ort(model, [X])[0], ref[0], atol=1e-6)
    # and it outlines again to the same functions (value names inside differ: shared bodies)
    again, fresh = irkit.outline(model), irkit.outline(B.stack(3))
    assert irkit.function_tree(again) == irkit.function_tree(fresh)
    assert {k: [n.op_type for n in f] for k, f in again.functions.items()} == {
        k: [n.op_type for n in f] for k, f in fresh.functions.items()
    }


def test_selective_inline_by_module_and_by_function():
    model = irkit.outline(B.stack(2))
    irkit.inline(model, modules=["ReLU"])
    assert names(model) == ["mypkg::Block", "torch.nn.modules::Linear"]
    block = model.functions[("mypkg", "Block", "")]
    relu = [n for n in block if n.op_type == "Relu"][0]
    assert md.node_scope(relu.metadata_props)[-1] == md.Frame("layers.0.act", 0, B.RELU)
    irkit.inline(model, lambda f: f.name == "Block")
    assert names(model) == ["torch.nn.modules::Linear"]
    assert called(model) == ["layers.0.fc1", "layers.0.fc2", "layers.1.fc1", "layers.1.fc2"]
    irkit.check(model)
    np.testing.assert_allclose(run_ort(model, [X])[0], run_ort(B.stack(2), [X])[0], atol=1e-6)


def test_functions_and_metadata_survive_save_and_load(tmp_path):
    model = irkit.outline(B.stack(3))
    loaded = irkit.load(irkit.save(model, tmp_path / "m.onnx"))
    assert irkit.function_tree(loaded) == irkit.function_tree(model)
    block = loaded.functions[("mypkg", "Block", "")]
    assert md.decode_scope(block.metadata_props[md.OUTLINE_ORIGIN])[-1].path == "layers.0"
    irkit.inline(loaded)
    assert [n.metadata_props[md.SCOPE] for n in loaded.graph] == [
        n.metadata_props[md.SCOPE] for n in B.stack(3).graph
    ]


def test_malformed_scope_metadata_is_reported_with_the_node():
    model = B.stack(1)
    model.graph.node(0).metadata_props[md.SCOPE] = '[["layers.0", 0]]'
    with pytest.raises(MetadataError) as err:  # (as outline's docstring says)
        irkit.outline(model)
    assert str(err.value).startswith(
        "Node 'matmul_1' (MatMul) has malformed irkit.scope metadata '[[\"layers.0\", 0]]': "
    )
    assert "irkit.metadata.encode_scope" in str(err.value)


def test_inline_by_module_leaves_foreign_functions_alone():
    model = irkit.outline(B.stack(1), ["ReLU"])
    relu = model.functions[("torch.nn.modules", "ReLU", "")]
    call = model.graph.node("layers.0.act")
    del call.metadata_props[md.CALL_MODULE]  # now a call of a function irkit did not outline
    irkit.inline(model, modules=True)
    assert list(model.functions.values()) == [relu]
    irkit.inline(model)
    assert len(model.functions) == 0


def test_class_globs_select_like_module_rule_cls():
    """Outlining and ``ModuleRule`` share one selector: class strings may be globs."""
    assert names(irkit.outline(B.stack(1), ["*.Lin*"])) == ["torch.nn.modules::Linear"]
    assert names(irkit.outline(B.stack(1), irkit.ModuleSelector(classes=["Re?U"]))) == [
        "torch.nn.modules::ReLU"
    ]
    assert irkit.ModuleSelector is irkit.hierarchy.ModuleSelector
