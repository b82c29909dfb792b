"""Kernel-type legalization: ops torchlib writes for dtypes their kernels refuse still run.

Each case used to produce a file onnxruntime refuses (``InvalidGraph`` or ``NOT_IMPLEMENTED``):
now the op computes in the nearest wider dtype its kernel accepts, and the numbers and dtypes
match eager exactly.
"""

from __future__ import annotations

import collections

import numpy as np
import onnx_ir as ir
import pytest
import torch
from torch import nn

import irkit
from irkit.lowering._legalize import legalize_kernel_types
from tests import helpers

_BOOL = torch.tensor(
    [[True, False, True, False], [False, False, True, True], [True, True, False, False]]
)
_INT = torch.tensor([[-5, 3, 0, 7], [2, -1, 4, -6], [9, 8, -3, 1]])


class _Fn(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


def _lower_and_compare(fn, *args: torch.Tensor) -> ir.Model:
    module = _Fn(fn)
    model = irkit.lower(torch.export.export(module, args))
    outputs = helpers.run_ort(model, list(args))
    expected = helpers.flatten_outputs(module(*args))
    assert [(o.shape, o.dtype) for o in outputs] == [(e.shape, e.dtype) for e in expected]
    for out, want in zip(outputs, expected, strict=True):
        np.testing.assert_array_equal(out, want)
    return model


def _cast_targets(model: ir.Model) -> collections.Counter[str]:
    return collections.Counter(
        ir.DataType(n.attributes["to"].as_int()).name for n in model.graph if n.op_type == "Cast"
    )


@pytest.mark.parametrize(
    "fn, args",
    [
        (torch.ceil, (_INT,)),  # the schema has no integer Ceil/Floor/Round
        (torch.round, (_INT,)),
        (torch.isnan, (_INT,)),
        (torch.isfinite, (_BOOL,)),
        (lambda x: torch.sort(x, stable=True), (_BOOL,)),  # TopK has no bool
        (lambda x: torch.max(x, 1), (_BOOL,)),  # ArgMax has no bool
        (lambda x, m: x.masked_fill(m, True), (_BOOL, _INT > 0)),  # onnxruntime: no bool Where
        (torch.relu, (_INT,)),  # onnxruntime: no int64 Relu
        (lambda x, w: nn.functional.linear(x, w), (_INT, _INT[:2])),  # nor int64 Gemm
        (lambda x: nn.functional.max_pool2d(x, 2), (_INT.reshape(1, 1, 3, 4),)),
        (lambda x: nn.functional.pixel_shuffle(x, 2), (_INT.reshape(1, 4, 3, 1),)),
        (torch.heaviside, (_BOOL, _BOOL)),
    ],
    ids=[
        "ceil_int64",
        "round_int64",
        "isnan_int64",
        "isfinite_bool",
        "sort_bool",
        "max_dim_bool",
        "masked_fill_bool",
        "relu_int64",
        "linear_int64",
        "max_pool_int64",
        "pixel_shuffle_int64",
        "heaviside_bool",
    ],
)
def test_ops_on_dtypes_their_kernels_refuse_compute_in_a_wider_one(fn, args):
    _lower_and_compare(fn, *args)


def test_a_bool_where_runs_in_uint8_and_casts_back():
    model = _lower_and_compare(lambda x, m: x.masked_fill(m, True), _BOOL, _INT > 0)
    (where,) = [n for n in model.graph if n.op_type == "Where"]
    assert [v.dtype for v in where.inputs[1:]] == [ir.DataType.UINT8] * 2
    assert where.outputs[0].dtype == ir.DataType.UINT8
    assert _cast_targets(model) == {"UINT8": 2, "BOOL": 1}
    assert model.graph.outputs[0].dtype == ir.DataType.BOOL


def test_supported_dtypes_and_float16_are_left_alone():
    # float16 is the user's precision choice: no casts even where onnxruntime's CPU provider
    # has no float16 kernel (it computes those in float32 by itself).
    for dtype in (torch.float32, torch.float16):
        x = torch.randn(3, 4, dtype=dtype)
        model = irkit.lower(torch.export.export(_Fn(lambda a: torch.relu(a) @ a.T), (x,)))
        assert not _cast_targets(model), dtype
        assert legalize_kernel_types(model) == 0


def test_an_op_without_an_exact_wider_dtype_is_an_error_naming_the_node():
    args = (_INT.reshape(1, 2, 6), _INT.reshape(3, 2, 2)[:, :, :2])
    ep = torch.export.export(_Fn(lambda x, w: nn.functional.conv1d(x, w)), args)
    with pytest.raises(irkit.LoweringError) as info:
        irkit.lower(ep)
    err = info.value
    assert (err.fx_node, err.target) == ("conv1d", "aten::conv1d.default")
    assert "Conv, which has no kernel for int64" in str(err) and "test_legalize.py" in err.source


def test_outputs_keep_their_names_and_module_scopes_through_the_casts():
    class Block(nn.Module):
        def forward(self, x):
            return torch.ceil(x) + 1

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.block = Block()

        def forward(self, x):
            return self.block(x) * 2

    model = irkit.lower(torch.export.export(Net(), (_INT,)), functions=False)
    ceil = next(n for n in model.graph if n.op_type == "Ceil")
    casts = [n for n in model.graph if n.op_type == "Cast"]
    assert len(casts) == 2
    scopes = {n.metadata_props[irkit.metadata.SCOPE] for n in [ceil, *casts]}
    assert len(scopes) == 1 and "block" in scopes.pop()
    back = next(c for c in casts if c.inputs[0] is ceil.outputs[0])
    assert back.outputs[0].name == "ceil"  # the FX node's value name stays on the int64 result
    outlined = irkit.lower(torch.export.export(Net(), (_INT,)))
    helpers.assert_close(helpers.run_ort(outlined, [_INT]), [((_INT + 1) * 2).numpy()], 0)
