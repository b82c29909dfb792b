"""Every causal LM transformers maps, through irkit and onnxruntime, measured.

For each model type of transformers' ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`` a tiny model is built
from its config class's defaults by :func:`bench.tiny_config.tiny_config` (random weights, seed
0, eval mode; a config with an ``is_decoder`` field is built as a decoder, as transformers'
``*LMHeadModel`` asks), then, in its own subprocess (isolation and a timeout):

1. the reference: ``model.generate(do_sample=False, max_new_tokens=12)`` for one prompt (batch
   1, 6 tokens) and a left-padded batch of two prompts (6 and 3 tokens), with a fresh
   ``GenerationConfig`` whose ``eos_token_id`` is unset, so that 12 tokens always come (prompt
   ids are drawn from the vocabulary without the config's special token ids);
2. ``irkit.llm.export_causal_lm`` (where the cached export fails, again with ``cache=False``:
   the whole sequence at every step, the type marked ``(no cache)`` and counted apart in the
   summary, the cached export's error kept as ``cached_error``), ``irkit.lower``,
   ``irkit.optimize(target)``, ``irkit.save`` to a temporary folder, an onnxruntime CPU session
   (graph optimizations off), and ``irkit.llm.generate_greedy`` on the same prompts, 12 new
   tokens.

Each result is classified by the first stage that fails:

- ``config``: the tiny model does not build (the exception is reported; most are transformers'
  defaults that do not build either);
- ``eager``: the reference ``generate`` fails (transformers itself, irkit not involved);
- ``export``, ``lower``, ``optimize``, ``ort-load`` (session creation, including the save),
  ``ort-run`` (``generate_greedy``);
- ``reference``: the ids differ, but transformers disagrees with itself: its ``generate``
  (prefill, then one token at a time with its cache) gives other ids than the arg-max of its own
  forward over the whole sequence without a cache, and that forward's arg-max equals
  onnxruntime's ids (a model whose one-token and multi-token paths differ in transformers); for
  a type exported without a cache, also where onnxruntime's ids equal transformers' own greedy
  loop without a cache (the whole sequence at every step, as ``generate_greedy`` drives it) and
  ``generate``'s do not (CPM-Ant, whose mask is not causal: a teacher-forced forward differs
  from both);
- ``ids``: onnxruntime's ids differ from the reference (the detail gives the first differing
  new token, and the largest logits difference between onnxruntime and eager PyTorch on random
  inputs, which tells a real difference from a near-tie of the arg-max);
- ``exact``: equal ids for both prompts.

A worker over its ``--timeout`` is reported in the stage it was in (``Timeout``), a crashed one
likewise (``Crash``). Failures are grouped by mechanism: the stage plus the error's first line,
normalized (numbers, quoted names, class names and versions stripped), e.g.
``export: ExportError: export_causal_lm: layer N of …'s cache (…) holds no N-d key/value tensors
… (14 types: lfm2, mamba, …)``. The summary ends with ``exact N/M`` per target, M being the
types whose tiny model builds.

Usage::

    PYTHONPATH=$PWD nice -n 15 python bench/bench_causal_lm_sweep.py \\
        [--only llama,gpt2] [--skip gemma3n] [--jobs 1] [--timeout 600] \\
        [--target onnx|ort|both] [--json sweep.json]

``PYTHONPATH`` must hold the repository (``bench.tiny_config``); the workers inherit it.
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

STAGES = (
    "config", "eager", "export", "lower", "optimize", "ort-load", "ort-run", "reference", "ids",
    "exact",
)  # fmt: skip
NEW_TOKENS = 12
PROMPT = 6
SHORT = 3
SEED = 0
ROOT = pathlib.Path(__file__).resolve().parent.parent


# --- error normalization ----------------------------------------------------------------------------

_VERSIONS = re.compile(r"\s*with transformers [^()]*\([^)]*\)|\s*\(tested:[^)]*\)")
_QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"|`[^`]*`")
_CAMEL = re.compile(r"\b[A-Za-z][A-Za-z0-9_]*[a-z0-9][A-Z]\w*\b")
_KEEP_CAMEL = re.compile(r"(Error|Exception|Warning|Interrupt)$")
_NUMBER = re.compile(r"\d+(\.\d+)*")
_ADDRESS = re.compile(r"0x[0-9a-fA-F]+")
_PATH = re.compile(r"(/[\w.\-]+){2,}")


def normalize(error: str) -> str:
    """The first line of ``error`` without what differs between models of one mechanism."""
    line = error.strip().splitlines()[0] if error.strip() else ""
    line = _VERSIONS.sub("", line)
    line = _ADDRESS.sub("…", line)
    line = _PATH.sub("…", line)
    line = _QUOTED.sub("'…'", line)
    line = _CAMEL.sub(lambda m: m.group(0) if _KEEP_CAMEL.search(m.group(0)) else "…", line)
    line = _NUMBER.sub("N", line)
    line = re.sub(r"(…[\s,]*){2,}", "… ", line)
    return line[:160].strip()


def group_key(result: dict[str, Any]) -> str:
    """``stage: normalized error`` (the stage alone for ``ids``)."""
    if result["stage"] == "ids":
        return "ids"
    return f"{result['stage']}: {normalize(result.get('error') or '')}"


# --- the worker (one model type, in its own process) -------------------------------------------------


def _special_ids(config: Any, seen: set[int] | None = None) -> set[int]:
    """Every token id a config (or a nested one, or its generation defaults) names."""
    from transformers import PretrainedConfig

    ids: set[int] = set()
    seen = seen if seen is not None else set()
    if id(config) in seen:
        return ids
    seen.add(id(config))
    for key, value in config.to_dict().items():
        if re.search(r"(token_id|token_index|_token_ids)$", key):
            stack = [value]
            while stack:
                item = stack.pop()
                if isinstance(item, int) and not isinstance(item, bool):
                    ids.add(item)
                elif isinstance(item, (list, tuple)):
                    stack.extend(item)
    for key in list(vars(config)):
        try:
            value = getattr(config, key, None)
        except Exception:  # a heterogeneous config refuses some global reads
            continue
        if isinstance(value, PretrainedConfig):
            ids |= _special_ids(value, seen)
    return ids


def prompts(config: Any) -> tuple[list[Any], int]:
    """Batch 1 (6 tokens) and a left-padded batch 2 (6 and 3 tokens); the pad id."""
    import numpy as np

    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    vocab = int(text.vocab_size)
    pad = getattr(text, "pad_token_id", None)
    if not isinstance(pad, int) or not 0 <= pad < vocab:
        pad = 0
    allowed = np.array(sorted(set(range(vocab)) - _special_ids(config) - {pad}), dtype=np.int64)
    rng = np.random.default_rng(SEED)
    ids = rng.choice(allowed, size=(2, PROMPT))
    mask = np.ones_like(ids)
    ids[1, : PROMPT - SHORT], mask[1, : PROMPT - SHORT] = pad, 0
    return [(ids[:1], mask[:1]), (ids, mask)], pad


def _as_decoder(config: Any) -> Any:
    if getattr(config, "is_decoder", None) is False:
        config.is_decoder = True
    return config


def _ort_session(path: pathlib.Path) -> Any:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.log_severity_level = 3
    opts.intra_op_num_threads = 1
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def _first_difference(got: Any, expected: Any) -> str:
    import numpy as np

    if got.shape != expected.shape:
        return f"shapes {tuple(got.shape)} vs {tuple(expected.shape)}"
    row, col = (int(v[0]) for v in np.nonzero(got != expected))
    return f"row {row}, new token {col - got.shape[1] + NEW_TOKENS}: {got[row, col]} vs {expected[row, col]}"


class _Progress:
    """Writes the worker's result file after each stage, so a killed worker leaves its stage."""

    def __init__(self, path: pathlib.Path, model_type: str, targets: list[str]) -> None:
        self.path = path
        self.results = {t: {"type": model_type, "target": t, "stage": "config"} for t in targets}
        self.info: dict[str, Any] = {"seconds": {}}
        self.started = time.perf_counter()

    def stage(self, stage: str, targets: list[str] | None = None) -> None:
        for target in targets or list(self.results):
            self.results[target]["stage"] = stage
        self.write()

    def fail(self, error: BaseException, targets: list[str] | None = None) -> None:
        text = f"{type(error).__name__}: {error}"
        for target in targets or list(self.results):
            self.results[target]["error"] = text
            self.results[target]["traceback"] = traceback.format_exc()[-3000:]
        self.write()

    def time(self, name: str, start: float) -> None:
        self.info["seconds"][name] = round(time.perf_counter() - start, 2)

    def write(self) -> None:
        for result in self.results.values():
            result.update(self.info)
            result["seconds_total"] = round(time.perf_counter() - self.started, 2)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(list(self.results.values()), default=str))
        tmp.replace(self.path)


def worker(model_type: str, targets: list[str], result_path: pathlib.Path) -> None:
    """Runs one model type through every stage, writing ``result_path`` as it goes."""
    import warnings

    warnings.filterwarnings("ignore")
    progress = _Progress(result_path, model_type, targets)
    progress.write()
    import numpy as np
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    torch.set_num_threads(1)

    import irkit
    from bench.tiny_config import tiny_config, tiny_model
    from irkit.llm import causal_lm_feeds, export_causal_lm, generate_greedy, run_eager

    # config: the tiny model builds
    start = time.perf_counter()
    try:
        config = _as_decoder(tiny_config(model_type))
        lm = tiny_model(model_type, config=config, seed=SEED)
        text = config.get_text_config()
        progress.info.update(
            model_class=type(lm).__name__,
            params=sum(p.numel() for p in lm.parameters()),
            layers=getattr(text, "num_hidden_layers", None),
        )
        cases, pad = prompts(config)
    except Exception as error:
        progress.fail(error)
        return
    progress.time("config", start)

    # eager: the reference ids
    progress.stage("eager")
    start = time.perf_counter()
    try:
        generation = transformers.GenerationConfig(
            do_sample=False, max_new_tokens=NEW_TOKENS, pad_token_id=pad, eos_token_id=None
        )
        lm.generation_config = generation
        expected = []
        with torch.no_grad():
            for ids, mask in cases:
                out = lm.generate(
                    input_ids=torch.from_numpy(ids),
                    attention_mask=torch.from_numpy(mask),
                    generation_config=generation,
                )
                expected.append(out.numpy())
    except Exception as error:
        progress.fail(error)
        return
    progress.time("eager", start)

    progress.stage("export")
    start = time.perf_counter()
    try:
        exported = export_causal_lm(lm)
    except Exception as cached_error:
        # the cached step cannot be captured: the model without a cache (the whole sequence
        # at every step), reported as such (``cache: false``, the cached export's error kept)
        progress.info["cached_error"] = f"{type(cached_error).__name__}: {cached_error}"
        try:
            exported = export_causal_lm(lm, cache=False)
        except Exception as error:
            progress.fail(cached_error)
            progress.info["uncached_error"] = f"{type(error).__name__}: {error}"
            progress.write()
            return
        progress.info["cache"] = False
    if not exported.cache.keys and not exported.cache.states:
        progress.info["cache"] = False  # (a model that keeps no cache: XLNet, openai-gpt)
    progress.time("export", start)
    uncached = progress.info.get("cache")  # False: exported without a cache

    progress.stage("lower")
    start = time.perf_counter()
    try:
        lowered = irkit.lower(exported.program, **exported.lower_kwargs())
    except Exception as error:
        progress.fail(error)
        return
    progress.time("lower", start)

    def diagnose(session: Any) -> str:
        """Logits of onnxruntime against eager PyTorch on random inputs (past 5, 3 new tokens):
        tells a real difference from a near-tie the greedy arg-max fell on."""
        try:
            past = 0 if uncached is False else 5  # (without a cache: the whole sequence)
            feeds = causal_lm_feeds(lm, batch=2, seq=8 - past, past=past, layout=exported.cache)
            names = {arg.name for arg in session.get_inputs()}
            got = session.run(["logits"], {k: v for k, v in feeds.items() if k in names})[0]
            if uncached is False:  # (the model's forward as the cacheless program runs it)
                kwargs = {k: torch.from_numpy(feeds[k]) for k in names if k in feeds}
                with torch.no_grad():
                    want = lm(**kwargs, use_cache=False).logits.float().numpy()
            else:
                want = run_eager(lm, feeds)[0]
            diff = float(np.abs(got - want).max())
            return f"logits max |diff| {diff:.2g} (max |logit| {float(np.abs(want).max()):.2g})"
        except Exception as error:
            return f"logits not compared: {type(error).__name__}: {str(error).strip()[:160]}"

    def whole_sequence_logits(ids: Any, mask: Any) -> Any:
        """transformers' forward over the whole sequence at once (no cache; positions from the
        mask, as ``generate`` makes them)."""
        kwargs: dict[str, Any] = {
            "input_ids": torch.from_numpy(ids),
            "attention_mask": torch.from_numpy(mask),
            "use_cache": False,
        }
        if "position_ids" in inspect.signature(lm.forward).parameters:
            positions = np.maximum(np.cumsum(mask, axis=-1) - 1, 0)
            kwargs["position_ids"] = torch.from_numpy(positions)
        return lm(**kwargs).logits

    def uncached_agrees(sequences: list[Any]) -> bool:
        """Whether each sequence's new tokens are the arg-max of transformers' own forward over
        the whole sequence at once (no cache; positions from the mask, as generate makes)."""
        with torch.no_grad():
            for full, (ids, mask) in zip(sequences, cases, strict=True):
                grown = np.concatenate([mask, np.ones_like(full[:, ids.shape[1] :])], axis=1)
                logits = whole_sequence_logits(full, grown)[:, ids.shape[1] - 1 : -1]
                if not np.array_equal(logits.argmax(-1).numpy(), full[:, ids.shape[1] :]):
                    return False
        return True

    def uncached_loop(ids: Any, mask: Any) -> Any:
        """transformers' own greedy loop without a cache: the whole sequence at every step (as
        ``generate_greedy`` drives a program exported with ``cache=False``)."""
        sequence, grown = ids, mask
        with torch.no_grad():
            for _ in range(NEW_TOKENS):
                token = whole_sequence_logits(sequence, grown)[:, -1].argmax(-1).numpy()[:, None]
                sequence = np.concatenate([sequence, token], axis=1)
                grown = np.concatenate([grown, np.ones_like(token)], axis=1)
        return sequence

    def reference_problem(got: list[Any]) -> str | None:
        """The reason the reference, not irkit, is inconsistent, or None (see ``reference``)."""
        try:
            if uncached_agrees(expected):
                return None
            if uncached_agrees(got):
                return (
                    "transformers' generate (cached, one token at a time) differs from its own "
                    "uncached forward over the whole sequence, which onnxruntime's ids equal"
                )
            if uncached is not False:
                return None
            loops = [uncached_loop(ids, mask) for ids, mask in cases]
            same = all(np.array_equal(a, b) for a, b in zip(loops, got, strict=True))
            if not same or all(np.array_equal(a, b) for a, b in zip(loops, expected, strict=True)):
                return None
        except Exception:  # no uncached forward: no verdict
            return None
        return (
            "transformers' generate (cached) differs from its own greedy loop without a cache "
            "(the whole sequence at every step; a teacher-forced forward differs from both), "
            "which onnxruntime's ids of the cacheless export equal"
        )

    for target in targets:
        _run_target(
            target, lowered, cases, expected, pad, progress, generate_greedy, irkit, np,
            (diagnose, reference_problem),
        )  # fmt: skip


def _run_target(
    target: str,
    lowered: Any,
    cases: list[Any],
    expected: list[Any],
    pad: int,
    progress: _Progress,
    generate_greedy: Any,
    irkit: Any,
    np: Any,
    checks: tuple[Any, Any],
) -> None:
    diagnose, reference_problem = checks
    progress.stage("optimize", [target])
    start = time.perf_counter()
    try:
        model = irkit.optimize(lowered.clone(), target)
    except Exception as error:
        progress.fail(error, [target])
        return
    progress.time(f"optimize-{target}", start)

    progress.stage("ort-load", [target])
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="irkit-sweep-") as folder:
        try:
            path = irkit.save(model, pathlib.Path(folder) / "model.onnx")
            session = _ort_session(path)
        except Exception as error:
            progress.fail(error, [target])
            return
        progress.time(f"ort-load-{target}", start)

        progress.stage("ort-run", [target])
        start = time.perf_counter()
        try:
            got = [
                generate_greedy(session, ids, mask, max_new_tokens=NEW_TOKENS, pad_token_id=pad)
                for ids, mask in cases
            ]
        except Exception as error:
            progress.fail(error, [target])
            return
        progress.time(f"ort-run-{target}", start)

        for g, e, (ids, _) in zip(got, expected, cases, strict=True):
            if g.shape != e.shape or not np.array_equal(g, e):
                detail = f"batch {len(ids)}: {_first_difference(g, e)}; {diagnose(session)}"
                progress.results[target]["detail"] = detail
                reason = reference_problem(got)
                if reason:
                    progress.results[target]["error"] = f"ReferenceProblem: {reason}"
                progress.stage("reference" if reason else "ids", [target])
                return
    progress.stage("exact", [target])


# --- the driver -------------------------------------------------------------------------------------


def _run_one(model_type: str, targets: list[str], timeout: float) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="irkit-sweep-worker-") as folder:
        result_path = pathlib.Path(folder) / "result.json"
        env = dict(os.environ)
        paths = [str(ROOT), env.get("PYTHONPATH", "")]
        env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
        command = [sys.executable, str(pathlib.Path(__file__).resolve()), "--worker", model_type]
        target = "both" if len(targets) > 1 else targets[0]
        command += ["--target", target, "--result", str(result_path)]
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
        wall = round(time.perf_counter() - start, 1)
        try:
            results = json.loads(result_path.read_text())
        except (OSError, json.JSONDecodeError):
            results = [{"type": model_type, "target": t, "stage": "config"} for t in targets]
        for result in results:
            if note and result["stage"] != "exact" and "error" not in result:
                result["error"] = note
            result["wall"] = wall
        return results


def summarize(results: list[dict[str, Any]], targets: list[str]) -> list[str]:
    """The summary lines: ``exact N/M`` per target, then the failure groups, largest first."""
    lines = []
    for target in targets:
        mine = [r for r in results if r["target"] == target]
        built = [r for r in mine if r["stage"] != "config"]
        exact = [r for r in mine if r["stage"] == "exact"]
        uncached = sorted(r["type"] for r in exact if r.get("cache") is False)
        lines.append(
            f"[{target}] exact {len(exact)}/{len(built)} ({len(mine)} types mapped): "
            f"with cache {len(exact) - len(uncached)}, without {len(uncached)}"
            + (f" (no cache: {', '.join(uncached)})" if uncached else "")
        )
        stages = collections.Counter(r["stage"] for r in mine)
        lines.append("  stages: " + ", ".join(f"{s} {stages[s]}" for s in STAGES if stages[s]))
        groups: dict[str, list[str]] = collections.defaultdict(list)
        for r in mine:
            if r["stage"] != "exact":
                groups[group_key(r)].append(r["type"])
        order = sorted(
            groups.items(), key=lambda kv: (STAGES.index(kv[0].split(":")[0]), -len(kv[1]))
        )
        for key, types in order:
            lines.append(f"  {key} ({len(types)} types: {', '.join(sorted(types))})")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated model types")
    parser.add_argument("--skip", default="", help="comma-separated model types to leave out")
    parser.add_argument("--jobs", type=int, default=1, help="workers at once")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per model type")
    parser.add_argument("--target", default="both", choices=("onnx", "ort", "both"))
    parser.add_argument("--json", default=None, help="write every result here")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--result", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.worker:
        targets = ["onnx", "ort"] if args.target == "both" else [args.target]
        worker(args.worker, targets, pathlib.Path(args.result))
        return 0

    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    types = list(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
    only = [t for t in args.only.split(",") if t]
    unknown = sorted(set(only) - set(types))
    if unknown:
        parser.error(f"not causal-LM model types: {', '.join(unknown)}")
    if only:
        types = [t for t in types if t in only]
    skip = {t for t in args.skip.split(",") if t}
    types = [t for t in types if t not in skip]
    targets = ["onnx", "ort"] if args.target == "both" else [args.target]

    results: list[dict[str, Any]] = []
    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(args.jobs, 1)) as pool:
        futures = {pool.submit(_run_one, t, targets, args.timeout): t for t in types}
        for done, future in enumerate(concurrent.futures.as_completed(futures), 1):
            for r in future.result():
                results.append(r)
                detail = r.get("detail") or normalize(r.get("error") or "")
                if r.get("cache") is False:
                    detail = f"(no cache) {detail}"
                print(
                    f"[{done}/{len(types)}] {r['type']:28s} {r['target']:4s} {r['stage']:8s} "
                    f"{r.get('wall', 0):6.1f}s  {detail[:110]}",
                    flush=True,
                )
    results.sort(key=lambda r: (types.index(r["type"]), r["target"]))
    lines = summarize(results, targets)
    print(f"\n{len(types)} types in {time.perf_counter() - started:.0f} s")
    print("\n".join(lines))
    if args.json:
        import torch
        import transformers

        payload = {
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "targets": targets,
            "new_tokens": NEW_TOKENS,
            "summary": lines,
            "results": results,
        }
        pathlib.Path(args.json).write_text(json.dumps(payload, indent=1, default=str))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
