"""``irkit export`` vs onnxruntime-genai's model builder on state-space / hybrid models.

The issue item "as fast as the builder on the same model" for the models with conv and
recurrent caches: an LFM2-shaped folder (conv state on its ``conv`` layers, keys/values on its
``full_attention`` layers) and a Qwen3.5-shaped one (gated delta net — conv and recurrent
state — on its ``linear_attention`` layers, keys/values on its ``full_attention`` layer). Both:
hidden 512, intermediate 1536, 4 layers with both kinds (LFM2 ``conv, full_attention, conv,
full_attention``; Qwen3.5 three ``linear_attention`` then ``full_attention``), 8 heads, 2 KV
heads, vocab 4000; Qwen3.5's head dim 64 (rotary 16: partial factor 0.25, interleaved M-RoPE
sections ``[3, 3, 2]`` as its checkpoints carry; with text positions it is plain RoPE) and
linear attention 4 key / 8 value heads of 64. Random weights, the local word-level tokenizer.
``--size real`` takes the released models' shapes instead (LFM2-350M: hidden 1024, 16 layers of
which 6 attention, 16 heads, 8 KV heads, intermediate 4608, vocab 65536, tied; Qwen3.5-0.8B's
text decoder: hidden 1024, 24 layers in six groups of three linear-attention and one attention,
KV heads 2 of 256, linear attention 16 + 16 heads of 128, intermediate 3584, vocab 248320, tied),
where a decode step is bound by its weights and the graph's fixed per-step costs weigh little.

Everything else is ``bench/bench_genai.py``'s (imported): whole-process exports with their peak
RSS, ``intra_op_num_threads: 1``, a prompt of 128 tokens then 128 tokens decoded one at a time in
``og.Generator`` on ORT CPU, interleaved rounds, median [min..max], ratio irkit/builder (targets:
prefill and per token <= 1.0, export <= 0.5). Per model and precision it also prints whether the
two folders decode the same greedy ids (and, in fp32, irkit's against transformers ``generate``
on the same prompt: the correctness anchor), then a Markdown table of all the runs.

The builder refuses ``Qwen3_5ForCausalLM`` (its architecture list has only the
``Qwen3_5ForConditionalGeneration`` checkpoints, whose text decoder it builds): the bench tries
the folder as is once, prints the refusal, then gives the builder the same folder with only
``architectures`` changed (a sibling folder of links). A builder that still refuses gets its
reason printed as its figure, with irkit's absolute figures and no ratio.

``--processes N`` times ``--rounds`` rounds in each of N fresh processes
(``bench_genai.process_rounds``): a process keeps its models' memory placement, and with it an
offset of its own (one pair's per-process median ratio swung 1.006–1.062 over 10 processes), so a
ratio to ±0.01 needs several processes; the table then pools every process's rounds. Much of
that offset is the load order: a process decodes the model it loaded first slower (LFM2-350M
int4: ~13 %, whichever folder it is), so the table adds the ratio with the order cancelled, the
geometric mean of the two orders' process medians (``bench_genai.balanced_ratio``): read that
one.

``--profile`` prints, from onnxruntime's profiler over ``--profile-rounds`` more generations of
each folder (interleaved), the kernels one decode step runs and, per op type, the median over
decode steps of its kernel time in a step, the median prefill kernel time, and both totals,
irkit's beside the builder's (nodes inside a ``Scan`` body are counted on their own and inside
the ``Scan``: read the ``Scan`` row as the whole recurrence). Per-step medians, not sums: on a
loaded machine one descheduled kernel would swamp a sum.

Usage: ``python bench/bench_genai_states.py [--arch lfm2 qwen35] [--size bench|real] [--precision fp32 int4]
[--target ort|onnx] [--rounds 5] [--processes N] [--export-rounds 5] [--profile] [--profile-rounds 3]
[--workdir DIR]`` (run with ``PYTHONPATH=$PWD``).
"""

from __future__ import annotations

import argparse
import bisect
import collections
import dataclasses
import json
import pathlib
import shutil
import statistics
import sys
import tempfile
from collections.abc import Sequence

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import bench_genai as bg

ARCHS = ("lfm2", "qwen35")
#: The architecture the builder builds Qwen3.5's text decoder from.
QWEN35_BUILDER_ARCH = "Qwen3_5ForConditionalGeneration"


#: ``--size``: the issue's bench shape, or the released models' (LFM2-350M, Qwen3.5-0.8B's text
#: decoder: their widths, layer patterns, vocabularies and tied embeddings; random weights).
SIZES = ("bench", "real")


def make_config(arch: str, size: str = "bench") -> object:
    """The transformers config of ``arch`` (``lfm2`` or ``qwen35``) at ``size`` (:data:`SIZES`)."""
    import transformers

    real = size == "real"
    common = dict(
        hidden_size=1024 if real else 512,
        max_position_embeddings=2048,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        tie_word_embeddings=real,
    )
    if arch == "lfm2":
        attention = (2, 5, 8, 10, 12, 14) if real else (1, 3)
        layers = 16 if real else 4
        return transformers.Lfm2Config(
            **common,
            intermediate_size=4608 if real else 1536,
            num_hidden_layers=layers,
            num_attention_heads=16 if real else 8,
            num_key_value_heads=8 if real else 2,
            vocab_size=65536 if real else bg.VOCAB,
            layer_types=["full_attention" if i in attention else "conv" for i in range(layers)],
            block_ff_dim=4608 if real else 1536,
            block_auto_adjust_ff_dim=False,
        )
    return transformers.Qwen3_5TextConfig(
        **common,
        intermediate_size=3584 if real else 1536,
        num_hidden_layers=24 if real else 4,
        num_attention_heads=8,
        num_key_value_heads=2,
        vocab_size=248320 if real else bg.VOCAB,
        layer_types=(["linear_attention"] * 3 + ["full_attention"]) * (6 if real else 1),
        head_dim=256 if real else 64,
        linear_num_key_heads=16 if real else 4,
        linear_num_value_heads=16 if real else 8,
        linear_key_head_dim=128 if real else 64,
        linear_value_head_dim=128 if real else 64,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.25,
            "mrope_section": [11, 11, 10] if real else [3, 3, 2],
            "mrope_interleaved": True,
        },
    )


def builder_view(folder: pathlib.Path, architecture: str) -> pathlib.Path:
    """A sibling of ``folder`` with ``config.json``'s ``architectures`` set to ``architecture``.

    Every other file is a symbolic link to ``folder``'s: the same weights and tokenizer.
    """
    view = folder.parent / f"{folder.name}-{architecture}"
    shutil.rmtree(view, ignore_errors=True)
    view.mkdir()
    for path in folder.iterdir():
        if path.name != "config.json":
            (view / path.name).symlink_to(path.resolve())
    config = json.loads((folder / "config.json").read_text())
    config["architectures"] = [architecture]
    (view / "config.json").write_text(json.dumps(config, indent=2))
    return view


def builder_source(
    folder: pathlib.Path, arch: str, out: pathlib.Path, precision: str
) -> tuple[pathlib.Path, str | None]:
    """The folder the builder exports, and a note on what it refused on the way.

    Qwen3.5: the folder as is first (one export, not timed); if the builder refuses it, the
    :func:`builder_view` naming :data:`QWEN35_BUILDER_ARCH`.
    """
    if arch != "qwen35":
        return folder, None
    try:
        bg.run_export("builder", folder, out, precision, "onnx")
    except bg.ExportFailed as error:
        view = builder_view(folder, QWEN35_BUILDER_ARCH)
        architecture = json.loads((folder / "config.json").read_text())["architectures"][0]
        return view, (
            f"{architecture} as is: {error.reason()}; given the same weights as "
            f"{QWEN35_BUILDER_ARCH}"
        )
    return folder, None


def reference_ids(folder: pathlib.Path, prompt: Sequence[int]) -> list[int]:
    """transformers ``generate``'s greedy ids after ``prompt`` (eos held off as genai does)."""
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    with torch.no_grad():
        ids = model.generate(
            torch.tensor([list(prompt)]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=bg.NEW_TOKENS,
            min_new_tokens=bg.NEW_TOKENS,
            do_sample=False,
            pad_token_id=0,
        )
    return [int(i) for i in ids[0, len(prompt) :]]


def compare_ids(a: Sequence[int], b: Sequence[int]) -> str:
    """``same (n of n)``, or where the first difference is."""
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        if x != y:
            return f"differ from decoded token {i + 1} of {len(a)} ({x} vs {y})"
    return f"same ({len(a)} of {len(a)})"


@dataclasses.dataclass
class StepProfile:
    """Kernel times (µs) by op type of the prefill and of each decode step of generations."""

    prefill: list[collections.Counter[str]] = dataclasses.field(default_factory=list)
    decode: list[collections.Counter[str]] = dataclasses.field(default_factory=list)
    kernels: int = 0  # kernels in a decode step (the most common count)


def profiled_events(
    folder: pathlib.Path, prompt: Sequence[int], threads: int | None = 1
) -> list[dict[str, object]]:
    """The events of onnxruntime's profile of one greedy generation of ``folder``.

    ``threads``: the session's intra/inter-op threads while profiled (``None``: the folder's
    own options are kept, the profiler added).
    """
    import onnxruntime_genai as og

    for old in folder.glob("ort_profile*.json"):
        old.unlink()
    config = folder / "genai_config.json"
    original = config.read_text()
    edited = json.loads(original)
    options = edited["model"]["decoder"].setdefault("session_options", {})
    options["enable_profiling"] = str(folder / "ort_profile")
    if threads is not None:
        options["intra_op_num_threads"] = options["inter_op_num_threads"] = threads
    config.write_text(json.dumps(edited, indent=2))
    try:
        model = og.Model(str(folder))
        bg.timed_generation(model, prompt)
        del model
    finally:
        config.write_text(original)
    found = [*folder.glob("ort_profile*.json"), *pathlib.Path.cwd().glob("ort_profile*.json")]
    if not found:
        sys.exit(f"onnxruntime wrote no profile under {folder} or {pathlib.Path.cwd()}")
    path = max(found, key=lambda p: p.stat().st_mtime)
    events: list[dict[str, object]] = json.loads(path.read_text())
    path.unlink()
    return events


def profile_steps(folder: pathlib.Path, prompt: Sequence[int], into: StepProfile) -> None:
    """One generation under onnxruntime's profiler, split into its runs (``model_run`` events):
    the first is the prefill, the others decode steps."""
    events: list[dict] = profiled_events(folder, prompt)  # type: ignore[type-arg]
    starts = sorted(e["ts"] for e in events if e.get("name") == "model_run")
    runs: list[collections.Counter[str]] = [collections.Counter() for _ in starts]
    counts = [0] * len(starts)
    for event in events:
        if event.get("cat") == "Node" and event.get("name", "").endswith("_kernel_time"):
            run = bisect.bisect_right(starts, event["ts"]) - 1
            runs[run][event.get("args", {}).get("op_name", "?")] += int(event.get("dur", 0))
            counts[run] += 1
    into.prefill.append(runs[0])
    into.decode.extend(runs[1:])
    into.kernels = collections.Counter(counts[1:]).most_common(1)[0][0]


def _median(steps: Sequence[collections.Counter[str]], op: str | None = None) -> float:
    return statistics.median(sum(c.values()) if op is None else c.get(op, 0) for c in steps)


def profile_table(profiles: dict[str, StepProfile]) -> str:
    """Per op type: median µs per decode step and median prefill ms, each kind side by side."""
    kinds = list(profiles)
    ops: collections.Counter[str] = collections.Counter()
    for profile in profiles.values():
        for step in profile.decode:
            ops.update(step)
    head = " | ".join(f"{k} decode µs/step, prefill ms" for k in kinds)
    lines = [f"| op | {head} |", "|---|" + "---|" * len(kinds)]
    rows = [(None, "**all kernels**"), *((op, op) for op, _ in ops.most_common())]
    for op, label in rows:
        cells = [
            f"{_median(profiles[k].decode, op):.0f}, {_median(profiles[k].prefill, op) / 1e3:.2f}"
            for k in kinds
        ]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    kernels = ", ".join(f"{k} {profiles[k].kernels}" for k in kinds)
    return f"kernels per decode step: {kernels}\n" + "\n".join(lines)


@dataclasses.dataclass
class Case:
    """The outcome of one model and precision."""

    arch: str
    precision: str
    figures: dict[str, bg.Figures]
    refused: str | None  # why the builder gave no folder
    note: str | None  # what the builder refused before it got a folder it exports
    ids: str  # irkit vs builder greedy ids
    reference: str | None  # irkit vs transformers (fp32)


def run_case(work: pathlib.Path, arch: str, precision: str, args: argparse.Namespace) -> Case:
    """Export, time and check one model at one precision; prints its table."""
    import onnxruntime_genai as og

    name = arch if args.size == "bench" else f"{arch}-{args.size}"
    folder = work / f"hf-{name}"
    if not (folder / "config.json").exists():
        bg.save_folder(folder, make_config(arch, args.size))
    outs = {
        "irkit": work / f"irkit-{name}-{precision}-{args.target}",
        "builder": work / f"builder-{name}-{precision}",
    }
    source, note = builder_source(folder, arch, outs["builder"], precision)
    if note is not None:
        print(f"builder refused {note}", flush=True)
    figures = {kind: bg.Figures() for kind in outs}
    failed = bg.export_rounds(
        {"irkit": folder, "builder": source},
        outs,
        precision,
        args.target,
        args.export_rounds,
        figures,
    )
    if "irkit" in failed:
        sys.exit(str(failed["irkit"]))
    refused = failed["builder"].reason() if "builder" in failed else None
    kinds = [kind for kind in outs if kind not in failed]
    for kind in kinds:
        bg.set_session_options(outs[kind])
    prompt = bg.make_prompt(bg.VOCAB)
    orders: list[bg.LoadOrder] = []
    if args.processes:  # (each process loads the folders afresh: bench_genai.process_rounds)
        ids = bg.process_rounds(
            {kind: outs[kind] for kind in kinds},
            prompt,
            args.rounds,
            args.processes,
            figures,
            orders,
        )
    else:
        models = {kind: og.Model(str(outs[kind])) for kind in kinds}
        ids = bg.generation_rounds(models, prompt, args.rounds, figures)
        del models
    label = f"{arch}, {precision}, irkit --target {args.target}"
    rounds = args.rounds * max(args.processes, 1)
    print(bg.report(figures, label, rounds, args.export_rounds, refused=refused, orders=orders))
    same = compare_ids(ids["irkit"], ids["builder"]) if "builder" in ids else "no builder folder"
    print(f"greedy ids, irkit vs builder: {same}")
    reference = None
    if precision == "fp32":
        reference = compare_ids(ids["irkit"], reference_ids(folder, prompt))
        print(f"greedy ids, irkit vs transformers generate: {reference}")
    if args.profile:
        profiles = {kind: StepProfile() for kind in kinds}
        for i in range(args.profile_rounds):
            for kind in kinds if i % 2 == 0 else kinds[::-1]:
                profile_steps(outs[kind], prompt, profiles[kind])
        print(f"onnxruntime profile, {arch} {precision}, {args.profile_rounds} generations each:")
        print(profile_table(profiles), flush=True)
    return Case(arch, precision, figures, refused, note, same, reference)


def _cell(figures: dict[str, bg.Figures], field: str, scale: float, unit: str) -> str:
    a, b = getattr(figures["irkit"], field), getattr(figures["builder"], field)
    if not b:
        return f"{statistics.median(a) * scale:.2f} {unit} vs refused"
    ratio = statistics.median(a) / statistics.median(b)
    return (
        f"{ratio:.2f} [{statistics.median(a) * scale:.2f} vs "
        f"{statistics.median(b) * scale:.2f} {unit}]"
    )


def summary(cases: Sequence[Case]) -> str:
    """A Markdown table of every case: ratio irkit/builder [median vs median]."""
    lines = [
        "| ratio irkit/builder | prefill | per token | export (process wall) | export peak RSS "
        "| greedy ids irkit vs builder |",
        "|---|---|---|---|---|---|",
    ]
    for case in cases:
        f = case.figures
        ids = case.ids + (f"; vs transformers: {case.reference}" if case.reference else "")
        lines.append(
            f"| {case.arch} {case.precision} | {_cell(f, 'prefill', 1e3, 'ms')} "
            f"| {_cell(f, 'per_token', 1e3, 'ms')} | {_cell(f, 'export', 1.0, 's')} "
            f"| {_cell(f, 'export_rss', 1e-9, 'GB')} | {ids} |"
        )
    notes = {note for case in cases for note in (case.note, case.refused) if note}
    lines += [f"\nbuilder refused {note}" for note in sorted(notes)]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", nargs="+", choices=ARCHS, default=list(ARCHS))
    parser.add_argument(
        "--size",
        choices=SIZES,
        default="bench",
        help="the bench shape (hidden 512, 4 layers) or the released models' (LFM2-350M, "
        "Qwen3.5-0.8B)",
    )
    parser.add_argument(
        "--precision", nargs="+", choices=("fp32", "int4"), default=["fp32", "int4"]
    )
    parser.add_argument(
        "--target", choices=("onnx", "ort"), default="ort", help="irkit's (irkit export's default)"
    )
    parser.add_argument("--rounds", type=int, default=5, help="generation rounds (>= 5)")
    parser.add_argument(
        "--processes",
        type=int,
        default=0,
        help="time --rounds rounds in each of this many fresh processes (0: in this one)",
    )
    parser.add_argument("--export-rounds", type=int, default=5, help="export rounds (>= 5)")
    parser.add_argument("--profile", action="store_true", help="ORT profile of each, by op type")
    parser.add_argument(
        "--profile-rounds", type=int, default=3, help="profiled generations of each (--profile)"
    )
    parser.add_argument("--workdir", type=pathlib.Path, help="keep the folders here")
    args = parser.parse_args(argv)

    work = args.workdir or pathlib.Path(tempfile.mkdtemp(prefix="bench_genai_states-"))
    work.mkdir(parents=True, exist_ok=True)
    cases = [
        run_case(work, arch, precision, args) for arch in args.arch for precision in args.precision
    ]
    print(summary(cases))
    if args.workdir is None:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
