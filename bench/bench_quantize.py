"""Quantized decode/prefill vs the onnxruntime-genai builder's int4 / int8 models (issue 24).

In one run, for a Llama-shaped model with random weights (``ref``: hidden 512, 4 layers, 8 heads /
2 KV heads, intermediate 1376, vocab 4000; ``wide``: hidden 1280, intermediate 3456, 20 / 4
heads — 2.5× wider), this builds

- ``irkit int4`` / ``irkit int8``: ``export_causal_lm`` → ``irkit.lower(functions=False)`` →
  ``irkit.optimize("onnx")`` (glue rules, packed q/k/v and gate/up) → ``irkit.quantize`` at the
  builder's block size and accuracy level (read from its model's ``MatMulNBits``), then
  :func:`irkit.rules.decode.quantized_rules` (residual add + RMSNorm →
  ``SkipSimplifiedLayerNormalization``, rotary angles → tables read at the position ids, SiLU →
  ``QuickGelu``, the causal mask → ``Attention(is_causal=1)`` with the padding mask alone;
  ``--no-decode-rules`` leaves them out);
- ``irkit dyn8``: the same float model → ``irkit.quantize(bits=8, activations="dynamic")``
  (``DynamicQuantizeMatMul``, the prefill-fast option), then the same decode rules;
- ``builder int4`` / ``builder int8``: ``python -m onnxruntime_genai.models.builder -p int4|int8
  -e cpu`` on a ``save_pretrained`` folder of the same weights,

and times each with one onnxruntime CPU ``InferenceSession`` harness (the same feeds, the KV
cache as inputs, batch 1) at 1 and 2 intra-op threads: decode@127, decode@511 (one token after
127 / 511 cached) and prefill@128. Rounds interleave every variant; each round gives a ratio
irkit/builder; the table prints the median ratio of >= 5 rounds with its min and max, and the
median milliseconds. It also prints, against the fp32 model (irkit's, which matches eager
PyTorch): max |Δlogit|, cosine and top-1 agreement over a prefill of 128 and a decode step,
at accuracy level 0 and 4; the node count of each model (file, functions inlined, and after
onnxruntime's own graph optimizations) and, from onnxruntime's profiler over decode@127 steps,
the share of kernel time outside ``MatMulNBits``/``DynamicQuantizeMatMul`` and attention
(``Attention``, ``GroupQueryAttention``, ``MultiHeadAttention``) with the top ops. The
profiler slows every node it times, so its kernel sums do not compare models of different node
counts: the wall time of a decode step (decode@127, decode@511; 1 thread) is split instead into
the int4 models' ``MatMulNBits`` alone, their feeds and fetches alone (:func:`floor_models`)
and the rest, each timed unprofiled and interleaved, best of many rounds.

Targets (issue 24): int4 decode <= 0.9x, int4 prefill <= 1.0x, int8 <= 0.9x the builder; nodes
per decode step <= builder + 20%; non-MatMulNBits, non-attention kernels <= 10%. On a busy
machine the figures are indicative: rerun on a quiet one.

Usage: ``PYTHONPATH=$PWD python bench/bench_quantize.py [--sizes ref,wide]
[--rounds 7] [--threads 1,2] [--workdir DIR] [--no-decode-rules] [--top 4] [--no-spin]`` (the
builder runs with the same ``PYTHONPATH``; ``--top`` is the number of glue ops listed per
model; ``--no-spin``: see :func:`session`).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from typing import Any

import numpy as np
import onnx
import onnx.inliner
import onnx_ir as ir
import onnxruntime as ort
import torch

import irkit
from irkit.llm import causal_lm_feeds, export_causal_lm
from irkit.rules.decode import quantized_rules

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from bench_latency import _tokenizer  # (the offline tokenizer the builder copies)

SIZES = {
    "ref": dict(hidden_size=512, intermediate_size=1376, num_attention_heads=8),
    "wide": dict(hidden_size=1280, intermediate_size=3456, num_attention_heads=20),
}
KV_HEADS = {"ref": 2, "wide": 4}
CASES = [("decode@127", 1, 127), ("decode@511", 1, 511), ("prefill@128", 128, 0)]
PAIRS = [("irkit int4", "builder int4"), ("irkit int8", "builder int8")]
MATMUL_OPS = {"MatMulNBits", "DynamicQuantizeMatMul", "MatMulInteger", "MatMul"}
MS = "com.microsoft"
ATTENTION_OPS = {"Attention", "GroupQueryAttention", "MultiHeadAttention"}
MAX_SEQUENCE = 1024  # the export's bound, and the rotary tables' rows


def llama(size: str) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        num_hidden_layers=4,
        num_key_value_heads=KV_HEADS[size],
        vocab_size=4000,
        max_position_embeddings=MAX_SEQUENCE,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        **SIZES[size],
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).eval()


# --- models --------------------------------------------------------------------------------------


def builder(lm: torch.nn.Module, out: pathlib.Path, precision: str) -> pathlib.Path:
    hf = out / "hf"
    if not hf.exists():
        lm.save_pretrained(hf)
        _tokenizer(hf, lm.config.vocab_size)
    target = out / f"builder_{precision}"
    cmd = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(hf)]
    cmd += ["-o", str(target), "-p", precision, "-e", "cpu", "-c", str(out / "cache")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, env=os.environ)
    if proc.returncode != 0:
        raise RuntimeError(f"builder -p {precision} failed: {proc.stderr[-600:]}")
    return target / "model.onnx"


def nbits_settings(path: pathlib.Path) -> tuple[int, int]:
    """``(block_size, accuracy_level)`` of the builder model's MatMulNBits."""
    for node in onnx.load(str(path), load_external_data=False).graph.node:
        if node.op_type == "MatMulNBits":
            attrs = {a.name: a.i for a in node.attribute}
            return attrs["block_size"], attrs.get("accuracy_level", 0)
    raise RuntimeError(f"{path} has no MatMulNBits")


def irkit_float(lm: torch.nn.Module, out: pathlib.Path) -> tuple[pathlib.Path, float]:
    t0 = time.perf_counter()
    exported = export_causal_lm(lm, max_sequence=MAX_SEQUENCE)
    model = irkit.lower(exported.program, functions=False, **exported.lower_kwargs())
    irkit.optimize(model, "onnx")
    path = out / "irkit_fp32.onnx"
    irkit.save(model, path)
    return path, time.perf_counter() - t0


def irkit_quantized(
    source: pathlib.Path, out: pathlib.Path, name: str, decode_rules: bool, **options: Any
) -> pathlib.Path:
    model = ir.load(source)
    if options.pop("dynamic", False):
        irkit.quantize(model, bits=8, activations="dynamic")
    else:
        irkit.quantize(model, **options)
    if decode_rules:
        irkit.optimize(model, rules=quantized_rules(max_positions=MAX_SEQUENCE))
    path = out / f"{name.replace(' ', '_')}.onnx"
    irkit.save(model, path)
    return path


# --- running -------------------------------------------------------------------------------------


def session(
    path: pathlib.Path, threads: int, profile: str | None = None, spin: bool = True
) -> ort.InferenceSession:
    """One CPU session. ``spin=False`` (``--no-spin``, at ``threads > 1``) stops the pool's
    workers spinning between parallel sections and runs: the harness keeps one pool per variant
    alive, and a pool still spinning after its run competes with the next variant's run for
    the cores. onnxruntime's default (and genai's, one session per process) is to spin."""
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    if threads > 1 and not spin:
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if profile:
        opts.enable_profiling = True
        opts.profile_file_prefix = profile
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def feeds_for(sess: ort.InferenceSession, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {i.name: feeds[i.name] for i in sess.get_inputs()}


def timed(
    paths: dict[str, pathlib.Path],
    cases: dict[str, dict[str, np.ndarray]],
    threads: int,
    rounds: int,
    spin: bool = True,
) -> dict[tuple[str, str], list[float]]:
    """``{(variant, case): [ms per round]}``: every round runs every variant on every case."""
    sessions = {name: session(p, threads, spin=spin) for name, p in paths.items()}
    bound = {(n, c): feeds_for(s, f) for n, s in sessions.items() for c, f in cases.items()}
    for (n, _), f in bound.items():
        sessions[n].run(None, f)  # warm-up
    times: dict[tuple[str, str], list[float]] = collections.defaultdict(list)
    for _ in range(rounds):
        for c in cases:
            repeat = 2 if c.startswith("prefill") else 20
            for n, s in sessions.items():
                f = bound[n, c]
                t0 = time.perf_counter()
                for _ in range(repeat):
                    s.run(None, f)
                times[n, c].append((time.perf_counter() - t0) / repeat * 1e3)
    return times


def ratio_line(times: dict, a: str, b: str, case: str) -> str:
    ratios = [x / y for x, y in zip(times[a, case], times[b, case], strict=True)]
    med = statistics.median(ratios)
    return (
        f"{statistics.median(times[a, case]):8.3f} {statistics.median(times[b, case]):8.3f} "
        f"{med:6.2f}x [{min(ratios):.2f}–{max(ratios):.2f}]"
    )


def accuracy(
    path: pathlib.Path, reference: pathlib.Path, cases: dict[str, list[dict[str, np.ndarray]]]
) -> str:
    """Against the fp32 model, over every row of logits of each case's feeds."""
    got_s, ref_s = session(path, 2), session(reference, 2)
    cells = []
    for name, feeds in cases.items():
        got = np.concatenate(
            [got_s.run(["logits"], feeds_for(got_s, f))[0].reshape(-1, 4000) for f in feeds]
        )
        ref = np.concatenate(
            [ref_s.run(["logits"], feeds_for(ref_s, f))[0].reshape(-1, 4000) for f in feeds]
        )
        cos = float(got.ravel() @ ref.ravel() / np.linalg.norm(got) / np.linalg.norm(ref))
        top1 = float((got.argmax(-1) == ref.argmax(-1)).mean())
        cells.append(f"{name}: max|Δ| {np.abs(got - ref).max():.3f} cos {cos:.5f} top1 {top1:.2f}")
    return "; ".join(cells)


def node_counts(path: pathlib.Path, work: pathlib.Path, name: str) -> tuple[int, int]:
    """Nodes in the file (functions inlined) and after onnxruntime's graph optimizations."""
    flat = onnx.inliner.inline_local_functions(onnx.load(str(path)))
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    optimized = work / f"{name.replace(' ', '_')}.ort_optimized.onnx"
    opts.optimized_model_filepath = str(optimized)
    ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    after = len(onnx.load(str(optimized), load_external_data=False).graph.node)
    return len(flat.graph.node), after


def profile_share(
    path: pathlib.Path,
    feeds: dict[str, np.ndarray],
    work: pathlib.Path,
    name: str,
    steps: int = 50,
    top: int = 4,
) -> str:
    """Kernel-time share outside matmuls and attention over ``steps`` decode steps (1 thread)."""
    sess = session(path, 1, profile=str(work / f"prof_{name.replace(' ', '_')}"))
    f = feeds_for(sess, feeds)
    for _ in range(steps):
        sess.run(None, f)
    trace = json.loads(pathlib.Path(sess.end_profiling()).read_text())
    per_op: collections.Counter[str] = collections.Counter()
    for event in trace:
        if event.get("cat") == "Node" and event.get("name", "").endswith("_kernel_time"):
            per_op[event["args"]["op_name"]] += event["dur"]
    total = sum(per_op.values()) or 1
    glue = {k: v for k, v in per_op.items() if k not in MATMUL_OPS | ATTENTION_OPS}
    listed = collections.Counter(glue).most_common(top)
    names = ", ".join(f"{k} {v / total:.0%}" for k, v in listed)
    return f"glue {sum(glue.values()) / total:5.1%} of {total / steps / 1e3:.3f} ms/step (top: {names})"


def floor_models(path: pathlib.Path, work: pathlib.Path, name: str) -> tuple[pathlib.Path, ...]:
    """Two models with ``path``'s inputs and outputs that bound its decode step from below:

    - ``matmuls``: its ``MatMulNBits`` nodes alone, each fed by one random input of its ``K``,
      each output a graph output (the weight bytes a step reads, at the same call count);
    - ``io``: the step's feeds and fetches alone: logits a constant, each ``present`` its
      ``past`` padded by one position (the copy every cache-as-input step makes).
    """
    model = onnx.load(str(path))
    graph = model.graph
    nbits = [n for n in graph.node if n.op_type == "MatMulNBits"]
    used = {i for n in nbits for i in n.input[1:]}
    nodes, outputs, widths = [], [], set()
    for j, node in enumerate(nbits):
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        widths.add(attrs["K"])
        nodes.append(
            onnx.helper.make_node(
                "MatMulNBits", [f"x{attrs['K']}", *node.input[1:]], [f"y{j}"], domain=MS, **attrs
            )
        )
        outputs.append(onnx.helper.make_tensor_value_info(f"y{j}", onnx.TensorProto.FLOAT, None))
    inputs = [
        onnx.helper.make_tensor_value_info(f"x{k}", onnx.TensorProto.FLOAT, [1, 1, k])
        for k in sorted(widths)
    ]
    weights = [t for t in graph.initializer if t.name in used]
    matmuls = onnx.helper.make_model(
        onnx.helper.make_graph(nodes, "matmuls", inputs, outputs, weights),
        opset_imports=[onnx.helper.make_opsetid("", 21), onnx.helper.make_opsetid(MS, 1)],
    )
    vocab = graph.output[0].type.tensor_type.shape.dim[-1].dim_value or 1
    consts = [
        onnx.numpy_helper.from_array(np.zeros((1, 1, vocab), np.float32), "zeros"),
        onnx.numpy_helper.from_array(np.array([0, 0, 0, 0, 0, 0, 1, 0], np.int64), "pads"),
    ]
    io_nodes = []
    for out in graph.output:
        if out.name == "logits":
            io_nodes.append(onnx.helper.make_node("Identity", ["zeros"], ["logits"]))
        else:  # present.N.key|value <- past_key_values.N.key|value (irkit's and genai's names)
            past = out.name.replace("present", "past_key_values")
            io_nodes.append(onnx.helper.make_node("Pad", [past, "pads"], [out.name]))
    io = onnx.helper.make_model(
        onnx.helper.make_graph(io_nodes, "io", list(graph.input), list(graph.output), consts),
        opset_imports=[onnx.helper.make_opsetid("", 21)],
    )
    stem = name.replace(" ", "_")
    paths = work / f"{stem}.floor_matmuls.onnx", work / f"{stem}.floor_io.onnx"
    onnx.save(matmuls, str(paths[0]), save_as_external_data=True, location=paths[0].name + ".data")
    onnx.save(io, str(paths[1]))
    return paths


def decomposition(
    pair: tuple[str, str],
    paths: dict[str, pathlib.Path],
    feeds: dict[str, np.ndarray],
    work: pathlib.Path,
    rounds: int,
) -> list[str]:
    """Wall time of a decode step split into matmuls, feeds/fetches and the rest (1 thread).

    onnxruntime's profiler slows every node it times (a profiled decode@127 step of the
    reference model takes ~1.2 ms, an unprofiled one ~0.75 ms), so its kernel sums compare
    badly across models of different node counts; this times, interleaved and unprofiled, each
    model and its two :func:`floor_models`. ``bound`` is ``(matmuls + io) / builder step``: the
    ratio irkit would reach if everything else (attention, norms, rotary, glue) cost nothing.
    """
    variants: dict[str, pathlib.Path] = {}
    for name in pair:
        matmuls, io = floor_models(paths[name], work, name)
        variants.update({name: paths[name], f"{name} matmuls": matmuls, f"{name} io": io})
    rng = np.random.default_rng(0)
    sessions = {n: session(p, 1) for n, p in variants.items()}
    bound = {}
    for n, s in sessions.items():
        bound[n] = {
            i.name: feeds[i.name]
            if i.name in feeds
            else rng.standard_normal([int(d) for d in i.shape]).astype(np.float32)
            for i in s.get_inputs()
        }
        s.run(None, bound[n])
    times: dict[str, list[float]] = collections.defaultdict(list)
    for _ in range(rounds):
        for n, s in sessions.items():
            t0 = time.perf_counter()
            for _ in range(20):
                s.run(None, bound[n])
            times[n].append((time.perf_counter() - t0) / 20 * 1e3)
    best = {n: min(t) for n, t in times.items()}
    lines = []
    for name in pair:
        mm, io = best[f"{name} matmuls"], best[f"{name} io"]
        rest = best[name] - mm - io
        lines.append(
            f"{name:14} step {best[name]:.3f} = matmuls {mm:.3f} + io {io:.3f} + rest {rest:.3f}"
        )
    a, b = pair
    floor = (best[f"{a} matmuls"] + best[f"{a} io"]) / best[b]
    lines.append(f"{a} / {b}: {best[a] / best[b]:.2f}x; bound (rest = 0) {floor:.2f}x")
    return lines


# --- one model size ------------------------------------------------------------------------------


def run_size(
    size: str,
    work: pathlib.Path,
    rounds: int,
    threads: list[int],
    decode_rules: bool,
    top: int,
    spin: bool = True,
) -> str:
    out = work / size
    out.mkdir(parents=True, exist_ok=True)
    lm = llama(size)
    lines = [f"## {size}: {SIZES[size]}, 4 layers, {KV_HEADS[size]} KV heads, vocab 4000"]
    t0 = time.perf_counter()
    b4 = builder(lm, out, "int4")
    b8 = builder(lm, out, "int8")
    block, level = nbits_settings(b4)
    lines.append(
        f"builder int4+int8: {time.perf_counter() - t0:.1f} s; block {block}, level {level}"
    )
    fp32, seconds = irkit_float(lm, out)
    lines.append(f"irkit export+lower+optimize: {seconds:.1f} s")
    settings = dict(block_size=block, accuracy_level=level)
    paths = {
        "irkit int4": irkit_quantized(fp32, out, "irkit int4", decode_rules, bits=4, **settings),
        "builder int4": b4,
        "irkit int8": irkit_quantized(fp32, out, "irkit int8", decode_rules, bits=8, **settings),
        "builder int8": b8,
        "irkit dyn8": irkit_quantized(fp32, out, "irkit dyn8", decode_rules, dynamic=True),
    }
    pairs = list(PAIRS)
    if decode_rules:  # the decode rules' own effect, in the same rounds
        plain = irkit_quantized(fp32, out, "irkit int4 plain", False, bits=4, **settings)
        paths["irkit int4 plain"] = plain
        pairs.append(("irkit int4", "irkit int4 plain"))
    acc0 = irkit_quantized(
        fp32, out, "irkit int4 acc0", decode_rules, bits=4, block_size=block, accuracy_level=0
    )
    cases = {
        c: causal_lm_feeds(lm, batch=1, seq=seq, past=past, seed=past) for c, seq, past in CASES
    }
    for threads_n in threads:
        times = timed(paths, cases, threads_n, rounds, spin)
        lines.append(f"\n### {threads_n} thread(s), {rounds} interleaved rounds (ms, medians)")
        lines.append(f"{'case':12} {'pair':30} {'a':>8} {'b':>8}  ratio [min–max]")
        for a, b in pairs:
            for c in cases:
                lines.append(f"{c:12} {a + ' / ' + b:30} {ratio_line(times, a, b, c)}")
        for c in cases:
            lines.append(
                f"{c:12} {'irkit dyn8 / builder int4':30} "
                f"{ratio_line(times, 'irkit dyn8', 'builder int4', c)}"
            )
    lines.append("\n### decode step, wall time split (1 thread, best of 4 × rounds, ms)")
    for c in ("decode@127", "decode@511"):
        lines.append(f"{c}:")
        pair = ("irkit int4", "builder int4")
        lines += [f"  {x}" for x in decomposition(pair, paths, cases[c], out, 4 * rounds)]
    decodes = [causal_lm_feeds(lm, batch=1, seq=1, past=127, seed=100 + i) for i in range(32)]
    accuracy_cases = {"prefill@128": [cases["prefill@128"]], "32 × decode@127": decodes}
    lines.append("\n### accuracy vs irkit fp32 (logits)")
    for name, path in [("irkit int4 acc0", acc0), *paths.items()]:
        lines.append(f"{name:16} {accuracy(path, fp32, accuracy_cases)}")
    lines.append(
        "\n### nodes (file, inlined | after onnxruntime's optimizations) and decode@127 kernels"
    )
    for name, path in [("irkit fp32", fp32), *paths.items()]:
        nodes, optimized = node_counts(path, out, name)
        share = profile_share(path, cases["decode@127"], out, name, top=top)
        lines.append(f"{name:14} {nodes:4d} | {optimized:4d}   {share}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="ref")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--no-decode-rules", action="store_true")
    parser.add_argument("--top", type=int, default=4)
    parser.add_argument(
        "--no-spin",
        action="store_true",
        help="at > 1 thread, intra-op pools do not spin (onnxruntime spins by default)",
    )
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    work = pathlib.Path(args.workdir or tempfile.mkdtemp(prefix="bench_quantize_"))
    threads = [int(t) for t in args.threads.split(",")]
    print(
        f"onnxruntime {ort.__version__}, workdir {work}, "
        f"decode rules {'off' if args.no_decode_rules else 'on'}, "
        f"spinning {'off' if args.no_spin else 'on'} at > 1 thread",
        flush=True,
    )
    for size in args.sizes.split(","):
        rules = not args.no_decode_rules
        rounds = max(args.rounds, 5)
        print(run_size(size, work, rounds, threads, rules, args.top, not args.no_spin), flush=True)


if __name__ == "__main__":
    main()
