"""Input files are never modified, and load errors are irkit's own."""

from __future__ import annotations

import hashlib

import onnx
import pytest

import irkit
from tests import zoo


def _digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_optimizing_and_outlining_a_loaded_model_leaves_its_files_untouched(tmp_path):
    src = irkit.save(
        irkit.lower(zoo.export("llama"), functions=False), tmp_path / "in.onnx", external_data=True
    )
    data = tmp_path / "in.onnx.data"
    before = (_digest(src), _digest(data))
    model = irkit.load(src)
    irkit.optimize(model)
    irkit.outline(model)
    irkit.save(model, tmp_path / "out.onnx", external_data=True)
    assert (_digest(src), _digest(data)) == before


def test_load_errors_name_the_file(tmp_path):
    with pytest.raises(irkit.ModelLoadError, match="no such file"):
        irkit.load(tmp_path / "missing.onnx")
    (tmp_path / "junk.onnx").write_bytes(b"not a model at all")
    with pytest.raises(irkit.ModelLoadError, match="junk.onnx"):
        irkit.load(tmp_path / "junk.onnx")


def _value_infos(path) -> dict[str, list[str]]:
    """Every ``value_info`` name of the file: the main graph's, then each function's."""
    proto = onnx.load(path, load_external_data=False)
    names = {"<main graph>": sorted(info.name for info in proto.graph.value_info)}
    for function in proto.functions:
        names[function.name] = sorted(info.name for info in function.value_info)
    return names


@pytest.mark.parametrize("external_data", [False, True], ids=["inline", "external"])
@pytest.mark.parametrize("name", sorted(zoo.ZOO))
def test_load_then_save_writes_the_same_bytes_value_info_included(tmp_path, name, external_data):
    # onnx-ir 1.1 reads a function's inputs by name alone: without irkit.load putting their
    # value_info back, an optimized Llama's functions kept 53 of their 93 entries.
    model = irkit.optimize(irkit.lower(zoo.export(name)))
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = irkit.save(model, tmp_path / "a" / "m.onnx", external_data=external_data)
    second = irkit.save(irkit.load(first), tmp_path / "b" / "m.onnx", external_data=external_data)
    before, after = _value_infos(first), _value_infos(second)
    assert after == before
    assert sum(map(len, before.values())) > len(before["<main graph>"]) > 0
    assert second.read_bytes() == first.read_bytes()
    if external_data:
        assert (tmp_path / "b" / "m.onnx.data").read_bytes() == (
            tmp_path / "a" / "m.onnx.data"
        ).read_bytes()
