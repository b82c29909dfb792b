"""``bench/bench_causal_lm_sweep.py``'s grouping of failures by mechanism (no model is built)."""

from __future__ import annotations

from bench import bench_causal_lm_sweep as sweep


def test_normalize_strips_what_differs_between_models():
    lfm2 = (
        "ExportError: export_causal_lm: layer 0 of Lfm2ForCausalLM's cache (Lfm2ShortConvLayer) "
        "holds no 4-d key/value tensors (batch, heads, sequence, head_dim)\nmore"
    )
    mamba = (
        "ExportError: export_causal_lm: layer 3 of MambaForCausalLM's cache (MambaCacheLayer) "
        "holds no 4-d key/value tensors (batch, heads, sequence, head_dim)"
    )
    assert sweep.normalize(lfm2) == sweep.normalize(mamba)
    assert sweep.normalize(lfm2).startswith("ExportError: export_causal_lm: layer N of …")
    assert "\n" not in sweep.normalize(lfm2)
    qwen = "ExportError: running Qwen3_5ForCausalLM on a 2-token prompt failed: IndexError: x"
    assert (
        sweep.normalize(qwen) == "ExportError: running … on a N-token prompt failed: IndexError: x"
    )
    assert sweep.normalize("ExportError: running xLSTMForCausalLM on").endswith("running … on")


def test_normalize_drops_versions_and_quoted_names():
    a = (
        "ExportError: export_causal_lm: torch.export failed with transformers 5.24.0, torch "
        "2.13.0 (tested: transformers 4.54 … 5.24 with torch 2.13): KeyError: 'full_attention'"
    )
    b = a.replace("5.24.0", "5.25.1").replace("'full_attention'", "'sliding'")
    assert sweep.normalize(a) == sweep.normalize(b)
    assert "transformers" not in sweep.normalize(a)


def test_summary_counts_exact_over_built_and_groups():
    results = [
        {"type": "llama", "target": "ort", "stage": "exact"},
        {"type": "xlm", "target": "ort", "stage": "exact", "cache": False},
        {"type": "gpt2", "target": "ort", "stage": "ids", "detail": "batch 1: …"},
        {"type": "lfm2", "target": "ort", "stage": "export", "error": "ExportError: layer 0 x"},
        {"type": "mamba", "target": "ort", "stage": "export", "error": "ExportError: layer 1 x"},
        {"type": "dbrx", "target": "ort", "stage": "config", "error": "AttributeError: no"},
    ]
    lines = sweep.summarize(results, ["ort"])
    # a type exported without a cache (the cached export failed) is counted apart, by name
    assert lines[0] == ("[ort] exact 2/5 (6 types mapped): with cache 1, without 1 (no cache: xlm)")
    assert "  export: ExportError: layer N x (2 types: lfm2, mamba)" in lines
    assert "  ids (1 types: gpt2)" in lines
    groups = [line for line in lines if "types:" in line]
    assert groups[0].startswith("  config:")  # in stage order


def test_a_reference_problem_is_grouped_by_its_reason():
    reason = "ReferenceProblem: transformers' generate (cached, one token at a time) differs"
    results = [
        {"type": "zamba2", "target": "ort", "stage": "reference", "error": reason},
        {"type": "gpt2", "target": "ort", "stage": "ids", "detail": "batch 1: …"},
    ]
    lines = sweep.summarize(results, ["ort"])
    assert lines[0] == "[ort] exact 0/2 (2 types mapped): with cache 0, without 0"
    assert f"  reference: {sweep.normalize(reason)} (1 types: zamba2)" in lines
    assert lines.index("  ids (1 types: gpt2)") > 2  # after the reference problems
