"""Golden text dumps and the provenance every ONNX node carries."""

from __future__ import annotations

import inspect
import subprocess
import sys

import onnx_ir as ir
import torch

import irkit
from irkit import metadata
from tests import helpers, zoo
from tests.capabilities import require_round_trip_float_text


def _text(model: ir.Model) -> str:
    return ir.to_onnx_text(model, exclude_initializers=True)


def test_golden_mlp_flat_and_hierarchical():
    ep = zoo.export("mlp")
    helpers.assert_golden(_text(irkit.lower(ep, functions=False)), "lowering/mlp_flat.txt")
    helpers.assert_golden(_text(irkit.lower(ep)), "lowering/mlp.txt")


def test_golden_attention_block():
    require_round_trip_float_text()  # (its scale is a float constant)
    torch.manual_seed(0)
    block = zoo.SelfAttention(16, 2).eval()
    ep = torch.export.export(block, (torch.randn(1, 4, 16),))
    model = irkit.lower(ep, functions=False)
    helpers.assert_golden(_text(model), "lowering/attention_block.txt")
    helpers.assert_close(
        helpers.run_ort(model, [ep.example_inputs[0][0]]),
        helpers.flatten_outputs(block(ep.example_inputs[0][0])),
        1e-5,
    )


class Repeat(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = zoo.MLP(4, 4, 4)

    def forward(self, x):
        return self.a(self.a(x)) * 2


def test_nodes_carry_scope_with_call_index_fx_name_and_source():
    model = irkit.lower(torch.export.export(Repeat(), (torch.randn(2, 4),)), functions=False)
    by_fx = {n.metadata_props[metadata.FX_NODE]: n for n in model.graph}
    first = metadata.node_scope(by_fx["linear"].metadata_props)
    second = metadata.node_scope(by_fx["linear_2"].metadata_props)
    cls = f"{zoo.__name__}.MLP"
    assert first == (
        metadata.Frame("a", 0, cls),
        metadata.Frame("a.fc1", 0, "torch.nn.modules.linear.Linear"),
    )
    assert second == (
        metadata.Frame("a", 1, cls),
        metadata.Frame("a.fc1", 1, "torch.nn.modules.linear.Linear"),
    )
    assert second[-1].call_id == "a.fc1@1"
    assert metadata.node_scope(by_fx["mul"].metadata_props) == ()  # the root module's own op
    line = inspect.getsourcelines(Repeat.forward)[1] + 1
    assert by_fx["mul"].metadata_props[metadata.SOURCE] == f"{__file__}:{line}"
    assert by_fx["linear"].metadata_props[metadata.FX_TARGET] == "aten.linear.default"
    for node in model.graph:
        assert {metadata.SCOPE, metadata.FX_NODE, metadata.FX_TARGET, metadata.SOURCE} <= set(
            node.metadata_props
        )


def test_metadata_survives_save_and_load(tmp_path):
    model = irkit.lower(torch.export.export(Repeat(), (torch.randn(2, 4),)))
    loaded = irkit.load(irkit.save(model, tmp_path / "m.onnx"))
    assert [dict(n.metadata_props) for n in loaded.graph] == [
        dict(n.metadata_props) for n in model.graph
    ]


def test_save_is_byte_identical_across_runs(tmp_path):
    a = irkit.save(irkit.lower(zoo.export("llama")), tmp_path / "a.onnx")
    b = irkit.save(irkit.lower(zoo.export("llama")), tmp_path / "b.onnx")
    assert a.read_bytes() == b.read_bytes()


def test_external_data_on_request(tmp_path):
    model = irkit.lower(zoo.export("mlp"))
    path = irkit.save(model, tmp_path / "ext.onnx", external_data=True)
    # onnx-ir keeps tensors under 256 bytes inline; the weight matrices go to the side file.
    assert (tmp_path / "ext.onnx.data").stat().st_size == sum(
        v.const_value.nbytes
        for v in model.graph.initializers.values()
        if v.const_value.nbytes >= 256
    )
    outputs = helpers.run_ort(path, zoo.load("mlp").args)
    helpers.assert_close(outputs, helpers.flatten_outputs(zoo.load("mlp").eager()), 1e-5)


def test_tied_weights_stay_one_initializer():
    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(10, 4)
            self.head = torch.nn.Linear(4, 10, bias=False)
            self.head.weight = self.emb.weight

        def forward(self, ids):
            return self.head(self.emb(ids))

    module = Tied().eval()
    args = (torch.tensor([[1, 2, 3]]),)
    model = irkit.lower(torch.export.export(module, args))
    assert list(model.graph.initializers) == ["emb.weight"]
    helpers.assert_close(helpers.run_ort(model, args), helpers.flatten_outputs(module(*args)), 1e-5)


def test_import_irkit_does_not_import_torch():
    code = "import sys, irkit; irkit.load; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


class WithConstants(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("scale", torch.full((4,), 2.0), persistent=False)
        self.offset = torch.arange(4.0)  # a plain tensor attribute: lifted as a constant

    def forward(self, x, y):
        return x * self.scale + self.offset, y.sum()


def test_user_names_and_lifted_constants_become_named_initializers():
    module, args = WithConstants(), (torch.randn(2, 4), torch.randn(3))
    ep = torch.export.export(module, args)
    model = irkit.lower(ep, input_names=["features", "extra"], output_names=["scaled", "total"])
    assert [v.name for v in model.graph.inputs] == ["features", "extra"]
    assert [v.name for v in model.graph.outputs] == ["scaled", "total"]
    assert set(model.graph.initializers) == {"scale", "offset"}
    helpers.assert_close(helpers.run_ort(model, args), helpers.flatten_outputs(module(*args)), 1e-6)
