"""irkit's packing equals onnxruntime's ``MatMulNBitsQuantizer`` (default RTN) byte for byte."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from irkit.errors import QuantizationError
from irkit.weights.packing import Method, dequantize, quantize_blockwise, rtn_scales

matmul_nbits_quantizer = pytest.importorskip("onnxruntime.quantization.matmul_nbits_quantizer")


def _ort_packed(w: np.ndarray, bits: int, block_size: int, symmetric: bool) -> list[np.ndarray]:
    """B, scales (and zero points) as onnxruntime's quantizer writes them for ``x @ w``."""
    elem = TensorProto.FLOAT if w.dtype == np.float32 else TensorProto.FLOAT16
    k, n = w.shape
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["a", "w"], ["y"])],
        "g",
        [helper.make_tensor_value_info("a", elem, [1, k])],
        [helper.make_tensor_value_info("y", elem, [1, n])],
        [numpy_helper.from_array(w, "w")],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    config = matmul_nbits_quantizer.DefaultWeightOnlyQuantConfig(
        block_size=block_size, is_symmetric=symmetric, bits=bits
    )
    quantizer = matmul_nbits_quantizer.MatMulNBitsQuantizer(proto, algo_config=config)
    quantizer.process()
    out = quantizer.model.model.graph
    (node,) = out.node
    assert node.op_type == "MatMulNBits"
    tensors = {t.name: numpy_helper.to_array(t) for t in out.initializer}
    return [tensors[name] for name in node.input[1:]]


def _weight(k: int, n: int, dtype: type, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((k, n)) * (0.02, 1.0, 40.0)[seed % 3]
    if k >= 64 and n >= 3:  # an all-zero block, an all-positive one, a ±tie
        w[:16, 0] = 0
        w[16:32, 1] = np.abs(w[16:32, 1])
        w[32:48, 2] = 0
        w[32, 2], w[33, 2] = 1.5, -1.5
    return w.astype(dtype)


SHAPES = [(64, 8), (96, 5), (50, 3), (31, 4), (33, 2), (17, 3), (300, 6)]
SETTINGS = list(itertools.product((4, 8), (16, 32, 64, 128, 256), (True, False)))


@pytest.mark.parametrize(("bits", "block_size", "symmetric"), SETTINGS)
def test_packing_equals_onnxruntime_byte_for_byte(bits, block_size, symmetric):
    for seed, ((k, n), dtype) in enumerate(itertools.product(SHAPES, (np.float32, np.float16))):
        w = _weight(k, n, dtype, seed)
        expected = _ort_packed(w, bits, block_size, symmetric)
        packed = quantize_blockwise(w, bits=bits, block_size=block_size, symmetric=symmetric)
        mine = [packed.data, packed.scales] + ([] if symmetric else [packed.zero_points])
        assert len(mine) == len(expected)
        names = ("B", "scales", "zero_points")[: len(mine)]
        for name, ours, theirs in zip(names, mine, expected, strict=True):
            where = f"{name} of a {k}x{n} {np.dtype(dtype).name} weight"
            assert ours.dtype == theirs.dtype, where
            assert ours.shape == theirs.shape, where
            assert ours.tobytes() == theirs.tobytes(), where


@pytest.mark.parametrize(("bits", "bound"), [(4, 0.1), (8, 0.006)])
def test_dequantized_error(bits, bound):
    """Asymmetric codes are within half a step; symmetric ones within a step (the extreme
    maps to code 0, so the other side's largest value can clamp at the top code)."""
    w = np.random.default_rng(1).standard_normal((256, 16)).astype(np.float32)
    for symmetric, steps in ((True, 1.0), (False, 0.5)):
        packed = quantize_blockwise(w, bits=bits, block_size=32, symmetric=symmetric)
        err = np.abs(dequantize(packed) - w)
        step = np.repeat(np.abs(packed.scales.T), 32, axis=0)  # (K, N) per-element scale
        assert (err <= steps * step * (1 + 1e-5)).all()
        assert err.mean() / np.abs(w).mean() < bound


def test_layout_and_sizes():
    packed = quantize_blockwise(
        np.ones((100, 7), np.float32), bits=4, block_size=32, symmetric=False
    )
    assert packed.data.shape == (7, 4, 16) and packed.data.dtype == np.uint8
    assert packed.scales.shape == (7, 4) and packed.zero_points.shape == (7, 2)
    assert packed.nbytes == 7 * 4 * 16 + 7 * 4 * 4 + 7 * 2


@pytest.mark.parametrize(
    ("kwargs", "weight", "message"),
    [
        ({"bits": 3}, np.ones((32, 2), np.float32), "bits=3"),
        ({"block_size": 48}, np.ones((32, 2), np.float32), "block_size=48"),
        ({}, np.ones((2, 32, 2), np.float32), "(K, N) matrix"),
        ({}, np.ones((32, 2), np.float64), "float64"),
        ({}, np.full((32, 2), np.nan, np.float32), "NaN"),
    ],
)
def test_bad_input_is_a_quantization_error(kwargs, weight, message):
    with pytest.raises(QuantizationError, match=message.replace("(", r"\(").replace(")", r"\)")):
        quantize_blockwise(weight, **kwargs)


def _outliers(w: np.ndarray, seed: int) -> np.ndarray:
    """1% of the values 20× larger (the heavy tails of real LLM weights)."""
    rng = np.random.default_rng(seed)
    heavy = w.copy()
    heavy[rng.random(w.shape) < 0.01] *= 20
    return heavy


def _mse(w: np.ndarray, packed) -> float:
    return float(np.mean(np.square(dequantize(packed) - w.astype(np.float32))))


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("outliers", [False, True], ids=["normal", "outliers"])
def test_kquant_has_less_error_than_rtn_in_every_block(bits, symmetric, dtype, outliers):
    """The search includes RTN's own candidate: never more error per block, and less overall
    (figures of the float32 4-bit cases in docs/quantization.md)."""
    w = np.random.default_rng(2).standard_normal((256, 48)).astype(np.float32)
    w = (_outliers(w, 3) if outliers else w).astype(dtype)
    settings = dict(bits=bits, block_size=32, symmetric=symmetric)
    rtn = quantize_blockwise(w, **settings)
    kq = quantize_blockwise(w, method=Method.KQUANT, **settings)
    assert kq.data.shape == rtn.data.shape and kq.scales.dtype == rtn.scales.dtype
    assert (kq.zero_points is None) == symmetric
    per_block = lambda p: np.square(dequantize(p) - w.astype(np.float32)).reshape(8, 32, 48).sum(1)  # noqa: E731
    assert (per_block(kq) <= per_block(rtn) * (1 + 1e-6) + 1e-12).all()
    ratio = _mse(w, kq) / _mse(w, rtn)
    assert ratio < (0.97 if bits == 4 and not outliers else 0.995), ratio


def test_chunked_packing_and_rtn_scales_equal_the_whole():
    from irkit.weights import packing

    w = np.random.default_rng(4).standard_normal((97, 301)).astype(np.float32)
    for symmetric in (True, False):
        whole = quantize_blockwise(w, symmetric=symmetric)
        scales, zero_points = rtn_scales(w, symmetric=symmetric)
        saved = packing._CHUNK_ELEMENTS
        packing._CHUNK_ELEMENTS = 97 * 40  # 8 chunks of 40 columns
        try:
            chunked = quantize_blockwise(w, symmetric=symmetric)
            scales_chunked, zp_chunked = rtn_scales(w, symmetric=symmetric)
        finally:
            packing._CHUNK_ELEMENTS = saved
        for a, b in ((chunked.data, whole.data), (chunked.scales, whole.scales),
                     (scales, whole.scales), (scales_chunked, whole.scales)):  # fmt: skip
            assert a.tobytes() == b.tobytes()
        if not symmetric:
            assert zero_points.tobytes() == whole.zero_points.tobytes()
            assert zp_chunked.tobytes() == whole.zero_points.tobytes()


@pytest.mark.parametrize("method", list(Method))
@pytest.mark.parametrize("symmetric", [True, False])
def test_float16_weight_packed_as_float32_equals_packing_its_float32_copy(symmetric, method):
    """``dtype=float32`` on a float16 weight (a streamed save of an fp16 checkpoint into a
    float32 model) converts chunk by chunk: the bytes of packing ``weight.astype(float32)``."""
    from irkit.weights import packing

    w16 = (np.random.default_rng(5).standard_normal((97, 301)) * 0.02).astype(np.float16)
    w32 = w16.astype(np.float32)
    for chunk in (packing._CHUNK_ELEMENTS, 97 * 40):
        saved, packing._CHUNK_ELEMENTS = packing._CHUNK_ELEMENTS, chunk
        try:
            options = dict(bits=4, block_size=32, symmetric=symmetric)
            expected = quantize_blockwise(w32, method=method, **options)
            got = quantize_blockwise(w16, method=method, dtype=np.float32, **options)
            scales, zero_points = rtn_scales(w16, dtype=np.float32, **options)
        finally:
            packing._CHUNK_ELEMENTS = saved
        assert got.scales.dtype == np.float32
        assert got.data.tobytes() == expected.data.tobytes()
        assert got.scales.tobytes() == expected.scales.tobytes()
        if symmetric:
            assert got.zero_points is None and zero_points is None
        else:
            assert got.zero_points.tobytes() == expected.zero_points.tobytes()
        if method is Method.RTN:
            assert scales.tobytes() == expected.scales.tobytes()
            assert symmetric or zero_points.tobytes() == expected.zero_points.tobytes()
    with pytest.raises(QuantizationError, match="cannot be packed as float16"):
        quantize_blockwise(w32, dtype=np.float16)
    w16[3, 7] = np.inf
    with pytest.raises(QuantizationError, match="inf or NaN"):
        quantize_blockwise(w16, dtype=np.float32)


def _column_rtn(w: np.ndarray, bits: int, block_size: int, symmetric: bool, dtype) -> list:
    """The column-chunk RTN packer every RTN weight went through before the row kernel (still
    :func:`quantize_blockwise`'s path for k-quants): the reference the row kernel is pinned to."""
    from irkit.weights import packing

    data, scales, zp = packing._quantize_columns(
        w, bits, block_size, symmetric, Method.RTN, np.dtype(dtype)
    )
    return [data, scales] + ([] if zp is None else [zp])


def _special_blocks(w: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Blocks the kernel treats apart: all zero (both signs), a ±tie of the extreme, float16
    subnormals, values that land on exact halves of the code grid, a constant block."""
    k, n = w.shape
    if k >= 64 and n >= 6:
        w[:16, 0] = 0
        w[:16, 1] = -0.0
        w[16:32, 2] = 0
        w[16, 2], w[20, 2] = 1.5, -1.5
        w[32:48, 3] = rng.integers(-5, 5, 16) * np.float32(2.0**-24)  # float16 subnormals
        w[:32, 4] = np.arange(-16, 16) / np.float32(16)  # (codes on .5: roundf vs rint)
        w[32:64, 5] = 0.25
    return w


# rows not a multiple of any block, odd rows (the odd-K nibble rule), 1 column, a weight large
# enough for the threads (2^20 elements), and a C-contiguous (K, N) array (no free transpose)
PIN_SHAPES = [(67, 5), (33, 7), (1, 3), (31, 1), (97, 301), (300, 6), (1000, 1100), (2048, 520)]


@pytest.mark.parametrize(("bits", "block_size", "symmetric"), SETTINGS)
def test_row_kernel_equals_the_column_packer(bits, block_size, symmetric):
    """The RTN row kernel (``irkit.weights._rtn_rows``: integer range keys, float16 bit conversion,
    ``floor(y + 0.49999997)``, threads) gives the old packer's bytes on random weights of odd
    shapes, float32 and float16, packed as their own dtype and float16 as float32, whether the
    weight is a transposed view (``Linear.weight.T``, the streamed case) or C-contiguous."""
    rng = np.random.default_rng(bits * 1000 + block_size + symmetric)
    for k, n in PIN_SHAPES:
        for dtype, as_dtype in ((np.float32, None), (np.float16, None), (np.float16, np.float32)):
            scale = (0.02, 3.0, 1e-3)[int(rng.integers(3))]
            base = _special_blocks(rng.standard_normal((k, n)).astype(np.float32) * scale, rng)
            w16 = base.astype(dtype)
            for w in (np.ascontiguousarray(w16.T).T, np.ascontiguousarray(w16)):
                expected = _column_rtn(w, bits, block_size, symmetric, as_dtype or dtype)
                packed = quantize_blockwise(
                    w, bits=bits, block_size=block_size, symmetric=symmetric, dtype=as_dtype
                )
                got = [packed.data, packed.scales] + ([] if symmetric else [packed.zero_points])
                names = ("B", "scales", "zp")[: len(got)]
                for name, ours, theirs in zip(names, got, expected, strict=True):
                    where = f"{name} of {k}x{n} {np.dtype(dtype).name} as {as_dtype}"
                    assert ours.dtype == theirs.dtype and ours.shape == theirs.shape, where
                    assert ours.tobytes() == theirs.tobytes(), where


def test_row_kernel_refuses_inf_and_nan_in_any_block():
    """The row kernel finds a non-finite value from the range keys (float16 bit conversion
    would turn inf into a finite number): a ``QuantizationError``, whichever block holds it."""
    for dtype in (np.float16, np.float32):
        for bad in (np.inf, -np.inf, np.nan):
            w = np.ones((64, 40), dtype)
            w[37, 29] = bad
            for symmetric in (True, False):
                with pytest.raises(QuantizationError, match="inf or NaN"):
                    quantize_blockwise(w, symmetric=symmetric, dtype=np.float32)
