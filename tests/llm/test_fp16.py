"""float16 export of causal LMs: the fusions fire as in float32, numbers in onnxruntime CPU.

Tiny Llama / Qwen2 / Phi-3 (random weights) in float16: the lowered and optimized graph has the
float32 graph's ops exactly, plus the two Casts of the rotary cos/sin that transformers writes
(``RMSNormalization`` through the Cast(float32) … Cast(float16) norm, ``SkipSimplified…`` on the
``"ort"`` target); logits and present keys/values within 5e-3 of eager float16 and of eager
float32. A bfloat16 ``save_pretrained`` folder exports as float16 (tensors converted while
streamed) and as float32. Gemma's embedding scale is refused when it would overflow.
"""

from __future__ import annotations

import collections
import functools

import numpy as np
import pytest

import irkit
from irkit.errors import LoweringOptionsError, WeightsError
from irkit.llm import causal_lm_feeds, export_causal_lm, run_eager
from irkit.llm._precision import Precision, check_half_range, convert_model, meta_model
from irkit.rules import ort
from tests.helpers import assert_close, ort_session

torch = pytest.importorskip("torch")

ATOL = 5e-3  # float16 logits of a tiny random model are ~0.1: ~3 half ulps of them


def test_precision_names():
    assert Precision.parse("fp16") is Precision.FP16
    assert Precision.parse(Precision.FP32) is Precision.FP32
    with pytest.raises(LoweringOptionsError, match="do not run bfloat16 graphs"):
        Precision.parse("bf16")
    with pytest.raises(LoweringOptionsError, match="'int3' is not one of fp32, fp16"):
        Precision.parse("int3")


def test_convert_model_copies():
    linear = torch.nn.Linear(4, 4)
    linear.register_buffer("inv_freq", torch.ones(2), persistent=False)
    half = convert_model(linear, "fp16")
    assert half is not linear and half.weight.dtype == torch.float16
    assert half.inv_freq.dtype == torch.float32  # buffers keep the dtype they were built in
    assert linear.weight.dtype == torch.float32  # the caller's model is not modified
    assert convert_model(half, Precision.FP16) is half
    with pytest.raises(LoweringOptionsError, match="not a torch module"):
        convert_model(object(), "fp16")


ARCHS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {"pad_token_id": 0}),
}


def _config(arch: str):
    transformers = pytest.importorskip("transformers")
    name, _, extra = ARCHS[arch]
    return getattr(transformers, name)(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=128,
        max_position_embeddings=256,
        **extra,
    )


@functools.cache
def _models(arch: str):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    lm32 = getattr(transformers, ARCHS[arch][1])(_config(arch)).eval()
    return lm32, convert_model(lm32, "fp16")


@functools.cache
def _exported(arch: str, half: bool):
    lm32, lm16 = _models(arch)
    return export_causal_lm(lm16 if half else lm32)


def _optimized(arch: str, half: bool, target: str):
    exported = _exported(arch, half)
    model = irkit.lower(exported.program, **exported.lower_kwargs())
    report = irkit.RewriteReport()
    if target == "ort":
        irkit.optimize(model, target="ort", rules=ort.default_rules(skip_norm=True), report=report)
    else:
        irkit.optimize(model, target="onnx", report=report)
    return model, report


def _histogram(model) -> collections.Counter:
    """Ops of the main graph and of every function body (one count per distinct body)."""
    return collections.Counter(
        n.op_type for g in (model.graph, *model.functions.values()) for n in g
    )


@pytest.mark.slow
@pytest.mark.parametrize("target", ["onnx", "ort"])
@pytest.mark.parametrize("arch", list(ARCHS))
def test_fp16_fusions_fire_as_in_fp32(arch, target):
    m32, r32 = _optimized(arch, False, target)
    m16, r16 = _optimized(arch, True, target)
    h32, h16 = _histogram(m32), _histogram(m16)
    # the same graph, plus the rotary's Cast(cos)/Cast(sin) to float16 that transformers writes
    assert h16 - h32 == collections.Counter({"Cast": 2}) and not h32 - h16, (h16, h32)
    assert h16["RMSNormalization"] == 1 and h16["Pow"] == h16["ReduceMean"] == 0
    if target == "ort":  # one in each of the two layer bodies, two at the seams in the parent
        assert h16["SkipSimplifiedLayerNormalization"] == 4
    fired16 = {k: v for k, v in r16.fired.items() if k != "RMSNormalizationHalf"}
    assert r16.fired["RMSNormalizationHalf"] == r32.fired["RMSNormalization"]
    assert fired16 == {k: v for k, v in r32.fired.items() if k != "RMSNormalization"}
    # numbers: onnxruntime CPU float16 vs eager float16 and vs eager float32
    lm32, lm16 = _models(arch)
    exported = _exported(arch, True)
    feeds = causal_lm_feeds(lm16, batch=2, seq=3, past=4, layout=exported.cache)
    assert feeds["past_key_values.0.key"].dtype == np.float16
    got = [g.astype(np.float32) for g in ort_session(m16).run(None, feeds)]
    assert_close(got, run_eager(lm16, feeds), atol=ATOL)
    feeds32 = {k: v.astype(np.float32) if v.dtype == np.float16 else v for k, v in feeds.items()}
    assert_close(got, run_eager(lm32, feeds32), atol=ATOL)


@pytest.mark.slow
def test_bf16_folder_exports_as_fp16_and_fp32(tmp_path):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    lm = transformers.LlamaForCausalLM(_config("llama")).to(torch.bfloat16).eval()
    lm.save_pretrained(tmp_path / "bf16")
    config = transformers.AutoConfig.from_pretrained(tmp_path / "bf16")
    for precision, dtype, np_dtype in (
        ("fp16", torch.float16, np.float16),
        ("fp32", torch.float32, np.float32),
    ):
        meta = meta_model(config, precision)
        exported = export_causal_lm(meta.model)
        model = irkit.lower(exported.program, **exported.lower_kwargs())
        irkit.optimize(model, target="ort")
        path = tmp_path / f"{precision}.onnx"
        irkit.save(model, path, weights=[tmp_path / "bf16", meta.buffers])
        session = ort_session(path)
        saved = irkit.load(path)
        weights = {
            name: v.dtype for name, v in saved.graph.initializers.items() if "weight" in name
        }
        assert len(weights) >= 10 and set(weights.values()) == {irkit_dtype(np_dtype)}, weights
        reference = transformers.AutoModelForCausalLM.from_pretrained(
            tmp_path / "bf16", dtype=dtype
        ).eval()
        feeds = causal_lm_feeds(reference, batch=2, seq=3, past=4, layout=exported.cache)
        assert feeds["past_key_values.0.key"].dtype == np_dtype
        got = [g.astype(np.float32) for g in session.run(None, feeds)]
        assert_close(got, run_eager(reference, feeds), atol=ATOL if precision == "fp16" else 1e-4)


def irkit_dtype(np_dtype):
    import onnx_ir as ir

    return ir.DataType.from_numpy(np.dtype(np_dtype))


def _gemma(tmp_path=None, big: float | None = None):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GemmaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        vocab_size=128,
        max_position_embeddings=256,
    )
    lm = transformers.GemmaForCausalLM(cfg).eval()
    if big is not None:
        with torch.no_grad():
            lm.model.embed_tokens.weight[7, 3] = big
    if tmp_path is not None:
        lm.save_pretrained(tmp_path)
    return cfg, lm


@pytest.mark.slow
def test_gemma_embedding_scale_overflow_is_refused(tmp_path):
    _, fine = _gemma()
    fine16 = convert_model(fine, "fp16")
    check_half_range(fine16)  # sqrt(64) × small rows: in range
    # it exports; Gemma's float32 norm (1 + w included) stays a float32 RMSNormalization
    exported = export_causal_lm(fine16)
    model = irkit.lower(exported.program, **exported.lower_kwargs())
    irkit.optimize(model, target="ort")
    norm = next(f for f in model.functions.values() if f.name == "GemmaRMSNorm")
    ops = collections.Counter(n.op_type for n in norm)
    assert ops["RMSNormalization"] == 1 and ops["Pow"] == 0
    fused = next(n for n in norm if n.op_type == "RMSNormalization")
    assert fused.inputs[0].dtype == irkit_dtype(np.float32)
    feeds = causal_lm_feeds(fine16, batch=2, seq=3, past=4, layout=exported.cache)
    got = [g.astype(np.float32) for g in ort_session(model).run(None, feeds)]
    assert_close(got, run_eager(fine16, feeds), atol=ATOL)
    cfg, lm = _gemma(tmp_path / "big", big=9000.0)  # 9000 × 8 = 72000 > 65504
    with pytest.raises(WeightsError, match=r"model.embed_tokens \(GemmaTextScaledWordEmbedding\)"):
        check_half_range(convert_model(lm, "fp16"))
    meta = meta_model(cfg, "fp16")  # the streamed path reads the table from the folder
    with pytest.raises(WeightsError, match=r"9000 × 8 = 72000, past float16's 65504.*fp32"):
        check_half_range(meta.model, [tmp_path / "big", meta.buffers])
    with pytest.raises(WeightsError, match="on the meta device and in none of the weights"):
        check_half_range(meta.model)
