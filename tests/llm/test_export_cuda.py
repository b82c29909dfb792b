"""``irkit export -e cuda`` of a model with per-head Q/K norms (Qwen3): the norms move into
``GroupQueryAttention`` (:mod:`irkit.rules.ort.attention.qk_norm`).

onnxruntime's CPU kernel refuses the op's Q/K norm inputs, so the numbers are checked on a GPU
(``bench/bench_genai_cuda.py``'s logits check, docs/gpu.md); here: the graph (every attention
takes the model's own norm weights and epsilon, no head norm left outside), and that onnxruntime
loads it and its CPU kernel names exactly those inputs when it refuses them (the schema's
inputs 14 and 15, so the folder is one onnxruntime reads).
"""

from __future__ import annotations

import collections
import pathlib

import numpy as np
import onnx
import onnx.inliner
import pytest

from irkit.llm import export

transformers = pytest.importorskip("transformers")

LAYERS = 2
HEAD_DIM = 32
EPS = 1e-6


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, pathlib.Path]:
    """The Hugging Face folder (``hf``) and its ``-e cuda`` export (``cuda``)."""
    import torch

    root = tmp_path_factory.mktemp("qk_norm")
    config = transformers.Qwen3Config(
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=HEAD_DIM,
        vocab_size=300,
        max_position_embeddings=256,
        rms_norm_eps=EPS,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    for layer in model.model.layers:  # norms that are not all ones: the weights must travel
        layer.self_attn.q_norm.weight.data.uniform_(0.5, 1.5)
        layer.self_attn.k_norm.weight.data.uniform_(0.5, 1.5)
    model.save_pretrained(root / "hf")
    cuda = export(root / "hf", root / "cuda", precision="fp16", execution_provider="cuda")
    return {"hf": root / "hf", "cuda": cuda.path}


def _model(folder: pathlib.Path) -> onnx.ModelProto:
    return onnx.inliner.inline_local_functions(onnx.load(str(folder / "model.onnx")))


@pytest.mark.slow
def test_cuda_attention_normalizes_q_and_k_itself(folders):
    from safetensors.numpy import load_file

    cuda = _model(folders["cuda"])
    attentions = [n for n in cuda.graph.node if n.op_type == "GroupQueryAttention"]
    assert len(attentions) == LAYERS
    weights = {i.name: onnx.numpy_helper.to_array(i) for i in cuda.graph.initializer}
    source = [
        (f"model.layers.{i}.self_attn.q_norm.weight", f"model.layers.{i}.self_attn.k_norm.weight")
        for i in range(LAYERS)
    ]
    state = load_file(str(folders["hf"] / "model.safetensors"))
    for attention, (q_name, k_name) in zip(attentions, source, strict=True):
        q_norm, k_norm = attention.input[14], attention.input[15]
        assert weights[q_norm].shape == weights[k_norm].shape == (HEAD_DIM,)
        assert weights[q_norm].dtype == np.float16
        np.testing.assert_array_equal(weights[q_norm], state[q_name].astype(np.float16))
        np.testing.assert_array_equal(weights[k_norm], state[k_name].astype(np.float16))
        epsilon = {a.name: a.f for a in attention.attribute}["qk_norm_epsilon"]
        assert epsilon == pytest.approx(EPS)
    ops = collections.Counter(n.op_type for n in cuda.graph.node)
    # 2 norms a layer and the final one: each fused with the residual add before it
    # (SkipSimplifiedLayerNormalization) but the first layer's first; no head norm outside the op
    assert ops["SkipSimplifiedLayerNormalization"] == 2 * LAYERS, ops
    assert ops["RMSNormalization"] == 1, ops


@pytest.mark.slow
def test_onnxruntime_reads_the_q_k_norm_inputs(folders):
    import onnxruntime as ort

    session = ort.InferenceSession(
        str(folders["cuda"] / "model.onnx"), providers=["CPUExecutionProvider"]
    )
    feeds = {}
    for i in session.get_inputs():
        shape = [1 if isinstance(d, str) or d is None else d for d in i.shape]
        if i.name == "attention_mask":
            shape = [1, 256 + 1] if len(shape) == 2 else shape
        dtype = {"tensor(int64)": np.int64, "tensor(float16)": np.float16}[i.type]
        feeds[i.name] = np.ones(shape, dtype=dtype)
    with pytest.raises(Exception, match="q_norm_weight / k_norm_weight inputs are not supported"):
        session.run(None, feeds)
