"""OpInfo conformance harness: one PyTorch OpInfo entry → export → ONNX → onnxruntime vs eager.

PyTorch's own op database (``torch.testing._internal.common_methods_invocations.op_db``) gives,
for every op, sample inputs per dtype. For one ``(op, dtype)`` *case* the harness takes the first
few samples (deterministic seed), wraps each call in an ``nn.Module`` whose ``forward`` takes every
tensor leaf of ``(sample.input, sample.args, sample.kwargs)`` as an input (non-tensors are baked in
as constants), exports it with ``torch.export.export`` as a user would (eval mode, grad enabled),
converts the program with an *exporter* (irkit or the stock ``torch.onnx.export(..., dynamo=True)``)
and runs the ONNX model in onnxruntime (CPU, graph optimizations disabled) against eager PyTorch.

Every sample ends in one :class:`Outcome` with a one-line reason; a case passes when every sample
that torch can export passes. Used by ``tests/conformance/test_opinfo.py`` (CI subset) and
``bench/bench_opinfo.py`` (the full sweep, both exporters).

Comparison policy (see docs/conformance.md):

* float32: ``|actual - expected| <= atol + rtol * |expected|`` with torch's ONNX OpInfo tolerances
  (``rtol=3.7e-5, atol=1.8e-4``, test/onnx/torchlib/test_ops.py); NaN equals NaN, infinities must
  match. Integers and bool: exact.
* Output count, shapes and dtypes must match exactly (an int64 output where torch returns float
  is a failure). A complex eager output is compared with ``torch.view_as_real`` of it — ONNX has
  no complex arithmetic and torchlib represents complex tensors that way.
* Random ops (eager gives different numbers under two different seeds): shape and dtype only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import functools
import gc
import io
import itertools
import logging
import re
import traceback
import types
import warnings
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import torch
import torch.utils._pytree as pytree

logger = logging.getLogger(__name__)

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "int64": torch.int64,
    "bool": torch.bool,
}
# torch's ONNX OpInfo tests (test/onnx/torchlib/test_ops.py): relaxed for aten::matmul and
# native_layer_norm; other dtypes exact.
FP32_RTOL = 3.7e-5
FP32_ATOL = 1.8e-4
DEFAULT_SAMPLES = 3
SEED = 0


class Outcome(str, enum.Enum):
    """How one sample (and, for the worst sample, one case) ended."""

    PASS = "pass"
    NO_SAMPLES = "no_samples"  # op lists the dtype but yields no sample eager can run
    EXPORT_FAILED = "export_failed"  # torch.export fails: not applicable to either exporter
    UNSUPPORTED = "unsupported"  # irkit.UnsupportedOpError
    LOWERING_ERROR = "lowering_error"  # another irkit error (or any stock exporter error)
    CRASH = "crash"  # a non-irkit exception escaped irkit.lower / irkit mutated the program
    ORT_LOAD_FAILED = "ort_load_failed"
    ORT_RUN_FAILED = "ort_run_failed"
    OUTPUT_MISMATCH = "output_mismatch"  # number of outputs differs
    DTYPE_MISMATCH = "dtype_mismatch"
    SHAPE_MISMATCH = "shape_mismatch"
    MISMATCH = "mismatch"  # values differ beyond tolerance
    TIMEOUT = "timeout"  # set by the bench's process pool
    WORKER_DIED = "worker_died"  # set by the bench's process pool (segfault, OOM)


# Outcomes that say nothing about the exporter: the case is not applicable to either.
NOT_APPLICABLE = frozenset({Outcome.NO_SAMPLES, Outcome.EXPORT_FAILED})


@dataclasses.dataclass(frozen=True)
class Result:
    """The outcome of one case (or one sample) with a one-line reason."""

    outcome: Outcome
    reason: str = ""
    sample: int = -1  # index of the sample the outcome comes from (-1: none)

    @property
    def passed(self) -> bool:
        return self.outcome is Outcome.PASS

    def to_json(self) -> dict[str, Any]:
        return {"outcome": self.outcome.value, "reason": self.reason, "sample": self.sample}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Result:
        return cls(Outcome(data["outcome"]), data["reason"], data["sample"])


# ----------------------------------------------------------------------------------------------
# The op database


@functools.lru_cache(maxsize=1)
def op_db() -> tuple[Any, ...]:
    """PyTorch's OpInfo database (imported lazily: it takes a few seconds)."""
    from torch.testing._internal.common_methods_invocations import op_db as db

    return tuple(db)


def case_id(name: str, variant: str, dtype: str) -> str:
    """The test id of a case: ``op.variant-dtype`` (``op-dtype`` without a variant)."""
    return f"{name}.{variant}-{dtype}" if variant else f"{name}-{dtype}"


@functools.lru_cache(maxsize=1)
def _ops_by_key() -> dict[tuple[str, str], Any]:
    return {(op.name, op.variant_test_name): op for op in op_db()}


def find_op(name: str, variant: str = "") -> Any:
    """The OpInfo entry ``(name, variant)``; raises ``KeyError`` naming close matches."""
    try:
        return _ops_by_key()[(name, variant)]
    except KeyError:
        close = sorted(f"{n}.{v}" if v else n for n, v in _ops_by_key() if n.startswith(name[:4]))
        raise KeyError(f"no OpInfo {name!r} variant {variant!r}; similar: {close[:10]}") from None


class OpDbCaseGone(UserWarning):
    """A case of irkit's tables that the installed torch's op_db no longer has."""


def missing_from_op_db(
    cases: Iterable[tuple[str, str, str]],
    known: Collection[tuple[str, str, str]],
    *,
    installed_torch: str,
    table_torch: str,
    what: str,
) -> list[str]:
    """The ids of ``cases`` not in ``known`` (the installed op_db's cases), reported.

    Under the torch the tables were made from (``table_torch``) a missing case is a mistake in
    the table: ``AssertionError``. Under another torch, whose op_db may drop cases (torch 2.15's
    has no float32 ``cholesky`` or ``qr``), each is named in one :class:`OpDbCaseGone` warning
    (pytest's warnings summary), and the suite runs the cases that remain.
    """
    missing = [case_id(*c) for c in cases if c not in known]
    if missing:
        message = (
            f"{len(missing)} {what} not in torch {installed_torch}'s op_db (the tables were "
            f"made from torch {table_torch}'s): {', '.join(missing)}"
        )
        assert installed_torch != table_torch, message
        warnings.warn(OpDbCaseGone(message), stacklevel=2)
    return missing


def all_cases(dtypes: Sequence[str] = tuple(DTYPES)) -> list[tuple[str, str, str]]:
    """Every ``(op, variant, dtype)`` of op_db where the op lists the dtype (CPU)."""
    out = []
    for op in op_db():
        supported = op.supported_dtypes("cpu")
        out.extend((op.name, op.variant_test_name, d) for d in dtypes if DTYPES[d] in supported)
    return out


# ----------------------------------------------------------------------------------------------
# Samples and the module that wraps one call


@dataclasses.dataclass
class Sample:
    """One call of the op: its tensor leaves, the module that replays it and eager's outputs."""

    module: torch.nn.Module
    args: tuple[torch.Tensor, ...]
    expected: list[torch.Tensor]
    random: bool
    description: str


class _TensorSlot:
    """Marks where a forward input goes among a sample's leaves (``None`` is a real value)."""

    def __repr__(self) -> str:
        return "TENSOR_SLOT"


TENSOR_SLOT = _TensorSlot()


class OpModule(torch.nn.Module):
    """``forward(*tensors)`` calls ``fn(input, *args, **kwargs)`` with the tensors put back.

    Non-tensor leaves (ints, dtypes, slices, ...) are constants of the module. If the op mutates
    its inputs, the inputs are cloned first so the program does not mutate user inputs (the
    in-place op itself is still in the graph).
    """

    def __init__(self, fn: Callable[..., Any], leaves: list[Any], spec: Any, clone: bool):
        super().__init__()
        self.fn = fn
        self.leaves = leaves  # tensors replaced by TENSOR_SLOT
        self.spec = spec
        self.clone = clone

    def forward(self, *tensors: torch.Tensor) -> Any:
        it = iter(tensors)
        leaves = [
            (next(it).clone() if self.clone else next(it)) if leaf is TENSOR_SLOT else leaf
            for leaf in self.leaves
        ]
        inp, args, kwargs = pytree.tree_unflatten(leaves, self.spec)
        return self.fn(inp, *args, **kwargs)


def _split(sample: Any) -> tuple[list[Any], Any, list[torch.Tensor]]:
    leaves, spec = pytree.tree_flatten((sample.input, tuple(sample.args), dict(sample.kwargs)))
    tensors = [x for x in leaves if isinstance(x, torch.Tensor)]
    consts = [TENSOR_SLOT if isinstance(x, torch.Tensor) else x for x in leaves]
    return consts, spec, tensors


def _fresh(tensors: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    return tuple(t.detach().clone() for t in tensors)


def _eager(module: OpModule, tensors: Sequence[torch.Tensor], seed: int) -> Any:
    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return module(*_fresh(tensors))


def _tensor_leaves(out: Any) -> list[Any]:
    leaves, _ = pytree.tree_flatten(out)
    return [x for x in leaves if x is not None]


def _same(a: list[Any], b: list[Any]) -> bool:
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            if x.shape != y.shape or x.dtype != y.dtype:
                return False
            x, y = x.resolve_conj().resolve_neg(), y.resolve_conj().resolve_neg()
            if not torch.equal(
                torch.view_as_real(x) if x.is_complex() else x,
                torch.view_as_real(y) if y.is_complex() else y,
            ) and not (
                x.is_floating_point() and torch.allclose(x, y, rtol=0, atol=0, equal_nan=True)
            ):
                return False
        elif x != y:
            return False
    return True


def _close_sample_generator(it: Any) -> None:
    """Close the sample generator now.

    Many ``sample_inputs`` functions are generators running under ``torch.no_grad()``. OpInfo
    wraps them in a ``TrackedInputIter`` that sits in a reference cycle, so an unfinished
    generator is finalized by the cyclic garbage collector at an arbitrary later moment — in the
    middle of a later ``torch.export`` trace its ``no_grad`` exit turns into a
    ``wrap_with_set_grad_enabled`` node (seen as a flaky ``unsupported`` result).
    """
    if isinstance(it, types.GeneratorType):
        it.close()
        return
    child = getattr(it, "child_iter", None)  # TrackedInputIter: enumerate(generator)
    for ref in gc.get_referents(child) if child is not None else ():
        if isinstance(ref, types.GeneratorType):
            ref.close()


def samples(op: Any, dtype: str, n: int = DEFAULT_SAMPLES) -> Iterator[Sample | Result]:
    """The first ``n`` samples of ``op`` for ``dtype`` as :class:`Sample` s.

    A sample eager PyTorch cannot run (or whose output has no tensor) is yielded as a
    :class:`Result` (``NO_SAMPLES`` with the reason) so nothing disappears silently.
    """
    torch.manual_seed(SEED)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gen = op.sample_inputs("cpu", DTYPES[dtype])
        raw = list(itertools.islice(gen, n))
        _close_sample_generator(gen)
    for i, sample in enumerate(raw):
        consts, spec, tensors = _split(sample)
        module = OpModule(op.op, consts, spec, clone=False).eval()
        copies = _fresh(tensors)
        try:
            torch.manual_seed(1234)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                first = module(*copies)
        except Exception as e:  # the sample itself is invalid on this build
            yield Result(Outcome.NO_SAMPLES, f"eager fails: {_line(e)}", i)
            continue
        # An op that writes into its inputs bumps their version counters.
        mutates = any(c._version != 0 for c in copies)
        if mutates:
            module = OpModule(op.op, consts, spec, clone=True).eval()
        out = _tensor_leaves(first)
        if not out or not all(isinstance(x, torch.Tensor) for x in out):
            kinds = sorted({type(x).__name__ for x in out}) or ["nothing"]
            yield Result(Outcome.NO_SAMPLES, f"eager returns {', '.join(kinds)}, not tensors", i)
            continue
        sparse = sorted({str(x.layout) for x in out if x.layout != torch.strided})
        if sparse:
            yield Result(Outcome.NO_SAMPLES, f"eager returns {', '.join(sparse)} tensors", i)
            continue
        yield Sample(
            module=module,
            args=tuple(tensors),
            expected=out,
            random=_is_random(op, module, tensors, out),
            description=_describe(sample),
        )


_RANDOM_NAME = re.compile(
    r"rand|normal|bernoulli|dropout|multinomial|uniform|poisson|exponential|geometric|cauchy"
)


def _is_random(op: Any, module: OpModule, tensors: Sequence[torch.Tensor], out: list[Any]) -> bool:
    """Whether the op's output is random (or uninitialized, like ``empty``).

    Eager runs under further seeds; any difference means random. Tiny samples can agree by
    chance (bernoulli of three small probabilities), so OpInfo's
    ``has_nondeterministic_output`` and the names of torch's random ops count too.
    """
    if op.has_nondeterministic_output or _RANDOM_NAME.search(op.name):
        return True
    return any(
        not _same(out, _tensor_leaves(_eager(module, tensors, seed=seed))) for seed in (4321, 99)
    )


def has_random_node(ep: torch.export.ExportedProgram) -> bool:
    """Whether the program calls an op torch tags ``nondeterministic_seeded`` (dropout inside
    ``multi_head_attention_forward`` with ``training=True``: eager may agree under a few seeds)."""
    return any(
        isinstance(node.target, torch._ops.OpOverload)
        and torch.Tag.nondeterministic_seeded in node.target.tags
        for node in ep.graph.nodes
        if node.op == "call_function"
    )


def _describe(sample: Any) -> str:
    def short(x: Any) -> str:
        if isinstance(x, torch.Tensor):
            return f"{str(x.dtype).removeprefix('torch.')}{list(x.shape)}"
        return repr(x)

    mapped = pytree.tree_map(short, (sample.input, tuple(sample.args), dict(sample.kwargs)))
    return f"input={mapped[0]} args={mapped[1]} kwargs={mapped[2]}"


def _line(e: BaseException) -> str:
    """A one-line reason: exception type and its first non-empty line, shortened."""
    text = next((ln.strip() for ln in str(e).splitlines() if ln.strip()), "")
    return f"{type(e).__name__}: {text}"[:300]


def export(sample: Sample) -> torch.export.ExportedProgram | Result:
    """``torch.export.export`` the sample's module as a user would (eval mode, grad enabled)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return torch.export.export(sample.module, _fresh(sample.args))
    except Exception as e:
        return Result(Outcome.EXPORT_FAILED, _line(e))


# ----------------------------------------------------------------------------------------------
# Exporters: ExportedProgram → (onnx_ir.Model | Result)


def irkit_exporter(ep: torch.export.ExportedProgram) -> Any:
    """``irkit.lower(ep)`` with its defaults; classifies failures (``UNSUPPORTED``/...)."""
    import irkit

    before = str(ep.graph)
    try:
        model = irkit.lower(ep)
    except irkit.UnsupportedOpError as e:
        ops = ", ".join(name for name, *_ in e.ops)
        return Result(Outcome.UNSUPPORTED, f"UnsupportedOpError: {ops}")
    except irkit.IrkitError as e:
        return Result(Outcome.LOWERING_ERROR, _irkit_reason(e))
    except Exception as e:
        return Result(Outcome.CRASH, _line(e) + _where(e))
    if str(ep.graph) != before:
        return Result(Outcome.CRASH, "irkit.lower mutated the input ExportedProgram")
    return model


def _irkit_reason(e: BaseException) -> str:
    """The error without its where-prefix (the FX node is always the op's own node), then the
    chained cause and where it was raised — the part that names the root cause."""
    import irkit

    text = str(e)
    if isinstance(e, irkit.LoweringError):
        where = f"FX node {e.fx_node!r} ({e.target})"
        where += f" in module {e.module_path!r}" if e.module_path else ""
        where += f" at {e.source}" if e.source else ""
        text = f"in {e.target}: {text.removeprefix(where + ': ')}"
    first = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    out = f"{type(e).__name__} {first}"
    cause = e.__cause__
    if cause is not None and type(cause).__name__ not in first:
        out += f" <- {_line(cause)}"
    if cause is not None:
        out += _where(cause)
    return out[:400]


def _where(e: BaseException) -> str:
    """`` @ file:line in func`` of the innermost frame (where the exception was raised)."""
    tb = traceback.extract_tb(e.__traceback__)
    if not tb:
        return ""
    frame = tb[-1]
    path = frame.filename.split("site-packages/")[-1]
    if "/irkit/" in path:
        path = "irkit/" + path.split("/irkit/", 1)[1]
    return f" @ {path}:{frame.lineno} in {frame.name}"


@functools.cache
def _original_from_torchlib() -> Any:
    from torch.onnx._internal.exporter import _registration

    return _registration.ONNXRegistry.__dict__["from_torchlib"].__func__


@functools.cache
def _torchlib_registry(opset_version: int) -> Any:
    from torch.onnx._internal.exporter import _registration

    return _original_from_torchlib()(_registration.ONNXRegistry, opset_version=opset_version)


@contextlib.contextmanager
def _registry_built_once() -> Iterator[None]:
    """Let ``torch.onnx.export`` build its torchlib registry once per process.

    It rebuilds the same registry in every call (about 70% of a call on a one-op program); with
    no ``custom_translation_table`` nothing writes to it, so reusing it changes time, not results.
    """
    from torch.onnx._internal.exporter import _constants, _registration

    cls = _registration.ONNXRegistry
    _original_from_torchlib()  # remember the real one before patching

    def cached(_cls: Any, opset_version: int = _constants.TORCHLIB_OPSET) -> Any:
        return _torchlib_registry(opset_version)

    saved = cls.__dict__["from_torchlib"]
    cls.from_torchlib = classmethod(cached)
    try:
        yield
    finally:
        cls.from_torchlib = saved


def stock_exporter(ep: torch.export.ExportedProgram) -> Any:
    """``torch.onnx.export(ep, dynamo=True)`` with its default ``optimize``; any error is a
    ``LOWERING_ERROR``."""
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)
    try:
        with (
            _registry_built_once(),
            contextlib.redirect_stdout(io.StringIO()),
            contextlib.redirect_stderr(io.StringIO()),
            warnings.catch_warnings(),
        ):
            warnings.simplefilter("ignore")
            program = torch.onnx.export(ep, dynamo=True, verbose=False)
    except Exception as e:
        return Result(Outcome.LOWERING_ERROR, _line(e))
    return program.model


EXPORTERS: dict[str, Callable[[torch.export.ExportedProgram], Any]] = {
    "irkit": irkit_exporter,
    "stock": stock_exporter,
}


# ----------------------------------------------------------------------------------------------
# onnxruntime vs eager


def run_and_compare(
    model: Any,
    ep: torch.export.ExportedProgram,
    sample: Sample,
    rtol: float = FP32_RTOL,
    atol: float = FP32_ATOL,
) -> Result:
    """Run ``model`` (an ``onnx_ir.Model``) in onnxruntime and compare with eager (floating
    outputs within ``atol + rtol * |expected|``)."""
    from tests.helpers import ort_session

    try:
        session = ort_session(model)
    except Exception as e:
        return Result(Outcome.ORT_LOAD_FAILED, _line(e))
    names = [spec.arg.name for spec in ep.graph_signature.input_specs if _is_user_input(spec)]
    by_name = dict(zip(names, sample.args, strict=True))
    inputs = [i.name for i in session.get_inputs()]
    if set(inputs) <= set(by_name):
        feeds = {n: by_name[n].numpy() for n in inputs}
    elif len(inputs) == len(names):  # renamed inputs (the stock optimizer does): by position
        feeds = {n: t.numpy() for n, t in zip(inputs, sample.args, strict=True)}
    else:
        return Result(
            Outcome.ORT_LOAD_FAILED, f"model inputs {inputs} do not match program inputs {names}"
        )
    try:
        actual = session.run(None, feeds)
    except Exception as e:
        return Result(Outcome.ORT_RUN_FAILED, _line(e))
    return compare(actual, sample.expected, random=sample.random, rtol=rtol, atol=atol)


def _is_user_input(spec: Any) -> bool:
    from torch.export.graph_signature import InputKind

    return spec.kind == InputKind.USER_INPUT and isinstance(
        spec.arg, torch.export.graph_signature.TensorArgument
    )


def _numpy_dtype(t: torch.Tensor) -> np.dtype:
    return torch.empty((), dtype=t.dtype).numpy().dtype


def compare(
    actual: Sequence[np.ndarray],
    expected: Sequence[torch.Tensor],
    random: bool,
    rtol: float = FP32_RTOL,
    atol: float = FP32_ATOL,
) -> Result:
    """Compare onnxruntime's outputs with eager's (policy in the module docstring)."""
    if len(actual) != len(expected):
        return Result(
            Outcome.OUTPUT_MISMATCH, f"{len(actual)} ONNX outputs vs {len(expected)} in eager"
        )
    worst = 0.0
    for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
        a = np.asarray(a)
        e = e.detach().resolve_conj().resolve_neg()
        if e.is_complex():
            e = torch.view_as_real(e)
        want = _numpy_dtype(e)
        if a.dtype != want:
            return Result(Outcome.DTYPE_MISMATCH, f"output {i}: {a.dtype} vs eager {want}")
        if tuple(a.shape) != tuple(e.shape):
            return Result(
                Outcome.SHAPE_MISMATCH, f"output {i}: shape {list(a.shape)} vs {list(e.shape)}"
            )
        if random or not a.size:
            continue
        ok, diff = _close(a, e.numpy(), rtol, atol)
        worst = max(worst, diff)
        if not ok:
            return Result(Outcome.MISMATCH, f"output {i}: max abs diff {diff:.3g}")
    return Result(Outcome.PASS, "random op: shape and dtype only" if random else "")


def _close(
    a: np.ndarray, e: np.ndarray, rtol: float = FP32_RTOL, atol: float = FP32_ATOL
) -> tuple[bool, float]:
    """(within tolerance, max abs diff over finite values)."""
    if not np.issubdtype(e.dtype, np.floating):
        equal = np.array_equal(a, e)
        diff = 0.0 if equal else float(np.max(np.abs(a.astype(np.float64) - e.astype(np.float64))))
        return equal, diff
    a64, e64 = a.astype(np.float64), e.astype(np.float64)
    with np.errstate(invalid="ignore"):  # inf - inf
        raw = np.abs(a64 - e64)
    nan_ok = np.isnan(a64) == np.isnan(e64)
    inf_ok = np.where(np.isinf(e64) | np.isinf(a64), a64 == e64, True)
    finite = np.isfinite(a64) & np.isfinite(e64)
    absdiff = np.where(finite, raw, 0.0)
    within = absdiff <= atol + rtol * np.abs(np.where(finite, e64, 0.0))
    diff = float(absdiff.max()) if absdiff.size else 0.0
    if not nan_ok.all():
        return False, float("nan")
    if not inf_ok.all():
        return False, float("inf")
    return bool(within.all()), diff


# ----------------------------------------------------------------------------------------------
# One case, for one or several exporters


def run_case(
    name: str,
    variant: str,
    dtype: str,
    exporters: Sequence[str] = ("irkit",),
    n_samples: int = DEFAULT_SAMPLES,
) -> dict[str, Result]:
    """Run ``(op, variant, dtype)`` for each exporter on the same samples and programs.

    Returns ``{exporter: Result}``: ``PASS`` if every sample torch can export passes; otherwise
    the first failing sample's result; ``EXPORT_FAILED``/``NO_SAMPLES`` if no sample applies.
    """
    op = find_op(name, variant)
    per: dict[str, list[Result]] = {x: [] for x in exporters}
    skipped: list[Result] = []
    for i, sample in enumerate(samples(op, dtype, n_samples)):
        if isinstance(sample, Result):
            skipped.append(sample)
            continue
        ep = export(sample)
        if isinstance(ep, Result):
            skipped.append(dataclasses.replace(ep, sample=i))
            continue
        sample.random = sample.random or has_random_node(ep)
        for x in exporters:
            if per[x] and not per[x][-1].passed:
                continue  # the case already failed for this exporter
            model = EXPORTERS[x](ep)
            result = model if isinstance(model, Result) else run_and_compare(model, ep, sample)
            if result.passed and sample.random:
                result = Result(Outcome.PASS, "random op: shape and dtype only")
            per[x].append(dataclasses.replace(result, sample=i))
    return {x: _summarize(per[x], skipped) for x in exporters}


def _summarize(results: list[Result], skipped: list[Result]) -> Result:
    if not results:
        export_failed = [r for r in skipped if r.outcome is Outcome.EXPORT_FAILED]
        if export_failed:
            return export_failed[0]
        return skipped[0] if skipped else Result(Outcome.NO_SAMPLES, "op yields no samples")
    for r in results:
        if not r.passed:
            return r
    random = any(r.reason.startswith("random") for r in results)
    note = f"{len(results)} sample(s)"
    if skipped:
        note += f", {len(skipped)} not applicable ({skipped[0].outcome.value})"
    return Result(Outcome.PASS, ("random op, shape/dtype only; " if random else "") + note)
