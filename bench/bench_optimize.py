"""Benchmark: irkit.optimize vs onnxscript's optimizer + rewriter on the same models.

Anchor: ``onnxscript.optimizer.optimize(model)`` followed by ``onnxscript.rewriter.rewrite(model)``
(its default rules), measured in the same run on a fresh copy of the same model. Models come from
two front ends: the anchor exporter (``torch.onnx.export(ep, dynamo=True, optimize=False).model``)
and ``irkit.lower`` (flat, and with its default module functions) — pre-LN stacks of 4/16/64 layers (``tests.zoo`` ``stackN``), GPT-2, Llama.

Prints per model: nodes before, time and nodes after for each, the time ratio anchor/irkit
(higher is better for irkit), then the scaling slope of each optimizer (log-log fit of time vs
node count over the stacks; 1.0 = linear).

Usage:  python bench/bench_optimize.py [--quick] [--repeat N]
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

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

import onnx_ir as ir  # noqa: E402
import torch  # noqa: E402

import irkit  # noqa: E402
from irkit.rewriting import count_nodes  # noqa: E402
from tests import zoo  # noqa: E402


def _program(name: str):
    if name.startswith("stack"):
        zm = zoo.prenorm_stack(int(name[5:]))
        return torch.export.export(zm.module, zm.args)
    return zoo.export(name)


def _anchor_export(ep) -> ir.Model:
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.onnx.export(ep, dynamo=True, optimize=False, verbose=False).model


def _copy(model: ir.Model) -> ir.Model:
    return ir.serde.deserialize_model(ir.serde.serialize_model(model))


def _run_irkit(model: ir.Model) -> None:
    irkit.optimize(model)


def _run_anchor(model: ir.Model) -> None:
    import onnxscript.optimizer
    import onnxscript.rewriter

    onnxscript.optimizer.optimize(model)
    onnxscript.rewriter.rewrite(model)


def _best(fn, model: ir.Model, repeat: int) -> tuple[float, int]:
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="stacks 4/16 only, one repeat")
    parser.add_argument("--repeat", type=int, default=3, help="repeats per optimizer (best of)")
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    repeat = 1 if args.quick else args.repeat
    names = (
        ["stack4", "stack16"] if args.quick else ["stack4", "stack16", "stack64", "gpt2", "llama"]
    )
    fronts = {
        "anchor-export": _anchor_export,
        "irkit flat": functools.partial(irkit.lower, functions=False),
        # The default: shared function bodies are optimized once (the anchor inlines them).
        "irkit hier": irkit.lower,
    }

    # Warm up imports and registries outside the measurement.
    warm = _anchor_export(_program("stack4"))
    _best(_run_irkit, warm, 1)
    _best(_run_anchor, warm, 1)

    header = (
        f"{'front end':<14} {'model':<8} {'nodes':>6} | {'irkit s':>8} {'nodes':>6} | "
        f"{'anchor s':>8} {'nodes':>6} | {'anchor/irkit':>12}"
    )
    print(header)
    print("-" * len(header))
    scaling: dict[str, dict[str, list[tuple[int, float]]]] = {
        f: {"irkit": [], "anchor": []} for f in fronts
    }
    for name in names:
        ep = _program(name)
        flat_nodes = count_nodes(irkit.lower(ep, functions=False))
        for front, make in fronts.items():
            model = make(ep)
            n0 = count_nodes(model)
            t_irkit, n_irkit = _best(_run_irkit, model, repeat)
            t_anchor, n_anchor = _best(_run_anchor, model, repeat)
            print(
                f"{front:<14} {name:<8} {n0:>6} | {t_irkit:>8.3f} {n_irkit:>6} | "
                f"{t_anchor:>8.3f} {n_anchor:>6} | {t_anchor / t_irkit:>11.1f}×",
                flush=True,
            )
            if name.startswith("stack"):
                # Slopes are over the flat size, so stored-vs-inlined sizes do not skew them.
                scaling[front]["irkit"].append((flat_nodes, t_irkit))
                scaling[front]["anchor"].append((flat_nodes, t_anchor))
    print()
    for front, series in scaling.items():
        if len(series["irkit"]) >= 2:
            print(
                f"scaling slope over stacks ({front}): irkit {_slope(series['irkit']):.2f}, "
                f"anchor {_slope(series['anchor']):.2f}  (log-log fit of time vs flat nodes)"
            )


if __name__ == "__main__":
    main()
