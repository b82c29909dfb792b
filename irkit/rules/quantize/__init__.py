"""Quantization: MatMul / FusedMatMul / Gemm with a constant weight → MatMulNBits (weight-only)
or DynamicQuantizeMatMul (dynamic int8 activations).

Identity: ``A @ W = MatMulNBits(A, pack(W))`` up to the rounding of ``W`` to ``bits`` per value
(round to nearest, per block of ``block_size`` rows of ``K``; packing in
:mod:`irkit.weights.packing`, byte-equal to onnxruntime's ``MatMulNBitsQuantizer``). With
``activations="dynamic"`` (:class:`Activations`): ``A @ W ≈ DynamicQuantizeMatMul(A, Wq, s)``,
``Wq`` int8 with one scale per output column (7-bit codes by default,
:func:`irkit.weights.packing.quantize_columns_int8`), ``A`` quantized to uint8 by the kernel at
each call: every product is an int8 GEMM, the fast prefill on CPU.

Which nodes (each one not taken is reported with why, see :class:`QuantizeReport`):

- ``MatMul(A, W)``, ``MatMul(A, Transpose(W))`` (irkit lowers every ``Linear`` so),
  ``com.microsoft.FusedMatMul`` (``alpha = 1``, no batch transposes; ``transB`` is the
  ``Transpose``, ``transA`` becomes a ``Transpose`` of ``A``'s last two axes before the
  ``MatMulNBits``: LFM2's conv ``out_proj`` over the channels-first conv output), ``Gemm`` (``alpha = beta = 1``, ``transA = 0``, a 1-D ``C`` of ``N`` values
  becomes MatMulNBits' ``bias``; so does a 1-D ``Add`` of the product, afterwards:
  :mod:`irkit.rules.quantize._bias`);
- the weight is a 2-D float32/float16 constant (an initializer that is not a graph input, or a
  ``Constant``) of the activation's dtype, with ``K >= block_size`` (dynamic int8: float32, any
  ``K``; embedding Gathers stay weight-only);
- or the weight is an input of a local function whose every call passes such a constant (through
  any depth of calls). The function body is rewritten once: that input becomes the packed
  weight, scales (and zero points) inputs, and every call passes its own packed initializers, so
  a deduplicated body stays one function. When the calls of one body want different settings
  (``exclude=``/``bits_for=`` by module path), the functions are copied from the innermost level
  of calls that parts them down to the body (:class:`Specializer`).

This is a pass rather than a :class:`~irkit.rewriting.Rule`: a rule rewrites inside one graph or
function body, while quantizing a function's weight changes the function's signature and every
call of it, up to the main graph.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

import onnx_ir as ir

from irkit.rewriting import rewrite
from irkit.rules._calls import Calls
from irkit.rules.quantize._bias import MATMUL_NBITS_BIAS
from irkit.rules.quantize._choice import Choice, collect, note_quantized, note_tied, specialize
from irkit.rules.quantize._options import (
    DEFAULT_ACCURACY_LEVEL,
    Activations,
    Embeddings,
    checked_settings,
)
from irkit.rules.quantize._packer import Packer
from irkit.rules.quantize._report import QuantizedNode, QuantizeReport, SkippedNode
from irkit.rules.quantize._rewrite import apply_sites, initializer_bytes
from irkit.rules.quantize._sites import dynamic_note, refuse_weightless
from irkit.weights.packing import Method

__all__ = [
    "quantize",
    "Activations",
    "Embeddings",
    "QuantizeReport",
    "QuantizedNode",
    "SkippedNode",
    "DEFAULT_ACCURACY_LEVEL",
]


def quantize(
    model: ir.Model,
    *,
    bits: int = 4,
    block_size: int = 32,
    symmetric: bool = True,
    accuracy_level: int | None = None,
    exclude: str | Sequence[str] = (),
    bits_for: Mapping[str, int] | None = None,
    method: Method | str = Method.RTN,
    embeddings: Embeddings | bool | str = False,
    activations: Activations | str | None = None,
    report: QuantizeReport | None = None,
) -> ir.Model:
    """Quantize the model's constant matmul weights **in place** into ``com.microsoft.MatMulNBits``
    (or, with ``activations="dynamic"``, ``com.microsoft.DynamicQuantizeMatMul``).

    See the module docstring for which nodes are taken; every ``MatMul``/``FusedMatMul``/``Gemm``
    left alone is listed in the report with why. Inside local functions the weight inputs become
    packed inputs, so deduplicated bodies stay deduplicated. A model that holds no quantizable
    node (an already quantized one, say) is left as it is, with a report note.

    Args:
        model: The model; modified in place.
        bits: 4 or 8.
        block_size: Rows of ``K`` per scale: 16, 32, 64, 128 or 256.
        symmetric: No zero points (else per-block zero points: slightly more accurate, more bytes).
        accuracy_level: MatMulNBits' ``accuracy_level``; ``None`` means
            :data:`DEFAULT_ACCURACY_LEVEL` (4: int8 activations inside the kernel, the CPU
            choice of onnxruntime-genai's builder). 0 computes in the activation's float type.
        exclude: Module path globs (or node names) to leave in float: ``"lm_head"``,
            ``"layers.0.*"``. A pattern also covers the modules below the one it names.
        bits_for: Per-module bit widths overriding ``bits`` (first matching glob wins), e.g.
            ``{"lm_head": 8}``.
        method: ``"rtn"`` (round to nearest, onnxruntime's bytes) or ``"kquant"`` (a search
            of scales with least squares: less reconstruction error, 25–120× the packing time);
            see :class:`irkit.weights.packing.Method`.
        embeddings: Also turn embedding ``Gather`` nodes of constant 2-D float tables into
            ``com.microsoft.GatherBlockQuantized`` (same bits, block size and zero points; 4
            or 8 bits): ``True``/``"all"`` every one, ``"tied"`` only a table a quantized
            product multiplies by too (:class:`Embeddings`). A table tied to a quantized
            lm_head (``MatMul(x, Transpose(E))``) with the same bits is packed once: both ops
            read one initializer.
        activations: ``None``/``"none"`` (weight-only ``MatMulNBits``: the fast decode),
            ``"dynamic"`` (``DynamicQuantizeMatMul``: int8 weights with one scale per output
            column, activations quantized per call by the kernel: the fast prefill; needs
            ``bits=8`` and no block, level, zero point, k-quant or embedding option) or
            ``"dynamic-full-range"`` (8-bit instead of 7-bit codes: for VNNI/ARM CPUs only);
            see :class:`Activations`. Site finding, ``exclude=``, the report and local
            functions (quantized weights become function inputs) are shared by both paths.
        report: If given, filled with the :class:`QuantizeReport`.

    On a weightless model (lowered from a ``meta``-device program) the packed weights, scales
    and zero points are derived tensors (:class:`irkit.weights.Packed` recipes over the
    checkpoint tensors): :func:`irkit.save` with ``weights=`` packs them one tensor at a time
    while streaming the shards, to the same bytes as quantizing the real model in memory.
    Dynamic int8 is not derived while saving: it refuses a weightless model.

    Returns:
        ``model`` itself.

    Raises:
        QuantizationError: Unsupported ``bits``, ``block_size``, ``accuracy_level``,
            ``bits_for``, ``method`` or ``activations``; an option the dynamic path does not
            take; a weightless weight on the dynamic path (before any change).

    Example:
        >>> import numpy as np, onnx_ir as ir
        >>> x = ir.Value(name="x", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([1, 64]))
        >>> w = ir.Value(name="w", const_value=ir.tensor(np.ones((64, 8), np.float32)))
        >>> mm = ir.node("MatMul", [x, w])
        >>> graph = ir.Graph([x], mm.outputs, nodes=[mm], initializers=[w], opset_imports={"": 21})
        >>> [n.op_type for n in quantize(ir.Model(graph, ir_version=10)).graph]
        ['MatMulNBits']
    """
    start = time.perf_counter()
    patterns = (exclude,) if isinstance(exclude, str) else tuple(exclude)
    overrides = dict(bits_for or {})
    settings = checked_settings(
        bits=bits,
        block_size=block_size,
        symmetric=symmetric,
        accuracy_level=accuracy_level,
        bits_for=overrides,
        method=method,
        embeddings=embeddings,
        activations=activations,
    )
    if settings.activations.dynamic:
        refuse_weightless(model, settings)
    result = QuantizeReport(bytes_before=initializer_bytes(model), into=settings.op_type)
    if settings.activations.dynamic:
        result.notes.append(dynamic_note(settings.activations))
    choice = Choice(bits, patterns, overrides)
    result.notes += specialize(model, choice, settings)
    calls = Calls.of(model)
    packer = Packer(model, calls, settings)
    sites = collect(model, calls, choice, packer, result)
    note_quantized(model, sites, result)
    note_tied(sites, calls, result)
    apply_sites(model, sites, packer, result)
    if not settings.activations.dynamic:
        rewrite(model, MATMUL_NBITS_BIAS)  # a linear layer's bias Add into MatMulNBits
    result.functions = sorted(f"{f.domain}::{f.name}" for f in packer.changed_functions.values())
    result.bytes_after = initializer_bytes(model)
    result.seconds = time.perf_counter() - start
    if report is not None:
        report.fill_from(result)
    return model
