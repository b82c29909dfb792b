"""MiniMax: lightning attention (linear attention with a per-head decay) and softmax attention
layers, its states in a cache class of its own (``MiniMaxCache.linear_cache``).

The lightning attention's export forward (:mod:`irkit.llm.kernels.lightning`) equals
transformers' module on both of its paths (the blocked prompt path and the per-token path from a
cached state); the model exports as one program (``past.N.recurrent`` read and written through
the cache's own list), runs in onnxruntime like eager and gives ``generate``'s greedy ids for
one prompt and a left-padded batch of two, prompts longer than one lightning-attention block;
a right-padded row's state is the state after its last real token. onnxruntime-genai 0.18 has no
layer type for a recurrent state without a convolution state: ``irkit export`` refuses it.
"""

from __future__ import annotations

import collections
import pathlib

import numpy as np
import pytest

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")
modeling = pytest.importorskip("transformers.models.minimax.modeling_minimax")

import irkit  # noqa: E402
from irkit.llm import (  # noqa: E402
    causal_lm_feeds,
    export_causal_lm,
    generate_greedy,
    kernels,
    run_eager,
)
from irkit.llm.kernels.lightning import is_lightning_attention, lightning_attention  # noqa: E402
from tests.capabilities import (  # noqa: E402
    cache_argument,
    require_config_dtype,
    require_typed_cache_layers,
)

BLOCK = 4  # the lightning attention's block: the prompts below span several


def _config(**overrides: object) -> object:
    fields = dict(
        vocab_size=300, hidden_size=64, intermediate_size=64, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=4,
        num_experts_per_tok=2, block_size=BLOCK, max_position_embeddings=256,
        layer_types=["full_attention", "linear_attention", "linear_attention"],
        bos_token_id=0, eos_token_id=1, pad_token_id=2, initializer_range=0.3,
    )  # fmt: skip
    return transformers.MiniMaxConfig(**(fields | overrides))


def _model(**overrides: object) -> object:
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(_config(**overrides)).eval()


@pytest.fixture(scope="module")
def model() -> object:
    return _model()


@pytest.fixture(scope="module")
def exported(model: object) -> object:
    require_typed_cache_layers()  # which layers hold a recurrent state (4.54: MiniMaxCache only)
    return export_causal_lm(model)


@pytest.fixture(scope="module", params=["onnx", "ort"])
def saved(request: pytest.FixtureRequest, exported: object, tmp_path_factory) -> pathlib.Path:
    lowered = irkit.lower(exported.program, **exported.lower_kwargs())
    irkit.optimize(lowered, target=request.param)
    path = tmp_path_factory.mktemp(f"minimax_{request.param}") / "model.onnx"
    irkit.save(lowered, path)
    return path


@pytest.fixture(scope="module")
def session(saved: pathlib.Path) -> object:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(str(saved), options)


# --- the kernel against transformers' module ----------------------------------------------------
def _attention(model: object) -> object:
    return model.model.layers[1].self_attn


def test_the_lightning_attention_is_recognized_by_what_it_is(model: object) -> None:
    found = [m for m in model.modules() if is_lightning_attention(m)]
    assert found == [model.model.layers[1].self_attn, model.model.layers[2].self_attn]
    assert not is_lightning_attention(model.model.layers[0].self_attn)  # softmax attention


def test_export_kernels_swaps_the_forward_and_restores_it(model: object) -> None:
    module = _attention(model)
    with kernels.export_kernels(model) as swapped:
        assert "lightning_attention" in swapped
        assert module.forward.__func__ is lightning_attention
    assert "forward" not in vars(module)
    assert module.forward.__func__ is type(module).forward


@pytest.mark.parametrize("length", [1, 3, 2 * BLOCK + 3])
def test_lightning_attention_equals_both_transformers_paths(model: object, length: int) -> None:
    """A prompt from no state (transformers' blocked path) and a continuation from a cached state
    (its per-token path): the same outputs and states."""
    if not hasattr(modeling, "apply_mask_to_padding_states"):
        pytest.skip(  # 4.54 masks the values and decays of a padded token instead
            "transformers' lightning attention zeros no padded projections "
            "(apply_mask_to_padding_states), as irkit's kernel does"
        )
    module = _attention(model)
    torch.manual_seed(length)
    hidden = torch.randn(2, length, 64)
    mask = torch.ones(2, length)
    mask[1, :2] = 0  # a left-padded row
    with torch.no_grad():
        for state in (None, torch.randn(2, 4, 16, 16)):
            caches = [modeling.MiniMaxCache(), modeling.MiniMaxCache()]
            if state is not None:
                for cache in caches:
                    cache.set_linear_cache(1, state.clone())
            by_name = {cache_argument(module.forward): caches[0]}
            want = module(hidden, None, mask if length > 1 else None, **by_name)
            got = lightning_attention(module, hidden, None, mask if length > 1 else None, caches[1])
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(caches[1].linear_cache[1], caches[0].linear_cache[1])


# --- the exported model ------------------------------------------------------------------------
def test_names_and_one_scan(exported: object, saved: pathlib.Path, session: object) -> None:
    counts = _op_counts(saved)  # in the lightning attention's function (two calls of it)
    if saved.parent.name.startswith("minimax_ort"):  # onnxruntime's kernel, no Scan left
        assert counts["com.microsoft::LinearAttention"] == 1 and counts["::Scan"] == 0
    else:  # standard ops: one call of the kernel's function, a Scan in its body
        assert counts["irkit_kernels::gated_linear"] == 1 and counts["::Scan"] == 1
    assert exported.input_names[3:] == [
        "past_key_values.0.key", "past_key_values.0.value", "past.1.recurrent", "past.2.recurrent",
    ]  # fmt: skip
    assert exported.output_names[-2:] == ["present.1.recurrent", "present.2.recurrent"]
    shapes = {arg.name: arg.shape for arg in session.get_inputs()}
    assert shapes["past.1.recurrent"][1:] == [4, 16, 16]  # (heads, head_dim, head_dim)


def test_one_program_runs_like_eager(model: object, exported: object, session: object) -> None:
    # decode, prefill over several blocks, decode on a batch, a prompt continued from a state
    for batch, seq, past in [(1, 1, 4), (2, 2 * BLOCK + 3, 0), (2, 1, 9), (1, 6, 3)]:
        feeds = causal_lm_feeds(model, batch=batch, seq=seq, past=past, layout=exported.cache)
        for want, got in zip(run_eager(model, feeds), session.run(None, feeds), strict=True):
            # float32 rounding: the states reach ~70 (initializer_range 0.3), 3e-6 relative
            np.testing.assert_allclose(got, want, atol=5e-4, rtol=1e-4)


def test_greedy_ids_equal_generate(model: object, session: object) -> None:
    ids = torch.tensor(
        [[7, 7, 7, 7, 5, 17, 42, 9, 33, 61, 5], [3, 8, 11, 77, 4, 5, 90, 12, 6, 8, 9]]
    )
    mask = torch.tensor([[0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1], [1] * 11])
    for rows in (slice(1, 2), slice(0, 2)):  # one prompt of 11 tokens; a left-padded batch
        want = model.generate(
            input_ids=ids[rows], attention_mask=mask[rows], do_sample=False, max_new_tokens=10,
            eos_token_id=None, pad_token_id=7,
        )  # fmt: skip
        got = generate_greedy(
            session, ids[rows].numpy(), mask[rows].numpy(), max_new_tokens=10, pad_token_id=7
        )
        np.testing.assert_array_equal(got, want.numpy())
        assert len(set(want[-1, 11:].tolist())) >= 4  # varied ids, not one token repeated


def test_a_right_padded_row_keeps_the_state_of_its_last_token(
    model: object, exported: object, session: object
) -> None:
    """onnxruntime-genai right-pads: on a pad step the state neither decays nor is written."""
    feeds = causal_lm_feeds(model, batch=2, seq=7, past=0, layout=exported.cache)
    feeds["attention_mask"][1, 4:] = 0  # row 1: four tokens, then three pads
    names = [o.name for o in session.get_outputs()]
    padded = dict(zip(names, session.run(None, feeds), strict=True))
    short = {
        k: v[1:, :4] if k in ("input_ids", "attention_mask", "position_ids") else v[1:]
        for k, v in feeds.items()
    }  # fmt: skip  (row 1 alone, without its pads)
    alone = dict(zip(names, session.run(None, short), strict=True))
    for name in ("present.1.recurrent", "present.2.recurrent"):
        np.testing.assert_allclose(padded[name][1], alone[name][0], atol=1e-5, rtol=1e-5)


def test_irkit_export_refuses_genai_a_recurrent_state_alone(
    model: object, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture
) -> None:
    """genai 0.18's ``linear_attention`` layer asks for a convolution state too (its Generator
    fails on a missing ``past_key_values.N.conv_state``): exit 2 before tracing, naming the
    layer and the kind."""
    require_config_dtype()
    from irkit.cli import main
    from tests.llm import genai_support as gs

    folder = gs.save_folder(tmp_path / "hf", model, gs.tokenizer(vocab_size=300))
    assert main(["export", str(folder), "-o", str(tmp_path / "out"), "-q"]) == 2
    assert "layer 1 of the 'minimax' model caches recurrent" in capsys.readouterr().err


def test_a_lightning_layer_first_equals_the_uncached_forward(tmp_path: pathlib.Path) -> None:
    """With a lightning layer first (as MiniMax-Text-01's layers are), transformers' own cached
    ``generate`` disagrees with its uncached forward on a left-padded row: ``MiniMaxCache``
    appends a plain ``DynamicLayer`` for that layer too, never updated, and
    ``get_seq_length()`` reads layer 0, so its decode steps take the past as empty. irkit's
    typed layers put a ``LinearAttentionLayer`` there (``get_seq_length`` skips it): its ids are
    the uncached forward's arg-max, token by token."""
    require_typed_cache_layers()
    model = _model(layer_types=["linear_attention", "full_attention"], num_hidden_layers=2)
    exported = export_causal_lm(model)
    assert exported.input_names[3:] == [
        "past_key_values.1.key", "past_key_values.1.value", "past.0.recurrent",
    ]  # fmt: skip
    lowered = irkit.lower(exported.program, **exported.lower_kwargs())
    irkit.optimize(lowered, target="onnx")
    irkit.save(lowered, tmp_path / "model.onnx")
    session = ort.InferenceSession(str(tmp_path / "model.onnx"))
    ids = np.array([[7, 7, 7, 7, 5, 17, 42, 9, 33, 61, 5], [3, 8, 11, 77, 4, 5, 90, 12, 6, 8, 9]])
    mask = np.array([[0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1], [1] * 11])
    got = generate_greedy(session, ids, mask, max_new_tokens=8, pad_token_id=7)
    full = np.concatenate([mask, np.ones((2, 8), dtype=mask.dtype)], axis=1)
    with torch.no_grad():
        logits = model(
            input_ids=torch.from_numpy(got), attention_mask=torch.from_numpy(full),
            position_ids=torch.from_numpy(np.maximum(full.cumsum(-1) - 1, 0)), use_cache=False,
        ).logits  # fmt: skip
    np.testing.assert_array_equal(got[:, 11:], logits[:, 10:-1].argmax(-1).numpy())


def _op_counts(session_path: pathlib.Path) -> collections.Counter:
    import onnx

    proto = onnx.load(str(session_path), load_external_data=False)
    graphs = [proto.graph, *proto.functions]
    return collections.Counter(f"{n.domain}::{n.op_type}" for g in graphs for n in g.node)
