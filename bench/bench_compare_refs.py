"""Benchmark: the same lower / optimize / save work timed on two checkouts of irkit, interleaved.

Answers "did this branch slow irkit down?" on a busy machine: each run starts one fresh process
per checkout (``PYTHONPATH=<checkout>``, so each imports its own ``irkit`` and ``tests.zoo``),
alternating which goes first (ABBA), and each process exports the same models, warms up on
``mlp``, then times ``irkit.lower(ep)`` (default module functions), ``irkit.optimize`` of that
model and ``irkit.save`` of the result. Prints per model and stage the median of the runs with
min/max for each checkout, and the ratio of the medians (candidate / reference: below 1.0 is
faster). The stages are those of ``bench_lower.py`` (lower + save) and ``bench_optimize.py``
(``irkit.optimize``) without their reference exporters, which both checkouts share.

Usage:  python bench/bench_compare_refs.py --reference /work/main [--candidate .]
            [--models stack16,gpt2,llama] [--runs 5]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

STAGES = ("lower", "optimize", "save")


def _worker(models: list[str]) -> None:
    """Time the stages for each model in this process's irkit; print one JSON line."""
    import torch

    import irkit
    from tests import zoo

    logging.disable(logging.WARNING)
    torch.manual_seed(0)
    out: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        warm = irkit.lower(zoo.export("mlp"))
        irkit.optimize(warm)
        irkit.save(warm, pathlib.Path(tmp) / "warm.onnx")
        for name in models:
            ep = zoo.export(name)
            t0 = time.perf_counter()
            model = irkit.lower(ep)
            t1 = time.perf_counter()
            irkit.optimize(model)
            t2 = time.perf_counter()
            irkit.save(model, pathlib.Path(tmp) / f"{name}.onnx")
            t3 = time.perf_counter()
            out[name] = {"lower": t1 - t0, "optimize": t2 - t1, "save": t3 - t2}
    print("RESULT " + json.dumps(out), flush=True)


def _run(checkout: pathlib.Path, models: list[str]) -> dict[str, dict[str, float]]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(checkout)
    result = subprocess.run(
        [sys.executable, str(pathlib.Path(__file__).resolve()), "--worker", ",".join(models)],
        cwd=checkout,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    line = next((x for x in result.stdout.splitlines() if x.startswith("RESULT ")), None)
    if result.returncode != 0 or line is None:
        raise SystemExit(f"{checkout}: the worker failed:\n{result.stdout}\n{result.stderr}")
    parsed: dict[str, dict[str, float]] = json.loads(line.removeprefix("RESULT "))
    return parsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reference", help="the checkout to compare against (required)")
    parser.add_argument("--candidate", default=".", help="the checkout under test (default: .)")
    parser.add_argument("--models", default="stack16,gpt2,llama", help="tests/zoo.py names")
    parser.add_argument("--runs", type=int, default=5, help="interleaved runs per checkout")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _worker(args.worker.split(","))
        return
    if not args.reference:
        parser.error("--reference is required")
    models = args.models.split(",")
    refs = {
        "reference": pathlib.Path(args.reference).resolve(),
        "candidate": pathlib.Path(args.candidate).resolve(),
    }
    times: dict[str, list[dict[str, dict[str, float]]]] = {k: [] for k in refs}
    for run in range(args.runs):
        order = list(refs) if run % 2 == 0 else list(reversed(refs))
        for key in order:
            times[key].append(_run(refs[key], models))
        print(f"run {run + 1}/{args.runs} done", file=sys.stderr, flush=True)

    print(f"reference {refs['reference']}  candidate {refs['candidate']}  runs {args.runs}")
    print(
        f"{'model':10} {'stage':9} {'reference s (min-max)':>24} {'candidate s (min-max)':>24}"
        f" {'cand/ref':>8}"
    )
    for name in models:
        for stage in STAGES:
            cells, medians = [], []
            for key in refs:
                values = [t[name][stage] for t in times[key]]
                median = statistics.median(values)
                medians.append(median)
                cells.append(f"{median:8.3f} ({min(values):.3f}-{max(values):.3f})")
            ratio = medians[1] / medians[0]
            print(f"{name:10} {stage:9} {cells[0]:>24} {cells[1]:>24} {ratio:8.3f}")


if __name__ == "__main__":
    main()
