"""``outline`` needs only the model: ``outline(lower(ep, functions=False))`` is ``lower(ep)``."""

from __future__ import annotations

import pytest
import torch

import irkit
from irkit import metadata as md
from tests import zoo
from tests.hierarchy.test_outline_torch import Outputs, X


def _bytes(model, tmp_path, name: str) -> bytes:
    return irkit.save(model, tmp_path / f"{name}.onnx").read_bytes()


def _outlined_twice(ep, tmp_path) -> tuple[bytes, bytes]:
    """The bytes of ``lower(ep)`` and of ``outline(lower(ep, functions=False))``; each stage's
    result passes irkit.lint."""
    direct = _bytes(irkit.lint(irkit.lower(ep)), tmp_path, "direct")
    flat = irkit.lint(irkit.lower(ep, functions=False))
    staged = _bytes(irkit.lint(irkit.outline(flat)), tmp_path, "staged")
    return direct, staged


def test_preserved_signatures_travel_in_the_model(tmp_path):
    with torch.no_grad():
        ep = torch.export.export(
            Outputs().eval(), (X,), preserve_module_call_signature=("pair", "dict")
        )
    flat = irkit.lower(ep, functions=False)
    assert md.decode_call_signatures(flat.metadata_props[md.CALL_SIGNATURES]) == {
        "pair": (["x"], ["add", "mul"]),
        "dict": (["mul"], ["sigmoid", "tanh", "exp"]),
    }
    direct, staged = _outlined_twice(ep, tmp_path)
    assert staged == direct
    # ... and after a save/load round trip, outlining a file gives the same function signatures.
    loaded = irkit.outline(irkit.load(irkit.save(flat, tmp_path / "flat.onnx")))
    pair = loaded.functions[("tests.hierarchy", "PairOut", "")]
    assert [v.name for v in pair.outputs] == ["add", "mul"]


def test_without_preserved_signatures_no_key_is_written():
    with torch.no_grad():
        ep = torch.export.export(Outputs().eval(), (X,))
    assert md.CALL_SIGNATURES not in irkit.lower(ep, functions=False).metadata_props


@pytest.mark.slow
def test_llama_outline_after_flat_lowering_is_byte_identical(tmp_path):
    direct, staged = _outlined_twice(zoo.export("llama"), tmp_path)
    assert len(direct) > 10_000
    assert staged == direct
