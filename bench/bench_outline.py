"""Outlining + dedupe cost and graph-size gain on pre-LN stacks of 4/16/64 layers.

Prints, per stack: node count, lowering time (the anchor: ``irkit.lower(ep, functions=False)`` of
the same ExportedProgram, measured in the same run), outline time (``irkit.outline`` on the
freshly lowered model) as a fraction of it, both per node (flat ⇒ linear growth), and the
serialized model size without weights, flat vs outlined. Times are medians over the repeats.

Two protocols, both printed:

* ``outline/lower``: a full garbage collection, then lowering, then outlining right away — the
  sequence ``irkit.lower(ep)`` runs (outlining pays for any collection lowering's garbage
  triggers).
* ``cold``: another lowering, then a full garbage collection, then outlining. The collection
  leaves the caches cold and the allocator's arenas released, which costs the first few
  hundred microseconds of whatever runs next; no ``irkit.lower`` call sees that, but it bounds
  the figure from above.

    python bench/bench_outline.py [--layers 4 16 64] [--repeat 5] [--quick]
"""

from __future__ import annotations

import argparse
import gc
import pathlib
import statistics
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

import onnx_ir as ir

import irkit
from tests import zoo


def _graph_bytes(model: ir.Model) -> int:
    """Serialized size with every initializer's payload dropped (structure only)."""
    proto = ir.serde.serialize_model(model)
    for init in proto.graph.initializer:
        init.ClearField("raw_data")
        init.ClearField("float_data")
    return proto.ByteSize()


def bench(n_layers: int, repeat: int) -> dict[str, float]:
    ep = zoo.export(f"stack{n_layers}")
    irkit.outline(irkit.lower(ep, functions=False))  # warm-up (imports: torchlib, networkx)
    lower_t, outline_t, cold_t = [], [], []
    for _ in range(repeat):
        gc.collect()
        t0 = time.perf_counter()
        model = irkit.lower(ep, functions=False)  # the anchor: lowering alone
        t1 = time.perf_counter()
        irkit.outline(model)  # as irkit.lower(ep) does it: right after lowering
        t2 = time.perf_counter()
        lower_t.append(t1 - t0)
        outline_t.append(t2 - t1)
        model = irkit.lower(ep, functions=False)
        gc.collect()
        t3 = time.perf_counter()
        irkit.outline(model)  # cold: after a full collection
        cold_t.append(time.perf_counter() - t3)
    flat = irkit.lower(ep, functions=False)
    flat_nodes, flat_bytes = len(list(flat.graph)), _graph_bytes(flat)
    lower_s, outline_s = statistics.median(lower_t), statistics.median(outline_t)
    return {
        "layers": n_layers,
        "nodes": flat_nodes,
        "lower_s": lower_s,
        "outline_s": outline_s,
        "ratio": outline_s / lower_s,
        "cold_ratio": statistics.median(cold_t) / lower_s,
        "lower_us_per_node": 1e6 * lower_s / flat_nodes,
        "us_per_node": 1e6 * outline_s / flat_nodes,
        "flat_kb": flat_bytes / 1024,
        "outlined_kb": _graph_bytes(model) / 1024,
        "functions": len(model.functions),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[4, 16, 64])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="4 and 16 layers, 2 repeats")
    args = parser.parse_args()
    layers, repeat = ([4, 16], 2) if args.quick else (args.layers, args.repeat)
    header = (
        f"{'layers':>6} {'nodes':>6} {'lower s':>8} {'us/node':>8} {'outline s':>9} "
        f"{'outline/lower':>13} {'us/node':>8} {'cold':>6} {'flat KB':>8} {'outl. KB':>8} "
        f"{'shrink':>7} {'fns':>4}"
    )
    print(header)
    for n in layers:
        r = bench(n, repeat)
        print(
            f"{r['layers']:>6} {r['nodes']:>6} {r['lower_s']:>8.3f} {r['lower_us_per_node']:>8.1f} "
            f"{r['outline_s']:>9.3f} {r['ratio']:>12.1%} {r['us_per_node']:>8.1f} "
            f"{r['cold_ratio']:>6.1%} {r['flat_kb']:>8.1f} "
            f"{r['outlined_kb']:>8.1f} {r['flat_kb'] / r['outlined_kb']:>6.1f}x {r['functions']:>4}"
        )


if __name__ == "__main__":
    main()
