"""onnx's own backend test data through ``irkit optimize`` (both targets), ``irkit check`` and
``irkit view``: every model onnxruntime runs before runs after with the same outputs, or irkit
refuses it with an irkit error (``EXPECTED_REFUSALS``, each with its reason). The harness is
``tests/conformance/onnx_backend.py`` (``python -m tests.conformance.onnx_backend`` prints the
whole sweep); the cases come in chunks (by source, and node tests by first letter), so a failure
names its files.
"""

from __future__ import annotations

import string

import numpy as np
import onnx
import pytest
from onnx import helper

from tests.conformance import onnx_backend as ob
from tests.conformance.onnx_backend import Case, Outcome

EXPECTED_REFUSALS: dict[tuple[str, str], str] = {
    ("node/test_mvn", "check"): (
        "onnx.checker's full shape inference rejects the Constant node in the function body of "
        "MeanVarianceNormalization ('One and only one of the attributes ... must be "
        "specified'): an onnx bug; onnxruntime expands the function and runs it"
    ),
}
"""``(case, "onnx" | "ort" | "check")`` → why irkit refuses it (``check``: ``irkit.check`` or the
view's text render raises an irkit error on the original). Strict: an entry that passes fails."""

CHUNKS = [
    "light/",
    "pytorch-converted/",
    "pytorch-operator/",
    "simple/",
    *(f"node/test_{c}" for c in string.ascii_lowercase if c not in "jkvyz"),  # (onnx 1.23 has none)
]


@pytest.fixture(scope="session")
def backend_cases(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Case, ...]:
    # pytest's cache keeps the generated node cases between runs; without it (-p no:cacheprovider)
    # they are generated into this run's temporary directory.
    cache = getattr(request.config, "cache", None)
    where = cache.mkdir("onnx_backend") if cache is not None else tmp_path_factory.mktemp("ob")
    return ob.cases(where)


def _problems(result: ob.CaseResult) -> list[str]:
    found = []
    verdicts = {**result.targets, "check": result.tools}
    for what, verdict in verdicts.items():
        expected = EXPECTED_REFUSALS.get((result.name, what))
        if verdict.outcome is Outcome.REFUSED and expected is None:
            found.append(
                f"{result.name} [{what}] refused, not in EXPECTED_REFUSALS: {verdict.reason}"
            )
        elif verdict.outcome in (Outcome.BROKEN, Outcome.CRASH):
            found.append(f"{result.name} [{what}] {verdict.outcome.value}: {verdict.reason}")
        elif expected is not None and verdict.outcome is not Outcome.REFUSED:
            found.append(f"{result.name} [{what}] passes: delete its EXPECTED_REFUSALS entry")
    return found


@pytest.mark.slow
@pytest.mark.parametrize("chunk", CHUNKS)
def test_onnx_backend_data(chunk: str, backend_cases: tuple[Case, ...]) -> None:
    chosen = [c for c in backend_cases if c.name.startswith(chunk)]
    assert chosen, f"onnx {onnx.__version__} has no case named {chunk}*: drop the chunk"
    problems, ran = [], 0
    for case in chosen:
        result = ob.run_case(case)
        ran += result.original.outcome is Outcome.PASS
        problems += _problems(result)
    assert not problems, "\n".join(problems)
    assert ran, f"onnxruntime runs none of the {len(chosen)} cases: the harness is broken"


@pytest.mark.slow
def test_the_table_names_real_cases(backend_cases: tuple[Case, ...]) -> None:
    names = {c.name for c in backend_cases}
    assert len(names) > 1600, len(names)  # (onnx 1.23: 2,036; 1.18, the floor: 1,663)
    uncovered = sorted(n for n in names if not n.startswith(tuple(CHUNKS)))
    assert not uncovered, f"no chunk runs these (add one to CHUNKS): {uncovered}"
    stale = [key for key in EXPECTED_REFUSALS if key[0] not in names]
    assert not stale, stale
    assert all(any(key[0].startswith(c) for c in CHUNKS) for key in EXPECTED_REFUSALS)


# ----------------------------------------------------------------------------------------------
# The harness itself: it must be able to fail (no onnx case collection: fast)


def _relu_case(expected: np.ndarray | None = None) -> Case:
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["t"]), helper.make_node("Relu", ["t"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [3])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    x = np.array([-1.0, 0.5, 2.0], dtype=np.float32)
    y = np.maximum(x, 0) if expected is None else expected
    return Case("test/relu", model.SerializeToString(), (((x,), (y,)),))


def _reference(case: Case) -> list:
    outputs, result = ob.reference(case)
    assert result.outcome is Outcome.PASS, result
    return outputs


def _with_op(op_type: str):
    def optimizer(model: bytes, target: str) -> bytes:
        proto = onnx.load_from_string(ob.optimize_bytes(model, target))
        proto.graph.node[-1].op_type = op_type
        return proto.SerializeToString()

    return optimizer


def test_harness_passes_irkit_and_catches_wrong_numbers() -> None:
    case = _relu_case()
    outputs = _reference(case)
    assert ob.after(case, "onnx", outputs).outcome is Outcome.PASS
    wrong = ob.after(case, "onnx", outputs, optimizer=_with_op("Neg"))
    assert wrong.outcome is Outcome.BROKEN and "outputs differ" in wrong.reason, wrong
    refused = ob.after(case, "onnx", outputs, optimizer=_with_op("NoSuchOp"))
    assert refused.outcome is Outcome.BROKEN and "onnxruntime refuses" in refused.reason


def test_harness_checks_the_result_when_the_original_passes_check() -> None:
    case = _relu_case()
    outputs = _reference(case)

    def bad_metadata(model: bytes, target: str) -> bytes:  # (onnxruntime runs it; lint does not)
        proto = onnx.load_from_string(ob.optimize_bytes(model, target))
        proto.graph.node[0].metadata_props.add(key="irkit.no_such_key", value="1")
        return proto.SerializeToString()

    assert ob.after(case, "onnx", outputs, optimizer=bad_metadata).outcome is Outcome.PASS
    result = ob.after(case, "onnx", outputs, optimizer=bad_metadata, check=True)
    assert result.outcome is Outcome.BROKEN, result
    assert (
        "irkit.check rejects the result" in result.reason and "irkit.no_such_key" in result.reason
    )


def test_harness_tells_refusals_from_crashes() -> None:
    import irkit

    case = _relu_case()
    outputs = _reference(case)

    def refuse(model: bytes, target: str) -> bytes:
        raise irkit.RewriteError("no")

    def crash(model: bytes, target: str) -> bytes:
        raise KeyError("bug")

    assert ob.after(case, "ort", outputs, optimizer=refuse).outcome is Outcome.REFUSED
    assert ob.after(case, "ort", outputs, optimizer=crash).outcome is Outcome.CRASH


def test_harness_needs_onnxruntime_to_match_the_expected_outputs() -> None:
    outputs, result = ob.reference(_relu_case(np.zeros(3, dtype=np.float32)))
    assert outputs == [] and result.outcome is Outcome.NOT_APPLICABLE
    assert "onnxruntime differs" in result.reason


def test_harness_flags_a_check_false_alarm(monkeypatch: pytest.MonkeyPatch) -> None:
    from irkit import _runtime

    assert ob.check_and_view(_relu_case(), runs=True).outcome is Outcome.PASS
    monkeypatch.setattr(_runtime, "runtime_problems", lambda model: ["no kernel for Relu"])
    result = ob.check_and_view(_relu_case(), runs=True)
    assert result.outcome is Outcome.BROKEN and "false alarm" in result.reason
    assert ob.check_and_view(_relu_case(), runs=False).outcome is Outcome.PASS


def test_problems_apply_the_table_strictly() -> None:
    ok, refused = ob.Result(Outcome.PASS), ob.Result(Outcome.REFUSED, "RewriteError: no")
    result = ob.CaseResult("node/test_mvn", ok, {"onnx": refused, "ort": ok}, ok, 0.0)
    (problem, passes) = _problems(result)
    assert "node/test_mvn [onnx] refused, not in EXPECTED_REFUSALS" in problem
    assert "node/test_mvn [check] passes: delete its EXPECTED_REFUSALS entry" in passes
