"""irkit's packing equals onnxruntime's ``MatMulNBitsQuantizer`` (default RTN) byte for byte."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from irkit.errors import QuantizationError
from irkit.weights.packing import dequantize, quantize_blockwise

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
