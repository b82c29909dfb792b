"""Hand-built onnx-ir models with irkit scope metadata, for testing outlining without torch."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import numpy as np
import onnx_ir as ir

from irkit import metadata as md

F32 = ir.DataType.FLOAT


class Builder:
    """Build a graph node by node, stamping the current module scope on every node."""

    def __init__(self, opset: int = 21):
        self.nodes: list[ir.Node] = []
        self.inputs: list[ir.Value] = []
        self.initializers: list[ir.Value] = []
        self.scope: list[md.Frame] = []
        self.opset = opset
        self._n = 0
        self.rng = np.random.default_rng(0)

    def input(self, name: str, shape: Sequence[int | str]) -> ir.Value:
        v = ir.Value(name=name, type=ir.TensorType(F32), shape=ir.Shape(list(shape)))
        self.inputs.append(v)
        return v

    def weight(self, name: str, shape: Sequence[int], array: np.ndarray | None = None) -> ir.Value:
        arr = self.rng.standard_normal(shape).astype(np.float32) if array is None else array
        v = ir.Value(
            name=name,
            type=ir.TensorType(F32),
            shape=ir.Shape(list(shape)),
            const_value=ir.tensor(arr, name=name),
        )
        self.initializers.append(v)
        return v

    @contextlib.contextmanager
    def module(self, path: str, cls: str, call_index: int = 0) -> Iterator[None]:
        self.scope.append(md.Frame(path, call_index, cls))
        try:
            yield
        finally:
            self.scope.pop()

    def op(self, op_type: str, *inputs: ir.Value, num_outputs: int = 1, **attrs: object):
        self._n += 1
        name = f"{op_type.lower()}_{self._n}"
        node = ir.Node(
            "",
            op_type,
            inputs,
            attributes=ir.convenience.convert_attributes(attrs),
            num_outputs=num_outputs,
            name=name,
            metadata_props={
                md.SCOPE: md.encode_scope(self.scope),
                md.SOURCE: f"model.py:{self._n}",
                md.FX_NODE: name,
            },
        )
        for i, out in enumerate(node.outputs):
            out.name = name if num_outputs == 1 else f"{name}__{i}"
        self.nodes.append(node)
        return node.outputs[0] if num_outputs == 1 else node.outputs

    def model(self, outputs: Sequence[ir.Value]) -> ir.Model:
        graph = ir.Graph(
            self.inputs,
            outputs,
            nodes=self.nodes,
            initializers=self.initializers,
            opset_imports={"": self.opset},
            name="main",
        )
        model = ir.Model(graph, ir_version=10, producer_name="irkit")
        ir.passes.common.ShapeInferencePass()(model)
        return model


# --- module "classes" written as builder functions --------------------------------------------

LINEAR = "torch.nn.modules.linear.Linear"
RELU = "torch.nn.modules.activation.ReLU"
BLOCK = "mypkg.blocks.Block"
STACK_D = 8


def linear(
    b: Builder,
    path: str,
    x: ir.Value,
    d_in: int,
    d_out: int,
    bias: bool = True,
    call: int = 0,
    weights: tuple[ir.Value, ...] | None = None,
) -> ir.Value:
    if weights is None:
        weights = (b.weight(f"{path}.weight", [d_in, d_out]),)
        if bias:
            weights += (b.weight(f"{path}.bias", [d_out]),)
    with b.module(path, LINEAR, call):
        y = b.op("MatMul", x, weights[0])
        return b.op("Add", y, weights[1]) if len(weights) > 1 else y


def block(b: Builder, path: str, x: ir.Value, bias: bool = True) -> ir.Value:
    with b.module(path, BLOCK):
        h = linear(b, f"{path}.fc1", x, STACK_D, STACK_D, bias)
        with b.module(f"{path}.act", RELU):
            h = b.op("Relu", h)
        h = linear(b, f"{path}.fc2", h, STACK_D, STACK_D)
        return b.op("Add", x, h)  # residual: a functional op of the block itself


def stack(n_layers: int, first_bias: bool = True, batch: int | str = "batch") -> ir.Model:
    """``n_layers`` residual blocks (Linear → ReLU → Linear), optionally the first without bias."""
    b = Builder()
    x = b.input("x", [batch, STACK_D])
    h = x
    for i in range(n_layers):
        h = block(b, f"layers.{i}", h, bias=first_bias or i > 0)
    return b.model([h])
