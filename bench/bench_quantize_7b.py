"""Benchmark: a Llama-2-7B-shaped checkpoint quantized to int4 while it streams, peak RSS.

1. Random fp16 weights with Llama-2-7B's shapes (``--layers``, default 32: the whole 7B) are
   written as ``save_pretrained`` lays them out (``model-0000k-of-0000n.safetensors`` + index),
   tensor by tensor in 16 MiB pieces (never all in memory), under ``--cache`` (kept between
   runs; 13.5 GB for 32 layers: check ``df -h`` first).
2. ``LlamaForCausalLM`` with those shapes is built on ``meta`` (float32), exported, lowered
   (``irkit.lower``) and quantized (``irkit.quantize(model, bits=4)``: every Linear becomes
   ``MatMulNBits`` whose packed weight, scales and zero points are derived tensors over the
   checkpoint's tensors); the weightless graph is saved.
3. A fresh subprocess (no torch) loads the graph and saves it with ``weights=<folder>``: each
   quantized weight is read, converted to float32, packed and written one at a time. Reported:
   its wall time, the bytes written, and its peak RSS (``VmHWM``) whole and growth during the
   save. Target (issue 24): peak RSS < 2 GB.
4. With ``--builder``: the wall time of the same job against onnxruntime-genai's model builder
   (``-p int4 -e cpu``) on a smaller Llama that fits in memory for both (``--small``, random
   weights from ``save_pretrained``): irkit = meta export + lower + quantize + streamed save from
   the same folder (one process, as a user runs it), builder = its whole command. Median of
   ``--runs`` interleaved runs with min/max, and the ratio builder / irkit (higher is better for
   irkit). The builder's model also fuses attention (GroupQueryAttention) and writes a genai
   folder; irkit's is the lowered graph: the figure compares the cost of getting int4 weights.

Projection (used by the suite's 7B-slice test, ``tests/quantize/test_streamed.py``): a streamed
save holds one tensor at a time, so its peak is ``base(L) + W``: ``base(L)``, the process with
the loaded graph, grows linearly with the layer count ``L`` (``base(32) = base(2) + 30 ×
(base(2) - base(1))``), and ``W``, the working set of the largest tensor, is the same for the
slice and the whole 7B when the slice keeps the 32000-token vocabulary (the lm_head, 32000 ×
4096, is the largest tensor of both).

Usage:  python bench/bench_quantize_7b.py [--layers N] [--cache DIR] [--builder] [--runs N]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import pathlib
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent

LLAMA2_7B = dict(
    vocab_size=32000,
    hidden_size=4096,
    intermediate_size=11008,
    num_attention_heads=32,
    num_key_value_heads=32,
    max_position_embeddings=4096,
    rms_norm_eps=1e-5,
)
SMALL = dict(
    vocab_size=32000,
    hidden_size=1024,
    intermediate_size=2816,
    num_attention_heads=16,
    num_key_value_heads=4,
    max_position_embeddings=2048,
    rms_norm_eps=1e-5,
)
SHARD_BYTES = 2 * 10**9
_PIECE = 1 << 23  # elements per random piece written


def llama_shapes(layers: int, config: dict = LLAMA2_7B) -> list[tuple[str, tuple[int, ...]]]:
    """The state_dict names and shapes of ``LlamaForCausalLM`` (untied), in save order."""
    h, i, v = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    kv = h // config["num_attention_heads"] * config["num_key_value_heads"]
    specs: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (v, h))]
    for n in range(layers):
        p = f"model.layers.{n}."
        specs += [
            (p + "self_attn.q_proj.weight", (h, h)),
            (p + "self_attn.k_proj.weight", (kv, h)),
            (p + "self_attn.v_proj.weight", (kv, h)),
            (p + "self_attn.o_proj.weight", (h, h)),
            (p + "mlp.gate_proj.weight", (i, h)),
            (p + "mlp.up_proj.weight", (i, h)),
            (p + "mlp.down_proj.weight", (h, i)),
            (p + "input_layernorm.weight", (h,)),
            (p + "post_attention_layernorm.weight", (h,)),
        ]
    specs += [("model.norm.weight", (h,)), ("lm_head.weight", (v, h))]
    return specs


def write_checkpoint(folder: pathlib.Path, specs: list[tuple[str, tuple[int, ...]]]) -> int:
    """Random fp16 tensors (normal × 0.02, Llama-2-7B's checkpoint dtype) in save_pretrained's sharded layout, written piece
    by piece; kept if the index is there already. Returns the bytes of tensor data."""
    index_path = folder / "model.safetensors.index.json"
    if index_path.is_file():
        return int(json.loads(index_path.read_text())["metadata"]["total_size"])
    folder.mkdir(parents=True, exist_ok=True)
    groups: list[list[tuple[str, tuple[int, ...]]]] = [[]]
    size = 0
    for name, shape in specs:
        nbytes = 2 * int(np.prod(shape))
        if groups[-1] and size + nbytes > SHARD_BYTES:
            groups.append([])
            size = 0
        groups[-1].append((name, shape))
        size += nbytes
    rng = np.random.default_rng(0)
    pool = (rng.standard_normal(2 * _PIECE, dtype=np.float32) * 0.02).astype(np.float16)
    weight_map, total = {}, 0
    for g, group in enumerate(groups):
        file = f"model-{g + 1:05d}-of-{len(groups):05d}.safetensors"
        header: dict[str, object] = {"__metadata__": {"format": "pt"}}
        offset = 0
        for name, shape in group:
            nbytes = 2 * int(np.prod(shape))
            header[name] = {
                "dtype": "F16",
                "shape": list(shape),
                "data_offsets": [offset, offset + nbytes],
            }
            offset += nbytes
        text = json.dumps(header).encode()
        text += b" " * (-len(text) % 8)
        with open(folder / file, "wb") as f:
            f.write(struct.pack("<Q", len(text)) + text)
            for j, (name, shape) in enumerate(group):
                left = int(np.prod(shape))
                k = 0
                while left:
                    count = min(left, _PIECE)
                    start = (j * 7919 + k * 104729 + g) % _PIECE
                    f.write(pool[start : start + count].tobytes())
                    left -= count
                    k += 1
                weight_map[name] = file
        total += offset
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    index_path.write_text(json.dumps(index, indent=2))
    return total


def write_buffers(path: pathlib.Path, config: dict = LLAMA2_7B) -> None:
    """The rotary ``inv_freq`` buffer (non-persistent: save_pretrained leaves it out)."""
    from safetensors.numpy import save_file

    head = config["hidden_size"] // config["num_attention_heads"]
    inv = 1.0 / (10000.0 ** (np.arange(0, head, 2, dtype=np.int64).astype(np.float32) / head))
    save_file({"model.rotary_emb.inv_freq": inv.astype(np.float32)}, str(path))


def quantized_model(layers: int, config: dict = LLAMA2_7B, **options) -> tuple[object, str]:
    """Meta Llama → export → lower → quantize (int4): the weightless model and the report's
    first line."""
    import torch
    import transformers

    import irkit
    from irkit.rules.quantize import QuantizeReport

    cfg = transformers.LlamaConfig(num_hidden_layers=layers, **config)
    with torch.device("meta"):
        module = transformers.LlamaForCausalLM(cfg).eval()
    ids = torch.zeros(1, 8, dtype=torch.long, device="meta")
    ep = torch.export.export(module, (ids,), kwargs={"use_cache": False})
    model = irkit.lower(ep)
    report = QuantizeReport()
    irkit.quantize(model, bits=4, report=report, **options)
    return model, str(report).splitlines()[0]


def quantized_graph(layers: int, out: pathlib.Path, config: dict = LLAMA2_7B, **options) -> str:
    """:func:`quantized_model`, its weightless graph saved to ``out``. Returns the report line."""
    import irkit

    model, line = quantized_model(layers, config, **options)
    irkit.save(model, out)
    return line


SAVE = """
import json, sys, time
import irkit

def peak_rss():  # VmHWM: this process's own peak
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024

graph, out, folder, extra = sys.argv[1:5]
model = irkit.load(graph, load_external_data=False)
before = peak_rss()
t0 = time.perf_counter()
if folder != "-":  # ("-": only the loaded graph's footprint)
    irkit.save(model, out, weights=[folder, extra], external_data=True)
seconds = time.perf_counter() - t0
print(json.dumps({"seconds": seconds, "peak": peak_rss(), "before": before,
                  "torch": "torch" in sys.modules}))
"""


def streamed_save(
    graph: pathlib.Path, out: pathlib.Path, folder: pathlib.Path | str, extra: pathlib.Path
) -> dict:
    """Save ``graph`` with the checkpoint's weights in a fresh process; its figures (with
    ``folder`` ``"-"``: only load the graph, for its footprint)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-c", SAVE, str(graph), str(out), str(folder), str(extra)],
        capture_output=True, text=True, env=env, check=False,
    )  # fmt: skip
    if result.returncode != 0:
        raise RuntimeError(result.stderr[-4000:])
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    figures["written"] = sum(p.stat().st_size for p in out.parent.glob(out.name + "*"))
    return figures


def _gb(n: float) -> str:
    return f"{n / 1e9:.2f} GB"


def _streamed_figures(layers: int, cache: pathlib.Path) -> None:
    folder = cache / f"llama7b-{layers}L-fp16"
    t0 = time.perf_counter()
    total = write_checkpoint(folder, llama_shapes(layers))
    print(
        f"checkpoint {folder}: {_gb(total)} fp16 ({time.perf_counter() - t0:.0f} s to write/find)"
    )
    extra = folder / "extra_buffers.safetensors"
    write_buffers(extra)
    out_dir = cache / "quantized"
    shutil.rmtree(out_dir, ignore_errors=True)
    out_dir.mkdir(parents=True)
    t0 = time.perf_counter()
    line = quantized_graph(layers, out_dir / "graph.onnx")
    print(f"meta export + lower + quantize ({layers} layers): {time.perf_counter() - t0:.1f} s")
    print(f"  {line}")
    m = streamed_save(out_dir / "graph.onnx", out_dir / "model.onnx", folder, extra)
    print(
        f"streamed int4 save: {m['seconds']:.1f} s, wrote {_gb(m['written'])}, peak RSS "
        f"{_gb(m['peak'])} (before the save {_gb(m['before'])}, growth {_gb(m['peak'] - m['before'])}), "
        f"torch imported: {m['torch']}; target < 2 GB: {'met' if m['peak'] < 2e9 else 'MISSED'}"
    )
    shutil.rmtree(out_dir, ignore_errors=True)


def _irkit_job(folder: pathlib.Path, out_dir: pathlib.Path, layers: int) -> None:
    """What a user runs: meta export, lower, quantize, save streamed from the folder."""
    import irkit

    extra = out_dir / "buffers.safetensors"
    write_buffers(extra, SMALL)
    model, _ = quantized_model(layers, SMALL)
    irkit.save(model, out_dir / "model.onnx", weights=[folder, extra], external_data=True)


IRKIT_JOB = """
import pathlib, sys
sys.path.insert(0, {root!r})
from bench.bench_quantize_7b import _irkit_job
_irkit_job(pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), int(sys.argv[3]))
"""


def _timed_run(args: list[str], env: dict) -> float:
    t0 = time.perf_counter()
    result = subprocess.run(args, capture_output=True, text=True, env=env, check=False)
    if result.returncode != 0:
        raise RuntimeError(result.stderr[-4000:])
    return time.perf_counter() - t0


def _tokenizer(folder: pathlib.Path, vocab: int) -> None:
    """A word-level tokenizer built offline (the builder reads one from the folder)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="t0", pad_token="t0", bos_token="t1", eos_token="t2"
    )
    fast.save_pretrained(folder)


def _builder_figures(layers: int, runs: int) -> None:
    import torch
    import transformers

    work = pathlib.Path(tempfile.mkdtemp(prefix="bench_q7b_"))
    folder = work / "hf"
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(num_hidden_layers=layers, **SMALL)
    transformers.LlamaForCausalLM(cfg).save_pretrained(folder)
    _tokenizer(folder, cfg.vocab_size)
    params = sum(int(np.prod(s)) for _, s in llama_shapes(layers, SMALL))
    print(
        f"\nagainst the genai builder: Llama {layers} layers, hidden {SMALL['hidden_size']}, "
        f"{params / 1e6:.0f} M parameters (fp32 checkpoint), int4 block 32, {runs} runs"
    )
    site = f"{ROOT}:{ROOT / 'tests' / 'site'}"
    env = {**os.environ, "PYTHONPATH": site}
    irkit_cmd = [
        sys.executable,
        "-c",
        IRKIT_JOB.format(root=str(ROOT)),
        str(folder),
        "",
        str(layers),
    ]
    times: dict[str, list[float]] = {"irkit": [], "builder": []}
    for run in range(runs):
        for who in ("irkit", "builder") if run % 2 == 0 else ("builder", "irkit"):
            out = work / f"out-{who}"
            shutil.rmtree(out, ignore_errors=True)
            out.mkdir()
            if who == "irkit":
                irkit_cmd[-2] = str(out)
                times[who].append(_timed_run(irkit_cmd, env))
            else:
                cmd = [
                    sys.executable,
                    "-m",
                    "onnxruntime_genai.models.builder",
                    "-i",
                    str(folder),
                    "-o",
                    str(out),
                    "-p",
                    "int4",
                    "-e",
                    "cpu",
                    "-c",
                    str(work / "cache"),
                ]
                times[who].append(_timed_run(cmd, env))
    for who, values in times.items():
        print(
            f"  {who:8s} median {statistics.median(values):6.1f} s  (min {min(values):.1f}, "
            f"max {max(values):.1f})"
        )
    ratios = [b / i for b, i in zip(times["builder"], times["irkit"], strict=True)]
    print(
        f"  ratio builder/irkit: median {statistics.median(ratios):.2f}x (min {min(ratios):.2f}, "
        f"max {max(ratios):.2f}; higher is better for irkit)"
    )
    shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=32, help="decoder layers (7B: 32)")
    parser.add_argument("--cache", type=pathlib.Path, default=pathlib.Path("/work/scale-cache"))
    parser.add_argument("--builder", action="store_true", help="also time the genai builder")
    parser.add_argument("--small-layers", type=int, default=8, help="layers of the --builder model")
    parser.add_argument("--runs", type=int, default=5, help="interleaved runs for --builder")
    parser.add_argument("--no-7b", action="store_true", help="only the --builder comparison")
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    if not args.no_7b:
        _streamed_figures(args.layers, args.cache)
    if args.builder:
        _builder_figures(args.small_layers, args.runs)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
