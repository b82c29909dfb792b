"""The text, JSON and onnx-text dumps: golden files, exact numbers, colour rules."""

from __future__ import annotations

import json

import onnx_ir as ir
import pytest

import irkit
from irkit import viz
from tests.viz import models
from tests.viz.conftest import check_golden, run_cli


@pytest.mark.parametrize(
    ("golden", "args"),
    [
        ("toy.txt", []),
        ("toy_stats.txt", ["--stats"]),
        ("toy_depth1.txt", ["--depth", "1"]),
        ("toy_expand.txt", ["--expand", "layers.1"]),
        ("toy_function_block.txt", ["--function", "Block"]),
        ("toy_module_mlp.txt", ["--function", "layers.2.mlp"]),
        ("toy.json", ["--format", "json"]),
        ("toy_onnx.txt", ["--format", "onnx-text"]),
    ],
)
def test_cli_golden(toy, golden, args):
    result = run_cli(toy, *args, cwd=toy.parent)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    check_golden(golden, result.stdout)


def test_dump_is_deterministic(toy):
    """Same bytes on every run (fresh process, so no dict-order or id() luck)."""
    runs = [run_cli(toy, "--stats", cwd=toy.parent).stdout for _ in range(2)]
    assert runs[0] == runs[1]
    assert runs[0] == viz.render_text(
        viz.summarize(__import__("irkit").load(toy), name="toy.onnx"), viz.TextOptions(stats=True)
    )


def test_summary_numbers():
    s = viz.summarize(models.stack(4, d=8))
    layers = s.root.children
    assert [c.path for c in layers] == ["layers.0", "layers.1", "layers.2", "layers.3"]
    block = layers[2]
    # wq 64 + bq 8 + wo 64 + w1 256 + b1 32 + w2 256 + b2 8 = 688 float32 parameters.
    assert (block.params, block.param_bytes) == (688, 688 * 4)
    assert [c.path for c in block.children] == ["layers.2.attn", "layers.2.mlp"]
    assert block.children[1].params == 256 + 32 + 256 + 8
    assert block.body.calls == 4 and block.children[0].body.calls == 4
    assert block.body.node_count == 11
    assert dict(s.root.body.ops) == {"MatMul": 17, "Add": 20, "Softmax": 4, "Relu": 4}
    # Attention: 2 MatMuls [B,S,8]x[8,8] = 2·2·64·B·S; MLP: 2·2·256·B·S; head 2·8·11·B·S.
    assert s.root.body.flops.text() == f"{4 * (256 + 1024) + 176}·B·S"
    assert s.params == 4 * 688 + 88
    assert [i.type_text() for i in s.inputs] == ["f32[B,S,8]"]


def test_grouping_fits_one_screen_for_64_layers():
    text = viz.render_text(viz.summarize(models.stack(64)))
    assert "layers.0 … layers.63  Block ×64  11 nodes · 688 params (2.7 KiB) each" in text
    assert len(text.splitlines()) < 25


def test_json_schema_fields(toy):
    data = json.loads(run_cli(toy, "--format", "json").stdout)
    assert data["schema"] == "irkit.viz/2"
    assert data["totals"]["nodes"] == 34
    assert [f["id"] for f in data["functions"]] == [
        "tests.viz.toy::Attention",
        "tests.viz.toy::Block",
        "tests.viz.toy::MLP",
    ]
    assert data["tree"]["children"][1]["children"][0]["path"] == "layers.1.attn"


def test_color_only_when_asked(toy):
    plain = run_cli(toy).stdout  # stdout is a pipe: no colour
    assert "\x1b[" not in plain
    colored = run_cli(toy, "--color", "always").stdout
    assert "\x1b[" in colored
    no_color = run_cli(toy, "--color", "auto", env={"NO_COLOR": "1"}).stdout
    assert no_color == plain


def test_model_without_irkit_metadata_falls_back_to_names():
    model = ir.from_onnx_text(
        """
        <ir_version: 10, opset_import: ["" : 21, "local" : 1]>
        g (float[N,4] x) => (float[N,4] y) {
            h = local.Twice (x)
            y = local.Twice (h)
        }
        <domain: "local", opset_import: ["" : 21]>
        Twice (a) => (b) { t = Add (a, a)
                           b = Relu (t) }
        """
    )
    model.graph.node(0).name = "first"
    s = viz.summarize(model)
    assert [(c.path, c.cls) for c in s.root.children] == [
        ("first", "local.Twice"),
        ("Twice_1", "local.Twice"),
    ]
    text = viz.render_text(s)
    assert "first  Twice  2 nodes" in text
    assert "ops:\n  Add 2    Relu 2\n" in text


def test_recursive_function_is_a_user_error():
    model = ir.from_onnx_text(
        """
        <ir_version: 10, opset_import: ["" : 21, "local" : 1]>
        g (float[2] x) => (float[2] y) { y = local.Loop (x) }
        <domain: "local", opset_import: ["" : 21, "local" : 1]>
        Loop (a) => (b) { b = local.Loop (a) }
        """
    )
    with pytest.raises(irkit.errors.IrkitError, match="'local::Loop' calls itself"):
        viz.summarize(model)


def test_a_dot_that_returns_too_few_svgs_is_a_viz_error(monkeypatch):
    """``layout_svg`` splits ``dot``'s output at each XML header: a count that does not match
    the sources it was given (a broken Graphviz) is reported, not mispaired."""
    graphviz = pytest.importorskip("graphviz")
    from irkit.viz._dot import layout_svg

    one_svg = b'<?xml version="1.0"?>\n<svg xmlns="http://www.w3.org/2000/svg"/>\n'
    monkeypatch.setattr(graphviz, "pipe", lambda *args, **kwargs: one_svg)
    assert layout_svg(["digraph a {}"]) == [one_svg.decode()]
    with pytest.raises(irkit.VizError, match="returned 1 SVG documents for 2 graphs"):
        layout_svg(["digraph a {}", "digraph b {}"])
