"""A checkpoint whose fused tensor transformers splits on load (``query_key_value`` →
``q_proj``/``k_proj``/``v_proj``: a ``Split`` weight converter) exports from its folder, the
parts streamed as slices of the checkpoint tensor, and runs in genai equal to ``generate``."""

from __future__ import annotations

import pathlib

import pytest

from tests.llm import genai_support as gs

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
pytest.importorskip("onnxruntime_genai")
pytestmark = pytest.mark.slow

from irkit.cli import main  # noqa: E402


def test_fused_qkv_checkpoint_exports_and_runs(tmp_path: pathlib.Path) -> None:
    import safetensors

    config = transformers.AutoConfig.for_model(
        "sarvam_moe", vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, bos_token_id=0, eos_token_id=1,
        pad_token_id=2, initializer_range=0.3,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    folder = gs.save_folder(tmp_path / "hf", model, gs.tokenizer(vocab_size=300))
    with safetensors.safe_open(str(next(folder.glob("*.safetensors"))), "pt") as f:
        keys = list(f.keys())
    assert any("query_key_value" in k for k in keys)  # the checkpoint holds the fused tensor
    assert main(["export", str(folder), "-o", str(tmp_path / "out"), "-q"]) == 0
    prompts = ["hello world the quick", "the lazy dog jumps over the brown fox and hello world"]
    got = [gs.until_eos(ids, 1) for ids in gs.genai_ids(tmp_path / "out", prompts, 16)]
    want = [gs.until_eos(ids, 1) for ids in gs.reference_ids(folder, prompts, 16, model)]
    assert got == want
