"""A causal LM without a cache (GPT-1: its forward takes no past_key_values) exports with ids in
and logits out, and :func:`irkit.llm.generate_greedy` runs it by re-reading the sequence;
``irkit export`` refuses it before tracing (genai carries a cache between steps)."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest

from tests.llm import genai_support as gs

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")
pytestmark = pytest.mark.slow

import irkit  # noqa: E402
from irkit.cli import main  # noqa: E402
from irkit.llm import causal_lm_feeds, export_causal_lm, generate_greedy, run_eager  # noqa: E402


def _gpt1() -> object:
    torch.manual_seed(0)
    config = transformers.OpenAIGPTConfig(
        vocab_size=300, n_embd=64, n_layer=2, n_head=4, n_positions=128, initializer_range=0.3
    )
    return transformers.OpenAIGPTLMHeadModel(config).eval()


def test_uncached_model_exports_and_generates(tmp_path: pathlib.Path) -> None:
    model = _gpt1()
    exported = export_causal_lm(model)
    assert exported.input_names == ["input_ids", "attention_mask", "position_ids"]
    assert exported.output_names == ["logits"]
    lowered = irkit.lower(exported.program, **exported.lower_kwargs())
    irkit.optimize(lowered)
    irkit.save(lowered, tmp_path / "gpt1.onnx")
    session = ort.InferenceSession(str(tmp_path / "gpt1.onnx"))
    feeds = causal_lm_feeds(model, batch=2, seq=9, past=0, layout=exported.cache)
    np.testing.assert_allclose(session.run(None, feeds)[0], run_eager(model, feeds)[0], atol=1e-4)
    ids = torch.tensor([[5, 17, 42, 9, 11]])
    want = model.generate(ids, do_sample=False, max_new_tokens=10, pad_token_id=0)
    got = generate_greedy(session, ids.numpy(), max_new_tokens=10)
    np.testing.assert_array_equal(got, want.numpy())
    assert len(set(want[0, 5:].tolist())) >= 2  # not one token repeated


def test_export_refuses_an_uncached_model_before_tracing(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = gs.save_folder(tmp_path / "hf", _gpt1(), gs.tokenizer(vocab_size=300))
    assert main(["export", str(folder), "-o", str(tmp_path / "out"), "-q"]) == 2
    err = capsys.readouterr().err
    assert "has no cache" in err and "generate_greedy" in err and "'openai-gpt'" in err
    assert not (tmp_path / "out").exists()
