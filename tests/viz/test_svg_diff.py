"""SVG/DOT pictures (built-in layout, and Graphviz's with --layout dot) and the diff."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest

from irkit import viz
from tests.viz import models
from tests.viz.conftest import check_golden, run_cli

SVG = "{http://www.w3.org/2000/svg}"


def _groups(svg_text: str, cls: str) -> list[ET.Element]:
    root = ET.fromstring(svg_text.encode())
    return [g for g in root.iter(f"{SVG}g") if cls in (g.get("class") or "").split()]


@pytest.mark.parametrize("layout", ["builtin", "dot"])
def test_svg_has_one_group_per_top_level_call(toy, layout, request):
    if layout == "dot":
        request.getfixturevalue("graphviz_dot")  # the optional Graphviz layout, where installed
    result = run_cli(toy, "--format", "svg", "--layout", layout)
    assert result.returncode == 0, result.stderr
    calls = _groups(result.stdout, "call")
    assert len(calls) == 3  # layers.0, layers.1, layers.2
    titles = ["".join(t.itertext()) for g in calls for t in g.iter(f"{SVG}text")]
    assert [t for t in titles if t.startswith("layers.")] == ["layers.0", "layers.1", "layers.2"]
    assert len(_groups(result.stdout, "op")) == 1  # lm_head MatMul
    edge_labels = {
        "".join(t.itertext()) for g in _groups(result.stdout, "edge") for t in g.iter(f"{SVG}text")
    }
    assert "f32[B,S,8]" in edge_labels  # shapes on edges


def test_svg_of_a_function_body(toy):
    result = run_cli(toy, "--format", "svg", "--function", "Block")
    assert len(_groups(result.stdout, "call")) == 2  # attn, mlp
    assert len(_groups(result.stdout, "op")) == 2  # the residual Adds


def test_dot_source_golden(toy):
    result = run_cli(toy, "--format", "dot", "--function", "Attention")
    assert result.returncode == 0
    check_golden("toy_attention.dot", result.stdout)


def test_diff_with_itself_is_empty(toy):
    result = run_cli(toy, "--diff", toy)
    assert result.returncode == 0
    assert result.stdout.splitlines()[1] == "no differences"
    data = json.loads(run_cli(toy, "--diff", toy, "--format", "json").stdout)
    assert data["modules"] == [] and data["ops_delta"] == {}


def test_diff_names_the_fused_module(toy, toy_fused):
    result = run_cli(toy.name, "--diff", toy_fused.name, cwd=toy.parent)
    assert result.returncode == 0, result.stderr
    check_golden("toy_diff.txt", result.stdout)
    data = json.loads(
        run_cli(toy.name, "--diff", toy_fused.name, "-f", "json", cwd=toy.parent).stdout
    )
    assert [m["path"] for m in data["modules"]] == ["layers.0.mlp", "layers.1.mlp", "layers.2.mlp"]
    assert data["modules"][0]["ops_delta"] == {"Add": -1, "Gemm": 1, "MatMul": -1}
    assert data["ops_delta"] == {"Add": -3, "Gemm": 3, "MatMul": -3}


def test_diff_reports_changed_and_inlined_modules():
    a = models.stack(2)
    b = models.stack(2)
    # "changed": same node name, other op; and the last Block call inlined away (module removed).
    attention = b.functions[(models.PKG, "Attention", "")]
    softmax = next(n for n in attention if n.op_type == "Softmax")
    softmax.op_type = "LogSoftmax"
    diff = viz.diff_summaries(viz.summarize(a, name="a"), viz.summarize(b, name="b"))
    assert [(m.path, m.status) for m in diff.modules] == [
        ("layers.0.attn", "changed"),
        ("layers.1.attn", "changed"),
    ]
    assert diff.modules[0].body.changed[0][1].op_type == "LogSoftmax"
    text = viz.render_diff_text(diff)
    assert "layers.0.attn … layers.1.attn  Attention ×2  Softmax -1, LogSoftmax +1 each" in text
    assert "    ~ Softmax  attn/Softmax_2 → LogSoftmax" in text


def test_diff_html_side_by_side(toy, toy_fused, tmp_path):
    out = tmp_path / "diff.html"
    result = run_cli(toy, "--diff", toy_fused, "-o", out)
    assert result.returncode == 0, result.stderr
    page = out.read_text()
    assert page.count('<div class="pair">') == 1  # one changed body pair (MLP)
    assert "before: tests.viz.toy::MLP" in page and "after: tests.viz.toy::MLP" in page
    assert 'class="node op removed"' in page and 'class="node op added"' in page
    assert "http://" not in page.replace("http://www.w3.org", "")  # nothing fetched
