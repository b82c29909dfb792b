"""OpInfo conformance of irkit.lower: PyTorch's own op database, run in onnxruntime vs eager.

The CI subset (``SUBSET``) covers every class of op — unary/binary elementwise, reductions,
indexing/scatter, shape ops, nn.functional conv/pool/norm/activations/losses, linalg basics,
creation, sorting, random ops — on float32, and int64/bool where listed. Each case is
``op.variant-dtype``; a case in ``expected_failures.EXPECTED_FAILURES`` is
``xfail(strict=True)`` (so a fix that makes it pass is noticed: delete its entry), every other
case must pass.

``IRKIT_OPINFO=full python -m pytest tests/conformance`` runs every op of op_db instead (about
1,500 cases; ``bench/bench_opinfo.py`` does the same and compares with the stock exporter).
"""

from __future__ import annotations

import functools
import os

import numpy as np
import pytest
import torch
from onnxscript import opset18 as op

from tests.conformance import expected_failures, opinfo
from tests.conformance.expected_failures import EXPECTED_FAILURES
from tests.conformance.opinfo import OpDbCaseGone, Outcome

F, L, B = "float32", "int64", "bool"  # L: torch.long
FIB = (F, L, B)
FI = (F, L)

# (op name, variant) -> dtypes. Chosen to cover the classes of ops; see the module docstring.
SUBSET: dict[tuple[str, str], tuple[str, ...]] = {
    # unary elementwise
    ("abs", ""): FI,
    ("neg", ""): FI,
    ("exp", ""): FIB,
    ("log", ""): (F, L),
    ("sqrt", ""): (F, B),
    ("rsqrt", ""): (F,),
    ("sin", ""): FIB,
    ("tanh", ""): (F,),
    ("sigmoid", ""): (F, L),
    ("erf", ""): (F,),
    ("log1p", ""): (F,),
    ("expm1", ""): (F,),
    ("reciprocal", ""): (F, L),
    ("floor", ""): FI,
    ("round", ""): (F,),
    ("round", "decimals_3"): (F,),
    ("sign", ""): FIB,
    ("isnan", ""): FIB,
    ("nan_to_num", ""): (F,),
    ("logical_not", ""): FIB,
    ("bitwise_not", ""): (L, B),
    # binary elementwise
    ("add", ""): FIB,
    ("sub", ""): FI,
    ("mul", ""): FIB,
    ("div", "no_rounding_mode"): FIB,
    ("div", "floor_rounding"): FI,
    ("pow", ""): FI,
    ("maximum", ""): FIB,
    ("atan2", ""): (F, L),
    ("remainder", ""): FI,
    ("fmod", ""): FI,
    ("eq", ""): FIB,
    ("lt", ""): FIB,
    ("logical_and", ""): FIB,
    ("bitwise_and", ""): (L, B),
    ("where", ""): FIB,
    ("clamp", ""): FI,
    ("lerp", ""): (F,),
    ("addcmul", ""): FI,
    ("xlogy", ""): (F,),
    # reductions
    ("sum", ""): FIB,
    ("mean", ""): (F,),
    ("prod", ""): FIB,
    ("amax", ""): FIB,
    ("argmax", ""): FI,
    ("max", "reduction_with_dim"): FIB,
    ("var", ""): (F,),
    ("std_mean", ""): (F,),
    ("logsumexp", ""): FI,
    ("cumsum", ""): FI,
    ("all", ""): FIB,
    ("any", ""): FIB,
    ("linalg.vector_norm", ""): (F,),
    ("softmax", ""): (F,),
    ("log_softmax", ""): (F,),
    ("count_nonzero", ""): FIB,
    # indexing / scatter
    ("gather", ""): FIB,
    ("index_select", ""): (F,),
    ("index_add", ""): FI,
    ("index_put", ""): FIB,
    ("scatter", ""): (F, L),
    ("scatter_add", ""): FI,
    ("scatter_reduce", "sum"): FI,
    ("masked_fill", ""): FIB,
    ("__getitem__", ""): FIB,
    ("take_along_dim", ""): (F,),
    ("select", ""): (F, L),
    ("narrow", ""): (F,),
    ("nonzero", ""): FIB,
    # shape ops
    ("cat", ""): FIB,
    ("stack", ""): (F, L),
    ("reshape", ""): FIB,
    ("view", ""): (F,),
    ("permute", ""): FIB,
    ("transpose", ""): (F,),
    ("squeeze", ""): (F,),
    ("unsqueeze", ""): (F,),
    ("flatten", ""): (F,),
    ("expand", ""): FIB,
    ("repeat", ""): (F,),
    ("flip", ""): (F,),
    ("roll", ""): (F,),
    ("split", ""): (F,),
    ("split", "list_args"): (F,),
    ("chunk", ""): (F,),
    ("tril", ""): (F,),
    ("movedim", ""): (F,),
    ("unbind", ""): (F,),
    ("constant_pad_nd", ""): (F,),
    ("nn.functional.pad", "reflect"): (F,),
    # nn.functional: conv / pool / norm
    ("nn.functional.conv1d", ""): (F,),
    ("nn.functional.conv2d", ""): (F,),
    ("nn.functional.conv_transpose2d", ""): (F,),
    ("nn.functional.max_pool2d", ""): (F,),
    ("nn.functional.avg_pool2d", ""): (F,),
    ("nn.functional.adaptive_avg_pool2d", ""): (F,),
    ("nn.functional.batch_norm", ""): (F,),
    ("nn.functional.layer_norm", ""): (F,),
    ("nn.functional.group_norm", ""): (F,),
    ("nn.functional.rms_norm", ""): (F,),
    ("nn.functional.interpolate", "nearest"): (F,),
    ("nn.functional.interpolate", "bilinear"): (F,),
    ("nn.functional.pixel_shuffle", ""): (F,),
    # nn.functional: activations
    ("nn.functional.relu", ""): FI,
    ("nn.functional.gelu", ""): (F,),
    ("nn.functional.silu", ""): (F,),
    ("nn.functional.elu", ""): (F,),
    ("nn.functional.leaky_relu", ""): (F,),
    ("nn.functional.hardtanh", ""): FI,
    ("nn.functional.hardswish", ""): (F,),
    ("nn.functional.softplus", ""): (F,),
    ("nn.functional.mish", ""): (F,),
    ("nn.functional.glu", ""): (F,),
    ("nn.functional.linear", ""): (F,),
    ("nn.functional.embedding", ""): (F,),
    ("nn.functional.one_hot", ""): (L,),
    ("nn.functional.scaled_dot_product_attention", ""): (F,),
    # nn.functional: losses
    ("nn.functional.cross_entropy", ""): (F,),
    ("nn.functional.nll_loss", ""): (F,),
    ("nn.functional.mse_loss", ""): (F,),
    ("nn.functional.l1_loss", ""): (F,),
    ("nn.functional.binary_cross_entropy", ""): (F,),
    ("nn.functional.binary_cross_entropy_with_logits", ""): (F,),
    ("nn.functional.smooth_l1_loss", ""): (F,),
    ("nn.functional.kl_div", ""): (F,),
    ("nn.functional.cosine_similarity", ""): (F,),
    # linalg basics
    ("matmul", ""): FI,
    ("mm", ""): FI,
    ("bmm", ""): (F,),
    ("addmm", ""): (F,),
    ("einsum", ""): (F,),
    ("outer", ""): (F,),
    ("linalg.det", ""): (F,),
    ("linalg.inv", ""): (F,),
    ("linalg.cross", ""): FI,
    # creation, conversion, sorting
    ("zeros_like", ""): (F,),
    ("full_like", ""): FIB,
    ("arange", ""): FI,
    ("eye", ""): (F,),
    ("to", ""): (F, L),
    ("long", ""): (F, B),
    ("sort", ""): (F, L),
    ("topk", ""): FI,
    ("cummax", ""): (F,),
    # random ops (shape and dtype only)
    ("nn.functional.dropout", ""): (F,),
    ("bernoulli", ""): (F,),
    ("rand_like", ""): (F,),
    ("randn_like", ""): (F,),
    ("randint_like", ""): FI,
    ("multinomial", ""): (F,),
}

_FULL = os.environ.get("IRKIT_OPINFO", "").lower() == "full"


def _cases() -> list[tuple[str, str, str]]:
    if _FULL:
        return opinfo.all_cases()
    return [(name, variant, d) for (name, variant), dtypes in SUBSET.items() for d in dtypes]


def _params() -> list:
    params = []
    for case in _cases():
        marks = []
        if case in EXPECTED_FAILURES:
            marks.append(pytest.mark.xfail(strict=True, reason=EXPECTED_FAILURES[case]))
        params.append(pytest.param(case, id=opinfo.case_id(*case), marks=marks))
    return params


@functools.cache
def _installed_cases() -> frozenset[tuple[str, str, str]]:
    """Every case of the installed torch's op_db."""
    return frozenset(opinfo.all_cases())


@pytest.mark.parametrize("case", _params())
def test_opinfo(case: tuple[str, str, str]) -> None:
    if case not in _installed_cases():  # reported by test_subset_cases_exist_in_op_db
        pytest.skip(f"not in torch {torch.__version__}'s op_db")
    result = opinfo.run_case(*case)["irkit"]
    assert result.passed, f"{result.outcome.value} (sample {result.sample}): {result.reason}"


# ----------------------------------------------------------------------------------------------
# The subset and the table stay consistent with op_db: under the torch they were made from,
# every case is there; another torch's op_db may drop cases, which are reported (a warning
# naming them, in pytest's warnings summary) and skipped, not failed.


def _missing(cases, what: str) -> list[str]:
    return opinfo.missing_from_op_db(
        cases,
        _installed_cases(),
        installed_torch=torch.__version__,
        table_torch=expected_failures.TORCH,
        what=what,
    )


def test_subset_cases_exist_in_op_db() -> None:
    _missing(_cases(), "cases of the conformance subset")
    assert 150 <= len(_cases()) <= 250 or _FULL, len(_cases())


def test_expected_failures_are_real_cases_with_a_reason_class() -> None:
    classes = (
        "torch.export fails: ",
        "no applicable sample: ",
        "no ONNX equivalent",
        "onnxruntime lacks a kernel: ",
        "irkit gap",
    )
    _missing(EXPECTED_FAILURES, "expected-failure entries")
    unclassified = {c: r for c, r in EXPECTED_FAILURES.items() if not r.startswith(classes)}
    assert not unclassified, unclassified


def test_a_case_another_torch_dropped_is_reported_not_failed() -> None:
    """torch 2.15's op_db has no float32 ``cholesky`` or ``qr``: named, not failed."""
    table = [("cholesky", "", F), ("qr", "", F), ("sin", "", F)]
    known = {("sin", "", F)}
    with pytest.warns(OpDbCaseGone) as record:
        missing = opinfo.missing_from_op_db(
            table, known, installed_torch="2.15.0", table_torch="2.13.0+cpu", what="entries"
        )
    assert missing == ["cholesky-float32", "qr-float32"]
    (warning,) = record
    assert str(warning.message) == (
        "2 entries not in torch 2.15.0's op_db (the tables were made from torch 2.13.0+cpu's): "
        "cholesky-float32, qr-float32"
    )
    # Under the torch the table was made from, a missing case is the table's mistake.
    with pytest.raises(AssertionError, match="1 entries not in torch 2.13.0"):
        opinfo.missing_from_op_db(
            table[:1], known, installed_torch="2.13.0+cpu", table_torch="2.13.0+cpu", what="entries"
        )
    assert (
        opinfo.missing_from_op_db(table[2:], known, installed_torch="x", table_torch="y", what="")
        == []
    )


# ----------------------------------------------------------------------------------------------
# The harness itself: it must be able to fail


def _one_sample(name: str, variant: str = "", dtype: str = F) -> opinfo.Sample:
    return next(
        s
        for s in opinfo.samples(opinfo.find_op(name, variant), dtype, 3)
        if isinstance(s, opinfo.Sample)
    )


def test_wrong_lowering_is_a_mismatch() -> None:
    import irkit

    sample = _one_sample("sin")
    ep = opinfo.export(sample)
    assert isinstance(ep, torch.export.ExportedProgram)
    cos = {torch.ops.aten.sin.default: lambda x: op.Cos(x)}  # a deliberately wrong lowering
    model = irkit.lower(ep, custom_lowerings=cos)
    result = opinfo.run_and_compare(model, ep, sample)
    assert result.outcome is Outcome.MISMATCH, result
    assert opinfo.run_and_compare(irkit.lower(ep), ep, sample).passed


def test_compare_policy() -> None:
    e = torch.tensor([1.0, float("nan"), float("inf"), 100.0])
    ok = np.array([1.0 + 1e-4, np.nan, np.inf, 100.003], dtype=np.float32)
    assert opinfo.compare([ok], [e], random=False).passed
    far = ok.copy()
    far[3] = 100.01  # beyond atol + rtol * 100
    assert opinfo.compare([far], [e], random=False).outcome is Outcome.MISMATCH
    nan_lost = ok.copy()
    nan_lost[1] = 0.0
    assert opinfo.compare([nan_lost], [e], random=False).outcome is Outcome.MISMATCH
    as_int = np.array([1, 2], dtype=np.int64)
    r = opinfo.compare([as_int], [torch.tensor([1.0, 2.0])], random=False)
    assert r.outcome is Outcome.DTYPE_MISMATCH, r
    r = opinfo.compare([ok[:3]], [e], random=True)
    assert r.outcome is Outcome.SHAPE_MISMATCH, r
    assert opinfo.compare([ok * 7], [e], random=True).passed  # random: shape and dtype only
    r = opinfo.compare([np.array([1, 2]), np.array([3])], [torch.tensor([1, 2])], random=False)
    assert r.outcome is Outcome.OUTPUT_MISMATCH, r
    assert opinfo.compare([np.array([1, 3])], [torch.tensor([1, 2])], False).outcome is (
        Outcome.MISMATCH
    )


def test_random_ops_are_detected_and_deterministic_ops_are_not() -> None:
    assert _one_sample("bernoulli").random
    assert _one_sample("nn.functional.dropout").random
    assert not _one_sample("add").random
    assert not _one_sample("nn.functional.conv2d").random


def test_in_place_op_clones_its_inputs_in_the_program() -> None:
    sample = _one_sample("uniform")  # Tensor.uniform_
    assert sample.module.clone
    ep = opinfo.export(sample)
    assert isinstance(ep, torch.export.ExportedProgram)
    assert not ep.graph_signature.user_inputs_to_mutate


def test_tensor_lists_become_inputs() -> None:
    sample = _one_sample("cat")
    assert len(sample.args) >= 2  # each tensor of the list is one input
    ep = opinfo.export(sample)
    assert len(ep.graph_signature.user_inputs) == len(sample.args)


def test_none_arguments_stay_constants() -> None:
    # interpolate's samples pass size=None or scale_factor=None: a None is a value, not an input.
    sample = _one_sample("nn.functional.interpolate", "nearest")
    assert len(sample.args) == 1
    assert opinfo.export(sample).graph_signature.user_inputs


def test_sparse_and_scalar_outputs_are_not_applicable() -> None:
    op = opinfo.find_op("to_sparse")
    reasons = [r.reason for r in opinfo.samples(op, F, 1)]
    assert reasons == ["eager returns torch.sparse_coo tensors"], reasons
    reasons = [r.reason for r in opinfo.samples(opinfo.find_op("item"), F, 1)]
    assert reasons == ["eager returns float, not tensors"], reasons
