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
   external data (with fsync). Reported: seconds, GB/s, and that against the disk's own
   sequential write speed measured in the same run (a file of the same size, 64 MiB writes,
   fsync; the better of a run before and one after the save); and the subprocess's peak RSS
   (``VmHWM``), whole process and growth during the
   save. The output and the disk test file are deleted afterwards; the shard cache is kept.

Targets (issue 15): lower >= 5x faster than the stock exporter at 7B, save >= 80% of the disk's
write speed, peak RSS of the save <= 2 GB.

Usage:  python bench/bench_scale.py [--layers N] [--weights] [--cache DIR] [--no-stock]
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

import torch  # noqa: E402
import transformers  # noqa: E402

import irkit  # noqa: E402

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


def _disk_write_speed(path: pathlib.Path, nbytes: int) -> float:
    """GB/s of plain sequential 64 MiB writes of ``nbytes`` + fsync."""
    block = memoryview(os.urandom(64 << 20))
    t0 = time.perf_counter()
    with open(path, "wb", buffering=0) as f:
        left = nbytes
        while left > 0:
            left -= f.write(block[: min(left, len(block))])
        os.fsync(f.fileno())
    seconds = time.perf_counter() - t0
    path.unlink()
    return nbytes / seconds / 1e9


SAVE = """
import json, sys, time
import irkit

def peak_rss():  # VmHWM: this process's own peak (ru_maxrss carries the parent's over exec)
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024

graph, out, folder, extra = sys.argv[1:5]
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
    return sum(p.stat().st_size for p in paths) / seconds / 1e9


def _save(graph: pathlib.Path, out_dir: pathlib.Path, folder: pathlib.Path, extra: pathlib.Path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = out_dir / "model.onnx"
    result = subprocess.run(
        [sys.executable, "-c", SAVE, str(graph), str(out), str(folder), str(extra)],
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


def _save_figures(model, layers: int, cache: pathlib.Path) -> None:
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
    write_1 = _disk_write_speed(out_dir / "disk_test.bin", total)
    _drop_cache(shards)
    read = _read_speed(shards)
    _drop_cache(shards)
    copy = _copy_speed(shards, out_dir)
    _drop_cache(shards)
    cold = _save(graph, out_dir, folder, extra)
    _read_speed(shards)  # into the page cache
    warm = _save(graph, out_dir, folder, extra)
    write_2 = _disk_write_speed(out_dir / "disk_test.bin", total)
    disk = max(write_1, write_2)
    print(f"  {total / 1e9:.2f} GB of weights in {len(shards)} shards; references, same run:")
    print(
        f"  disk: sequential write + fsync     {disk:6.2f} GB/s  (runs: {write_1:.2f}, {write_2:.2f})"
    )
    print(f"  disk: sequential read (cold)       {read:6.2f} GB/s")
    print(f"  copy: shutil.copyfile + fsync      {copy:6.2f} GB/s  (source read from the disk)")
    for label, m in (("checkpoint on disk (cold)", cold), ("checkpoint in page cache", warm)):
        print(
            f"  irkit.save, {label:26} {m['seconds']:7.1f} s  {m['speed']:.2f} GB/s = "
            f"{100 * m['speed'] / disk:3.0f}% of disk write, {100 * m['speed'] / copy:3.0f}% of copy;"
            f" peak RSS {m['peak'] / 2**30:.2f} GiB"
        )
    print(
        f"  (peak RSS = VmHWM of the save's process: {cold['before'] / 2**30:.2f} GiB before the "
        f"save; torch imported: {cold['torch']})"
    )
    shutil.rmtree(out_dir)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=32, help="decoder layers (7B: 32)")
    parser.add_argument("--weights", action="store_true", help="also stream random fp16 weights")
    parser.add_argument("--cache", type=pathlib.Path, default=pathlib.Path("/work/scale-cache"))
    parser.add_argument("--no-stock", action="store_true", help="skip torch.onnx.export")
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    model = _lower_figures(args.layers, stock=not args.no_stock)
    if args.weights:
        _save_figures(model, args.layers, args.cache)


if __name__ == "__main__":
    main()
