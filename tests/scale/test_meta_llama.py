"""A Llama captured on the meta device, lowered without weights, saved with weights streamed from
a sharded ``save_pretrained`` folder: onnxruntime agrees with the real-weight model."""

from __future__ import annotations

import json

import numpy as np
import onnx_ir as ir
import pytest
import torch
import transformers

import irkit
from irkit.weights import WeightlessTensor
from tests.helpers import FP32_ATOL, run_ort

CONFIG = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
)


def _config() -> transformers.LlamaConfig:
    return transformers.LlamaConfig(**CONFIG)


def _ids() -> torch.Tensor:
    return torch.tensor([[3, 17, 42, 250, 7, 99, 1, 0]])


@pytest.fixture(scope="module")
def real():
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(_config()).eval()


@pytest.fixture(scope="module")
def shards(real, tmp_path_factory):
    folder = tmp_path_factory.mktemp("llama")
    real.save_pretrained(folder, max_shard_size="100KB")
    return folder


def _require_a_rotary_embedding_on_meta(module: torch.nn.Module) -> None:
    """Skips where the model's rotary embedding cannot run on the meta device: transformers
    4.54's enters ``torch.autocast(device_type="meta")``, which torch 2.13 refuses
    (``unsupported scalarType``), eagerly and under torch.export alike."""
    hidden = torch.zeros(1, 2, CONFIG["hidden_size"], device="meta")
    try:
        module.model.rotary_emb(hidden, torch.zeros(1, 2, dtype=torch.long, device="meta"))
    except RuntimeError as exc:
        pytest.skip(f"transformers' rotary embedding does not run on meta: {exc}")


@pytest.fixture(scope="module")
def meta_model():
    with torch.device("meta"):
        module = transformers.LlamaForCausalLM(_config()).eval()
    ids = torch.zeros(1, 8, dtype=torch.long, device="meta")
    _require_a_rotary_embedding_on_meta(module)
    ep = torch.export.export(module, (ids,), kwargs={"use_cache": False})
    return irkit.lower(ep)


def _buffers(real) -> dict[str, torch.Tensor]:
    """Non-persistent buffers (rotary inv_freq): save_pretrained leaves them out."""
    return dict(real.named_buffers())


def test_meta_program_lowers_to_weightless_initializers(meta_model):
    inits = meta_model.graph.initializers
    assert all(isinstance(v.const_value, WeightlessTensor) for v in inits.values())
    assert not any(isinstance(v.const_value, ir.Tensor) for v in inits.values())
    q = inits["model.layers.0.self_attn.q_proj.weight"].const_value
    assert (q.dtype, tuple(q.shape)) == (ir.DataType.FLOAT, (64, 64))
    assert "model.rotary_emb.inv_freq" in inits  # a buffer computed in __init__: meta too


def test_weights_streamed_from_shards_match_eager(meta_model, real, shards, tmp_path):
    index = json.loads((shards / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) >= 3  # really several shards
    path = irkit.save(
        meta_model, tmp_path / "llama.onnx", weights=[shards, _buffers(real)], external_data=True
    )
    assert (tmp_path / "llama.onnx.data").stat().st_size > 200_000
    assert all(  # the in-memory model still has no data
        isinstance(v.const_value, WeightlessTensor) for v in meta_model.graph.initializers.values()
    )
    ids = _ids()
    (got,) = run_ort(path, [ids.numpy()])
    with torch.no_grad():
        expected = real(ids, use_cache=False).logits.numpy()
    np.testing.assert_allclose(got, expected, atol=FP32_ATOL, rtol=0)


def test_optimized_outlined_weightless_model_saves_with_sharded_aligned_data(
    meta_model, real, shards, tmp_path, caplog
):
    model = irkit.load(irkit.save(meta_model, tmp_path / "g.onnx"), load_external_data=False)
    irkit.optimize(model)
    irkit.check(model)
    assert "have no data" in caplog.text
    path = irkit.save(
        model,
        tmp_path / "opt.onnx",
        weights=[shards, _buffers(real)],
        max_shard_size="150KB",
        alignment=4096,
    )
    files = sorted(p.name for p in tmp_path.glob("opt.onnx-*-of-*.data"))
    assert len(files) >= 3 and all(
        (tmp_path / f).stat().st_size <= 150_000 + 4096 for f in files
    ), files
    saved = irkit.load(path)
    offsets = [
        v.const_value.offset
        for v in saved.graph.initializers.values()
        if isinstance(v.const_value, ir.ExternalTensor) and v.const_value.nbytes > 4096
    ]
    assert len(offsets) >= 10 and all(o % 4096 == 0 for o in offsets), offsets
    (got,) = run_ort(path, [_ids().numpy()])
    with torch.no_grad():
        expected = real(_ids(), use_cache=False).logits.numpy()
    np.testing.assert_allclose(got, expected, atol=FP32_ATOL, rtol=0)


class _Tied(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(50, 16)
        self.head = torch.nn.Linear(16, 50, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.emb(ids))


@pytest.mark.parametrize("key", ["emb.weight", "head.weight"])
def test_tied_weights_are_one_initializer_found_under_either_name(tmp_path, key):
    torch.manual_seed(0)
    real = _Tied().eval()
    with torch.device("meta"):
        meta = _Tied().eval()
    ids = torch.tensor([[1, 7, 49]])
    model = irkit.lower(torch.export.export(meta, (ids.to("meta"),)))
    assert len(model.graph.initializers) == 1
    path = irkit.save(model, tmp_path / "t.onnx", weights={key: real.emb.weight})
    (got,) = run_ort(path, [ids.numpy()])
    np.testing.assert_allclose(got, real(ids).detach().numpy(), atol=FP32_ATOL, rtol=0)


class _Scaled(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 4)
        self.register_buffer("scale", torch.full((4,), 2.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) * self.scale


def test_program_captured_under_fake_tensor_mode(tmp_path):
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(allow_non_fake_inputs=True):
        ep = torch.export.export(_Scaled(), (torch.randn(2, 8),))
    model = irkit.lower(ep)
    kinds = {k: type(v.const_value) for k, v in model.graph.initializers.items()}
    assert kinds == dict.fromkeys(["fc.weight", "fc.bias", "scale"], WeightlessTensor)
    torch.manual_seed(0)
    real = _Scaled()
    path = irkit.save(model, tmp_path / "s.onnx", weights=real.state_dict())
    x = torch.randn(2, 8)
    (got,) = run_ort(path, [x.numpy()])
    np.testing.assert_allclose(got, real(x).detach().numpy(), atol=FP32_ATOL, rtol=0)
