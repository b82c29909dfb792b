"""Coverage mechanisms of irkit.lower: context regions, dtype reconciliation, decompositions.

Each test exports a small module the way a user would, lowers it, runs it in onnxruntime (graph
optimizations off) and compares with eager PyTorch.
"""

from __future__ import annotations

import collections

import numpy as np
import pytest
import torch
import torch.utils._pytree as pytree
from torch import nn

import irkit
from irkit import metadata
from tests import helpers

F = nn.functional


def _check(module: nn.Module, *args: torch.Tensor, atol: float = 1e-5, functions=True):
    module.eval()
    ep = torch.export.export(module, args)
    model = irkit.lower(ep, functions=functions)
    outputs = helpers.run_ort(model, list(args))
    with torch.no_grad():
        expected = helpers.flatten_outputs(module(*args))
    helpers.assert_close(outputs, expected, atol)
    return model


def _all_ops(model) -> set[str]:
    ops = {n.op_type for n in model.graph}
    for function in model.functions.values():
        ops |= {n.op_type for n in function}
    return ops


# --- context regions -------------------------------------------------------------------------


class Rotary(nn.Module):
    """The transformers pattern: a ``@torch.no_grad()`` forward inside a model."""

    def __init__(self):
        super().__init__()
        self.register_buffer("inv_freq", torch.arange(0, 8, 2).float() / 8)

    @torch.no_grad()
    def forward(self, x):
        freqs = x[..., None] * self.inv_freq
        return freqs.cos(), freqs.sin()


class WithRegions(nn.Module):
    def __init__(self):
        super().__init__()
        self.rotary = Rotary()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        cos, sin = self.rotary(x)
        with torch.enable_grad():
            y = self.lin(cos.sum(-1))
        with torch.no_grad(), torch.autocast("cpu", enabled=False):
            z = sin.mean(-1) * 3
        return y + z


@pytest.mark.parametrize("functions", [True, False])
def test_grad_mode_regions_are_inlined_with_their_module_scopes(functions):
    module = WithRegions()
    ep = torch.export.export(module.eval(), (torch.randn(3, 4),))
    hops = [n for n in ep.graph.nodes if isinstance(n.target, torch._ops.HigherOrderOperator)]
    assert hops, "the test must exercise wrap_with_set_grad_enabled"
    model = _check(module, torch.randn(3, 4), functions=functions)
    if functions:
        # The rotary module inside the no_grad region is still a module call.
        assert [n.op_type for n in model.graph if n.domain] == ["Rotary", "Linear"]
    else:
        assert not model.functions
        scopes = {n.metadata_props.get("irkit.scope", "") for n in model.graph}
        assert any("rotary" in s for s in scopes)


class Autocast(nn.Module):
    def __init__(self, enabled: bool):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.enabled = enabled

    def forward(self, x):
        with torch.autocast("cpu", dtype=torch.float16, enabled=self.enabled):
            y = self.lin(x)
            with torch.autocast("cpu", enabled=False):
                z = y.float() * 2
            w = torch.softmax(y, -1)
        return z + w.float()


def test_autocast_casts_are_explicit_and_numbers_match_eager_under_autocast():
    torch.manual_seed(0)
    model = _check(Autocast(enabled=True), torch.randn(4, 8), atol=2e-3)
    flat = irkit.inline(model)
    gemm = next(n for n in flat.graph if n.op_type in ("Gemm", "MatMul"))
    assert gemm.inputs[0].dtype == irkit_dtype("FLOAT16")
    assert "Cast" in _all_ops(flat)


def test_autocast_disabled_region_is_a_plain_inline():
    model = _check(Autocast(enabled=False), torch.randn(4, 8))
    assert "Cast" not in {n.op_type for n in irkit.inline(model).graph}


def irkit_dtype(name: str):
    import onnx_ir as ir

    return getattr(ir.DataType, name)


# --- dtype reconciliation --------------------------------------------------------------------


class Promotions(nn.Module):
    def forward(self, x):
        n = x.shape[-1]
        positions = torch.arange(n)
        a = torch.log(positions / 16 + 1)  # int64 true division → float
        b = x * positions  # float32 * int64
        c = torch.sin(positions)  # float-only op on int64
        d = torch.exp(x > 0)  # on bool
        e = (x > 0).sum(-1)  # bool → int64 reduction
        f = x.half() + x  # float16 + float32
        return a + b + c + d, e, f


def test_implicit_promotions_become_casts():
    model = _check(Promotions(), torch.randn(3, 16))
    outputs = {v.name: v.dtype for v in model.graph.outputs}
    assert [str(d) for d in outputs.values()] == ["FLOAT", "INT64", "FLOAT"]


def test_true_division_of_masks_and_masked_fill_keep_their_meaning():
    class Masks(nn.Module):
        def forward(self, x):
            ratio = torch.div(x > 0, x > -1)  # bool / bool → float (NaN where 0/0)
            return torch.nan_to_num(ratio), x.masked_fill(x > 0, 2.0)

    _check(Masks(), torch.randn(2, 3))


def test_promotion_histogram_of_a_minimal_repro():
    class M(nn.Module):
        def forward(self, x):
            return x * torch.arange(x.shape[-1])

    model = _check(M(), torch.randn(2, 5))
    casts = [n for n in model.graph if n.op_type == "Cast"]
    mul = next(n for n in model.graph if n.op_type == "Mul")
    # One cast of the arange's int64 to float feeds the Mul (plus Range's own input casts).
    assert mul.inputs[1].producer().op_type == "Cast"
    assert mul.inputs[1].producer().attributes["to"].value == 1
    assert len(casts) >= 1


def test_division_by_a_symbolic_size():
    class Mean(nn.Module):
        def forward(self, x):
            return x.sum(0) / x.size(0) + x.shape[1] * x.mean()

    dims = ({0: torch.export.Dim("batch"), 1: torch.export.Dim("width")},)
    ep = torch.export.export(Mean(), (torch.randn(5, 3),), dynamic_shapes=dims)
    model = irkit.lower(ep)
    for x in (torch.randn(5, 3), torch.randn(7, 4)):
        helpers.assert_close(helpers.run_ort(model, [x]), [Mean()(x).numpy()], 1e-5)


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: F.hardtanh(x, -1.0, 2.0),
        lambda x: F.relu6(x),
        lambda x: torch.log1p(x.abs()),
        lambda x: torch.erf(x) + torch.expm1(x),
        lambda x: torch.isnan(x),
        lambda x: torch.addcmul(x, x, x, value=0.5),
        lambda x: torch.lerp(x, x.flip(0), 0.3),
        lambda x: F.mish(x) + F.selu(x) + F.logsigmoid(x) + F.hardswish(x),
        lambda x: torch.round(x, decimals=2),
        lambda x: torch.amax(x, dim=(0, 1)),
    ],
    ids=[
        "hardtanh",
        "relu6",
        "log1p",
        "erf_expm1",
        "isnan",
        "addcmul",
        "lerp",
        "activations",
        "round_decimals",
        "amax",
    ],
)
def test_ops_that_used_to_crash_in_result_dtype_pinning(fn):
    _check(_Fn(fn), torch.randn(4, 8))


class _Fn(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


@pytest.mark.parametrize(
    "fn, x",
    [
        (lambda x: torch.amax(x), torch.randn(3, 4)),  # dim=[] left implicit by the node
        (lambda x: torch.amin(x > 0), torch.randn(3, 4)),
        (lambda x: torch.softmax(x, 0, dtype=torch.float32), torch.arange(12).reshape(3, 4)),
        (lambda x: (x > 0).sum() + (x > 0).cumsum(0).sum(), torch.randn(3, 4)),
        (lambda x: torch.masked.std(x, 1, mask=x > 0.1), torch.rand(3, 4) + 0.2),  # aten.divide
    ],
    ids=["amax_default_dim", "amin_bool", "softmax_int_dtype", "sum_cumsum_bool", "masked_std"],
)
def test_schema_defaults_dtype_arguments_and_aliases(fn, x):
    _check(_Fn(fn), x)


@pytest.mark.parametrize(
    "fn, x",
    [
        (lambda x: F.one_hot(x, 5), torch.tensor([1, 2, 0])),  # its decomposition asserts
        (  # the decomposition edits its list argument
            lambda x: torch.ops.aten._unsafe_masked_index(x, x > 0, [torch.tensor([0, 2, 1])], 0.0),
            torch.randn(3),
        ),
    ],
    ids=["one_hot", "unsafe_masked_index"],
)
def test_decompositions_with_assertions_and_list_arguments(fn, x):
    _check(_Fn(fn), x)


@pytest.mark.parametrize(
    "fn, x",
    [
        (lambda x: torch.view_as_real(x.to(torch.cfloat)), torch.randn(3)),
        (lambda x: torch.view_as_real(x.to(torch.cdouble)), torch.arange(3)),
    ],
    ids=["float_to_cfloat", "int_to_cdouble"],
)
def test_conversion_to_complex(fn, x):
    _check(_Fn(fn), x)


@pytest.mark.parametrize(
    "fn, x",
    [
        (lambda x: x.mT, torch.randn(2, 3, 4) > 0),  # torchlib's Einsum has no bool kernel
        (lambda x: x.mH.float() + 1, torch.arange(6).reshape(2, 3)),
        (lambda x: x.clone().resize_(3, 4) * 2, torch.randn(2, 6)),
    ],
    ids=["mT_bool", "mH_int", "resize_"],
)
def test_gaps_filled_by_own_lowerings(fn, x):
    _check(_Fn(fn), x)


class _Experts(nn.Module):
    """Mixture-of-experts rows: ``x`` sorted by expert, ``offs`` each expert's end row."""

    def __init__(self, dtype: torch.dtype = torch.float32):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(3, 16, 8, dtype=dtype))

    def forward(self, x, offs):
        if x.dtype == torch.float32:  # what transformers' experts run on CPU under torch.export
            return torch.ops.transformers.grouped_mm_fallback(x, self.weight, offs=offs)
        return torch._grouped_mm(x, self.weight, offs=offs)


@pytest.mark.parametrize("offs", [[2, 2, 6], [0, 3, 4], [1, 5, 7]], ids=["empty", "tail", "full"])
def test_transformers_grouped_mm_custom_op_with_dynamic_rows(offs):
    # A Python loop over data-dependent offsets (no trace follows it); irkit lowers it as the
    # aten._grouped_mm it computes: one Slice/MatMul per expert, rows past the last are zero.
    pytest.importorskip("transformers.integrations.moe")
    module, rows = _Experts(), torch.export.Dim("rows")
    x, offs_t = torch.randn(7, 16), torch.tensor(offs, dtype=torch.int32)
    ep = torch.export.export(module, (x, offs_t), dynamic_shapes=({0: rows}, None))
    model = irkit.lower(ep)
    histogram = collections.Counter(n.op_type for n in model.graph)
    assert (histogram["Slice"], histogram["MatMul"]) == (3, 3)
    for n in (7, 9):
        x = torch.randn(n, 16)
        with torch.no_grad():
            expected = module(x, offs_t)
        helpers.assert_close(helpers.run_ort(model, [x, offs_t]), [expected.numpy()], 1e-5)


def test_aten_ragged_grouped_mm_is_lowered_where_torchlib_refuses_offsets():
    # bfloat16 only (torch's kernel); onnxruntime has no bfloat16 MatMul on CPU, so the graph is
    # checked: the same lowering as the custom op above, whose numbers are checked.
    module = _Experts(torch.bfloat16)
    args = (torch.randn(7, 16, dtype=torch.bfloat16), torch.tensor([2, 2, 6], dtype=torch.int32))
    model = irkit.lower(torch.export.export(module, args))
    histogram = collections.Counter(n.op_type for n in model.graph)
    assert (histogram["Slice"], histogram["MatMul"], histogram["Concat"]) == (3, 3, 2)
    irkit.check(model)


_TIES = torch.tensor([[3.0, 1.0, 2.0, 1.0, 0.5], [0.0, -1.0, 4.0, 2.0, 2.0]])
_NAN = torch.tensor([[1.0, float("nan"), 2.0], [0.5, -1.0, 3.0]])
_DISTINCT = torch.tensor([[3.0, 1.0, 2.0, -1.0, 0.5], [0.0, -2.0, 4.0, 2.5, 2.0]])
_SORTED = torch.sort(torch.randn(3, 6)).values


@pytest.mark.parametrize(
    "fn, args",
    [
        (torch.hypot, (torch.randn(3, 4), torch.randn(4))),
        (torch.fmax, (_NAN, torch.randn(2, 3))),
        (torch.fmin, (torch.arange(5), torch.arange(5).flip(0))),
        (lambda x: torch.sort(x, stable=True, descending=True), (_TIES,)),
        (lambda x: torch.argsort(x, dim=0, stable=True), (_TIES,)),
        (lambda x: torch.kthvalue(x, 2), (_DISTINCT,)),  # torch breaks ties arbitrarily
        (lambda x: torch.kthvalue(x, 2, 0, keepdim=True), (_DISTINCT,)),
        (torch.median, (_DISTINCT,)),
        (torch.median, (_NAN,)),
        (lambda x: torch.median(x, 1, keepdim=True)[0], (_NAN,)),
        (lambda s, v: torch.searchsorted(s, v, right=True), (_SORTED, torch.randn(3, 2))),
        (lambda s, v: torch.searchsorted(s, v, out_int32=True), (_SORTED[0], torch.randn(4, 2))),
        (torch.bucketize, (torch.randn(4, 2), _SORTED[0])),
        (lambda x, m: torch.masked_select(x, m), (torch.randn(3, 1), torch.randn(3, 4) > 0)),
        (
            lambda x, i, s: x.scatter(0, i, s, reduce="add"),
            (torch.randn(3, 4), torch.tensor([[0, 1, 2, 0]]), torch.randn(1, 4)),
        ),
        (
            lambda x, i: x.scatter(1, i, 2.0, reduce="multiply"),
            (torch.randn(3, 4), torch.tensor([[0], [1], [3]])),
        ),
    ],
    ids=[
        "hypot",
        "fmax_nan",
        "fmin_int",
        "sort_stable_desc",
        "argsort_stable",
        "kthvalue",
        "kthvalue_keepdim",
        "median",
        "median_nan",
        "median_dim_nan",
        "searchsorted_right",
        "searchsorted_int32",
        "bucketize",
        "masked_select_broadcast",
        "scatter_add",
        "scatter_value_multiply",
    ],
)
def test_ops_no_exporter_had_own_lowerings(fn, args):
    # Ties check sort's stability; NaNs check fmax's and median's NaN rules.
    module = _Fn(fn)
    outputs = helpers.run_ort(irkit.lower(torch.export.export(module, args)), list(args))
    expected = helpers.flatten_outputs(module(*args))
    assert [(o.shape, o.dtype) for o in outputs] == [(e.shape, e.dtype) for e in expected]
    for out, want in zip(outputs, expected, strict=True):
        np.testing.assert_allclose(out, want, atol=1e-5, equal_nan=True)


def test_uniform_in_place_draws_in_its_range():
    ep = torch.export.export(_Fn(lambda x: x.clone().uniform_(2.0, 3.0)), (torch.randn(1000),))
    (out,) = helpers.run_ort(irkit.lower(ep), [torch.randn(1000)])
    assert out.dtype == np.float32 and 2.0 <= out.min() < 2.1 and 2.9 < out.max() <= 3.0


def test_an_input_passed_through_gets_its_own_output_name():
    class PassThrough(nn.Module):
        def forward(self, x):
            return x.contiguous()

    model = _check(PassThrough(), torch.randn(3))
    assert [v.name for v in model.graph.inputs] == ["x"]
    assert [v.name for v in model.graph.outputs] == ["x_output"]


def test_in_place_random_op_named_differently_from_its_functional_form():
    ep = torch.export.export(_Fn(lambda x: x.clone().normal_(2.0, 0.5)), (torch.randn(64),))
    (out,) = helpers.run_ort(irkit.lower(ep), [torch.randn(64)])
    assert out.shape == (64,) and abs(float(out.mean()) - 2.0) < 0.5


def test_mobilenet_block_with_relu6():
    block = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU6())
    _check(block, torch.randn(1, 3, 8, 8), atol=1e-4)


def test_split_with_unequal_sizes():
    model = _check(_Fn(lambda x: x.split([4, 12], -1)), torch.randn(3, 16))
    (split,) = [n for n in model.graph if n.op_type == "Split"]
    assert len(split.outputs) == 2


# --- inputs and outputs ----------------------------------------------------------------------


class _Cache:
    def __init__(self, keys, values):
        self.keys, self.values = list(keys), list(values)


pytree.register_pytree_node(
    _Cache,
    lambda c: (c.keys + c.values, len(c.keys)),
    lambda xs, n: _Cache(list(xs)[:n], list(xs)[n:]),
    flatten_with_keys_fn=lambda c: (
        [(pytree.SequenceKey(i), v) for i, v in enumerate(c.keys + c.values)],
        len(c.keys),
    ),
)


class ReturnsCache(nn.Module):
    def forward(self, x, use_cache=True):
        out = x + 1
        if not use_cache:
            return {"out": out}
        return {"out": out, "cache": _Cache([x * 2, x * 3], [x * 4, x * 5])}


def test_custom_pytree_output_is_named_without_rebuilding_the_class():
    x = torch.randn(2, 3)
    ep = torch.export.export(ReturnsCache(), (x,), {"use_cache": True})
    model = irkit.lower(ep)
    assert [v.name for v in model.graph.outputs] == [
        "out",
        "cache_0",
        "cache_1",
        "cache_2",
        "cache_3",
    ]
    # The Python constant use_cache=True was specialized away: it is not an ONNX input.
    assert [v.name for v in model.graph.inputs] == ["x"]
    expected = helpers.flatten_outputs(ReturnsCache()(x))
    helpers.assert_close(helpers.run_ort(model, [x]), expected, 1e-6)


# --- decompositions --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: torch.var_mean(x, dim=1, correction=0),
        lambda x: torch.std_mean(x, dim=1, correction=2),
        lambda x: F.binary_cross_entropy_with_logits(x, x.sigmoid()),
        lambda x: F.multilabel_margin_loss(x, torch.zeros_like(x, dtype=torch.long)),
        lambda x: x.clone().zero_() + x,
        lambda x: torch.fft.rfft(x).abs(),
        lambda x: torch.view_as_real(torch.fft.fft(x)),
        lambda x: torch.masked.mean(x, 1, mask=x > 0),
    ],
    ids=[
        "var_mean",
        "std_mean",
        "bce_logits",
        "multilabel_margin",
        "zero_",
        "rfft",
        "fft",
        "masked_mean",
    ],
)
def test_every_decomposition_torch_has_is_tried(fn):
    _check(_Fn(fn), torch.randn(4, 8), atol=1e-4)


def test_unsupported_op_says_why_decomposing_did_not_help():
    # Uneven bins of a dynamic size: irkit's own lowering needs static sizes, torch's
    # decomposition only covers evenly dividing ones.
    ep = torch.export.export(
        _Fn(lambda x: F.adaptive_max_pool3d(x, 2)),
        (torch.randn(1, 1, 5, 5, 5),),
        dynamic_shapes=(({4: torch.export.Dim("w", min=3)},),),
    )
    with pytest.raises(irkit.UnsupportedOpError) as info:
        irkit.lower(ep)
    assert [op[0] for op in info.value.ops] == ["aten::adaptive_max_pool3d.default"]
    assert "decomposition" in info.value.reasons["aten::adaptive_max_pool3d.default"]
    assert "decompositions did not help" in str(info.value)


def test_random_ops_get_an_opset_onnxruntime_runs():
    module = _Fn(lambda x: torch.randn_like(x) + x.clone().bernoulli_(0.5))
    ep = torch.export.export(module, (torch.randn(4, 8),))
    model = irkit.lower(ep)
    assert model.opset_imports[""] == 21
    (out,) = helpers.run_ort(model, [torch.randn(4, 8)])
    assert out.shape == (4, 8) and out.dtype.name == "float32"
    with pytest.raises(irkit.LoweringError, match=r"opset=21"):
        irkit.lower(ep, opset=23)
    assert irkit.lower(_export_plain()).opset_imports[""] == 23


def _export_plain():
    return torch.export.export(_Fn(lambda x: x + 1), (torch.randn(2),))


@torch.library.custom_op("irkit_test_cov::grouped_mm", mutates_args=())
def grouped_mm(x: torch.Tensor, w: torch.Tensor, sizes: list[int]) -> torch.Tensor:
    outs, start = [], 0
    for i, n in enumerate(sizes):
        outs.append(x[start : start + n] @ w[i])
        start += n
    return torch.cat(outs)


@grouped_mm.register_fake
def _(x, w, sizes):
    return x.new_empty(x.shape[0], w.shape[-1])


class MoEFallback(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(2, 4, 3))

    def forward(self, x):
        return torch.ops.irkit_test_cov.grouped_mm(x, self.w, [2, 3]).relu()


def test_custom_op_python_implementation_is_traced_only_when_asked():
    x = torch.randn(5, 4)
    module = MoEFallback()
    ep = torch.export.export(module, (x,))
    with pytest.raises(irkit.UnsupportedOpError):
        irkit.lower(ep)
    model = irkit.lower(ep, decompose_custom_ops=True)
    expected = helpers.flatten_outputs(module(x))
    helpers.assert_close(helpers.run_ort(model, [x]), expected, 1e-5)


class TwoGroupedCalls(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(2, 4, 4))

    def forward(self, x):
        y = torch.ops.irkit_test_cov.grouped_mm(x, self.w, [2, 3]).relu()
        z = torch.ops.irkit_test_cov.grouped_mm(y, self.w * 2, [2, 3])
        return z + torch.ops.irkit_test_cov.grouped_mm(x, self.w, [1, 4])


def test_a_traced_custom_op_is_a_local_function_named_after_it():
    # one function per distinct traced body (sizes [2, 3] twice, [1, 4] once), each marked
    # with the op it implements; optimize keeps them (a rule may replace the calls)
    x = torch.randn(5, 4)
    module = TwoGroupedCalls()
    ep = torch.export.export(module, (x,))
    model = irkit.lower(ep, decompose_custom_ops=True, functions=False)
    calls = [n.op_type for n in model.graph if n.domain == "irkit_test_cov"]
    assert calls == ["grouped_mm", "grouped_mm", "grouped_mm_1"]
    assert sorted(model.functions) == [
        ("irkit_test_cov", "grouped_mm", ""),
        ("irkit_test_cov", "grouped_mm_1", ""),
    ]
    for function in model.functions.values():
        assert function.metadata_props[metadata.CUSTOM_OP] == "irkit_test_cov::grouped_mm"
    irkit.optimize(model)
    irkit.check(model)
    assert len(model.functions) == 2
    expected = helpers.flatten_outputs(module(x))
    helpers.assert_close(helpers.run_ort(model, [x]), expected, 1e-5)


def test_eval_mode_in_place_dropout_on_a_view_needs_no_functionalization(caplog):
    class Head(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 4)
            self.drop = nn.Dropout(0.2, inplace=True)  # MobileNetV2's classifier

        def forward(self, x):
            return self.drop(self.fc(x).view(2, 2, 2))

    with caplog.at_level("INFO", logger="irkit.lowering._lower"):
        _check(Head(), torch.randn(2, 8))
    assert "functionalizing" not in caplog.text
    assert "functional counterpart of an in-place op: 1" in caplog.text


class _SymbolicSizes(nn.Module):
    """Python ``min``/``max`` of sizes (MPT's position bias, SEW's padding): ``torch.sym_*``."""

    def forward(self, x, y):
        n = min(x.size(1), y.size(1))
        return x[:, :n] + y[:, :n], torch.ones(max(x.size(1), 3)) * (x.size(1) / 2)


def test_python_min_max_of_symbolic_sizes():
    dim = torch.export.Dim
    module, args = _SymbolicSizes(), (torch.randn(2, 6), torch.randn(2, 5))
    ep = torch.export.export(module, args, dynamic_shapes=({1: dim("a")}, {1: dim("b")}))
    model = irkit.lower(ep)
    for x, y in [args, (torch.randn(2, 2), torch.randn(2, 7))]:
        expected = helpers.flatten_outputs(module(x, y))
        helpers.assert_close(helpers.run_ort(model, [x, y]), expected, 1e-6)


def test_a_module_built_inside_forward_initializes_with_a_random_op_nobody_reads():
    # BigBird switches attention type in forward: nn.Linear's init traces as empty → uniform_.
    class BuildsLinear(nn.Module):
        def forward(self, x):
            nn.Linear(4, 4)
            return x * 2

    _check(BuildsLinear(), torch.randn(2, 4))


# --- torchlib lowerings that refuse some arguments ----------------------------------------------


class SoftTargets(nn.Module):
    def forward(self, logits, probabilities, labels):
        return (
            F.cross_entropy(logits, probabilities),  # class probabilities: decomposed
            F.cross_entropy(logits, labels),  # class indices: torchlib's SoftmaxCrossEntropyLoss
        )


def test_cross_entropy_with_class_probabilities_is_decomposed():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 5, generator=g)
    probabilities = torch.softmax(torch.randn(4, 5, generator=g), -1)
    labels = torch.tensor([0, 3, 1, 4])
    model = _check(SoftTargets(), logits, probabilities, labels, atol=1e-6)
    ops = collections.Counter(
        n.op_type for g in (model.graph, *model.functions.values()) for n in g
    )
    assert ops["SoftmaxCrossEntropyLoss"] == 1 and ops["LogSoftmax"] >= 1


class SignBit(nn.Module):
    def forward(self, x, scalar):
        return torch.signbit(x), torch.signbit(scalar), torch.copysign(scalar, x[1])


def test_signbit_sees_negative_zero_and_keeps_a_scalar_0d():
    x = torch.tensor([1.0, -0.0, 0.0, -2.0, float("inf"), float("-inf")])
    scalar = torch.tensor(3.0)
    model = _check(SignBit(), x, scalar, atol=0.0)
    out = helpers.run_ort(model, [x.numpy(), scalar.numpy()])
    assert out[0].tolist() == [False, True, False, True, False, True]
    assert out[1].shape == () and out[2].shape == () and out[2] == -3.0
