"""The HTML page in a real headless Chromium (Debian's), driven over the DevTools protocol."""

from __future__ import annotations

import os
import shutil

import pytest

import irkit
from tests import zoo
from tests.viz import models
from tests.viz.conftest import ARTIFACTS, ROOT, run_cli

pytestmark = pytest.mark.browser

CLICK = "(el) => el.dispatchEvent(new MouseEvent('click', {bubbles: true}))"


def _click_call(b, label: str) -> None:
    """Click the function box whose text contains ``label`` in the shown graph."""
    found = b.evaluate(
        f"""(() => {{
          const g = [...document.querySelectorAll('#canvas g.node.call')]
            .find((n) => [...n.querySelectorAll('text')].some((t) => t.textContent === {label!r}));
          if (!g) return false;
          ({CLICK})(g);
          return true;
        }})()"""
    )
    assert found, f"no call box {label!r}"


def _trail(b) -> list[str]:
    return [label for _, label in b.evaluate("window.irkitViz.trail()")]


def _no_dot(tmp_path) -> dict[str, str]:
    """An environment whose PATH holds no program at all: no Graphviz."""
    empty = tmp_path / "empty_path"
    empty.mkdir(exist_ok=True)
    return {"PATH": str(empty)}


@pytest.fixture
def page(tmp_path, toy, chromium):
    from tests.viz.cdp import Browser

    out = tmp_path / "toy.html"
    result = run_cli(toy, "--format", "html", "-o", out, env=_no_dot(tmp_path))
    assert result.returncode == 0, result.stderr
    with Browser(out.as_uri()) as browser:
        yield browser


def test_html_page_in_chromium(page):
    b = page
    assert b.evaluate("document.querySelectorAll('#canvas g.node.call').length") == 3
    assert b.evaluate("document.querySelectorAll('#tree summary, #tree .leaf').length") >= 3
    # Drill into a Block call, then into its attention call.
    _click_call(b, "layers.1")
    assert _trail(b) == ["main", "layers.1"]
    assert b.evaluate("document.querySelector('#canvas svg .graph > text').textContent") == (
        "tests.viz.toy::Block"
    )
    assert b.evaluate("window.irkitViz.layoutMs('tests.viz.toy::Block')") is not None
    assert b.evaluate("document.querySelectorAll('#canvas g.node.call').length") == 2
    _click_call(b, "attn")
    assert _trail(b) == ["main", "layers.1", "layers.1.attn"]
    # Click a primitive node: its card shows module path, source and attributes.
    b.evaluate(
        f"({CLICK})([...document.querySelectorAll('#canvas g.node.op')]"
        ".find((n) => n.textContent.includes('Softmax')))"
    )
    card = b.evaluate("document.getElementById('side').innerText")
    assert "Softmax" in card and "toy/modeling.py:13" in card and "layers.0.attn" in card
    assert "axis" in card
    # Breadcrumb back to the top.
    b.evaluate(f"({CLICK})(document.querySelector('#crumbs-path a'))")
    assert _trail(b) == ["main"]
    assert b.evaluate("document.querySelectorAll('#canvas g.node.call').length") == 3
    # Search finds a node inside a function body and opens it.
    b.evaluate(
        "(() => { const s = document.getElementById('search'); s.value = 'relu';"
        " s.dispatchEvent(new Event('input')); })()"
    )
    results = b.evaluate("[...document.querySelectorAll('#results > div')].map((d) => d.innerText)")
    assert len(results) == 1 and "Relu" in results[0] and "MLP" in results[0]
    b.evaluate(f"({CLICK})(document.querySelector('#results > div'))")
    assert b.evaluate("window.irkitViz.trail().at(-1)[0]") == "tests.viz.toy::MLP"
    assert b.evaluate("document.querySelector('#canvas g.node.hl').textContent.trim()") == "Relu"
    # The picture for the docs: the Block body with a call's card.
    _click_call_path(b)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    b.screenshot(ARTIFACTS / "viz_html_toy.png")
    card = b.evaluate("document.getElementById('side').innerText")
    assert (
        card.startswith("tests.viz.toy::MLP layers.1.mlp\nmodule\tlayers.1.mlp")
        and "1024·B·S" in card
    )
    assert b.errors == []


def _click_call_path(b) -> None:
    b.evaluate("window.irkitViz.search(document.getElementById('search').value = '')")
    b.evaluate(f"({CLICK})(document.querySelector('#crumbs-path a'))")
    _click_call(b, "layers.1")
    b.evaluate(
        "(() => { const g = [...document.querySelectorAll('#canvas g.node.call')][1];"
        " g.dispatchEvent(new MouseEvent('click', {bubbles: true, shiftKey: true})); })()"
    )


def test_node_card_parameters_attributes_and_copy_path(page):
    """Netron-style essentials: an initializer's dtype/shape and first values, attributes in
    full, and a button that copies the node's or module's path."""
    b = page
    b.evaluate(
        f"({CLICK})([...document.querySelectorAll('#canvas g.node.op')]"
        ".find((n) => n.textContent.trim() === 'MatMul'))"
    )
    card = _card(b)
    assert "parameters\nlm_head.weight\tf32[8,11]\n\t[" in card, card
    assert "(88 values)" in card
    first = b.evaluate(
        "document.querySelector('#side table.params tr:nth-child(2) td.mono').textContent"
    )
    assert first.startswith("[") and len(first.split(",")) == 9  # 8 values and "… ]"
    b.evaluate(f"({CLICK})(document.querySelector('#side button.copy-path'))")
    assert b.evaluate("window.irkitViz.copied()") == "lm_head/lm_head/MatMul"
    _click_call(b, "layers.2")
    b.evaluate(
        "[...document.querySelectorAll('#canvas g.node.call')].find((n) => n.textContent.includes"
        "('mlp')).dispatchEvent(new MouseEvent('click', {bubbles: true, shiftKey: true}))"
    )
    b.evaluate(f"({CLICK})(document.querySelector('#side button.copy-path'))")
    assert b.evaluate("window.irkitViz.copied()") == "layers.2.mlp"
    _click_call(b, "attn")
    b.evaluate(
        f"({CLICK})([...document.querySelectorAll('#canvas g.node.op')]"
        ".find((n) => n.textContent.trim() === 'Softmax'))"
    )
    assert "attributes\naxis\t-1" in _card(b)
    b.evaluate(f"({CLICK})(document.querySelector('#side button.copy-path'))")
    assert b.evaluate("window.irkitViz.copied()").startswith("layers.2.attn/")
    assert b.errors == []


def test_flat_20k_node_model_page(tmp_path, chromium):
    """A 20,000-node flat graph with PyTorch exporter scopes: written in seconds, the top level
    (200 layer boxes) shown at once, one module laid out when opened, search reaches any node."""
    from tests.viz.cdp import Browser

    path = irkit.save(models.torch_exporter_flat(200, 100), tmp_path / "flat20k.onnx")
    out = tmp_path / "flat20k.html"
    result = run_cli(path, "-o", out, env=_no_dot(tmp_path))
    assert result.returncode == 0, result.stderr
    with Browser(out.as_uri(), timeout=60) as b:
        regions = b.evaluate(
            "[...document.querySelectorAll('#canvas g.node.region')].map(g => g.id)"
        )
        assert regions == [f"r:scope:layers.{i}" for i in range(200)]
        assert b.evaluate("document.querySelectorAll('#canvas g.node.op').length") == 0
        assert b.evaluate("document.querySelector('#tree').innerText").count("×200") == 3
        shown = b.evaluate("window.irkitViz.firstPaintMs")
        assert shown < 20000, shown
        b.evaluate(f"({CLICK})(document.getElementById('r:scope:layers.199'))")
        b.evaluate(f"({CLICK})(document.getElementById('r:scope:layers.199.attn'))")
        assert _trail(b) == ["main", "layers.199", "layers.199.attn"]
        ops = b.evaluate(
            "[...document.querySelectorAll('#canvas g.node.op')].map(n => n.textContent)"
        )
        assert len(ops) == 50 and ops[0] == "MatMul"
        b.evaluate("window.irkitViz.search('node_add_12345')")
        b.evaluate(f"({CLICK})(document.querySelector('#results > div'))")
        assert _trail(b) == ["main", "layers.123", "layers.123.attn"]
        assert b.evaluate("document.querySelector('#canvas g.node.hl').id") == "n12345"
        card = _card(b)
        assert "module\tlayers.123.attn\nclass\tmodel.Attention" in card
        assert b.errors == []


def test_control_flow_drill_down(tmp_path, chromium):
    """If/Loop nodes open like calls: a one-subgraph Loop opens on click, an If offers its
    branches; breadcrumbs lead back."""
    from tests.viz.cdp import Browser

    path = irkit.save(models.control_flow(), tmp_path / "cf.onnx")
    out = tmp_path / "cf.html"
    assert run_cli(path, "-o", out, env=_no_dot(tmp_path)).returncode == 0
    flows = "[...document.querySelectorAll('#canvas g.node.flow')].map(n => n.textContent)"
    with Browser(out.as_uri()) as b:
        assert b.evaluate(flows) == ["Iftop_ifelse_branch · then_branch", "Looploopbody"]
        b.evaluate(f"({CLICK})(document.querySelectorAll('#canvas g.node.flow')[1])")
        assert _trail(b) == ["main", "loop.body"]
        assert b.evaluate(flows) == ["Ifinner_ifelse_branch · then_branch"]
        b.evaluate(f"({CLICK})(document.querySelector('#canvas g.node.flow'))")
        buttons = b.evaluate(
            "[...document.querySelectorAll('#side button.open-branch')].map(x => x.textContent)"
        )
        assert buttons == ["open else_branch ›", "open then_branch ›"]
        b.evaluate(f"({CLICK})(document.querySelectorAll('#side button.open-branch')[1])")
        assert _trail(b) == ["main", "loop.body", "loop.body/inner_if.then_branch"]
        ops = b.evaluate(
            "[...document.querySelectorAll('#canvas g.node.op')].map(n => n.textContent)"
        )
        assert ops == ["Add", "Relu"]
        b.evaluate(f"({CLICK})(document.querySelector('#crumbs-path a'))")
        assert _trail(b) == ["main"]
        assert b.errors == []


def test_large_model_page_stays_usable(tmp_path, chromium):
    from tests.viz.cdp import Browser

    path = irkit.save(models.stack(64, d=16, extra_ops=40), tmp_path / "big.onnx")
    out = tmp_path / "big.html"
    result = run_cli(path, "-o", out, env=_no_dot(tmp_path))
    assert result.returncode == 0, result.stderr
    with Browser(out.as_uri()) as b:
        # The 64 Block calls are one group in the hierarchy tree; bodies render on demand.
        assert b.evaluate("document.querySelectorAll('#canvas svg').length") == 1
        assert b.evaluate("document.querySelector('#tree').innerText").count("×64") >= 3
        _click_call(b, "layers.63")
        _click_call(b, "mlp")
        assert _trail(b) == ["main", "layers.63", "layers.63.mlp"]
        assert b.evaluate("document.querySelectorAll('#canvas g.node.op').length") == 45
        assert b.errors == []


def _card(b) -> str:
    return b.evaluate("document.getElementById('side').innerText")


def test_real_outlined_llama_page(tmp_path, chromium):
    """irkit.lower's llama (module functions): drill into a decoder layer and its attention,
    search into a shared body, and start the page on a module with --function/--depth."""
    from tests.viz.cdp import Browser

    path = irkit.save(irkit.lower(zoo.export("llama")), tmp_path / "llama.onnx")
    out = tmp_path / "llama.html"
    result = run_cli(path, "-o", out, env=_no_dot(tmp_path))
    assert result.returncode == 0, result.stderr
    with Browser(out.as_uri()) as b:
        _click_call(b, "layers.1")
        assert _trail(b) == ["main", "layers.1"]
        labels = b.evaluate(
            "[...document.querySelectorAll('#canvas g.node.call')].map((n) => n.textContent.trim())"
        )
        assert any("LlamaRMSNorm" in t and "body ×5" in t for t in labels), labels
        _click_call(b, "self_attn")
        assert _trail(b) == ["main", "layers.1", "layers.1.self_attn"]
        # The k_proj box names the deduplicated variant it runs.
        labels = b.evaluate(
            "[...document.querySelectorAll('#canvas g.node.call')]"
            ".map((n) => [...n.querySelectorAll('text')].map((t) => t.textContent).join('|'))"
        )
        assert "k_proj|Linear (Linear_1)|2 nodes · body ×4" in labels, labels
        b.evaluate(
            f"({CLICK})([...document.querySelectorAll('#canvas g.node.op')]"
            ".find((n) => n.textContent.trim() === 'Softmax'))"
        )
        card = _card(b)
        assert (
            card.startswith("Softmax")
            and f"llama/modeling_llama.py:{_attention_call_line()}" in card
        )
        assert "module\tlayers.1.self_attn\n" in card  # re-rooted: the body is layers.0's
        assert "class\ttransformers.models.llama.modeling_llama.LlamaAttention" in card
        # The page for the docs: a decoder layer with the card of its attention call.
        b.evaluate(f"({CLICK})(document.querySelectorAll('#crumbs-path a')[1])")
        b.evaluate(
            "[...document.querySelectorAll('#canvas g.node.call')].find((n) =>"
            " n.textContent.includes('self_attn')).dispatchEvent("
            "new MouseEvent('click', {bubbles: true, shiftKey: true}))"
        )
        assert _card(b).startswith("transformers.models.llama::LlamaAttention layers.1.self_attn")
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        b.screenshot(ARTIFACTS / "viz_html.png")
        if os.environ.get("IRKIT_REGEN_GOLDEN") == "1":
            shutil.copy(ARTIFACTS / "viz_html.png", ROOT / "docs" / "viz_html.png")
        # Search finds a node inside a shared function body and opens that body.
        b.evaluate("window.irkitViz.search('reducemean')")
        results = b.evaluate(
            "[...document.querySelectorAll('#results > div')].map((d) => d.innerText)"
        )
        assert len(results) == 1 and "LlamaRMSNorm" in results[0], results
        b.evaluate(f"({CLICK})(document.querySelector('#results > div'))")
        assert b.evaluate("window.irkitViz.trail().at(-1)[0]") == (
            "transformers.models.llama::LlamaRMSNorm"
        )
        assert b.evaluate("document.querySelector('#canvas g.node.hl').textContent.trim()") == (
            "ReduceMean"
        )
        assert b.errors == []
    # --function opens that very instance; --depth folds the panel below it.
    result = run_cli(path, "-o", out, "--function", "layers.1.mlp", "--depth", "1")
    assert result.returncode == 0, result.stderr
    with Browser(out.as_uri()) as b:
        assert _trail(b) == ["main", "layers.1", "layers.1.mlp"]
        assert b.evaluate("document.querySelectorAll('#tree details[open]').length") == 1
        assert b.errors == []


def _attention_call_line() -> int:
    """The line of ``LlamaAttention.forward``'s ``attention_interface(`` call in the installed
    transformers (the source line the Softmax node carries; it moves between releases)."""
    import inspect

    from transformers.models.llama import modeling_llama

    lines, start = inspect.getsourcelines(modeling_llama.LlamaAttention.forward)
    (offset,) = [i for i, line in enumerate(lines) if "= attention_interface(" in line]
    return start + offset
