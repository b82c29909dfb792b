"""OpInfo sweep: irkit vs the stock exporter on every op of PyTorch's op_db, same samples.

For each op (float32, plus int64 and bool where the op lists them) the first ``--samples``
samples are exported once with ``torch.export.export`` and converted by each exporter
(``irkit.lower`` and ``torch.onnx.export(ep, dynamo=True)``); the ONNX models run in onnxruntime
(CPU, graph optimizations off) against eager PyTorch (harness: tests/conformance/opinfo.py).

Prints pass counts per dtype for both exporters, the cases where the stock exporter passes and
irkit fails grouped by failure class and root cause, and the cases where irkit passes and the
stock exporter fails. ``--write-expected`` (re)writes tests/conformance/expected_failures.py
from irkit's results (entries of cases not run are kept).

Cases run in ``--jobs`` worker processes (default 1; 0 runs in this process): a crash or a case
over ``--timeout`` seconds kills only its worker and is reported as such.

Usage:
    python bench/bench_opinfo.py [--ops add,nn.functional.conv2d] [--dtypes float32,int64,bool]
        [--samples 3] [--jobs 2] [--exporters irkit,stock] [--json out.json] [--write-expected]
    python bench/bench_opinfo.py --load out.json [--write-expected]   # report a saved sweep
    python bench/bench_opinfo.py --load out.json --ops a,b --json out.json  # rerun some, merge
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import multiprocessing
import multiprocessing.connection
import os
import pathlib
import re
import subprocess
import sys
import time
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.conformance import opinfo  # noqa: E402
from tests.conformance.opinfo import NOT_APPLICABLE, Outcome, Result  # noqa: E402

Case = tuple[str, str, str]
Results = dict[Case, dict[str, Result]]
EXPECTED_PATH = ROOT / "tests" / "conformance" / "expected_failures.py"


# ----------------------------------------------------------------------------------------------
# Running cases in worker processes


def _worker(conn: Any, exporters: tuple[str, ...], n_samples: int) -> None:
    import logging
    import warnings

    import torch

    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    logging.disable(logging.WARNING)
    while True:
        case = conn.recv()
        if case is None:
            return
        try:
            out = opinfo.run_case(*case, exporters=exporters, n_samples=n_samples)
            conn.send({x: r.to_json() for x, r in out.items()})
        except Exception as e:  # a harness error: report it, keep the worker
            r = Result(Outcome.CRASH, f"harness: {type(e).__name__}: {e}"[:300])
            conn.send({x: r.to_json() for x in exporters})


class _Slot:
    def __init__(self, ctx: Any, exporters: tuple[str, ...], n_samples: int):
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker, args=(child, exporters, n_samples), daemon=True)
        self.proc.start()
        child.close()
        self.case: Case | None = None
        self.started = 0.0

    def kill(self) -> None:
        self.proc.kill()
        self.proc.join()
        self.conn.close()


def run_all(
    cases: list[Case], exporters: tuple[str, ...], n_samples: int, jobs: int, timeout: float
) -> Results:
    """Run every case; results keyed by case, then exporter."""
    results: Results = {}
    t0 = time.perf_counter()

    def done(case: Case, out: dict[str, Result]) -> None:
        results[case] = out
        n = len(results)
        if n % 25 == 0 or n == len(cases):
            el = time.perf_counter() - t0
            eta = el / n * (len(cases) - n)
            print(f"  {n}/{len(cases)} cases, {el:.0f}s elapsed, ~{eta:.0f}s left", file=sys.stderr)

    if jobs == 0:
        for case in cases:
            done(case, opinfo.run_case(*case, exporters=exporters, n_samples=n_samples))
        return results

    ctx = multiprocessing.get_context("spawn")
    pending = list(reversed(cases))
    slots = [_Slot(ctx, exporters, n_samples) for _ in range(min(jobs, len(cases)))]
    while len(results) < len(cases):
        for slot in slots:
            if slot.case is None and pending:
                slot.case, slot.started = pending.pop(), time.perf_counter()
                slot.conn.send(slot.case)
        busy = {slot.conn: slot for slot in slots if slot.case is not None}
        for conn in multiprocessing.connection.wait(list(busy), timeout=1.0):
            slot = busy[conn]
            try:
                data = conn.recv()
                out = {x: Result.from_json(r) for x, r in data.items()}
            except (EOFError, OSError):
                code = slot.proc.exitcode
                r = Result(Outcome.WORKER_DIED, f"worker process died (exit code {code})")
                out = {x: r for x in exporters}
                slots[slots.index(slot)] = _restart(slot, ctx, exporters, n_samples)
            done(slot.case, out)  # type: ignore[arg-type]
            slot.case = None
        now = time.perf_counter()
        for i, slot in enumerate(slots):
            if slot.case is not None and now - slot.started > timeout:
                r = Result(Outcome.TIMEOUT, f"case took over {timeout:g}s (worker killed)")
                done(slot.case, {x: r for x in exporters})
                slots[i] = _restart(slot, ctx, exporters, n_samples)
    for slot in slots:
        slot.conn.send(None)
        slot.proc.join(timeout=10)
        if slot.proc.is_alive():
            slot.kill()
    return results


def _restart(slot: _Slot, ctx: Any, exporters: tuple[str, ...], n_samples: int) -> _Slot:
    slot.kill()
    slot.case = None
    return _Slot(ctx, exporters, n_samples)


# ----------------------------------------------------------------------------------------------
# Reporting


def root_cause(r: Result) -> str:
    """A failure's grouping key: its class, the message with op names, quoted names and numbers
    blanked (no "Fix: ..." advice), and where the underlying exception was raised."""
    if r.outcome is Outcome.UNSUPPORTED:
        return "unsupported: UnsupportedOpError (the aten ops are listed per case)"
    message, _, where = r.reason.partition(" @ ")
    message = message.split(" Fix: ")[0]
    message = re.sub(r"\bin aten\.[\w.]+: ", "", message)
    message = re.sub(r"\baten::[\w.]+", "aten::…", message)
    message = re.sub(r"'[^']*'|\"[^\"]*\"", "'…'", message)
    message = re.sub(r"\([^()]*\)", "(…)", message)
    message = re.sub(r"\b\d+(\.\d+)?(e[-+]?\d+)?\b", "N", message)
    message = re.sub(r"\[[^\]]*\]", "[…]", message)
    return f"{r.outcome.value}: {message[:200]}" + (f" @ {where}" if where else "")


def _name(case: Case) -> str:
    return opinfo.case_id(*case)


def report(results: Results, exporters: tuple[str, ...]) -> str:
    """The printed summary (pass counts, stock-only and irkit-only passes)."""
    lines = []
    dtypes = sorted({c[2] for c in results}, key=list(opinfo.DTYPES).index)
    lines.append("Pass counts (applicable cases: torch.export succeeds on at least one sample)")
    lines.append(
        f"  {'dtype':8s} {'cases':>6s} {'n/a':>5s} {'applicable':>10s} "
        + " ".join(f"{x:>7s}" for x in exporters)
    )
    for d in dtypes:
        rows = [r for c, r in results.items() if c[2] == d]
        na = sum(1 for r in rows if r[exporters[0]].outcome in NOT_APPLICABLE)
        counts = [sum(1 for r in rows if r[x].passed) for x in exporters]
        lines.append(
            f"  {d:8s} {len(rows):6d} {na:5d} {len(rows) - na:10d} "
            + " ".join(f"{n:7d}" for n in counts)
        )
    for x in exporters:
        hist = collections.Counter(r[x].outcome.value for r in results.values())
        lines.append(f"  {x} outcomes: " + ", ".join(f"{k} {v}" for k, v in hist.most_common()))
    if "irkit" in exporters and "stock" in exporters:
        lost = {c: r for c, r in results.items() if r["stock"].passed and not r["irkit"].passed}
        won = {c: r for c, r in results.items() if r["irkit"].passed and not r["stock"].passed}
        lines.append("")
        lines.append(f"Stock passes, irkit fails: {len(lost)} cases, by irkit's root cause")
        lines.extend(_grouped(lost))
        lines.append("")
        lines.append(f"irkit passes, stock fails: {len(won)} cases")
        for c, r in sorted(won.items()):
            lines.append(
                f"  {_name(c)}  (stock: {r['stock'].outcome.value}: {r['stock'].reason[:120]})"
            )
    return "\n".join(lines)


def _grouped(cases: Results) -> list[str]:
    groups: dict[str, list[Case]] = collections.defaultdict(list)
    for c, r in cases.items():
        groups[root_cause(r["irkit"])].append(c)
    lines = []
    for key, members in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        lines.append(f"- {len(members)} cases: {key}")
        first = cases[members[0]]["irkit"]
        lines.append(f"    e.g. {_name(members[0])}: {first.reason}")
        if first.outcome is Outcome.UNSUPPORTED:
            for c in sorted(members):
                lines.append(f"    {_name(c)}: {cases[c]['irkit'].reason.split(': ', 1)[-1]}")
        else:
            lines.append("    " + ", ".join(_name(c) for c in sorted(members)))
    return lines


# ----------------------------------------------------------------------------------------------
# The expected-failure table


# Reviewed: matrix factorizations and solvers have no standard ONNX op (ONNX has Det, nothing
# for Cholesky/LU/QR/SVD/eig/inverse/solve); both exporters report them unsupported.
_FACTORIZATIONS = [
    "cholesky",
    "cholesky_inverse",
    "cholesky_solve",
    "geqrf",
    "ormqr",
    "lu",
    "lu_solve",
    "lu_unpack",
    "qr",
    "svd",
    "svd_lowrank",
    "pca_lowrank",
    "pinverse",
    "triangular_solve",
    "matrix_exp",
    "linalg.cholesky",
    "linalg.cholesky_ex",
    "linalg.cond",
    "linalg.eig",
    "linalg.eigh",
    "linalg.eigvals",
    "linalg.eigvalsh",
    "linalg.householder_product",
    "linalg.inv",
    "linalg.inv_ex",
    "linalg.ldl_factor",
    "linalg.ldl_factor_ex",
    "linalg.ldl_solve",
    "linalg.lu",
    "linalg.lu_factor",
    "linalg.lu_factor_ex",
    "linalg.lu_solve",
    "linalg.matrix_rank",
    "linalg.pinv",
    "linalg.qr",
    "linalg.slogdet",
    "linalg.solve",
    "linalg.solve_ex",
    "linalg.solve_triangular",
    "linalg.svd",
    "linalg.svdvals",
    "linalg.tensorinv",
    "linalg.tensorsolve",
]


def classify(irkit_r: Result, stock_r: Result | None, op_name: str = "") -> str:
    """The table's reason for a case irkit fails: reason class, then the one-line reason."""
    if irkit_r.outcome is Outcome.EXPORT_FAILED:
        return f"torch.export fails: {irkit_r.reason}"
    if irkit_r.outcome is Outcome.NO_SAMPLES:
        return f"no applicable sample: {irkit_r.reason}"
    what = f"{irkit_r.outcome.value}: {irkit_r.reason}"
    if stock_r is None:
        return f"irkit gap: {what}"
    if stock_r.passed:
        return f"irkit gap (stock passes): {what}"
    if op_name in _FACTORIZATIONS and irkit_r.outcome is Outcome.UNSUPPORTED:
        return f"no ONNX equivalent (matrix factorization/solve; stock fails too): {what}"
    if "NOT_IMPLEMENTED" in irkit_r.reason and "NOT_IMPLEMENTED" in stock_r.reason:
        return f"onnxruntime lacks a kernel: {what}"
    return f"irkit gap (stock fails too: {stock_r.outcome.value}): {what}"


def load_expected() -> dict[Case, str]:
    if not EXPECTED_PATH.exists():
        return {}
    from tests.conformance.expected_failures import EXPECTED_FAILURES

    return dict(EXPECTED_FAILURES)


def write_expected(results: Results, meta: dict[str, Any]) -> int:
    """Rewrite the table: cases run replace their entries; the rest are kept. Returns its size.

    Without the stock exporter's results (``--exporters irkit``), a case that stays an irkit
    failure keeps its class from the existing entry (``irkit gap (stock passes)``,
    ``no ONNX equivalent (...)``, ...) and only its outcome and reason are refreshed.
    """
    table = load_expected()
    for case, r in results.items():
        old = table.pop(case, None)
        if r["irkit"].passed:
            continue
        reason = classify(r["irkit"], r.get("stock"), case[0])
        if "stock" not in r and old and reason.startswith("irkit gap: "):
            kept = re.match(r"[^:(]*(\([^)]*\))?", old).group(0)  # class, with its (...)
            if kept.startswith(("irkit gap", "no ONNX equivalent", "onnxruntime lacks")):
                reason = f"{kept}: {reason.removeprefix('irkit gap: ')}"
        table[case] = reason
    body = [
        '"""Cases irkit is expected to fail: ``{(op name, variant, dtype): reason}``.',
        "",
        "Generated by ``python bench/bench_opinfo.py --write-expected`` (then reviewed), used by",
        "tests/conformance/test_opinfo.py as ``xfail(strict=True)``: a fix that makes a case pass",
        "fails the test until its entry is removed. Reason classes: ``torch.export fails``,",
        "``no applicable sample``, ``no ONNX equivalent``, ``onnxruntime lacks a kernel``,",
        "``irkit gap (stock passes)``, ``irkit gap (stock fails too: <outcome>)``.",
        "",
        f"Last generated: {meta['date']} at commit {meta['commit']} (torch {meta['torch']},",
        f"{meta['samples']} samples per case).",
        '"""',
        "",
        "# The torch whose op_db this table was made from: every case must be in its op_db. Another",
        "# torch's op_db may lack some (tests/conformance/test_opinfo.py reports them, no failure).",
        f"TORCH = {json.dumps(meta['torch'])}",
        "",
        "# One line per case (generated; not reformatted).",
        "# fmt: off",
        "EXPECTED_FAILURES: dict[tuple[str, str, str], str] = {",
    ]
    for case in sorted(table):
        key = "(" + ", ".join(json.dumps(x) for x in case) + ")"
        body.append(f"    {key}: {json.dumps(table[case][:240], ensure_ascii=False)},")
    body.append("}")
    body.append("# fmt: on")
    EXPECTED_PATH.write_text("\n".join(body) + "\n")
    return len(table)


# ----------------------------------------------------------------------------------------------


def _select(ops: str | None, dtypes: list[str]) -> list[Case]:
    cases = opinfo.all_cases(dtypes)
    if not ops:
        return cases
    wanted = {w.strip() for w in ops.split(",") if w.strip()}
    picked = [c for c in cases if c[0] in wanted or f"{c[0]}.{c[1]}" in wanted]
    missing = wanted - {c[0] for c in picked} - {f"{c[0]}.{c[1]}" for c in picked}
    if missing:
        raise SystemExit(f"no OpInfo entry (with those dtypes) named: {sorted(missing)}")
    return picked


def _meta(args: argparse.Namespace, seconds: float) -> dict[str, Any]:
    import torch

    commit = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "-C", str(ROOT), "status", "--porcelain", "--", "irkit"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": commit + ("+dirty" if dirty else ""),
        "torch": torch.__version__,
        "samples": args.samples,
        "jobs": args.jobs,
        "seconds": round(seconds, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", help="comma-separated OpInfo names (name or name.variant)")
    parser.add_argument("--dtypes", default="float32,int64,bool")
    parser.add_argument("--samples", type=int, default=opinfo.DEFAULT_SAMPLES)
    parser.add_argument("--jobs", type=int, default=1, help="worker processes (0: in-process)")
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds per case")
    parser.add_argument("--exporters", default="irkit,stock")
    parser.add_argument("--json", help="write all results to this file")
    parser.add_argument("--load", help="report a saved --json file instead of running")
    parser.add_argument("--write-expected", action="store_true")
    args = parser.parse_args()

    results: Results = {}
    meta: dict[str, Any] = {}
    exporters = tuple(x.strip() for x in args.exporters.split(","))
    if args.load:
        data = json.loads(pathlib.Path(args.load).read_text())
        meta = data["meta"]
        exporters = tuple(meta["exporters"])
        results = {
            tuple(v["case"]): {x: Result.from_json(v[x]) for x in exporters}
            for v in data["results"].values()
        }
    if args.ops or not args.load:
        dtypes = [d.strip() for d in args.dtypes.split(",")]
        cases = _select(args.ops, dtypes)
        print(
            f"{len(cases)} cases ({', '.join(dtypes)}), {args.samples} samples, "
            f"exporters {', '.join(exporters)}, {args.jobs} job(s)",
            file=sys.stderr,
        )
        t0 = time.perf_counter()
        fresh = run_all(cases, exporters, args.samples, args.jobs, args.timeout)
        seconds = time.perf_counter() - t0
        if meta:  # --load with --ops: the new results replace those cases in the loaded sweep
            note = f"{len(cases)} cases rerun {_meta(args, seconds)['date']}"
            meta["rerun"] = f"{meta['rerun']}; {note}" if "rerun" in meta else note
        else:
            meta = _meta(args, seconds) | {"exporters": list(exporters)}
        results |= fresh
    if args.json:
        payload = {
            "meta": meta,
            "results": {
                _name(c): {"case": list(c)} | {x: r[x].to_json() for x in exporters}
                for c, r in sorted(results.items())
            },
        }
        pathlib.Path(args.json).write_text(json.dumps(payload, indent=1))
    print(report(results, exporters))
    print(
        f"\n{len(results)} cases in {meta['seconds']:.0f}s ({meta['jobs']} job(s), "
        f"{meta['samples']} samples) at {meta['commit']}, {meta['date']}"
        + (f"; {meta['rerun']}" if "rerun" in meta else "")
    )
    if args.write_expected:
        n = write_expected(results, meta)
        print(f"wrote {os.path.relpath(EXPECTED_PATH)} ({n} entries)")


if __name__ == "__main__":
    main()
