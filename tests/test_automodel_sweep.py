"""``bench/bench_automodel_sweep.py``: its summary and grouping, inputs by parameter name, and one
tiny model end to end (bert, in a worker subprocess)."""

from __future__ import annotations

import types

import numpy as np
import pytest

from bench import bench_automodel_sweep as sweep


def _results():
    return [
        {"type": "bert", "stage": "ok", "stock": "ok"},
        {"type": "gpt2", "stage": "compare", "stock": "ok", "detail": "output 0: …"},
        {"type": "llama", "stage": "lower", "stock": "ok", "error": "LoweringError: op aten.x.y N"},
        {"type": "mamba", "stage": "lower", "stock": "stock-export", "error": "LoweringError: op aten.x.y 3"},
        {"type": "vit", "stage": "ok", "stock": "stock-ort-run", "stock_error": "Fail: [ONNXRuntimeError] 1"},
        {"type": "lxmert", "stage": "inputs", "error": "InputsError: no rule builds forward parameter 'x'"},
        {"type": "sam", "stage": "export", "error": "UserError: data-dependent 7"},
        {"type": "dbrx", "stage": "config", "error": "AttributeError: no"},
    ]  # fmt: skip


def test_summary_counts_over_exported_and_names_irkit_only_failures():
    lines = sweep.summarize(_results())
    assert lines[0] == (
        "irkit ok 2/5, stock ok 3/5, irkit-only failures 2 (8 types run, 5 exported)"
    )
    assert lines[-1] == "irkit-only failures: gpt2, llama"
    assert "  lower: LoweringError: op aten.x.y N (2 types: llama, mamba)" in lines
    assert "  compare (1 types: gpt2)" in lines
    assert "  stock-ort-run: Fail: [ONNXRuntimeError] N (1 types: vit)" in lines
    assert "  stock-export (1 types: mamba)" in lines


def test_the_model_inputs_and_export_are_not_counted():
    lines = sweep.summarize(_results())
    head = lines[lines.index("not counted (the model, its inputs or torch.export):") + 1 :]
    head = head[: head.index("irkit failures:")]
    assert [line.split(":")[0].strip() for line in head] == ["config", "inputs", "export"]
    assert "InputsError: no rule builds forward parameter '…'" in head[1]


def test_compare_scales_the_tolerance_by_the_output():
    big = np.full((2, 3), 1000.0, np.float32)
    assert sweep.compare([big + 0.5], [big])[0]  # 5e-4 of the scale
    assert not sweep.compare([big + 2.0], [big])[0]
    small = np.zeros((2, 3), np.float32)
    assert not sweep.compare([small + 2e-3], [small])[0]  # scale at least 1
    assert not sweep.compare([small], [small, small])[0]
    assert "shape" in sweep.compare([small[:1]], [small])[1]


def test_inputs_come_from_forward_parameter_names():
    class Text:
        main_input_name = "input_ids"

        def forward(self, input_ids=None, attention_mask=None, decoder_input_ids=None):
            pass

    class Vision:
        main_input_name = "pixel_values"

        def forward(self, pixel_values, output_hidden_states=None):
            pass

    class Unknown:
        main_input_name = "input_ids"

        def forward(self, input_ids, mystery_tensor):
            pass

    text = types.SimpleNamespace(vocab_size=50, is_encoder_decoder=True, pad_token_id=0)
    feeds = sweep.build_inputs(Text(), text)
    assert list(feeds) == ["input_ids", "attention_mask", "decoder_input_ids"]
    assert feeds["input_ids"].shape == (sweep.BATCH, sweep.SEQ) and feeds["input_ids"].max() < 50
    assert feeds["decoder_input_ids"].shape == (sweep.BATCH, sweep.DECODER_SEQ)
    vision = types.SimpleNamespace(
        vision_config=types.SimpleNamespace(image_size=24, num_channels=1)
    )
    assert sweep.build_inputs(Vision(), vision)["pixel_values"].shape == (sweep.BATCH, 1, 24, 24)
    with pytest.raises(sweep.InputsError, match="mystery_tensor"):
        sweep.build_inputs(Unknown(), text)


@pytest.mark.slow
def test_bert_end_to_end_in_a_worker():
    result = sweep._run_one("bert", timeout=240)
    assert result["stage"] == "ok", result.get("error")
    assert result["stock"] == "ok", result.get("stock_error")
    assert result["inputs"] == {"input_ids": [2, 8], "attention_mask": [2, 8]}


def test_the_innermost_cause_groups_a_wrapped_error():
    header = (
        "ConversionError: Failed to convert the exported program. \x1b[96mThis is step 3/3\x1b[0m"
    )
    results = [
        {"type": t, "stage": "ok", "stock": "stock-export", "stock_error": header,
         "stock_cause": f"DispatchError: No ONNX function found for {op}"}
        for t, op in (("afmoe", "'aten.a'"), ("t5", "'aten.b'"))
    ]  # fmt: skip
    lines = sweep.summarize(results)
    assert (
        "  stock-export: DispatchError: No ONNX function found for '…' (2 types: afmoe, t5)"
        in lines
    )
    assert sweep.group_key("stock-export", header) == (
        "stock-export: ConversionError: Failed to convert the exported program. This is step N/N"
    )


def test_modal_adds_the_other_modalities_a_rule_builds():
    class Dual:
        main_input_name = "input_ids"

        def forward(self, input_ids=None, pixel_values=None, visual_feats=None, visual_pos=None):
            pass

    config = types.SimpleNamespace(vocab_size=50, image_size=16, num_channels=3)
    assert list(sweep.build_inputs(Dual(), config)) == ["input_ids"]
    wide = sweep.build_inputs(Dual(), config, modal=True)
    assert list(wide) == ["input_ids", "pixel_values", "visual_feats", "visual_pos"]
    assert wide["pixel_values"].shape == (sweep.BATCH, 3, 16, 16)


@pytest.mark.slow
def test_layoutlm_runs_in_onnxruntime():
    """Once irkit-only: the fused Attention had a [batch, 1, 1, seq] mask onnxruntime's CPU kernel
    refuses; the fusion now expands the mask's query axis (issue 32, rules/attention.py)."""
    result = sweep._run_one("layoutlm", timeout=240)
    assert result["stock"] == "ok", result.get("stock_error")
    assert result["stage"] == "ok", result.get("error")


def test_a_program_that_draws_random_numbers_groups_its_compare_row_by_the_ops():
    import torch

    class Noisy(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = torch.nn.functional.dropout(x, 0.1, training=False)  # off: no draw
            x = torch.nn.functional.scaled_dot_product_attention(x, x, x)  # dropout_p 0
            return x + torch.rand(x.shape)

    program = torch.export.export(Noisy(), (torch.zeros(1, 2, 3),), strict=False)
    assert sweep.random_ops(program) == ["aten.rand.default"]
    rows = [
        {"type": "vit_mae", "stage": "compare", "stock": "stock-compare", "random_ops": ["aten.rand.default"]},
        {"type": "gpt2", "stage": "compare", "stock": "ok"},
    ]  # fmt: skip
    lines = sweep.summarize(rows)
    assert (
        "  compare: the program draws random numbers (aten.rand.default) (1 types: vit_mae)"
        in lines
    )
    assert "  compare (1 types: gpt2)" in lines
    assert (
        "  stock-compare: the program draws random numbers (aten.rand.default) (1 types: vit_mae)"
        in lines
    )
