"""The bias of a quantized linear layer, taken into ``MatMulNBits``.

Identity: ``Add(MatMulNBits(A, B, scales, zero_points?), bias)
= MatMulNBits(A, B, scales, zero_points?, , bias)`` — ``MatMulNBits`` adds its optional
``bias`` input (``[N]``) to every row of the product, as ``Add`` broadcasts a 1-D ``bias``
along the last axis: one kernel less per biased linear layer and decode step (q/k/v biases,
GPT-2's and Phi's every projection), as genai's builder writes them.

Preconditions: the ``MatMulNBits`` has no ``g_idx`` or ``bias`` yet and its product has no
other use; ``bias`` is 1-D of ``N`` (the node's attribute) values of the product's dtype.
"""

from __future__ import annotations

import onnx_ir as ir

from irkit.rewriting import (
    Match,
    RewriteBuilder,
    RewriteContext,
    Rule,
    Verdict,
    fail,
    op,
    optional,
    outer_dims,
    outer_dtype,
    var,
)

MS = "com.microsoft"

a, b, scales, zero_points, bias = (var(n) for n in ("a", "b", "scales", "zero_points", "bias"))


def _nbits(match: Match) -> ir.Node:
    return next(n for n in match.nodes if n.op_type == "MatMulNBits")


def _check(
    scales: ir.Value, bias: ir.Value, product: ir.Value, match: Match, ctx: RewriteContext
) -> Verdict:
    node = _nbits(match)
    n = node.attributes.get_int("N", -1)
    tensor = bias.const_value
    # (a Linear function's bias is its input: the shape and dtype of what every call passes)
    shape = outer_dims(bias, ctx.graph, ctx.model) if tensor is None else tensor.shape.dims
    if shape is None or list(shape) != [n]:
        return fail(f"bias shape {shape} is not [N] = [{n}]", bias)
    dtype = outer_dtype(bias, ctx.graph, ctx.model) if tensor is None else tensor.dtype
    # (the product's type is A's and the scales': the packed inputs are typed)
    want = product.dtype or outer_dtype(scales, ctx.graph, ctx.model)
    if want is None or dtype != want:
        return fail(f"bias dtype {dtype} is not the product's {want}", bias)
    if len(product.uses()) != 1 or product.is_graph_output():
        return fail("the product has another use", product)
    return True


def _fold(
    op: RewriteBuilder,
    a: ir.Value,
    b: ir.Value,
    scales: ir.Value,
    zero_points: ir.Value | None,
    bias: ir.Value,
    match: Match,
) -> ir.Value:
    """MatMulNBits(A, B, scales, zero_points?, , bias)"""
    attributes = {k: v.value for k, v in _nbits(match).attributes.items()}
    return op.domain(MS).MatMulNBits(a, b, scales, zero_points, None, bias, **attributes)


MATMUL_NBITS_BIAS = Rule(
    "MatMulNBitsBias",
    op.Add(op.domain(MS).MatMulNBits(a, b, scales, optional(zero_points), _name="product"), bias),
    check=_check,
    rewrite=_fold,
)
"""``Add(MatMulNBits(…), bias) = MatMulNBits(…, bias)`` (see the module docstring)."""
