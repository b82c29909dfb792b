"""The recurrences as torch custom ops: each one recognizable unit of the exported program.

A kernel (:mod:`irkit.llm.kernels.gated_delta`) prepares its operands with plain torch ops
(casts, L2 normalization, the query scale, the padding hold) and calls one op of this module
for the recurrence itself. ``torch.export`` keeps the call as one node; ``irkit.lower`` with
``decompose_custom_ops=True`` (what :meth:`irkit.llm.CausalLMExport.lower_kwargs` asks for)
lowers it to a call of an ONNX local function named after the op (domain :data:`NAMESPACE`)
whose body is the op's Python implementation: a ``scan`` over the tokens → ``Scan``. The
``"ort"`` target replaces the call by onnxruntime's own kernel where the semantics match
(:mod:`irkit.rules.ort.linear_attention`).

Ops (all tensors float32; ``(batch, tokens, heads, dim)`` layout, one state per head):

- ``irkit_kernels::gated_delta(q, k, v, decay, beta, state) -> (out, final)``: per token ``t``
  ``S = exp(decay_t)·S``, ``S = S + k_t ⊗ (β_t·(v_t − Sᵀk_t))``, ``o_t = Sᵀ q_t`` — onnxruntime's
  ``LinearAttention(update_rule="gated_delta", scale=1)`` with the query already scaled. ``q``
  and ``k`` may have fewer heads than ``v``: each query/key head serves that many consecutive
  value heads (the contrib op's grouping, ``q_num_heads`` < ``kv_num_heads``).
"""

from __future__ import annotations

import torch
from torch._higher_order_ops.scan import scan_op

__all__ = ["NAMESPACE", "gated_delta"]

NAMESPACE = "irkit_kernels"
"""The torch library namespace of the ops, and the ONNX domain of their functions."""


def _gated_delta(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    decay: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The gated delta rule over the tokens (see the module docstring).

    Args:
        query: ``(batch, tokens, k_heads, k_dim)``, scaled already.
        key: ``(batch, tokens, k_heads, k_dim)``.
        value: ``(batch, tokens, heads, v_dim)``; ``heads`` a multiple of ``k_heads``.
        decay: ``(batch, tokens, heads)``, log space (≤ 0).
        beta: ``(batch, tokens, heads)``, write strength.
        state: ``(batch, heads, k_dim, v_dim)``, the state before the first token.

    Returns:
        ``(out (batch, tokens, heads, v_dim), state after the last token)``.
    """

    def step(
        s: torch.Tensor,
        q_t: torch.Tensor,
        k_t: torch.Tensor,
        v_t: torch.Tensor,
        d_t: torch.Tensor,
        b_t: torch.Tensor,
    ) -> list[torch.Tensor]:
        s = s * d_t.exp()[..., None, None]
        delta = (v_t - (s * k_t[..., None]).sum(-2)) * b_t[..., None]
        s = s + k_t[..., None] * delta[..., None, :]
        return [s.clone(), (s * q_t[..., None]).sum(-2)]

    if query.shape[2] != value.shape[2]:
        query = query.repeat_interleave(value.shape[2] // query.shape[2], dim=2)
        key = key.repeat_interleave(value.shape[2] // key.shape[2], dim=2)
    out, final = _scan_tokens(step, state, query, key, value, decay, beta)
    return out, final


def _scan_tokens(step: object, state: torch.Tensor, *xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``(final state, outputs stacked on the token axis 1)`` of ``step`` over axis 1 of ``xs``.

    Calls torch's ``scan`` operator itself, on token-major operands: the ``scan`` function
    compiles its body with dynamo first, which cannot run inside ``irkit.lower``'s trace of the
    op (a ``ShapeEnv`` of the exported program's symbols).
    """
    final, out = scan_op(step, [state], [x.movedim(1, 0) for x in xs], ())
    return out.movedim(0, 1), final


def _gated_delta_shape(*operands: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The output shapes: ``value``'s and ``state``'s (operands as :func:`_gated_delta`'s)."""
    value, state = operands[2], operands[5]
    return value.new_empty(value.shape), state.new_empty(state.shape)


gated_delta = torch.library.custom_op(f"{NAMESPACE}::gated_delta", _gated_delta, mutates_args=())
gated_delta.register_fake(_gated_delta_shape)
