"""Every format with nothing but pip: Graphviz's ``dot`` hidden from PATH (the CLI is started
by absolute interpreter path, so an empty PATH hides every system program)."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest

import irkit
from irkit import viz
from tests.viz import models
from tests.viz.conftest import run_cli

SVG = "{http://www.w3.org/2000/svg}"


@pytest.fixture
def no_dot(tmp_path) -> dict[str, str]:
    empty = tmp_path / "empty_path"
    empty.mkdir()
    return {"PATH": str(empty)}


@pytest.fixture(scope="module")
def control_flow(tmp_path_factory):
    d = tmp_path_factory.mktemp("cf")
    model = models.control_flow()
    path = irkit.save(model, d / "cf.onnx")
    changed = models.control_flow()
    then = changed.graph.node("top_if").attributes["then_branch"].as_graph()
    then.node(0).op_type = "Sub"  # Mul → Sub inside one branch
    other = irkit.save(changed, d / "cf2.onnx")
    return path, other


def _ok(result) -> str:
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    return result.stdout


def test_every_format_without_dot(toy, tmp_path, no_dot):
    text = _ok(run_cli(toy, env=no_dot))
    assert "layers.0 … layers.2  Block ×3" in text
    assert "ToyStack" in _ok(run_cli(toy, "--format", "onnx-text", env=no_dot))
    data = json.loads(_ok(run_cli(toy, "--format", "json", env=no_dot)))
    assert [c["path"] for c in data["tree"]["children"]] == ["layers.0", "layers.1", "layers.2"]
    dot = _ok(run_cli(toy, "--format", "dot", env=no_dot))
    assert dot.startswith("digraph {") and '"layers.1\\nBlock\\n11 nodes · body ×3"' in dot

    svg = _ok(run_cli(toy, "--format", "svg", env=no_dot))
    root = ET.fromstring(svg.encode())
    calls = root.findall(f".//{SVG}g[@class='node call']")
    texts = [[t.text for t in g.findall(f"{SVG}text")] for g in calls]
    assert texts == [
        ["layers.0", "Block", "11 nodes · body ×3"],
        ["layers.1", "Block", "11 nodes · body ×3"],
        ["layers.2", "Block", "11 nodes · body ×3"],
    ]
    ops = root.findall(f".//{SVG}g[@class='node op']")
    assert [g.find(f"{SVG}text").text for g in ops] == ["MatMul"]
    assert len(root.findall(f".//{SVG}g[@class='edge']")) == 5  # x → 3 calls → MatMul → logits
    body = _ok(run_cli(toy, "--format", "svg", "--function", "Block", env=no_dot))
    assert body.count('class="node call"') == 2 and ">attn<" in body and ">mlp<" in body

    out = tmp_path / "toy.html"
    _ok(run_cli(toy, "-o", out, env=no_dot))
    page = out.read_text()
    assert "var dagre=" in page  # the layout library is inlined: no network, no CDN
    assert "<script src" not in page and "http://" not in page.replace(
        'xmlns="http://www.w3.org/2000/svg"', ""
    ).replace("http://www.w3.org/2000/svg", "")
    blob = page.split('<script id="irkit-data" type="application/json">', 1)[1]
    data = json.loads(blob.split("</script>", 1)[0])
    main = data["graphs"]["main"]["graph"]
    assert [n[1] for n in main["nodes"] if n[2] == "call"] == [
        ["layers.0", "Block", "11 nodes · body ×3"],
        ["layers.1", "Block", "11 nodes · body ×3"],
        ["layers.2", "Block", "11 nodes · body ×3"],
    ]
    assert sorted(data["graphs"]) == [
        "main",
        "tests.viz.toy::Attention",
        "tests.viz.toy::Block",
        "tests.viz.toy::MLP",
    ]


def test_diff_without_dot(toy, toy_fused, tmp_path, no_dot):
    out = tmp_path / "diff.html"
    _ok(run_cli(toy, "--diff", toy_fused, "--format", "html", "-o", out, env=no_dot))
    page = out.read_text()
    assert page.count("<svg") == 2  # the MLP body before | after
    assert 'class="node op removed"' in page and 'class="node op added"' in page
    assert ">Gemm<" in page


def test_control_flow_opens_like_calls_in_text_json_dot(control_flow, no_dot):
    path, _ = control_flow
    text = _ok(run_cli(path, env=no_dot))
    assert text.splitlines()[:7] == [
        "cf.onnx  2 nodes (13 stored in 6 graphs)",
        "├─ top_if.else_branch  If  2 nodes  → f32[2]",
        "├─ top_if.then_branch  If  2 nodes  → f32[2]",
        "├─ loop.body  Loop  3 nodes  → b8[], f32[2]",
        "│  ├─ inner_if.else_branch  If  2 nodes  → f32[2]",
        "│  ├─ inner_if.then_branch  If  2 nodes  → f32[2]",
        "│  └─ · 3 ops: Add, Identity, If",
    ]
    body = _ok(run_cli(path, "--function", "main/loop.body", env=no_dot))
    assert body.startswith("subgraph main/loop.body of Loop  3 nodes stored")
    assert "inner_out = If(cond_in) <else_branch=graph, then_branch=graph>" in body
    data = json.loads(_ok(run_cli(path, "--format", "json", env=no_dot)))
    loop = data["tree"]["children"][2]
    assert (loop["path"], loop["origin"], loop["function"], loop["class"]) == (
        "loop.body",
        "subgraph",
        None,
        "Loop",
    )
    assert [c["path"] for c in loop["children"]] == [
        "loop.body/inner_if.else_branch",
        "loop.body/inner_if.then_branch",
    ]
    dot = _ok(run_cli(path, "--format", "dot", env=no_dot))
    for key in (
        "main/top_if.then_branch",
        "main/top_if.else_branch",
        "main/loop.body",
        "main/loop.body/inner_if.then_branch",
    ):
        assert f'id="g:{key}"' in dot
    assert dot.count('subgraph "cluster_') == 5


def test_control_flow_diff(control_flow, no_dot):
    a, b = control_flow
    text = _ok(run_cli(a, "--diff", b, env=no_dot))
    assert "  top_if.then_branch  If  Mul -1, Sub +1" in text
    assert "    ~ Mul  then_Mul → Sub" in text
    out = a.parent / "cf_diff.html"
    _ok(run_cli(a, "--diff", b, "-f", "html", "-o", out, env=no_dot))
    page = out.read_text()
    assert "before: main/top_if.then_branch" in page and "after: main/top_if.then_branch" in page
    assert page.count('class="node op changed"') == 2


def test_flat_graph_without_metadata_is_cut_into_runs():
    """No scope metadata at all: the page's regions are runs of at most 400 nodes, chained by
    the values that cross them."""
    from irkit.viz import _regions

    model = models.torch_exporter_flat(10, 100)
    for node in model.graph:
        node.metadata_props.clear()
    root = _regions.build_regions(model.graph)
    assert [(r.key, r.label, r.size) for r in root.children.values()] == [
        ("chunk:0-399", "nodes 0–399", 400),
        ("chunk:400-799", "nodes 400–799", 400),
        ("chunk:800-999", "nodes 800–999", 200),
    ]
    graphs = _regions.region_graphs(viz.summarize(model), root)
    assert graphs["main"].edges == [
        ("x0", "r:chunk:0-399", "f32[B,8]"),
        ("r:chunk:0-399", "r:chunk:400-799", "f32[B,8]"),
        ("r:chunk:400-799", "r:chunk:800-999", "f32[B,8]"),
        ("r:chunk:800-999", "y0", ""),
    ]
    middle = graphs["chunk:400-799"]
    assert [n.id for n in middle.nodes if n.kind == "input"] == ["x0"]  # the value from run 1
    assert sum(n.kind == "op" for n in middle.nodes) == 400
