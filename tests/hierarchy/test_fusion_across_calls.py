"""Fusion across module boundaries with the hierarchy kept (``irkit.optimize(target="ort")``).

The pipeline opens the module calls (:func:`open_module_calls`), rewrites the flat graph with
the hierarchy guard on, and outlines the same modules again; each fused node belongs to the
deepest module containing all the nodes it replaced.
"""

from __future__ import annotations

import collections

import numpy as np
import onnx_ir as ir
import pytest

import irkit
from irkit import metadata as md
from irkit.hierarchy import open_module_calls
from irkit.rewriting import RewriteReport
from irkit.rules import ort
from tests.helpers import run_ort
from tests.hierarchy.builders import Builder

BLOCK = "pkg.Block"
NORM = "pkg.RMSNorm"
D = 8


def _norm(b: Builder, path: str, x: ir.Value) -> ir.Value:
    with b.module(path, NORM):
        return b.op("RMSNormalization", x, b.weight(f"{path}.weight", [D]), axis=-1, epsilon=1e-5)


def _blocks(n: int) -> ir.Model:
    """``n`` pre-norm residual blocks: ``h = x + relu(norm(x) @ W)``, then ``out = norm(h)``.

    Each block's residual ``Add`` (in the block) feeds the next block's norm (in a child of the
    next block) — a fusion across two calls of ``Block`` — and the last one the final norm.
    """
    b = Builder(opset=23)
    h = b.input("x", [2, 3, D])
    for i in range(n):
        with b.module(f"layers.{i}", BLOCK):
            y = _norm(b, f"layers.{i}.norm", h)
            y = b.op("Relu", b.op("MatMul", y, b.weight(f"layers.{i}.w", [D, D])))
            h = b.op("Add", h, y)
    return b.model([_norm(b, "norm", h)])


def _functions(model: ir.Model) -> dict[str, dict[str, int]]:
    return {
        f.name: dict(collections.Counter(n.op_type for n in f)) for f in model.functions.values()
    }


def test_residual_add_and_child_norm_fuse_into_the_parent_function():
    b = Builder(opset=23)
    x = b.input("x", [2, 3, D])
    r = b.input("r", [2, 3, D])
    with b.module("block", BLOCK):
        s = b.op("Add", x, r)
        y = _norm(b, "block.norm", s)
        out = b.op("Mul", y, s)
    model = irkit.outline(b.model([out]))
    before = ir.serde.deserialize_model(ir.serde.serialize_model(model))
    assert _functions(model) == {
        "RMSNorm": {"RMSNormalization": 1},
        "Block": {"Add": 1, "RMSNorm": 1, "Mul": 1},
    }
    irkit.optimize(model, target="ort", rules=ort.default_rules(skip_norm=True))
    assert _functions(model) == {"Block": {"SkipSimplifiedLayerNormalization": 1, "Mul": 1}}
    fused = next(n for n in model.functions[("pkg", "Block", "")] if n.domain == "com.microsoft")
    assert [f.path for f in md.node_scope(fused.metadata_props)] == ["block"]
    inputs = [np.random.default_rng(0).standard_normal((2, 3, D)).astype(np.float32)] * 2
    np.testing.assert_allclose(run_ort(model, inputs)[0], run_ort(before, inputs)[0], atol=1e-5)


@pytest.mark.parametrize("n", [2, 3])
def test_fusion_at_the_seam_of_two_calls_keeps_the_later_calls_alike(n):
    """Block *i*'s residual ``Add`` (its exit) and block *i+1*'s norm (its entry) fuse between
    the calls, as do the last block's ``Add`` and the final norm: every block after the first
    loses its entry and exit alike and they share one function; the first keeps its norm."""
    model = irkit.outline(_blocks(n))
    before = ir.serde.deserialize_model(ir.serde.serialize_model(model))
    report = RewriteReport()
    irkit.optimize(model, target="ort", rules=ort.default_rules(skip_norm=True), report=report)
    assert report.fired["SkipSimplifiedLayerNormalization"] == n
    assert _functions(model) == {
        "RMSNorm": {"RMSNormalization": 1},
        "Block": {"RMSNorm": 1, "MatMul": 1, "Relu": 1},
        "Block_1": {"MatMul": 1, "Relu": 1},
    }
    assert collections.Counter(n.op_type for n in model.graph) == {
        "Block": 1,
        "Block_1": n - 1,
        "SkipSimplifiedLayerNormalization": n,
    }
    inputs = [np.random.default_rng(1).standard_normal((2, 3, D)).astype(np.float32)]
    np.testing.assert_allclose(run_ort(model, inputs)[0], run_ort(before, inputs)[0], atol=1e-5)


def test_a_fusion_reaching_inside_two_calls_of_one_module_is_refused():
    """Each block's residual sum is also read inside the block (``Sigmoid``, a second output):
    fusing it with the next block's norm (or the last one's with the final norm) would take a
    node from inside the call."""
    b = Builder(opset=23)
    h, gate = b.input("x", [2, 3, D]), b.input("g", [2, 3, D])
    for i in range(2):
        with b.module(f"layers.{i}", BLOCK):
            y = _norm(b, f"layers.{i}.norm", h)
            y = b.op("Relu", b.op("MatMul", b.op("Mul", y, gate), b.weight(f"w{i}", [D, D])))
            h = b.op("Add", h, y)
            gate = b.op("Sigmoid", h)
    model = irkit.outline(b.model([_norm(b, "norm", h), gate]))
    before = ir.serde.deserialize_model(ir.serde.serialize_model(model))
    report = RewriteReport()
    irkit.optimize(
        model,
        target="ort",
        rules=ort.default_rules(skip_norm=True),
        explain="SkipSimplifiedLayerNormalization",
        report=report,
    )
    assert report.fired.get("SkipSimplifiedLayerNormalization", 0) == 0  # (the final norm too)
    assert "spans module calls layers.0, layers.1 but leaves other nodes in layers.0, layers.1" in (
        report.explain(limit=50)
    )
    bodies = [f for f in model.functions.values() if f.name.startswith("Block")]
    assert [collections.Counter(n.op_type for n in f)["Add"] for f in bodies] == [1]  # one body
    rng = np.random.default_rng(1)
    inputs = [rng.standard_normal((2, 3, D)).astype(np.float32) for _ in range(2)]
    for got, want in zip(run_ort(model, inputs), run_ort(before, inputs), strict=True):
        np.testing.assert_allclose(got, want, atol=1e-5)


def test_without_the_guard_the_flat_graph_fuses_across_calls():
    """(What the guard prevents: on a flat graph, the ``"onnx"``-style rewrite fuses freely.)"""
    model = _blocks(2)
    report = RewriteReport()
    irkit.rewrite(model, ort.default_rules(skip_norm=True), report=report)
    assert report.fired["SkipSimplifiedLayerNormalization"] == 2


def test_open_module_calls_returns_the_selection_that_outlines_them_again():
    model = irkit.outline(_blocks(2), ["Block"])  # the user's choice: blocks only
    tree, functions = irkit.function_tree(model), _functions(model)
    opened = open_module_calls(model)
    assert not model.functions and opened == {("layers.0", BLOCK), ("layers.1", BLOCK)}
    irkit.outline(model, lambda path, cls: (path, cls) in opened)
    assert (irkit.function_tree(model), _functions(model)) == (tree, functions)


def test_ort_target_respects_the_functions_choice():
    model = irkit.outline(_blocks(2), ["Block"])
    irkit.optimize(model, target="ort", rules=ort.default_rules(skip_norm=True))
    assert list(_functions(model)) == ["Block", "Block_1"]  # (the first block keeps its norm)
    flat = _blocks(2)
    irkit.optimize(flat, target="ort", rules=ort.default_rules(skip_norm=True))
    assert not flat.functions


def test_fusion_with_the_only_call_of_its_class_is_allowed():
    """dense's bias Add + act's Gelu → BiasGelu in the parent: every parent changes alike."""
    b = Builder(opset=23)
    h = b.input("x", [2, 3, D])
    for i in range(2):
        with b.module(f"layers.{i}", BLOCK):
            with b.module(f"layers.{i}.dense", "torch.nn.Linear"):
                y = b.op("MatMul", h, b.weight(f"layers.{i}.dense.weight", [D, D]))
                y = b.op("Add", y, b.weight(f"layers.{i}.dense.bias", [D]))
            with b.module(f"layers.{i}.act", "pkg.GELU"):
                h = b.op("Gelu", y)
    model = irkit.outline(b.model([h]))
    before = ir.serde.deserialize_model(ir.serde.serialize_model(model))
    irkit.optimize(model, target="ort", rules=ort.default_rules(skip_norm=True))
    assert _functions(model) == {"Linear": {"MatMul": 1}, "Block": {"Linear": 1, "BiasGelu": 1}}
    assert collections.Counter(n.op_type for n in model.graph) == {"Block": 2}
    inputs = [np.random.default_rng(2).standard_normal((2, 3, D)).astype(np.float32)]
    np.testing.assert_allclose(run_ort(model, inputs)[0], run_ort(before, inputs)[0], atol=1e-5)


def test_a_norm_whose_scale_is_computed_in_its_call_fuses_whole():
    """``1 + w`` computed inside each of a block's two norm calls (Gemma's, Qwen3.5's norms; the
    weights are inputs, as streamed weights are: nothing folds the ``Add``): the residual
    ``Add`` and the second norm fuse with that ``Add``, so the norm's call is replaced whole
    and the guard lets it (the blocks' bodies change alike: one fusion in each); so does the
    first block's last ``Add`` with the second block's first norm, at their seam."""
    b = Builder(opset=23)
    h = b.input("x", [2, 3, D])
    scales = [b.input(f"w{i}", [D]) for i in range(4)]

    def norm(path: str, x: ir.Value, w: ir.Value) -> ir.Value:
        with b.module(path, NORM):
            one = b.op("Constant", value=ir.tensor(np.array(1.0, np.float32)))
            return b.op("RMSNormalization", x, b.op("Add", w, one), axis=-1, epsilon=1e-5)

    for i in range(2):
        with b.module(f"layers.{i}", BLOCK):
            y = b.op(
                "MatMul", norm(f"layers.{i}.norm1", h, scales[2 * i]), b.weight(f"w{i}a", [D, D])
            )
            h = b.op("Add", h, y)
            y = b.op(
                "MatMul",
                norm(f"layers.{i}.norm2", h, scales[2 * i + 1]),
                b.weight(f"w{i}b", [D, D]),
            )
            h = b.op("Add", h, y)
    model = irkit.outline(b.model([h]))
    before = ir.serde.deserialize_model(ir.serde.serialize_model(model))
    report = RewriteReport()
    irkit.optimize(model, target="ort", rules=ort.default_rules(skip_norm=True), report=report)
    # each block's second norm with its residual Add, and block 1's first norm with block 0's
    # last Add at their seam (between the calls); block 0's first norm reads the input: kept
    assert report.fired["SkipSimplifiedLayerNormalizationOffset"] == 3
    assert _functions(model) == {
        "RMSNorm": {"Add": 1, "RMSNormalization": 1},
        "Block": {"RMSNorm": 1, "MatMul": 2, "Add": 1, "SkipSimplifiedLayerNormalization": 1},
        "Block_1": {"MatMul": 2, "Add": 2, "SkipSimplifiedLayerNormalization": 1},
    }  # (each Skip's scale 1 + w an Add beside it: onnxruntime folds it at load)
    assert collections.Counter(n.op_type for n in model.graph) == {
        "Block": 1, "Add": 1, "SkipSimplifiedLayerNormalization": 1, "Block_1": 1,
    }  # fmt: skip
    rng = np.random.default_rng(2)
    inputs = [rng.standard_normal((2, 3, D)).astype(np.float32)]
    inputs += [rng.standard_normal(D).astype(np.float32) for _ in scales]
    np.testing.assert_allclose(run_ort(model, inputs)[0], run_ort(before, inputs)[0], atol=1e-5)


def test_nodes_a_pass_made_while_the_calls_were_open_join_their_readers_calls():
    """GPT-J under ``target="ort"``: onnxscript's constant folder writes ``Concat``\\ s (a
    ``repeat_interleave``'s partly known shape) that carry no metadata; before they took their
    readers' scope the outline split each attention, block and the model into convex parts
    (an ``OutlineWarning`` each). Now every module call is one function call again."""
    import warnings

    transformers = pytest.importorskip("transformers")
    from irkit.llm import export_causal_lm

    config = transformers.GPTJConfig(
        n_embd=64, n_layer=2, n_head=4, rotary_dim=8, n_positions=64, vocab_size=100
    )
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    exported = export_causal_lm(model)
    lowered = irkit.lower(exported.program, **exported.lower_kwargs())
    with warnings.catch_warnings():
        warnings.simplefilter("error", irkit.OutlineWarning)
        irkit.optimize(lowered, target="ort")
    names = sorted(f.name for f in lowered.functions.values())
    assert "GPTJAttention" in names and "GPTJBlock" in names
    assert not any(n.startswith(("GPTJAttention_", "GPTJBlock_", "GPTJModel_")) for n in names)
