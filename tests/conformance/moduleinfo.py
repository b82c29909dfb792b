"""ModuleInfo conformance harness: one PyTorch ModuleInfo entry → export → ONNX → onnxruntime.

PyTorch's module database (``torch.testing._internal.common_modules.module_db``) gives, for every
``torch.nn`` module, constructor and forward inputs per dtype (``module_inputs_func(module_info,
device="cpu", dtype=..., requires_grad=False, training=False)``). For one ``(module, dtype)``
*case* the harness builds each sample's module in eval mode, wraps it so that ``forward`` takes
every tensor leaf of the forward input as an input (non-tensors are constants), exports it with
``torch.export.export``, converts it with an exporter (irkit or the stock
``torch.onnx.export(..., dynamo=True)``; see :mod:`tests.conformance.opinfo`) and runs the ONNX
model in onnxruntime (CPU) against eager PyTorch.

The comparison is the OpInfo harness's (:func:`tests.conformance.opinfo.compare`): float32 with
torch's ONNX OpInfo tolerances, float16 with ``rtol=atol=1e-2`` (eager CPU float16 computes some
ops in float32; onnxruntime in float16), output count/shape/dtype exact. A sample whose eager
output differs under two further seeds (``FractionalMaxPool2d`` without ``_random_samples``)
compares shape and dtype only; module_db's samples are all deterministic in eval mode (dropout
is in the program with ``train=False``), so every output is compared by value.

A case passes when every sample torch can export passes; a module passes when each of its dtype
cases passes (or is not applicable). Used by ``tests/conformance/test_moduleinfo.py`` (CI) and
``bench/bench_moduleinfo.py`` (the full sweep, both exporters).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.utils._pytree as pytree

from tests.conformance import opinfo
from tests.conformance.opinfo import NOT_APPLICABLE, Outcome, Result

DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "float16": torch.float16}
# (rtol, atol) per dtype; float32 is the OpInfo harness's policy.
TOLERANCES: dict[str, tuple[float, float]] = {
    "float32": (opinfo.FP32_RTOL, opinfo.FP32_ATOL),
    "float16": (1e-2, 1e-2),
}
SEED = 0


@functools.lru_cache(maxsize=1)
def module_db() -> tuple[Any, ...]:
    """PyTorch's ModuleInfo database (imported lazily: it takes seconds)."""
    from torch.testing._internal.common_modules import module_db as db

    return tuple(db)


def case_id(name: str, dtype: str) -> str:
    """The test id of a case: ``nn.Module-dtype``."""
    return f"{name}-{dtype}"


@functools.lru_cache(maxsize=1)
def _by_name() -> dict[str, Any]:
    return {m.name: m for m in module_db()}


def find_module(name: str) -> Any:
    """The ModuleInfo entry ``name`` (``nn.LSTM``); raises ``KeyError`` naming close matches."""
    try:
        return _by_name()[name]
    except KeyError:
        close = sorted(n for n in _by_name() if n[:6] == name[:6])
        raise KeyError(f"no ModuleInfo {name!r}; similar: {close[:10]}") from None


def all_cases(dtypes: Sequence[str] = tuple(DTYPES)) -> list[tuple[str, str]]:
    """Every ``(module, dtype)`` of module_db where the entry lists the dtype."""
    return [(m.name, d) for m in module_db() for d in dtypes if DTYPES[d] in m.dtypes]


class ForwardModule(torch.nn.Module):
    """``forward(*tensors)`` calls the wrapped module with its forward input's tensors put back."""

    def __init__(self, module: torch.nn.Module, leaves: list[Any], spec: Any):
        super().__init__()
        self.module = module
        self.leaves = leaves  # tensors replaced by opinfo.TENSOR_SLOT
        self.spec = spec

    def forward(self, *tensors: torch.Tensor) -> Any:
        it = iter(tensors)
        leaves = [next(it) if leaf is opinfo.TENSOR_SLOT else leaf for leaf in self.leaves]
        args, kwargs = pytree.tree_unflatten(leaves, self.spec)
        return self.module(*args, **kwargs)


@dataclasses.dataclass
class ModuleSample(opinfo.Sample):
    """An OpInfo :class:`~tests.conformance.opinfo.Sample` with the dtype's tolerances."""

    rtol: float = opinfo.FP32_RTOL
    atol: float = opinfo.FP32_ATOL


def _eager(module: torch.nn.Module, tensors: Sequence[torch.Tensor], seed: int) -> Any:
    torch.manual_seed(seed)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        return module(*(t.clone() for t in tensors))


def raw_inputs(info: Any, dtype: str) -> list[Any]:
    """The entry's ``ModuleInput`` s for ``dtype`` (eval mode, no grad), deterministic."""
    torch.manual_seed(SEED)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return list(
            info.module_inputs_func(
                info, device="cpu", dtype=DTYPES[dtype], requires_grad=False, training=False
            )
        )


def samples(info: Any, dtype: str, n: int | None = None) -> Iterator[ModuleSample | Result]:
    """The first ``n`` (all: None) samples of the entry for ``dtype``.

    A sample eager PyTorch cannot run (or whose output has no tensor) is yielded as a
    :class:`Result` (``NO_SAMPLES`` with the reason) so nothing disappears silently.
    """
    rtol, atol = TOLERANCES[dtype]
    for i, mi in enumerate(itertools.islice(raw_inputs(info, dtype), n)):
        if mi.forward_input is None:
            yield Result(Outcome.NO_SAMPLES, "sample has no forward input", i)
            continue
        ctor, fwd = mi.constructor_input, mi.forward_input
        leaves, spec = pytree.tree_flatten((tuple(fwd.args), dict(fwd.kwargs)))
        tensors = [x for x in leaves if isinstance(x, torch.Tensor)]
        consts = [opinfo.TENSOR_SLOT if isinstance(x, torch.Tensor) else x for x in leaves]
        try:
            torch.manual_seed(SEED)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                inner = info.module_cls(*ctor.args, **ctor.kwargs).to(DTYPES[dtype]).eval()
            module = ForwardModule(inner, consts, spec).eval()
            first = _eager(module, tensors, seed=1234)  # also materializes Lazy* modules
        except Exception as e:  # the sample itself is invalid on this build
            yield Result(Outcome.NO_SAMPLES, f"eager fails: {opinfo._line(e)}", i)
            continue
        out = opinfo._tensor_leaves(first)
        if not out or not all(isinstance(x, torch.Tensor) for x in out):
            kinds = sorted({type(x).__name__ for x in out}) or ["nothing"]
            yield Result(Outcome.NO_SAMPLES, f"eager returns {', '.join(kinds)}, not tensors", i)
            continue
        random = any(
            not opinfo._same(out, opinfo._tensor_leaves(_eager(module, tensors, seed=s)))
            for s in (4321, 99)
        )
        yield ModuleSample(
            module=module,
            args=tuple(tensors),
            expected=out,
            random=random,
            description=f"{mi.desc or 'sample'}: {_describe(ctor, fwd)}",
            rtol=rtol,
            atol=atol,
        )


def _describe(ctor: Any, fwd: Any) -> str:
    def short(x: Any) -> str:
        if isinstance(x, torch.Tensor):
            return f"{str(x.dtype).removeprefix('torch.')}{list(x.shape)}"
        return repr(x)

    c = pytree.tree_map(short, (tuple(ctor.args), dict(ctor.kwargs)))
    f = pytree.tree_map(short, (tuple(fwd.args), dict(fwd.kwargs)))
    return f"ctor={c} forward={f}"


def run_case(
    name: str,
    dtype: str,
    exporters: Sequence[str] = ("irkit",),
    n_samples: int | None = None,
) -> dict[str, Result]:
    """Run ``(module, dtype)`` for each exporter on the same samples and programs.

    Returns ``{exporter: Result}``: ``PASS`` if every sample torch can export passes; otherwise
    the first failing sample's result (its reason names the sample); ``EXPORT_FAILED`` /
    ``NO_SAMPLES`` if no sample applies.
    """
    info = find_module(name)
    per: dict[str, list[Result]] = {x: [] for x in exporters}
    skipped: list[Result] = []
    for i, sample in enumerate(samples(info, dtype, n_samples)):
        if all(per[x] and not per[x][-1].passed for x in exporters):
            break  # every exporter failed already: the rest cannot change the verdicts
        if isinstance(sample, Result):
            skipped.append(sample)
            continue
        ep = opinfo.export(sample)
        if isinstance(ep, Result):
            skipped.append(dataclasses.replace(ep, sample=i))
            continue
        # No has_random_node here: in eval mode dropout is in the program with train=False.
        for x in exporters:
            if per[x] and not per[x][-1].passed:
                continue  # the case already failed for this exporter
            model = opinfo.EXPORTERS[x](ep)
            result = (
                model
                if isinstance(model, Result)
                else opinfo.run_and_compare(model, ep, sample, rtol=sample.rtol, atol=sample.atol)
            )
            if not result.passed:
                result = dataclasses.replace(
                    result, reason=f"{result.reason} [{sample.description[:160]}]"
                )
            per[x].append(dataclasses.replace(result, sample=i))
    return {x: opinfo._summarize(per[x], skipped) for x in exporters}


def module_passed(results: Sequence[Result]) -> bool | None:
    """A module's verdict from its dtype cases: None when no case is applicable."""
    applicable = [r for r in results if r.outcome not in NOT_APPLICABLE]
    if not applicable:
        return None
    return all(r.passed for r in applicable)
