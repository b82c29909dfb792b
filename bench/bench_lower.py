"""Benchmark: irkit.lower (+save) vs the anchor exporter on the same ExportedProgram.

irkit is timed as a user calls it: ``irkit.lower(ep)`` with its default module functions
(outlining and dedupe included) and ``irkit.save``; the ONNX column is the flat node count.

The anchor is ``torch.onnx.export(ep, dynamo=True, optimize=False)`` (+ its save), measured in
the same run, on the same machine, on the same program. Both are warmed up first (registry
construction and imports are not counted). Prints one row per model and the ratio
anchor/irkit (higher is better for irkit), then the scaling of irkit's time with depth.

``--control-flow`` times the control-flow models of ``tests/lowering/test_control_flow.py``
(cond/while_loop/scan/map, nested, a strict-export ``nested_compile_region`` stack) instead.

With ``--zoo arch`` it runs the architecture zoo (tests/arch_zoo.py: transformers models exported
as users export them) instead: per model, irkit and the stock exporter on the same program, the
time of each and the ratio, then each result checked in onnxruntime at two sizes against eager
PyTorch; a failure shows where it happened (lower/export, onnxruntime load, numbers) and the
first line of the error, so coverage and speed are reported side by side.

``--zoo wide`` runs the wide zoo (tests/arch_zoo_wide.py: 60+ more architectures nobody tuned
irkit for) the same way; a model torch.export cannot export with its dynamic dims is exported
static (the reason is printed) and checked at the export size only.

Usage:  python bench/bench_lower.py [--quick] [--repeat N] [--control-flow]
        python bench/bench_lower.py --zoo arch|wide [--models a,b] [--no-grad] [--markdown]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import logging
import math
import pathlib
import re
import sys
import tempfile
import time
import warnings

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

import torch

import irkit
from tests import zoo


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
    parser.add_argument(
        "--zoo", choices=["stack", "arch", "wide"], default="stack", help="which zoo"
    )
    parser.add_argument("--models", default="", help="--zoo arch: comma-separated subset")
    parser.add_argument("--no-grad", action="store_true", help="--zoo arch: export in no_grad")
    parser.add_argument("--markdown", action="store_true", help="--zoo arch: a markdown table")
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    if args.control_flow:
        _bench_control_flow(args.repeat)
        return
    if args.zoo in ("arch", "wide"):
        _arch_zoo(args)
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


# --- the architecture zoo: coverage and speed side by side ---------------------------------------


def _first_line(exc: BaseException) -> str:
    """``Class: first line`` of an error; irkit errors say which FX node / op failed."""
    from irkit.errors import LoweringError, UnsupportedOpError

    if isinstance(exc, UnsupportedOpError):
        text = "; ".join(f"{name} (node {node!r})" for name, _, node, _ in exc.ops)
    elif isinstance(exc, LoweringError):
        cause = exc.__cause__
        why = f"{type(cause).__name__}: {str(cause).splitlines()[0]}" if cause else str(exc)
        text = f"node {exc.fx_node!r} ({exc.target}): {why}"
    else:
        root = exc  # the stock exporter wraps the real error: report the innermost cause
        while root.__cause__ is not None:
            root = root.__cause__
        lines = [line for line in str(root).splitlines() if line.strip()]
        text = re.sub(r"\x1b\[[0-9;]*m", "", lines[0] if lines else "")
        if root is not exc:
            text = f"{type(root).__name__}: {text}"
    return f"{type(exc).__name__}: {text}"[:240]


def _check(path: pathlib.Path, name: str, zoo_mod=None, sizes=None) -> str:
    """``"ok"`` or where the file fails: onnxruntime load, run, or numbers (both sizes).

    ``zoo_mod`` is the zoo module (default tests.arch_zoo), ``sizes`` the input sets to check
    (default both of the entry's sizes).
    """
    import numpy as np

    from tests import arch_zoo, helpers

    zoo_mod = zoo_mod or arch_zoo
    zm = zoo_mod.load(name)
    try:
        session = helpers.ort_session(path)
    except Exception as exc:
        return "ort-load " + re.sub(r"Load model from \S+ failed:", "", _first_line(exc))
    names = [i.name for i in session.get_inputs()]
    for size, inputs in enumerate(sizes or zm.sizes()):
        feeds = zm.feeds(inputs)
        if len(feeds) != len(names):
            return f"inputs: model takes {names}, program has {len(feeds)} tensors"
        try:
            got = session.run(None, {n: t.numpy() for n, t in zip(names, feeds, strict=True)})
        except Exception as exc:
            return f"ort-run size {size} " + _first_line(exc)
        want = zoo_mod.expected_outputs(name, size)
        if len(got) != len(want):
            return f"outputs: {len(got)} vs {len(want)} expected"
        for a, e in zip(got, want, strict=True):
            if a.shape != e.shape:
                return f"numbers size {size}: shape {a.shape} vs {e.shape}"
            diff = float(np.max(np.abs(a.astype(np.float64) - e))) if a.size else 0.0
            if not diff <= helpers.FP32_ATOL:
                return f"numbers size {size}: max abs diff {diff:.3g}"
    return "ok"


def _input_shapes(ep) -> list[str]:
    """The placeholders' shapes as text (symbolic dims print as their current value)."""
    return [
        str(getattr(n.meta.get("val"), "shape", None))
        for n in ep.graph.nodes
        if n.op == "placeholder"
    ]


def _irkit_variant(ep, zm, variant: str, out: pathlib.Path) -> None:
    model = irkit.lower(
        ep,
        functions=variant != "flat",
        input_names=zm.input_names,
        output_names=zm.output_names,
        **zm.lower_options,
    )
    if variant == "optimized":
        irkit.optimize(model)
    irkit.save(model, out)


def _arch_zoo(args: argparse.Namespace) -> None:
    """Per model: irkit vs the stock exporter (time, ratio), then both checked in onnxruntime."""
    from tests import arch_zoo, arch_zoo_wide

    wide = args.zoo == "wide"
    zoo_mod = arch_zoo_wide if wide else arch_zoo
    names = args.models.split(",") if args.models else list(zoo_mod.ARCH_ZOO)
    repeat = 1 if args.quick else args.repeat
    tmp = pathlib.Path(tempfile.mkdtemp())
    warm = zoo.export("mlp")
    _irkit(warm, tmp / "warm_i.onnx")
    _anchor(warm, tmp / "warm_a.onnx")
    grad = "under torch.no_grad()" if args.no_grad else "without torch.no_grad() (as users do)"
    print(
        f"architecture zoo, exported {grad}; times: lower+save, best of {repeat} (irkit), 1 (stock)"
    )
    print(f"{'model':13} {'FX':>5} {'irkit s':>8} {'stock s':>8} {'ratio':>7}  irkit | stock")
    rows = []
    for name in names:
        try:
            zm = zoo_mod.load(name)
            if wide:
                ep, static = arch_zoo_wide.export_info(name, no_grad=args.no_grad)
                sizes = arch_zoo_wide.sizes(name, no_grad=args.no_grad)
            else:
                ep, static, sizes = arch_zoo.export(name, no_grad=args.no_grad), "", None
        except Exception as exc:
            print(f"{name:13} torch.export fails: {_first_line(exc)}", flush=True)
            why = "torch.export " + _first_line(exc)
            rows.append(
                (
                    name,
                    dict.fromkeys(("functions", "flat", "optimized", "stock"), why)
                    | {"static": ""},
                    None,
                    None,
                )
            )
            continue
        if static:
            print(f"{name:13} dynamic export fails, exported static: {static}", flush=True)
        check = functools.partial(_check, zoo_mod=zoo_mod, sizes=sizes)
        status = {}
        t_irkit = t_stock = None
        before = _input_shapes(ep)
        try:
            t_irkit = _best(
                functools.partial(_irkit_variant, ep, zm, "functions", tmp / f"{name}_i.onnx"),
                repeat,
            )
            status["functions"] = check(tmp / f"{name}_i.onnx", name)
        except Exception as exc:
            status["functions"] = "lower " + _first_line(exc)
        for variant in ("flat", "optimized"):
            path = tmp / f"{name}_{variant}.onnx"
            try:
                _irkit_variant(ep, zm, variant, path)
                status[variant] = check(path, name)
            except Exception as exc:
                status[variant] = "lower " + _first_line(exc)
        if _input_shapes(ep) != before:
            for key in ("functions", "flat", "optimized"):
                status[key] = (
                    "irkit.lower changed the ExportedProgram's input shapes; " + status[key]
                )
            # The stock exporter gets an intact program: a fresh export.
            if wide:
                ep = arch_zoo_wide.export_info.__wrapped__(name, no_grad=args.no_grad)[0]
            else:
                ep = arch_zoo.export.__wrapped__(name, no_grad=args.no_grad)
        try:
            t_stock = _best(functools.partial(_anchor, ep, tmp / f"{name}_a.onnx"), 1)
            status["stock"] = check(tmp / f"{name}_a.onnx", name)
        except Exception as exc:
            status["stock"] = "export " + _first_line(exc)
        ratio = f"{t_stock / t_irkit:6.1f}x" if t_irkit and t_stock else f"{'-':>7}"
        fmt = lambda t: f"{t:8.3f}" if t is not None else f"{'fails':>8}"  # noqa: E731
        mark = lambda s: "ok" if s == "ok" else "FAIL"  # noqa: E731
        print(
            f"{name:13} {len(ep.graph.nodes):5d} {fmt(t_irkit)} {fmt(t_stock)} {ratio}  "
            f"{mark(status['functions'])} | {mark(status['stock'])}",
            flush=True,
        )
        for key in ("functions", "flat", "optimized", "stock"):
            if status[key] != "ok":
                print(f"{'':15}{key}: {status[key]}", flush=True)
        status["static"] = static
        rows.append((name, status, t_irkit, t_stock))
    _arch_summary(rows, args.markdown, wide)


def _arch_summary(rows: list, markdown: bool, wide: bool = False) -> None:
    variants = ("functions", "flat", "optimized")
    n = len(rows)
    print()
    for key in (*variants, "stock"):
        ok = sum(status[key] == "ok" for _, status, _, _ in rows)
        print(f"{'irkit ' + key if key != 'stock' else 'stock exporter':22} passes {ok:2d} of {n}")
    behind = [name for name, st, _, _ in rows if st["stock"] == "ok" and st["functions"] != "ok"]
    ahead = [name for name, st, _, _ in rows if st["stock"] != "ok" and st["functions"] == "ok"]
    print(
        f"irkit fails where the stock exporter passes ({len(behind)}): {', '.join(behind) or '-'}"
    )
    print(f"irkit passes where the stock exporter fails ({len(ahead)}): {', '.join(ahead) or '-'}")
    both = [
        (ti, ts) for _, st, ti, ts in rows if ti and ts and st["functions"] == st["stock"] == "ok"
    ]
    if both:
        ratios = sorted(ts / ti for ti, ts in both)
        geo = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
        print(
            f"speed-up where both pass ({len(both)} models): geometric mean {geo:.1f}x, "
            f"min {ratios[0]:.1f}x, max {ratios[-1]:.1f}x"
        )
    if markdown and wide:
        print()
        print(
            "| model | shapes | irkit functions | irkit flat | irkit optimized | stock "
            "| irkit s | stock s | stock/irkit |"
        )
        print("|---|---|---|---|---|---|---|---|---|")
        for name, st, ti, ts in rows:
            cells = [("ok" if st[k] == "ok" else "fail") for k in (*variants, "stock")]
            times = [f"{t:.2f}" if t is not None else "-" for t in (ti, ts)]
            ratio = f"{ts / ti:.1f}x" if ti and ts else "-"
            shapes = "static" if st["static"] else "dynamic"
            if st["stock"].startswith("torch.export"):
                shapes = "export fails"
            print(f"| {name} | {shapes} | " + " | ".join([*cells, *times, ratio]) + " |")
    elif markdown:
        print()
        print(
            "| model | irkit functions | irkit flat | irkit optimized | stock | irkit s | stock s |"
        )
        print("|---|---|---|---|---|---|---|")
        for name, st, ti, ts in rows:
            cells = [("ok" if st[k] == "ok" else "fail") for k in (*variants, "stock")]
            times = [f"{t:.2f}" if t is not None else "-" for t in (ti, ts)]
            print(f"| {name} | " + " | ".join(cells + times) + " |")


if __name__ == "__main__":
    main()
