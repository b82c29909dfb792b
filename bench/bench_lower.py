"""Benchmark: irkit.lower (+save) vs the anchor exporter on the same ExportedProgram.

irkit is timed as a user calls it: ``irkit.lower(ep)`` with its default module functions
(outlining and dedupe included) and ``irkit.save``; the ONNX column is the flat node count.

The anchor is ``torch.onnx.export(ep, dynamo=True, optimize=False)`` (+ its save), measured in
the same run, on the same machine, on the same program. Both are warmed up first (registry
construction and imports are not counted). Prints one row per model and the ratio
anchor/irkit (higher is better for irkit), then the scaling of irkit's time with depth.

Usage:  python bench/bench_lower.py [--quick] [--repeat N] [--control-flow]

``--control-flow`` times the control-flow models of ``tests/lowering/test_control_flow.py``
(cond/while_loop/scan/map, nested, a strict-export ``nested_compile_region`` stack) instead.
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
import tempfile
import time
import warnings

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

import irkit  # noqa: E402
from tests import zoo  # noqa: E402


def _best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def _irkit(ep, out: pathlib.Path) -> None:
    irkit.save(irkit.lower(ep), out)


def _anchor(ep, out: pathlib.Path) -> None:
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(ep, dynamo=True, optimize=False, verbose=False)
        program.save(str(out))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="stacks only, one repeat")
    parser.add_argument("--repeat", type=int, default=3, help="irkit repeats (best of)")
    parser.add_argument("--control-flow", action="store_true", help="control-flow models")
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    if args.control_flow:
        _bench_control_flow(args.repeat)
        return
    repeat = 1 if args.quick else args.repeat
    names = (
        [] if args.quick else ["mlp", "cnn", "gpt2", "bert", "llama", "t5", "vit", "whisper"]
    ) + ["stack4", "stack16", "stack64"]
    tmp = pathlib.Path(tempfile.mkdtemp())
    warm = zoo.export("mlp")
    _irkit(warm, tmp / "warm_i.onnx")
    _anchor(warm, tmp / "warm_a.onnx")

    print(
        f"{'model':10} {'FX nodes':>8} {'ONNX':>6} {'irkit s':>9} {'anchor s':>9} {'ratio':>7} {'irkit nodes/s':>14}"
    )
    stack_points = []
    for name in names:
        ep = zoo.export(name)
        fx_nodes = len(ep.graph.nodes)
        onnx_nodes = len(irkit.lower(ep, functions=False).graph)  # flat ONNX size
        t_irkit = _best(functools.partial(_irkit, ep, tmp / f"{name}_i.onnx"), repeat)
        try:
            t_anchor = _best(functools.partial(_anchor, ep, tmp / f"{name}_a.onnx"), 1)
        except Exception as exc:  # the anchor cannot export some models at all
            print(
                f"{name:10} {fx_nodes:8d} {onnx_nodes:6d} {t_irkit:9.3f} {'fails':>9} "
                f"{'-':>7} {fx_nodes / t_irkit:14.0f}   anchor: {type(exc).__name__}"
            )
            continue
        print(
            f"{name:10} {fx_nodes:8d} {onnx_nodes:6d} {t_irkit:9.3f} {t_anchor:9.3f} "
            f"{t_anchor / t_irkit:6.1f}x {fx_nodes / t_irkit:14.0f}"
        )
        if name.startswith("stack"):
            stack_points.append((fx_nodes, t_irkit, t_anchor))

    (n0, i0, a0), (n1, i1, a1) = stack_points[0], stack_points[-1]
    slope_i = math.log(i1 / i0) / math.log(n1 / n0)
    slope_a = math.log(a1 / a0) / math.log(n1 / n0)
    print()
    print(
        "irkit time per FX node (µs) at 4/16/64 layers:",
        " / ".join(f"{1e6 * t / n:.0f}" for n, t, _ in stack_points),
    )
    print(
        f"scaling slope (log time / log nodes), stack4→stack64: irkit {slope_i:.2f}, anchor {slope_a:.2f}"
    )
    print(f"speed-up at 64 layers: {a1 / i1:.1f}x (target ≥ 5x)")


def _bench_control_flow(repeat: int) -> None:
    """irkit vs the anchor on If/Loop/Scan models and an invoke_subgraph stack, one run."""
    from tests.lowering import test_control_flow as cf

    x, xs = torch.randn(2, 3), torch.randn(8, 3)
    cases = {
        "cond": lambda: torch.export.export(cf.Cond(), (x, x)),
        "while_loop": lambda: torch.export.export(cf.While(), (x, torch.tensor(5))),
        "scan": lambda: torch.export.export(cf.CumulativeScan(), (x[0], xs)),
        "map": lambda: torch.export.export(cf.Map(), (xs, x[0])),
        "nested": lambda: torch.export.export(cf.NestedScan(), (x[0], xs)),
        "subgraph3": lambda: torch.export.export(cf.Stack(), (torch.randn(2, 4),), strict=True),
    }
    tmp = pathlib.Path(tempfile.mkdtemp())
    warm = cases["cond"]()
    _irkit(warm, tmp / "warm_i.onnx")
    _anchor(warm, tmp / "warm_a.onnx")
    print(f"{'model':12} {'irkit s':>9} {'anchor s':>9} {'ratio':>7}  functions (irkit / anchor)")
    for name, make in cases.items():
        ep = make()
        t_irkit = _best(functools.partial(_irkit, ep, tmp / f"{name}_i.onnx"), repeat)
        try:
            t_anchor = _best(functools.partial(_anchor, ep, tmp / f"{name}_a.onnx"), repeat)
        except Exception as exc:
            print(f"{name:12} {t_irkit:9.3f} {'fails':>9} {'-':>7}  anchor: {type(exc).__name__}")
            continue
        counts = [len(irkit.load(tmp / f"{name}_{k}.onnx").functions) for k in ("i", "a")]
        print(
            f"{name:12} {t_irkit:9.3f} {t_anchor:9.3f} {t_anchor / t_irkit:6.1f}x  "
            f"{counts[0]} / {counts[1]}"
        )


if __name__ == "__main__":
    main()
