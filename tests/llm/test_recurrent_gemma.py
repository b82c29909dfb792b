"""RecurrentGemma (Griffin: RG-LRU recurrent blocks + local attention): its module-held cache
(``conv1d_state``, ``recurrent_states``) as the ``conv`` / ``recurrent`` kinds, its RG-LRU and
block convolution as export kernels (swapped by qualified name); one program for a prefill and
the decode steps, greedy ids equal to transformers ``generate`` in onnxruntime and in
onnxruntime-genai's ``Generator``."""

from __future__ import annotations

import inspect
import json
import pathlib

import numpy as np
import pytest

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")
rg = pytest.importorskip("transformers.models.recurrent_gemma.modeling_recurrent_gemma")

import irkit  # noqa: E402
from irkit.llm import (  # noqa: E402
    causal_lm_feeds,
    export_causal_lm,
    generate_greedy,
    kernels,
    run_eager,
)
from irkit.llm.kernels.rglru import rnn_scan  # noqa: E402
from tests.capabilities import require_config_dtype  # noqa: E402

VOCAB = 300
EOS = 1
CONV = 4  # conv1d_width: the prompts below are longer
WINDOW = 4  # attention_window_size: prompt + new tokens cross it


def _config() -> object:
    # w_init_variance_scale 1: the tiny random model produces varied ids (not one token repeated)
    return transformers.RecurrentGemmaConfig(
        vocab_size=VOCAB, hidden_size=64, lru_width=64, intermediate_size=128,
        num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=1, head_dim=16,
        attention_window_size=WINDOW, conv1d_width=CONV,
        block_types=["recurrent", "recurrent", "attention"], bos_token_id=0, eos_token_id=EOS,
        pad_token_id=2, w_init_variance_scale=1.0, final_w_init_variance_scale=1.0,
    )  # fmt: skip


def _model() -> object:
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(_config()).eval()


def _scan_inputs(seq: int) -> tuple:
    g = torch.Generator().manual_seed(seq)
    x = torch.randn(2, seq, 8, generator=g)
    a = torch.rand(2, seq, 8, generator=g)
    positions = torch.arange(seq)[None] + torch.tensor([[0], [3]])  # row 0 starts a document
    return x, a, positions[:, :, None] == 0, torch.randn(2, 8, generator=g)


@pytest.mark.parametrize("seq", [1, 6])
@pytest.mark.parametrize("initial", [False, True])
def test_rnn_scan_equals_the_python_loop(seq: int, initial: bool) -> None:
    x, a, reset, state = _scan_inputs(seq)
    init = state if initial else None
    lru = rg.RecurrentGemmaRglru.__new__(rg.RecurrentGemmaRglru)  # (the method reads no field)
    want = rg.RecurrentGemmaRglru._rnn_scan(lru, x, a, reset, init)
    got = rnn_scan(lru, x, a, reset, init)
    torch.testing.assert_close(got, want, atol=0, rtol=0)


def test_rnn_scan_holds_state_at_pads() -> None:
    x, a, reset, state = _scan_inputs(6)
    mask = torch.tensor([[1] * 6, [1, 1, 1, 0, 0, 0]])  # row 1 right-padded
    with kernels.padding_mask(mask):
        _, held = rnn_scan(None, x, a, reset, state)
    _, prefix = rnn_scan(None, x[1:, :3], a[1:, :3], reset[1:, :3], state[1:])
    torch.testing.assert_close(held[1], prefix[0], atol=0, rtol=0)


def test_methods_are_swapped_by_qualified_name_and_put_back() -> None:
    model = _model()
    block = type(model.model.layers[0].temporal_block)
    original = vars(block)["forward"], vars(rg.RecurrentGemmaRglru)["_rnn_scan"]
    with kernels.export_kernels(model) as names:
        assert names == ["RecurrentGemmaRecurrentBlock.forward", "RecurrentGemmaRglru._rnn_scan"]
        assert vars(block)["forward"] is kernels.METHODS["RecurrentGemmaRecurrentBlock.forward"]
    assert (vars(block)["forward"], vars(rg.RecurrentGemmaRglru)["_rnn_scan"]) == original


def _require_position_keyed_blocks() -> None:
    """Skips where the recurrent block picks prefill or decode by ``cache_position`` (transformers
    4.54): torch.export then specializes the sequence length (a constraint violation, irkit's
    ``ExportError``); transformers 5 picks by ``position_ids``."""
    if "cache_position" in inspect.signature(rg.RecurrentGemmaRecurrentBlock.forward).parameters:
        pytest.skip("transformers' RecurrentGemma recurrent block branches on cache_position")


@pytest.fixture(scope="module")
def exported() -> tuple[object, object]:
    _require_position_keyed_blocks()
    model = _model()
    return model, export_causal_lm(model)


def test_module_held_states_are_cache_kinds(exported) -> None:
    model, export = exported
    assert export.input_names[3:] == [
        "past_key_values.2.key", "past_key_values.2.value", "past.0.conv", "past.1.conv",
        "past.0.recurrent", "past.1.recurrent",
    ]  # fmt: skip
    shapes = {spec.past_name: spec.shape for spec in export.cache.states}
    assert shapes["past.0.conv"] == (64, CONV - 1) and shapes["past.0.recurrent"] == (64,)
    block = model.model.layers[0].temporal_block
    assert block.conv1d_state is None and block.rg_lru.recurrent_states is None  # left as it was


@pytest.mark.parametrize("target", ["onnx", "ort"])
def test_greedy_ids_equal_generate(exported, target: str, tmp_path: pathlib.Path) -> None:
    model, export = exported
    lowered = irkit.optimize(irkit.lower(export.program, **export.lower_kwargs()), target)
    path = irkit.save(lowered, tmp_path / "model.onnx")
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    ids = torch.tensor([[2, 2, 5, 17, 42, 9, 11, 33], [3, 8, 4, 77, 4, 5, 6, 90]])
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1, 1], [1] * 8])  # left-padded, as generate pads
    for rows in (slice(1, 2), slice(0, 2)):  # batch 1, then a left-padded batch 2
        with torch.no_grad():
            want = model.generate(
                input_ids=ids[rows], attention_mask=mask[rows], do_sample=False,
                max_new_tokens=12, eos_token_id=None, pad_token_id=2,
            )  # fmt: skip
        got = generate_greedy(
            session, ids[rows].numpy(), mask[rows].numpy(), max_new_tokens=12, pad_token_id=2
        )
        np.testing.assert_array_equal(got, want.numpy())
        assert len(set(want[-1, 8:].tolist())) >= 6  # varied ids


def test_a_decode_step_from_random_states_equals_eager(exported, tmp_path: pathlib.Path) -> None:
    """Every state read and written where the model keeps it: a one-token step (transformers'
    decode path: conv1d_state and recurrent_states continued) from random past states."""
    model, export = exported
    path = irkit.save(irkit.lower(export.program, **export.lower_kwargs()), tmp_path / "m.onnx")
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for batch, past in ((1, 4), (2, 9)):
        feeds = causal_lm_feeds(model, batch=batch, seq=1, past=past, layout=export.cache)
        for want, got in zip(run_eager(model, feeds), session.run(None, feeds), strict=True):
            np.testing.assert_allclose(got, want, atol=5e-5, rtol=1e-4)


@pytest.mark.slow
def test_genai_generator_equals_generate(tmp_path: pathlib.Path) -> None:
    pytest.importorskip("onnxruntime_genai")
    _require_position_keyed_blocks()
    require_config_dtype()
    from irkit.cli import main
    from tests.llm import genai_support as gs

    model = _model()
    folder = gs.save_folder(tmp_path / "hf", model, gs.tokenizer(vocab_size=VOCAB))
    out = tmp_path / "out"
    assert main(["export", str(folder), "-o", str(out), "-q", "--target", "onnx"]) == 0
    decoder = json.loads((out / "genai_config.json").read_text())["model"]["decoder"]
    # the local attention layer's keys/values grow, the window is the graph's mask
    assert decoder["layer_types"] == ["linear_attention", "linear_attention", "full_attention"]
    assert decoder["conv_cache_size"] == CONV - 1
    prompts = ["hello world the quick", "the lazy dog jumps over the brown fox and hello world"]
    for batch in (prompts[:1], prompts):  # genai right-pads the shorter prompt of the batch
        got = [gs.until_eos(ids, EOS) for ids in gs.genai_ids(out, batch, 16)]
        want = [gs.until_eos(ids, EOS) for ids in gs.reference_ids(folder, batch, 16, model)]
        assert got == want
        assert max(len(set(ids)) for ids in want) >= 6
