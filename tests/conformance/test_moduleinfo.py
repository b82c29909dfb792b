"""ModuleInfo conformance of irkit.lower: PyTorch's module database, in onnxruntime vs eager.

Every module of ``torch.testing._internal.common_modules.module_db`` (float32, and float16 where
the entry lists it) is a case ``nn.Module-dtype``; each sample is built in eval mode, exported
with ``torch.export.export``, lowered with ``irkit.lower`` and run in onnxruntime against eager
(harness: tests/conformance/moduleinfo.py).

CI runs a deterministic subset: the first ``CI_SAMPLES`` samples of every case (and
``CI_SAMPLES_OF`` for modules whose first samples miss what irkit's own lowerings handle) —
18 s on this 2-core machine (2026-11-25). The full sweep, every sample, took 314 s on one thread
(``LinearCrossEntropyLoss`` alone has 200+ samples per dtype), too long for CI:
``IRKIT_MODULEINFO=full`` runs it here, and ``bench/bench_moduleinfo.py`` runs it against the
stock exporter too. A case listed in
``moduleinfo_expected_failures.EXPECTED_FAILURES`` is ``xfail(strict=True)`` when its failing
sample is among the samples run — so a fix that makes it pass fails the test until its entry is
removed — and every other case must pass.
"""

from __future__ import annotations

import os

import pytest

from tests.conformance import moduleinfo
from tests.conformance.moduleinfo_expected_failures import EXPECTED_FAILURES

pytestmark = pytest.mark.slow

CI_SAMPLES = 1
# Modules whose first sample misses what irkit's own lowerings handle: nn.LSTM's samples 2 and 3
# are the first with proj_size > 0.
CI_SAMPLES_OF: dict[str, int] = {"nn.LSTM": 4}
_FULL = os.environ.get("IRKIT_MODULEINFO", "").lower() == "full"


def _samples(module: str) -> int | None:
    """How many samples of ``module`` the test runs (None: all)."""
    return None if _FULL else CI_SAMPLES_OF.get(module, CI_SAMPLES)


def _params() -> list:
    params = []
    for case in moduleinfo.all_cases():
        marks = []
        expected = EXPECTED_FAILURES.get(case)
        n = _samples(case[0])
        if expected is not None and (n is None or expected[0] < n):
            marks.append(pytest.mark.xfail(strict=True, reason=expected[1]))
        params.append(pytest.param(case, id=moduleinfo.case_id(*case), marks=marks))
    return params


@pytest.mark.parametrize("case", _params())
def test_moduleinfo(case: tuple[str, str]) -> None:
    result = moduleinfo.run_case(*case, n_samples=_samples(case[0]))["irkit"]
    assert result.passed or result.outcome in moduleinfo.NOT_APPLICABLE, (
        f"{result.outcome.value} (sample {result.sample}): {result.reason}"
    )


def test_expected_failures_are_real_cases() -> None:
    known = set(moduleinfo.all_cases())
    stale = [c for c in EXPECTED_FAILURES if c not in known]
    assert not stale, f"entries for cases module_db does not have: {stale}"
    unclassified = {
        c: r for c, (_, r) in EXPECTED_FAILURES.items() if not r.startswith(("irkit gap", "both"))
    }
    assert not unclassified, unclassified


def test_harness_detects_a_wrong_lowering() -> None:
    """A deliberately wrong lowering of the module's op is a mismatch, the right one passes."""
    import torch
    from onnxscript import opset18 as op

    import irkit
    from tests.conformance import opinfo

    sample = next(
        s
        for s in moduleinfo.samples(moduleinfo.find_module("nn.Tanh"), "float32", 1)
        if isinstance(s, moduleinfo.ModuleSample)
    )
    ep = opinfo.export(sample)
    assert isinstance(ep, torch.export.ExportedProgram)
    wrong = irkit.lower(ep, custom_lowerings={torch.ops.aten.tanh.default: lambda x: op.Sigmoid(x)})
    assert opinfo.run_and_compare(wrong, ep, sample).outcome is opinfo.Outcome.MISMATCH
    assert opinfo.run_and_compare(irkit.lower(ep), ep, sample).passed


def test_random_samples_make_fractional_pooling_deterministic() -> None:
    """module_db gives ``FractionalMaxPool*d`` its ``_random_samples``: the module is
    deterministic, so its outputs are compared by value (not shape and dtype only)."""
    for name in ("nn.FractionalMaxPool2d", "nn.FractionalMaxPool3d"):
        for sample in moduleinfo.samples(moduleinfo.find_module(name), "float32"):
            assert isinstance(sample, moduleinfo.ModuleSample)
            assert "_random_samples" in sample.description, sample.description
            assert not sample.random, sample.description
