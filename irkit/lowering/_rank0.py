"""0-d tensors reduced "over dim 0": lowered as the one-element 1-D tensor torch treats them as.

torch lets an op with a ``dim`` argument take a 0-d tensor and ``dim`` 0 or -1 (``amax``,
``prod.dim_int``, ``argmax``, ``softmax``, ``cumsum``, ``max.dim`` …): the scalar behaves as a
tensor of one element along that dim, and the result is 0-d again. torchlib emits the ONNX op
with ``axes=[0]`` on the rank-0 value, which ONNX rejects ("axis must be in [-rank, rank-1]"),
so the file would not load. Identity used instead::

    op(x, dim=d) = Reshape(op(Reshape(x, [1]), dim=0 or [0]), [])   (x 0-d, d ∈ {0, -1})

applied when every tensor input and every tensor output of the FX node is 0-d (so any other
0-d operand, e.g. ``gather``'s index, is reshaped alike and the outputs keep torch's shape).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx_ir as ir
import torch

from irkit.lowering._recorder import Recorder

__all__ = ["is_rank0_dim_op", "lift_rank0", "lower_to_rank0"]

_DIM_NAMES = ("dim", "dims")  # aten's reductions, prims' (``prims.var(x, dims, correction)``)


def _dim_arg(node: torch.fx.Node) -> tuple[int | None, str, Any]:
    """(position in the schema, name, value) of the node's dim argument, or (None, "", None)."""
    target = node.target
    if not isinstance(target, torch._ops.OpOverload):
        return None, "", None
    names = [a.name for a in target._schema.arguments]
    name = next((n for n in _DIM_NAMES if n in names), None)
    if name is None:
        return None, "", None
    index = names.index(name)
    if index < len(node.args):
        return index, name, node.args[index]
    return index, name, node.kwargs.get(name)


def _tensor_vals(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensor_vals(v)]
    return []


def is_rank0_dim_op(node: torch.fx.Node) -> bool:
    """Whether ``node`` reduces (or scans, or indexes) 0-d tensors along ``dim`` 0 or -1."""
    outputs = _tensor_vals(node.meta.get("val"))  # (checked first: most nodes stop here)
    if not outputs or any(t.dim() != 0 for t in outputs):
        return False
    index, _, dim = _dim_arg(node)
    if index is None or dim is None:
        return False
    dims = list(dim) if isinstance(dim, (tuple, list)) else [dim]
    if not dims or any(not isinstance(d, int) or d not in (0, -1) for d in dims):
        return False
    inputs = [t for n in node.all_input_nodes for t in _tensor_vals(n.meta.get("val"))]
    return bool(inputs) and all(t.dim() == 0 for t in inputs)


def _one_element(recorder: Recorder, value: ir.Value) -> ir.Value:
    out = recorder.opset.Reshape(value, recorder.opset.Constant(value_ints=[1]))
    out.dtype, out.shape = value.dtype, ir.Shape([1])  # (a 0-d input's dtype, maybe unknown)
    result: ir.Value = out
    return result


def lift_rank0(
    recorder: Recorder, node: torch.fx.Node, args: list[Any], kwargs: dict[str, Any]
) -> None:
    """Reshape the 0-d tensor arguments to ``[1]`` and ``dim`` to 0 (in place)."""
    for i, arg in enumerate(node.args):
        if isinstance(arg, torch.fx.Node) and isinstance(args[i], ir.Value):
            args[i] = _one_element(recorder, args[i])
    for key, arg in node.kwargs.items():
        if isinstance(arg, torch.fx.Node) and isinstance(kwargs.get(key), ir.Value):
            kwargs[key] = _one_element(recorder, kwargs[key])
    index, name, dim = _dim_arg(node)
    zero: int | list[int] = [0] if isinstance(dim, (tuple, list)) else 0
    if index is not None and index < len(args):
        args[index] = zero
    else:
        kwargs[name] = zero


def lower_to_rank0(recorder: Recorder, outputs: Any) -> Any:
    """Reshape every tensor result back to 0-d."""
    if isinstance(outputs, ir.Value):
        out = recorder.opset.Reshape(
            outputs, recorder.opset.Constant(value=ir.tensor(np.zeros(0, dtype=np.int64)))
        )
        out.dtype, out.shape = outputs.dtype, ir.Shape([])
        return out
    if isinstance(outputs, (tuple, list)):
        return type(outputs)(lower_to_rank0(recorder, o) for o in outputs)
    return outputs
