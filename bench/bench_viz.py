"""Viz timings: the hierarchical 64-layer stack, a 64-layer flat graph per layout engine, and
a 20,000-node flat graph end to end (write the HTML page, first paint in Chromium).

Run: ``python bench/bench_viz.py [--layers 64] [--repeat 5] [--no-browser] [--no-dot]``.
Prints seconds and ratios against the anchor ``onnx.load`` of the stack file, measured in the
same run. Graphviz rows (the optional ``--layout dot``) are printed only where ``dot`` is on
PATH; Chromium rows only where Chromium is installed.

``--dump-graphs DIR`` also writes the drawable bodies (64-layer flat graph, the outlined
Llama's decoder layer and attention) as JSON for ``tools/viz_assets/compare_engines.mjs``,
which times the in-page layout candidates (dagre, elkjs, @viz-js/viz) on them.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import onnx  # noqa: E402

import irkit  # noqa: E402
from irkit import viz  # noqa: E402
from irkit.viz import _dot, _graph, _html, _svg, cli  # noqa: E402
from tests.viz import models  # noqa: E402


def median_of(fn, repeat: int) -> float:
    """The median wall time of ``repeat`` calls of ``fn``, in seconds."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def cli_seconds(*args: str, timeout: float = 300) -> float | None:
    """Wall time of one ``tools/viz.py`` process; ``None`` if it ran out of time. Its CPU time
    (user + system) is printed too: on a shared machine the wall time also counts waiting."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    try:
        subprocess.run(
            [sys.executable, str(ROOT / "tools" / "viz.py"), *args],
            check=True,
            env=env,
            stdout=subprocess.DEVNULL,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return None
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    print(f"    (CPU time of the process: {cpu:.2f} s)")
    return wall


def first_paint(html: pathlib.Path) -> tuple[float, float, int]:
    """Open ``html`` in headless Chromium: (seconds from launch until the page has run, the
    page's own time to its first drawn graph in s, nodes drawn)."""
    from tests.viz.cdp import Browser

    start = time.perf_counter()
    with Browser(html.as_uri(), timeout=120) as b:
        loaded = time.perf_counter() - start
        shown = b.evaluate("window.irkitViz.firstPaintMs") / 1000
        count = b.evaluate("document.querySelectorAll('#canvas g.node').length")
    return loaded, shown, count


def _dump_graphs(out: pathlib.Path, flat_summary) -> None:
    from tests import zoo

    out.mkdir(parents=True, exist_ok=True)
    bodies = {"flat64": (flat_summary, flat_summary.root.body)}
    llama = viz.summarize(irkit.lower(zoo.export("llama")))
    bodies["llama_layer"] = (llama, llama.find_body("layers.1"))
    bodies["llama_attn"] = (llama, llama.find_body("layers.1.self_attn"))
    for name, (summary, body) in bodies.items():
        data = _graph.body_graph(summary, body).to_json()
        (out / f"{name}.json").write_text(json.dumps(data))
        start = time.perf_counter()
        svg = _svg.layout_graph_svg(_graph.body_graph(summary, body))
        seconds = time.perf_counter() - start
        (out / f"{name}.igraph.svg").write_text(svg)
        print(f"  dumped {name}: {len(data['nodes'])} nodes; igraph SVG {seconds * 1000:.0f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--layers", type=int, default=64)
    parser.add_argument("--extra-ops", type=int, default=40)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--no-browser", action="store_true", help="skip the Chromium rows")
    parser.add_argument("--no-dot", action="store_true", help="skip the Graphviz rows")
    parser.add_argument("--dump-graphs", metavar="DIR", help="write drawable bodies as JSON")
    args = parser.parse_args()
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="bench_viz_"))
    has_dot = shutil.which("dot") is not None and not args.no_dot
    from tests.viz.cdp import find_chromium

    has_browser = find_chromium() is not None and not args.no_browser

    path = irkit.save(models.stack(args.layers, d=64, extra_ops=args.extra_ops), tmp / "s.onnx")
    flat_path = irkit.save(models.torch_exporter_flat(args.layers, 50), tmp / "flat.onnx")
    big_path = irkit.save(models.torch_exporter_flat(200, 100), tmp / "flat20k.onnx")
    anchor = median_of(lambda: onnx.load(str(path)), args.repeat)
    summary = viz.summarize(cli.load_model(str(path)))
    flat = viz.summarize(cli.load_model(str(flat_path)))
    print(
        f"stack: {args.layers} layers, {summary.root.body.node_count} nodes executed, "
        f"{sum(b.stored_nodes for b in summary.bodies.values())} stored; flat: "
        f"{flat.root.body.node_count} nodes; 20k: {big_path.stat().st_size / 2**20:.1f} MiB"
    )
    rows: list[tuple[str, float | None]] = [("onnx.load of the stack (anchor)", anchor)]

    def add(name: str, seconds: float | None) -> None:
        rows.append((name, seconds))
        shown = "did not finish" if seconds is None else f"{seconds * 1000:9.1f} ms"
        ratio = "" if seconds is None else f"{seconds / anchor:9.1f}× anchor"
        print(f"  {name:<58} {shown:>12} {ratio}", flush=True)

    print(f"  {rows[0][0]:<58} {anchor * 1000:9.1f} ms {1:9.1f}× anchor")
    load = lambda p: viz.summarize(cli.load_model(str(p)))  # noqa: E731
    add("stack: load + summarize + text dump", median_of(lambda: viz.render_text(load(path)), 3))
    add(
        "stack: load + summarize + HTML page (builtin)",
        median_of(lambda: viz.render_html(load(path)), 3),
    )
    if has_dot:
        html_dot = lambda: _html.render_html(load(path), layout="dot")  # noqa: E731
        add("stack: load + summarize + HTML page (--layout dot)", median_of(html_dot, 1))

    print(
        f"-- {flat.root.body.node_count}-node flat graph ({args.layers} layers), whole graph in one picture"
    )
    graph = _graph.body_graph(flat, flat.root.body)
    add(
        "flat: SVG, builtin layout (igraph Sugiyama + drawing)",
        median_of(lambda: _svg.layout_graph_svg(graph), 3),
    )
    if has_dot:
        dot = _dot.body_dot(flat, flat.root.body).source
        add("flat: SVG, --layout dot (Graphviz)", median_of(lambda: _dot.layout_svg([dot]), 1))
    add(
        "flat: HTML page data (builtin: regions, laid out in the page)",
        median_of(lambda: _html.render_html(flat), 3),
    )
    if has_dot:
        add(
            "flat: HTML page (--layout dot: whole graph by Graphviz)",
            median_of(lambda: _html.render_html(flat, layout="dot"), 1),
        )

    print("-- 20,000-node flat graph, end to end (whole CLI process)")
    big_html = tmp / "flat20k.html"
    add("20k: CLI text dump", cli_seconds(str(big_path)))
    add("20k: CLI HTML page (builtin)", cli_seconds(str(big_path), "-o", str(big_html)))
    if has_browser:
        loaded, shown, count = first_paint(big_html)
        add(f"20k: Chromium launch → page ready ({count} boxes drawn)", loaded)
        add("20k: in the page: navigation → top level drawn", shown)
    if has_dot:
        dot_html = tmp / "flat20k_dot.html"
        add(
            "20k: CLI HTML page (--layout dot), 300 s limit",
            cli_seconds(str(big_path), "-o", str(dot_html), "--layout", "dot"),
        )
        if has_browser and dot_html.exists():
            loaded, shown, count = first_paint(dot_html)
            add(f"20k (--layout dot): Chromium launch → page ready ({count} nodes)", loaded)
    if args.dump_graphs:
        _dump_graphs(pathlib.Path(args.dump_graphs), flat)


if __name__ == "__main__":
    main()
