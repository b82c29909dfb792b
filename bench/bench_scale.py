"""Benchmark: a Llama-2-7B-shaped model on the meta device — export, lower, stream the weights.

1. ``LlamaForCausalLM`` with Llama-2-7B's shapes (fp16) is built on ``meta``: no weights exist.
   ``torch.export`` time; ``irkit.lower(ep)`` time (lowering + module functions, as users call
   it) against ``torch.onnx.export(ep, dynamo=True)`` on the same program, both with
   ``optimize=False`` and with the stock exporter's default ``optimize=True``. Both are warmed
   up on a 1-layer model first. Ratio = stock / irkit (higher is better for irkit).
2. With ``--weights``: random fp16 weights are written once, shard by shard, as
   ``save_pretrained`` lays them out (``model-0000k-of-0000n.safetensors`` + index) under
   ``--cache`` (default /work/scale-cache; never all in memory). The weightless graph is saved,
   then a fresh subprocess (no torch) loads it and saves it with ``weights=<folder>`` into
   external data (``alignment=4096``, with fsync), once with the checkpoint evicted from the
   page cache (cold: read from the same disk the output goes to) and once with it cached
   (warm), twice each (the better run is reported, as for the disk references). Reported:
   seconds, GB/s, and that against references measured in the same run:
   - the disk's sequential write speed as issue 15 defines it (a file of the same size, 64 MiB
     writes, one fsync at the end; the better of a run before and one after the saves);
   - the same writes with irkit's rolling write-behind (``sync_file_range``): what the disk
     gives when the page cache does not pile up dirty pages (the better of two runs);
   - the disk's cold sequential read speed, and two plain copies of the shards with fsync:
     ``shutil.copyfile``, and the shards copied whole through irkit's own writer (same chunks,
     read-ahead, write-behind; cold and warm) — the ceiling of a copy on this disk, which a
     cold save, reading and writing the same disk, cannot beat;
   - with ``--previous``: the writer irkit used before (onnx-ir's, one fsync per file), cold
     and warm;
   and the subprocess's peak RSS (``VmHWM``), whole process and growth during the save, and
   (with util-linux ``fincore``) how much of the cached checkpoint the warm save left cached.
   The output and the test files are deleted afterwards; the shard cache is kept.

Targets (issue 15): lower >= 5x faster than the stock exporter at 7B, save >= 80% of the disk's
write speed, peak RSS of the save <= 2 GB.

Usage:  python bench/bench_scale.py [--layers N] [--weights] [--cache DIR] [--no-stock]
                                    [--previous]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import os
import pathlib
import shutil
import subprocess
import sys
import time
import warnings

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import onnx_ir as ir  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402

import irkit  # noqa: E402
from irkit.weights import _checkpoints, _writer  # noqa: E402

UINT8 = ir.DataType.UINT8

LLAMA2_7B = dict(
    vocab_size=32000,
    hidden_size=4096,
    intermediate_size=11008,
    num_attention_heads=32,
    num_key_value_heads=32,
    max_position_embeddings=4096,
    rms_norm_eps=1e-5,
)
SHARD_BYTES = 2 * 10**9  # shards of the random checkpoint (transformers' default is 5 GB)


def _config(layers: int) -> transformers.LlamaConfig:
    return transformers.LlamaConfig(num_hidden_layers=layers, **LLAMA2_7B)


def _meta_program(layers: int) -> tuple[torch.export.ExportedProgram, float]:
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(_config(layers)).to(torch.float16).eval()
    ids = torch.zeros(1, 16, dtype=torch.long, device="meta")
    t0 = time.perf_counter()
    ep = torch.export.export(model, (ids,), kwargs={"use_cache": False})
    return ep, time.perf_counter() - t0


def _timed(fn) -> tuple[object, float]:
    t0 = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - t0


def _stock(ep: torch.export.ExportedProgram, optimize: bool) -> object:
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.onnx.export(ep, dynamo=True, optimize=optimize, verbose=False)


def _lower_figures(layers: int, stock: bool) -> object:
    warm, _ = _meta_program(1)
    irkit.lower(warm)
    if stock:
        _stock(warm, optimize=False)
    ep, t_export = _meta_program(layers)
    params = sum(v.numel() for v in ep.state_dict.values())
    print(f"Llama-2-7B-shaped, {layers} layers, {params / 1e9:.2f} B parameters on meta (fp16)")
    print(
        f"  torch.export                      {t_export:8.2f} s   ({len(ep.graph.nodes)} FX nodes)"
    )
    model, t_irkit = _timed(lambda: irkit.lower(ep))
    print(f"  irkit.lower                       {t_irkit:8.2f} s")
    if stock:
        for optimize in (False, True):
            label = f"  torch.onnx.export(optimize={optimize!s:5})"
            try:
                _, t = _timed(lambda optimize=optimize: _stock(ep, optimize))
            except Exception as exc:  # the stock optimizer reads weights a meta model lacks
                cause = str(exc).splitlines()[0][:100]
                print(f"{label}  fails: {type(exc).__name__}: {cause}")
                continue
            print(f"{label}  {t:8.2f} s   ratio stock/irkit {t / t_irkit:5.1f}x")
    return model


def _write_checkpoint(layers: int, folder: pathlib.Path) -> int:
    """Random fp16 weights in save_pretrained's sharded layout; returns the bytes written."""
    from safetensors.torch import save_file

    index_path = folder / "model.safetensors.index.json"
    if index_path.is_file():
        return int(json.loads(index_path.read_text())["metadata"]["total_size"])
    folder.mkdir(parents=True, exist_ok=True)
    with torch.device("meta"):
        meta = transformers.LlamaForCausalLM(_config(layers)).to(torch.float16)
    specs = [(k, v.shape) for k, v in meta.state_dict().items()]
    groups: list[list[tuple[str, torch.Size]]] = [[]]
    size = 0
    for name, shape in specs:
        nbytes = 2 * shape.numel()
        if groups[-1] and size + nbytes > SHARD_BYTES:
            groups.append([])
            size = 0
        groups[-1].append((name, shape))
        size += nbytes
    # One random block, sliced at varying offsets: random bytes at memcpy speed (drawing 7B
    # normal numbers on 2 cores takes many minutes and measures nothing of interest).
    largest = max(shape.numel() for _, shape in specs)
    generator = torch.Generator().manual_seed(0)
    block = (torch.randn(2 * largest, generator=generator) * 0.02).to(torch.float16)
    weight_map, total = {}, 0
    t0 = time.perf_counter()
    for i, group in enumerate(groups):
        file = f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
        shard = {}
        for j, (name, shape) in enumerate(group):
            start = (j * 7919 + i * 104729) % (largest + 1)
            shard[name] = block[start : start + shape.numel()].clone().view(shape)
        save_file(shard, folder / file, metadata={"format": "pt"})
        total += sum(2 * s.numel() for _, s in group)
        weight_map.update(dict.fromkeys(shard, file))
        del shard
        print(f"  wrote {file} ({time.perf_counter() - t0:.0f} s)", flush=True)
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    index_path.write_text(json.dumps(index, indent=2))
    return total


def _extra_buffers(layers: int, path: pathlib.Path) -> None:
    """Non-persistent buffers save_pretrained leaves out (rotary inv_freq), computed on CPU."""
    from safetensors.torch import save_file

    rotary = transformers.models.llama.modeling_llama.LlamaRotaryEmbedding(_config(layers))
    buffers = {f"model.rotary_emb.{k}": v.to(torch.float16) for k, v in rotary.named_buffers()}
    save_file(buffers, path)  # (the model was cast to fp16 on meta, buffers included)


def _disk_write_speed(path: pathlib.Path, nbytes: int, behind: bool) -> float:
    """GB/s of plain sequential 64 MiB writes of ``nbytes`` + fsync (the issue's reference);
    with ``behind``, the same writes with irkit's rolling write-behind (what the disk does when
    the page cache does not pile up gigabytes of dirty pages first)."""
    block = memoryview(os.urandom(64 << 20))
    t0 = time.perf_counter()
    with open(path, "wb", buffering=0) as f:
        writeback = _writer._WriteBehind(f.fileno(), _writer.WINDOW, _writer.SYNC_FILE_RANGE)
        done = 0
        while done < nbytes:
            done += f.write(block[: min(nbytes - done, len(block))])
            if behind:
                writeback.advance(done)
        os.fsync(f.fileno())
    seconds = time.perf_counter() - t0
    path.unlink()
    os.sync()
    return nbytes / seconds / 1e9


SAVE = """
import json, sys, time
import irkit

def peak_rss():  # VmHWM: this process's own peak (ru_maxrss carries the parent's over exec)
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024

graph, out, folder, extra, previous = sys.argv[1:6]
if previous == "1":  # the writer before irkit/weights/_writer.py: onnx-ir's, then one fsync per file
    import os
    import onnx_ir as ir
    from irkit.weights import _stream

    def write_data_file(tensors, offsets, path):
        ir.external_data.convert_tensors_to_external(
            tensors, str(path.parent), path.name, alignment=4096, align_threshold=4096
        )
        fd = os.open(path, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)

    _stream.write_data_file = write_data_file
model = irkit.load(graph, load_external_data=False)
before = peak_rss()
t0 = time.perf_counter()
irkit.save(model, out, weights=[folder, extra], external_data=True, alignment=4096)
seconds = time.perf_counter() - t0
peak = peak_rss()
print(json.dumps({"seconds": seconds, "peak": peak, "before": before,
                  "torch": "torch" in sys.modules}))
"""


def _shards(folder: pathlib.Path) -> list[pathlib.Path]:
    return sorted(folder.glob("model-*.safetensors"))


def _drop_cache(paths: list[pathlib.Path]) -> None:
    """Evict these (clean) files from the page cache: the next read comes from the disk."""
    os.sync()
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)


def _read_speed(paths: list[pathlib.Path]) -> float:
    """GB/s of sequential 64 MiB reads (also leaves the files in the page cache)."""
    t0 = time.perf_counter()
    for path in paths:
        with open(path, "rb", buffering=0) as f:
            while f.read(64 << 20):
                pass
    return sum(p.stat().st_size for p in paths) / (time.perf_counter() - t0) / 1e9


def _copy_speed(paths: list[pathlib.Path], out_dir: pathlib.Path) -> float:
    """GB/s of ``shutil.copyfile`` (kernel copy) + fsync of the shards: the plain-copy reference."""
    t0 = time.perf_counter()
    copies = []
    for path in paths:
        copy = out_dir / f"copy_{path.name}"
        shutil.copyfile(path, copy)
        fd = os.open(copy, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
        copies.append(copy)
    seconds = time.perf_counter() - t0
    for copy in copies:
        copy.unlink()
    os.sync()
    return sum(p.stat().st_size for p in paths) / seconds / 1e9


def _writer_copy_speed(paths: list[pathlib.Path], out_dir: pathlib.Path) -> float:
    """GB/s of copying the shards whole through irkit's writer (same chunks, read-ahead and
    write-behind as the save, one output file): the copy ceiling of this disk, without any of
    the save's bookkeeping."""
    whole = [
        _checkpoints.FileTensor(p, 0, p.stat().st_size, UINT8, (p.stat().st_size,)) for p in paths
    ]
    offsets = [sum(t.length for t in whole[:i]) for i in range(len(whole))]
    out = out_dir / "copy.bin"
    t0 = time.perf_counter()
    _writer.write_data_file(whole, offsets, out)
    seconds = time.perf_counter() - t0
    out.unlink()
    os.sync()
    return sum(t.length for t in whole) / seconds / 1e9


def _cached_fraction(paths: list[pathlib.Path]) -> float | None:
    """Share of these files' bytes in the page cache (util-linux ``fincore``), or None."""
    if shutil.which("fincore") is None:
        return None
    result = subprocess.run(
        ["fincore", "--bytes", "--noheadings", "--output", "RES", *map(str, paths)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if result.returncode != 0:
        return None
    cached = sum(int(x) for x in result.stdout.split())
    return cached / sum(p.stat().st_size for p in paths)


def _save(graph, out_dir, folder, extra, previous: bool = False) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = out_dir / "model.onnx"
    args = [str(graph), str(out), str(folder), str(extra), "1" if previous else "0"]
    result = subprocess.run(
        [sys.executable, "-c", SAVE, *args],
        capture_output=True, text=True, env=env, check=False,
    )  # fmt: skip
    if result.returncode != 0:
        raise SystemExit(result.stderr)
    m = json.loads(result.stdout.strip().splitlines()[-1])
    m["written"] = sum(p.stat().st_size for p in out_dir.glob("model.onnx*"))
    m["speed"] = m["written"] / m["seconds"] / 1e9
    for path in out_dir.glob("model.onnx*"):
        path.unlink()
    os.sync()
    return m


def _save_figures(model, layers: int, cache: pathlib.Path, previous: bool) -> None:
    folder = cache / f"llama7b-{layers}L-fp16"
    print(f"Weights: {folder}")
    total = _write_checkpoint(layers, folder)
    extra = folder / "extra_buffers.safetensors"
    _extra_buffers(layers, extra)
    shards = _shards(folder)
    out_dir = cache / "out"
    shutil.rmtree(out_dir, ignore_errors=True)
    out_dir.mkdir(parents=True)
    graph = irkit.save(model, out_dir / "graph.onnx")  # weightless: dims and dtypes only
    os.sync()  # the checkpoint's dirty pages must not be flushed during a measurement
    test_file = out_dir / "disk_test.bin"
    ref: dict[str, list[float]] = {k: [] for k in ("write", "behind", "copy_cold", "copy_warm")}
    runs: dict[str, list[dict]] = {"cold": [], "warm": [], "previous cold": [], "previous warm": []}
    cached: dict[str, float | None] = {}

    def cold(key: str, old: bool = False) -> None:
        _drop_cache(shards)
        runs[key].append(_save(graph, out_dir, folder, extra, previous=old))

    def warm(key: str, old: bool = False) -> None:
        _read_speed(shards)  # into the page cache
        cached[f"before {key}"] = _cached_fraction(shards)
        runs[key].append(_save(graph, out_dir, folder, extra, previous=old))
        cached[f"after {key}"] = _cached_fraction(shards)

    ref["write"].append(_disk_write_speed(test_file, total, behind=False))
    ref["behind"].append(_disk_write_speed(test_file, total, behind=True))
    _drop_cache(shards)
    read = _read_speed(shards)
    _drop_cache(shards)
    copy = _copy_speed(shards, out_dir)
    _drop_cache(shards)
    ref["copy_cold"].append(_writer_copy_speed(shards, out_dir))
    cold("cold")
    if previous:
        cold("previous cold", old=True)
    _read_speed(shards)
    ref["copy_warm"].append(_writer_copy_speed(shards, out_dir))
    warm("warm")
    if previous:
        warm("previous warm", old=True)
    cold("cold")  # second runs: each figure is the better of two, as the references
    warm("warm")
    ref["write"].append(_disk_write_speed(test_file, total, behind=False))
    ref["behind"].append(_disk_write_speed(test_file, total, behind=True))
    shutil.rmtree(out_dir)
    _print_save_figures(total, len(shards), ref, read, copy, runs, cached)


def _print_save_figures(total, n_shards, ref, read, copy, runs, cached) -> None:
    def best(values: list[float]) -> str:
        return f"{max(values):6.2f} GB/s  (runs: {', '.join(f'{v:.2f}' for v in values)})"

    disk, behind = max(ref["write"]), max(ref["behind"])
    print(f"  {total / 1e9:.2f} GB of weights in {n_shards} shards; references, same run:")
    print(f"  disk: sequential write + fsync     {best(ref['write'])}  <- issue 15's reference")
    print(f"  disk: same + rolling write-behind  {best(ref['behind'])}")
    print(f"  disk: sequential read (cold)       {read:6.2f} GB/s")
    print(f"  copy: shutil.copyfile + fsync      {copy:6.2f} GB/s  (source read from the disk)")
    print(f"  copy: irkit's writer, whole shards {best(ref['copy_cold'])}  source on disk")
    print(f"  copy: irkit's writer, whole shards {best(ref['copy_warm'])}  source cached")
    print("  irkit.save (better of the runs; % of: disk write / write-behind write / writer copy)")
    for key, ms in runs.items():
        if not ms:
            continue
        m = max(ms, key=lambda m: m["speed"])
        ceiling = max(ref["copy_cold"] if "cold" in key else ref["copy_warm"])
        names = {"cold": "checkpoint on disk (cold)", "warm": "checkpoint in page cache"}
        label = names.get(key) or key.replace(" ", " writer, ")
        speeds = ", ".join(f"{x['speed']:.2f}" for x in ms)
        print(
            f"  {label:26} {m['seconds']:6.1f} s  {m['speed']:.2f} GB/s (runs: {speeds})  "
            f"= {100 * m['speed'] / disk:3.0f}% / {100 * m['speed'] / behind:3.0f}% / "
            f"{100 * m['speed'] / ceiling:3.0f}%;  peak RSS {m['peak'] / 2**30:.2f} GiB"
        )
    for key in ("warm", "previous warm"):
        if cached.get(f"before {key}") is not None and cached.get(f"after {key}") is not None:
            print(
                f"  checkpoint bytes in the page cache, {key} save: "
                f"{100 * cached[f'before {key}']:.0f}% before, {100 * cached[f'after {key}']:.0f}% "
                "after"
            )
    first = runs["cold"][0]
    print(
        f"  (peak RSS = VmHWM of the save's process: {first['before'] / 2**30:.2f} GiB before the "
        f"save; torch imported: {first['torch']})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=32, help="decoder layers (7B: 32)")
    parser.add_argument("--weights", action="store_true", help="also stream random fp16 weights")
    parser.add_argument("--cache", type=pathlib.Path, default=pathlib.Path("/work/scale-cache"))
    parser.add_argument("--no-stock", action="store_true", help="skip torch.onnx.export")
    parser.add_argument(
        "--previous", action="store_true", help="also time the previous writer (onnx-ir's), cold"
    )
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    model = _lower_figures(args.layers, stock=not args.no_stock)
    if args.weights:
        _save_figures(model, args.layers, args.cache, args.previous)


if __name__ == "__main__":
    main()
