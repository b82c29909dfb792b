"""The settings of one :func:`irkit.quantize` run, and :class:`Activations` (which op it writes)."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping

from irkit.errors import QuantizationError
from irkit.weights.packing import Method, check_settings

DEFAULT_ACCURACY_LEVEL = 4
"""``accuracy_level`` when none is given: 4 (activations quantized to int8 inside the kernel),
the onnxruntime-genai builder's CPU default, about 2× faster decode on CPU than 0."""

_DEFAULT_BLOCK_SIZE = 32


class Activations(enum.Enum):
    """What happens to the activations of a quantized product (``activations=`` of
    :func:`irkit.quantize`; its value, e.g. ``"dynamic"``, is accepted too)."""

    NONE = "none"
    """Weight-only: ``com.microsoft.MatMulNBits`` (4 or 8 bits per block of ``K``); the product
    is computed in float, or with ``accuracy_level=4`` in int8 blocks inside the kernel. Bound
    by weight bytes: the fast decode."""
    DYNAMIC = "dynamic"
    """Dynamic int8: ``com.microsoft.DynamicQuantizeMatMul`` (int8 weights, one scale per output
    column, 7-bit codes so that every x86 CPU computes them exactly); the kernel quantizes the
    activations to uint8 per call and every product is an int8 GEMM: the fast prefill."""
    DYNAMIC_FULL_RANGE = "dynamic-full-range"
    """As :attr:`DYNAMIC` with the full int8 range of codes (``|Wq| <= 127``): more precise on
    CPUs with VNNI or ARM dot products, wrong on AVX2/AVX-512F without VNNI (16-bit saturation
    in onnxruntime's u8×s8 kernel)."""

    @property
    def dynamic(self) -> bool:
        """Whether the product becomes ``DynamicQuantizeMatMul``."""
        return self is not Activations.NONE

    @classmethod
    def of(cls, activations: Activations | str | None) -> Activations:
        """``activations`` as an :class:`Activations` (``None`` is :attr:`NONE`).

        Raises:
            QuantizationError: Not a value irkit knows.
        """
        if activations is None:
            return cls.NONE
        try:
            return activations if isinstance(activations, Activations) else cls(activations)
        except ValueError:
            known = [a.value for a in cls]
            raise QuantizationError(
                f"activations={activations!r} is not supported: choose one of {known}"
            ) from None


class Embeddings(enum.Enum):
    """Which embedding ``Gather`` nodes become ``com.microsoft.GatherBlockQuantized``
    (``embeddings=`` of :func:`irkit.quantize`; ``True`` is :attr:`ALL`, ``False`` :attr:`NONE`).
    """

    NONE = "none"
    """Every table stays in float."""
    TIED = "tied"
    """Only a table a quantized product multiplies by too (a tied embedding / lm_head: ``Gather(E)``
    and ``MatMul(x, Transpose(E))``): one packed initializer serves both ops, so the float table
    leaves the file (what ``irkit export`` does, as onnxruntime-genai's builder does)."""
    ALL = "all"
    """Every ``Gather`` of a constant 2-D float table (position tables too)."""

    @classmethod
    def of(cls, embeddings: Embeddings | bool | str) -> Embeddings:
        """``embeddings`` as an :class:`Embeddings`.

        Raises:
            QuantizationError: Not a value irkit knows.
        """
        if isinstance(embeddings, Embeddings):
            return embeddings
        if isinstance(embeddings, bool):
            return cls.ALL if embeddings else cls.NONE
        try:
            return cls(embeddings)
        except ValueError:
            known = [e.value for e in cls]
            raise QuantizationError(
                f"embeddings={embeddings!r} is not supported: True, False or one of {known}"
            ) from None


@dataclasses.dataclass(frozen=True)
class Settings:
    """One run's settings, as checked by :func:`irkit.quantize`."""

    bits: int
    block_size: int
    symmetric: bool
    accuracy_level: int
    method: Method
    embeddings: Embeddings
    activations: Activations = Activations.NONE

    @property
    def op_type(self) -> str:
        """The ``com.microsoft`` op the products become."""
        return "DynamicQuantizeMatMul" if self.activations.dynamic else "MatMulNBits"


def checked_settings(
    *,
    bits: int,
    block_size: int,
    symmetric: bool,
    accuracy_level: int | None,
    bits_for: Mapping[str, int],
    method: Method | str,
    embeddings: Embeddings | bool | str,
    activations: Activations | str | None,
) -> Settings:
    """The settings of :func:`irkit.quantize`'s arguments.

    Raises:
        QuantizationError: A value the chosen op does not take, or an option that does not
            apply to it (dynamic int8 has no blocks, levels, zero points or k-quant search).
    """
    check_settings(bits, block_size)
    for pattern, b in bits_for.items():
        if not isinstance(pattern, str):
            raise QuantizationError(f"bits_for keys are module path globs, got {pattern!r}")
        check_settings(b, block_size)
    mode = Activations.of(activations)
    chosen = Method.of(method)
    tables = Embeddings.of(embeddings)
    if mode.dynamic:
        _check_dynamic(bits, block_size, symmetric, accuracy_level, bits_for, chosen, tables)
        return Settings(bits, block_size, symmetric, 0, chosen, tables, mode)
    level = DEFAULT_ACCURACY_LEVEL if accuracy_level is None else accuracy_level
    if isinstance(level, bool) or level not in (0, 1, 2, 3, 4):
        raise QuantizationError(
            f"accuracy_level={accuracy_level!r}: MatMulNBits takes 0 (unset), 1 (fp32), "
            "2 (fp16), 3 (bf16) or 4 (int8)"
        )
    return Settings(bits, block_size, symmetric, int(level), chosen, tables, mode)


def _check_dynamic(
    bits: int,
    block_size: int,
    symmetric: bool,
    accuracy_level: int | None,
    bits_for: Mapping[str, int],
    method: Method,
    embeddings: Embeddings,
) -> None:
    """Refuse the options that do not apply to ``DynamicQuantizeMatMul``, naming the fix."""
    where = "activations='dynamic' (DynamicQuantizeMatMul)"
    problems = []
    if bits != 8:
        problems.append(f"bits={bits}: its weights are int8, pass bits=8")
    if any(b != 8 for b in bits_for.values()):
        problems.append(
            f"bits_for={dict(bits_for)!r}: every product is int8; keep layers in float with "
            "exclude= instead"
        )
    if block_size != _DEFAULT_BLOCK_SIZE:
        problems.append(
            f"block_size={block_size}: its weights have one scale per output column, no blocks; "
            "leave block_size out"
        )
    if not symmetric:
        problems.append("symmetric=False: its int8 weights are symmetric; leave symmetric out")
    if accuracy_level is not None:
        problems.append(
            f"accuracy_level={accuracy_level!r}: it always computes in int8; leave it out"
        )
    if method is not Method.RTN:
        problems.append(
            f"method={method.value!r}: per-column int8 rounds to nearest; use method='rtn'"
        )
    if embeddings is not Embeddings.NONE:
        problems.append(
            f"embeddings={embeddings.value!r}: GatherBlockQuantized is weight-only; quantize "
            "embeddings with activations=None"
        )
    if problems:
        raise QuantizationError(f"{where}: " + "; ".join(problems))
