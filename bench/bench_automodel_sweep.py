"""Every base model transformers' ``AutoModel`` maps, through irkit and the stock exporter.

For each model type of transformers' ``MODEL_MAPPING_NAMES`` a tiny model is built from its
config class's defaults by :func:`bench.tiny_config.tiny_config` (``AutoModel``, random weights,
seed 0, eval mode), then, in its own subprocess (isolation and a timeout):

1. ``inputs``: keyword inputs derived from the model's ``forward`` signature by parameter name,
   never by model type (:func:`build_inputs`): ``input_ids`` (+ ``attention_mask``, right-padded
   second row) for text, ``pixel_values`` of the config's ``image_size`` / ``num_channels`` for
   vision, ``input_values`` / ``input_features`` for audio (sizes from the config), the decoder
   ids of an encoder-decoder, and a few named multimodal extras (``visual_feats``, ``bbox``, …).
   Only required parameters and the main input are fed (a multimodal model whose image inputs
   are optional runs its text path); ``use_cache=False`` where ``forward`` takes it (a cache
   object is no output ``torch.export`` can flatten). A required parameter no rule knows ends the row as
   ``inputs`` (not counted: neither irkit's nor the stock exporter's failure);
2. ``eager``: the model under ``torch.no_grad()`` (the reference: its tensor outputs, flattened);
3. ``export``: ``torch.export.export(model, (), kwargs, strict=False)`` under ``torch.no_grad()``,
   static shapes (a refusal is torch.export's, not irkit's: not counted);
4. irkit: ``irkit.lower`` → ``irkit.optimize`` → ``irkit.save`` → onnxruntime (CPU, graph
   optimizations off) → ``compare``: every output against eager, max |diff| ≤ 1e-3 × max(1,
   max |eager|) per output;
5. stock: ``torch.onnx.export(program, dynamo=True)`` from the same ``ExportedProgram`` →
   onnxruntime → the same comparison.

Stages, in order: ``config``, ``inputs``, ``eager``, ``export`` (the row's stage when it ends
there; not counted), then irkit's ``lower``, ``optimize``, ``ort-load``, ``ort-run``,
``compare``, ``ok`` and, separately, the stock exporter's ``stock-export``, ``stock-ort-load``,
``stock-ort-run``, ``stock-compare``, ``ok``. A worker over its ``--timeout`` is reported in the
stage it was in (``Timeout``), a crashed one likewise (``Crash``). Failures are grouped by
mechanism as in the causal-LM sweep (stage + exception type + normalized first line). The summary
starts with ``irkit ok N/M, stock ok K/M, irkit-only failures F``, M being the types that export;
an irkit-only failure is a type whose stock export is ok and whose irkit row is not.

Usage::

    PYTHONPATH=$PWD nice -n 19 python bench/bench_automodel_sweep.py \\
        [--only bert,vit] [--skip sam] [--jobs 1] [--timeout 300] [--json sweep.json]
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import inspect
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import time
import traceback
from typing import Any

from bench.bench_causal_lm_sweep import normalize

PRE = ("config", "inputs", "eager", "export")
IRKIT = ("lower", "optimize", "ort-load", "ort-run", "compare", "ok")
STOCK = ("stock-export", "stock-ort-load", "stock-ort-run", "stock-compare", "ok")
STAGES = PRE + IRKIT
BATCH = 2
SEQ = 8
DECODER_SEQ = 4
SEED = 0
RTOL = 1e-3
RANDOM = "the program draws random numbers"  # a compare row's mechanism (random_ops)
ROOT = pathlib.Path(__file__).resolve().parent.parent
MODAL = ("input_ids", "pixel_values", "input_values", "input_features", "visual_feats", "bbox")
_ANSI = re.compile(r"\x1b\[[0-9;]*m|\[[0-9;]*m")


def group_key(stage: str, error: str | None) -> str:
    """``stage: normalized error`` (the stage alone for ``compare``: its detail is numbers;
    ``compare: the program draws random numbers (…)`` for a program with seeded random ops)."""
    text = _ANSI.sub("", error or "")
    if stage.endswith("compare"):
        return f"{stage}: {text}" if text.startswith(RANDOM) else stage
    if "Status Message:" in text:  # onnxruntime: the node kind and the failed check, no C++
        message = text.split("Status Message:", 1)[1]
        message = message.split(" was false. ")[-1] if " was false. " in message else message
        text = f"{text.split(' Name:')[0]} {message.rsplit(') ', 1)[-1].strip()}"
    line = normalize(text)
    return stage if stage.endswith("compare") or not line else f"{stage}: {line}"


# --- inputs, by forward parameter name ----------------------------------------------------------


class InputsError(Exception):
    """No rule builds a required input of the model's ``forward``."""


def _find(config: Any, *names: str) -> Any:
    """The first of ``names`` set on ``config`` or on one of its sub-configs (one level)."""
    subs = [config] + [
        getattr(config, key, None)
        for key in ("vision_config", "audio_config", "text_config", "encoder_config")
    ]
    for sub in subs:
        for name in names:
            value = getattr(sub, name, None) if sub is not None else None
            if value is not None:
                return value
    return None


def _image_size(config: Any) -> tuple[int, int]:
    size = _find(config, "image_size", "img_size", "input_size", "crop_size")
    if isinstance(size, (list, tuple)):
        size = size[-2:] if len(size) >= 2 else (size[0], size[0])
        return int(size[0]), int(size[1])
    if isinstance(size, dict):
        return int(size.get("height", 32)), int(size.get("width", 32))
    if isinstance(size, int) and size > 0:
        return size, size
    return 32, 32


def _vocab(config: Any) -> int:
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    vocab = getattr(text, "vocab_size", None) or _find(config, "vocab_size")
    return int(vocab) if isinstance(vocab, int) and vocab > 0 else 100


def _ids(config: Any, shape: tuple[int, ...], rng: Any) -> Any:
    import numpy as np

    from bench.bench_causal_lm_sweep import _special_ids

    vocab = _vocab(config)
    special = _special_ids(config) if hasattr(config, "to_dict") else set()
    allowed = np.array(sorted(set(range(vocab)) - special) or [0], dtype=np.int64)
    return rng.choice(allowed, size=shape)


def _input(name: str, config: Any, rng: Any) -> Any:
    """One input by its parameter name (a numpy array), or None when no rule knows the name."""
    import numpy as np

    def floats(*shape: int) -> Any:
        return rng.standard_normal(shape).astype(np.float32)

    if name in ("input_ids", "decoder_input_ids", "labels_ids"):
        seq = DECODER_SEQ if name.startswith("decoder") else SEQ
        return _ids(config, (BATCH, seq), rng)
    if name in ("attention_mask", "decoder_attention_mask"):
        mask = np.ones((BATCH, DECODER_SEQ if name.startswith("decoder") else SEQ), np.int64)
        mask[1, -2:] = 0
        return mask
    if name == "token_type_ids":
        return np.zeros((BATCH, SEQ), np.int64)
    if name == "pixel_values":
        channels = _find(config, "num_channels", "in_channels", "in_chans", "num_input_channels")
        height, width = _image_size(config)
        return floats(BATCH, int(channels or 3), height, width)
    if name == "input_values":
        return floats(BATCH, 1600)
    if name == "input_features":
        mels = _find(config, "num_mel_bins")
        if mels:
            frames = 2 * int(_find(config, "max_source_positions") or 1500)
            return floats(BATCH, int(mels), frames)
        size = _find(config, "feature_size", "input_feat_per_channel", "input_dim")
        channels = int(_find(config, "input_channels") or 1)
        return floats(BATCH, 32, int(size or 80) * channels) if size else None
    if name == "bbox":
        corner = rng.integers(0, 500, (BATCH, SEQ, 2))
        return np.concatenate([corner, corner + 10], axis=-1).astype(np.int64)
    if name == "visual_feats":
        return floats(BATCH, 4, int(_find(config, "visual_feat_dim") or 16))
    if name == "visual_pos":
        return rng.random((BATCH, 4, int(_find(config, "visual_pos_dim") or 4))).astype(np.float32)
    if name in ("past_values", "past_values_padding"):
        length = int(_find(config, "context_length", "context_len", "patch_length") or 32)
        pad = name.endswith("_padding")
        return np.zeros((BATCH, length), np.int64) if pad else floats(BATCH, length)
    if name == "freq":
        return np.zeros((BATCH, 1), np.int64)
    return None


def build_inputs(
    model: Any, config: Any, seed: int = SEED, *, modal: bool = False
) -> dict[str, Any]:
    """The keyword inputs (numpy arrays) for ``model``'s ``forward``, by parameter name.

    Feeds the main input, every required parameter, the attention mask of text ids, and the
    decoder ids of an encoder-decoder; with ``modal``, also every optional input of another
    modality a rule builds (``MODAL``: a multimodal model that needs both text and image).

    Raises:
        InputsError: a required parameter (or the main input) no rule builds.
    """
    import numpy as np

    rng = np.random.default_rng(seed)
    params = inspect.signature(model.forward).parameters
    main = getattr(model, "main_input_name", "input_ids")
    wanted = [
        name
        for name, p in params.items()
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        and (p.default is inspect.Parameter.empty or name == main)
    ]
    if main not in params and not wanted:
        wanted = [n for n in ("input_ids", "pixel_values", "input_values") if n in params][:1]
    if modal:
        wanted += [name for name in MODAL if name in params]
        wanted += ["visual_pos"] if "visual_feats" in wanted and "visual_pos" in params else []
    if "input_ids" in wanted and "attention_mask" in params:
        wanted.append("attention_mask")
    if getattr(config, "is_encoder_decoder", False) and "decoder_input_ids" in params:
        wanted.append("decoder_input_ids")
    feeds: dict[str, Any] = {}
    for name in dict.fromkeys(wanted):
        value = _input(name, config, rng)
        if value is None:
            raise InputsError(f"no rule builds forward parameter {name!r}")
        feeds[name] = value
    if not feeds:
        raise InputsError("forward has no parameter a rule builds")
    return feeds


# --- the worker -----------------------------------------------------------------------------------


def _ort_session(path: pathlib.Path) -> Any:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.log_severity_level = 3
    opts.intra_op_num_threads = 1
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def compare(got: list[Any], expected: list[Any]) -> tuple[bool, str]:
    """Whether each output is within ``RTOL × max(1, max |eager|)``, and a one-line detail."""
    import numpy as np

    if len(got) != len(expected):
        return False, f"{len(got)} outputs vs {len(expected)} eager"
    worst, worst_detail = 0.0, "no outputs"
    for i, (g, e) in enumerate(zip(got, expected, strict=True)):
        g, e = np.asarray(g), np.asarray(e)
        if g.shape != e.shape:
            return False, f"output {i}: shape {g.shape} vs {e.shape}"
        if e.size == 0:
            continue
        g64, e64 = g.astype(np.float64), e.astype(np.float64)
        if not np.array_equal(np.isnan(g64), np.isnan(e64)):
            return False, f"output {i}: NaN where eager has none (or the reverse)"
        g64, e64 = np.nan_to_num(g64, nan=0.0), np.nan_to_num(e64, nan=0.0)
        scale = max(1.0, float(np.abs(e64).max()))
        diff = float(np.abs(g64 - e64).max())
        if worst_detail == "no outputs" or diff / scale > worst:
            worst = diff / scale
            worst_detail = f"output {i}: max |diff| {diff:.2g} (max |eager| {scale:.2g})"
    return worst <= RTOL, worst_detail


class _Row:
    """The worker's result, written after each stage (a killed worker leaves its stage)."""

    def __init__(self, path: pathlib.Path, model_type: str) -> None:
        self.path = path
        self.result: dict[str, Any] = {"type": model_type, "stage": "config", "seconds": {}}
        self.started = time.perf_counter()

    def stage(self, stage: str, key: str = "stage") -> None:
        self.result[key] = stage
        self.write()

    def fail(self, error: BaseException, key: str = "stage") -> None:
        prefix = "stock_" if key == "stock" else ""
        self.result[f"{prefix}error"] = f"{type(error).__name__}: {error}"
        inner = error
        while inner.__cause__ is not None:
            inner = inner.__cause__
        if inner is not error:  # the mechanism is the innermost cause (the stock exporter's)
            self.result[f"{prefix}cause"] = f"{type(inner).__name__}: {inner}"
        self.result[f"{prefix}traceback"] = traceback.format_exc()[-3000:]
        self.write()

    def time(self, name: str, start: float) -> None:
        self.result["seconds"][name] = round(time.perf_counter() - start, 2)

    def write(self) -> None:
        self.result["seconds_total"] = round(time.perf_counter() - self.started, 2)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.result, default=str))
        tmp.replace(self.path)


def _draws(node: Any) -> bool:
    """Whether an FX node draws random numbers: a seeded random op (``torch.Tag.
    nondeterministic_seeded``) other than a dropout that is off (``train=False``, ``p=0``,
    ``dropout_p=0``: ``dropout`` and ``scaled_dot_product_attention`` in eval mode)."""
    import torch

    target = node.target
    if node.op != "call_function" or torch.Tag.nondeterministic_seeded not in getattr(
        target, "tags", ()
    ):
        return False
    arguments = target._schema.arguments
    bound = {a.name: a.default_value for a in arguments if a.has_default_value()}
    bound |= dict(zip([a.name for a in arguments], node.args, strict=False)) | dict(node.kwargs)
    if bound.get("train", True) is False:
        return False
    return all(bound.get(name, 1) != 0 for name in ("p", "dropout_p"))


def random_ops(program: Any) -> list[str]:
    """The ops of ``program`` that draw random numbers (:func:`_draws`), sorted by name.

    A forward that draws random numbers (``torch.rand`` noise for random masking, a sampled
    duration) draws different ones in eager PyTorch and in onnxruntime, so its numbers cannot be
    compared; the summary groups such a ``compare`` row by these ops.
    """
    return sorted({str(node.target) for node in program.graph.nodes if _draws(node)})


def _eager(model: Any, feeds: dict[str, Any]) -> tuple[dict[str, Any], list[Any]]:
    """The keyword arguments (tensors, ``use_cache=False``) and the eager tensor outputs."""
    import torch
    from torch.utils import _pytree as pytree

    kwargs: dict[str, Any] = {k: torch.from_numpy(v) for k, v in feeds.items()}
    params = inspect.signature(model.forward).parameters
    takes_kwargs = any(p.kind is p.VAR_KEYWORD for p in params.values())
    text = model.config.get_text_config() if hasattr(model.config, "get_text_config") else None
    cached = getattr(model.config, "use_cache", None) or getattr(text, "use_cache", None)
    if "use_cache" in params or (takes_kwargs and cached):
        kwargs["use_cache"] = False  # a cache object is no output torch.export can flatten
    with torch.no_grad():
        out = model(**kwargs)
    leaves = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
    return kwargs, [t.detach().numpy() for t in leaves]


def _prepare(model_type: str, row: _Row) -> Any:
    """config → inputs → eager → export; the program, feeds and reference, or None."""
    import torch

    from bench.tiny_config import tiny_model

    try:
        model = tiny_model(model_type, auto_class="AutoModel", seed=SEED)
        row.result.update(
            model_class=type(model).__name__, params=sum(p.numel() for p in model.parameters())
        )
    except Exception as error:
        row.fail(error)
        return None
    row.stage("inputs")
    try:
        feeds = build_inputs(model, model.config)
    except Exception as error:
        row.fail(error)
        return None
    row.stage("eager")
    try:
        kwargs, expected = _eager(model, feeds)
    except Exception:
        try:  # a multimodal model may need its other modalities too
            wider = build_inputs(model, model.config, modal=True)
            if list(wider) == list(feeds):
                raise
            feeds = wider
            kwargs, expected = _eager(model, feeds)
        except Exception as last:  # the wider inputs' error where they were tried
            row.result["inputs"] = {k: list(v.shape) for k, v in feeds.items()}
            row.fail(last)
            return None
    row.result["inputs"] = {k: list(v.shape) for k, v in feeds.items()}
    row.stage("export")
    start = time.perf_counter()
    try:
        with torch.no_grad():
            program = torch.export.export(model, (), kwargs, strict=False)
    except Exception as error:
        row.fail(error)
        return None
    row.time("export", start)
    drawn = random_ops(program)
    if drawn:
        row.result["random_ops"] = drawn
    return program, feeds, expected


def _run_session(path: pathlib.Path, feeds: dict[str, Any], row: _Row, key: str, prefix: str):
    """onnxruntime on ``path``; the outputs, or None (the row's ``key`` stage says where)."""
    row.stage(f"{prefix}ort-load", key)
    try:
        session = _ort_session(path)
    except Exception as error:
        row.fail(error, key)
        return None
    row.stage(f"{prefix}ort-run", key)
    try:
        names = [i.name for i in session.get_inputs()]
        values = list(feeds.values())
        if len(names) != len(values):
            raise ValueError(f"the model has {len(names)} inputs, {len(values)} were built")
        return session.run(None, dict(zip(names, values, strict=True)))
    except Exception as error:
        row.fail(error, key)
        return None


def worker(model_type: str, result_path: pathlib.Path) -> None:
    """Runs one model type through every stage, writing ``result_path`` as it goes."""
    import warnings

    warnings.filterwarnings("ignore")
    row = _Row(result_path, model_type)
    row.write()
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    torch.set_num_threads(1)
    import irkit

    prepared = _prepare(model_type, row)
    if prepared is None:
        return
    program, feeds, expected = prepared
    with tempfile.TemporaryDirectory(prefix="irkit-amsweep-") as folder:
        row.stage("lower")
        start = time.perf_counter()
        got = None
        try:
            model = irkit.lower(program)
            row.time("lower", start)
            row.stage("optimize")
            irkit.optimize(model)
            path = irkit.save(model, pathlib.Path(folder) / "irkit.onnx")
        except Exception as error:
            row.fail(error)
        else:
            got = _run_session(path, feeds, row, "stage", "")
        if got is not None:
            ok, detail = compare(got, expected)
            row.result["detail"] = detail
            row.stage("ok" if ok else "compare")

        row.stage("stock-export", "stock")
        try:
            onnx_program = torch.onnx.export(program, dynamo=True, verbose=False)
            assert onnx_program is not None
            stock_path = pathlib.Path(folder) / "stock.onnx"
            onnx_program.save(str(stock_path))
        except Exception as error:
            row.fail(error, "stock")
            return
        got = _run_session(stock_path, feeds, row, "stock", "stock-")
        if got is not None:
            ok, detail = compare(got, expected)
            row.result["stock_detail"] = detail
            row.stage("ok" if ok else "stock-compare", "stock")


# --- the driver -----------------------------------------------------------------------------------


def _run_one(model_type: str, timeout: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="irkit-amsweep-worker-") as folder:
        result_path = pathlib.Path(folder) / "result.json"
        env = dict(os.environ)
        paths = [str(ROOT), env.get("PYTHONPATH", "")]
        env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
        command = [sys.executable, str(pathlib.Path(__file__).resolve()), "--worker", model_type]
        command += ["--result", str(result_path)]
        start = time.perf_counter()
        note = None
        try:
            proc = subprocess.run(
                command, env=env, capture_output=True, text=True, timeout=timeout, cwd=ROOT
            )
            if proc.returncode != 0:
                tail = (proc.stderr or "").strip().splitlines()[-1:] or [""]
                note = f"Crash: worker exited with {proc.returncode}: {tail[0][:300]}"
        except subprocess.TimeoutExpired:
            note = f"Timeout: over {timeout:g} s"
        try:
            result = json.loads(result_path.read_text())
        except (OSError, json.JSONDecodeError):
            result = {"type": model_type, "stage": "config"}
        if note:
            if result["stage"] != "ok" and "error" not in result:
                result["error"] = note
            elif result["stage"] == "ok" and result.get("stock") not in ("ok", None):
                result.setdefault("stock_error", note)
            elif result["stage"] == "ok" and result.get("stock") is None:
                result.update(stock="stock-export", stock_error=note)
        result["wall"] = round(time.perf_counter() - start, 1)
        return result


def _why(result: dict[str, Any], prefix: str = "") -> str | None:
    stage = result.get("stock" if prefix else "stage") or ""
    if stage.endswith("compare") and result.get("random_ops"):
        return f"{RANDOM} ({', '.join(result['random_ops'])})"
    return result.get(f"{prefix}cause") or result.get(f"{prefix}error")


def _exported(result: dict[str, Any]) -> bool:
    return result["stage"] not in PRE


def irkit_only(results: list[dict[str, Any]]) -> list[str]:
    """Types whose stock export is ok and whose irkit row is not."""
    return sorted(
        r["type"] for r in results if r.get("stock") == "ok" and r["stage"] != "ok"
    )  # fmt: skip


def _groups(rows: list[tuple[str, str, str | None]], order: tuple[str, ...]) -> list[str]:
    groups: dict[str, list[str]] = collections.defaultdict(list)
    for model_type, stage, error in rows:
        groups[group_key(stage, error)].append(model_type)
    ranked = sorted(groups.items(), key=lambda kv: (order.index(kv[0].split(":")[0]), -len(kv[1])))
    return [f"  {key} ({len(types)} types: {', '.join(sorted(types))})" for key, types in ranked]


def summarize(results: list[dict[str, Any]]) -> list[str]:
    """The summary: the ``irkit ok N/M, stock ok K/M, irkit-only failures F`` line, the stages,
    then irkit's failure groups (the not-counted stages first), the stock exporter's, and the
    irkit-only types."""
    exported = [r for r in results if _exported(r)]
    ok = sum(r["stage"] == "ok" for r in exported)
    stock_ok = sum(r.get("stock") == "ok" for r in exported)
    only = irkit_only(results)
    lines = [
        f"irkit ok {ok}/{len(exported)}, stock ok {stock_ok}/{len(exported)}, "
        f"irkit-only failures {len(only)} ({len(results)} types run, {len(exported)} exported)"
    ]
    stages = collections.Counter(r["stage"] for r in results)
    lines.append("  stages: " + ", ".join(f"{s} {stages[s]}" for s in STAGES if stages[s]))
    lines.append("not counted (the model, its inputs or torch.export):")
    lines += _groups(
        [(r["type"], r["stage"], r.get("error")) for r in results if not _exported(r)], PRE
    )
    lines.append("irkit failures:")
    fails = [(r["type"], r["stage"], _why(r)) for r in exported if r["stage"] != "ok"]
    lines += _groups(fails, IRKIT)
    lines.append("stock failures:")
    stock = [
        (r["type"], r.get("stock") or "stock-export", _why(r, "stock_"))
        for r in exported
        if r.get("stock") != "ok"
    ]
    lines += _groups(stock, STOCK)
    lines.append(f"irkit-only failures: {', '.join(only) or 'none'}")
    return lines


def _types(parser: argparse.ArgumentParser, only: str, skip: str) -> list[str]:
    from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES

    types = list(MODEL_MAPPING_NAMES)
    chosen = [t for t in only.split(",") if t]
    unknown = sorted(set(chosen) - set(types))
    if unknown:
        parser.error(f"not AutoModel model types: {', '.join(unknown)}")
    if chosen:
        types = [t for t in types if t in chosen]
    skipped = {t for t in skip.split(",") if t}
    return [t for t in types if t not in skipped]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated model types")
    parser.add_argument("--skip", default="", help="comma-separated model types to leave out")
    parser.add_argument("--jobs", type=int, default=1, help="workers at once")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per model type")
    parser.add_argument("--json", default=None, help="write every result here")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--result", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.worker:
        worker(args.worker, pathlib.Path(args.result))
        return 0

    types = _types(parser, args.only, args.skip)
    results: list[dict[str, Any]] = []
    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(args.jobs, 1)) as pool:
        futures = {pool.submit(_run_one, t, args.timeout): t for t in types}
        for done, future in enumerate(concurrent.futures.as_completed(futures), 1):
            r = future.result()
            results.append(r)
            detail = r.get("detail") or normalize(r.get("error") or "")
            stock = r.get("stock") or "-"
            print(
                f"[{done}/{len(types)}] {r['type']:24s} {r['stage']:8s} stock {stock:14s} "
                f"{r.get('wall', 0):6.1f}s  {detail[:100]}",
                flush=True,
            )
    results.sort(key=lambda r: types.index(r["type"]))
    lines = summarize(results)
    print(f"\n{len(types)} types in {time.perf_counter() - started:.0f} s")
    print("\n".join(lines))
    if args.json:
        import torch
        import transformers

        payload = {
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "summary": lines,
            "results": results,
        }
        pathlib.Path(args.json).write_text(json.dumps(payload, indent=1, default=str))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
