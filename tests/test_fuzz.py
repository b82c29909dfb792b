"""Broken models: every outcome of load → check → optimize is success or an irkit error.

Random byte mutations of a saved (outlined) model, plus hand-made semantic breakages that
``irkit.check`` must reject with a :class:`irkit.CheckError` naming the problem. Deterministic
seeds; a few seconds.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import onnx_ir as ir
import pytest

import irkit
from irkit import metadata as md
from tests.hierarchy import builders

MUTATED_COPIES = 120


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> bytes:
    path = tmp_path_factory.mktemp("fuzz") / "stack.onnx"
    return irkit.save(irkit.outline(builders.stack(2)), path).read_bytes()


def _pipeline(path) -> list[str]:
    """load → check → optimize; the outcome of each stage reached (an irkit error class or ok)."""
    outcomes = []
    try:
        model = irkit.load(path)
    except irkit.IrkitError as exc:
        return [type(exc).__name__]
    for stage in (irkit.check, irkit.optimize):
        try:
            stage(model)
            outcomes.append("ok")
        except irkit.IrkitError as exc:
            outcomes.append(type(exc).__name__)
    return outcomes


def test_random_byte_mutations_end_in_success_or_an_irkit_error(saved, tmp_path):
    seen: dict[str, int] = {}
    for seed in range(MUTATED_COPIES):
        rng = random.Random(seed)
        data = bytearray(saved)
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        path = tmp_path / f"m{seed}.onnx"
        path.write_bytes(bytes(data))
        for outcome in _pipeline(path):  # any other exception fails the test here
            seen[outcome] = seen.get(outcome, 0) + 1
    # The mutations reach every stage: some files load, some are rejected at load.
    assert seen.get("ModelLoadError", 0) > 0
    assert seen.get("ok", 0) > 0


def _flat() -> ir.Model:
    return builders.stack(1)


def _dangling(m: ir.Model) -> None:
    ghost = ir.Value(name="ghost", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([8]))
    m.graph.node(1).replace_input_with(1, ghost)


def _cycle(m: ir.Model) -> None:
    first, second = m.graph.node(0), m.graph.node(1)
    first.replace_input_with(0, second.outputs[0])


def _duplicate_output_names(m: ir.Model) -> None:
    m.graph.node(1).outputs[0].name = m.graph.node(0).outputs[0].name


def _missing_opset_import(m: ir.Model) -> None:
    del m.opset_imports[""]


def _unknown_op(m: ir.Model) -> None:
    m.graph.node(2).op_type = "Frobnicate"


def _call_to_missing_function(m: ir.Model) -> None:
    irkit.outline(m)
    del m.functions[("torch.nn.modules", "ReLU", "")]


def _malformed_metadata(m: ir.Model) -> None:
    m.graph.node(0).metadata_props[md.SCOPE] = "[[1, 2]"


BREAKAGES: dict[str, tuple[Callable[[ir.Model], None], str]] = {
    "dangling input": (_dangling, "uses 'ghost', which no node, input or initializer"),
    "cycle": (_cycle, "before its producer"),
    "duplicate outputs": (_duplicate_output_names, "values in the main graph are named"),
    "missing opset import": (_missing_opset_import, "which is not in the opset imports"),
    "unknown op": (_unknown_op, "'Frobnicate' is not an ONNX op"),
    "call to a missing function": (
        _call_to_missing_function,
        "calls function torch.nn.modules::ReLU",
    ),
    "malformed metadata": (_malformed_metadata, "malformed irkit.scope metadata"),
}


@pytest.mark.parametrize("name", list(BREAKAGES))
def test_check_rejects_a_semantic_breakage_and_says_what(name, tmp_path):
    breakage, expected = BREAKAGES[name]
    model = _flat()
    breakage(model)
    with pytest.raises(irkit.CheckError) as info:
        irkit.check(model)
    assert expected in str(info.value)
    assert any(expected in p for p in info.value.problems)
    # The same file through the whole pipeline: success or an irkit error, never anything else.
    try:
        path = irkit.save(model, tmp_path / "broken.onnx")
    except irkit.IrkitError:
        return
    assert _pipeline(path)[0] in {"ok", "ModelLoadError", "CheckError"}
