"""Viz timings on a 64-layer hierarchical stack (and its inlined, flat form).

Run: ``python bench/bench_viz.py [--layers 64] [--extra-ops 40]``. Prints seconds and ratios
against the anchor ``onnx.load`` of the same file, measured in the same run. Targets: the text
dump well under a second, the HTML page in a few seconds.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import onnx  # noqa: E402
from onnx_ir.passes.common import InlinePass  # noqa: E402

import irkit  # noqa: E402
from irkit import viz  # noqa: E402
from irkit.viz import cli  # noqa: E402
from tests.viz import models  # noqa: E402


def median_of(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def cli_seconds(*args: str) -> float:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, str(ROOT / "tools" / "viz.py"), *args],
        check=True,
        env=env,
        stdout=subprocess.DEVNULL,
    )
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--layers", type=int, default=64)
    parser.add_argument("--extra-ops", type=int, default=40)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="bench_viz_"))
    model = models.stack(args.layers, d=64, extra_ops=args.extra_ops)
    path = irkit.save(model, tmp / "stack.onnx")
    flat = models.stack(args.layers, d=64, extra_ops=args.extra_ops)
    InlinePass()(flat)
    flat_path = irkit.save(flat, tmp / "flat.onnx")

    anchor = median_of(lambda: onnx.load(str(path)), args.repeat)
    load = median_of(lambda: cli.load_model(str(path)), args.repeat)
    summary = viz.summarize(cli.load_model(str(path)))
    text = median_of(lambda: viz.render_text(viz.summarize(cli.load_model(str(path)))), args.repeat)
    html = median_of(lambda: viz.render_html(viz.summarize(cli.load_model(str(path)))), 2)
    flat_html = median_of(lambda: viz.render_html(viz.summarize(cli.load_model(str(flat_path)))), 1)
    cli_text = median_of(lambda: cli_seconds(str(path)), 3)
    cli_html = median_of(lambda: cli_seconds(str(path), "-o", str(tmp / "s.html")), 1)

    print(
        f"model: {args.layers} layers, {summary.root.body.node_count} nodes executed, "
        f"{sum(b.stored_nodes for b in summary.bodies.values())} stored, "
        f"{path.stat().st_size / 2**20:.1f} MiB"
    )
    rows = [
        ("onnx.load (anchor)", anchor),
        ("viz load (irkit.load, no external data)", load),
        ("load + summarize + text dump", text),
        ("load + summarize + HTML page", html),
        ("flat (inlined) model: HTML page", flat_html),
        ("CLI text dump, whole process", cli_text),
        ("CLI HTML page, whole process", cli_html),
    ]
    for name, seconds in rows:
        print(f"  {name:<42} {seconds * 1000:9.1f} ms   {seconds / anchor:7.1f}× anchor")


if __name__ == "__main__":
    main()
