"""The public zoo: lower, save, run in onnxruntime, compare with eager PyTorch."""

from __future__ import annotations

import pytest
import torch

import irkit
from tests import helpers, zoo

ZOO = ["mlp", "cnn", "gpt2", "bert", "llama"]


@pytest.mark.parametrize("name", ZOO)
def test_zoo_model_matches_eager(name, tmp_path):
    zm = zoo.load(name)
    model = irkit.lower(zoo.export(name))
    path = irkit.save(model, tmp_path / f"{name}.onnx")
    import onnx

    onnx.checker.check_model(str(path), full_check=True)
    loaded = irkit.load(path)
    outputs = helpers.run_ort(loaded, zm.args)
    expected = helpers.flatten_outputs(zm.eager())
    helpers.assert_close(outputs, expected, helpers.FP32_ATOL)


def test_dynamic_batch_and_sequence_run_at_two_sizes():
    zm = zoo.load("gpt2_dynamic")
    model = irkit.lower(zoo.export("gpt2_dynamic"))
    (inp,) = model.graph.inputs
    assert [str(d) for d in inp.shape] == ["batch", "seq"]
    assert [str(d) for d in model.graph.outputs[0].shape] == ["batch", "seq", "64"]
    for batch, seq in [(1, 5), (3, 11)]:
        ids = torch.randint(0, 128, (batch, seq), generator=torch.Generator().manual_seed(batch))
        outputs = helpers.run_ort(model, [ids])
        helpers.assert_close(outputs, helpers.flatten_outputs(zm.eager(ids)), helpers.FP32_ATOL)


def test_outputs_are_named_after_their_keys():
    model = irkit.lower(zoo.export("bert"))
    assert [v.name for v in model.graph.outputs] == ["last_hidden_state", "pooler_output"]
    assert [v.name for v in model.graph.inputs] == ["input_ids"]


def test_initializers_are_named_by_fqn_and_share_torch_storage():
    ep = zoo.export("gpt2")
    model = irkit.lower(ep)
    inits = model.graph.initializers
    assert "h.0.attn.c_attn.weight" in inits
    weight = ep.state_dict["h.0.attn.c_attn.weight"]
    array = inits["h.0.attn.c_attn.weight"].const_value.numpy()
    # Zero copy: the ONNX tensor reads the very memory of the torch parameter.
    assert array.__array_interface__["data"][0] == weight.data_ptr()


def test_every_zoo_node_is_plain_onnx_without_leftover_functions():
    model = irkit.lower(zoo.export("llama"), functions=False)
    assert not model.functions  # torchlib script functions are inlined
    assert {n.domain for n in model.graph} == {""}
