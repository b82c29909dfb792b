"""Constants a ``meta``-device model builds in ``forward`` keep their values when it is exported.

``torch.export`` lifts what ``forward`` creates from Python data (the index tensor of
``y[..., [0, 2, 4]]``, ``torch.tensor(factors, device=x.device)``) as constants of the program;
on a ``meta`` model they land on ``meta`` without values. :func:`irkit.llm._meta.fake_weights`
runs the ``meta`` weights as weightless fake CPU tensors instead, so those constants are real
while no weight is ever materialized, and leaves the model as it was.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensor

import irkit
from irkit.errors import WeightsError
from irkit.llm._meta import fake_weights, probe_mode
from irkit.weights import is_weightless
from tests.helpers import FP32_ATOL, run_ort

SCALE = [1.0, 2.0, 3.0]
PICKED = [0, 2, 4]


class BuildsConstants(torch.nn.Module):
    """A layer whose ``forward`` builds two constants, one cached lazily (as longrope does)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(4, 6)
        self.register_buffer("offset", torch.arange(6.0), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = (self.proj(x) + self.offset)[..., PICKED]  # list index: an int64 constant
        scale = getattr(self, "scale", None)
        if scale is None:  # computed on first use and kept on the module
            scale = torch.tensor(SCALE, device=x.device)
            self.scale = scale
        return y * scale


def _models() -> tuple[BuildsConstants, BuildsConstants]:
    torch.manual_seed(0)
    real = BuildsConstants().eval()
    return real, BuildsConstants().eval().to("meta")


def _export(model: torch.nn.Module, device: str = "cpu") -> torch.export.ExportedProgram:
    x = torch.zeros(2, 4, device=device)
    return torch.export.export(model, (x,), dynamic_shapes=({0: torch.export.Dim("batch")},))


def _constants(program: torch.export.ExportedProgram) -> list[torch.Tensor]:
    names = program.graph_signature.lifted_tensor_constants
    return [program.constants[name] for name in names]


def test_on_meta_the_constants_have_no_values():
    _, meta = _models()
    constants = _constants(_export(meta, "meta"))
    assert [c.device.type for c in constants] == ["meta", "meta"]


def test_constants_built_in_forward_have_values_and_weights_none(tmp_path):
    real, meta = _models()
    with fake_weights(meta):
        program = _export(meta)
    constants = _constants(program)
    assert [c.tolist() for c in constants] == [PICKED, SCALE]
    assert all(not isinstance(c, FakeTensor) and c.device.type == "cpu" for c in constants)
    assert all(isinstance(t, FakeTensor) for t in program.state_dict.values())  # no weight data
    model = irkit.lower(program)
    weightless = {v.name for v in model.graph.initializers.values() if is_weightless(v.const_value)}
    assert weightless == {"proj.weight", "proj.bias", "offset"}
    path = irkit.save(
        model, tmp_path / "m.onnx", weights=[real.state_dict(), {"offset": real.offset}]
    )
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    (got,) = run_ort(str(path), [x])
    want = real(torch.from_numpy(x)).detach().numpy()
    np.testing.assert_allclose(got, want, atol=FP32_ATOL)


def test_the_model_is_left_as_it_was():
    _, meta = _models()
    weight, offset = meta.proj.weight, meta.offset
    with fake_weights(meta) as mode:
        assert mode is not None
        inside = meta.proj.weight
        assert isinstance(inside, FakeTensor) and isinstance(inside, torch.nn.Parameter)
        assert inside.device.type == "cpu" and inside.shape == weight.shape
        assert isinstance(meta.offset, FakeTensor) and meta.offset.device.type == "cpu"
        _export(meta)
        assert hasattr(meta, "scale")  # forward cached its constant ...
    assert not hasattr(meta, "scale")  # ... which is dropped on exit
    assert meta.proj.weight is weight and meta.offset is offset
    assert "offset" in meta._non_persistent_buffers_set


def test_tied_weights_stay_tied():
    with torch.device("meta"):
        model = torch.nn.Sequential(torch.nn.Embedding(8, 4), torch.nn.Linear(4, 8, bias=False))
    model[1].weight = model[0].weight
    with fake_weights(model):
        assert model[1].weight is model[0].weight
        assert isinstance(model[0].weight, FakeTensor)
    assert model[1].weight is model[0].weight and model[0].weight.device.type == "meta"


def test_a_model_with_real_weights_is_left_alone():
    real, _ = _models()
    weight = real.proj.weight
    with fake_weights(real) as mode:
        assert mode is None
        assert real.proj.weight is weight
        real(torch.zeros(1, 4))
    assert real.scale.tolist() == SCALE  # a real model's own run is its business


def test_probe_mode_runs_a_meta_model_for_shapes():
    _, meta = _models()
    with torch.no_grad(), probe_mode(meta):
        out = meta(torch.ones(5, 4))  # a real input: converted to a fake one
        assert isinstance(out, FakeTensor)
        assert tuple(out.shape) == (5, 3)
    assert not hasattr(meta, "scale") and meta.proj.weight.device.type == "meta"


@pytest.mark.parametrize("size", [1 << 15])
def test_a_large_meta_model_is_never_materialized(size):
    with torch.device("meta"):
        model = torch.nn.Linear(size, size, bias=False)  # 4 GiB in float32
    with fake_weights(model):
        program = torch.export.export(model, (torch.zeros(1, size),))
    (weight,) = program.state_dict.values()
    assert isinstance(weight, FakeTensor) and weight.untyped_storage().device.type == "meta"


def test_the_programs_fake_weights_are_refused_as_weights(tmp_path):
    _, meta = _models()
    with fake_weights(meta):
        program = _export(meta)
    with pytest.raises(WeightsError, match="meta or fake tensor"):
        irkit.save(irkit.lower(program), tmp_path / "m.onnx", weights=program.state_dict)
    assert not (tmp_path / "m.onnx").exists()
