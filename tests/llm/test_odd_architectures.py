"""Causal LMs that exercised an irkit mechanism the zoo's Llama-likes do not, against eager.

* doge computes its attention mask from the cached values: fusing the cache into one
  ``Attention`` would make the graph cyclic, which the rewrite engine refuses
  (``irkit/rewriting/_acyclic.py``).
* deepseek_v2 and llama4 rotate with complex frequencies (``polar``, ``view_as_complex``,
  ``unsqueeze`` and a product of complex tensors: ``irkit/lowering/_complex.py``).
* afmoe routes tokens with ``topk`` of sigmoid scores. transformers zero-initializes its router,
  so every expert ties and torch's CPU ``topk`` and ONNX ``TopK`` (lower index first) pick
  different experts — both valid top-k (``tests/lowering/test_topk.py``); the router here gets
  random weights, as a trained checkpoint has distinct scores.

Each model (two layers, hidden size 64, random weights, seed 0) is exported with
:func:`irkit.llm.export_causal_lm`, lowered, optimized for the target, and run in onnxruntime
(graph optimizations off) for a prefill and a decode step against eager PyTorch.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest

import irkit
from irkit.llm import causal_lm_feeds, export_causal_lm, run_eager
from irkit.rewriting._acyclic import CYCLE
from tests.helpers import FP32_ATOL, assert_close, ort_session

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

pytestmark = pytest.mark.slow

_BASE: dict[str, Any] = {
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 128,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
_MOE = {"num_experts_per_tok": 2, "moe_intermediate_size": 32}

CONFIGS: dict[str, dict[str, Any]] = {
    "doge": {},
    "afmoe": {**_MOE, "num_experts": 8, "num_shared_experts": 1, "num_dense_layers": 1},
    "deepseek_v2": {
        **_MOE,
        "num_key_value_heads": 4,  # multi-head latent attention: as many K/V heads as queries
        "kv_lora_rank": 32,
        "q_lora_rank": 48,
        "qk_nope_head_dim": 16,
        "qk_rope_head_dim": 8,
        "v_head_dim": 16,
        "head_dim": 8,
        "n_routed_experts": 8,
        "n_shared_experts": 1,
        "first_k_dense_replace": 1,
    },
    "llama4_text": {
        "head_dim": 16,
        "intermediate_size_mlp": 128,
        "num_local_experts": 4,
        "num_experts_per_tok": 1,
        "attention_chunk_size": 8,
        "no_rope_layers": [1, 0],  # one rotary layer, one NoPE layer
        "layer_types": ["chunked_attention", "full_attention"],
    },
}


@functools.cache
def _model(name: str) -> Any:
    config = transformers.AutoConfig.for_model(name, **{**_BASE, **CONFIGS[name]})
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    if name == "afmoe":
        with torch.no_grad():  # a trained router: distinct scores, no ties (module docstring)
            for layer in model.model.layers[config.num_dense_layers :]:
                layer.mlp.router.gate.weight.normal_(0.0, config.initializer_range)
    return model


@functools.cache
def _exported(name: str) -> Any:
    return export_causal_lm(_model(name))


def _check(name: str, target: str) -> irkit.RewriteReport:
    model, exported = _model(name), _exported(name)
    onnx_model = irkit.lower(exported.program, **exported.lower_kwargs())
    report = irkit.RewriteReport()
    irkit.optimize(onnx_model, target=target, report=report)
    if target == "onnx":  # (ONNX's shape inference knows no com.microsoft op)
        irkit.check(onnx_model)
    session = ort_session(onnx_model)
    names = {i.name for i in session.get_inputs()}
    for past, seq in ((0, 5), (4, 1)):  # prefill, decode step
        feeds = causal_lm_feeds(model, batch=2, seq=seq, past=past, layout=exported.cache)
        actual = session.run(None, {k: v for k, v in feeds.items() if k in names})
        assert_close(actual, run_eager(model, feeds), FP32_ATOL)
    return report


@pytest.mark.parametrize("target", ["onnx", "ort"])
@pytest.mark.parametrize("name", ["doge", "afmoe", "deepseek_v2", "llama4_text"])
def test_onnxruntime_equals_eager(name, target):
    _check(name, target)


def test_doge_cache_fusion_is_refused_as_a_cycle():
    report = _check("doge", "onnx")
    stats = report.rules["AttentionKVCache"]
    assert stats.fired == 0
    # the mask reads the present value; once: both layers call one DogeAttention function
    assert stats.failures[CYCLE] == 1


@pytest.mark.parametrize(
    ("model_type", "reason"),
    [
        # takes the whole sequence each step: a bare assert of the model, named by file and line
        (
            "xlm",
            r"AssertionError at xlm/modeling_xlm\.py:\d+: assert mask\.size\(\) == \(bs, slen\)",
        ),
        # compressor buffers of a varying length and Python counters in its own layer classes
        (
            "deepseek_v4",
            r"DeepseekV4ForCausalLM's cache layers are classes of its own, "
            r"DeepseekV4CSACache \('compressed_sparse_attention'\), DeepseekV4HCACache",
        ),
    ],
)
def test_what_cannot_export_is_one_error_with_its_reason(model_type, reason):
    from bench.tiny_config import tiny_model
    from irkit.errors import ExportError

    with pytest.raises(ExportError, match=reason) as caught:
        export_causal_lm(tiny_model(model_type))
    assert "Remedy:" in str(caught.value)
    # (longcat_flash and zaya export now: tests/llm/test_export_without_cache.py)
    assert "export_causal_lm(model, cache=False)" in str(caught.value)


@pytest.mark.parametrize(("model_type", "whole"), [("zaya", True), ("mamba2", False)])
def test_a_conv_state_is_carried_whole_only_where_its_oldest_column_is_read(model_type, whole):
    """ZAYA's two stacked width-2 convolutions keep exactly their joint left context (2
    columns) and read both; Mamba2's width-K convolution never reads the oldest of the K columns
    transformers keeps, and irkit carries K - 1 (genai's ``conv_cache_size``). Probed with a
    NaN, even through ZAYA's zero-initialized key scale and an attention kernel that drops
    NaN scores."""
    from bench.tiny_config import tiny_model
    from irkit.llm import cache_layout

    model = tiny_model(model_type)
    convs = [spec for spec in cache_layout(model).states if spec.kind.name == "conv"]
    assert convs
    kept = {m.conv_kernel_size if isinstance(m.conv_kernel_size, int) else None
            for m in model.modules() if hasattr(m, "conv_kernel_size")} - {None}  # fmt: skip
    assert len(kept) == 1
    width = kept.pop()
    assert {spec.shape[-1] for spec in convs} == {width if whole else width - 1}
    assert {type(spec.kind).__name__ for spec in convs} == {"_WholeConv" if whole else "_Conv"}
