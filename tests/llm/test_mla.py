"""MLA (deepseek_v3) exported in absorbed form (:mod:`irkit.llm.kernels.mla`).

The kernel caches ``K = [latent | k_pe]`` and ``V = [latent | 0]`` (one head each of
``kv_lora_rank + qk_rope_head_dim``), folds ``kv_b_proj``'s key half into the query and its value
half into the output; with genai's shared buffer (``irkit export --target ort``) the attention
becomes ``GroupQueryAttention`` owning that cache. Numbers against transformers' own forward (which caches the latent and ``k_pe``):
the same up to float rounding. That ``GroupQueryAttention`` owns genai's shared buffer, and
genai's ``Generator`` on the ``irkit export --target ort`` folder, are tested in
``tests/llm/test_genai_ort.py`` (``test_mla_absorbed_cache_is_group_query_attention``, the zoo's
``deepseek_v3``).
"""

from __future__ import annotations

import numpy as np
import pytest

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")

import onnx_ir as ir  # noqa: E402

import irkit  # noqa: E402
from irkit.llm import causal_lm_feeds, export_causal_lm, generate_greedy, kernels  # noqa: E402
from irkit.llm._causal_lm import cache_layout, pad_value_cache  # noqa: E402
from irkit.llm.kernels.mla import absorbed_latent_attention, is_latent_attention  # noqa: E402
from tests.capabilities import cache_argument  # noqa: E402
from tests.llm_zoo import BY_NAME  # noqa: E402


@pytest.fixture(scope="module")
def model() -> object:
    return BY_NAME["deepseek_v3"].model()


@pytest.fixture(scope="module")
def exported(model: object) -> object:
    return export_causal_lm(model)


@pytest.fixture(scope="module")
def session(exported: object) -> object:
    """Target ``ort``, the cache as past/present, onnxruntime's own graph optimizations off.
    (``GroupQueryAttention`` over genai's shared buffer, the form ``irkit export`` writes, is
    ``tests/llm/test_genai_ort.py::test_mla_absorbed_cache_is_group_query_attention``; the
    past/present form's masked GQA, ``gqa_masked``, declines the ``-inf`` mask of a boolean
    SDPA mask since onnxruntime's GQA without ``causal`` gives NaN on an empty row.)"""
    lowered = irkit.lower(exported.program, **exported.lower_kwargs())
    pad_value_cache(lowered, exported.cache)
    irkit.optimize(lowered, target="ort")
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    proto = ir.serde.serialize_model(lowered).SerializeToString()
    return ort.InferenceSession(proto, options, providers=["CPUExecutionProvider"])


def test_the_latent_attention_is_recognized_by_what_it_is(model: object) -> None:
    found = [m for m in model.modules() if is_latent_attention(m)]
    assert found == [layer.self_attn for layer in model.model.layers]
    llama = BY_NAME["llama"].model()
    assert not any(is_latent_attention(m) for m in llama.modules())


def test_the_probe_reads_the_absorbed_cache(model: object) -> None:
    """One key and one value head of ``kv_lora_rank + qk_rope_head_dim``, as exported; the
    model is its own again after the probe."""
    config = model.config
    width = config.kv_lora_rank + config.qk_rope_head_dim
    layout = cache_layout(model)
    assert layout.keys == layout.values == ((1, width),) * config.num_hidden_layers
    attention = model.model.layers[0].self_attn
    assert "forward" not in vars(attention)
    with kernels.layout_kernels(model) as swapped:
        assert swapped == ["absorbed_latent_attention"]
        assert attention.forward.__func__ is absorbed_latent_attention
    assert "forward" not in vars(attention)


def test_absorbed_equals_transformers_eager(model: object) -> None:
    """A right-padded prompt, then greedy generation: the logits within float rounding, the
    ids equal."""
    torch.manual_seed(1)
    ids = torch.randint(3, 200, (2, 7))
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    with torch.no_grad():
        want = model(input_ids=ids, attention_mask=mask).logits
        with kernels.layout_kernels(model):
            got = model(input_ids=ids, attention_mask=mask).logits
            ids_got = model.generate(ids[:1], max_new_tokens=10, do_sample=False)
        ids_want = model.generate(ids[:1], max_new_tokens=10, do_sample=False)
    scale = want.abs().max()
    assert float((got - want).abs().max() / scale) < 1e-5
    torch.testing.assert_close(ids_got, ids_want, rtol=0, atol=0)


def test_onnxruntime_equals_transformers_at_prefill_and_decode(
    model: object, exported: object, session: object
) -> None:
    """onnxruntime's logits against transformers' own forward (latent cache): a prefill of 6,
    then two decode steps on the presents onnxruntime returned; 1e-4 relative."""
    names = [o.name for o in session.get_outputs()]
    feeds = causal_lm_feeds(model, batch=2, seq=6, past=0, layout=exported.cache)
    ids = torch.from_numpy(feeds["input_ids"])
    with torch.no_grad():
        out = model(input_ids=ids, use_cache=True)
    got = dict(zip(names, session.run(None, feeds), strict=True))
    cache, step = out.past_key_values, out.logits
    for _ in range(3):
        want = step.numpy()
        scale = np.abs(want).max()
        np.testing.assert_allclose(got["logits"] / scale, want / scale, atol=1e-4, rtol=0)
        nxt = want[:, -1].argmax(-1)[:, None].astype(np.int64)
        total = feeds["attention_mask"].shape[1] + 1
        feeds = {
            "input_ids": nxt,
            "attention_mask": np.ones((2, total), dtype=np.int64),
            **({"position_ids": np.full((2, 1), total - 1, np.int64)} if exported.position_ids
               else {}),
            **{
                name.replace("present", "past_key_values"): value
                for name, value in got.items()
                if name.startswith("present.")
            },
        }  # fmt: skip
        got = dict(zip(names, session.run(None, feeds), strict=True))
        with torch.no_grad():
            by_name = {cache_argument(model.forward): cache}
            out = model(input_ids=torch.from_numpy(nxt), use_cache=True, **by_name)
        cache, step = out.past_key_values, out.logits


def test_greedy_ids_equal_generate(model: object, session: object) -> None:
    """Greedy ids of the onnxruntime session against transformers ``generate`` (its latent
    cache): one prompt, and a batch of two of equal length."""
    torch.manual_seed(2)
    ids = torch.randint(3, 200, (2, 9))
    for rows in (slice(0, 1), slice(0, 2)):
        with torch.no_grad():
            want = model.generate(
                input_ids=ids[rows], do_sample=False, max_new_tokens=12, eos_token_id=None,
                pad_token_id=0,
            )  # fmt: skip
        got = generate_greedy(session, ids[rows].numpy(), max_new_tokens=12, pad_token_id=0)
        np.testing.assert_array_equal(got, want.numpy())
        assert len(set(want[-1, 9:].tolist())) >= 4  # varied ids, not one token repeated


@pytest.mark.slow
def test_deepseek_v3_head_sizes_and_yarn_scaling() -> None:
    """DeepSeek-V3's latent sizes (one KV head of 512 + 64 = 576) and yarn's mscale in the
    module's ``scaling`` (onnxruntime's GroupQueryAttention runs one KV head of 576: the
    zoo's genai test owns its shared buffer); an 80-token prefill (past yarn's
    original 64 positions) and greedy decoding against transformers."""
    config = transformers.DeepseekV3Config(
        vocab_size=256, hidden_size=128, intermediate_size=128, moe_intermediate_size=32,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=512,
        q_lora_rank=64, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128,
        n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2, n_group=1, topk_group=1,
        first_k_dense_replace=1, max_position_embeddings=256,
        rope_parameters={
            "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
            "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0,
            "rope_theta": 10000.0,
        },
    )  # fmt: skip
    torch.manual_seed(0)
    lm = transformers.DeepseekV3ForCausalLM(config).eval()
    assert lm.model.layers[0].self_attn.scaling != (128 + 64) ** -0.5  # mscale applied
    exported = export_causal_lm(lm)
    assert exported.cache.keys == exported.cache.values == ((1, 576), (1, 576))
    lowered = irkit.lower(exported.program, **exported.lower_kwargs())
    pad_value_cache(lowered, exported.cache)
    irkit.optimize(lowered, target="ort")
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    proto = ir.serde.serialize_model(lowered).SerializeToString()
    session = ort.InferenceSession(proto, options, providers=["CPUExecutionProvider"])
    ids = torch.randint(3, 250, (1, 80))
    with torch.no_grad():
        want = lm(input_ids=ids).logits.numpy()
        generated = lm.generate(
            ids[:, :70], do_sample=False, max_new_tokens=12, eos_token_id=None, pad_token_id=0
        )
    feeds = causal_lm_feeds(lm, batch=1, seq=80, past=0, layout=exported.cache)
    feeds["input_ids"] = ids.numpy()
    got = session.run(None, feeds)[0]
    scale = np.abs(want).max()
    np.testing.assert_allclose(got / scale, want / scale, atol=1e-4, rtol=0)
    greedy = generate_greedy(session, ids[:, :70].numpy(), max_new_tokens=12, pad_token_id=0)
    np.testing.assert_array_equal(greedy, generated.numpy())
