"""Shared test helpers: run models in onnxruntime and compare with eager PyTorch."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx_ir as ir
import onnxruntime as ort

FP32_ATOL = 1e-4


def ort_session(model: ir.Model | str | os.PathLike) -> ort.InferenceSession:
    """An onnxruntime CPU session with graph optimizations disabled.

    ORT's own fusions must not hide a wrong graph, so nothing is optimized. A path is loaded by
    ORT itself (external data next to it is found). Under pytest-xdist each worker's session
    takes its share of the cores, as torch does (tests/conftest.py): a pool of every core per
    worker would spin against the other workers.
    """
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        opts.intra_op_num_threads = max(1, (os.cpu_count() or 1) // workers)
    opts.log_severity_level = 3
    source = (
        str(model)
        if isinstance(model, (str, os.PathLike))
        else (ir.serde.serialize_model(model).SerializeToString())
    )
    return ort.InferenceSession(source, opts, providers=["CPUExecutionProvider"])


def run_ort(
    model: ir.Model | str | os.PathLike, inputs: Sequence[Any] | Mapping[str, Any]
) -> list[np.ndarray]:
    """Run ``model`` on ``inputs`` (positional, in graph-input order, or by name)."""
    sess = ort_session(model)
    names = [i.name for i in sess.get_inputs()]
    if isinstance(inputs, Mapping):
        feeds = {k: _to_numpy(v) for k, v in inputs.items()}
    else:
        if len(inputs) != len(names):
            raise ValueError(f"model takes {len(names)} inputs {names}, got {len(inputs)}")
        feeds = {n: _to_numpy(v) for n, v in zip(names, inputs, strict=False)}
    return sess.run(None, feeds)


def _to_numpy(v: Any) -> np.ndarray:
    if hasattr(v, "detach"):
        return v.detach().cpu().numpy()
    return np.asarray(v)


def flatten_outputs(out: Any) -> list[np.ndarray]:
    """Flatten eager outputs (tensors, tuples, dicts, HF ModelOutput) in torch.export order."""
    import torch
    import torch.utils._pytree as pytree

    leaves, _ = pytree.tree_flatten(out)
    return [leaf.detach().numpy() for leaf in leaves if isinstance(leaf, torch.Tensor)]


def assert_close(
    actual: Sequence[np.ndarray], expected: Sequence[np.ndarray], atol: float
) -> float:
    """Assert elementwise closeness of two output lists; returns the max abs difference."""
    assert len(actual) == len(expected), f"{len(actual)} outputs vs {len(expected)} expected"
    worst = 0.0
    for i, (a, e) in enumerate(zip(actual, expected, strict=False)):
        assert a.shape == e.shape, f"output {i}: shape {a.shape} vs expected {e.shape}"
        if a.size:
            diff = float(np.max(np.abs(a.astype(np.float64) - e.astype(np.float64))))
            assert diff <= atol, f"output {i}: max abs diff {diff:.3g} > {atol:g}"
            worst = max(worst, diff)
    return worst


GOLDEN_DIR = __import__("pathlib").Path(__file__).parent / "golden"


def assert_golden(text: str, relpath: str) -> None:
    """Compare ``text`` with ``tests/golden/<relpath>``; ``IRKIT_REGEN_GOLDEN=1`` rewrites it."""
    import os

    path = GOLDEN_DIR / relpath
    if os.environ.get("IRKIT_REGEN_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return
    assert path.exists(), f"golden file {path} missing; run with IRKIT_REGEN_GOLDEN=1 to create it"
    expected = path.read_text()
    if text != expected:
        import difflib

        diff = "".join(
            difflib.unified_diff(
                expected.splitlines(True), text.splitlines(True), "golden", "actual", n=2
            )
        )
        raise AssertionError(f"{relpath} differs from the golden text:\n{diff[:6000]}")


def op_histogram(graph) -> dict[str, int]:
    """``{op_type: count}`` over the nodes of a graph or function body, sorted by op type."""
    import collections

    counts = collections.Counter(
        (f"{n.domain}::{n.op_type}" if n.domain else n.op_type) for n in graph
    )
    return dict(sorted(counts.items()))


#: fp32 tolerance of :func:`assert_optimize_keeps_numbers`: kernels that sum in another order.
OPTIMIZE_RTOL, OPTIMIZE_ATOL = 1e-4, 2e-5


def assert_optimize_keeps_numbers(model: ir.Model, feeds: Sequence[Any]) -> None:
    """``irkit.optimize`` for both targets keeps ``model`` runnable with the same outputs.

    The bug class of issue 32 (a rewrite that makes a model onnxruntime ran refuse, or compute
    something else): each optimized copy runs in onnxruntime and is compared with the
    unoptimized model (not with eager), so that only what the rewrite changed counts. ``model``
    itself is not modified.
    """
    import irkit

    before = run_ort(model, feeds)
    for target in ("onnx", "ort"):
        copy = ir.serde.deserialize_model(ir.serde.serialize_model(model))
        after = run_ort(irkit.optimize(copy, target), feeds)  # raises where it became unrunnable
        assert len(after) == len(before), f"target {target!r}"
        for i, (a, b) in enumerate(zip(after, before, strict=True)):
            np.testing.assert_allclose(
                a,
                b,
                rtol=OPTIMIZE_RTOL,
                atol=OPTIMIZE_ATOL,
                err_msg=f"target {target!r}, output {i}",
            )
