"""Outlining models lowered from torch.export: hand-written modules and the public zoo."""

from __future__ import annotations

import warnings

import onnx_ir as ir
import pytest
import torch
from torch import nn

import irkit
from irkit import metadata as md
from tests import zoo
from tests.helpers import assert_close, flatten_outputs, run_ort
from tests.hierarchy.golden import check_golden

torch.manual_seed(0)


class Inner(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        return torch.relu(self.lin(x))


class Nested(nn.Module):
    """Nested modules, and a functional op of the parent between two child calls."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = Inner(), Inner()

    def forward(self, x):
        return self.b(torch.tanh(self.a(x)))


class Twice(nn.Module):
    """One module instance called twice: two call sites of one function."""

    def __init__(self) -> None:
        super().__init__()
        self.enc = Inner()

    def forward(self, x):
        return self.enc(torch.tanh(self.enc(x)))


class Loop(nn.Module):
    def __init__(self, n: int = 3) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Inner() for _ in range(n))

    def forward(self, x):
        for layer in self.layers:
            x = x + layer(x)
        return x


class PairOut(nn.Module):
    def forward(self, x):
        return x + 1, x * 2


class DictOut(nn.Module):
    def forward(self, x):
        return {"s": torch.sigmoid(x), "t": torch.tanh(x), "unused": torch.exp(x)}


class Outputs(nn.Module):
    """A module returning a tuple, one returning a dict (with an unused entry)."""

    def __init__(self) -> None:
        super().__init__()
        self.pair, self.dict = PairOut(), DictOut()

    def forward(self, x):
        p, q = self.pair(x)
        d = self.dict(q)
        return p - d["s"], d["t"]


class Scaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("scale", torch.full((8,), 0.5))

    def forward(self, x):
        return x * self.scale


class Tied(nn.Module):
    """A buffer, and an embedding tied to the output projection."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(16, 8)
        self.scaled = Scaled()
        self.head = nn.Linear(8, 16, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids):
        return self.head(self.scaled(self.emb(ids)))


X = torch.randn(4, 8)
CASES = {
    "nested": (Nested, (X,), None),
    "twice": (Twice, (X,), None),
    "loop": (Loop, (X,), None),
    "outputs": (Outputs, (X,), None),
    "tied": (Tied, (torch.randint(0, 16, (2, 5)),), None),
    "loop_dynamic": (Loop, (X,), ({0: torch.export.Dim("batch", max=64)},)),
}


def lower_case(name: str):
    cls, args, dyn = CASES[name]
    torch.manual_seed(0)
    module = cls().eval()
    with torch.no_grad():
        ep = torch.export.export(module, args, dynamic_shapes=dyn)
        eager = flatten_outputs(module(*args))
    return irkit.lower(ep, functions=False), args, eager


def outline_and_verify(model: ir.Model, args, eager, **kwargs) -> ir.Model:
    flat = run_ort(model, list(args))
    assert_close(flat, eager, atol=1e-4)
    irkit.outline(model, **kwargs)
    irkit.check(irkit.lint(model))
    outlined = run_ort(model, list(args))
    assert_close(outlined, flat, atol=1e-5)
    assert_close(outlined, eager, atol=1e-4)
    return model


@pytest.mark.parametrize("name", sorted(CASES))
def test_hand_written_modules(name):
    model, args, eager = lower_case(name)
    with warnings.catch_warnings():
        warnings.simplefilter("error", irkit.OutlineWarning)
        outline_and_verify(model, args, eager)
    check_golden(f"torch_{name}_tree.txt", irkit.function_tree(model, sizes=False))


def test_twice_has_two_call_sites_of_one_function():
    model, args, eager = lower_case("twice")
    outline_and_verify(model, args, eager)
    sites = [n for n in model.graph if n.op_identifier() in model.functions]
    assert [n.name for n in sites] == ["enc", "enc@1"]
    assert len({n.op_identifier() for n in sites}) == 1


def test_loop_dynamic_batch_dim_in_function_types():
    model, args, eager = lower_case("loop_dynamic")
    outline_and_verify(model, args, eager)
    inner = model.functions[("tests.hierarchy", "Inner", "")]
    assert str(inner.inputs[0].shape) == "[batch,8]"
    assert all(str(v.shape).startswith("[batch") for v in inner.outputs)


def test_unused_dict_entry_is_not_a_function_output():
    model, args, eager = lower_case("outputs")
    outline_and_verify(model, args, eager)
    fn = model.functions[("tests.hierarchy", "DictOut", "")]
    assert len(fn.outputs) == 2  # sigmoid and tanh; exp is not used (and lowering may drop it)


def test_conflated_calls_are_split_back_into_two_calls():
    """Stamp both calls of ``enc`` with call index 0 — what the old Modularize pass did — so the
    "one call" spans a parent op (tanh): the region is not convex; it is split into two convex
    parts, which share one function again."""
    model, args, eager = lower_case("twice")
    for node in model.graph:
        scope = md.node_scope(node.metadata_props)
        if scope:
            node.metadata_props[md.SCOPE] = md.encode_scope(
                tuple(md.Frame(f.path, 0, f.cls) for f in scope)
            )
    with pytest.warns(
        irkit.OutlineWarning,
        match=r"module call 'enc' \(tests.hierarchy.test_outline_torch.Inner\) split into 2 convex parts",
    ):
        outline_and_verify(model, args, eager)
    assert [(n.name, n.op_type) for n in model.graph] == [
        ("enc/part0", "Inner"),
        ("tanh", "Tanh"),
        ("enc/part1", "Inner"),
    ]
    assert len(model.functions) == 2  # Inner and Linear, each shared by both parts


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gpt2", "bert", "llama", "cnn", "gpt2_dynamic"])
def test_zoo(name):
    zm = zoo.load(name)
    model = irkit.lower(zoo.export(name), functions=False)
    outline_and_verify(model, zm.args, flatten_outputs(zm.eager()))
    check_golden(f"zoo_{name}_tree.txt", irkit.function_tree(model, sizes=False))


def _layer_functions(model: ir.Model, cls: str) -> list[str]:
    return [f"{d}::{n}" for (d, n, _), f in model.functions.items() if f.doc_string.endswith(cls)]


# (config class, model class, decoder-layer class suffix, config kwargs; "{n}" = layer count)
_TINY_LMS = {
    "gpt2": ("GPT2Config", "GPT2Model", ".GPT2Block", "n_layer", {
        "n_embd": 32, "n_head": 2, "vocab_size": 64, "n_positions": 32,
        "use_cache": False, "bos_token_id": 0, "eos_token_id": 0}),
    "llama": ("LlamaConfig", "LlamaModel", ".LlamaDecoderLayer", "num_hidden_layers", {
        "hidden_size": 32, "num_attention_heads": 2, "num_key_value_heads": 1,
        "intermediate_size": 64, "vocab_size": 64, "max_position_embeddings": 32,
        "use_cache": False}),
}  # fmt: skip


def _transformers_model(kind: str, layers: int):
    import transformers

    config_cls, model_cls, layer_cls, layers_key, kwargs = _TINY_LMS[kind]
    torch.manual_seed(0)
    config = getattr(transformers, config_cls)(**kwargs, **{layers_key: layers})
    return getattr(transformers, model_cls)(config).eval(), layer_cls


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_n_layers_give_one_decoder_layer_function(kind):
    module, cls = _transformers_model(kind, 4)
    ids = torch.randint(0, 64, (2, 6))
    with torch.no_grad():
        ep = torch.export.export(module, (ids,))
        eager = flatten_outputs(module(ids))
    model = outline_and_verify(irkit.lower(ep, functions=False), (ids,), eager)
    assert len(_layer_functions(model, cls)) == 1
    layer = _layer_functions(model, cls)[0]
    tree = irkit.function_tree(model, sizes=False)
    assert f"  {layer}  calls=4" in tree.splitlines()
    top = [n.op_type for n in model.graph if n.op_identifier() in model.functions]
    assert top.count(layer.split("::")[1]) == 4


@pytest.mark.parametrize("name", ["twice", "loop"])
def test_inline_restores_every_scope(name):
    model, args, eager = lower_case(name)
    flat_scopes = sorted(n.metadata_props.get(md.SCOPE, "") for n in model.graph)
    irkit.inline(irkit.outline(model))
    assert len(model.functions) == 0
    assert sorted(n.metadata_props.get(md.SCOPE, "") for n in model.graph) == flat_scopes
    irkit.check(model)
    assert_close(run_ort(model, list(args)), eager, atol=1e-4)


@pytest.mark.slow
def test_zoo_stack4_is_one_block_function_called_four_times():
    zm = zoo.load("stack4")
    model = outline_and_verify(
        irkit.lower(zoo.export("stack4"), functions=False), zm.args, flatten_outputs(zm.eager())
    )
    tree = irkit.function_tree(model, sizes=False).splitlines()
    assert "  tests::PreLNBlock  calls=4" in tree
    assert [n.op_type for n in model.graph] == ["PreLNBlock"] * 4 + ["LayerNorm"]


def call_signatures(ep: torch.export.ExportedProgram) -> irkit.CallSignatures:
    """What ``irkit.lower`` stores in the model for ``outline`` (``irkit.call_signatures``)."""
    flat = irkit.lower(ep, functions=False)
    return irkit.metadata.decode_call_signatures(
        flat.metadata_props.get(irkit.metadata.CALL_SIGNATURES)
    )


def test_call_signatures_from_preserved_module_calls():
    module = Outputs().eval()
    with torch.no_grad():
        ep = torch.export.export(module, (X,), preserve_module_call_signature=("pair", "dict"))
        eager = flatten_outputs(module(X))
    sigs = call_signatures(ep)
    assert sigs == {"pair": (["x"], ["add", "mul"]), "dict": (["mul"], ["sigmoid", "tanh", "exp"])}
    model = outline_and_verify(irkit.lower(ep, functions=False), (X,), eager, call_signatures=sigs)
    pair = model.functions[("tests.hierarchy", "PairOut", "")]
    dict_fn = model.functions[("tests.hierarchy", "DictOut", "")]
    assert [v.name for v in pair.outputs] == ["add", "mul"]
    assert [v.name for v in dict_fn.inputs] == ["mul"]
    assert [v.name for v in dict_fn.outputs] == ["sigmoid", "tanh"]  # exp is unused


@pytest.mark.slow
def test_outline_after_cse_still_dedupes_the_stack():
    from onnx_ir.passes.common import CommonSubexpressionEliminationPass, RemoveUnusedNodesPass

    zm = zoo.load("stack4")
    model = irkit.lower(zoo.export("stack4"), functions=False)
    CommonSubexpressionEliminationPass()(model)
    RemoveUnusedNodesPass()(model)
    outline_and_verify(model, zm.args, flatten_outputs(zm.eager()))
    assert "  tests::PreLNBlock  calls=4" in irkit.function_tree(model, sizes=False).splitlines()
    assert [n.op_type for n in model.graph] == ["PreLNBlock"] * 4 + ["LayerNorm"]


@pytest.mark.slow
@pytest.mark.parametrize("order", ["optimize_then_outline", "outline_then_optimize"])
def test_outline_and_optimize_in_either_order(order):
    zm = zoo.load("llama")
    model = irkit.lower(zoo.export("llama"), functions=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", irkit.OutlineWarning)
        steps = [irkit.optimize, irkit.outline]
        for step in steps if order == "optimize_then_outline" else steps[::-1]:
            step(model)
    irkit.check(model)
    assert_close(run_ort(model, list(zm.args)), flatten_outputs(zm.eager()), atol=1e-4)
    tree = irkit.function_tree(model, sizes=False).splitlines()
    assert "  transformers.models.llama::LlamaDecoderLayer  calls=2" in tree
    assert not any("LlamaDecoderLayer_1" in line for line in tree)
