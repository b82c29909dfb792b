"""``irkit export`` vs onnxruntime-genai's model builder on the same folder (issue 23 item 6).

One Llama-shaped ``save_pretrained`` folder (random weights, a local word-level tokenizer) is
exported twice, each as a whole process. ``--size ref`` (the default, the issue's model): hidden
512, 4 layers, 8 heads, 2 KV heads, vocab 4000; ``--size 1b``: TinyLlama-1.1B's shape (hidden
2048, intermediate 5632, 22 layers, 32 heads, 4 KV heads, vocab 32000; 4.4 GB of fp32 weights,
built in memory once, so it needs ~9 GB of RAM and ~9 GB of disk per copy), where the builder's
whole-model load counts:

- ``irkit``: ``python -m irkit.cli export DIR -o OUT --precision P --target T`` (T: ``onnx``,
  the default, or ``ort``: onnxruntime's contrib ops)
- ``builder``: ``python -m onnxruntime_genai.models.builder -i DIR -o OUT -p P -e cpu``

(both with ``PYTHONPATH=<repo>``). Both folders get
``session_options`` ``intra_op_num_threads: 1`` / ``inter_op_num_threads: 1`` in their
``genai_config.json`` and run in ``og.Generator`` on ORT CPU: a prompt of 128 tokens
(``append_tokens``: the prefill), then 128 tokens decoded one ``generate_next_token`` at a time
(greedy; ``min_length`` keeps eos away). Rounds are interleaved (irkit, builder, irkit, …); the
table gives the median with min/max of each and the ratio irkit/builder of the medians, and the
export time (process wall) the same way, with the peak RSS of each export process
(``ru_maxrss``, taken by a small launcher process: Linux carries a process's peak RSS across
``exec``, so a child of this bench would report the bench's own). Targets: per-token and prefill <= 1.0, export <= 0.5.
``--export-only`` skips the generation rounds (the 1b model decodes slowly on one thread).

``bench/bench_genai_states.py`` runs the same comparison on LFM2- and Qwen3.5-shaped models with
this module's functions (:func:`save_folder`, :func:`export_rounds`, :func:`generation_rounds`,
:func:`report`, …).

``--profile`` also writes ORT's profile of one more run of each (``session_options``
``enable_profiling``) and prints the ten op types with the most time, to see where a ratio goes.

Usage: ``python bench/bench_genai.py [--size ref|1b] [--precision fp32|int4] [--target onnx|ort]
[--rounds 5] [--export-rounds 5] [--export-only] [--profile] [--workdir DIR]`` (run with
``PYTHONPATH=$PWD``).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import math
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

REPO = pathlib.Path(__file__).resolve().parents[1]
PROMPT = 128
NEW_TOKENS = 128
VOCAB = 4000


@dataclasses.dataclass(frozen=True)
class Size:
    """A Llama shape of the benchmark (``--size``)."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int


SIZES = {
    "ref": Size(hidden=512, intermediate=1536, layers=4, heads=8, kv_heads=2, vocab=VOCAB),
    # TinyLlama-1.1B's shape, random weights
    "1b": Size(hidden=2048, intermediate=5632, layers=22, heads=32, kv_heads=4, vocab=32000),
}


@dataclasses.dataclass
class Figures:
    """Seconds measured for one variant, one list per quantity."""

    export: list[float] = dataclasses.field(default_factory=list)
    export_rss: list[float] = dataclasses.field(default_factory=list)  # bytes
    prefill: list[float] = dataclasses.field(default_factory=list)
    per_token: list[float] = dataclasses.field(default_factory=list)


def make_folder(folder: pathlib.Path, size: Size = SIZES["ref"]) -> None:
    """The Llama-shaped random-weight folder, with a local tokenizer."""
    save_folder(folder, llama_config(size))


def llama_config(size: Size = SIZES["ref"]) -> object:
    """The transformers ``LlamaConfig`` of ``size`` (untied embeddings, 2048 positions)."""
    import transformers

    return transformers.LlamaConfig(
        hidden_size=size.hidden,
        intermediate_size=size.intermediate,
        num_hidden_layers=size.layers,
        num_attention_heads=size.heads,
        num_key_value_heads=size.kv_heads,
        vocab_size=size.vocab,
        max_position_embeddings=2048,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        tie_word_embeddings=False,
    )


def save_folder(
    folder: pathlib.Path, config: object, edit: Callable[[object], None] | None = None
) -> None:
    """``save_pretrained`` of a random-weight model of ``config`` (seed 0) and a local tokenizer.

    Args:
        folder: The folder written.
        config: A transformers config (its ``vocab_size`` sizes the word-level tokenizer:
            ``t0`` … ``t{vocab - 1}``; ``t0`` unk/pad, ``t1`` bos, ``t2`` eos).
        edit: Called with the model before it is saved (to set its weights otherwise).
    """
    import torch
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config)  # type: ignore[no-untyped-call]
    if edit is not None:
        edit(model)
    model.save_pretrained(folder)
    del model
    vocab = config.vocab_size  # type: ignore[attr-defined]
    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = transformers.PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tok, unk_token="t0", pad_token="t0", bos_token="t1", eos_token="t2"
    )
    fast.save_pretrained(folder)


def make_prompt(vocab: int, length: int = PROMPT) -> list[int]:
    """The benchmark's prompt: ``length`` ids spread over the vocabulary (no special ids)."""
    return [(7 * i + 3) % (vocab - 10) + 10 for i in range(length)]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO)
    return env


def export_command(
    kind: str,
    folder: pathlib.Path,
    out: pathlib.Path,
    precision: str,
    target: str = "onnx",
    builder_options: Sequence[str] = (),
    provider: str = "cpu",
) -> list[str]:
    """The whole-process export command of ``kind`` (``irkit`` or ``builder``; the builder's
    ``--extra_options`` are ``builder_options``, ``key=value`` each), for execution provider
    ``provider`` (``-e`` of both)."""
    if kind == "irkit":
        return [
            *(sys.executable, "-m", "irkit.cli", "export", str(folder), "-o", str(out), "-q"),
            *("--precision", precision, "--target", target, "-e", provider),
        ]
    cache = out.parent / f"{out.name}-cache"
    return [
        sys.executable,
        "-m",
        "onnxruntime_genai.models.builder",
        "-i",
        str(folder),
        "-o",
        str(out),
        "-p",
        precision,
        "-e",
        provider,
        "-c",
        str(cache),
        *(("--extra_options", *builder_options) if builder_options else ()),
    ]


# A small Python between the bench and the export: Linux carries a process's peak RSS across
# exec (``ru_maxrss`` keeps the pre-exec peak), so a child exec'd straight from this bench (which
# may have built a 4.4 GB model) would report the bench's own peak; the launcher's is ~10 MB.
_LAUNCHER = """\
import os, sys, time
t0 = time.perf_counter()
pid = os.fork()
if pid == 0:
    os.execv(sys.argv[1], sys.argv[1:])
_, status, usage = os.wait4(pid, 0)
sys.stderr.write(f"\\nBENCH {time.perf_counter() - t0} {usage.ru_maxrss}\\n")
sys.exit(os.waitstatus_to_exitcode(status))
"""


class ExportFailed(RuntimeError):
    """An export process exited non-zero; the message ends with its stderr's tail."""

    def __init__(self, kind: str, returncode: int, stderr: str) -> None:
        super().__init__(f"{kind} export failed ({returncode}):\n{stderr[-3000:]}")
        self.kind, self.returncode, self.stderr = kind, returncode, stderr

    def reason(self) -> str:
        """The last line of the process's stderr that names an error (or its last line)."""
        lines = [line.strip() for line in self.stderr.splitlines() if line.strip()]
        lines = [line for line in lines if not line.startswith("BENCH ")]
        errors = [line for line in lines if "Error" in line or "Exception" in line]
        return (errors or lines or [f"exit status {self.returncode}"])[-1].rstrip(".")


def run_export(
    kind: str,
    folder: pathlib.Path,
    out: pathlib.Path,
    precision: str,
    target: str,
    builder_options: Sequence[str] = (),
    provider: str = "cpu",
) -> tuple[float, int]:
    """Export into ``out`` (replaced): (the process wall time in seconds, its peak RSS in bytes),
    for execution provider ``provider``.

    Raises:
        ExportFailed: The export process exited non-zero.
    """
    shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(out.parent / f"{out.name}-cache", ignore_errors=True)
    command = export_command(kind, folder, out, precision, target, builder_options, provider)
    cmd = [sys.executable, "-c", _LAUNCHER, *command]
    proc = subprocess.run(
        cmd, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False
    )
    stderr = proc.stderr.decode(errors="replace")
    if proc.returncode != 0:
        raise ExportFailed(kind, proc.returncode, stderr)
    line = next(line for line in stderr.splitlines()[::-1] if line.startswith("BENCH "))
    _, wall, rss = line.split()
    return float(wall), int(rss) * 1024  # ru_maxrss: kilobytes on Linux


def set_session_options(out: pathlib.Path, profile: str | None = None) -> None:
    """One intra-op and one inter-op thread (and ORT's profiler if ``profile`` is a prefix)."""
    path = out / "genai_config.json"
    config = json.loads(path.read_text())
    options = config["model"]["decoder"].setdefault("session_options", {})
    options["intra_op_num_threads"] = 1
    options["inter_op_num_threads"] = 1
    options.pop("enable_profiling", None)
    if profile is not None:
        options["enable_profiling"] = profile
    path.write_text(json.dumps(config, indent=2))


class Generation(NamedTuple):
    """One timed greedy generation."""

    prefill: float  # seconds
    per_token: float  # seconds per decoded token
    ids: list[int]  # the decoded ids (after the prompt)


def timed_generation(model: object, prompt: Sequence[int]) -> Generation:
    """The prefill seconds, seconds per decoded token and decoded ids of one greedy generation."""
    import onnxruntime_genai as og

    params = og.GeneratorParams(model)
    total = len(prompt) + NEW_TOKENS
    params.set_search_options(max_length=total, min_length=total, do_sample=False)
    generator = og.Generator(model, params)
    t0 = time.perf_counter()
    generator.append_tokens(list(prompt))
    t1 = time.perf_counter()
    for _ in range(NEW_TOKENS):
        generator.generate_next_token()
    t2 = time.perf_counter()
    sequence = [int(i) for i in generator.get_sequence(0)]
    if len(sequence) != total:
        sys.exit(f"generated {len(sequence)} tokens, wanted {total}")
    return Generation(t1 - t0, (t2 - t1) / NEW_TOKENS, sequence[len(prompt) :])


def export_rounds(
    sources: Mapping[str, pathlib.Path],
    outs: Mapping[str, pathlib.Path],
    precision: str,
    target: str,
    rounds: int,
    figures: Mapping[str, Figures],
) -> dict[str, ExportFailed]:
    """``rounds`` interleaved whole-process exports of each kind (``irkit``, ``builder``).

    Args:
        sources: The Hugging Face folder each kind exports.
        outs: The output folder of each kind (replaced every round).
        precision: ``fp32`` or ``int4``.
        target: irkit's ``--target``.
        rounds: Export rounds (the kinds alternate which goes first).
        figures: Where each kind's wall time and peak RSS are appended.

    Returns:
        The kinds whose first export failed (they are not tried again), with the failure.
    """
    failed: dict[str, ExportFailed] = {}
    kinds = list(sources)
    for i in range(rounds):
        for kind in kinds if i % 2 == 0 else kinds[::-1]:
            if kind in failed:
                continue
            try:
                wall, rss = run_export(kind, sources[kind], outs[kind], precision, target)
            except ExportFailed as error:
                failed[kind] = error
                print(f"export {i + 1}/{rounds} {kind}: FAILED: {error.reason()}", flush=True)
                continue
            figures[kind].export.append(wall)
            figures[kind].export_rss.append(rss)
            print(
                f"export {i + 1}/{rounds} {kind}: {wall:.1f} s, peak RSS {rss / 1e9:.2f} GB",
                flush=True,
            )
    return failed


def generation_rounds(
    models: Mapping[str, object],
    prompt: Sequence[int],
    rounds: int,
    figures: Mapping[str, Figures],
) -> dict[str, list[int]]:
    """A warm-up, then ``rounds`` interleaved timed generations of each model.

    Args:
        models: The ``og.Model`` of each kind.
        prompt: The prompt ids.
        rounds: Generation rounds (the kinds alternate which goes first).
        figures: Where each kind's prefill and per-token seconds are appended.

    Returns:
        Each kind's greedy ids of the warm-up generation (the tokens after the prompt).
    """
    kinds = list(models)
    ids = {kind: timed_generation(models[kind], prompt).ids for kind in kinds}  # warm-up
    for i in range(rounds):
        for kind in kinds if i % 2 == 0 else kinds[::-1]:
            run = timed_generation(models[kind], prompt)
            figures[kind].prefill.append(run.prefill)
            figures[kind].per_token.append(run.per_token)
    return ids


@dataclasses.dataclass(frozen=True)
class LoadOrder:
    """One generation process of :func:`process_rounds`: the kind it loaded first, and its
    rounds' figures by kind."""

    first: str
    figures: Mapping[str, Figures]


def balanced_ratio(
    orders: Sequence[LoadOrder], field: str, a: str = "irkit", b: str = "builder"
) -> tuple[float, float, float] | None:
    """``a``/``b`` of ``field`` with the load order cancelled: (the median over processes that
    loaded ``a`` first of their per-round ratios' medians, the same over those that loaded ``b``
    first, their geometric mean); ``None`` without processes of both orders.

    A genai process decodes the model it loaded first slower than the next one (LFM2-350M int4:
    ~13 %, whichever model it is): a process measures ``a/b · f`` or ``a/(b · f)`` by its order,
    so the product of the two orders' ratios is ``(a/b)²`` whatever ``f`` is, while a median
    pooled over processes falls anywhere between the two modes.
    """
    by_first: dict[str, list[float]] = {a: [], b: []}
    for order in orders:
        if order.first not in by_first:
            continue
        pairs = zip(getattr(order.figures[a], field), getattr(order.figures[b], field), strict=True)
        ratios = [x / y for x, y in pairs]
        if ratios:
            by_first[order.first].append(statistics.median(ratios))
    if not by_first[a] or not by_first[b]:
        return None
    first_a, first_b = statistics.median(by_first[a]), statistics.median(by_first[b])
    return first_a, first_b, math.sqrt(first_a * first_b)


def process_rounds(
    folders: Mapping[str, pathlib.Path],
    prompt: Sequence[int],
    rounds: int,
    processes: int,
    figures: Mapping[str, Figures],
    orders: list[LoadOrder] | None = None,
) -> dict[str, list[int]]:
    """:func:`generation_rounds` in ``processes`` fresh processes, ``rounds`` each.

    A process keeps its models' memory placement for its whole life, and with it an offset of
    its own: the per-process median ratio of one pair of folders swung 1.006–1.062 over 10
    processes on an idle machine (2026-11-29), while a process's rounds agree within 1 %. The
    ratio of a comparison is therefore measured over processes, each loading every folder
    afresh (the load order rotated from one process to the next); much of the offset is that
    order (:func:`balanced_ratio`).

    Args:
        folders: The folder of each kind (``genai_config.json``'s session options set).
        prompt: The prompt ids.
        rounds: Timed generation rounds per process (after one warm-up).
        processes: How many processes.
        figures: Where each kind's prefill and per-token seconds are appended (all processes').
        orders: Where each process's load order and figures are appended
            (:func:`balanced_ratio`), if given.

    Returns:
        Each kind's greedy ids of the first process's warm-up generation.
    """
    kinds = list(folders)
    ids: dict[str, list[int]] = {}
    for i in range(processes):
        shift = i % len(kinds)
        order = kinds[shift:] + kinds[:shift]
        command = [
            *(sys.executable, __file__, "--worker", str(rounds), json.dumps(list(prompt))),
            *(f"{kind}={folders[kind]}" for kind in order),
        ]
        done = subprocess.run(command, capture_output=True, text=True, env=_env())
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:]
            raise RuntimeError(f"generation process {i + 1}/{processes} failed: {tail}")
        result = json.loads(done.stdout.strip().splitlines()[-1])
        for kind in kinds:
            figures[kind].prefill.extend(result[kind]["prefill"])
            figures[kind].per_token.extend(result[kind]["per_token"])
        if orders is not None:
            own = {
                kind: Figures(prefill=result[kind]["prefill"], per_token=result[kind]["per_token"])
                for kind in kinds
            }
            orders.append(LoadOrder(order[0], own))
        if not ids:
            ids = {kind: result[kind]["ids"] for kind in kinds}
    return ids


def _worker(argv: Sequence[str]) -> None:
    """``--worker ROUNDS PROMPT_JSON kind=folder ...``: :func:`generation_rounds` of the folders
    in this process, the figures and warm-up ids printed as one JSON line."""
    import onnxruntime_genai as og

    rounds, prompt = int(argv[0]), json.loads(argv[1])
    folders = dict(arg.split("=", 1) for arg in argv[2:])
    models = {kind: og.Model(folder) for kind, folder in folders.items()}
    figures = {kind: Figures() for kind in folders}
    ids = generation_rounds(models, prompt, rounds, figures)
    print(
        json.dumps(
            {
                kind: {"prefill": f.prefill, "per_token": f.per_token, "ids": ids[kind]}
                for kind, f in figures.items()
            }
        )
    )


def profile_summary(folder: pathlib.Path, prompt: Sequence[int], top: int = 10) -> str:
    """One generation under ORT's profiler: the op types with the most time."""
    import onnxruntime_genai as og

    prefix = str(folder / "ort_profile")
    set_session_options(folder, profile=prefix)
    before = set(folder.parent.glob("*.json")) | set(pathlib.Path.cwd().glob("ort_profile*.json"))
    model = og.Model(str(folder))
    timed_generation(model, prompt)
    del model
    set_session_options(folder)
    found = [
        p
        for p in {*folder.glob("ort_profile*.json"), *pathlib.Path.cwd().glob("ort_profile*.json")}
        if p not in before
    ]
    if not found:
        return f"  (no profile written under {folder})"
    events = json.loads(max(found, key=lambda p: p.stat().st_mtime).read_text())
    per_op: collections.Counter[str] = collections.Counter()
    for event in events:
        if event.get("cat") == "Node" and event.get("name", "").endswith("_kernel_time"):
            per_op[event.get("args", {}).get("op_name", "?")] += int(event.get("dur", 0))
    total = sum(per_op.values()) or 1
    return "\n".join(
        f"  {op:<28} {us / 1e3:9.1f} ms  {100 * us / total:5.1f}%"
        for op, us in per_op.most_common(top)
    )


def _stat(values: Sequence[float], scale: float, unit: str) -> str:
    return (
        f"{statistics.median(values) * scale:8.2f} {unit} "
        f"[{min(values) * scale:.2f}..{max(values) * scale:.2f}]"
    )


def report(
    figures: dict[str, Figures],
    precision: str,
    rounds: int,
    export_rounds: int,
    refused: str | None = None,
    orders: Sequence[LoadOrder] = (),
) -> str:
    """The table: median [min..max] of each variant, and the ratio irkit/builder.

    Args:
        figures: The ``irkit`` and ``builder`` figures.
        precision: The label of the run (the table's first line).
        rounds: Generation rounds, for the first line.
        export_rounds: Export rounds, for the first line.
        refused: Why the builder gave no folder: its rows then give irkit's figures alone, no
            ratio, and a last line says why.
        orders: The generation processes (:func:`process_rounds`): a line per timed quantity
            with the ratio by load order (:func:`balanced_ratio`), where both orders ran.
    """
    irkit, builder = figures["irkit"], figures["builder"]
    rows = [
        ("export (process wall)", "export", 1.0, "s", 0.5),
        ("export peak RSS", "export_rss", 1e-9, "GB", None),
        (f"prefill ({PROMPT} tokens)", "prefill", 1e3, "ms", 1.0),
        ("per decoded token", "per_token", 1e3, "ms", 1.0),
    ]
    lines = [
        f"irkit export vs genai builder, {precision}, ORT CPU 1 thread, prompt {PROMPT} + "
        f"{NEW_TOKENS} tokens; {export_rounds} export and {rounds} generation rounds, "
        "interleaved (median [min..max])",
        f"{'':24}{'irkit':>30}{'builder':>30}{'ratio':>8}  target",
    ]
    for label, field, scale, unit, target in rows:
        a, b = getattr(irkit, field), getattr(builder, field)
        if a and not b and refused is not None:
            lines.append(f"{label:24}{_stat(a, scale, unit):>30}{'refused':>30}{'-':>8}")
            continue
        if not a or not b:
            continue
        if target is None:
            ratio = statistics.median(a) / statistics.median(b)
            lines.append(
                f"{label:24}{_stat(a, scale, unit):>30}{_stat(b, scale, unit):>30}{ratio:8.2f}"
            )
            continue
        ratio = statistics.median(a) / statistics.median(b)
        verdict = "ok" if ratio <= target else "MISSED"
        lines.append(
            f"{label:24}{_stat(a, scale, unit):>30}{_stat(b, scale, unit):>30}"
            f"{ratio:8.2f}  <= {target} {verdict}"
        )
    for label, field in (("prefill", "prefill"), ("per token", "per_token")):
        balanced = balanced_ratio(orders, field)
        if balanced is not None:
            first_a, first_b, mean = balanced
            lines.append(
                f"{label}, load order cancelled: {mean:.3f} (irkit loaded first {first_a:.3f}, "
                f"builder first {first_b:.3f}; geometric mean of the orders' process medians)"
            )
    if refused is not None:
        lines.append(f"builder refused: {refused}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    given = list(sys.argv[1:] if argv is None else argv)
    if given[:1] == ["--worker"]:  # (one process of process_rounds)
        _worker(given[1:])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="ref", help="model shape")
    parser.add_argument("--precision", choices=("fp32", "int4"), default="fp32")
    parser.add_argument("--target", choices=("onnx", "ort"), default="onnx", help="irkit's")
    parser.add_argument("--rounds", type=int, default=5, help="generation rounds (>= 5)")
    parser.add_argument("--export-rounds", type=int, default=5, help="export rounds (>= 5)")
    parser.add_argument("--export-only", action="store_true", help="no generation rounds")
    parser.add_argument("--profile", action="store_true", help="ORT profile of each, by op type")
    parser.add_argument("--workdir", type=pathlib.Path, help="keep the folders here")
    args = parser.parse_args(argv)

    import onnxruntime_genai as og

    work = args.workdir or pathlib.Path(tempfile.mkdtemp(prefix="bench_genai-"))
    work.mkdir(parents=True, exist_ok=True)
    folder = work / f"hf-{args.size}"
    if not (folder / "config.json").exists():
        make_folder(folder, SIZES[args.size])
    kinds = ("irkit", "builder")
    outs = {
        "irkit": work / f"irkit-{args.precision}-{args.target}",
        "builder": work / f"builder-{args.precision}",
    }
    figures = {kind: Figures() for kind in kinds}
    failed = export_rounds(
        dict.fromkeys(kinds, folder), outs, args.precision, args.target, args.export_rounds, figures
    )
    if failed:
        sys.exit(str(next(iter(failed.values()))))
    label = f"{args.size}, {args.precision}, irkit --target {args.target}"
    if args.export_only:
        print(report(figures, label, 0, args.export_rounds))
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
        return
    for out in outs.values():
        set_session_options(out)
    models = {kind: og.Model(str(outs[kind])) for kind in kinds}
    prompt = make_prompt(SIZES[args.size].vocab)
    generation_rounds(models, prompt, args.rounds, figures)
    print(report(figures, label, args.rounds, args.export_rounds))
    if args.profile:
        del models
        for kind in kinds:
            print(f"ORT profile, {kind} (kernel time by op type, one generation):")
            print(profile_summary(outs[kind], prompt), flush=True)
    if args.workdir is None:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
