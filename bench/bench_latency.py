"""Latency of the models irkit writes vs the other ways to get an ONNX model (issue 12).

In one run, for a BERT-like encoder (hidden 256, seq 128), a ViT (224², patch 16) and a
Llama-style decoder (hidden 512, 4 layers, 8 heads, 2 KV heads, fp32; prefill 128, decode steps
at past 127 and 511, batch 1, KV cache as input), the onnxruntime CPU latency (1 intra-op
thread, default graph optimizations, interleaved rounds, medians) of:

- ``irkit onnx``: ``irkit.lower`` + ``irkit.optimize(target="onnx")``
- ``irkit ort``: ``irkit.optimize(target="ort")`` ("n/a" while the target does not exist)
- ``torch.onnx opsetN``: ``torch.onnx.export`` (dynamo) at its default opset, and at 23
- ``torch.onnx+ort_fusions``: the default export plus onnxscript's
  ``onnxscript.rewriter.ort_fusions.optimize_for_ort``
- ``genai builder`` (decoder only): onnxruntime-genai's model builder on a ``save_pretrained``
  folder of the same random weights (with a tiny offline tokenizer), run in its own venv.

Every variant is exported from the same random-weight model; the table gives the median
latency, the ratio against the best *other* variant (< 1 is faster than everything else) and
the max |logit difference| against eager PyTorch. Numbers are indicative on a shared machine.

A last row, ``MatMul floor (reference)``, times a model made of nothing but the weight products
(``MatMul``/``Gemm`` with a constant weight, functions inlined) of irkit's model on the case's
token rows: a lower bound no variant can beat with these kernels. Its ratio is the best ratio
any exporter could reach; the gap between a variant and the floor is what fusions can remove.

onnxruntime-genai is not an irkit dependency; set up its venv once::

    python -m venv --system-site-packages /work/venv-bench
    /work/venv-bench/bin/pip install --no-deps onnxruntime-genai

Usage: ``python bench/bench_latency.py [--rounds 30] [--genai-python /work/venv-bench/bin/python]
[--only encoder,vit,decoder] [--workdir DIR]``
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import onnxruntime as ort
import torch

import irkit
from irkit.llm import causal_lm_feeds, export_causal_lm, run_eager, torch_inputs

DEFAULT_GENAI_PYTHON = "/work/venv-bench/bin/python"


@dataclasses.dataclass
class Variant:
    name: str
    path: pathlib.Path | None  # None: not available (reason in note)
    note: str = ""
    session: ort.InferenceSession | None = None
    reference: bool = False  # a bound, not an exporter: left out of the "best other" ratios


@dataclasses.dataclass
class Case:
    """One timed workload: a model family at one input size."""

    name: str
    feeds: dict[str, np.ndarray]
    expected_logits: np.ndarray
    rows: int  # token rows every weight product multiplies (batch × sequence)


# --- models --------------------------------------------------------------------------------------


def encoder() -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    from transformers import BertConfig, BertModel

    cfg = BertConfig(
        hidden_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        intermediate_size=1024,
        vocab_size=8192,
        max_position_embeddings=512,
    )
    model = BertModel(cfg, add_pooling_layer=False).eval()
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 8192, (1, 128), generator=g)
    return model, {"input_ids": ids, "attention_mask": torch.ones(1, 128, dtype=torch.long)}


def vit() -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    from transformers import ViTConfig, ViTModel

    cfg = ViTConfig(
        hidden_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        intermediate_size=1024,
        image_size=224,
        patch_size=16,
    )
    model = ViTModel(cfg, add_pooling_layer=False).eval()
    g = torch.Generator().manual_seed(2)
    return model, {"pixel_values": torch.randn(1, 3, 224, 224, generator=g)}


def decoder() -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        hidden_size=512,
        intermediate_size=1408,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=2,
        vocab_size=8192,
        max_position_embeddings=1024,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    return LlamaForCausalLM(cfg).eval()


# --- variants ------------------------------------------------------------------------------------


def _save_irkit(program: Any, names: dict[str, Any], out: pathlib.Path, target: str) -> Variant:
    label = f"irkit {target}"
    if target not in irkit._pipeline.TARGETS:
        return Variant(label, None, "n/a (target not in irkit._pipeline.TARGETS)")
    model = irkit.lower(program, **names)
    irkit.optimize(model, target=target)
    path = out / f"irkit_{target}.onnx"
    irkit.save(model, path)
    return Variant(label, path)


def _torch_onnx(source: Source, opset: int | None) -> Any:
    """torch.onnx.export of the eager model with the same inputs and dynamic shapes."""
    kwargs: dict[str, Any] = {"dynamo": True, "optimize": True, "verbose": False}
    if opset is not None:
        kwargs["opset_version"] = opset
    if source.names:
        kwargs["input_names"] = source.names["input_names"]
        kwargs["output_names"] = source.names["output_names"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.onnx.export(
            source.model, (), kwargs=source.inputs(), dynamic_shapes=source.dynamic_shapes, **kwargs
        )


@dataclasses.dataclass
class Source:
    """The eager model and how every variant is exported from it."""

    model: torch.nn.Module
    inputs: Callable[[], dict[str, Any]]  # fresh example inputs (a KV cache is mutated)
    dynamic_shapes: dict[str, Any]
    names: dict[str, Any]

    def program(self) -> Any:
        return torch.export.export(
            self.model, (), self.inputs(), dynamic_shapes=self.dynamic_shapes
        )


def _failure(exc: Exception) -> str:
    lines = [ln for ln in str(exc).splitlines() if "Error" in ln] or [str(exc)]
    return f"fail ({type(exc).__name__}: {lines[-1].strip()[:160]})"


def torch_variants(source: Source, out: pathlib.Path) -> list[Variant]:
    """torch.onnx.export at its default opset, + ort_fusions, and at opset 23."""
    from onnxscript.rewriter.ort_fusions import optimize_for_ort

    try:
        onnx_program = _torch_onnx(source, None)
    except Exception as exc:  # the stock exporter's own failures are results too
        note = _failure(exc)
        return [
            Variant(f"torch.onnx {label}", None, note)
            for label in ("default opset", "+ort_fusions", "opset23")
        ]
    default_opset = onnx_program.model.opset_imports.get("", 0)
    path = out / "torch_default.onnx"
    onnx_program.save(path)
    variants = [Variant(f"torch.onnx opset{default_opset}", path)]
    fused, _ = optimize_for_ort(onnx_program.model)
    path = out / "torch_ort_fusions.onnx"
    irkit.save(fused, path)
    variants.append(Variant("torch.onnx+ort_fusions", path))
    if default_opset != 23:
        path = out / "torch_23.onnx"
        try:
            _torch_onnx(source, 23).save(path)
            variants.append(Variant("torch.onnx opset23", path))
        except Exception as exc:
            variants.append(Variant("torch.onnx opset23", None, _failure(exc)))
    return variants


def _tokenizer(folder: pathlib.Path, vocab: int) -> None:
    """A tiny word-level tokenizer, built offline (the builder copies one into its output)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="t0", pad_token="t0", bos_token="t1", eos_token="t2"
    )
    fast.save_pretrained(folder)


def genai_variant(lm: torch.nn.Module, out: pathlib.Path, python: str) -> Variant:
    label = "genai builder"
    if not pathlib.Path(python).exists():
        return Variant(
            label,
            None,
            f"n/a ({python} missing: python -m venv --system-site-packages /work/venv-bench; "
            "/work/venv-bench/bin/pip install --no-deps onnxruntime-genai)",
        )
    hf = out / "hf"
    lm.save_pretrained(hf)
    _tokenizer(hf, lm.config.vocab_size)
    cmd = [
        python,
        "-m",
        "onnxruntime_genai.models.builder",
        "-i",
        str(hf),
        "-o",
        str(out / "genai"),
    ]
    cmd += ["-p", "fp32", "-e", "cpu", "-c", str(out / "genai_cache")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        return Variant(label, None, f"n/a (builder failed: {proc.stderr.strip()[-300:]})")
    return Variant(label, out / "genai" / "model.onnx")


# --- the MatMul floor ----------------------------------------------------------------------------


def _weight_products(path: pathlib.Path) -> list[np.ndarray]:
    """The ``(K, N)`` weights of every product with a constant weight (MatMul, Gemm, FusedMatMul
    whose B is an initializer or the ``Transpose`` of one), the module functions inlined: what
    every variant must multiply."""
    import onnx
    import onnx.inliner
    from onnx import numpy_helper

    model = onnx.inliner.inline_local_functions(onnx.load(str(path)))
    inits = {t.name: t for t in model.graph.initializer}
    transposed = {
        n.output[0]: n.input[0]
        for n in model.graph.node
        if n.op_type == "Transpose"
        and n.input[0] in inits
        and not any(a.name == "perm" and list(a.ints) == [0, 1] for a in n.attribute)
    }
    weights = []
    for node in model.graph.node:
        if node.op_type not in ("MatMul", "Gemm", "FusedMatMul") or len(node.input) < 2:
            continue
        b, flip = node.input[1], any(a.name == "transB" and a.i for a in node.attribute)
        if b in transposed:
            b, flip = transposed[b], not flip
        if b not in inits:
            continue
        w = numpy_helper.to_array(inits[b])
        if w.ndim == 2:
            weights.append(np.ascontiguousarray(w.T if flip else w))
    return weights


def matmul_floor(source: pathlib.Path, out: pathlib.Path) -> Variant:
    """A model of nothing but ``source``'s weight products (each reads an input of the case's
    rows): no exporter can run the model in less time than its weights' products take."""
    import onnx
    from onnx import helper, numpy_helper

    weights = _weight_products(source)
    nodes, inits, outputs, widths = [], [], [], sorted({w.shape[0] for w in weights})
    for i, w in enumerate(weights):
        inits.append(numpy_helper.from_array(w, f"w{i}"))
        nodes.append(helper.make_node("MatMul", [f"x{w.shape[0]}", f"w{i}"], [f"y{i}"]))
        outputs.append(helper.make_tensor_value_info(f"y{i}", onnx.TensorProto.FLOAT, None))
    inputs = [
        helper.make_tensor_value_info(f"x{k}", onnx.TensorProto.FLOAT, ["rows", k]) for k in widths
    ]
    graph = helper.make_graph(nodes, "matmul_floor", inputs, outputs, inits)
    path = out / "matmul_floor.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]), str(path))
    return Variant("MatMul floor (reference)", path, reference=True)


def _floor_feeds(sess: ort.InferenceSession, rows: int) -> dict[str, np.ndarray]:
    g = np.random.default_rng(0)
    return {
        i.name: g.standard_normal((rows, i.shape[1])).astype(np.float32) for i in sess.get_inputs()
    }


# --- timing --------------------------------------------------------------------------------------


def session(path: pathlib.Path) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def _feeds_for(v: Variant, case: Case) -> dict[str, np.ndarray]:
    assert v.session is not None
    if v.reference:
        return _floor_feeds(v.session, case.rows)
    return {i.name: case.feeds[i.name] for i in v.session.get_inputs()}


def measure(
    variants: list[Variant], cases: list[Case], rounds: int, repeat: int
) -> dict[tuple[str, str], tuple[float, float]]:
    """``{(variant, case): (median ms, max |logit diff|)}``; rounds interleave all variants."""
    live = [v for v in variants if v.path is not None]
    for v in live:
        v.session = session(v.path)  # type: ignore[arg-type]
    diffs: dict[tuple[str, str], float] = {}
    times: dict[tuple[str, str], list[float]] = {}
    for case in cases:
        for v in live:
            assert v.session is not None
            f = _feeds_for(v, case)
            logits = v.session.run(None, f)[0]
            diffs[v.name, case.name] = (
                float("nan")
                if v.reference
                else float(np.max(np.abs(logits - case.expected_logits)))
            )
            v.session.run(None, f)  # warm-up
            times[v.name, case.name] = []
    for _ in range(rounds):
        for case in cases:
            for v in live:
                assert v.session is not None
                f = _feeds_for(v, case)
                t0 = time.perf_counter()
                for _ in range(repeat):
                    v.session.run(None, f)
                times[v.name, case.name].append((time.perf_counter() - t0) / repeat * 1e3)
    return {k: (statistics.median(t), diffs[k]) for k, t in times.items()}


def table(title: str, variants: list[Variant], cases: list[Case], results: dict) -> str:
    lines = [f"\n## {title}", ""]
    head = "| variant | " + " | ".join(f"{c.name} ms | ratio | max diff" for c in cases) + " |"
    lines += [head, "|" + "---|" * (1 + 3 * len(cases))]
    for v in variants:
        if v.path is None:
            lines.append(f"| {v.name} | {v.note} |")
            continue
        cells = []
        for c in cases:
            ms, diff = results[v.name, c.name]
            others = [
                results[o.name, c.name][0]
                for o in variants
                if o.path and o.name != v.name and not o.reference
            ]
            ratio = ms / min(others) if others else float("nan")
            cells.append(f"{ms:.3f} | {ratio:.2f} | {diff:.1e}")
        lines.append(f"| {v.name} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("ratio = median / the best other variant's median on the same row's input.")
    if any(v.reference and v.path for v in variants):
        lines.append(
            "MatMul floor: the same weight products and nothing else (a lower bound for every "
            "variant); its ratio is the best any exporter's model could reach."
        )
    return "\n".join(lines)


# --- runs ----------------------------------------------------------------------------------------


def run_encoder(
    name: str, make: Callable[[], Any], out: pathlib.Path, rounds: int, repeat: int
) -> str:
    model, inputs = make()
    dyn = {k: {0: torch.export.Dim("batch", max=64)} for k in inputs}
    example = {k: torch.cat([t, t]) for k, t in inputs.items()}  # batch 1 would be specialized
    source = Source(model, lambda: dict(example), dyn, {})
    program = source.program()
    with torch.no_grad():
        expected = model(**inputs).last_hidden_state.numpy()
    variants = [_save_irkit(program, {}, out, t) for t in ("onnx", "ort")]
    variants += torch_variants(source, out)
    if variants[0].path is not None:
        variants.append(matmul_floor(variants[0].path, out))
    feeds = {k: v.numpy() for k, v in inputs.items()}
    rows = expected.shape[0] * expected.shape[1]  # (batch, tokens, hidden)
    cases = [Case(name, feeds, expected, rows)]
    return table(name, variants, cases, measure(variants, cases, rounds, repeat))


def run_decoder(out: pathlib.Path, rounds: int, genai_python: str) -> str:
    torch.manual_seed(0)
    lm = decoder()
    exported = export_causal_lm(lm, max_sequence=1024)
    names = exported.lower_kwargs()
    example = causal_lm_feeds(lm, batch=2, seq=3, past=5)
    source = Source(lm, lambda: torch_inputs(lm, example), exported.dynamic_shapes, names)
    variants = [_save_irkit(exported.program, names, out, t) for t in ("onnx", "ort")]
    variants += torch_variants(source, out)
    variants.append(genai_variant(lm, out, genai_python))
    if variants[0].path is not None:
        variants.append(matmul_floor(variants[0].path, out))
    cases = []
    for label, seq, past in [
        ("prefill 128", 128, 0),
        ("decode p127", 1, 127),
        ("decode p511", 1, 511),
    ]:
        feeds = causal_lm_feeds(lm, batch=1, seq=seq, past=past, seed=past)
        cases.append(Case(label, feeds, run_eager(lm, feeds)[0], seq))
    reps = {"prefill 128": 1}
    results: dict = {}
    for case in cases:  # decode steps are short: more runs per timing
        results.update(measure(variants, [case], rounds, reps.get(case.name, 10)))
    return table("Llama-style decoder (hidden 512, 4 layers, 8/2 heads)", variants, cases, results)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--genai-python", default=DEFAULT_GENAI_PYTHON)
    parser.add_argument("--only", default="encoder,vit,decoder")
    parser.add_argument("--workdir", default=None, help="keep the ONNX files here")
    args = parser.parse_args(argv)
    only = set(args.only.split(","))
    with tempfile.TemporaryDirectory() as tmp:
        root = pathlib.Path(args.workdir or tmp)
        print(f"onnxruntime {ort.__version__}, torch {torch.__version__}, 1 intra-op thread")
        for key, title, make in [
            ("encoder", "BERT-like encoder, seq 128", encoder),
            ("vit", "ViT 224", vit),
        ]:
            if key in only:
                out = root / key
                out.mkdir(parents=True, exist_ok=True)
                print(run_encoder(title, make, out, args.rounds, 3), flush=True)
        if "decoder" in only:
            out = root / "decoder"
            out.mkdir(parents=True, exist_ok=True)
            print(run_decoder(out, args.rounds, args.genai_python), flush=True)


if __name__ == "__main__":
    sys.exit(main())
