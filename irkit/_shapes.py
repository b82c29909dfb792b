"""ONNX shape inference for models that come without shapes (other exporters' files).

This module imports no torch.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import onnx_ir as ir

__all__ = ["infer_shapes", "unknown_shape_fraction"]

logger = logging.getLogger(__name__)


def unknown_shape_fraction(model: ir.Model) -> float:
    """The fraction of the main graph's node outputs whose shape is unknown (0.0 if none);
    ``Constant`` nodes do not count (their attribute says their shape)."""
    outputs = [v for node in model.graph if node.op_type != "Constant" for v in node.outputs]
    if not outputs:
        return 0.0
    return sum(v.shape is None for v in outputs) / len(outputs)


def infer_shapes(model: ir.Model) -> None:
    """Give the main graph's values the shapes ONNX shape inference derives, **in place**.

    Exporters often write no shape for intermediate values (``torch.onnx.export`` with
    ``optimize=False`` leaves about two thirds of them unknown), and the rules whose
    preconditions are about shapes (a broadcast that changes nothing, a 2-D ``MatMul``) cannot
    fire without them; with shapes, constant folding also resolves ``Shape`` chains.

    Runs ``onnx.shape_inference.infer_shapes`` (data propagation, not strict) on a copy without
    the large initializers' data, and fills in only what the model does not know: a shape or
    type the model already has is never replaced. An op shape inference does not know keeps its
    unknown shape; a model it rejects is left unchanged (with a warning in the log).

    Example:
        >>> m = ir.from_onnx_text('''
        ...   <ir_version: 10, opset_import: ["" : 20]>
        ...   g (float[2, 3] x) => (float[2, 3] y) { t = Relu(x)  y = Neg(t) }''')
        >>> infer_shapes(m)
        >>> m.graph.node(0).outputs[0].shape
        Shape([2, 3])
    """
    import onnx

    def infer(proto: onnx.ModelProto) -> onnx.ModelProto:
        return onnx.shape_inference.infer_shapes(
            proto, check_type=False, strict_mode=False, data_prop=True
        )

    try:
        inferred = _without_large_initializers(infer, model)
    except Exception as exc:  # onnx rejects the model: optimize it as it is
        logger.warning("shape inference failed, the model keeps its shapes: %s", exc)
        return
    types = {vi.name: vi.type for vi in inferred.graph.value_info}
    types.update((vi.name, vi.type) for vi in inferred.graph.output)
    for node in model.graph:
        for value in node.outputs:
            proto_type = types.get(value.name or "")
            if proto_type is None:
                continue
            if value.shape is None:
                value.shape = ir.serde.deserialize_type_proto_for_shape(proto_type)
            if value.type is None:
                value.type = ir.serde.deserialize_type_proto_for_type(proto_type)


def _without_large_initializers(fn: Callable[[Any], Any], model: ir.Model) -> Any:
    """``fn(proto of model)``, serializing the model without its large initializers' data."""
    try:  # onnx_ir's helper (private): initializer data above 1 KB is not copied
        from onnx_ir.passes.common._c_api_utils import call_onnx_api
    except ImportError:  # pragma: no cover - a future onnx_ir without it: copy everything
        return fn(ir.serde.serialize_model(model))
    return call_onnx_api(fn, model)
