"""Replay (a repeated call outlined from the template of an identical earlier call) must give
exactly the model that outlining every call one by one gives — and it must actually happen."""

from __future__ import annotations

import logging
import re
import warnings

import numpy as np
import onnx_ir as ir
import pytest

import irkit
from irkit.hierarchy import _outline as outline_module
from tests import zoo
from tests.helpers import run_ort
from tests.hierarchy import builders as B


def _no_replay(monkeypatch: pytest.MonkeyPatch) -> None:
    """Outline every call on its own: no class is a replay candidate."""
    monkeypatch.setattr(outline_module, "_repeated_classes", lambda tree: set())


def _outline(model: ir.Model, caplog: pytest.LogCaptureFixture, **kwargs) -> int:
    """Outline ``model`` in place; return how many calls were replayed (from the log)."""
    caplog.clear()
    with caplog.at_level(logging.INFO, logger=outline_module.__name__), warnings.catch_warnings():
        warnings.simplefilter("ignore", irkit.OutlineWarning)
        irkit.outline(model, **kwargs)
    found = re.findall(r"\((\d+) replayed", caplog.text)
    assert len(found) == 1, caplog.text
    return int(found[0])


def _text(model: ir.Model) -> bytes:
    """The whole model (graph, functions, metadata) as bytes: equal bytes, equal models."""
    return ir.to_proto(model).SerializeToString(deterministic=True)


def _both(build, caplog, monkeypatch, **kwargs) -> tuple[ir.Model, int, ir.Model]:
    with_replay = build()
    replayed = _outline(with_replay, caplog, **kwargs)
    _no_replay(monkeypatch)
    without = build()
    assert _outline(without, caplog, **kwargs) == 0
    monkeypatch.undo()
    return with_replay, replayed, without


@pytest.mark.parametrize(
    ("first_bias", "functions", "replayed"),
    [
        (True, True, 7),  # layer 0 outlined call by call, layers 1..7 replayed
        (False, True, 6),  # layer 0 differs (no bias): layer 1 is outlined too, 2..7 replayed
        # layer 3's fc1 stays inline: layer 3's subtree differs, so it is not replayed
        (True, lambda path, cls: path != "layers.3.fc1", 6),
        (True, ["layers.*"], 0),  # blocks only: no block has a child call to skip
    ],
)
def test_replay_equals_call_by_call_outlining(caplog, monkeypatch, first_bias, functions, replayed):
    def build() -> ir.Model:
        return B.stack(8, first_bias=first_bias)

    fast, count, slow = _both(build, caplog, monkeypatch, functions=functions)
    assert count == replayed
    assert _text(fast) == _text(slow)
    x = np.random.default_rng(0).standard_normal((3, B.STACK_D)).astype(np.float32)
    np.testing.assert_allclose(
        run_ort(fast, [x])[0], run_ort(build(), [x])[0], rtol=1e-5, atol=1e-5
    )


def test_replay_respects_max_depth(caplog, monkeypatch):
    fast, count, slow = _both(lambda: B.stack(5), caplog, monkeypatch, max_depth=2)
    assert count == 4
    assert _text(fast) == _text(slow)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "replayed"), [("stack4", 3), ("gpt2", 1), ("llama", 1), ("bert", 1)]
)
def test_replay_on_zoo_models(caplog, monkeypatch, name, replayed):
    ep = zoo.export(name)

    def build() -> ir.Model:
        return irkit.lower(ep, functions=False)

    fast, count, slow = _both(build, caplog, monkeypatch)
    assert count == replayed
    assert _text(fast) == _text(slow)


def test_no_template_from_a_split_call(caplog, monkeypatch):
    """A first call whose outlining left a note (here: a child split in two) is not replayed, so
    every later call still gets its own note and warning."""

    def build() -> ir.Model:
        b = B.Builder()
        x = b.input("x", [2, B.STACK_D])
        h = x
        for i in range(3):
            with b.module(f"layers.{i}", B.BLOCK):
                with b.module(f"layers.{i}.inner", B.RELU):
                    a = b.op("Relu", h)
                n = b.op("Neg", a)  # the block's own op between two pieces of `inner`
                with b.module(f"layers.{i}.inner", B.RELU):
                    h = b.op("Add", a, n)
        return b.model([h])

    fast, count, slow = _both(build, caplog, monkeypatch)
    assert count == 0
    assert _text(fast) == _text(slow)
    notes = [n for n in fast.graph.all_nodes() if "irkit.outline.note" in n.metadata_props]
    notes += [
        n for f in fast.functions.values() for n in f if "irkit.outline.note" in n.metadata_props
    ]
    assert notes
