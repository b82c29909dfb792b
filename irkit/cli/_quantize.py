"""``irkit quantize``: weight-only int4/int8 quantization of any ONNX file (no torch needed)."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable

from irkit.cli._common import (
    EXIT_OK,
    add_external_data,
    count_nodes,
    external_data,
    input_file,
    output_file,
    refuse_overwriting_weights,
    side_file,
)
from irkit.cli._files import load_onnx

__all__ = ["COMMANDS"]

_SUMMARY = "quantize the weights of MatMul/Gemm to 4 or 8 bits (com.microsoft.MatMulNBits)"

_EPILOG = """\
examples:
  irkit quantize model.onnx -o model.int4.onnx
  irkit quantize model.onnx -o model.int8.onnx --bits 8 --block-size 128
  irkit quantize model.onnx -o out.onnx --exclude lm_head --exclude 'layers.0.*'
  irkit quantize model.onnx -o out.onnx --embeddings --method kquant
  irkit quantize model.onnx -o model.dyn8.onnx --activations dynamic

Runs irkit.quantize: every MatMul, FusedMatMul and Gemm whose weight is a constant (directly,
through a Transpose, or fed to a local function by every call) becomes MatMulNBits; local
functions stay shared. --embeddings also turns embedding Gathers into GatherBlockQuantized (a
tied lm_head shares its packed initializer); --tied-embeddings only such a tied table. --method
kquant searches scales for less error than round-to-nearest (slower to pack). --accuracy-level defaults to 4 (int8 activations in the kernel, the CPU
choice); 0 computes in float. --activations dynamic writes DynamicQuantizeMatMul instead (int8
weights per output column, activations quantized per call: faster prefill, 8-bit decode).
Prints what was quantized and every MatMul left alone with why.
The output runs in onnxruntime (CPU, CUDA). The input file is never modified."""


def _arguments(p: argparse.ArgumentParser) -> None:
    from irkit.rules.quantize import Activations, Embeddings
    from irkit.weights.packing import BITS, BLOCK_SIZES, Method

    p.add_argument("model", metavar="MODEL", help="the ONNX file to quantize")
    p.add_argument("-o", "--output", required=True, help="where to write the quantized model")
    p.add_argument(
        "--bits",
        type=int,
        choices=BITS,
        default=None,
        help="bits per weight (default 4; 8 with --activations dynamic)",
    )
    p.add_argument(
        "--block-size",
        type=int,
        choices=BLOCK_SIZES,
        default=32,
        help="rows of K sharing one scale (default 32)",
    )
    p.add_argument(
        "--asymmetric",
        action="store_true",
        help="per-block zero points (default: symmetric, no zero points)",
    )
    p.add_argument(
        "--accuracy-level",
        type=int,
        choices=(0, 1, 2, 3, 4),
        default=None,
        metavar="N",
        help="MatMulNBits accuracy_level: 0 float, 4 int8 activations (default 4)",
    )
    p.add_argument(
        "--exclude",
        action="append",
        default=[],
        metavar="GLOB",
        help="module path glob (or node name) to keep in float; repeatable",
    )
    p.add_argument(
        "--method",
        choices=[m.value for m in Method],
        default=Method.RTN.value,
        help="rtn: round to nearest (onnxruntime's bytes, default); kquant: less error",
    )
    tables = p.add_mutually_exclusive_group()
    tables.add_argument(
        "--embeddings",
        dest="embeddings",
        action="store_const",
        const=Embeddings.ALL,
        default=Embeddings.NONE,
        help="also quantize embedding Gathers (com.microsoft.GatherBlockQuantized)",
    )
    tables.add_argument(
        "--tied-embeddings",
        dest="embeddings",
        action="store_const",
        const=Embeddings.TIED,
        help="quantize only an embedding table a quantized lm_head multiplies by too (one "
        "packed initializer for both; what irkit export does)",
    )
    p.add_argument(
        "--activations",
        choices=[a.value for a in Activations],
        default=Activations.NONE.value,
        help="none: weight-only MatMulNBits (fast decode, default); dynamic: int8 "
        "DynamicQuantizeMatMul (fast prefill; dynamic-full-range for VNNI/ARM CPUs)",
    )
    add_external_data(p)


def _run(args: argparse.Namespace) -> int:
    import irkit

    source = input_file(args.model, "an ONNX file")
    destination = output_file(args.output, source)
    start = time.perf_counter()
    model = load_onnx(args.model)
    refuse_overwriting_weights(side_file(args, destination, model), model)
    before = count_nodes(model)
    report = irkit.QuantizeReport()
    irkit.quantize(
        model,
        bits=args.bits or (4 if args.activations == "none" else 8),
        block_size=args.block_size,
        symmetric=not args.asymmetric,
        accuracy_level=args.accuracy_level,
        exclude=args.exclude,
        method=args.method,
        embeddings=args.embeddings,
        activations=args.activations,
        report=report,
    )
    after = count_nodes(model)
    irkit.save(model, destination, external_data=external_data(args))
    if args.quiet:
        return EXIT_OK
    out = sys.stdout
    out.write(f"{args.model} → {args.output} ({time.perf_counter() - start:.2f} s)\n")
    out.write(f"  nodes       {sum(before)} → {sum(after)} (main graph + functions)\n")
    out.write(str(report) + "\n")
    return EXIT_OK


_Command = tuple[
    str, str, Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]
]

COMMANDS: dict[str, _Command] = {"quantize": (_SUMMARY, _EPILOG, _arguments, _run)}
