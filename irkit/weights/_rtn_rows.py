"""The round-to-nearest arithmetic of :mod:`irkit.weights.packing` and its fast path: the row
kernel that packs a weight from the rows of its transpose.

A ``Linear`` weight as a checkpoint stores it, ``[N, K]``, is already ``MatMulNBits``' block
layout (blocks run along ``K``), so :func:`rtn_transposed` quantizes rows of ``Wᵀ`` with no
transpose, in chunks of :data:`_ROW_ELEMENTS` elements on :func:`_workers` threads, each chunk in
about a dozen numpy passes: the symmetric range from one integer reduction over the values' bits
(:func:`_magnitude_keys`: no float reductions, no ``isfinite`` pass), float16 widened by integer
shifts (:func:`_half_to_float`), C ``roundf`` as ``floor(y + 0.49999997)``. The bytes are those
of the column packer (``packing._quantize_columns``), pinned by
``tests/quantize/test_packing.py``; see ``docs/quantization.md`` ("How RTN is computed").

This module imports nothing from irkit but :mod:`irkit.errors`.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os

import numpy as np
import numpy.typing as npt

from irkit.errors import QuantizationError

__all__ = [
    "extreme_scales",
    "pack_nibbles",
    "pack_zero_points",
    "range_params",
    "round_half_away",
    "rtn_transposed",
]


def round_half_away(x: npt.NDArray[np.float32]) -> npt.NDArray[np.float64]:
    """C ``roundf``: halves away from zero (float64 holds ``x ± 0.5`` exactly)."""
    wide = x.astype(np.float64)
    return np.trunc(wide + np.copysign(0.5, wide))


def extreme_scales(
    hi: npt.NDArray[np.float32], lo: npt.NDArray[np.float32], bits: int
) -> npt.NDArray[np.float32]:
    """:func:`_symmetric_scales` from each block's maximum ``hi`` and minimum ``lo``."""
    extreme = np.where(np.abs(hi) > np.abs(lo), hi, lo)
    scales: npt.NDArray[np.float32] = (extreme / np.float32(-(1 << (bits - 1)))).astype(np.float32)
    return scales


def range_params(
    hi: npt.NDArray[np.float32], lo: npt.NDArray[np.float32], bits: int
) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.uint8]]:
    """:func:`_asymmetric_params` from each block's maximum ``hi`` and minimum ``lo``."""
    top = (1 << bits) - 1
    lo = np.minimum(lo, np.float32(0))
    hi = np.maximum(hi, np.float32(0))
    scales = ((hi - lo) / np.float32(top)).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        zp_float = np.where(scales != 0, np.float32(0) - lo / scales, lo).astype(np.float32)
    zero_points = np.clip(round_half_away(zp_float), 0, top).astype(np.uint8)
    return scales, zero_points


def pack_nibbles(codes: npt.NDArray[np.uint8]) -> npt.NDArray[np.uint8]:
    """Two 4-bit codes per byte along the last axis, the first in the low nibble."""
    packed: npt.NDArray[np.uint8] = ((codes[..., 0::2] & 0xF) | (codes[..., 1::2] << 4)).astype(
        np.uint8
    )
    return packed


def pack_zero_points(zero_points: npt.NDArray[np.uint8], bits: int) -> npt.NDArray[np.uint8]:
    """``zero_points`` packed like ``B``; an odd block count's missing nibble is the mid value."""
    if bits == 8:
        return zero_points
    n, n_blocks = zero_points.shape
    if n_blocks % 2:
        mid = np.full((n, 1), 1 << (bits - 1), dtype=np.uint8)
        zero_points = np.concatenate([zero_points, mid], axis=1)
    return pack_nibbles(zero_points)


_ROW_ELEMENTS = 1 << 18
"""Weight elements the RTN row kernel works on at once: its scratch (about 2.5 MB) stays in the
caches through its dozen passes, and numpy's per-call cost is spread over enough elements."""

_PARALLEL_ELEMENTS = 1 << 20
"""Weights of fewer elements are packed on the calling thread alone."""

_HALF_DOWN = np.nextafter(np.float32(0.5), np.float32(0))
"""The float32 below 0.5: ``floor(y + _HALF_DOWN)`` is C ``roundf(y)`` for every float32
``y >= 0`` (exhaustively checked over ``[0, 300)``: ``y + 0.5`` would round ``0.49999997`` and
``1.4999999`` up), and a negative ``y`` clamps to 0 either way."""


def _workers() -> int:
    """Threads the RTN row kernel may use: the CPUs this process may run on (at most 8)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # (not Linux)
        cpus = os.cpu_count() or 1
    return max(1, min(8, cpus))


@dataclasses.dataclass
class _RowScratch:
    """One thread's buffers for :func:`_rtn_rows` (allocated once, reused chunk after chunk)."""

    floats: npt.NDArray[np.float32]
    codes: npt.NDArray[np.uint8]
    bits: npt.NDArray[np.uint32]
    more_bits: npt.NDArray[np.uint32]
    exact_half: bool
    """Whether :func:`_half_to_float` is exact on the thread that made the scratch."""

    @classmethod
    def of(cls, elements: int) -> _RowScratch:
        """Buffers for ``elements`` weight elements, made on the thread that uses them."""

        def u32() -> npt.NDArray[np.uint32]:
            return np.empty(elements, np.uint32)

        floats, codes = np.empty(elements, np.float32), np.empty(elements, np.uint8)
        return cls(floats, codes, u32(), u32(), _exact_half_trick())


_KEY_TOP = {np.dtype(np.float16): 0x7C00 << 1, np.dtype(np.float32): 0x7F800000 << 1}
"""The smallest magnitude key (:func:`_magnitude_keys`) of an inf or NaN, per source dtype."""

_UNSIGNED = {np.dtype(np.float16): np.uint16, np.dtype(np.float32): np.uint32}


def _magnitude_keys(
    rows: npt.NDArray[np.floating], scratch: _RowScratch
) -> npt.NDArray[np.unsignedinteger]:
    """The bits of each value rotated left by one, ``|v|``'s bits above the sign, as unsigned
    integers: ordered by magnitude, a negative value above the positive one of its magnitude
    (the symmetric scale's tie rule), and inf/NaN at or above :data:`_KEY_TOP`. Integer
    reductions are twice as fast as numpy's float ones, which also check for NaN."""
    unsigned = _UNSIGNED[rows.dtype]
    raw = rows.view(unsigned)
    keys = scratch.bits.view(unsigned)[: rows.size].reshape(rows.shape)
    carry = scratch.more_bits.view(unsigned)[: rows.size].reshape(rows.shape)
    np.left_shift(raw, 1, out=keys)
    np.right_shift(raw, 8 * raw.itemsize - 1, out=carry)
    np.bitwise_or(keys, carry, out=keys)
    return keys


def _unkey(keys: npt.NDArray[np.unsignedinteger], dtype: np.dtype) -> npt.NDArray[np.float32]:
    """The values (float32) whose :func:`_magnitude_keys` are ``keys``."""
    width = 8 * keys.itemsize - 1
    raw = (keys >> 1) | (keys << width)
    return raw.astype(keys.dtype).view(dtype).astype(np.float32)


def _half_to_float(rows: npt.NDArray[np.float16], out: npt.NDArray[np.float32]) -> None:
    """``out[...] = rows`` for finite float16 ``rows`` (inf and NaN become finite values: check
    first), in 4 integer/float passes where numpy's cast is 2.4x slower: the int16 bits
    sign-extended to int32 and shifted left 13 put the magnitude's bits in a float32 whose
    exponent is 112 short and fill bits 28-31 with the sign; masking bits 28-30 leaves the sign
    in bit 31, and times ``2^112`` is exact (subnormals included)."""
    bits = out.view(np.int32)
    np.copyto(bits, rows.view(np.int16))
    np.left_shift(bits, 13, out=bits)
    np.bitwise_and(bits, np.int32(-0x70000001), out=bits)  # (0x8FFFFFFF)
    np.multiply(out, np.float32(2.0**112), out=out)


def _exact_half_trick() -> bool:
    """Whether :func:`_half_to_float` converts subnormals exactly in this thread (not when the
    CPU is set to treat float32 subnormals as zero)."""
    halves = np.array([1, 0x83FF, 0x7BFF, 0x8000, 0xFBFF], np.uint16).view(np.float16)
    out = np.empty(halves.shape, np.float32)
    _half_to_float(halves, out)
    return bool((out == halves.astype(np.float32)).all())


def _extremes(
    rows: npt.NDArray[np.floating],
    floats: npt.NDArray[np.float32],
    block_size: int,
    scratch: _RowScratch,
) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]] | None:
    """Per block of whole ``rows`` (``K`` a multiple of the block): ``(hi, lo)`` with the
    block's extreme (:func:`extreme_scales`' choice) in both, from one integer reduction over
    :func:`_magnitude_keys`; ``floats`` gets the rows as float32. ``None`` where the faster
    route does not apply (another dtype, or float16 subnormals not exact here).

    Raises:
        QuantizationError: The rows hold inf or NaN values.
    """
    if rows.dtype not in _KEY_TOP or rows.shape[1] % block_size:
        return None
    half = rows.dtype == np.float16
    if half and not scratch.exact_half:
        return None
    c, k = rows.shape
    keys = _magnitude_keys(rows, scratch).reshape(c, k // block_size, block_size)
    top = keys.max(axis=2)
    if (top >= _KEY_TOP[rows.dtype]).any():
        raise QuantizationError("the weight holds inf or NaN values: no finite scale fits them")
    if half:
        _half_to_float(rows, floats)  # (after the check: inf would become finite)
    else:
        floats[...] = rows
    extreme = _unkey(top, rows.dtype)
    zero = extreme == 0
    if zero.any():  # (a zero block's scale keeps the sign numpy's min gives it, as before)
        extreme[zero] = floats.reshape(keys.shape)[zero].min(axis=1)
    return extreme, extreme


def _rtn_rows(
    rows: npt.NDArray[np.floating],
    out: tuple[npt.NDArray[np.uint8], npt.NDArray[np.floating], npt.NDArray[np.uint8] | None],
    bits: int,
    block_size: int,
    scratch: _RowScratch,
) -> None:
    """RTN-quantize ``rows`` (``(c, K)`` C-contiguous: ``c`` columns of the weight, i.e. rows of
    ``Wᵀ``) into ``out``: ``B``, scales (their dtype: the quantized-as dtype) and unpacked zero
    points (``None`` when symmetric), each ``c`` rows long. The same bytes as
    the column packer (``packing._quantize_columns``; ``tests/quantize/test_packing.py``), in fewer passes: the blocks
    are the rows' own memory (no transpose), the range is checked finite on the per-block
    extremes, ``roundf`` is ``floor(y + _HALF_DOWN)`` (the clamp makes it a truncation).

    Raises:
        QuantizationError: The rows hold inf or NaN values.
    """
    data, scales_out, zp_out = out
    c, k = rows.shape
    n_blocks = -(-k // block_size)
    width = n_blocks * block_size
    floats = scratch.floats[: c * width].reshape(c, width)
    blocks = floats.reshape(c, n_blocks, block_size)
    extremes = _extremes(rows, floats, block_size, scratch) if zp_out is None else None
    if extremes is None:
        floats[:, :k] = rows
        if width > k:
            floats[:, k:] = 0  # (zero padding: never the extreme, inside the range widened to 0)
        hi, lo = blocks.max(axis=2), blocks.min(axis=2)
        if not (np.isfinite(hi).all() and np.isfinite(lo).all()):  # (inf or NaN: an extreme)
            raise QuantizationError("the weight holds inf or NaN values: no finite scale fits them")
    else:
        hi, lo = extremes
    if zp_out is None:
        scales32 = extreme_scales(hi, lo, bits)
        shift: npt.NDArray[np.float32] | np.float32 = np.float32(1 << (bits - 1))
    else:
        scales32, zero_points = range_params(hi, lo, bits)
        zp_out[...] = zero_points
        shift = zero_points.astype(np.float32)[:, :, None]
    scales_out[...] = scales32  # (rounded to the stored dtype: the codes use that one)
    stored = scales_out.astype(np.float32)
    reciprocal = np.zeros(stored.shape, np.float32)
    np.divide(np.float32(1), stored, out=reciprocal, where=stored != 0)
    np.multiply(blocks, reciprocal[:, :, None], out=blocks)
    np.add(blocks, shift, out=blocks)
    np.add(blocks, _HALF_DOWN, out=blocks)
    np.clip(blocks, 0, (1 << bits) - 1, out=blocks)
    codes = scratch.codes[: c * width].reshape(c, width)
    np.copyto(codes, floats, casting="unsafe")  # (truncation: the floor of y >= 0)
    if width > k:  # as onnxruntime leaves the padding (see ``packing._pack_codes``)
        codes[:, k:] = 0
        if bits == 4 and k % 2 and (k - 1) % (2 * block_size):
            codes[:, k] = codes[:, k - 2]
    if bits == 8:
        data[...] = codes.reshape(data.shape)
        return
    pairs = codes.view(np.uint16)  # (little-endian: the first code in the low byte)
    high = scratch.bits.view(np.uint16)[: pairs.size].reshape(pairs.shape)
    np.right_shift(pairs, 4, out=high)
    np.bitwise_or(pairs, high, out=pairs)
    np.copyto(data.reshape(pairs.shape), pairs, casting="unsafe")


def rtn_transposed(
    transposed: npt.NDArray[np.floating],
    bits: int,
    block_size: int,
    symmetric: bool,
    dtype: np.dtype,
) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.floating], npt.NDArray[np.uint8] | None]:
    """``B``, scales and packed zero points of the weight whose transpose ``(N, K)`` is
    ``transposed`` (C-contiguous, or a view whose rows are), by :func:`_rtn_rows` a few rows at a
    time, on :func:`_workers` threads for a large weight (numpy releases the GIL in its loops;
    each thread fills its own rows of the outputs)."""
    n, k = transposed.shape
    n_blocks = -(-k // block_size)
    data = np.empty((n, n_blocks, block_size * bits // 8), np.uint8)
    scales = np.empty((n, n_blocks), dtype)
    zero_points = None if symmetric else np.empty((n, n_blocks), np.uint8)
    step = max(1, _ROW_ELEMENTS // (n_blocks * block_size))

    def run(first: int, last: int) -> None:
        scratch = _RowScratch.of(step * n_blocks * block_size)
        for start in range(first, last, step):
            end = min(start + step, last)
            zp = None if zero_points is None else zero_points[start:end]
            parts = (data[start:end], scales[start:end], zp)
            _rtn_rows(transposed[start:end], parts, bits, block_size, scratch)

    workers = min(_workers(), -(-n // step)) if n * k >= _PARALLEL_ELEMENTS else 1
    if workers == 1:
        run(0, n)
    else:
        bounds = [n * i // workers for i in range(workers + 1)]
        with concurrent.futures.ThreadPoolExecutor(workers) as pool:
            jobs = [pool.submit(run, a, b) for a, b in zip(bounds, bounds[1:], strict=False)]
            for job in jobs:
                job.result()  # (re-raises a worker's QuantizationError)
    packed_zp = None if zero_points is None else pack_zero_points(zero_points, bits)
    return data, scales, packed_zp
