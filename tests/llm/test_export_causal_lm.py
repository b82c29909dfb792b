"""irkit.llm.export_causal_lm: KV-cache export of transformers causal LMs, checked in onnxruntime.

Each architecture is exported once (tiny config, random weights), lowered with the names the
helper returns, and run at a prefill (past 0) and decode steps at two past lengths; logits and
every present key/value must match eager PyTorch.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import types

import numpy as np
import pytest

import irkit
from irkit.errors import ExportError, LoweringOptionsError
from irkit.llm import (
    TESTED_TRANSFORMERS,
    cache_layout,
    causal_lm_feeds,
    export_causal_lm,
    generate_greedy,
    run_eager,
    torch_inputs,
)
from tests.helpers import FP32_ATOL, assert_close, ort_session, run_ort
from tests.llm_zoo import BY_NAME

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

LAYERS = 2


def _lm(config_name: str, model_name: str):
    torch.manual_seed(0)
    cfg = getattr(transformers, config_name)(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=128,
        max_position_embeddings=256,
    )
    return getattr(transformers, model_name)(cfg).eval()


@functools.cache
def _lowered(config_name: str, model_name: str):
    lm = _lm(config_name, model_name)
    exported = export_causal_lm(lm)
    model = irkit.lower(exported.program, **exported.lower_kwargs())
    return lm, exported, model


ARCHS = [
    pytest.param("LlamaConfig", "LlamaForCausalLM", id="llama", marks=pytest.mark.slow),
    pytest.param("Qwen2Config", "Qwen2ForCausalLM", id="qwen2", marks=pytest.mark.slow),
]


@pytest.mark.parametrize(("config_name", "model_name"), ARCHS)
def test_names_and_dims(config_name, model_name):
    _, exported, model = _lowered(config_name, model_name)
    keys = [f"past_key_values.{i}.key" for i in range(LAYERS)]
    values = [f"past_key_values.{i}.value" for i in range(LAYERS)]
    assert exported.input_names == ["input_ids", "attention_mask", "position_ids", *keys, *values]
    assert [v.name for v in model.graph.inputs] == exported.input_names
    assert [v.name for v in model.graph.outputs] == exported.output_names
    assert exported.output_names[1] == "present.0.key"
    shapes = {
        v.name: [str(d) for d in v.shape] for v in (*model.graph.inputs, *model.graph.outputs)
    }
    assert shapes["input_ids"] == ["batch", "sequence"]
    assert shapes["attention_mask"] == ["batch", "total_sequence"]
    assert shapes["past_key_values.1.value"] == ["batch", "2", "past_sequence", "16"]
    assert shapes["present.0.key"] == ["batch", "2", "past_sequence + sequence", "16"]


@pytest.mark.parametrize(("config_name", "model_name"), ARCHS)
def test_numbers_prefill_and_two_past_lengths(config_name, model_name):
    lm, _, model = _lowered(config_name, model_name)
    session = ort_session(irkit.optimize(model.clone()))
    for batch, seq, past in [(2, 4, 0), (1, 1, 6), (3, 1, 17), (2, 3, 9)]:
        feeds = causal_lm_feeds(lm, batch=batch, seq=seq, past=past, seed=past)
        got = session.run(None, feeds)
        assert_close(got, run_eager(lm, feeds), atol=FP32_ATOL)


def test_bad_sizes_are_reported():
    lm = _lm("LlamaConfig", "LlamaForCausalLM")
    with pytest.raises(LoweringOptionsError, match="distinct sizes >= 2"):
        export_causal_lm(lm, batch=2, seq=2, past=5)


def test_not_a_causal_lm():
    with pytest.raises(LoweringOptionsError, match="has no `config`"):
        export_causal_lm(torch.nn.Linear(2, 2))


def test_feeds_shapes():
    lm = _lm("LlamaConfig", "LlamaForCausalLM")
    feeds = causal_lm_feeds(lm, batch=3, seq=1, past=4)
    assert feeds["position_ids"].tolist() == [[4]] * 3
    assert feeds["attention_mask"].shape == (3, 5)
    assert feeds["past_key_values.0.key"].shape == (3, 2, 4, 16)
    assert np.all(feeds["input_ids"] >= 1)


# --- binding, cache layout, errors (issue 22) ----------------------------------------------------


class _OldSignature(torch.nn.Module):
    """A causal LM whose forward takes the cache as ``past_key_values`` (transformers < 5.2x)."""

    config = object()

    def forward(self, input_ids, attention_mask=None, past_key_values=None, use_cache=None):
        raise NotImplementedError


def test_cache_is_bound_by_the_forward_signature():
    feeds = causal_lm_feeds(_lm("LlamaConfig", "LlamaForCausalLM"), batch=1, seq=2, past=3)
    del feeds["position_ids"]
    old = torch_inputs(_OldSignature(), feeds)
    assert set(old) == {"input_ids", "attention_mask", "past_key_values", "use_cache"}
    new = torch_inputs(_lm("LlamaConfig", "LlamaForCausalLM"), feeds)
    cache_arg = (
        "cache"
        if "cache" in inspect.signature(transformers.LlamaModel.forward).parameters
        else "past_key_values"
    )
    assert cache_arg in new and new[cache_arg].layers[1].keys.shape == (1, 2, 3, 16)


def test_cache_layout_is_the_models_own():
    falcon = cache_layout(BY_NAME["falcon"].model())  # multi-query: one KV head
    assert falcon.keys == falcon.values == ((1, 16), (1, 16))
    deepseek = BY_NAME["deepseek_v3"].model()  # MLA, absorbed: one key and one value head
    layout = cache_layout(deepseek)
    config = deepseek.config
    assert layout.keys[0] == layout.values[0] == (1, config.kv_lora_rank + config.qk_rope_head_dim)
    feeds = causal_lm_feeds(deepseek, batch=2, seq=1, past=3, layout=layout)
    assert feeds["past_key_values.1.key"].shape == (2, *layout.keys[1][:1], 3, layout.keys[1][1])
    assert feeds["past_key_values.1.value"].shape[-1] == layout.values[1][1]
    half = cache_layout(_lm("LlamaConfig", "LlamaForCausalLM").half())
    assert str(half.dtype) == "torch.float16" and half.numpy_dtype() == np.float16


def test_export_failure_is_an_irkit_error_naming_versions(monkeypatch):
    lm = _lm("LlamaConfig", "LlamaForCausalLM")
    boom = RuntimeError("boom from torch.export")

    def fail(*args, **kwargs):
        raise boom

    monkeypatch.setattr(torch.export, "export", fail)
    with pytest.raises(ExportError) as info:
        export_causal_lm(lm)
    message = str(info.value)
    assert f"transformers {transformers.__version__}" in message
    assert f"torch {torch.__version__}" in message
    low, high = TESTED_TRANSFORMERS
    assert f"tested: transformers {low} … {high}" in message
    assert "RuntimeError: boom from torch.export" in message
    assert info.value.__cause__ is boom


def test_a_model_without_input_ids_or_failing_without_a_cache():
    class NoIds(torch.nn.Module):
        config = object()

        def forward(self, inputs_embeds):
            raise NotImplementedError

    with pytest.raises(ExportError, match="takes no input_ids"):
        export_causal_lm(NoIds())

    config = types.SimpleNamespace(vocab_size=16, max_position_embeddings=32)
    config.get_text_config = lambda: config

    class NoCache(torch.nn.Module):  # exported without a cache (GPT-1's way): its failure named
        def __init__(self) -> None:
            super().__init__()
            self.config = config

        def forward(self, input_ids):
            raise NotImplementedError

    with pytest.raises(ExportError, match="torch.export.export of NoCache failed") as info:
        export_causal_lm(NoCache())
    assert isinstance(info.value.__cause__, NotImplementedError)


@pytest.mark.slow
def test_fp16_model_exports_and_matches_eager():
    lm = _lm("LlamaConfig", "LlamaForCausalLM").half()
    exported = export_causal_lm(lm)
    assert str(exported.cache.dtype) == "torch.float16"
    model = irkit.lower(exported.program, **exported.lower_kwargs())
    session = ort_session(model)
    feeds = causal_lm_feeds(lm, batch=2, seq=3, past=4, layout=exported.cache)
    assert feeds["past_key_values.0.key"].dtype == np.float16
    got = [g.astype(np.float32) for g in session.run(None, feeds)]
    assert_close(got, run_eager(lm, feeds), atol=2e-2)


# --- generate_greedy ------------------------------------------------------------------------------


class _Arg:
    def __init__(self, name, shape=(), type_="tensor(float)"):
        self.name, self.shape, self.type = name, list(shape), type_


class _FakeSession:
    """Logits that always pick ``(last token + 1) % 7``: checks the loop's bookkeeping."""

    def __init__(self):
        self.feeds = []

    def get_inputs(self):
        names = ["input_ids", "attention_mask", "position_ids"]
        return [_Arg(n) for n in names] + [_Arg("past_key_values.0.key", ("b", 1, "p", 2))]

    def get_outputs(self):
        return [_Arg("logits"), _Arg("present.0.key")]

    def run(self, names, feeds):
        self.feeds.append(feeds)
        ids = feeds["input_ids"]
        logits = np.zeros((*ids.shape, 7), dtype=np.float32)
        np.put_along_axis(logits, (ids[..., None] + 1) % 7, 1.0, axis=-1)
        past = feeds["past_key_values.0.key"]
        present = np.concatenate([past, np.zeros((len(ids), 1, ids.shape[1], 2), past.dtype)], 2)
        return [logits, present]


def test_generate_greedy_loop_bookkeeping():
    session = _FakeSession()
    out = generate_greedy(session, [[0, 5, 1], [3, 4, 5]], [[0, 1, 1], [1, 1, 1]], max_new_tokens=3)
    assert out.tolist() == [[0, 5, 1, 2, 3, 4], [3, 4, 5, 6, 0, 1]]
    first, second, third = session.feeds
    assert first["position_ids"].tolist() == [[0, 0, 1], [0, 1, 2]]
    assert first["past_key_values.0.key"].shape == (2, 1, 0, 2)
    assert second["position_ids"].tolist() == [[2], [3]] and second["input_ids"].tolist() == [
        [2],
        [6],
    ]
    assert second["attention_mask"].shape == (2, 4) and third["attention_mask"].shape == (2, 5)
    assert third["past_key_values.0.key"].shape == (2, 1, 4, 2)


def test_generate_greedy_stops_at_eos_and_pads():
    out = generate_greedy(
        _FakeSession(), [[1], [4]], max_new_tokens=5, eos_token_id=3, pad_token_id=0
    )
    assert out.tolist() == [[1, 2, 3, 0, 0, 0], [4, 5, 6, 0, 1, 2]]
    stop = generate_greedy(_FakeSession(), [[1]], max_new_tokens=5, eos_token_id=3)
    assert stop.tolist() == [[1, 2, 3]]


def test_generate_greedy_refuses_other_models():
    class Other(_FakeSession):
        def get_inputs(self):
            return [_Arg("x")]

    with pytest.raises(LoweringOptionsError, match="names irkit.llm.export_causal_lm gives"):
        generate_greedy(Other(), [[1]], max_new_tokens=1)


# --- the default export: a DynamicCache output -----------------------------------------------------


class _ReturnsDynamicCache(torch.nn.Module):
    """Builds and returns a ``DynamicCache`` (as ``use_cache=True`` does) and writes into a view
    (so irkit.lower functionalizes the program: torch retraces it)."""

    def forward(self, x):
        from transformers import DynamicCache

        cache = DynamicCache()
        doubled = x.new_empty(x.shape)
        doubled[:, :] = x * 2  # an in-place copy into a view
        cache.update(doubled, x + 1, 0)
        return {"out": x * 3, "cache": cache}


def test_default_export_with_a_dynamic_cache_output_lowers():
    try:
        from transformers.integrations.executorch import register_dynamic_cache_export_support
    except ImportError:  # transformers 4.54 registered DynamicCache when it was imported
        pass
    else:
        register_dynamic_cache_export_support()
    x = torch.randn(2, 1, 3, 4)
    program = torch.export.export(_ReturnsDynamicCache(), (x,))
    model = irkit.lower(program)  # was: SpecViolationError (lifted_tensor_N) in the retrace
    names = [v.name for v in model.graph.outputs]  # keys of the cache's pytree context
    assert names[0] == "out" and len(set(names)) == 3
    assert all(name.startswith("cache_") for name in names[1:]), names
    assert_close(run_ort(model, [x]), [(x * 3).numpy(), (x * 2).numpy(), (x + 1).numpy()], 1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["falcon", "phi3_longrope"])
def test_meta_model_constants_have_values_and_the_model_is_unchanged(name):
    """forward's constants (falcon's list indices, longrope's long factors) of a meta model."""
    from irkit.llm._meta import meta_causal_lm
    from tests.llm_zoo import EXTRA

    arch = {a.name: a for a in (*BY_NAME.values(), *EXTRA)}[name]
    meta = meta_causal_lm(arch.config(), dtype=torch.float32)
    before = {id(m): dict(vars(m)) for m in meta.model.modules()}
    exported = export_causal_lm(meta.model)
    program = exported.program
    constants = [program.constants[n] for n in program.graph_signature.lifted_tensor_constants]
    assert any(c.numel() for c in constants)  # not only the empty cache placeholders
    assert all(c.device.type == "cpu" for c in constants)
    assert all(not isinstance(c, torch._subclasses.fake_tensor.FakeTensor) for c in constants)
    assert {id(m): dict(vars(m)) for m in meta.model.modules()} == before
    assert {t.device.type for t in meta.model.state_dict().values()} == {"meta"}
    if name == "phi3_longrope":  # torch.tensor(long_factor) in forward, with its values
        factors = torch.tensor(arch.config().rope_parameters["long_factor"])
        assert any(c.shape == factors.shape and torch.equal(c, factors) for c in constants)


def _graph_text(program) -> list[tuple[str, ...]]:
    """The program's nodes with names replaced by positions: op, target, args, shapes, modules."""
    nodes = list(program.graph_module.graph.nodes)
    index = {node: f"%{i}" for i, node in enumerate(nodes)}
    rows = []
    for node in nodes:
        val = node.meta.get("val")
        shape = (tuple(map(str, val.shape)), str(val.dtype)) if hasattr(val, "shape") else None
        stack = [path for path, _ in node.meta.get("nn_module_stack", {}).values()]
        args = torch.fx.node.map_arg((node.args, node.kwargs), index.__getitem__)
        rows.append((node.op, str(node.target), str(args), str(shape), str(stack)))
    return rows


@pytest.mark.slow
@pytest.mark.parametrize("name", ["llama"])
def test_program_is_the_same_with_torchs_fake_tensor_cache(name, monkeypatch):
    """export_causal_lm turns the fake-tensor dispatch cache off (speed): same program. (The
    suite runs with it off too, tests/conftest.py: here it is on, as users have it.)"""
    import torch._dynamo.config as dynamo_config

    from irkit.llm import _causal_lm

    lm = BY_NAME[name].model()
    # (dynamo's config.patch, not monkeypatch: monkeypatch's undo deletes a config key it did
    # not find in the module's __dict__, which hides it from every later patch)
    with dynamo_config.patch(fake_tensor_cache_enabled=True):
        assert dynamo_config.fake_tensor_cache_enabled
        fast = export_causal_lm(lm).program
        assert dynamo_config.fake_tensor_cache_enabled  # restored on exit
        monkeypatch.setattr(_causal_lm, "_uncached_fake_dispatch", contextlib.nullcontext)
        cached = export_causal_lm(lm).program
    assert _graph_text(fast) == _graph_text(cached)
    assert str(fast.graph_signature) == str(cached.graph_signature)
    assert str(fast.range_constraints) == str(cached.range_constraints)


@pytest.mark.slow
def test_narrower_ranges_torch_proves_are_taken():
    """GPT-Neo's position table makes past + new ≤ max positions, so torch narrows both dims
    (suggested fixes: max - 2 each); the export takes them and stays dynamic."""
    config = transformers.GPTNeoConfig(
        vocab_size=256, hidden_size=64, num_layers=2, num_heads=4, window_size=8,
        attention_types=[[["global", "local"], 1]], max_position_embeddings=128,
    )  # fmt: skip
    torch.manual_seed(0)
    lm = transformers.GPTNeoForCausalLM(config).eval()
    exported = export_causal_lm(lm)
    session = ort_session(irkit.lower(exported.program, **exported.lower_kwargs()))
    for seq, past in ((7, 0), (1, 11)):
        feeds = causal_lm_feeds(lm, batch=2, seq=seq, past=past, layout=exported.cache)
        assert_close(session.run(None, feeds), run_eager(lm, feeds), atol=1e-4)


@pytest.mark.slow
def test_a_decoder_that_does_not_return_its_cache_is_named():
    """RoCBert without ``is_decoder`` updates the passed cache but returns only logits (and is
    not causal): a clear ExportError, not a count mismatch in lowering; as a decoder it exports."""
    config = transformers.RoCBertConfig(
        vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=128, pronunciation_vocab_size=32, shape_vocab_size=32,
    )  # fmt: skip
    torch.manual_seed(0)
    with pytest.raises(ExportError, match="returns logits .* no cache.*is_decoder=True"):
        export_causal_lm(transformers.RoCBertForCausalLM(config).eval())
    config.is_decoder = True
    lm = transformers.RoCBertForCausalLM(config).eval()
    exported = export_causal_lm(lm)
    session = ort_session(irkit.lower(exported.program, **exported.lower_kwargs()))
    feeds = causal_lm_feeds(lm, batch=2, seq=1, past=5, layout=exported.cache)
    assert_close(session.run(None, feeds), run_eager(lm, feeds), atol=1e-4)


@pytest.mark.slow
def test_a_branch_on_the_length_that_torch_narrows_to_is_refused():
    """Doge switches its mask to top-k beyond ``keep_window_size`` keys; at 8 (below the
    positions) torch.export takes the example's side and narrows both sequence dims to 6: the
    program would be silently wrong past 8 tokens, so the export is refused, naming the bound."""
    config = transformers.DogeConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=256,
        keep_window_size=8,
    )  # fmt: skip
    torch.manual_seed(0)
    lm = transformers.DogeForCausalLM(config).eval()
    with pytest.raises(ExportError, match=r"holds only for sequence <= 6 \(asked: up to 256\), "
                       r"past_sequence <= 6 .*branches on the sequence length"):  # fmt: skip
        export_causal_lm(lm)
    config.keep_window_size = 256  # (a window over every position: one program, exact)
    lm = transformers.DogeForCausalLM(config).eval()
    exported = export_causal_lm(lm)
    session = ort_session(irkit.lower(exported.program, **exported.lower_kwargs()))
    feeds = causal_lm_feeds(lm, batch=2, seq=4, past=9, layout=exported.cache)
    assert_close(session.run(None, feeds), run_eager(lm, feeds), atol=1e-4)
