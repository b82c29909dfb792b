"""``irkit export`` vs onnxruntime-genai's model builder on every zoo architecture it builds.

Issue 33 item 3: prefill and per token against the builder on each architecture of the causal-LM
zoo (``tests/llm_zoo.py``: :data:`ZOO` and :data:`EXTRA`) that the builder supports, fp32 and
int4, not only the reference llama of ``bench/bench_genai.py``.

Each architecture gets a reference-sized folder: the zoo's config with its sizes replaced by
``bench_genai``'s ``ref`` shape (hidden 512, intermediate 1536, 4 layers, 8 heads, 2 KV heads,
head dim 64, vocab 4000, 2048 positions) and everything else of the zoo's kept (MoE experts,
sliding window of 8, softcaps, longrope, ALiBi, MLA, multi-query, …); a zoo ``layer_types``
pattern is repeated over the 4 layers, longrope's factor lists are stretched to the new head dim,
an MLA config keeps as many KV heads as query heads, and a Phi-3 without longrope gets
``original_max_position_embeddings`` = ``max_position_embeddings`` (as Phi-3-mini-4k: the
builder reads the two differing as longrope). Random weights (seed 0) and the local word-level
tokenizer (``bench_genai.save_folder``).

The builder is tried first on each folder (``-p fp32 -e cpu``): it refuses an architecture it
does not know (``NotImplementedError``), and that refusal is recorded with its reason and the
architecture skipped (no irkit export, no rounds); phi3_longrope's builder export is made on a
view of its folder (:data:`BUILDER_CONFIG_EDITS`), and a builder folder whose bounded
sliding-window cache genai fails is re-exported without it (:func:`unbounded_window`). Otherwise both are exported once per
precision, each a whole process (``bench_genai.run_export``: irkit with its default
``--target ort``), both folders get one intra-op and one inter-op thread, and
``bench_genai.generation_rounds`` times a warm-up then ``--rounds`` interleaved generations of
each in ``og.Generator`` on ORT CPU: a 128-token prompt (the prefill), then 128 tokens decoded
one at a time. Per architecture and precision it prints ``bench_genai.report``'s table (median
[min..max], ratio irkit/builder; target <= 1.0 for prefill and per token) and, in fp32, whether
the greedy ids of the two folders agree (and irkit's against transformers ``generate``, the
correctness anchor). At the end: a Markdown table of every case, the refusals, and the
architectures and precisions whose prefill or per-token ratio is over 1.0.

``--processes N`` times ``--rounds`` rounds in each of N fresh processes
(``bench_genai.process_rounds``): a process keeps its models' memory placement, and with it an
offset of its own (one pair's per-process median ratio swung 1.006–1.062 over 10 processes), so a
ratio to ±0.01 needs several processes; the table then pools every process's rounds. Much of
that offset is the load order: a process decodes the model it loaded first slower (LFM2-350M
int4: ~13 %, whichever folder it is), so the table adds the ratio with the order cancelled, the
geometric mean of the two orders' process medians (``bench_genai.balanced_ratio``): read that
one.

``--profile`` prints ORT's kernel time by op type of one more generation of each folder
(``bench_genai.profile_summary``). ``--export-only`` stops after the exports; ``--keep-exports``
takes the folders (and refusals) already in ``--workdir`` as they are (their exports not timed
again), so the exports can be made ahead of a quiet machine and the rounds run on it.

Usage: ``python bench/bench_genai_zoo.py [--arch a b ...] [--precision fp32 int4] [--rounds 5] [--processes N]
[--profile] [--workdir DIR [--keep-exports]] [--export-only]`` (run with ``PYTHONPATH=$PWD``).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import pathlib
import shutil
import statistics
import sys
import tempfile
from collections.abc import Callable, Sequence
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import bench_genai as bg
import bench_genai_states as bs

from tests.llm_zoo import EXTRA, ZOO

ARCHS = {arch.name: arch for arch in (*ZOO, *EXTRA)}
REF = bg.SIZES["ref"]
HEAD_DIM = REF.hidden // REF.heads
POSITIONS = 2048

#: The reference size under each name a zoo config spells it with.
_SIZES: dict[str, int] = {
    **dict.fromkeys(("hidden_size", "n_embd", "d_model", "word_embed_proj_dim"), REF.hidden),
    **dict.fromkeys(("intermediate_size", "n_inner", "ffn_dim"), REF.intermediate),
    **dict.fromkeys(("num_hidden_layers", "n_layer", "n_layers"), REF.layers),
    **dict.fromkeys(("num_attention_heads", "n_head", "n_heads"), REF.heads),
    **dict.fromkeys(("max_position_embeddings", "n_positions", "max_seq_len", "n_ctx"), POSITIONS),
    "head_dim": HEAD_DIM,
    "vocab_size": REF.vocab,
}


def _stretch(values: Sequence[float], length: int) -> list[float]:
    """``values`` (an arithmetic run) resampled to ``length`` entries over the same range."""
    first, last = values[0], values[-1]
    return [first + (last - first) * i / (length - 1) for i in range(length)]


def reference_config(name: str) -> Any:
    """The zoo config of ``name`` at the reference size (see the module docstring)."""
    arch = ARCHS[name]
    factory = arch.config
    assert isinstance(factory, functools.partial), name
    (class_name,) = factory.args
    kwargs = dict(factory.keywords)
    for key in list(kwargs):
        if key in _SIZES:
            kwargs[key] = _SIZES[key]
    if "num_key_value_heads" in kwargs:  # MLA: as many KV heads as query heads
        mla = factory.keywords["num_key_value_heads"] == factory.keywords["num_attention_heads"]
        kwargs["num_key_value_heads"] = REF.heads if mla else REF.kv_heads
    if "layer_types" in kwargs:
        pattern = list(kwargs["layer_types"])
        kwargs["layer_types"] = [pattern[i % len(pattern)] for i in range(REF.layers)]
    rope = kwargs.get("rope_parameters")
    if rope and rope.get("rope_type") == "longrope":
        rope = dict(rope)
        for key in ("short_factor", "long_factor"):
            rope[key] = _stretch(rope[key], HEAD_DIM // 2)
        kwargs["rope_parameters"] = rope
    elif class_name == "Phi3Config":
        kwargs["original_max_position_embeddings"] = POSITIONS
    import transformers

    return getattr(transformers, class_name)(**kwargs)


@dataclasses.dataclass
class Case:
    """The outcome of one architecture at one precision."""

    arch: str
    precision: str
    figures: dict[str, bg.Figures]
    failed: str | None = None  # why there are no figures (an export or a run that failed)
    ids: str = ""  # irkit vs builder greedy ids
    reference: str | None = None  # irkit vs transformers greedy ids (fp32)
    note: str | None = None  # what the builder's folder needed (see unbounded_window)


def folder_of(work: pathlib.Path, name: str) -> pathlib.Path:
    """The reference-sized Hugging Face folder of ``name`` (made once)."""
    folder = work / f"hf-{name}"
    if not (folder / "config.json").exists():
        bg.save_folder(folder, reference_config(name))
    return folder


def _longrope_type(config: dict[str, Any]) -> None:
    """Phi-3 checkpoints' ``rope_scaling`` carries ``type: longrope``, which the builder reads
    (``rope_parameters["type"]``); transformers 5 writes ``rope_type`` only."""
    config["rope_parameters"] = {**config["rope_parameters"], "type": "longrope"}


#: Where the builder fails on transformers 5's config of the folder (not on the architecture):
#: what its config.json gets in the builder's view of the folder (same weights, links).
BUILDER_CONFIG_EDITS: dict[str, Callable[[dict[str, Any]], None]] = {
    "phi3_longrope": _longrope_type,
}


def builder_view(folder: pathlib.Path, edit: Callable[[dict[str, Any]], None]) -> pathlib.Path:
    """A sibling of ``folder`` whose config.json is ``edit``'s; its other files link to
    ``folder``'s."""
    view = folder.parent / f"{folder.name}-builder"
    shutil.rmtree(view, ignore_errors=True)
    view.mkdir()
    for path in folder.iterdir():
        if path.name not in ("config.json", "builder_refused.txt"):
            (view / path.name).symlink_to(path.resolve())
    config = json.loads((folder / "config.json").read_text())
    edit(config)
    (view / "config.json").write_text(json.dumps(config, indent=2))
    return view


def builder_source(work: pathlib.Path, name: str) -> pathlib.Path:
    """The folder the builder exports: :func:`builder_view` for :data:`BUILDER_CONFIG_EDITS`."""
    folder = folder_of(work, name)
    if name not in BUILDER_CONFIG_EDITS:
        return folder
    view = folder.parent / f"{folder.name}-builder"
    return view if view.exists() else builder_view(folder, BUILDER_CONFIG_EDITS[name])


def builder_probe(work: pathlib.Path, name: str, keep: bool) -> tuple[float, int] | str | None:
    """The builder's fp32 export of ``name``'s folder: its (wall, peak RSS), or why it refused.

    The folder it writes is the fp32 builder folder of :func:`run_case`; a refusal is also
    written to ``builder_refused.txt`` in the Hugging Face folder. ``keep``: a refusal or an
    fp32 folder already there is taken as is (``None``: the kept folder, not timed). For
    :data:`BUILDER_CONFIG_EDITS` the folder as is is tried first (its refusal printed), then
    :func:`builder_source`'s view.
    """
    folder = folder_of(work, name)
    refused = folder / "builder_refused.txt"
    if keep and refused.exists():
        return refused.read_text()
    out = builder_out(work, name, "fp32")
    if keep and (out / "genai_config.json").exists():
        return None
    architecture = json.loads((folder / "config.json").read_text())["architectures"][0]
    if name in BUILDER_CONFIG_EDITS:
        try:
            bg.run_export("builder", folder, out, "fp32", "ort")
        except bg.ExportFailed as error:
            reason = error.reason().replace(str(folder), folder.name)
            edit = BUILDER_CONFIG_EDITS[name].__name__
            print(
                f"builder refused {name} as is ({architecture}: {reason}); "
                f"tried again on its view with config.json edited by {edit}",
                flush=True,
            )
    try:
        return bg.run_export("builder", builder_source(work, name), out, "fp32", "ort")
    except bg.ExportFailed as error:
        reason = f"{architecture}: {error.reason().replace(str(folder), folder.name)}"
        refused.write_text(reason)
        return reason


def builder_out(work: pathlib.Path, name: str, precision: str) -> pathlib.Path:
    """The builder's output folder of ``name`` at ``precision``."""
    return work / f"builder-{name}-{precision}"


#: The builder's options for a folder whose bounded sliding-window KV cache fails in genai.
WINDOW_OPTIONS = ("windowed_kv_cache=false",)


def first_error(out: pathlib.Path, prompt: Sequence[int]) -> str | None:
    """Why one generation of the folder ``out`` fails in genai, or ``None``."""
    import onnxruntime_genai as og

    try:
        bg.timed_generation(og.Model(str(out)), prompt)
    except Exception as error:
        return f"{type(error).__name__}: {str(error).splitlines()[0]}"
    return None


def unbounded_window(
    out: pathlib.Path, source: pathlib.Path, precision: str, prompt: Sequence[int]
) -> str | None:
    """Re-export the builder's folder ``out`` with :data:`WINDOW_OPTIONS` if it has a bounded
    sliding-window cache (``decoder.sliding_window`` in genai_config.json) and fails on the
    prompt; returns the note saying so (kept in ``out/bench_note.txt``), or ``None``.

    genai 0.18 fails the builder's default folder of an architecture whose every layer is
    windowed (mistral, phi3 with the zoo's window of 8) on a prompt longer than the bounded
    cache (GroupQueryAttention: ``total_sequence_length must equal past_sequence_length +
    kv_sequence_length``); with the option the builder writes a cache of the whole length, as
    irkit's, the window applied in ``GroupQueryAttention`` (``local_window_size``).
    """
    note = out / "bench_note.txt"
    if note.exists():
        return note.read_text()
    decoder = json.loads((out / "genai_config.json").read_text())["model"]["decoder"]
    if "sliding_window" not in decoder:
        return None
    error = first_error(out, prompt)
    if error is None:
        return None
    bg.run_export("builder", source, out, precision, "ort", WINDOW_OPTIONS)
    bg.set_session_options(out)
    text = (
        f"the builder's default folder (bounded sliding-window KV cache) fails: {error}; "
        f"re-exported with --extra_options {' '.join(WINDOW_OPTIONS)} (not timed)"
    )
    note.write_text(text)
    return text


def run_case(
    work: pathlib.Path,
    name: str,
    precision: str,
    args: argparse.Namespace,
    probe: tuple[float, int] | None = None,
) -> Case | None:
    """Export, time and check one architecture at one precision; prints its table.

    ``probe``: the builder's export already made at this precision (:func:`builder_probe`).
    With ``--keep-exports`` a folder already exported is used as is (not timed); with
    ``--export-only`` nothing is run (``None``).
    """
    import onnxruntime_genai as og

    folder = folder_of(work, name)
    outs = {
        "irkit": work / f"irkit-{name}-{precision}",
        "builder": builder_out(work, name, precision),
    }
    figures = {kind: bg.Figures() for kind in outs}
    case = Case(name, precision, figures)
    for kind, out in outs.items():
        try:
            source = builder_source(work, name) if kind == "builder" else folder
            if kind == "builder" and probe is not None:
                wall, rss = probe
            elif args.keep_exports and (out / "genai_config.json").exists():
                bg.set_session_options(out)
                continue
            else:
                wall, rss = bg.run_export(kind, source, out, precision, "ort")
        except bg.ExportFailed as error:
            case.failed = f"{kind} export: {error.reason()}"
            print(f"{name} {precision}: {case.failed}", flush=True)
            return case
        figures[kind].export.append(wall)
        figures[kind].export_rss.append(rss)
        print(f"{name} {precision} {kind} export: {wall:.1f} s, {rss / 1e9:.2f} GB", flush=True)
        bg.set_session_options(out)
    if args.export_only:
        return None
    prompt = bg.make_prompt(REF.vocab)
    try:
        case.note = unbounded_window(outs["builder"], builder_source(work, name), precision, prompt)
    except bg.ExportFailed as error:
        case.failed = f"builder export ({WINDOW_OPTIONS[0]}): {error.reason()}"
        return case
    if case.note is not None:
        print(f"{name} {precision}: {case.note}", flush=True)
    orders: list[bg.LoadOrder] = []
    try:
        if args.processes:  # (each process loads the folders afresh: bench_genai.process_rounds)
            ids = bg.process_rounds(outs, prompt, args.rounds, args.processes, figures, orders)
        else:
            models = {kind: og.Model(str(out)) for kind, out in outs.items()}
            ids = bg.generation_rounds(models, prompt, args.rounds, figures)
            del models
    except Exception as error:
        case.failed = f"generation: {type(error).__name__}: {str(error).splitlines()[0]}"
        print(f"{name} {precision}: {case.failed}", flush=True)
        return case
    label = f"{name}, {precision}, irkit --target ort"
    print(bg.report(figures, label, args.rounds * max(args.processes, 1), 1, orders=orders))
    case.ids = bs.compare_ids(ids["irkit"], ids["builder"])
    print(f"greedy ids, irkit vs builder: {case.ids}")
    if precision == "fp32":
        case.reference = bs.compare_ids(ids["irkit"], bs.reference_ids(folder, prompt))
        print(f"greedy ids, irkit vs transformers generate: {case.reference}")
    if args.profile:
        for kind, out in outs.items():
            print(f"ORT profile, {name} {precision} {kind} (kernel time by op type):")
            print(bg.profile_summary(out, prompt), flush=True)
    return case


def ratio(figures: dict[str, bg.Figures], field: str) -> float:
    """The ratio irkit/builder of the medians of ``field``."""
    a, b = getattr(figures["irkit"], field), getattr(figures["builder"], field)
    return statistics.median(a) / statistics.median(b)


def _cell(figures: dict[str, bg.Figures], field: str) -> str:
    def stat(values: Sequence[float]) -> str:
        return (
            f"{statistics.median(values) * 1e3:.2f} "
            f"[{min(values) * 1e3:.2f}..{max(values) * 1e3:.2f}]"
        )

    a, b = getattr(figures["irkit"], field), getattr(figures["builder"], field)
    mark = "**" if ratio(figures, field) > 1.0 else ""
    return f"{mark}{ratio(figures, field):.2f}{mark} ({stat(a)} vs {stat(b)} ms)"


def summary(cases: Sequence[Case], refusals: dict[str, str]) -> str:
    """A Markdown table of every case, the refusals and the ratios over 1.0."""
    lines = [
        "| arch | precision | prefill irkit/builder (irkit vs builder, median [min..max]) "
        "| per token irkit/builder (ms) | greedy ids irkit vs builder |",
        "|---|---|---|---|---|",
    ]
    over = []
    for case in cases:
        if case.failed is not None:
            lines.append(f"| {case.arch} | {case.precision} | failed: {case.failed} | | |")
            continue
        ids = case.ids + (f"; vs transformers: {case.reference}" if case.reference else "")
        lines.append(
            f"| {case.arch} | {case.precision} | {_cell(case.figures, 'prefill')} "
            f"| {_cell(case.figures, 'per_token')} | {ids} |"
        )
        for field, label in (("prefill", "prefill"), ("per_token", "per token")):
            if ratio(case.figures, field) > 1.0:
                over.append(
                    f"{case.arch} {case.precision} {label} {ratio(case.figures, field):.2f}"
                )
    lines.append("")
    lines += [f"{case.arch} {case.precision}: {case.note}" for case in cases if case.note]
    lines += [f"builder refused {name}: {reason}" for name, reason in refusals.items()]
    lines.append(f"over 1.0: {', '.join(over) or 'none'}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", nargs="+", choices=sorted(ARCHS), default=list(ARCHS))
    parser.add_argument(
        "--precision", nargs="+", choices=("fp32", "int4"), default=["fp32", "int4"]
    )
    parser.add_argument("--rounds", type=int, default=5, help="generation rounds (>= 5)")
    parser.add_argument(
        "--processes",
        type=int,
        default=0,
        help="time --rounds rounds in each of this many fresh processes (0: in this one)",
    )
    parser.add_argument("--profile", action="store_true", help="ORT profile of each, by op type")
    parser.add_argument("--workdir", type=pathlib.Path, help="keep the folders here")
    parser.add_argument(
        "--keep-exports",
        action="store_true",
        help="use the exported folders (and refusals) already in --workdir as they are",
    )
    parser.add_argument("--export-only", action="store_true", help="no generation rounds")
    args = parser.parse_args(argv)

    work = args.workdir or pathlib.Path(tempfile.mkdtemp(prefix="bench_genai_zoo-"))
    work.mkdir(parents=True, exist_ok=True)
    refusals: dict[str, str] = {}
    cases: list[Case] = []
    for name in args.arch:
        probe = builder_probe(work, name, args.keep_exports)
        if isinstance(probe, str):
            refusals[name] = probe
            print(f"builder refused {name}: {probe}", flush=True)
            continue
        for precision in args.precision:
            case = run_case(work, name, precision, args, probe if precision == "fp32" else None)
            if case is not None:
                cases.append(case)
    print(summary(cases, refusals))
    (work / "summary.json").write_text(
        json.dumps(
            {
                "refusals": refusals,
                "cases": [dataclasses.asdict(case) for case in cases],
            },
            indent=1,
        )
    )
    if args.workdir is None:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
