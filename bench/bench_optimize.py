"""Benchmark: irkit's optimizer vs onnxscript's and vs onnxslim, on the same models.

Two tables, each against references measured in the same run on fresh copies of the same model.

1. ``irkit.optimize`` vs onnxscript (``onnxscript.optimizer.optimize`` then
   ``onnxscript.rewriter.rewrite`` with its default rules). Models from two front ends: the stock
   exporter (``torch.onnx.export(ep, dynamo=True, optimize=False).model``) and ``irkit.lower``
   (flat, and with its default module functions) — pre-LN stacks of 4/16/64 layers
   (``tests.zoo`` ``stackN``), GPT-2, Llama. Then the scaling slope of each optimizer (log-log
   fit of time vs node count over the stacks; 1.0 = linear).
2. ``irkit optimize`` (what the command runs: ONNX shape inference, then ``irkit.optimize``) vs
   onnxslim (``onnxslim.slim``) on the stock exporter's unoptimized output of every
   ``tests/zoo.py`` model, each in its native in-memory form (``onnx_ir.Model`` /
   ``onnx.ModelProto``; conversions are not timed). Per model: nodes before, best time and nodes
   after for each, the largest difference of any output from the unoptimized model's in
   onnxruntime, the time ratio onnxslim/irkit and the node difference irkit − onnxslim.

Ratios are reference/irkit: higher is better for irkit. The zoo models have random weights and
the default initialization (norm weights of ones, biases of zeros), which the neutral-element
rules of both tools remove; trained weights would not allow that.

onnxslim is not an irkit dependency. Without it the second table has no onnxslim columns and says
how to install it: ``python -m venv --system-site-packages .venv && .venv/bin/pip install
onnxslim``, then run this script with ``.venv/bin/python``.

Usage:  python bench/bench_optimize.py [--quick] [--repeat N] [--against onnxscript|onnxslim|all]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import logging
import math
import pathlib
import sys
import time
import warnings
from collections.abc import Callable

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

import numpy as np
import onnx
import onnx_ir as ir
import torch

import irkit
from irkit.cli import infer_shapes
from irkit.rewriting import count_nodes
from tests import helpers, zoo

ONNXSLIM_HINT = (
    "onnxslim is not installed in this environment: no onnxslim columns. To compare, run in a "
    "venv that has it: python -m venv --system-site-packages .venv && .venv/bin/pip install "
    "onnxslim && .venv/bin/python bench/bench_optimize.py --against onnxslim"
)

# Every zoo model the stock exporter is asked to export (t5 is listed: it reports its failure).
SLIM_MODELS = [
    "mlp", "cnn", "stack4", "stack16", "stack64", "gpt2", "bert", "llama", "mistral", "vit",
    "whisper", "t5",
]  # fmt: skip
SLIM_MODELS_QUICK = ["cnn", "stack4", "gpt2", "llama"]


def _stock_export(ep) -> ir.Model:
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.onnx.export(ep, dynamo=True, optimize=False, verbose=False).model


def _copy(model: ir.Model) -> ir.Model:
    return ir.serde.deserialize_model(ir.serde.serialize_model(model))


# --- 1. irkit.optimize vs onnxscript -------------------------------------------------------------


def _run_irkit(model: ir.Model) -> None:
    irkit.optimize(model)


def _run_onnxscript(model: ir.Model) -> None:
    import onnxscript.optimizer
    import onnxscript.rewriter

    onnxscript.optimizer.optimize(model)
    onnxscript.rewriter.rewrite(model)


def _best(fn: Callable[[ir.Model], None], model: ir.Model, repeat: int) -> tuple[float, int]:
    best, nodes = math.inf, 0
    for _ in range(repeat):
        m = _copy(model)
        t0 = time.perf_counter()
        fn(m)
        best = min(best, time.perf_counter() - t0)
        nodes = count_nodes(m)
    return best, nodes


def _slope(points: list[tuple[int, float]]) -> float:
    xs = [math.log(n) for n, _ in points]
    ys = [math.log(t) for _, t in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum(
        (x - mx) ** 2 for x in xs
    )


def against_onnxscript(quick: bool, repeat: int) -> None:
    names = ["stack4", "stack16"] if quick else ["stack4", "stack16", "stack64", "gpt2", "llama"]
    fronts = {
        "stock export": _stock_export,
        "irkit flat": functools.partial(irkit.lower, functions=False),
        # The default: shared function bodies are optimized once (onnxscript inlines them).
        "irkit hier": irkit.lower,
    }
    warm = _stock_export(zoo.export("stack4"))  # imports and registries outside the measurement
    _best(_run_irkit, warm, 1)
    _best(_run_onnxscript, warm, 1)

    print("1. irkit.optimize vs onnxscript (optimizer.optimize + rewriter.rewrite)")
    header = (
        f"{'front end':<14} {'model':<8} {'nodes':>6} | {'irkit s':>8} {'nodes':>6} | "
        f"{'oscript s':>9} {'nodes':>6} | {'oscript/irkit':>13}"
    )
    print(header)
    print("-" * len(header))
    scaling: dict[str, dict[str, list[tuple[int, float]]]] = {
        f: {"irkit": [], "onnxscript": []} for f in fronts
    }
    for name in names:
        ep = zoo.export(name)
        flat_nodes = count_nodes(irkit.lower(ep, functions=False))
        for front, make in fronts.items():
            model = make(ep)
            n0 = count_nodes(model)
            t_irkit, n_irkit = _best(_run_irkit, model, repeat)
            t_ref, n_ref = _best(_run_onnxscript, model, repeat)
            print(
                f"{front:<14} {name:<8} {n0:>6} | {t_irkit:>8.3f} {n_irkit:>6} | "
                f"{t_ref:>9.3f} {n_ref:>6} | {t_ref / t_irkit:>12.1f}×",
                flush=True,
            )
            if name.startswith("stack"):
                # Slopes are over the flat size, so stored-vs-inlined sizes do not skew them.
                scaling[front]["irkit"].append((flat_nodes, t_irkit))
                scaling[front]["onnxscript"].append((flat_nodes, t_ref))
    print()
    for front, series in scaling.items():
        if len(series["irkit"]) >= 2:
            print(
                f"scaling slope over stacks ({front}): irkit {_slope(series['irkit']):.2f}, "
                f"onnxscript {_slope(series['onnxscript']):.2f}  (log-log fit of time vs flat nodes)"
            )


# --- 2. irkit optimize vs onnxslim ---------------------------------------------------------------


def _irkit_command(data: bytes) -> tuple[float, bytes]:
    """What ``irkit optimize`` runs between loading and saving, timed."""
    model = ir.serde.deserialize_model(onnx.load_from_string(data))
    t0 = time.perf_counter()
    infer_shapes(model)
    irkit.optimize(model)
    seconds = time.perf_counter() - t0
    return seconds, ir.serde.serialize_model(model).SerializeToString()


def _onnxslim(data: bytes) -> tuple[float, bytes]:
    import onnxslim

    proto = onnx.load_from_string(data)
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        slim = onnxslim.slim(proto)
    seconds = time.perf_counter() - t0
    return seconds, slim.SerializeToString()


def _best_bytes(fn: Callable[[bytes], tuple[float, bytes]], data: bytes, repeat: int):
    best, out = math.inf, b""
    for _ in range(repeat):
        seconds, out = fn(data)
        best = min(best, seconds)
    return best, out


def _nodes(data: bytes) -> int:
    return count_nodes(ir.serde.deserialize_model(onnx.load_from_string(data)))


def _max_diff(data: bytes, inputs: list, reference: list[np.ndarray]) -> float:
    out = helpers.run_ort(ir.serde.deserialize_model(onnx.load_from_string(data)), inputs)
    return max(
        float(np.max(np.abs(a.astype(np.float64) - r.astype(np.float64)))) if a.size else 0.0
        for a, r in zip(out, reference, strict=True)
    )


def _has_onnxslim() -> bool:
    try:
        import onnxslim  # noqa: F401
    except ImportError:
        return False
    return True


def against_onnxslim(quick: bool, repeat: int) -> None:
    slim = _has_onnxslim()
    names = SLIM_MODELS_QUICK if quick else SLIM_MODELS
    print("2. irkit optimize (shape inference + irkit.optimize) vs onnxslim, stock export")
    if slim:
        import onnxslim

        print(
            f"   onnxslim {onnxslim.__version__}, irkit {irkit.__version__}, torch {torch.__version__}"
        )
    else:
        print(f"   {ONNXSLIM_HINT}")
    warm = ir.serde.serialize_model(_stock_export(zoo.export("stack4"))).SerializeToString()
    _irkit_command(warm)  # imports and registries outside the measurement
    if slim:
        _onnxslim(warm)
    header = f"{'model':<8} {'nodes':>6} | {'irkit s':>8} {'nodes':>6} {'max diff':>9}"
    if slim:
        header += (
            f" | {'slim s':>8} {'nodes':>6} {'max diff':>9} | {'slim/irkit':>10} {'Δnodes':>6}"
        )
    print(header)
    print("-" * len(header))
    totals = {"irkit": 0.0, "slim": 0.0}
    for name in names:
        zm = zoo.load(name)
        try:
            stock = _stock_export(zoo.export(name))
        except Exception as exc:  # the stock exporter's failure is a result, not a crash
            print(f"{name:<8} the stock exporter fails: {type(exc).__name__}", flush=True)
            continue
        data = ir.serde.serialize_model(stock).SerializeToString()
        inputs = [*zm.args, *zm.kwargs.values()]
        reference = helpers.run_ort(stock, inputs)
        t_irkit, out_irkit = _best_bytes(_irkit_command, data, repeat)
        n_irkit = _nodes(out_irkit)
        totals["irkit"] += t_irkit
        row = (
            f"{name:<8} {count_nodes(stock):>6} | {t_irkit:>8.3f} {n_irkit:>6} "
            f"{_max_diff(out_irkit, inputs, reference):>9.1e}"
        )
        if slim:
            t_slim, out_slim = _best_bytes(_onnxslim, data, repeat)
            n_slim = _nodes(out_slim)
            totals["slim"] += t_slim
            row += (
                f" | {t_slim:>8.3f} {n_slim:>6} {_max_diff(out_slim, inputs, reference):>9.1e}"
                f" | {t_slim / t_irkit:>9.1f}× {n_irkit - n_slim:>+6d}"
            )
        print(row, flush=True)
    if slim:
        print(f"total: irkit {totals['irkit']:.2f} s, onnxslim {totals['slim']:.2f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few small models, one repeat")
    parser.add_argument("--repeat", type=int, default=3, help="repeats per optimizer (best of)")
    parser.add_argument(
        "--against",
        choices=["all", "onnxscript", "onnxslim"],
        default="all",
        help="which comparison to run (default: both tables)",
    )
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    repeat = 1 if args.quick else args.repeat
    if args.against in ("all", "onnxscript"):
        against_onnxscript(args.quick, repeat)
        print()
    if args.against in ("all", "onnxslim"):
        against_onnxslim(args.quick, repeat)


if __name__ == "__main__":
    main()
