"""``irkit export`` vs the genai model builder on a whole 7B-shaped checkpoint (issue 33 item 4).

A Llama-2-7B-shaped folder (``--shape 7b``: hidden 4096, intermediate 11008, 32 layers, 32
heads, vocab 32000) or a TinyLlama-1.1B-shaped one (``--shape 1b``: hidden 2048, intermediate
5632, 22 layers, 32 heads, 4 KV heads, vocab 32000) is written shard by shard straight to
safetensors, one layer per shard, random fp16 weights (as such checkpoints ship): at most one
layer is ever in this process's memory, never the model (``--layers``/``--vocab`` make a slice).

Then, each as a whole process on the same folder, under a memory cap:

- ``irkit export FOLDER -o OUT --precision P`` (``--precision int4``, the default, or ``fp32``),
  in a small Python launcher that also reports the stage lines of ``irkit export``'s progress
  (written always, terminal or not) and the seconds spent in its parts (``torch.export``,
  ``irkit.lower``, layer stamping, ``irkit.optimize``, the quantize rewrite, ``irkit.save`` and
  inside it: reading + converting the checkpoint tensors, packing the int4 blocks, the rest:
  writing the file; the save computes a tensor on a worker thread while it writes the one
  before, so these overlap);
- with ``--builder``: ``python -m onnxruntime_genai.models.builder -i FOLDER -o OUT -p P -e cpu``.

Each export's wall time and peak RSS are printed, and the ratio irkit/builder. The peak is the
process's own ``VmHWM`` (``/proc/self/status`` read at its exit: that process alone, from its
exec); a process killed at the cap has none, and its figure is the largest resident set the
watchdog saw.

**The cap** (``--cap-gb``, default 16): a watchdog polls the child's process tree every 0.2 s
(the sum of ``VmRSS`` of the child and its descendants) and kills the whole process group
(``SIGKILL``) when it goes over the cap, or when the machine's ``MemAvailable`` falls under
``--floor-gb`` (default 1): the builder loads the whole model and builds it in fp32, which for
the 7B would not fit in the machine's 23 GB beside other work. "Killed at the cap after N s"
is then the builder's figure. ``--timeout`` bounds each export the same way.

Then irkit's folder (and the builder's, if it finished) is loaded in genai's ``og.Model`` in a
child process under the same cap, and generates ``--new-tokens`` greedy tokens after a short
prompt; the ids are printed (``--no-generate`` skips it).

Targets (the issue): irkit's wall time <= 0.5 x the builder's, irkit's peak RSS < 2 GB, the
folder loads in genai and generates.

For ``--precision fp32`` on the 7B shape the fp32 peak is also projected from a slice: the
peak is the imports and the traced graph plus one tensor being converted, its fp16 and fp32
copies (6 bytes per element of the largest tensor, the embedding or ``lm_head``)::

    peak(7B) ≈ peak(slice) − 6 × largest(slice) + 6 × largest(7B)

``df`` is checked first (the checkpoint, each export, the builder's fp32 cache).

Usage: ``python bench/bench_export_7b.py [--shape 7b|1b] [--precision int4|fp32] [--builder]
[--cap-gb 16] [--floor-gb 1] [--timeout S] [--layers N] [--vocab V] [--new-tokens 8]
[--no-generate] [--workdir DIR] [--keep] [--reuse] [--json]`` (run with ``PYTHONPATH=$PWD``;
``--keep --reuse`` keeps the checkpoint in ``--workdir`` for the next run). Figures:
docs/export.md ("A whole 7B in int4, against the builder").
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[1]
GB = 10**9
LIMIT_BYTES = 2 * GB
POLL_SECONDS = 0.2


@dataclasses.dataclass(frozen=True)
class Shape:
    """A Llama shape (``--shape``)."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int


SHAPES = {
    "7b": Shape(hidden=4096, intermediate=11008, layers=32, heads=32, kv_heads=32, vocab=32000),
    # TinyLlama-1.1B's shape
    "1b": Shape(hidden=2048, intermediate=5632, layers=22, heads=32, kv_heads=4, vocab=32000),
}
HIDDEN, INTERMEDIATE = SHAPES["7b"].hidden, SHAPES["7b"].intermediate

# The launcher of ``irkit export``: the CLI, with timers around its parts and its progress stage
# lines written always (``STAGE seconds text``); after the imports (torch, transformers,
# onnxruntime, irkit.llm) and before the export, the resident set (``IMPORTS_RSS bytes``); at
# exit ``TIMER name seconds calls`` lines and the process's own peak RSS (``VMHWM bytes``).
_IRKIT_CHILD = """
import functools, sys, time
T0 = time.monotonic()
TIMES = {}

def timed(owner, attr, key):
    fn = getattr(owner, attr)
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        t = time.monotonic()
        try:
            return fn(*args, **kwargs)
        finally:
            entry = TIMES.setdefault(key, [0.0, 0])
            entry[0] += time.monotonic() - t
            entry[1] += 1
    setattr(owner, attr, wrapper)

def report():
    for key, (seconds, calls) in TIMES.items():
        sys.stderr.write(f"TIMER {key} {seconds:.3f} {calls}\\n")
    sys.stderr.write(f"TIMER total {time.monotonic() - T0:.3f} 1\\n")
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            sys.stderr.write(f"VMHWM {int(line.split()[1]) * 1024}\\n")
    sys.stderr.flush()

try:
    import irkit
    import irkit.llm._causal_lm as causal_lm
    import irkit.llm._export as llm_export
    import irkit.llm._progress as progress
    import irkit.llm._stamp as stamp
    import irkit.weights._derived as derived
    import irkit.weights._stream as stream
    from irkit.cli import main

    def stage(self, text):
        sys.stderr.write(f"STAGE {time.monotonic() - T0:.3f} {text}\\n")
        sys.stderr.flush()

    progress.Progress.stage = stage
    timed(causal_lm, "export_causal_lm", "torch.export")
    timed(irkit, "lower", "irkit.lower")
    timed(stamp, "stamp_layers", "stamp layers")
    timed(irkit, "optimize", "irkit.optimize")
    timed(llm_export, "_quantize", "quantize rewrite")
    timed(irkit, "save", "irkit.save")
    timed(stream._Converted, "numpy", "save: read + convert")
    timed(derived.Packed, "compute", "save: pack blocks")
    timed(derived, "quantize_blockwise", "pack: codes + scales")
    timed(derived, "rtn_scales", "pack: scales alone")
    # The baseline: what the imports alone hold (the export imports these lazily; imported here
    # first, the peak counts them all the same), before any export work.
    import onnxruntime, torch, transformers
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            sys.stderr.write(f"IMPORTS_RSS {int(line.split()[1]) * 1024}\\n")
    TIMES["imports"] = [time.monotonic() - T0, 1]
    rc = main(sys.argv[1:])
finally:
    report()
sys.exit(rc)
"""

# The launcher of the builder: its module as ``__main__``, then ``VMHWM bytes``.
_BUILDER_CHILD = """
import runpy, sys
sys.argv = ["builder", *sys.argv[1:]]
try:
    runpy.run_module("onnxruntime_genai.models.builder", run_name="__main__", alter_sys=True)
finally:
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            sys.stderr.write(f"VMHWM {int(line.split()[1]) * 1024}\\n")
"""

# Load a folder in genai, generate greedily after a prompt (ids < 3000: any vocab the bench
# makes): ``GENAI {json}`` and ``VMHWM``.
_GENAI_CHILD = """
import json, sys, time
import onnxruntime_genai as og
folder, new = sys.argv[1], int(sys.argv[2])
t0 = time.perf_counter()
model = og.Model(folder)
t1 = time.perf_counter()
prompt = [1, 45, 496, 1735, 170, 2991]
params = og.GeneratorParams(model)
total = len(prompt) + new
params.set_search_options(max_length=total, min_length=total, do_sample=False)
generator = og.Generator(model, params)
generator.append_tokens(prompt)
t2 = time.perf_counter()
while not generator.is_done():
    generator.generate_next_token()
t3 = time.perf_counter()
ids = [int(i) for i in generator.get_sequence(0)][len(prompt):]
figures = {"load_s": t1 - t0, "prefill_s": t2 - t1, "decode_s": t3 - t2, "ids": ids}
sys.stderr.write("GENAI " + json.dumps(figures) + "\\n")
for line in open("/proc/self/status"):
    if line.startswith("VmHWM:"):
        sys.stderr.write(f"VMHWM {int(line.split()[1]) * 1024}\\n")
"""


def llama_config(shape: Shape) -> dict[str, Any]:
    """The ``config.json`` of ``shape`` (Llama-2-7B's, or TinyLlama's)."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": shape.hidden,
        "intermediate_size": shape.intermediate,
        "num_hidden_layers": shape.layers,
        "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads,
        "vocab_size": shape.vocab,
        "max_position_embeddings": 4096 if shape.hidden == HIDDEN else 2048,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 0,
        "torch_dtype": "float16",
    }


def llama_7b_config(layers: int, vocab: int) -> dict[str, Any]:
    """Llama-2-7B's ``config.json`` (``layers`` decoder layers, ``vocab`` tokens)."""
    return llama_config(dataclasses.replace(SHAPES["7b"], layers=layers, vocab=vocab))


def layer_shapes(layer: int, shape: Shape = SHAPES["7b"]) -> dict[str, tuple[int, ...]]:
    """The tensors of decoder layer ``layer``."""
    p = f"model.layers.{layer}."
    hidden, inter = shape.hidden, shape.intermediate
    kv = hidden // shape.heads * shape.kv_heads
    return {
        p + "input_layernorm.weight": (hidden,),
        p + "post_attention_layernorm.weight": (hidden,),
        p + "self_attn.q_proj.weight": (hidden, hidden),
        p + "self_attn.k_proj.weight": (kv, hidden),
        p + "self_attn.v_proj.weight": (kv, hidden),
        p + "self_attn.o_proj.weight": (hidden, hidden),
        p + "mlp.gate_proj.weight": (inter, hidden),
        p + "mlp.up_proj.weight": (inter, hidden),
        p + "mlp.down_proj.weight": (hidden, inter),
    }


def parameter_count(shape: Shape) -> int:
    """The parameters of ``shape`` (embedding, layers, final norm, ``lm_head``)."""
    layer = sum(int(np.prod(s)) for s in layer_shapes(0, shape).values())
    return shape.vocab * shape.hidden * 2 + shape.hidden + shape.layers * layer


def write_checkpoint(
    folder: pathlib.Path, layers: int, vocab: int, shape: Shape = SHAPES["7b"]
) -> int:
    """Write the folder shard by shard (fp16); returns the bytes of weights written."""
    from safetensors.numpy import save_file

    shape = dataclasses.replace(shape, layers=layers, vocab=vocab)
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    shards: list[dict[str, tuple[int, ...]]] = [
        {"model.embed_tokens.weight": (vocab, shape.hidden)},
        *(layer_shapes(i, shape) for i in range(layers)),
        {"model.norm.weight": (shape.hidden,), "lm_head.weight": (vocab, shape.hidden)},
    ]
    names = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    weight_map, total = {}, 0
    for shapes, name in zip(shards, names, strict=True):
        tensors = {}
        for key, dims in shapes.items():
            values = rng.random(int(np.prod(dims)), dtype=np.float32)
            tensors[key] = ((values - 0.5) * 0.04).astype(np.float16).reshape(dims)
            del values
            weight_map[key] = name
            total += tensors[key].nbytes
        save_file(tensors, str(folder / name), metadata={"format": "pt"})
        del tensors
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    (folder / "config.json").write_text(json.dumps(llama_config(shape), indent=2))
    _tokenizer(folder, vocab)
    return total


def _tokenizer(folder: pathlib.Path, vocab: int) -> None:
    """A word-level tokenizer ``t0`` … ``t{vocab - 1}`` (``t0`` unk/pad, ``t1`` bos, ``t2`` eos),
    saved with its ``tokenizer_config.json`` (the builder loads it with ``AutoTokenizer``)."""
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = transformers.PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tok, unk_token="t0", pad_token="t0", bos_token="t1", eos_token="t2"
    )
    fast.save_pretrained(folder)


# --- running a child under the cap -------------------------------------------------------------


@dataclasses.dataclass
class Run:
    """One child process run under the watchdog."""

    returncode: int | None  # None: killed by the watchdog
    wall: float  # seconds
    polled_peak: int  # the largest resident set (bytes) the watchdog saw, the whole tree
    killed: str | None  # why the watchdog killed it
    log: str  # its stdout and stderr

    @property
    def vmhwm(self) -> int | None:
        """The process's own peak RSS, reported at its exit (None if it has none)."""
        found = re.findall(r"^VMHWM (\d+)$", self.log, re.M)
        return int(found[-1]) if found else None

    @property
    def imports_rss(self) -> int | None:
        """The resident set after the imports, before any export work (None if not reported)."""
        found = re.findall(r"^IMPORTS_RSS (\d+)$", self.log, re.M)
        return int(found[-1]) if found else None

    @property
    def peak(self) -> int:
        """The peak RSS: the process's own ``VmHWM``, else the largest the watchdog saw."""
        return self.vmhwm if self.vmhwm is not None else self.polled_peak

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def outcome(self) -> str:
        """``ok``, ``killed …`` or ``failed …`` (with the last error line)."""
        if self.ok:
            return "ok"
        if self.killed:
            return f"killed {self.killed} after {self.wall:.0f} s"
        lines = [line.strip() for line in self.log.splitlines() if line.strip()]
        tags = ("VMHWM", "TIMER", "STAGE", "IMPORTS_RSS")
        lines = [line for line in lines if not line.startswith(tags)]
        errors = [line for line in lines if "Error" in line or "Exception" in line]
        last = (errors or lines or ["?"])[-1][:300]
        return f"failed (exit {self.returncode}) after {self.wall:.0f} s: {last}"


def _children(pid: int) -> list[int]:
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                found += [int(c) for c in f.read().split()]
        except OSError:
            pass
    return found


def tree_rss(pid: int) -> int:
    """The resident set (bytes) of ``pid`` and all its descendants (``VmRSS``, summed)."""
    total, todo, seen = 0, [pid], set()
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        try:
            with open(f"/proc/{p}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
                        break
        except OSError:
            continue
        todo += _children(p)
    return total


def mem_available() -> int:
    """The machine's ``MemAvailable`` in bytes."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def run_capped(
    cmd: list[str],
    log: pathlib.Path,
    *,
    cap: int,
    floor: int = GB,
    timeout: float | None = None,
    env: dict[str, str] | None = None,
) -> Run:
    """Run ``cmd`` (its own process group, stdout and stderr to ``log``) and poll its tree's
    resident set every 0.2 s; kill the group (``SIGKILL``) when it goes over ``cap`` bytes, the
    machine's ``MemAvailable`` under ``floor`` bytes, or the wall time over ``timeout``."""
    env = env if env is not None else {**os.environ, "PYTHONPATH": str(REPO)}
    peak, killed = 0, None
    with open(log, "w") as out:
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            while proc.poll() is None:
                rss = tree_rss(proc.pid)
                peak = max(peak, rss)
                wall = time.perf_counter() - t0
                if rss > cap:
                    killed = f"at the {cap / GB:.0f} GB cap (resident {rss / GB:.1f} GB)"
                elif mem_available() < floor:
                    killed = (
                        f"at the machine's floor (MemAvailable < {floor / GB:.1f} GB, "
                        f"resident {rss / GB:.1f} GB)"
                    )
                elif timeout is not None and wall > timeout:
                    killed = f"at the {timeout:.0f} s timeout (resident {rss / GB:.1f} GB)"
                if killed:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                    break
                time.sleep(POLL_SECONDS)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        wall = time.perf_counter() - t0
    return Run(
        returncode=None if killed else proc.returncode,
        wall=wall,
        polled_peak=peak,
        killed=killed,
        log=log.read_text(errors="replace"),
    )


# --- the exports --------------------------------------------------------------------------------


def irkit_command(folder: pathlib.Path, out: pathlib.Path, precision: str) -> list[str]:
    """``irkit export`` in its timing launcher."""
    return [
        *(sys.executable, "-c", _IRKIT_CHILD, "export", str(folder), "-o", str(out)),
        *("--precision", precision, "--overwrite"),
    ]


def builder_command(folder: pathlib.Path, out: pathlib.Path, precision: str) -> list[str]:
    """The genai model builder (``-p P -e cpu``) in its launcher."""
    cache = out.parent / f"{out.name}-cache"
    return [
        *(sys.executable, "-c", _BUILDER_CHILD, "-i", str(folder), "-o", str(out)),
        *("-p", precision, "-e", "cpu", "-c", str(cache)),
    ]


def stages(log: str) -> list[tuple[str, float]]:
    """irkit's stages and their seconds, from the launcher's ``STAGE`` and ``TIMER`` lines (the
    first: the imports and reading the config; the last ends at the process's end)."""
    marks = [
        (float(m.group(1)), m.group(2)) for m in re.finditer(r"^STAGE ([\d.]+) (.*)$", log, re.M)
    ]
    total = timers(log).get("total", (0.0, 0))[0]
    if not marks:
        return []
    out = [("start (imports, config, meta model)", marks[0][0])]
    ends = [t for t, _ in marks[1:]] + [total]
    out += [(text, end - t) for (t, text), end in zip(marks, ends, strict=True)]
    return out


def timers(log: str) -> dict[str, tuple[float, int]]:
    """The launcher's ``TIMER name seconds calls`` lines."""
    return {
        m.group(1): (float(m.group(2)), int(m.group(3)))
        for m in re.finditer(r"^TIMER (.+) ([\d.]+) (\d+)$", log, re.M)
    }


def parts(log: str) -> dict[str, float]:
    """Where irkit's time goes: torch.export, lowering, stamping, optimize, quantize, and
    ``irkit.save`` with, inside it, reading + converting, packing and the rest (writing). The
    save computes each tensor on a worker thread while the one before is written, so its
    parts overlap: the rest is ``save - read - pack`` and negative where they did."""
    t = {k: v[0] for k, v in timers(log).items()}
    save = t.get("irkit.save", 0.0)
    read, pack = t.get("save: read + convert", 0.0), t.get("save: pack blocks", 0.0)
    known = {
        "imports": t.get("imports", 0.0),
        "torch.export": t.get("torch.export", 0.0),
        "irkit.lower": t.get("irkit.lower", 0.0),
        "stamp layers": t.get("stamp layers", 0.0),
        "irkit.optimize": t.get("irkit.optimize", 0.0),
        "quantize rewrite": t.get("quantize rewrite", 0.0),
        "irkit.save": save,
        "  of which read + convert checkpoint": read,
        "  of which pack int4 blocks (worker thread)": pack,
        "    of which codes + scales (quantize_blockwise)": t.get("pack: codes + scales", 0.0),
        "    of which scales again (rtn_scales)": t.get("pack: scales alone", 0.0),
        "  the rest: writing (save - read - pack; < 0: overlapped)": save - read - pack,
    }
    known["other"] = t.get("total", 0.0) - sum(v for k, v in known.items() if not k.startswith(" "))
    return {k: round(v, 1) for k, v in known.items()}


def genai_check(folder: pathlib.Path, log: pathlib.Path, new: int, cap: int) -> dict[str, Any]:
    """Load ``folder`` in ``og.Model`` (a child under the cap) and generate ``new`` tokens."""
    run = run_capped([sys.executable, "-c", _GENAI_CHILD, str(folder), str(new)], log, cap=cap)
    found = re.findall(r"^GENAI (.*)$", run.log, re.M)
    if not run.ok or not found:
        return {"ok": False, "outcome": run.outcome(), "peak_rss_bytes": run.peak}
    return {
        "ok": True,
        **{
            k: (round(v, 2) if isinstance(v, float) else v)
            for k, v in json.loads(found[-1]).items()
        },
        "peak_rss_bytes": run.peak,
    }


def projection(peak: int, layers: int, vocab: int) -> int:
    """The fp32 7B peak projected from a slice's (the formula in the module docstring)."""
    largest = max(vocab * HIDDEN, INTERMEDIATE * HIDDEN)
    largest_7b = max(32000 * HIDDEN, INTERMEDIATE * HIDDEN)
    del layers
    return peak - 6 * largest + 6 * largest_7b


def output_estimate(shape: Shape, precision: str) -> int:
    """Bytes of an export's folder (int4: the blocks, scales, fp32 embedding and norms)."""
    params = parameter_count(shape)
    if precision == "fp32":
        return 4 * params
    return int(params * 0.7) + shape.vocab * shape.hidden * 4


def _size(path: pathlib.Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.1f} {five:.1f} {fifteen:.1f}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="7b")
    parser.add_argument("--precision", choices=("int4", "fp32"), default="int4")
    parser.add_argument("--layers", type=int, help="decoder layers (default: the shape's)")
    parser.add_argument("--vocab", type=int, help="vocabulary (default: the shape's)")
    parser.add_argument("--builder", action="store_true", help="also run the genai builder")
    parser.add_argument("--cap-gb", type=float, default=16.0, help="memory cap of each child")
    parser.add_argument("--floor-gb", type=float, default=1.0, help="kill under this available")
    parser.add_argument("--timeout", type=float, help="seconds each export may run")
    parser.add_argument("--new-tokens", type=int, default=8)
    parser.add_argument("--no-generate", dest="generate", action="store_false")
    parser.add_argument("--workdir", type=pathlib.Path)
    parser.add_argument("--reuse", action="store_true", help="keep an existing checkpoint")
    parser.add_argument("--keep", action="store_true", help="keep the folders")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)

    base = SHAPES[args.shape]
    shape = dataclasses.replace(
        base,
        layers=base.layers if args.layers is None else args.layers,
        vocab=base.vocab if args.vocab is None else args.vocab,
    )
    cap, floor = int(args.cap_gb * GB), int(args.floor_gb * GB)
    work = args.workdir or pathlib.Path(tempfile.mkdtemp(prefix="bench_export_7b-"))
    work.mkdir(parents=True, exist_ok=True)
    params = parameter_count(shape)
    folder, out, built = work / "hf", work / "onnx", work / "builder"
    reuse = args.reuse and (folder / "model.safetensors.index.json").exists()
    need = (0 if reuse else 2 * params) + output_estimate(shape, args.precision)
    if args.builder:  # its output, and room for an fp32 copy it may write
        need += output_estimate(shape, args.precision) + 4 * params
    free = shutil.disk_usage(work).free
    if free < need * 1.05:
        sys.exit(
            f"{work}: {free / 1e9:.1f} GB free, the checkpoint and the exports need "
            f"{need / 1e9:.1f} GB: pass fewer --layers"
        )
    say = (lambda _text: None) if args.json else (lambda text: print(text, flush=True))
    figures: dict[str, Any] = {
        "shape": args.shape,
        "layers": shape.layers,
        "vocab": shape.vocab,
        "precision": args.precision,
        "parameters": params,
        "cap_bytes": cap,
        "load_before": _load(),
    }
    try:
        t0 = time.perf_counter()
        if reuse:
            weights = sum(p.stat().st_size for p in folder.glob("*.safetensors"))
        else:
            shutil.rmtree(folder, ignore_errors=True)
            weights = write_checkpoint(folder, shape.layers, shape.vocab, shape)
        made = time.perf_counter() - t0
        figures.update(checkpoint_bytes=weights, checkpoint_seconds=round(made, 1))
        say(
            f"{args.shape}-shaped llama, {shape.layers} layers, vocab {shape.vocab}: "
            f"{params / 1e9:.2f} B parameters, fp16 shards {weights / 1e9:.1f} GB "
            f"({'reused' if reuse else f'written in {made:.0f} s'}); load {_load()}"
        )

        shutil.rmtree(out, ignore_errors=True)
        mine = run_capped(
            irkit_command(folder, out, args.precision),
            work / "irkit.log",
            cap=cap,
            floor=floor,
            timeout=args.timeout,
        )
        if not mine.ok:
            sys.exit(f"irkit export {mine.outcome()}:\n{mine.log[-3000:]}")
        written = _size(out)
        figures.update(
            output_bytes=written,
            export_seconds=round(mine.wall, 1),
            peak_rss_bytes=mine.peak,
            polled_peak_rss_bytes=mine.polled_peak,
            imports_rss_bytes=mine.imports_rss,
            stages=[(text, round(s, 1)) for text, s in stages(mine.log)],
            parts=parts(mine.log),
            load_after_irkit=_load(),
        )
        if args.shape == "7b" and args.precision == "fp32":
            figures["projected_7b_peak_rss_bytes"] = projection(
                mine.peak, shape.layers, shape.vocab
            )
        say(
            f"irkit export --precision {args.precision} ({written / 1e9:.2f} GB written): "
            f"{mine.wall:.1f} s, peak RSS {mine.peak / 1e9:.2f} GB "
            f"({'ok' if mine.peak < LIMIT_BYTES else 'MISSED'}: < 2 GB); load {_load()}"
        )
        for text, seconds in stages(mine.log):
            say(f"  stage {seconds:8.1f} s  {text}")
        for name, seconds in parts(mine.log).items():
            say(f"  part  {seconds:8.1f} s  {name}")
        if "projected_7b_peak_rss_bytes" in figures:
            say(
                "projected fp32 peak RSS for the whole 7B: "
                f"{figures['projected_7b_peak_rss_bytes'] / 1e9:.2f} GB"
            )

        theirs = None
        if args.builder:
            shutil.rmtree(built, ignore_errors=True)
            theirs = run_capped(
                builder_command(folder, built, args.precision),
                work / "builder.log",
                cap=cap,
                floor=floor,
                timeout=args.timeout,
            )
            shutil.rmtree(work / f"{built.name}-cache", ignore_errors=True)
            figures["builder"] = {
                "outcome": theirs.outcome(),
                "seconds": round(theirs.wall, 1),
                "peak_rss_bytes": theirs.peak,
                "polled_peak_rss_bytes": theirs.polled_peak,
                "output_bytes": _size(built) if theirs.ok else None,
            }
            ratio = mine.wall / theirs.wall if theirs.ok else None
            figures["ratio_irkit_builder"] = None if ratio is None else round(ratio, 3)
            say(
                f"builder -p {args.precision} -e cpu: {theirs.outcome()}: {theirs.wall:.1f} s, "
                f"peak RSS {theirs.peak / 1e9:.2f} GB"
                f"{'' if theirs.vmhwm is not None else ' (polled)'}; load {_load()}"
            )
            if ratio is None:
                say("wall ratio irkit/builder: none (the builder did not finish)")
            else:
                verdict = "ok" if ratio <= 0.5 else "MISSED"
                say(f"wall ratio irkit/builder: {ratio:.2f} ({verdict}: <= 0.5)")

        if args.generate:
            checks = {"irkit": out}
            if theirs is not None and theirs.ok:
                checks["builder"] = built
            figures["genai"] = {}
            for kind, path in checks.items():
                result = genai_check(path, work / f"genai-{kind}.log", args.new_tokens, cap)
                figures["genai"][kind] = result
                if result["ok"]:
                    say(
                        f"genai {kind}: og.Model loaded in {result['load_s']:.1f} s, "
                        f"prefill {result['prefill_s']:.2f} s, {args.new_tokens} tokens in "
                        f"{result['decode_s']:.1f} s, peak RSS "
                        f"{result['peak_rss_bytes'] / 1e9:.2f} GB: {result['ids']}"
                    )
                else:
                    say(f"genai {kind}: {result['outcome']}")
            ids = [r.get("ids") for r in figures["genai"].values() if r["ok"]]
            if len(ids) == 2:
                figures["genai"]["same_ids"] = ids[0] == ids[1]
                say(
                    f"irkit's and the builder's ids: {'the same' if ids[0] == ids[1] else 'differ'}"
                )
    finally:
        if not args.keep:
            if not args.reuse:
                shutil.rmtree(folder, ignore_errors=True)
            for path in (out, built, work / f"{built.name}-cache"):
                shutil.rmtree(path, ignore_errors=True)
    if args.json:
        print(json.dumps(figures))


if __name__ == "__main__":
    main()
