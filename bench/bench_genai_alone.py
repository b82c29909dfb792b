"""Decode speed of genai folders as an application runs them: one model per process.

``bench_genai.py`` and its zoo / state-model benches time both folders of a comparison in one
process, interleaved, and cancel the load order afterwards (``bench_genai.balanced_ratio``: a
process decodes the model it loaded first up to ~13 % slower, whichever folder that is). An
application loads one model. This bench runs each folder alone in a fresh process — one warm-up
generation, then ``--rounds`` timed ones (the prompt of 128 tokens, 128 tokens decoded one at a
time in ``og.Generator``, as ``bench_genai.timed_generation``) — ``--processes`` processes per
folder, the folders alternating process by process so slow drifts of the machine fall on all of
them alike. A figure is the median over a folder's processes of each process's median round,
with the processes' [min..max]; the ratio is the first folder's over each other's.

``--env default hugepages`` runs every folder once per environment in each cycle: ``hugepages``
sets ``GLIBC_TUNABLES=glibc.malloc.hugetlb=1`` for the process (glibc then asks the kernel for
transparent huge pages, ``madvise``, on the memory it maps and on its heap — what a machine whose
``/sys/kernel/mm/transparent_hugepage/enabled`` is ``madvise``, as here, does for no process by
default). A decode step at a released model's shape reads all of its weights, so the pages that
hold them matter; the bench prints each folder's ratio of the two environments too.

The folders are used as they are (their ``genai_config.json`` session options included: the
other benches write one intra-op thread into theirs). Greedy ids of each folder's first process
are compared with the first folder's.

Usage: ``python bench/bench_genai_alone.py irkit=DIR builder=DIR [--processes 6] [--rounds 3]
[--env default hugepages]`` (run with ``PYTHONPATH=$PWD``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import pathlib
import statistics
import subprocess
import sys
from collections.abc import Mapping, Sequence

#: The environment variables of each ``--env`` choice (added to this process's environment).
ENVIRONMENTS: Mapping[str, Mapping[str, str]] = {
    "default": {},
    "hugepages": {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"},
}


def _worker(argv: Sequence[str]) -> None:
    """``--worker ROUNDS FOLDER``: one warm-up and ``ROUNDS`` timed generations of the folder,
    printed as one JSON line (prefill and per-token seconds of each round, the warm-up's ids)."""
    import onnxruntime_genai as og

    from bench.bench_genai import make_prompt, timed_generation

    rounds, folder = int(argv[0]), argv[1]
    config = json.loads((pathlib.Path(folder) / "genai_config.json").read_text())
    prompt = make_prompt(int(config["model"]["vocab_size"]))
    model = og.Model(folder)
    ids = timed_generation(model, prompt).ids
    runs = [timed_generation(model, prompt) for _ in range(rounds)]
    prefill, per_token = [r.prefill for r in runs], [r.per_token for r in runs]
    print(json.dumps({"prefill": prefill, "per_token": per_token, "ids": ids}))


def run_alone(folder: pathlib.Path, rounds: int, env: Mapping[str, str]) -> dict[str, list[float]]:
    """One process of :func:`_worker` on ``folder`` with ``env`` added to the environment."""
    environ = {**os.environ, **env, "PYTHONPATH": str(pathlib.Path(__file__).resolve().parents[1])}
    command = [sys.executable, __file__, "--worker", str(rounds), str(folder)]
    done = subprocess.run(command, capture_output=True, text=True, env=environ, check=False)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:]
        raise RuntimeError(f"generation process on {folder} failed: {tail}")
    result: dict[str, list[float]] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _stat(values: Sequence[float]) -> str:
    return f"{statistics.median(values) * 1e3:8.3f} ms [{min(values) * 1e3:.3f}..{max(values) * 1e3:.3f}]"


def main(argv: Sequence[str] | None = None) -> None:
    given = list(sys.argv[1:] if argv is None else argv)
    if given[:1] == ["--worker"]:
        _worker(given[1:])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+", metavar="KIND=DIR", help="genai folders")
    parser.add_argument("--processes", type=int, default=6, help="processes per folder (>= 5)")
    parser.add_argument("--rounds", type=int, default=3, help="timed generations per process")
    parser.add_argument("--env", nargs="+", choices=sorted(ENVIRONMENTS), default=["default"])
    args = parser.parse_args(given)
    folders = dict(arg.split("=", 1) for arg in args.folders)
    runs = [(kind, env) for env in args.env for kind in folders]
    medians: dict[tuple[str, str], dict[str, list[float]]] = {
        run: {"prefill": [], "per_token": []} for run in runs
    }
    ids: dict[str, list[int]] = {}
    for cycle in range(args.processes):
        for kind, env in runs if cycle % 2 == 0 else runs[::-1]:
            result = run_alone(pathlib.Path(folders[kind]), args.rounds, ENVIRONMENTS[env])
            for field in ("prefill", "per_token"):
                medians[kind, env][field].append(statistics.median(result[field]))
            ids.setdefault(kind, result["ids"])  # type: ignore[arg-type]
            print(
                f"process {cycle + 1}/{args.processes} {kind} [{env}]: per token "
                f"{medians[kind, env]['per_token'][-1] * 1e3:.3f} ms",
                flush=True,
            )
    print(f"\n{summary(medians, list(folders), args.env, args.processes, args.rounds)}")
    first = next(iter(folders))
    for kind in itertools.islice(folders, 1, None):
        same = ids[kind] == ids[first]
        print(f"greedy ids {kind} vs {first}: {'same' if same else 'differ'}")


def summary(
    medians: Mapping[tuple[str, str], Mapping[str, Sequence[float]]],
    kinds: Sequence[str],
    envs: Sequence[str],
    processes: int,
    rounds: int,
) -> str:
    """The table: each folder's median [min..max] of its process medians by environment, the
    first folder's ratio to each other's, and each folder's hugepages/default per-token ratio
    (where both environments ran).

    Args:
        medians: Each (kind, environment)'s process medians, in seconds, by field (``prefill``,
            ``per_token``).
        kinds: The folders' kinds, the first the ratios' numerator.
        envs: The environments run.
        processes: Processes per folder and environment, for the first line.
        rounds: Timed rounds per process, for the first line.
    """
    lines = [
        f"one model per process, {processes} processes per folder and environment x {rounds} "
        "rounds (median of the process medians [min..max])"
    ]
    for env in envs:
        for field, label in (("prefill", "prefill"), ("per_token", "per token")):
            row = "  ".join(f"{kind} {_stat(medians[kind, env][field])}" for kind in kinds)
            lines.append(f"[{env}] {label:9} {row}")
            base = statistics.median(medians[kinds[0], env][field])
            for kind in kinds[1:]:
                ratio = base / statistics.median(medians[kind, env][field])
                lines.append(f"[{env}] {label:9} ratio {kinds[0]}/{kind}: {ratio:.3f}")
    if "default" in envs and "hugepages" in envs:
        for kind in kinds:
            default = statistics.median(medians[kind, "default"]["per_token"])
            huge = statistics.median(medians[kind, "hugepages"]["per_token"])
            lines.append(f"{kind}: per token hugepages/default {huge / default:.3f}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
