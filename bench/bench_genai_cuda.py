"""``irkit export -e cuda`` vs onnxruntime-genai's builder ``-e cuda`` on onnxruntime's CUDA EP.

Per model shape and precision (``fp16``, ``int4``: float16 compute, as the builder's ``-e cuda``
writes), the same Hugging Face folder is exported by both, and both folders run in
``og.Generator`` on the CUDA execution provider: a prompt (``--prompts``, default 128 and 1024
tokens: ``append_tokens``, the prefill), then 128 tokens decoded one ``generate_next_token`` at a
time (greedy; ``min_length`` holds eos off). Rounds are interleaved (irkit, builder, builder,
irkit, …) after a warm-up; each figure is the median [min..max], and the ratio irkit/builder of
the medians (target <= 1.0). One more profiled generation of each folder gives the kernels a
decode step runs per execution provider, and the op types of those not on CUDA (a node that
falls back to the CPU costs two copies between the devices). Correctness on the GPU: each
folder's logits of the last position of a 32-token prompt against transformers' float32 forward
on the same folder (computed by ``build``, shipped as ``reference-<shape>.npy``), and against
the same folder run on onnxruntime's CPU: max |diff| / max |logit| (int4 against transformers
measures the quantization, so read it beside the builder's). (Greedy ids are printed too, irkit's against the builder's; the tiled weights make
near-ties between tokens, so float16 rounding can flip one: the logits check is the measure.)

Shapes (``--shapes``; real models' shapes, not their weights):

- ``llama1b``: Llama-3.2-1B (hidden 2048, intermediate 8192, 16 layers, 32 heads, 8 KV heads,
  vocab 128256, tied embeddings);
- ``qwen35``: a Qwen3.5-style hybrid of 0.8B (hidden 1024, 24 layers: 3 gated-delta-net layers
  then one attention layer, repeated; 8 heads of 256, 2 KV heads; linear attention 16 key and
  16 value heads of 128; vocab 151936, tied); the builder gets the same weights as
  ``Qwen3_5ForConditionalGeneration`` (see ``bench/bench_genai_states.py``);
- ``lfm2``: LFM2-350M (hidden 1024, 16 layers, 10 conv and 6 attention, 16 heads, 8 KV heads,
  feed-forward 6656, vocab 65536, tied);
- ``ref``: ``bench/bench_genai.py``'s 4-layer reference Llama (to try the bench quickly).

The weights are random blocks of 64×64 tiled over each matrix (scaled to keep the norms): a GPU
runs a kernel in the same time whatever the values, and such folders compress about 1000× so
they can travel to a GPU machine. So the bench has two steps:

- ``build`` (where the project's environment is: irkit, transformers, the builder): the folders,
  the four exports per shape (whole processes, wall time printed) and one ``.tar.zst`` of each
  exported folder (``zstd --long``), with ``manifest.json``, into ``--out``;
- ``run`` (on the GPU machine: only ``onnxruntime-genai-cuda`` and ``zstandard`` or the ``zstd``
  command are needed, no torch): unpack,
  time, profile; prints the tables and writes ``results.json`` (after each case) into ``--out``.
  ``--provider cpu`` runs the same folders on the CPU instead (to try the bench itself here).

Usage: ``python bench/bench_genai_cuda.py build --out DIR [--shapes …] [--workdir W]`` then
``python bench/bench_genai_cuda.py run --models DIR --out OUT [--rounds 5] [--prompts 128
1024]`` (run with ``PYTHONPATH=$PWD``). Figures: docs/gpu.md.

``count`` (no GPU: a kernel per node, so the node counts predict a decode step's launches;
constant expressions, which onnxruntime folds at load, counted apart):
small 4-layer configs of the three shapes (``ref``: the reference Llama; ``lfm2`` and
``qwen35``: ``bench/bench_genai_states.py``'s ``make_config``) exported by both with ``-e
cuda``, and the op histograms of their ``model.onnx`` with every local function inlined, side by
side (``python bench/bench_genai_cuda.py count [--precisions int4 fp16] [--shapes …]``).
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import json
import math
import pathlib
import shutil
import statistics
import subprocess
import sys
import tarfile
import time
import traceback
from collections.abc import Callable, Sequence
from subprocess import PIPE
from typing import Any

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import bench_genai as bg
import bench_genai_states as bgs

PRECISIONS = ("int4", "fp16")
KINDS = ("irkit", "builder")
BLOCK = 64
WINDOW_LOG = 27  # zstd's window: 128 MiB
CHECK_PROMPT = 32  # prompt of the logits check


def _llama1b() -> Any:
    import transformers

    return transformers.LlamaConfig(
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        vocab_size=128256,
        max_position_embeddings=4096,
        rope_theta=500000.0,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        tie_word_embeddings=True,
    )


def _qwen35() -> Any:
    import transformers

    return transformers.Qwen3_5TextConfig(
        hidden_size=1024,
        intermediate_size=3584,
        num_hidden_layers=24,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=256,
        layer_types=(["linear_attention"] * 3 + ["full_attention"]) * 6,
        linear_num_key_heads=16,
        linear_num_value_heads=16,
        linear_key_head_dim=128,
        linear_value_head_dim=128,
        vocab_size=151936,
        max_position_embeddings=4096,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        tie_word_embeddings=True,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 10000000.0,
            "partial_rotary_factor": 0.25,
            "mrope_section": [11, 11, 10],
            "mrope_interleaved": True,
        },
    )


def _lfm2() -> Any:
    import transformers

    attention = {2, 5, 8, 10, 12, 14}
    return transformers.Lfm2Config(
        hidden_size=1024,
        intermediate_size=6656,
        num_hidden_layers=16,
        num_attention_heads=16,
        num_key_value_heads=8,
        layer_types=["full_attention" if i in attention else "conv" for i in range(16)],
        block_ff_dim=6656,
        block_auto_adjust_ff_dim=False,
        vocab_size=65536,
        max_position_embeddings=4096,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        tie_word_embeddings=True,
    )


def _ref() -> Any:
    return bg.llama_config(bg.SIZES["ref"])


#: Shape name → (its config, the architecture the builder is given or None: the folder's own).
SHAPES: dict[str, tuple[Callable[[], Any], str | None]] = {
    "llama1b": (_llama1b, None),
    "ref": (_ref, None),
    "qwen35": (_qwen35, bgs.QWEN35_BUILDER_ARCH),
    "lfm2": (_lfm2, None),
}


def tile_weights(model: Any) -> None:
    """Every weight of two or more dims becomes its first 64×64 block tiled over it (as a
    matrix of its first dim by the rest), divided by the square root of the tile count."""
    import torch

    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.ndim < 2:
                continue
            flat = parameter.view(parameter.shape[0], -1)
            rows, cols = flat.shape
            block = flat[: min(rows, BLOCK), : min(cols, BLOCK)].clone()
            reps = (-(-rows // block.shape[0]), -(-cols // block.shape[1]))
            flat.copy_(block.repeat(*reps)[:rows, :cols] / math.sqrt(reps[0] * reps[1]))


def reference_logits(folder: pathlib.Path, prompt: Sequence[int]) -> Any:
    """transformers' float32 logits of the last prompt position (the correctness anchor)."""
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    with torch.no_grad():
        logits = model.eval()(torch.tensor([list(prompt)])).logits
    return logits[0, -1].numpy()


def last_logits(folder: pathlib.Path, prompt: Sequence[int], cpu: bool = False) -> Any:
    """genai's float32 logits of the last position of ``prompt`` (``folder`` on its own
    execution provider, or on the CPU)."""
    import onnxruntime_genai as og

    config = og.Config(str(folder))
    if cpu:
        config.clear_providers()
    model = og.Model(config)
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(prompt) + 1)
    generator = og.Generator(model, params)
    generator.append_tokens(list(prompt))
    logits = np.asarray(generator.get_output("logits"), dtype=np.float32)
    return logits.reshape(-1, logits.shape[-1])[-1]


def relative_error(got: Any, reference: Any) -> float:
    """max |``got`` − ``reference``| / max |``reference``|."""
    return float(np.abs(got - reference).max() / np.abs(reference).max())


def _pack(folder: pathlib.Path, archive: pathlib.Path) -> None:
    """``folder`` as a zstd-compressed tar (the ``zstd`` command, a 128 MiB window: the tiled
    weights repeat every 64 rows)."""
    tar = subprocess.Popen(["tar", "-cf", "-", "-C", str(folder.parent), folder.name], stdout=PIPE)
    subprocess.run(
        ["zstd", "-q", "-f", "-T0", "-3", f"--long={WINDOW_LOG}", "-o", str(archive)],
        stdin=tar.stdout,
        check=True,
    )
    if tar.wait() != 0:
        sys.exit(f"tar of {folder} failed")


def build(
    out: pathlib.Path, work: pathlib.Path, shapes: Sequence[str], kinds: Sequence[str] = KINDS
) -> None:
    """The folders, the exports (of ``kinds``; the others' kept from an earlier build into
    ``out``) and the archives of ``shapes`` (see the module docstring)."""
    out.mkdir(parents=True, exist_ok=True)
    manifest_path = out / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else []
    for shape in shapes:
        make, architecture = SHAPES[shape]
        folder = work / f"hf-{shape}"
        if not (folder / "config.json").exists():
            t0 = time.perf_counter()
            bg.save_folder(folder, make(), edit=tile_weights)
            print(f"{shape}: folder in {time.perf_counter() - t0:.0f} s", flush=True)
        builder_folder = bgs.builder_view(folder, architecture) if architecture else folder
        vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
        reference = out / f"reference-{shape}.npy"
        if not reference.exists():
            np.save(reference, reference_logits(folder, bg.make_prompt(vocab, CHECK_PROMPT)))
        for precision in PRECISIONS:
            earlier = [e for e in manifest if (e["shape"], e["precision"]) == (shape, precision)]
            entry: dict[str, Any] = {
                **(earlier[0] if earlier else {}),
                "shape": shape,
                "precision": precision,
                "vocab": vocab,
                "reference": reference.name,
            }
            for kind in kinds:
                name = f"{kind}-{shape}-{precision}"
                source = folder if kind == "irkit" else builder_folder
                try:
                    wall, rss = bg.run_export(
                        kind, source, work / name, precision, "ort", provider="cuda"
                    )
                except bg.ExportFailed as error:
                    entry[kind] = {"refused": error.reason()}
                    print(f"{name}: FAILED: {error.reason()}", flush=True)
                    continue
                _pack(work / name, out / f"{name}.tar.zst")
                entry[kind] = {"archive": f"{name}.tar.zst", "export_s": wall, "rss": rss}
                size = (out / f"{name}.tar.zst").stat().st_size
                print(f"{name}: {wall:.0f} s, {rss / 1e9:.1f} GB RSS; {size / 1e6:.1f} MB packed")
            manifest = [e for e in manifest if (e["shape"], e["precision"]) != (shape, precision)]
            manifest.append(entry)
            manifest_path.write_text(json.dumps(manifest, indent=2))


def _unpack_one(archive: pathlib.Path, into: pathlib.Path) -> None:
    """Extract one :func:`_pack` archive with the ``zstandard`` module (a GPU machine may have
    no ``zstd`` command), else the command."""
    try:
        import zstandard
    except ImportError:
        zstd = subprocess.Popen(["zstd", "-dcq", f"--long={WINDOW_LOG}", str(archive)], stdout=PIPE)
        subprocess.run(["tar", "-xf", "-", "-C", str(into)], stdin=zstd.stdout, check=True)
        if zstd.wait() != 0:
            sys.exit(f"zstd -d of {archive} failed")
        return
    decompressor = zstandard.ZstdDecompressor(max_window_size=2**WINDOW_LOG)
    with (
        archive.open("rb") as raw,
        decompressor.stream_reader(raw) as stream,
        tarfile.open(fileobj=stream, mode="r|") as tar,
    ):
        tar.extractall(into, filter="data")


def _unpack(archives: Sequence[pathlib.Path], into: pathlib.Path) -> None:
    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(lambda archive: _unpack_one(archive, into), archives))


def _set_provider(folder: pathlib.Path, provider: str) -> None:
    """``genai_config.json``'s provider options: CUDA's as exported, or none (the CPU)."""
    path = folder / "genai_config.json"
    config = json.loads(path.read_text())
    options = config["model"]["decoder"].setdefault("session_options", {})
    if provider == "cpu":
        options["provider_options"] = []
    path.write_text(json.dumps(config, indent=2))


def placement(events: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Kernels of the first decode step per execution provider, and the op types not on CUDA."""
    starts = sorted(e["ts"] for e in events if e.get("name") == "model_run")
    per_provider: collections.Counter[str] = collections.Counter()
    elsewhere: collections.Counter[str] = collections.Counter()
    if len(starts) < 2:
        return {"providers": {}, "not_cuda": {}}
    first, end = starts[1], (starts[2] if len(starts) > 2 else math.inf)
    for event in events:
        name = str(event.get("name", ""))
        if event.get("cat") != "Node" or not name.endswith("_kernel_time"):
            continue
        if not first <= event["ts"] < end:
            continue
        args = event.get("args", {})
        provider = str(args.get("provider", "?"))
        per_provider[provider] += 1
        if provider != "CUDAExecutionProvider":
            elsewhere[str(args.get("op_name", "?"))] += 1
    return {"providers": dict(per_provider), "not_cuda": dict(elsewhere)}


def _median_ms(values: Sequence[float]) -> str:
    return (
        f"{statistics.median(values) * 1e3:.2f} [{min(values) * 1e3:.2f}..{max(values) * 1e3:.2f}]"
    )


def run_case(
    entry: dict[str, Any],
    folders: dict[str, pathlib.Path],
    prompts: Sequence[int],
    rounds: int,
    references: Any = None,
) -> dict[str, Any]:
    """Time, check (against ``references``: :func:`reference_logits`) and profile one shape and
    precision; prints its lines, returns its figures."""
    import onnxruntime_genai as og

    kinds = [kind for kind in KINDS if kind in folders]
    result: dict[str, Any] = {"shape": entry["shape"], "precision": entry["precision"]}
    t0 = time.perf_counter()
    models = {kind: og.Model(str(folders[kind])) for kind in kinds}
    result["load_s"] = time.perf_counter() - t0
    label = f"{entry['shape']} {entry['precision']}"
    for length in prompts:
        prompt = bg.make_prompt(entry["vocab"], length)
        figures = {kind: bg.Figures() for kind in kinds}
        ids = bg.generation_rounds(models, prompt, rounds, figures)
        row: dict[str, Any] = {}
        for kind in kinds:
            row[kind] = {"prefill": figures[kind].prefill, "per_token": figures[kind].per_token}
            print(
                f"{label} prompt {length} {kind:8} prefill {_median_ms(figures[kind].prefill)} ms"
                f", per token {_median_ms(figures[kind].per_token)} ms",
                flush=True,
            )
        if len(kinds) == 2:
            for field in ("prefill", "per_token"):
                a, b = (statistics.median(getattr(figures[k], field)) for k in kinds)
                row[f"{field}_ratio"] = a / b
            row["ids"] = bgs.compare_ids(ids["irkit"], ids["builder"])
            print(
                f"{label} prompt {length} ratio irkit/builder: prefill "
                f"{row['prefill_ratio']:.2f}, per token {row['per_token_ratio']:.2f}; greedy ids "
                f"{row['ids']}",
                flush=True,
            )
        result[f"prompt_{length}"] = row
    del models
    if references is not None:
        prompt = bg.make_prompt(entry["vocab"], CHECK_PROMPT)
        for kind in kinds:
            here = last_logits(folders[kind], prompt)
            error = relative_error(here, references)
            try:
                cpu: float | str = relative_error(
                    here, last_logits(folders[kind], prompt, cpu=True)
                )
            except RuntimeError as refused:  # (a CUDA-only op: the builder's LFM2 GQA q/k norm)
                cpu = str(refused).splitlines()[-1]
            result[f"logits_error_{kind}"] = error
            result[f"logits_vs_cpu_{kind}"] = cpu
            shown = f"{cpu:.2e}" if isinstance(cpu, float) else f"refused ({cpu})"
            print(
                f"{label} {kind} logits (prompt {CHECK_PROMPT}, last position), max |diff| / "
                f"max |logit|: vs transformers float32 {error:.2e}, vs the same folder on "
                f"onnxruntime's CPU {shown}",
                flush=True,
            )
    for kind in kinds:
        events = bgs.profiled_events(folders[kind], bg.make_prompt(entry["vocab"]), threads=None)
        result[f"placement_{kind}"] = placement(events)
        print(f"{label} {kind} decode step kernels: {result[f'placement_{kind}']}", flush=True)
    return result


def run(
    models: pathlib.Path, out: pathlib.Path, prompts: Sequence[int], rounds: int, provider: str
) -> None:
    """Unpack ``models``' archives, then :func:`run_case` for each manifest entry."""
    import onnxruntime_genai as og

    out.mkdir(parents=True, exist_ok=True)
    manifest = json.loads((models / "manifest.json").read_text())
    work = out / "folders" if provider == "cpu" else pathlib.Path("/tmp/bench_genai_cuda")
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    archives = [models / e[k]["archive"] for e in manifest for k in KINDS if "archive" in e[k]]
    _unpack(archives, work)
    print(f"unpacked {len(archives)} folders in {time.perf_counter() - t0:.0f} s", flush=True)
    print(f"onnxruntime-genai {og.__version__}, provider {provider}", flush=True)
    results: list[dict[str, Any]] = []
    for entry in manifest:
        folders = {
            kind: work / entry[kind]["archive"].removesuffix(".tar.zst")
            for kind in KINDS
            if "archive" in entry[kind]
        }
        for folder in folders.values():
            _set_provider(folder, provider)
        try:
            reference = models / entry["reference"] if "reference" in entry else None
            result = run_case(
                entry,
                folders,
                prompts,
                rounds,
                np.load(reference) if reference is not None and reference.exists() else None,
            )
        except (Exception, SystemExit) as error:  # a bench: report the case, run the next
            traceback.print_exc()
            result = {
                "shape": entry["shape"],
                "precision": entry["precision"],
                "error": repr(error),
            }
        result["refused"] = {k: entry[k]["refused"] for k in KINDS if "refused" in entry[k]}
        results.append(result)
        (out / "results.json").write_text(json.dumps(results, indent=2))


#: ``count``'s configs: 4 layers of each shape (the layer mix of the real ones).
COUNT_SHAPES: dict[str, tuple[Callable[[], Any], str | None]] = {
    "ref": (_ref, None),
    "lfm2": (lambda: bgs.make_config("lfm2"), None),
    "qwen35": (lambda: bgs.make_config("qwen35"), bgs.QWEN35_BUILDER_ARCH),
}


def op_histogram(path: pathlib.Path) -> tuple[collections.Counter[str], int]:
    """The op types of ``path``'s graph with every local function inlined (no weights read),
    less the constant expressions (nodes reading only initializers and constants: onnxruntime
    folds them at load), and how many of those there were."""
    import onnx
    import onnx.inliner

    model = onnx.inliner.inline_local_functions(onnx.load(str(path), load_external_data=False))
    constant = {i.name for i in model.graph.initializer} | {""}
    ops: collections.Counter[str] = collections.Counter()
    folded = 0
    for node in model.graph.node:
        if all(name in constant for name in node.input):
            constant.update(node.output)
            folded += 1
        else:
            ops[node.op_type] += 1
    return ops, folded


def count(work: pathlib.Path, shapes: Sequence[str], precisions: Sequence[str]) -> None:
    """Print irkit's and the builder's ``-e cuda`` op histograms per shape and precision."""
    for shape in shapes:
        make, architecture = COUNT_SHAPES[shape]
        folder = work / f"count-{shape}"
        if not (folder / "config.json").exists():
            bg.save_folder(folder, make())
        builder_folder = bgs.builder_view(folder, architecture) if architecture else folder
        for precision in precisions:
            counts: dict[str, collections.Counter[str]] = {}
            folded: dict[str, int] = {}
            for kind in KINDS:
                out = work / f"count-{kind}-{shape}-{precision}"
                source = folder if kind == "irkit" else builder_folder
                try:
                    bg.run_export(kind, source, out, precision, "ort", provider="cuda")
                except bg.ExportFailed as error:
                    print(f"{shape} {precision} {kind}: FAILED: {error.reason()}", flush=True)
                    continue
                counts[kind], folded[kind] = op_histogram(out / "model.onnx")
            ops = sorted(
                set().union(*counts.values()), key=lambda o: (-counts.get("irkit", {}).get(o, 0), o)
            )
            totals = "  ".join(f"{k} {sum(c.values())}" for k, c in counts.items())
            constants = ", ".join(f"{k} {n}" for k, n in folded.items())
            print(f"\n{shape} {precision}: nodes {totals} (+ constant: {constants})", flush=True)
            for op in ops:
                row = [counts[k].get(op, 0) for k in counts]
                mark = "" if len(set(row)) == 1 else "  *"
                print(f"  {op:36}" + "".join(f"{n:7d}" for n in row) + mark, flush=True)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="step", required=True)
    b = sub.add_parser("build", help="folders, exports and archives")
    b.add_argument("--out", type=pathlib.Path, required=True, help="where the archives go")
    b.add_argument(
        "--shapes", nargs="+", choices=sorted(SHAPES), default=["llama1b", "qwen35", "lfm2"]
    )
    b.add_argument("--workdir", type=pathlib.Path, default=pathlib.Path("bench-cuda-work"))
    b.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS), help="exported")
    r = sub.add_parser("run", help="time the archives' folders")
    r.add_argument("--models", type=pathlib.Path, required=True, help="build's --out")
    r.add_argument("--out", type=pathlib.Path, required=True, help="where results.json goes")
    r.add_argument("--prompts", type=int, nargs="+", default=[bg.PROMPT, 1024])
    r.add_argument("--rounds", type=int, default=5)
    r.add_argument("--provider", choices=("cuda", "cpu"), default="cuda")
    c = sub.add_parser("count", help="inlined op histograms of small -e cuda exports")
    c.add_argument("--shapes", nargs="+", choices=sorted(COUNT_SHAPES), default=list(COUNT_SHAPES))
    c.add_argument("--precisions", nargs="+", choices=PRECISIONS, default=list(PRECISIONS))
    c.add_argument("--workdir", type=pathlib.Path, default=pathlib.Path("bench-cuda-count"))
    args = parser.parse_args(argv)
    if args.step == "count":
        args.workdir.mkdir(parents=True, exist_ok=True)
        count(args.workdir, args.shapes, args.precisions)
    elif args.step == "build":
        args.workdir.mkdir(parents=True, exist_ok=True)
        build(args.out, args.workdir, args.shapes, args.kinds)
    else:
        run(args.models, args.out, args.prompts, args.rounds, args.provider)
    shutil.rmtree(pathlib.Path("/tmp/bench_genai_cuda"), ignore_errors=True)


if __name__ == "__main__":
    main()
