"""Peak RSS of ``irkit export`` on a whole 7B-shaped checkpoint (issue 23 item 5).

A Llama-2-7B-shaped folder (hidden 4096, intermediate 11008, 32 layers, 32 heads, vocab 32000;
``--layers``/``--vocab`` make a slice) is written shard by shard straight to safetensors, one
layer per shard, random fp16 weights (as 7B checkpoints ship): at most one layer is ever in this
process's memory, never the model. Then ``irkit export`` runs in a child process (fp32 output:
every tensor converted fp16 → fp32 while streamed) and reports its own peak resident set
(``VmHWM`` of ``/proc/self/status``: that process alone, from its exec). The target is a peak
under 2 GB.

The projection from a slice: the peak is the imports and the traced graph (grows slowly with the
layer count) plus one tensor being converted, its fp16 and fp32 copies (6 bytes per element of
the largest tensor, the embedding or ``lm_head``)::

    peak(7B) ≈ peak(slice) − 6 × largest(slice) + 6 × largest(7B)

``df`` is checked first: the folder needs 13.5 GB (fp16) and the export 27 GB (fp32); with less
free space, pass ``--layers`` and read the projection.

Usage: ``python bench/bench_export_7b.py [--layers 32] [--vocab 32000] [--workdir DIR] [--keep]
[--json]`` (run with ``PYTHONPATH=$PWD``).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[1]
HIDDEN, INTERMEDIATE, HEADS = 4096, 11008, 32
LIMIT_BYTES = 2 * 10**9
_CHILD = """
import sys
from irkit.cli import main
rc = main(sys.argv[1:])
for line in open("/proc/self/status"):
    if line.startswith("VmHWM:"):
        sys.stderr.write(f"VMHWM {int(line.split()[1]) * 1024}\\n")
sys.exit(rc)
"""


def llama_7b_config(layers: int, vocab: int) -> dict[str, Any]:
    """Llama-2-7B's ``config.json`` (``layers`` decoder layers, ``vocab`` tokens)."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": layers,
        "num_attention_heads": HEADS,
        "num_key_value_heads": HEADS,
        "vocab_size": vocab,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": "float16",
    }


def layer_shapes(layer: int) -> dict[str, tuple[int, ...]]:
    """The tensors of decoder layer ``layer``."""
    p = f"model.layers.{layer}."
    return {
        p + "input_layernorm.weight": (HIDDEN,),
        p + "post_attention_layernorm.weight": (HIDDEN,),
        **{p + f"self_attn.{n}_proj.weight": (HIDDEN, HIDDEN) for n in ("q", "k", "v", "o")},
        p + "mlp.gate_proj.weight": (INTERMEDIATE, HIDDEN),
        p + "mlp.up_proj.weight": (INTERMEDIATE, HIDDEN),
        p + "mlp.down_proj.weight": (HIDDEN, INTERMEDIATE),
    }


def write_checkpoint(folder: pathlib.Path, layers: int, vocab: int) -> int:
    """Write the folder shard by shard (fp16); returns the bytes of weights written."""
    from safetensors.numpy import save_file

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    shards: list[dict[str, tuple[int, ...]]] = [
        {"model.embed_tokens.weight": (vocab, HIDDEN)},
        *(layer_shapes(i) for i in range(layers)),
        {"model.norm.weight": (HIDDEN,), "lm_head.weight": (vocab, HIDDEN)},
    ]
    names = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    weight_map, total = {}, 0
    for shapes, name in zip(shards, names, strict=True):
        tensors = {}
        for key, shape in shapes.items():
            values = rng.random(int(np.prod(shape)), dtype=np.float32)
            tensors[key] = ((values - 0.5) * 0.04).astype(np.float16).reshape(shape)
            del values
            weight_map[key] = name
            total += tensors[key].nbytes
        save_file(tensors, str(folder / name), metadata={"format": "pt"})
        del tensors
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    (folder / "config.json").write_text(json.dumps(llama_7b_config(layers, vocab), indent=2))
    _tokenizer(folder, vocab)
    return total


def _tokenizer(folder: pathlib.Path, vocab: int) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(folder / "tokenizer.json"))


def run_export(folder: pathlib.Path, out: pathlib.Path) -> tuple[int, float, str]:
    """``irkit export`` in a child process: (its peak RSS in bytes, wall seconds, stderr)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO)
    cmd = [sys.executable, "-c", _CHILD, "export", str(folder), "-o", str(out), "--overwrite"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"irkit export failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    peak = next(
        int(line.split()[1]) for line in proc.stderr.splitlines() if line.startswith("VMHWM ")
    )
    return peak, wall, proc.stderr


def projection(peak: int, layers: int, vocab: int) -> int:
    """The 7B peak projected from a slice's (the formula in the module docstring)."""
    largest = max(vocab * HIDDEN, INTERMEDIATE * HIDDEN)
    largest_7b = max(32000 * HIDDEN, INTERMEDIATE * HIDDEN)
    del layers
    return peak - 6 * largest + 6 * largest_7b


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--workdir", type=pathlib.Path)
    parser.add_argument("--keep", action="store_true", help="keep the folders")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)

    work = args.workdir or pathlib.Path(tempfile.mkdtemp(prefix="bench_export_7b-"))
    work.mkdir(parents=True, exist_ok=True)
    params = (
        args.vocab * HIDDEN * 2
        + HIDDEN
        + args.layers * sum(int(np.prod(s)) for s in layer_shapes(0).values())
    )
    need = params * (2 + 4)
    free = shutil.disk_usage(work).free
    if free < need * 1.05:
        sys.exit(
            f"{work}: {free / 1e9:.1f} GB free, the checkpoint and the export need "
            f"{need / 1e9:.1f} GB: pass fewer --layers (the figure is projected)"
        )
    folder, out = work / "hf", work / "onnx"
    try:
        t0 = time.perf_counter()
        weights = write_checkpoint(folder, args.layers, args.vocab)
        made = time.perf_counter() - t0
        peak, wall, stderr = run_export(folder, out)
        written = sum(p.stat().st_size for p in out.iterdir())
    finally:
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)
            shutil.rmtree(out, ignore_errors=True)
    projected = projection(peak, args.layers, args.vocab)
    figures = {
        "layers": args.layers,
        "vocab": args.vocab,
        "parameters": params,
        "checkpoint_bytes": weights,
        "checkpoint_seconds": round(made, 1),
        "output_bytes": written,
        "export_seconds": round(wall, 1),
        "peak_rss_bytes": peak,
        "projected_7b_peak_rss_bytes": projected,
    }
    if args.json:
        print(json.dumps(figures))
        return
    print(
        f"Llama-2-7B-shaped, {args.layers} layers, vocab {args.vocab}: {params / 1e9:.2f} B "
        f"parameters, fp16 shards {weights / 1e9:.1f} GB (written in {made:.0f} s)\n"
        f"irkit export (fp32, {written / 1e9:.1f} GB written): {wall:.0f} s, peak RSS "
        f"{peak / 1e9:.2f} GB ({'ok' if peak < LIMIT_BYTES else 'MISSED'}: < 2 GB)\n"
        f"projected peak RSS for the whole 7B: {projected / 1e9:.2f} GB"
    )
    print(stderr.strip()[-500:])


if __name__ == "__main__":
    main()
