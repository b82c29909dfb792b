"""Block quantization of a weight matrix into ``com.microsoft.MatMulNBits``'s packed layout.

Round-to-nearest (RTN) quantization of a ``(K, N)`` weight along ``K`` in blocks of
``block_size``, numpy only. The result is what onnxruntime's ``MatMulNBits`` reads and is equal
byte for byte to what onnxruntime's ``MatMulNBitsQuantizer`` (default RTN configuration) writes
for the same settings (``tests/quantize/test_packing.py`` proves it):

- ``B``: ``uint8 [N, n_blocks, blob_size]`` with ``n_blocks = ceil(K / block_size)`` and
  ``blob_size = block_size * bits / 8``; 4-bit values are packed two per byte, the first in the
  low nibble. ``K`` not divisible by the block is padded: the last block's missing rows do not
  take part in its range and their codes are left as onnxruntime leaves them.
- ``scales``: ``[N, n_blocks]``, the weight's float dtype.
- ``zero_points`` (asymmetric only): ``uint8 [N, ceil(n_blocks * bits / 8)]``, packed like
  ``B``; a missing last nibble is the mid value (8).

Symmetric: a block's scale is ``v / -2^(bits-1)`` where ``v`` is its value of largest magnitude
(the smaller one on a tie), so ``v`` maps to code 0; the zero point is implicit
(``2^(bits-1)``). Asymmetric: the block's range is widened to include 0, ``scale = (max - min) /
(2^bits - 1)`` and ``zero_point = round(-min / scale)`` clamped to the code range. A code is
``clamp(round(w / scale + zero_point), 0, 2^bits - 1)``. Arithmetic is float32 as in
onnxruntime's kernel, and rounding is half away from zero (C ``roundf``).

:attr:`Method.KQUANT` (``method="kquant"``) is a better data-free method in the style of
llama.cpp's k-quants (``make_qx_quants``): per block it tries a grid of scales around the RTN one
(and, asymmetric, of ranges shrunk from each end), refits each candidate's scale by least squares
for its codes, and keeps the candidate of least squared reconstruction error. RTN is one of the
candidates, so a block's error is never larger than RTN's (``tests/quantize/test_packing.py``
measures how much smaller); the layout is the same, it just costs 25–120× RTN's time.

RTN is computed by the row kernel of :mod:`irkit.weights._rtn_rows` (the rows of ``Wᵀ``, a
few numpy passes per chunk, threaded); the column packer here (:func:`_quantize_columns`, the
k-quant path) is the reference it is pinned to.

:func:`quantize_columns_int8` is the other layout, ``com.microsoft.DynamicQuantizeMatMul``'s:
int8 codes ``[K, N]`` with one symmetric float32 scale per column (the activations are quantized
by the kernel at run time).

This module imports nothing from irkit but :mod:`irkit.errors` and its own kernel
(:mod:`irkit.weights._rtn_rows`): it is a leaf of the weights floor.
"""

from __future__ import annotations

import dataclasses
import enum

import numpy as np
import numpy.typing as npt

from irkit.errors import QuantizationError
from irkit.weights._rtn_rows import (
    extreme_scales,
    pack_nibbles,
    pack_zero_points,
    range_params,
    rtn_transposed,
)

__all__ = [
    "BITS",
    "BLOCK_SIZES",
    "Method",
    "FLOAT_DTYPES",
    "PackedWeight",
    "check_settings",
    "quantize_blockwise",
    "rtn_scales",
    "dequantize",
    "quantize_columns_int8",
]

BITS = (4, 8)
"""Bit widths irkit packs (``MatMulNBits`` also defines 2; onnxruntime's CPU kernel is slow there)."""

BLOCK_SIZES = (16, 32, 64, 128, 256)
"""Block sizes ``MatMulNBits`` supports (powers of two, at least 16)."""

FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float16))
"""Weight dtypes that can be packed (the scales keep the weight's dtype, as ``A`` must)."""


class Method(enum.Enum):
    """How codes and scales are chosen (both give ``MatMulNBits``' layout)."""

    RTN = "rtn"
    """Round to nearest from the block's range: byte-equal to onnxruntime's quantizer."""
    KQUANT = "kquant"
    """Search of scales (and ranges) around RTN's, least-squares refit, least error kept."""

    @classmethod
    def of(cls, method: Method | str) -> Method:
        """``method`` as a :class:`Method` (its value, e.g. ``"rtn"``, is accepted).

        Raises:
            QuantizationError: Not a method irkit knows.
        """
        try:
            return method if isinstance(method, Method) else cls(method)
        except ValueError:
            known = [m.value for m in cls]
            raise QuantizationError(
                f"method={method!r} is not a quantization method: choose one of {known}"
            ) from None


@dataclasses.dataclass(frozen=True)
class PackedWeight:
    """One quantized ``(K, N)`` weight, laid out as ``MatMulNBits``' inputs.

    Attributes:
        data: ``B``: ``uint8 [N, n_blocks, blob_size]``.
        scales: ``[N, n_blocks]``, the weight's dtype.
        zero_points: ``uint8 [N, ceil(n_blocks * bits / 8)]``, or ``None`` when symmetric.
        k: Rows of the weight (``MatMulNBits``' ``K``).
        n: Columns of the weight (``N``).
        bits: Bits per code.
        block_size: Rows per block.
    """

    data: npt.NDArray[np.uint8]
    scales: npt.NDArray[np.floating]
    zero_points: npt.NDArray[np.uint8] | None
    k: int
    n: int
    bits: int
    block_size: int

    @property
    def n_blocks(self) -> int:
        """Blocks per column: ``ceil(K / block_size)``."""
        return -(-self.k // self.block_size)

    @property
    def nbytes(self) -> int:
        """Bytes of the packed data, scales and zero points together."""
        zp = 0 if self.zero_points is None else self.zero_points.nbytes
        return int(self.data.nbytes + self.scales.nbytes + zp)


def check_settings(bits: int, block_size: int) -> None:
    """Raise unless ``MatMulNBits`` supports this bit width and block size.

    Raises:
        QuantizationError: ``bits`` not in :data:`BITS` or ``block_size`` not in
            :data:`BLOCK_SIZES`.
    """
    if isinstance(bits, bool) or bits not in BITS:
        raise QuantizationError(
            f"bits={bits!r} is not supported: choose one of {list(BITS)} "
            "(com.microsoft.MatMulNBits packs 4- and 8-bit codes)"
        )
    if isinstance(block_size, bool) or block_size not in BLOCK_SIZES:
        raise QuantizationError(
            f"block_size={block_size!r} is not supported: choose one of {list(BLOCK_SIZES)} "
            "(MatMulNBits needs a power of two of at least 16)"
        )


def _blocks(weight: npt.NDArray[np.floating], block_size: int) -> npt.NDArray[np.float32]:
    """The weight transposed to ``(N, n_blocks, block_size)`` float32, zero-padded along K."""
    k, n = weight.shape
    n_blocks = -(-k // block_size)
    padded = np.zeros((n, n_blocks * block_size), dtype=np.float32)
    padded[:, :k] = weight.T
    return padded.reshape(n, n_blocks, block_size)


def _finite_blocks(weight: npt.NDArray[np.floating], block_size: int) -> npt.NDArray[np.float32]:
    """:func:`_blocks`, checked finite (in the contiguous float32 copy: the padding is 0).

    Raises:
        QuantizationError: The weight holds inf or NaN values.
    """
    blocks = _blocks(weight, block_size)
    if not np.isfinite(blocks).all():
        raise QuantizationError("the weight holds inf or NaN values: no finite scale fits them")
    return blocks


def _symmetric_scales(blocks: npt.NDArray[np.float32], bits: int) -> npt.NDArray[np.float32]:
    """Per block: the value of largest magnitude (the minimum on a tie) over ``-2^(bits-1)``."""
    return extreme_scales(blocks.max(axis=2), blocks.min(axis=2), bits)


def _asymmetric_params(
    blocks: npt.NDArray[np.float32], bits: int
) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.uint8]]:
    """Per block: ``scale = (max - min) / (2^bits - 1)`` over the range widened to include 0, and
    the zero point ``round(-min / scale)`` clamped to the code range."""
    return range_params(blocks.max(axis=2), blocks.min(axis=2), bits)


def _codes(
    blocks: npt.NDArray[np.float32],
    scales: npt.NDArray[np.float32],
    zero_points: npt.NDArray[np.uint8],
    bits: int,
) -> npt.NDArray[np.uint8]:
    """``clamp(round(w * (1 / scale) + zero_point), 0, 2^bits - 1)`` in float32."""
    with np.errstate(divide="ignore"):
        reciprocal = np.where(scales != 0, np.float32(1) / scales, np.float32(0))
    reciprocal = reciprocal.astype(np.float32)
    shifted = blocks * reciprocal[:, :, None]
    shifted += zero_points.astype(np.float32)[:, :, None]
    # roundf, then the clamp: for x >= 0, floor(x) + (x - floor(x) >= 0.5), both exact in
    # float32; a negative x clamps to 0 either way.
    floor = np.floor(shifted)
    shifted -= floor
    floor += shifted >= np.float32(0.5)
    top = (1 << bits) - 1
    np.clip(floor, 0, top, out=floor)
    codes: npt.NDArray[np.uint8] = floor.astype(np.uint8)
    return codes


def _pack_codes(codes: npt.NDArray[np.uint8], k: int, bits: int) -> npt.NDArray[np.uint8]:
    """``B`` from the codes ``(N, n_blocks, block_size)``: padding rows are 0, except that for
    an odd ``K`` onnxruntime's kernel leaves the high nibble of the last byte holding the code of
    row ``K - 2`` when that row lies in the same two-block stretch (its loop reuses the pair)."""
    n, n_blocks, block_size = codes.shape
    flat: npt.NDArray[np.uint8] = codes.reshape(n, n_blocks * block_size).copy()
    flat[:, k:] = 0
    if bits == 8:
        return flat.reshape(n, n_blocks, block_size)
    if k % 2 and (k - 1) % (2 * block_size):
        flat[:, k] = flat[:, k - 2]
    return pack_nibbles(flat).reshape(n, n_blocks, block_size // 2)


def _checked_weight(weight: npt.ArrayLike) -> npt.NDArray[np.floating]:
    array = np.asarray(weight)
    if array.ndim != 2:
        raise QuantizationError(
            f"a weight to pack must be a (K, N) matrix, got shape {array.shape}"
        )
    if array.dtype not in FLOAT_DTYPES:
        raise QuantizationError(
            f"a weight of dtype {array.dtype} cannot be packed: MatMulNBits takes "
            f"{[str(d) for d in FLOAT_DTYPES]} (cast the model first)"
        )
    if 0 in array.shape:
        raise QuantizationError(f"an empty weight {array.shape} cannot be packed")
    return array


def _weight_dtype(array: npt.NDArray[np.floating], dtype: npt.DTypeLike | None) -> np.dtype:
    """The dtype the weight is quantized as (its scales' dtype): ``dtype``, else the weight's.

    Raises:
        QuantizationError: ``dtype`` is not a packable dtype at least as wide as the weight's.
    """
    wanted = array.dtype if dtype is None else np.dtype(dtype)
    if wanted not in FLOAT_DTYPES or not np.can_cast(array.dtype, wanted, "safe"):
        raise QuantizationError(
            f"a {array.dtype} weight cannot be packed as {wanted}: give one of "
            f"{[str(d) for d in FLOAT_DTYPES]} at least as wide as the weight"
        )
    return wanted


_KQUANT_STEPS = tuple(0.1 * i for i in range(-9, 10))
"""Offsets of the symmetric divisor ``2^(bits-1) + step`` tried (as llama.cpp's search)."""

_KQUANT_SHRINK = (1.0, 0.95, 0.9, 0.85, 0.8, 0.7)
"""Factors the asymmetric range's ends are shrunk by (every pair is tried)."""


def _least_squares(
    blocks: npt.NDArray[np.float32], levels: npt.NDArray[np.float32]
) -> npt.NDArray[np.float32]:
    """Per block the scale ``s`` minimising ``|w - levels * s|^2`` (0 where the levels are)."""
    num = (blocks * levels).sum(axis=2)
    den = (levels * levels).sum(axis=2)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(den > 0, num / den, 0).astype(np.float32)


class _Best:
    """The least-error codes, scales and zero points seen so far, per block."""

    def __init__(self, blocks: npt.NDArray[np.float32], dtype: np.dtype) -> None:
        self.blocks, self.dtype = blocks, dtype
        self.error: npt.NDArray[np.float32] | None = None
        self.codes = np.zeros(blocks.shape, np.uint8)
        self.scales = np.zeros(blocks.shape[:2], np.float32)
        self.zero_points = np.zeros(blocks.shape[:2], np.uint8)

    def offer(
        self,
        codes: npt.NDArray[np.uint8],
        scales: npt.NDArray[np.float32],
        zero_points: npt.NDArray[np.uint8],
    ) -> None:
        stored = scales.astype(self.dtype).astype(np.float32)  # (the kernel reads this one)
        levels = codes.astype(np.float32) - zero_points.astype(np.float32)[:, :, None]
        error = np.square(self.blocks - levels * stored[:, :, None]).sum(axis=2)
        better = np.ones(error.shape, bool) if self.error is None else error < self.error
        self.error = error if self.error is None else np.where(better, error, self.error)
        self.codes = np.where(better[:, :, None], codes, self.codes)
        self.scales = np.where(better, stored, self.scales)
        self.zero_points = np.where(better, zero_points, self.zero_points)

    def offer_refit(self, codes: npt.NDArray[np.uint8], zero_points: npt.NDArray[np.uint8]) -> None:
        """The codes with their least-squares scale."""
        levels = codes.astype(np.float32) - zero_points.astype(np.float32)[:, :, None]
        self.offer(codes, _least_squares(self.blocks, levels), zero_points)


def _kquant(
    blocks: npt.NDArray[np.float32], bits: int, symmetric: bool, dtype: np.dtype
) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.float32], npt.NDArray[np.uint8]]:
    """Codes, scales and zero points of least squared error over the search (RTN included)."""
    best = _Best(blocks, dtype)
    if symmetric:
        mid = 1 << (bits - 1)
        zero_points = np.full(blocks.shape[:2], mid, dtype=np.uint8)
        hi, lo = blocks.max(axis=2), blocks.min(axis=2)
        extreme = np.where(np.abs(hi) > np.abs(lo), hi, lo)
        for step in _KQUANT_STEPS:
            scales = (extreme / np.float32(-(mid + step))).astype(np.float32)
            stored = scales.astype(dtype).astype(np.float32)
            codes = _codes(blocks, stored, zero_points, bits)
            best.offer(codes, scales, zero_points)
            best.offer_refit(codes, zero_points)
        return best.codes, best.scales, best.zero_points
    lo = np.minimum(blocks.min(axis=2), np.float32(0))
    hi = np.maximum(blocks.max(axis=2), np.float32(0))
    for a in _KQUANT_SHRINK:
        for b in _KQUANT_SHRINK:
            shrunk = np.stack([lo * np.float32(a), hi * np.float32(b)], axis=2)
            scales, zero_points = _asymmetric_params(shrunk, bits)
            stored = scales.astype(dtype).astype(np.float32)
            codes = _codes(blocks, stored, zero_points, bits)
            best.offer(codes, scales, zero_points)
            best.offer_refit(codes, zero_points)
    return best.codes, best.scales, best.zero_points


def quantize_blockwise(
    weight: npt.ArrayLike,
    *,
    bits: int = 4,
    block_size: int = 32,
    symmetric: bool = True,
    method: Method | str = Method.RTN,
    dtype: npt.DTypeLike | None = None,
) -> PackedWeight:
    """Quantize a ``(K, N)`` weight along ``K`` into ``MatMulNBits``' packed inputs (RTN).

    Args:
        weight: The ``(K, N)`` matrix ``B`` of ``A @ B`` (float32 or float16).
        bits: 4 or 8.
        block_size: Rows of ``K`` sharing one scale: 16, 32, 64, 128 or 256.
        symmetric: No zero points (the zero point is the mid code); else per-block zero points.
        method: :attr:`Method.RTN` (onnxruntime's bytes) or :attr:`Method.KQUANT` (less error).
        dtype: The dtype the weight is quantized as (its scales' dtype); default the weight's.
            A float16 weight packed as float32 gives the bytes of ``weight.astype(float32)``
            without that whole copy (a streamed save of an fp16 checkpoint into a float32
            model): each chunk is converted on its way into the blocks.

    Returns:
        The packed weight; see the module docstring for the layout.

    Raises:
        QuantizationError: Unsupported settings or weight (see :func:`check_settings`).

    Example:
        >>> w = np.arange(-8, 8, dtype=np.float32).reshape(16, 1)
        >>> p = quantize_blockwise(w, bits=4, block_size=16)
        >>> p.data.shape, p.scales.tolist(), p.zero_points
        ((1, 1, 8), [[1.0]], None)
        >>> bool((dequantize(p) == w).all())
        True
    """
    check_settings(bits, block_size)
    chosen = Method.of(method)
    array = _checked_weight(weight)
    as_dtype = _weight_dtype(array, dtype)
    k, n = array.shape
    if chosen is Method.RTN:
        data, scales, zero_points = rtn_transposed(array.T, bits, block_size, symmetric, as_dtype)
        return PackedWeight(data, scales, zero_points, k, n, bits, block_size)
    step = max(1, _CHUNK_ELEMENTS // k)
    if step >= n:
        data, scales, zero_points = _quantize_columns(
            array, bits, block_size, symmetric, chosen, as_dtype
        )
    else:  # columns are independent: a chunk at a time bounds the temporaries
        n_blocks = -(-k // block_size)
        data = np.empty((n, n_blocks, block_size * bits // 8), np.uint8)
        scales = np.empty((n, n_blocks), as_dtype)
        zero_points = None if symmetric else np.empty((n, -(-n_blocks * bits // 8)), np.uint8)
        for start in range(0, n, step):
            part = _quantize_columns(
                array[:, start : start + step], bits, block_size, symmetric, chosen, as_dtype
            )
            data[start : start + step], scales[start : start + step] = part[0], part[1]
            if zero_points is not None and part[2] is not None:
                zero_points[start : start + step] = part[2]
    return PackedWeight(data, scales, zero_points, k, n, bits, block_size)


def rtn_scales(
    weight: npt.ArrayLike,
    *,
    bits: int = 4,
    block_size: int = 32,
    symmetric: bool = True,
    dtype: npt.DTypeLike | None = None,
) -> tuple[npt.NDArray[np.floating], npt.NDArray[np.uint8] | None]:
    """The scales and packed zero points (``None`` when symmetric) :func:`quantize_blockwise`
    gives with :attr:`Method.RTN` (and ``dtype``), without computing the codes (scales asked
    for alone).

    Raises:
        QuantizationError: As :func:`quantize_blockwise`.
    """
    check_settings(bits, block_size)
    array = _checked_weight(weight)
    as_dtype = _weight_dtype(array, dtype)
    k, n = array.shape
    n_blocks = -(-k // block_size)
    scales = np.empty((n, n_blocks), as_dtype)
    zero_points = None if symmetric else np.empty((n, -(-n_blocks * bits // 8)), np.uint8)
    step = max(1, _CHUNK_ELEMENTS // k)
    for start in range(0, n, step):
        blocks = _finite_blocks(array[:, start : start + step], block_size)
        if symmetric:
            scales[start : start + step] = _symmetric_scales(blocks, bits)
        else:
            scales32, zp = _asymmetric_params(blocks, bits)
            scales[start : start + step] = scales32
            if zero_points is not None:
                zero_points[start : start + step] = pack_zero_points(zp, bits)
    return scales, zero_points


_CHUNK_ELEMENTS = 1 << 22
"""Weight elements quantized at once (the float64 rounding temporaries are 8 bytes each)."""


def _quantize_columns(
    array: npt.NDArray[np.floating],
    bits: int,
    block_size: int,
    symmetric: bool,
    method: Method,
    dtype: np.dtype,
) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.floating], npt.NDArray[np.uint8] | None]:
    """``B``, scales and zero points (``None`` when symmetric) of some whole columns."""
    k = array.shape[0]
    blocks = _finite_blocks(array, block_size)
    if method is Method.KQUANT:
        codes, scales32, zero_points = _kquant(blocks, bits, symmetric, dtype)
        scales = scales32.astype(dtype)
    else:
        if symmetric:
            scales32 = _symmetric_scales(blocks, bits)
            zero_points = np.full(scales32.shape, 1 << (bits - 1), dtype=np.uint8)
        else:
            scales32, zero_points = _asymmetric_params(blocks, bits)
        scales = scales32.astype(dtype)  # codes use the stored (rounded) scale, as the kernel
        codes = _codes(blocks, scales.astype(np.float32), zero_points, bits)
    packed_zp = None if symmetric else pack_zero_points(zero_points, bits)
    return _pack_codes(codes, k, bits), scales, packed_zp


def _unpack(packed: npt.NDArray[np.uint8], bits: int, count: int) -> npt.NDArray[np.uint8]:
    """Codes along the last axis of a packed array, ``count`` of them."""
    if bits == 8:
        return packed[..., :count]
    codes = np.stack([packed & 0xF, packed >> 4], axis=-1).reshape(*packed.shape[:-1], -1)
    return codes[..., :count]


def dequantize(packed: PackedWeight) -> npt.NDArray[np.float32]:
    """The ``(K, N)`` float32 weight ``MatMulNBits`` computes with: ``(code - zp) * scale``."""
    n, n_blocks, bs = packed.n, packed.n_blocks, packed.block_size
    codes = packed.data.reshape(n, n_blocks, -1)
    values = _unpack(codes, packed.bits, bs).astype(np.float32)
    if packed.zero_points is None:
        zp = np.full((n, n_blocks), 1 << (packed.bits - 1), dtype=np.float32)
    else:
        zp = _unpack(packed.zero_points, packed.bits, n_blocks).astype(np.float32)
    scales = packed.scales.astype(np.float32)
    full = (values - zp[:, :, None]) * scales[:, :, None]
    return np.ascontiguousarray(full.reshape(n, n_blocks * bs)[:, : packed.k].T)


def quantize_columns_int8(
    weight: npt.ArrayLike, *, reduce_range: bool = True
) -> tuple[npt.NDArray[np.int8], npt.NDArray[np.float32]]:
    """``(Wq int8 [K, N], scale float32 [N])`` of a float32 ``(K, N)`` weight, symmetric per
    column, as ``com.microsoft.DynamicQuantizeMatMul`` reads them: ``W ≈ Wq · scale``.

    ``scale = max|W[:, n]| / L`` (1 for an all-zero column) and ``Wq = clamp(round(W / scale),
    -L, L)``, halves to even (numpy). ``L = 64`` with ``reduce_range`` (7-bit codes): onnxruntime's
    u8×s8 kernels on x86 CPUs without VNNI add pairs of products in 16-bit saturating arithmetic
    and ``2 · 255 · 127`` overflows it (measured on AVX2: a 64-deep product off by 11% of its
    range with ``L = 127``, under 1% with ``L = 64``); ``L = 127`` is for VNNI and ARM CPUs.

    Raises:
        QuantizationError: Not a 2-D float32 weight, empty, or holding inf/NaN.

    >>> q, s = quantize_columns_int8(np.array([[1.0, -2.0], [0.5, 4.0]], np.float32))
    >>> q.tolist(), s.tolist()
    ([[64, -32], [32, 64]], [0.015625, 0.0625])
    >>> quantize_columns_int8(np.array([[1.0], [-0.5]], np.float32), reduce_range=False)[0].tolist()
    [[127], [-64]]
    """
    array = _checked_weight(weight)
    if array.dtype != np.float32:
        raise QuantizationError(
            f"a weight of dtype {array.dtype} cannot be quantized for DynamicQuantizeMatMul, "
            "which takes float32 (cast the model to float32 first)"
        )
    if not np.isfinite(array).all():
        raise QuantizationError("the weight holds inf or NaN values: no finite scale fits them")
    limit = np.float32(64 if reduce_range else 127)
    peak = np.abs(array).max(axis=0).astype(np.float32)
    scale = np.where(peak > 0, peak / limit, np.float32(1)).astype(np.float32)
    codes = np.clip(np.round(array / scale), -limit, limit).astype(np.int8)
    return np.ascontiguousarray(codes), scale
