"""viz on real *hierarchical* models: ``irkit.lower`` with its default module functions."""

from __future__ import annotations

import json

import pytest

import irkit
from tests import helpers, zoo
from tests.viz.conftest import run_cli


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    model = irkit.lower(zoo.export("stack4"))
    return model, irkit.save(model, tmp_path_factory.mktemp("outlined") / "stack4.onnx")


@pytest.fixture(scope="module")
def llama_pair(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("llama")
    model = irkit.lower(zoo.export("llama"))
    before = irkit.save(model, tmp / "llama.onnx")
    irkit.optimize(model)
    return before, irkit.save(model, tmp / "llama_opt.onnx")


def test_golden_text_of_a_real_outlined_model(stack):
    _, path = stack
    result = run_cli(path, "--stats")
    assert result.returncode == 0, result.stderr
    helpers.assert_golden(result.stdout, "viz/stack4_outlined_stats.txt")


def test_repeated_layers_are_one_grouped_line_with_the_shared_body(stack):
    model, path = stack
    lines = run_cli(path, "--depth", "1").stdout.splitlines()
    assert lines[1].startswith("├─ layers.0 … layers.3  PreLNBlock ×4  ")
    blocks = [f for f in model.functions.values() if f.name == "PreLNBlock"]
    assert len(blocks) == 1  # one body, four calls
    data = json.loads(run_cli(path, "--format", "json").stdout)
    assert data["totals"]["nodes"] == 233  # every call counted with its shared body


def test_function_dump_of_a_shared_body(stack):
    result = run_cli(stack[1], "--function", "PreLNBlock")
    assert result.returncode == 0, result.stderr
    assert "SelfAttention" in result.stdout and "FeedForward" in result.stdout


def test_diff_after_optimize_reports_the_fusion_in_the_norm_modules(llama_pair):
    before, after = llama_pair
    result = run_cli(before, "--diff", after)
    assert result.returncode == 0, result.stderr
    text = result.stdout
    assert "LlamaRMSNorm" in text and "RMSNormalization +1" in text
    same = run_cli(before, "--diff", before).stdout
    assert "RMSNormalization" not in same


def test_golden_text_of_an_outlined_llama(llama_pair):
    """Default dump with stats of the 2-layer llama: Linear variants named with their callers,
    FLOPs known through function bodies, shared bodies marked."""
    result = run_cli(llama_pair[0], "--stats")
    assert result.returncode == 0, result.stderr
    helpers.assert_golden(result.stdout, "viz/llama_outlined_stats.txt")
    assert (
        "k_proj  Linear ×2  2 nodes · 2048 params (8.0 KiB) each  → f32[2,8,32]  [body Linear_1 "
        "shared by 4 calls]" in result.stdout
    )


def test_diff_reports_the_rmsnorm_fusion_at_every_norm_module(llama_pair):
    before, after = llama_pair
    lines = run_cli(before, "--diff", after).stdout.splitlines()
    fused = [
        line.split()[0]
        for line in lines
        if "LlamaRMSNorm" in line and line.rstrip().endswith("RMSNormalization +1")
    ]
    assert fused == [
        "layers.0.input_layernorm",
        "layers.0.post_attention_layernorm",
        "layers.1.input_layernorm",
        "layers.1.post_attention_layernorm",
        "norm",
    ]


def test_json_of_a_flat_model_has_the_module_tree(tmp_path):
    flat = irkit.save(irkit.lower(zoo.export("stack2"), functions=False), tmp_path / "flat.onnx")
    outlined = irkit.save(irkit.lower(zoo.export("stack2")), tmp_path / "outlined.onnx")
    tree = json.loads(run_cli(flat, "--format", "json").stdout)["tree"]
    ref = json.loads(run_cli(outlined, "--format", "json").stdout)["tree"]
    assert tree["origin"] == "graph" and ref["origin"] == "graph"
    layer, ref_layer = tree["children"][0], ref["children"][0]
    assert (layer["path"], layer["origin"], layer["function"]) == ("layers.0", "scope", None)
    assert ref_layer["origin"] == "function"
    for key in ("class", "nodes", "params", "flops", "outputs"):
        assert layer[key] == ref_layer[key], key
    assert [c["path"] for c in layer["children"]] == [
        "layers.0.ln1",
        "layers.0.attn",
        "layers.0.ln2",
        "layers.0.mlp",
    ]
    assert layer["flops"] == {"terms": [{"coef": 3276800, "symbols": []}], "unknown_nodes": 0}
