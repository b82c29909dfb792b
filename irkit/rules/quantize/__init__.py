"""Weight-only quantization: MatMul / FusedMatMul / Gemm with a constant weight → MatMulNBits.

Identity: ``A @ W = MatMulNBits(A, pack(W))`` up to the rounding of ``W`` to ``bits`` per value
(round to nearest, per block of ``block_size`` rows of ``K``; packing in
:mod:`irkit.weights.packing`, byte-equal to onnxruntime's ``MatMulNBitsQuantizer``).

Which nodes (each one not taken is reported with why, see :class:`QuantizeReport`):

- ``MatMul(A, W)``, ``MatMul(A, Transpose(W))`` (irkit lowers every ``Linear`` so),
  ``com.microsoft.FusedMatMul`` (``alpha = 1``, no ``transA``/batch transposes; ``transB`` is the
  ``Transpose``), ``Gemm`` (``alpha = beta = 1``, ``transA = 0``, a 1-D ``C`` of ``N`` values
  becomes MatMulNBits' ``bias``);
- the weight is a 2-D float32/float16 constant (an initializer that is not a graph input, or a
  ``Constant``) of the activation's dtype, with ``K >= block_size``;
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

from irkit.errors import QuantizationError
from irkit.rules._calls import Calls
from irkit.rules.quantize._choice import Choice, collect, note_quantized, note_tied, specialize
from irkit.rules.quantize._packer import Packer, Settings
from irkit.rules.quantize._report import QuantizedNode, QuantizeReport, SkippedNode
from irkit.rules.quantize._rewrite import apply_sites, initializer_bytes
from irkit.weights.packing import Method, check_settings

__all__ = ["quantize", "QuantizeReport", "QuantizedNode", "SkippedNode", "DEFAULT_ACCURACY_LEVEL"]

DEFAULT_ACCURACY_LEVEL = 4
"""``accuracy_level`` when none is given: 4 (activations quantized to int8 inside the kernel),
the onnxruntime-genai builder's CPU default, about 2× faster decode on CPU than 0."""


def _checked_options(
    bits: int, block_size: int, accuracy_level: int | None, bits_for: Mapping[str, int]
) -> int:
    check_settings(bits, block_size)
    for pattern, b in bits_for.items():
        if not isinstance(pattern, str):
            raise QuantizationError(f"bits_for keys are module path globs, got {pattern!r}")
        check_settings(b, block_size)
    level = DEFAULT_ACCURACY_LEVEL if accuracy_level is None else accuracy_level
    if isinstance(level, bool) or level not in (0, 1, 2, 3, 4):
        raise QuantizationError(
            f"accuracy_level={accuracy_level!r}: MatMulNBits takes 0 (unset), 1 (fp32), "
            "2 (fp16), 3 (bf16) or 4 (int8)"
        )
    return int(level)


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
    embeddings: bool = False,
    report: QuantizeReport | None = None,
) -> ir.Model:
    """Quantize the model's constant matmul weights **in place** into ``com.microsoft.MatMulNBits``.

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
        embeddings: Also turn each embedding ``Gather`` of a constant 2-D float table into
            ``com.microsoft.GatherBlockQuantized`` (same bits, block size and zero points; 4
            or 8 bits). A table tied to a quantized lm_head (``MatMul(x, Transpose(E))``) with
            the same bits is packed once: both ops read one initializer.
        report: If given, filled with the :class:`QuantizeReport`.

    On a weightless model (lowered from a ``meta``-device program) the packed weights, scales
    and zero points are derived tensors (:class:`irkit.weights.Packed` recipes over the
    checkpoint tensors): :func:`irkit.save` with ``weights=`` packs them one tensor at a time
    while streaming the shards, to the same bytes as quantizing the real model in memory.

    Returns:
        ``model`` itself.

    Raises:
        QuantizationError: Unsupported ``bits``, ``block_size``, ``accuracy_level``,
            ``bits_for`` or ``method``.

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
    level = _checked_options(bits, block_size, accuracy_level, overrides)
    settings = Settings(bits, block_size, symmetric, level, Method.of(method), embeddings)
    result = QuantizeReport(bytes_before=initializer_bytes(model))
    choice = Choice(bits, patterns, overrides)
    result.notes += specialize(model, choice, settings)
    calls = Calls.of(model)
    packer = Packer(model, calls, settings)
    sites = collect(model, calls, choice, packer, result)
    note_quantized(model, sites, result)
    note_tied(sites, calls, result)
    apply_sites(model, sites, packer, result)
    result.functions = sorted(f"{f.domain}::{f.name}" for f in packer.changed_functions.values())
    result.bytes_after = initializer_bytes(model)
    result.seconds = time.perf_counter() - start
    if report is not None:
        report.fill_from(result)
    return model
