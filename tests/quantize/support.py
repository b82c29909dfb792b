"""Hand-built models for the quantization tests (onnx.helper, then onnx-ir)."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

import numpy as np
import onnx
import onnx_ir as ir
from onnx import TensorProto, helper, numpy_helper

from irkit import metadata
from irkit.metadata import Frame
from irkit.weights.packing import dequantize, quantize_blockwise

RNG_SEED = 0
FLOAT = TensorProto.FLOAT


def model(
    nodes: Sequence[onnx.NodeProto],
    inputs: Mapping[str, tuple[int, Sequence[int]]],
    outputs: Sequence[str],
    initializers: Mapping[str, np.ndarray],
    functions: Sequence[onnx.FunctionProto] = (),
) -> ir.Model:
    """A model from ONNX nodes; outputs' types are left to onnxruntime."""
    graph = helper.make_graph(
        list(nodes),
        "g",
        [helper.make_tensor_value_info(n, t, s) for n, (t, s) in inputs.items()],
        [helper.make_tensor_value_info(n, FLOAT, None) for n in outputs],
        [numpy_helper.from_array(a, n) for n, a in initializers.items()],
    )
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    if functions:
        opsets.append(helper.make_opsetid("local", 1))
    proto = helper.make_model(graph, opset_imports=opsets, functions=list(functions))
    proto.ir_version = 10
    return ir.serde.deserialize_model(proto)


def weights(*shapes: tuple[int, int], seed: int = RNG_SEED) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(np.float32) for s in shapes]


def fake_quant(w: np.ndarray, bits: int = 4, block_size: int = 32, symmetric: bool = True):
    """The (K, N) weight MatMulNBits computes with."""
    return dequantize(quantize_blockwise(w, bits=bits, block_size=block_size, symmetric=symmetric))


def shared_blocks(k: int = 64) -> tuple[ir.Model, dict[str, np.ndarray]]:
    """``y = Block(Block(x, a1, a2), b1, b2)``, ``Block(x, w1, w2) = Lin(Lin(x, w1), w2)``,
    ``Lin(x, w) = MatMul(x, Transpose(w))``: one body of each, four Linear instances; with
    irkit's scope metadata (modules ``block0``/``block1``, ``.fc1``/``.fc2``)."""
    lin = helper.make_function(
        "local",
        "Lin",
        ["x", "w"],
        ["y"],
        [
            helper.make_node("Transpose", ["w"], ["t"], perm=[1, 0]),
            helper.make_node("MatMul", ["x", "t"], ["y"], name="mm"),
        ],
        [helper.make_opsetid("", 21)],
    )
    block = helper.make_function(
        "local",
        "Block",
        ["x", "w1", "w2"],
        ["y"],
        [
            helper.make_node("Lin", ["x", "w1"], ["h"], domain="local", name="fc1"),
            helper.make_node("Relu", ["h"], ["r"]),
            helper.make_node("Lin", ["r", "w2"], ["y"], domain="local", name="fc2"),
        ],
        [helper.make_opsetid("", 21), helper.make_opsetid("local", 1)],
    )
    names = ["a1", "a2", "b1", "b2"]
    inits = dict(zip(names, weights(*[(k, k)] * 4), strict=True))
    m = model(
        [
            helper.make_node("Block", ["x", "a1", "a2"], ["h"], domain="local", name="block0"),
            helper.make_node("Block", ["h", "b1", "b2"], ["y"], domain="local", name="block1"),
        ],
        {"x": (FLOAT, [2, 3, k])},
        ["y"],
        inits,
        [lin, block],
    )
    _stamp_scopes(m)
    return m, inits


def _stamp_scopes(m: ir.Model) -> None:
    """Scope metadata as irkit.lower + outline write it."""
    block_frame = Frame("block0", 0, "m.Block")
    for node in m.graph:
        frame = Frame(node.name or "", 0, "m.Block")
        node.metadata_props[metadata.CALL_MODULE] = metadata.encode_call(frame)
    block = m.functions[("local", "Block", "")]
    block.metadata_props[metadata.OUTLINE_ORIGIN] = metadata.encode_scope([block_frame])
    for node in block:
        if node.op_type == "Lin":
            frame = Frame(f"block0.{node.name}", 0, "m.Lin")
            node.metadata_props[metadata.CALL_MODULE] = metadata.encode_call(frame)
    lin = m.functions[("local", "Lin", "")]
    origin = [block_frame, Frame("block0.fc1", 0, "m.Lin")]
    lin.metadata_props[metadata.OUTLINE_ORIGIN] = metadata.encode_scope(origin)
    for node in lin:
        node.metadata_props[metadata.SCOPE] = metadata.encode_scope(origin)


def shared_blocks_reference(
    x: np.ndarray,
    inits: Mapping[str, np.ndarray],
    float_weights: Sequence[str] = (),
    **settings,
) -> np.ndarray:
    """``shared_blocks``' output with the weights fake-quantized (but ``float_weights``)."""

    def lin(h: np.ndarray, name: str) -> np.ndarray:
        w = np.ascontiguousarray(inits[name].T)
        return h @ (w if name in float_weights else fake_quant(w, **settings))

    h = lin(np.maximum(lin(x, "a1"), 0), "a2")
    return lin(np.maximum(lin(h, "b1"), 0), "b2")


def quiet_ort_quantizer() -> None:
    logging.getLogger("onnxruntime.quantization").setLevel(logging.ERROR)
