"""``scaled_dot_product_attention`` with a mask: zero for a query whose every key is masked.

torch (its math and CPU flash kernels, ``_safe_softmax``) returns **0** for a query row whose
boolean mask is all false, or whose float mask is ``-inf`` at every key. torchlib's lowering
(onnxscript 0.7) does not:

* boolean mask: it adds ``Where(mask, 0, finfo.min)``, so an empty row's scores are all
  ``finfo.min`` (``score + finfo.min`` rounds to it), ``Softmax`` spreads the row evenly and
  its ``Where(IsNaN(p), 0, p)`` guard never fires: the row becomes the **mean of the values**
  (transformers' padding masks: a left-padded query under a causal mask, glm5_next's pad
  queries);
* float mask: no guard, so a row of ``-inf`` gives ``Softmax`` ``NaN``.

Here the boolean mask becomes ``Where(mask, 0, -inf)`` and both forms keep torchlib's guard,
which then zeroes exactly the rows torch zeroes. Everything else is torchlib's graph, node for
node (its √scale on both operands, its ``kᵀ``, its ``enable_gqa`` repeat and scale helpers),
so the attention rules (:mod:`irkit.rules.attention`) match it as before; the fused
``Attention`` gets the ``-inf`` mask, for which onnxruntime's kernel returns 0 as the guard
does. A float mask that fills with ``finfo.min`` (Hugging Face's) is unchanged: torch averages
such a row too, and the guard never fires. No mask or ``is_causal`` (no empty row): torchlib's
own lowering; not 4-D: torch's decomposition (``torchlib_gap``).
"""

from __future__ import annotations

import math
from typing import Any

import onnx_ir as ir
import torch
from onnxscript import opset18 as op

from irkit.lowering._registration import OwnLowering

__all__: list[str] = []

aten = torch.ops.aten

_INT64_MAX, _INT64_MIN = 2**63 - 1, -(2**63)
_NAMES = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal")


def _args(node: torch.fx.Node) -> dict[str, Any]:
    args = dict(zip(_NAMES, node.args, strict=False))
    args.update(node.kwargs)
    return args


def _not_4d(node: torch.fx.Node) -> bool:
    """``scaled_dot_product_attention`` of query/key/value not all 4-D (NesT's and Twins'
    ``(B, T, H, N, D)`` blocks): torchlib asserts 4-D; torch's math decomposition takes any rank."""
    values = [a.meta.get("val") for a in node.args[:3] if isinstance(a, torch.fx.Node)]
    return any(isinstance(v, torch.Tensor) and v.dim() != 4 for v in values)


def _masked_4d(node: torch.fx.Node) -> bool:
    """4-D query/key/value with an ``attn_mask`` (where a row can be empty)."""
    return isinstance(_args(node).get("attn_mask"), torch.fx.Node) and not _not_4d(node)


def _key_transposed(key: Any) -> Any:
    """``kᵀ`` as torchlib writes it: fold the leading dims, swap the last two, unfold."""
    shape = op.Shape(key)
    last = op.Slice(shape, [-1], op.Constant(value_ints=[_INT64_MAX]))
    second = op.Slice(shape, [-2], [-1])
    lead = op.Slice(shape, op.Constant(value_ints=[_INT64_MIN]), [-2])
    folded = op.Reshape(key, op.Concat(op.Constant(value_ints=[-1]), second, last, axis=0))
    return op.Reshape(op.Transpose(folded, perm=[0, 2, 1]), op.Concat(lead, last, second, axis=0))


def _sdpa_masked(
    query: Any,
    key: Any,
    value: Any,
    attn_mask: Any,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> Any:
    """``softmax(q·kᵀ·scale + mask)·v`` with torch's zero rows (see the module docstring)."""
    from onnxscript.function_libs.torch_lib.ops import nn as torchlib_nn

    if scale is None:
        scale = torchlib_nn._attention_scale(query)
    scale = op.CastLike(scale, query)
    if enable_gqa and query.shape[1] != key.shape[1]:
        key, value = torchlib_nn._attention_repeat_kv_for_group_query(query, key, value)
    zero = op.Constant(value=ir.tensor(0.0, dtype=query.dtype))
    if attn_mask.dtype == ir.DataType.BOOL:
        minus_inf = op.Constant(value=ir.tensor(-math.inf, dtype=query.dtype))
        attn_mask = op.Where(attn_mask, zero, minus_inf)
    key_transposed = _key_transposed(key)
    scores = op.MatMul(op.Mul(query, op.Sqrt(scale)), op.Mul(key_transposed, op.Sqrt(scale)))
    probs = op.Softmax(op.Add(scores, attn_mask), axis=-1)
    probs = op.Where(op.IsNaN(probs), zero, probs)  # a row of -inf: 0, as torch
    if dropout_p != 0:
        probs, _ = op.Dropout(probs, dropout_p)
    return op.MatMul(probs, value)


_SDPA = OwnLowering(
    aten.scaled_dot_product_attention.default,
    _sdpa_masked,
    applies=_masked_4d,
    torchlib_gap=_not_4d,
)
