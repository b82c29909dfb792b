"""Input files are never modified, and load errors are irkit's own."""

from __future__ import annotations

import hashlib

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
