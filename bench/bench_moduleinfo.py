"""ModuleInfo sweep: irkit vs the stock exporter on every module of PyTorch's module_db.

For each module (float32, plus float16 where the entry lists it) every sample (or the first
``--samples``) is built in eval mode, exported once with ``torch.export.export`` and converted by
each exporter (``irkit.lower`` and ``torch.onnx.export(ep, dynamo=True)``); the ONNX models run in
onnxruntime (CPU) against eager PyTorch (harness: tests/conformance/moduleinfo.py).

Prints one line per module (irkit and stock verdicts, seconds), the totals over applicable
modules (torch.export succeeds on at least one sample), and the modules where one exporter
passes and the other fails. ``--write-expected`` (re)writes
tests/conformance/moduleinfo_expected_failures.py from irkit's results.

Usage:
    python bench/bench_moduleinfo.py [--modules nn.LSTM,nn.Conv2d] [--dtypes float32,float16]
        [--samples N] [--exporters irkit,stock] [--json out.json] [--write-expected]
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import logging
import pathlib
import subprocess
import sys
import time
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.conformance import moduleinfo  # noqa: E402
from tests.conformance.opinfo import NOT_APPLICABLE, Result  # noqa: E402

Case = tuple[str, str]
Results = dict[Case, dict[str, Result]]
EXPECTED_PATH = ROOT / "tests" / "conformance" / "moduleinfo_expected_failures.py"


def run_all(
    cases: list[Case], exporters: tuple[str, ...], n_samples: int | None
) -> tuple[Results, dict[Case, float]]:
    results: Results = {}
    seconds: dict[Case, float] = {}
    for i, case in enumerate(cases, 1):
        t0 = time.perf_counter()
        results[case] = moduleinfo.run_case(*case, exporters=exporters, n_samples=n_samples)
        seconds[case] = time.perf_counter() - t0
        line = "  ".join(f"{x} {results[case][x].outcome.value}" for x in exporters)
        print(
            f"  [{i}/{len(cases)}] {moduleinfo.case_id(*case)}: {line} ({seconds[case]:.1f}s)",
            file=sys.stderr,
        )
    return results, seconds


def _verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("pass" if ok else "FAIL")


def report(results: Results, seconds: dict[Case, float], exporters: tuple[str, ...]) -> str:
    by_module: dict[str, list[Case]] = collections.defaultdict(list)
    for case in results:
        by_module[case[0]].append(case)
    verdicts: dict[str, dict[str, bool | None]] = {}
    lines = [f"{'module':32s} {'dtypes':16s} " + " ".join(f"{x:>6s}" for x in exporters) + "    s"]
    for name, cases in by_module.items():
        verdicts[name] = {
            x: moduleinfo.module_passed([results[c][x] for c in cases]) for x in exporters
        }
        secs = sum(seconds.get(c, 0.0) for c in cases)
        lines.append(
            f"{name:32s} {','.join(c[1] for c in cases):16s} "
            + " ".join(f"{_verdict(verdicts[name][x]):>6s}" for x in exporters)
            + f" {secs:5.1f}"
        )
        for c in cases:
            for x in exporters:
                r = results[c][x]
                if not r.passed and r.outcome not in NOT_APPLICABLE:
                    lines.append(
                        f"    {x} {c[1]} (sample {r.sample}): {r.outcome.value}: {r.reason[:220]}"
                    )
    applicable = [n for n, v in verdicts.items() if v[exporters[0]] is not None]
    lines.append("")
    lines.append(
        f"{len(verdicts)} modules, {len(applicable)} applicable (torch.export succeeds on a sample)"
    )
    for x in exporters:
        n = sum(1 for v in verdicts.values() if v[x])
        lines.append(f"  {x}: {n}/{len(applicable)} modules pass")
    if "irkit" in exporters and "stock" in exporters:
        lost = [n for n, v in verdicts.items() if v["stock"] and not v["irkit"]]
        won = [n for n, v in verdicts.items() if v["irkit"] and v["stock"] is False]
        lines.append(f"  stock passes, irkit fails: {lost or 'none'}")
        lines.append(f"  irkit passes, stock fails: {won or 'none'}")
    return "\n".join(lines)


def write_expected(results: Results, meta: dict[str, Any]) -> int:
    """Rewrite the table from irkit's results: cases run replace their entries."""
    from tests.conformance.moduleinfo_expected_failures import EXPECTED_FAILURES

    table = dict(EXPECTED_FAILURES)
    for case, r in results.items():
        table.pop(case, None)
        ir_r = r["irkit"]
        if ir_r.passed or ir_r.outcome in NOT_APPLICABLE:
            continue
        stock = r.get("stock")
        if stock is None:
            cls = "irkit gap"
        elif stock.passed:
            cls = "irkit gap (stock passes)"
        else:
            cls = f"both fail (stock: {stock.outcome.value})"
        table[case] = (ir_r.sample, f"{cls}: {ir_r.outcome.value}: {ir_r.reason}"[:240])
    body = [
        '"""ModuleInfo cases irkit is expected to fail: ``{(module, dtype): (sample, reason)}``.',
        "",
        "Generated by ``python bench/bench_moduleinfo.py --write-expected``, then reviewed (each reason",
        "says why), used by tests/conformance/test_moduleinfo.py as ``xfail(strict=True)`` when the",
        "failing sample (its index) is among the samples the test runs. Classes: ``irkit gap (stock",
        "passes)``, ``irkit gap``, ``both fail (stock: <outcome>)``.",
        "",
        f"Last generated: {meta['date']} at commit {meta['commit']} (torch {meta['torch']}).",
        '"""',
        "",
        "# fmt: off",
        "EXPECTED_FAILURES: dict[tuple[str, str], tuple[int, str]] = {",
    ]
    for case in sorted(table):
        sample, reason = table[case]
        key = "(" + ", ".join(json.dumps(x) for x in case) + ")"
        body.append(f"    {key}: ({sample}, {json.dumps(reason, ensure_ascii=False)}),")
    body += ["}", "# fmt: on", ""]
    EXPECTED_PATH.write_text("\n".join(body))
    return len(table)


def _meta(seconds: float) -> dict[str, Any]:
    import torch

    commit = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": commit,
        "torch": torch.__version__,
        "seconds": round(seconds, 1),
    }


def _report_saved(args: argparse.Namespace) -> None:
    results: Results = {}
    seconds: dict[Case, float] = {}
    notes = []
    for path in args.load:
        data = json.loads(pathlib.Path(path).read_text())
        meta = data["meta"]
        notes.append(
            f"{path}: {', '.join(meta['exporters'])} at {meta['commit']}, "
            f"{meta['date']}, {meta['seconds']:.0f}s"
        )
        for entry in data["results"].values():
            case = (entry["case"][0], entry["case"][1])
            results.setdefault(case, {})
            for x in meta["exporters"]:
                results[case][x] = Result.from_json(entry[x])
            seconds[case] = seconds.get(case, 0.0) + entry["seconds"]
    exporters = tuple(x for x in ("irkit", "stock") if all(x in r for r in results.values()))
    print(report(results, seconds, exporters))
    print("\n" + "\n".join(notes))
    if args.write_expected:
        meta = json.loads(pathlib.Path(args.load[-1]).read_text())["meta"]
        print(f"wrote {EXPECTED_PATH.relative_to(ROOT)} ({write_expected(results, meta)} entries)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modules", help="comma-separated ModuleInfo names (nn.LSTM)")
    parser.add_argument("--dtypes", default="float32,float16")
    parser.add_argument("--samples", type=int, default=None, help="first N samples (default all)")
    parser.add_argument("--exporters", default="irkit,stock")
    parser.add_argument("--json", help="write all results to this file")
    parser.add_argument("--write-expected", action="store_true")
    parser.add_argument(
        "--load",
        action="append",
        help="report saved --json sweeps instead of running (repeat to merge, e.g. one per "
        "exporter; later files win per case and exporter)",
    )
    args = parser.parse_args()
    if args.load:
        _report_saved(args)
        return

    import torch

    torch.set_num_threads(1)
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)
    exporters = tuple(x.strip() for x in args.exporters.split(","))
    cases = moduleinfo.all_cases([d.strip() for d in args.dtypes.split(",")])
    if args.modules:
        wanted = {m.strip() for m in args.modules.split(",")}
        missing = wanted - {c[0] for c in cases}
        if missing:
            raise SystemExit(f"no ModuleInfo entry (with those dtypes) named: {sorted(missing)}")
        cases = [c for c in cases if c[0] in wanted]
    print(f"{len(cases)} cases, exporters {', '.join(exporters)}", file=sys.stderr)
    t0 = time.perf_counter()
    results, seconds = run_all(cases, exporters, args.samples)
    meta = _meta(time.perf_counter() - t0)
    print(report(results, seconds, exporters))
    print(
        f"\n{len(cases)} cases in {meta['seconds']:.0f}s (1 thread) at {meta['commit']}, "
        f"{meta['date']}"
    )
    if args.json:
        payload = {
            "meta": meta | {"exporters": list(exporters)},
            "results": {
                moduleinfo.case_id(*c): {"case": list(c), "seconds": round(seconds[c], 2)}
                | {x: r[x].to_json() for x in exporters}
                for c, r in results.items()
            },
        }
        pathlib.Path(args.json).write_text(json.dumps(payload, indent=1))
    if args.write_expected:
        print(f"wrote {EXPECTED_PATH.relative_to(ROOT)} ({write_expected(results, meta)} entries)")


if __name__ == "__main__":
    main()
