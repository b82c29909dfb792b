"""Runtime assertions and the ops that feed them, against eager.

``torch._check``, ``torch._assert_async`` and ``_check_is_size`` trace to ops that compute nothing
(``_assert_scalar``, ``_assert_async``, ``sym_constrain_range*``): dropped. ``torch.all`` of a bool
tensor inside ``if not torch.all(...)`` traces to ``_is_all_true`` (``torch.any``:
``_is_any_true``), a value: lowered (``ReduceMin``/``ReduceMax``). Vision-language models check
with it that image features and image tokens agree (llava and most of its kind).
"""

from __future__ import annotations

import collections

import numpy as np
import pytest
import torch

import irkit
from tests import helpers

aten = torch.ops.aten


class Checked(torch.nn.Module):
    def forward(self, x, mask):
        torch._assert_async(x.sum() > 0, "x sums to a positive number")
        torch._check(x.shape[0] > 1)
        n = mask.sum().item()
        torch._check(n >= 0)
        torch._check(n <= 100)
        return x * 2, aten._is_any_true(mask), aten._is_all_true(mask)


def _ops(model) -> collections.Counter[str]:
    return collections.Counter(node.op_type for node in model.graph)


@pytest.mark.parametrize("all_true", [False, True])
def test_assertions_are_dropped_and_all_any_true_computed(all_true):
    x = torch.rand(3, 4) + 0.1
    mask = torch.ones(3, 4, dtype=torch.bool) if all_true else torch.rand(3, 4) > 0.5
    mask[0, 0] = True  # any is true; all only when every element is
    module = Checked()
    ep = torch.export.export(module, (x, mask))
    targets = {node.target for node in ep.graph.nodes}
    assert {
        aten._assert_async.msg,
        aten._assert_scalar.default,
        aten._is_all_true.default,
    } <= targets
    model = irkit.lower(ep)
    # Mul for x * 2; each of all/any: Cast to bool, Cast to int64, Reduce, Cast back to bool;
    # nothing for the assertions (their inputs, unused, are not emitted).
    assert _ops(model) == {"Constant": 1, "Mul": 1, "Cast": 6, "ReduceMin": 1, "ReduceMax": 1}
    doubled, any_true, all_true_ = helpers.run_ort(model, [x, mask])
    expected = module(x, mask)
    np.testing.assert_array_equal(doubled, expected[0].numpy())
    assert any_true.shape == () and any_true.dtype == np.bool_ and bool(any_true)
    assert all_true_.shape == () and bool(all_true_) is all_true is bool(expected[2])


class FunctionalAssert(torch.nn.Module):
    def forward(self, x):
        token = aten._make_dep_token()
        token = aten._functional_assert_async.msg(x.sum() > 0, "positive", token)
        return x + 1, token


def test_functional_assertions_pass_their_token_on():
    x = torch.rand(3)
    model = irkit.lower(torch.export.export(FunctionalAssert(), (x,)))
    assert _ops(model) == {"Constant": 2, "Add": 1, "Identity": 1}
    out, token = helpers.run_ort(model, [x])
    np.testing.assert_array_equal(out, (x + 1).numpy())
    assert token.shape == () and token.dtype == np.float32  # torch's token: an empty float


class NoneOutputs(torch.nn.Module):
    def forward(self, x):
        return {"first": x + 1, "nothing": None, "last": x * 3}


def test_none_outputs_have_no_onnx_output_and_the_others_keep_their_keys():
    x = torch.rand(2, 3)
    model = irkit.lower(torch.export.export(NoneOutputs(), (x,)))
    assert [v.name for v in model.graph.outputs] == ["first", "last"]
    first, last = helpers.run_ort(model, [x])
    np.testing.assert_array_equal(first, (x + 1).numpy())
    np.testing.assert_array_equal(last, (x * 3).numpy())


@pytest.mark.slow
def test_llava_base_model_with_its_image_token_check_equals_eager():
    transformers = pytest.importorskip("transformers")
    from bench.tiny_config import tiny_config

    config = tiny_config("llava")
    vision = config.vision_config
    vision.image_size = 64
    torch.manual_seed(0)
    model = transformers.LlavaModel(config).eval()
    n_image = (vision.image_size // vision.patch_size) ** 2
    ids = torch.randint(3, 100, (1, n_image + 4), generator=torch.Generator().manual_seed(1))
    ids[0, 2 : 2 + n_image] = config.image_token_index
    pixels = torch.randn(1, 3, vision.image_size, vision.image_size)
    kwargs = {"input_ids": ids, "pixel_values": pixels, "use_cache": False}
    with torch.no_grad():
        expected = model(**kwargs).last_hidden_state
        ep = torch.export.export(model, (), kwargs, strict=False)
    assert aten._is_all_true.default in {node.target for node in ep.graph.nodes}
    lowered = irkit.optimize(irkit.lower(ep))
    got = helpers.run_ort(lowered, [ids, pixels])[0]
    np.testing.assert_allclose(got, expected.numpy(), atol=helpers.FP32_ATOL, rtol=0)
