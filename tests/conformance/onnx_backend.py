"""onnx's own backend test data through irkit: a model onnxruntime runs must still run after.

The cases (:func:`cases`), about 2,000 models with inputs and expected outputs:

- ``node/*``: every node test case of ``onnx.backend.test.case.node`` and ``simple/*`` every
  simple model case of ``onnx.backend.test.case.model`` — the cases ``backend-test-tools
  generate-data`` serializes, taken from onnx's collectors in memory (no files are written;
  onnx 1.23's ``generate-data`` writes only the simple and real-model directories);
- ``light/*``, ``pytorch-converted/*``, ``pytorch-operator/*``: the data directories the onnx
  wheel ships (``onnx/backend/test/data``); a ``light`` model's inputs are the runner's
  deterministic dummy data (``Runner.generate_dummy_data``), its outputs the wheel's files.

A case is **applicable** when onnxruntime (CPU, graph optimizations off, as
``tests/helpers.py``) loads the original model and matches every expected output — onnx's
own comparison (``Runner.assert_similar_outputs``: output count, shapes, dtypes, strings
exactly, ``assert_allclose(rtol, atol)`` with the case's tolerances, rtol 1e-3 and atol 1e-7,
densenet121 2e-3). For an applicable case, per target (``"onnx"``, ``"ort"``), what
``irkit optimize [--target ort]`` does (:func:`optimize_bytes`: load, ONNX shape inference,
``irkit.optimize(infer_shapes=False)``, ``irkit.save``) must give a model onnxruntime loads and
that matches the original's outputs on the same inputs (the same comparison) — and that passes
``irkit.check`` when the original does —, or raise an
irkit error (a *refusal*, which writes nothing). ``irkit.check`` and the text render of
``irkit view`` run on the original too: each succeeds or raises an irkit error.

Outcomes (:class:`Outcome`) per target; ``broken`` is what the suite forbids.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import json
import logging
import pathlib
import pickle
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
from onnx import numpy_helper

TARGETS = ("onnx", "ort")
DATA = pathlib.Path(onnx.__file__).parent / "backend" / "test" / "data"
WHEEL_KINDS = ("light", "pytorch-converted", "pytorch-operator")


@dataclasses.dataclass(frozen=True)
class Case:
    """One model with its data sets (inputs, expected outputs) and onnx's tolerances."""

    name: str  # "<kind>/<test name>", e.g. "node/test_abs"
    model: bytes  # a serialized ModelProto
    data_sets: tuple[tuple[tuple[Any, ...], tuple[Any, ...]], ...]
    rtol: float = 1e-3
    atol: float = 1e-7


class Outcome(enum.Enum):
    """What happened to one case (for the original) or one target (after irkit)."""

    PASS = "pass"  # the optimized model runs with the original's outputs
    REFUSED = "refused"  # irkit raised an irkit error (nothing written)
    BROKEN = "broken"  # irkit wrote a model onnxruntime refuses or that computes other outputs
    CRASH = "crash"  # a non-irkit exception escaped irkit
    NOT_APPLICABLE = "not_applicable"  # onnxruntime does not run the original as expected


@dataclasses.dataclass(frozen=True)
class Result:
    outcome: Outcome
    reason: str = ""

    @property
    def ok(self) -> bool:
        return self.outcome in (Outcome.PASS, Outcome.NOT_APPLICABLE)


# ----------------------------------------------------------------------------------------------
# The cases


def _normalize(value: Any) -> Any:
    """A data-set entry as onnxruntime takes and returns it (numpy arrays, lists, dicts)."""
    if isinstance(value, onnx.TensorProto):
        return numpy_helper.to_array(value)
    if isinstance(value, onnx.SequenceProto):
        return numpy_helper.to_list(value)
    if isinstance(value, onnx.MapProto):
        return numpy_helper.to_dict(value)
    if isinstance(value, onnx.OptionalProto):
        return numpy_helper.to_optional(value)
    if isinstance(value, np.generic):  # (a 0-d input given as a numpy scalar)
        return np.asarray(value)
    if isinstance(value, list):
        return [_normalize(v) for v in value]
    return value


def _from_collector(test_case: Any, kind: str) -> Case:
    data_sets = tuple(
        (tuple(_normalize(x) for x in inputs), tuple(_normalize(y) for y in outputs))
        for inputs, outputs in test_case.data_sets
    )
    return Case(
        f"{kind}/{test_case.name}",
        test_case.model.SerializeToString(),
        data_sets,
        test_case.rtol,
        test_case.atol,
    )


def _generated() -> Iterator[Case]:
    from onnx.backend.test.case import model as model_cases
    from onnx.backend.test.case import node as node_cases

    with warnings.catch_warnings():  # (the generators overflow casts and divide by zero)
        warnings.simplefilter("ignore")
        np.seterr(all="ignore")
        # onnx's generators may spell numpy 2's ``np.bool`` (onnx 1.18's Attention cases), a
        # name numpy 1.24 … 1.26 lack (their deprecated alias of the builtin was removed; numpy
        # 2's is ``np.bool_``): where numpy has none, it is lent for the generation as
        # ``np.bool_``, the dtype numpy 2 gives, so the cases are the ones numpy 2 generates.
        lend_bool = not hasattr(np, "bool")
        if lend_bool:
            np.bool = np.bool_  # type: ignore[attr-defined,unused-ignore]
        try:
            nodes = node_cases.collect_testcases(None)
            models = model_cases.collect_testcases()
        finally:
            if lend_bool:
                del np.bool
    for test_case in nodes:
        yield _from_collector(test_case, "node")
    for test_case in models:
        if test_case.kind == "simple":
            yield _from_collector(test_case, "simple")


def _generated_cached(cache: pathlib.Path | None) -> list[Case]:
    if cache is None:
        return list(_generated())
    path = cache / f"generated-onnx-{onnx.__version__}-numpy-{np.__version__}.pickle"
    if path.is_file():
        loaded: list[Case] = pickle.loads(path.read_bytes())  # (our own file)
        return loaded
    found = list(_generated())
    path.write_bytes(pickle.dumps(found, protocol=pickle.HIGHEST_PROTOCOL))
    return found


def _read(path: pathlib.Path, type_proto: onnx.TypeProto) -> Any:
    """A data-set file (the onnx runner's ``_load_proto``)."""
    proto: Any
    if type_proto.HasField("sequence_type"):
        proto = onnx.SequenceProto()
    elif type_proto.HasField("map_type"):
        proto = onnx.MapProto()
    elif type_proto.HasField("optional_type"):
        proto = onnx.OptionalProto()
    else:
        proto = onnx.TensorProto()
    proto.ParseFromString(path.read_bytes())
    return _normalize(proto)


def _wheel_case(kind: str, directory: pathlib.Path) -> Case:
    model_bytes = (directory / "model.onnx").read_bytes()
    model = onnx.load_from_string(model_bytes)
    data_sets = []
    for data_dir in sorted(directory.glob("test_data_set*")):
        inputs = tuple(
            _read(data_dir / f"input_{i}.pb", model.graph.input[i].type)
            for i in range(len(list(data_dir.glob("input_*.pb"))))
        )
        outputs = tuple(
            _read(data_dir / f"output_{i}.pb", model.graph.output[i].type)
            for i in range(len(list(data_dir.glob("output_*.pb"))))
        )
        data_sets.append((inputs, outputs))
    return Case(f"{kind}/{directory.name}", model_bytes, tuple(data_sets))


def _light_cases() -> Iterator[Case]:
    from onnx.backend.test.case import model as model_cases
    from onnx.backend.test.runner import Runner

    tolerances = {
        t.model_name: (t.rtol, t.atol) for t in model_cases.collect_testcases() if t.kind == "real"
    }
    for path in sorted((DATA / "light").glob("light_*.onnx")):
        name = path.stem.removeprefix("light_")
        model_bytes = path.read_bytes()
        model = onnx.load_from_string(model_bytes)
        initializers = {t.name for t in model.graph.initializer}
        inputs = tuple(
            Runner.generate_dummy_data(x, seed=0, name=name, random=False)
            for x in model.graph.input
            if x.name not in initializers
        )
        outputs = tuple(
            _read(path.with_name(f"{path.stem}_output_{i}.pb"), model.graph.output[i].type)
            for i in range(len(model.graph.output))
        )
        rtol, atol = tolerances.get(name, (1e-3, 1e-7))
        yield Case(f"light/{name}", model_bytes, ((inputs, outputs),), rtol, atol)


@functools.cache
def cases(cache: pathlib.Path | None = None) -> tuple[Case, ...]:
    """Every case, sorted by name.

    Args:
        cache: A directory keeping the generated cases between runs (onnx's node generators run
            numpy references: about 10 s of CPU; the pickle loads in well under one).
    """
    found = _generated_cached(cache)
    found += _light_cases()
    for kind in WHEEL_KINDS[1:]:
        found += (_wheel_case(kind, d) for d in sorted((DATA / kind).iterdir()) if d.is_dir())
    return tuple(sorted(found, key=lambda c: c.name))


# ----------------------------------------------------------------------------------------------
# Running and comparing


def session(model: bytes | str) -> ort.InferenceSession:
    """An onnxruntime CPU session with graph optimizations off (what ``tests/helpers.py`` uses)."""
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.log_severity_level = 4
    opts.intra_op_num_threads = 1  # (the sweep's figures are for one core)
    return ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])


def run(sess: ort.InferenceSession, inputs: Sequence[Any]) -> list[Any]:
    """Run with inputs in the session's input order (initializers excluded, as onnx does)."""
    names = [i.name for i in sess.get_inputs()]
    return list(sess.run(None, dict(zip(names, inputs, strict=False))))


def compare(expected: Sequence[Any], actual: Sequence[Any], rtol: float, atol: float) -> None:
    """onnx's ``Runner.assert_similar_outputs`` (raises ``AssertionError``)."""
    from onnx.backend.test.runner import Runner

    Runner.assert_similar_outputs(list(expected), list(actual), rtol=rtol, atol=atol)


def _brief(exc: BaseException, limit: int = 300) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:limit]}"


def reference(case: Case) -> tuple[list[list[Any]], Result]:
    """The original model's outputs per data set, or why the case is not applicable."""
    try:
        sess = session(case.model)
    except Exception as exc:
        return [], Result(Outcome.NOT_APPLICABLE, f"onnxruntime refuses it: {_brief(exc)}")
    outputs = []
    for inputs, expected in case.data_sets:
        try:
            got = run(sess, inputs)
        except Exception as exc:
            return [], Result(Outcome.NOT_APPLICABLE, f"onnxruntime fails: {_brief(exc)}")
        try:
            compare(expected, got, case.rtol, case.atol)
        except (AssertionError, TypeError, ValueError) as exc:
            return [], Result(Outcome.NOT_APPLICABLE, f"onnxruntime differs: {_brief(exc)}")
        outputs.append(got)
    return outputs, Result(Outcome.PASS)


def optimize_bytes(model: bytes, target: str) -> bytes:
    """What ``irkit optimize [--target ort]`` writes for ``model`` (may raise irkit errors)."""
    import irkit
    from irkit._shapes import infer_shapes

    with tempfile.TemporaryDirectory() as tmp:
        source = pathlib.Path(tmp, "in.onnx")
        source.write_bytes(model)
        loaded = irkit.load(source)
        infer_shapes(loaded)
        irkit.optimize(loaded, target, infer_shapes=False)
        out = irkit.save(loaded, pathlib.Path(tmp, "out.onnx"))
        return out.read_bytes()


Optimizer = Callable[[bytes, str], bytes]


def after(
    case: Case,
    target: str,
    reference_outputs: list[list[Any]],
    optimizer: Optimizer = optimize_bytes,
    verdicts: dict[bytes, Result] | None = None,
    check: bool = False,
) -> Result:
    """The optimized model against the original's outputs. ``verdicts`` (optimized file →
    result) lets a case's targets share the run when they write the same file. With ``check``
    (the original passes ``irkit.check``), the optimized file must pass it too."""
    from irkit.errors import IrkitError

    try:
        optimized = optimizer(case.model, target)
    except IrkitError as exc:
        return Result(Outcome.REFUSED, _brief(exc))
    except Exception as exc:
        return Result(Outcome.CRASH, _brief(exc))
    if verdicts is None:
        return _run_optimized(case, optimized, reference_outputs, check)
    if optimized not in verdicts:
        verdicts[optimized] = _run_optimized(case, optimized, reference_outputs, check)
    return verdicts[optimized]


def _run_optimized(
    case: Case, optimized: bytes, reference_outputs: list[list[Any]], check: bool
) -> Result:
    import irkit
    from irkit.errors import CheckError

    if check:
        try:
            irkit.check(ir.serde.deserialize_model(onnx.load_from_string(optimized)))
        except CheckError as exc:
            return Result(Outcome.BROKEN, f"irkit.check rejects the result: {_brief(exc)}")
    try:
        sess = session(optimized)
    except Exception as exc:
        return Result(Outcome.BROKEN, f"onnxruntime refuses the result: {_brief(exc)}")
    for (inputs, _), expected in zip(case.data_sets, reference_outputs, strict=True):
        try:
            compare(expected, run(sess, inputs), case.rtol, case.atol)
        except Exception as exc:
            return Result(Outcome.BROKEN, f"outputs differ: {_brief(exc)}")
    return Result(Outcome.PASS)


def check_and_view(case: Case, runs: bool) -> Result:
    """``irkit.check`` and the text render of ``irkit view`` on the original model: each
    succeeds or raises an irkit error (a crash is any other exception). For a model onnxruntime
    runs (``runs``), ``check`` must not claim that onnxruntime cannot run it (``BROKEN``);
    ``REFUSED`` when it rejects the model for another reason (the ONNX checker's)."""
    import irkit
    from irkit import viz
    from irkit._runtime import runtime_problems
    from irkit.errors import IrkitError

    model = ir.serde.deserialize_model(onnx.load_from_string(case.model))
    if runs and (problems := runtime_problems(model)):
        return Result(Outcome.BROKEN, f"check: a false alarm: {problems[0]}")
    refused = ""
    steps: list[tuple[str, Callable[[], object]]] = [
        ("check", lambda: irkit.check(model, runtime=False)),
        ("view", lambda: viz.render_text(viz.summarize(model))),
    ]
    for name, step in steps:
        try:
            step()
        except IrkitError as exc:
            refused = refused or f"{name}: {_brief(exc)}"
        except Exception as exc:
            return Result(Outcome.CRASH, f"{name}: {_brief(exc)}")
    return Result(Outcome.REFUSED, refused) if refused else Result(Outcome.PASS)


@dataclasses.dataclass
class CaseResult:
    name: str
    original: Result
    targets: dict[str, Result]
    tools: Result
    seconds: float


def run_case(case: Case, targets: Sequence[str] = TARGETS) -> CaseResult:
    """The original in onnxruntime, then each target, then check and view."""
    start = time.perf_counter()
    outputs, original = reference(case)
    runs = original.outcome is Outcome.PASS
    tools = check_and_view(case, runs)
    results: dict[str, Result] = {}
    if runs:
        verdicts: dict[bytes, Result] = {}  # (most files come out the same for both targets)
        checked = tools.outcome is Outcome.PASS
        results = {t: after(case, t, outputs, verdicts=verdicts, check=checked) for t in targets}
    return CaseResult(case.name, original, results, tools, time.perf_counter() - start)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tests.conformance.onnx_backend [-k SUBSTRING] [--json FILE]``: the sweep, with
    a summary; exit status 1 if a result is broken or crashed."""
    import argparse
    import collections

    parser = argparse.ArgumentParser()
    parser.add_argument("-k", default="", help="only cases whose name contains this")
    parser.add_argument("--json", help="write every case's results to this file")
    args = parser.parse_args(argv)
    logging.disable(logging.WARNING)  # (onnx-ir and onnxscript log per skipped fold)
    warnings.simplefilter("ignore")
    records = []
    start = time.perf_counter()
    chosen = [c for c in cases() if args.k in c.name]
    collected = time.perf_counter()
    counts: collections.Counter[tuple[str, str]] = collections.Counter()
    slowest: list[tuple[float, str]] = []
    for case in chosen:
        r = run_case(case)
        slowest.append((r.seconds, r.name))
        records.append(
            {
                "name": r.name,
                "seconds": round(r.seconds, 3),
                **{k: dataclasses.asdict(v) for k, v in r.targets.items()},
                "original": dataclasses.asdict(r.original),
                "tools": dataclasses.asdict(r.tools),
            }
        )
        counts["original", r.original.outcome.value] += 1
        counts["tools", r.tools.outcome.value] += 1
        if r.tools.outcome is not Outcome.PASS:
            print(f"{r.name} [check/view] {r.tools.outcome.value}: {r.tools.reason}")
        for target, result in r.targets.items():
            counts[target, result.outcome.value] += 1
            if result.outcome is not Outcome.PASS:
                print(f"{r.name} [{target}] {result.outcome.value}: {result.reason}")
    total = time.perf_counter() - start
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(records, indent=1, default=str))
    print(f"{len(chosen)} cases, collected in {collected - start:.1f} s, swept in {total:.1f} s")
    for key, n in sorted(counts.items()):
        print(f"  {key[0]:>8} {key[1]:<15} {n}")
    for seconds, name in sorted(slowest, reverse=True)[:10]:
        print(f"  {seconds:6.2f} s {name}")
    bad = {Outcome.BROKEN.value, Outcome.CRASH.value}
    return 1 if any(outcome in bad for _, outcome in counts) else 0


if __name__ == "__main__":
    raise SystemExit(main())
