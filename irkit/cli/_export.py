"""``irkit export``: a Hugging Face causal-LM folder → a folder onnxruntime-genai runs.

Needs the ``irkit[llm]`` extra (transformers, safetensors); imported when the command runs.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from collections.abc import Callable

from irkit.cli._common import EXIT_OK, CommandLineError

__all__ = ["COMMANDS", "EXTRA_PACKAGES"]

#: What ``irkit export`` imports (module name → pip package), all in the ``irkit[llm]`` extra.
EXTRA_PACKAGES = {"transformers": "transformers", "safetensors": "safetensors"}

_EPILOG = """\
examples:
  irkit export path/to/Qwen2.5-0.5B-Instruct -o qwen-onnx
  irkit export path/to/llama -o llama-onnx --max-length 2048 --overwrite
  irkit export path/to/llama -o llama-int4 --precision int4
  irkit export path/to/llama -o llama-cuda-int4 --precision int4 -e cuda

MODEL_DIR is a local Hugging Face folder (config.json, *.safetensors, tokenizer files); nothing
is downloaded. OUT_DIR gets model.onnx + model.onnx.data, genai_config.json, config.json,
generation_config.json and the tokenizer and chat-template files: onnxruntime-genai's
og.Model(OUT_DIR) runs it. The weights are streamed from the shards, never loaded whole.
On a terminal it shows the stages and the tensors and MB written (nothing when piped; -q: only
errors). Needs the irkit[llm] extra (pip install 'irkit[llm]')."""

_PRECISIONS = ("fp32", "fp16", "int4", "int8")  # irkit.llm._export.PRECISIONS, without torch
_TARGETS = ("onnx", "ort")
_PROVIDERS = ("cpu", "cuda")  # irkit.llm._provider.ExecutionProvider, without torch


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", metavar="MODEL_DIR", help="a Hugging Face model folder")
    p.add_argument("-o", "--output", required=True, metavar="OUT_DIR", help="the folder to write")
    p.add_argument(
        "--precision",
        choices=_PRECISIONS,
        default="fp32",
        help="weights and compute dtype: fp32 (default), fp16, or fp32 with int4/int8 "
        "matmul weights (MatMulNBits)",
    )
    p.add_argument(
        "--target",
        choices=_TARGETS,
        default="ort",
        help="irkit.optimize target: onnxruntime's contrib ops (default: GroupQueryAttention, "
        "as genai's builder writes) or standard ONNX only",
    )
    p.add_argument(
        "-e",
        "--execution-provider",
        choices=_PROVIDERS,
        default="cpu",
        help="where onnxruntime-genai runs the folder (written into genai_config.json): cpu "
        "(default) or cuda (float16 compute: int4/int8 pack float16 matmuls; fp32 is refused)",
    )
    p.add_argument(
        "--max-length",
        type=int,
        metavar="N",
        help="search.max_length in genai_config.json, prompt + generated tokens "
        "(default: min(max_position_embeddings, 4096))",
    )
    p.add_argument(
        "--kv-buffer",
        choices=("windowed", "shared", "concat"),
        default="windowed",
        help="KV cache: one buffer of max_length shared by past and present "
        "(past_present_share_buffer true: opset 24 TensorScatter for target onnx, "
        "GroupQueryAttention for target ort), each sliding-window layer's on a buffer of its "
        "window (windowed, the default: target ort; a padded batch of prompts longer than "
        "the window + 16 is refused), or past + new concatenated (concat, opset 23)",
    )
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty OUT_DIR")
    p.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="allow a model defined by Python code in MODEL_DIR (runs that code)",
    )
    p.add_argument(
        "--no-layer-reuse",
        dest="layer_reuse",
        action="store_false",
        help="trace every decoder layer (default: trace one period of provably identical "
        "layers and stamp it out to all; the same model, exported faster)",
    )


def _check_extra() -> None:
    missing = [
        pip for module, pip in EXTRA_PACKAGES.items() if not importlib.util.find_spec(module)
    ]
    if missing:
        raise CommandLineError(f"irkit export needs {', '.join(missing)}: pip install 'irkit[llm]'")


def _export(args: argparse.Namespace) -> int:
    _check_extra()
    if args.max_length is not None and args.max_length < 2:
        raise CommandLineError(f"--max-length {args.max_length}: must be 2 or more")
    from irkit.llm import Progress, export

    progress = Progress(sys.stderr, quiet=args.quiet)
    result = export(
        args.model,
        args.output,
        precision=args.precision,
        target=args.target,
        execution_provider=args.execution_provider,
        max_length=args.max_length,
        share_buffer=args.kv_buffer != "concat",
        windowed_cache=args.kv_buffer == "windowed",
        overwrite=args.overwrite,
        trust_remote_code=args.trust_remote_code,
        layer_reuse=args.layer_reuse,
        progress=progress,
    )
    if not args.quiet:
        sys.stdout.write(f"{args.model} → {result.path}/  ({', '.join(result.files)})\n")
    return EXIT_OK


_Command = tuple[
    str, str, Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]
]

COMMANDS: dict[str, _Command] = {
    "export": (
        "export a Hugging Face causal-LM folder to a folder onnxruntime-genai runs",
        _EPILOG,
        _arguments,
        _export,
    ),
}
