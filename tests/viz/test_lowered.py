"""viz on real models from ``irkit.lower`` (torch is used here only to make them)."""

from __future__ import annotations

import json
from collections import Counter

import pytest

import irkit
from irkit import metadata, viz
from tests import zoo
from tests.viz.conftest import run_cli


@pytest.fixture(scope="module")
def lowered(tmp_path_factory):
    model = irkit.lower(zoo.export("stack2"), functions=False)
    path = irkit.save(model, tmp_path_factory.mktemp("lowered") / "stack2.onnx")
    return model, path


def test_text_and_json_of_a_lowered_model(lowered):
    model, path = lowered
    ops = Counter(n.op_type for n in model.graph)
    result = run_cli(path, "--format", "json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["totals"]["nodes"] == len(model.graph)
    assert data["op_histogram"] == dict(sorted(ops.items()))
    params = sum(v.const_value.size for v in model.graph.initializers.values())
    assert data["totals"]["params"] == params
    text = run_cli(path).stdout
    assert text.startswith(f"stack2.onnx  {len(model.graph)} nodes")
    top = max(ops.items(), key=lambda kv: (kv[1], kv[0]))
    assert f"{top[0]} {top[1]}" in text


def test_flat_model_shows_modules_from_scopes(lowered):
    _, path = lowered
    lines = run_cli(path, "--depth", "2").stdout.splitlines()
    assert lines[1] == "modules (from irkit.scope; not outlined into functions):"
    assert lines[2].startswith("├─ layers.0 … layers.1  PreLNBlock ×2  ")
    assert lines[2].endswith(" nodes each")
    assert [line.split()[2] for line in lines[3:7]] == ["ln1", "attn", "ln2", "mlp"]


def test_node_card_carries_provenance(lowered):
    model, _ = lowered
    from irkit.viz import _html

    node = next(n for n in model.graph if n.op_type == "MatMul" or n.op_type == "Gemm")
    info = _html.node_info(viz.summarize(model), node, set(), {})
    fields = dict(info["fields"])
    assert fields["source"] == node.metadata_props[metadata.SOURCE]
    assert fields["fx node"] == node.metadata_props[metadata.FX_NODE]
    assert fields["module"] == metadata.node_scope(node.metadata_props)[-1].call_id


def test_lowered_model_diff_with_itself_is_empty(lowered):
    _, path = lowered
    result = run_cli(path, "--diff", path)
    assert result.stdout.splitlines()[1] == "no differences"


def test_diff_of_flat_models_names_modules_from_scopes(lowered, tmp_path):
    model, path = lowered
    other = irkit.load(path)
    softmax = next(n for n in other.graph if n.op_type == "Softmax")
    softmax.op_type = "LogSoftmax"
    module = metadata.node_scope(softmax.metadata_props)[-1].call_id
    irkit.save(other, tmp_path / "changed.onnx")
    text = run_cli(path, "--diff", tmp_path / "changed.onnx").stdout
    cls = metadata.node_scope(softmax.metadata_props)[-1].class_name
    assert text.splitlines()[3:] == [
        "modules:",
        f"  {module}  {cls}  Softmax -1, LogSoftmax +1",
        f"    ~ Softmax  {softmax.name} → LogSoftmax",
    ]


def test_diff_after_irkit_optimize_names_the_fused_modules(tmp_path):
    model = irkit.lower(zoo.export("llama"), functions=False)
    before = irkit.save(model, tmp_path / "llama.onnx")
    report = irkit.RewriteReport()
    irkit.optimize(model, report=report)
    assert report.fired["RMSNormalization"] == 5
    after = irkit.save(model, tmp_path / "llama_opt.onnx")
    data = json.loads(run_cli(before, "--diff", after, "--format", "json").stdout)
    fused = {
        m["path"]: m["class"] for m in data["modules"] if m["ops_delta"].get("RMSNormalization")
    }
    assert fused == {
        "layers.0.input_layernorm": "LlamaRMSNorm",
        "layers.0.post_attention_layernorm": "LlamaRMSNorm",
        "layers.1.input_layernorm": "LlamaRMSNorm",
        "layers.1.post_attention_layernorm": "LlamaRMSNorm",
        "norm": "LlamaRMSNorm",
    }
    assert data["ops_delta"]["RMSNormalization"] == 5
    text = run_cli(before, "--diff", after).stdout
    assert "  layers.0.input_layernorm  LlamaRMSNorm  " in text
    assert "more (--format json lists all)" in text  # long lists are cut


@pytest.mark.browser
def test_flat_model_page_opens_modules_as_regions(lowered, tmp_path, chromium):
    """A flat model's page shows its top-level module calls as boxes; opening one lays out
    only that module (its sub-modules are boxes again), and the panel opens modules too."""
    from tests.viz.cdp import Browser

    _, path = lowered
    out = tmp_path / "flat.html"
    assert run_cli(path, "-o", out, env={"PATH": str(tmp_path)}).returncode == 0
    regions = "[...document.querySelectorAll('#canvas g.node.region')].map(g => g.id)"
    with Browser(out.as_uri()) as b:
        assert b.evaluate(regions) == ["r:scope:layers.0", "r:scope:layers.1", "r:scope:ln_f"]
        tree = b.evaluate("document.getElementById('tree').textContent")
        assert "layers.0 … layers.1 PreLNBlock ×2" in tree
        b.evaluate(
            "document.getElementById('r:scope:layers.1')"
            ".dispatchEvent(new MouseEvent('click', {bubbles: true}))"
        )
        assert b.evaluate("window.irkitViz.trail()") == [
            ["main", "main"],
            ["scope:layers.1", "layers.1"],
        ]
        assert b.evaluate(regions) == [
            "r:scope:layers.1.ln1",
            "r:scope:layers.1.attn",
            "r:scope:layers.1.ln2",
            "r:scope:layers.1.mlp",
        ]
        b.evaluate(
            "[...document.querySelectorAll('#tree .leaf')].find(e => e.textContent.startsWith"
            "('ln_f')).dispatchEvent(new MouseEvent('click', {bubbles: true}))"
        )
        assert b.evaluate("window.irkitViz.trail().at(-1)") == ["scope:ln_f", "ln_f"]
        ops = b.evaluate(
            "[...document.querySelectorAll('#canvas g.node.op')].map(g => g.textContent)"
        )
        assert ops and all(op for op in ops)
        assert b.errors == []


def test_flat_model_page_with_graphviz_keeps_clusters(lowered, tmp_path, graphviz_dot):
    _, path = lowered
    out = tmp_path / "flat.html"
    assert run_cli(path, "-o", out, "--layout", "dot").returncode == 0
    page = out.read_text()
    for cluster in ("c:layers.0", "c:layers.1", "c:layers.0.attn", "c:layers.1.mlp"):
        assert f'id=\\"{cluster}\\"' in page  # inside the JSON blob


def test_torch_exporter_scopes_group_a_flat_export(tmp_path):
    """PyTorch's own exporter (``torch.onnx.export(..., dynamo=True)``) writes
    ``pkg.torch.onnx.name_scopes``/``class_hierarchy`` on every node: the text tree and the
    page's regions show its modules."""
    import torch

    z = zoo.prenorm_stack(2)
    path = tmp_path / "stack2_torch.onnx"
    torch.onnx.export(z.module, z.args, dynamo=True, verbose=False).save(str(path))
    lines = run_cli(path, "--depth", "2", env={"PATH": str(tmp_path)}).stdout.splitlines()
    assert lines[1] == "modules (from pkg.torch.onnx.name_scopes; not outlined into functions):"
    assert lines[2].startswith("├─ layers.0 … layers.1  PreLNBlock ×2  ")
    assert [line.split()[2] for line in lines[3:7]] == ["ln1", "attn", "ln2", "mlp"]
    out = tmp_path / "stack2_torch.html"
    assert run_cli(path, "-o", out, env={"PATH": str(tmp_path)}).returncode == 0
    blob = out.read_text().split('type="application/json">', 1)[1].split("</script>", 1)[0]
    main = json.loads(blob)["graphs"]["main"]["graph"]
    boxes = [n[1][:2] for n in main["nodes"] if n[2] == "region"]
    assert boxes[:2] == [["layers.0", "PreLNBlock"], ["layers.1", "PreLNBlock"]]
