"""The gated delta rule (Qwen3-Next, Qwen3.5, OLMo-hybrid, …) as a scan over tokens.

Contracts ``chunk_gated_delta_rule`` and ``fused_recurrent_gated_delta_rule`` (flash-linear-
attention's API, which transformers' fallbacks follow): per head, with the state ``S`` a
``(k_head_dim, v_head_dim)`` matrix and per token ``t``::

    S = exp(g_t) · S
    S = S + k_t ⊗ (β_t · (v_t − Sᵀ k_t))
    o_t = Sᵀ (q_t / √k_head_dim)

with ``q``, ``k`` L2-normalized first when ``use_qk_l2norm_in_kernel``. Where the step's padding
mask (:func:`irkit.llm.kernels.step_mask`) is 0 the step neither decays (``g = 0``) nor writes
(``β = 0``), so the state is held exactly and a right-padded row's state is the one after its
last real token (the same inputs express it for onnxruntime's ``LinearAttention``). The chunked fallback
computes the same sums in another order (chunks of ``chunk_size`` tokens); results agree to
float32 rounding.
"""

from __future__ import annotations

from typing import Any

from irkit.llm.kernels._common import l2norm, refuse
from irkit.llm.kernels._mask import held

__all__ = ["KERNELS", "gated_delta_rule"]


def gated_delta_rule(
    query: Any,
    key: Any,
    value: Any,
    g: Any,
    beta: Any,
    chunk_size: int = 64,
    initial_state: Any = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    **kwargs: Any,
) -> tuple[Any, Any]:
    """The gated delta rule over a sequence, one ``scan`` step per token.

    Args:
        query: ``(batch, seq, k_heads, k_head_dim)``.
        key: ``(batch, seq, k_heads, k_head_dim)``.
        value: ``(batch, seq, v_heads, v_head_dim)``; ``v_heads`` a multiple of ``k_heads``
            (each query/key head serves that many consecutive value heads).
        g: ``(batch, seq, v_heads)`` decay in log space (≤ 0).
        beta: ``(batch, seq, v_heads)`` write strength.
        chunk_size: Ignored (the chunked contract's tiling; the sum is the same).
        initial_state: ``(batch, v_heads, k_head_dim, v_head_dim)`` or ``None`` (zeros).
        output_final_state: Return the final state (else ``None``).
        use_qk_l2norm_in_kernel: L2-normalize queries and keys first.
        **kwargs: ``cu_seqlens`` (packed sequences) must be ``None``; others are ignored.

    Returns:
        ``(output (batch, seq, v_heads, v_head_dim) in query's dtype, final state float32 or
        None)``.

    Raises:
        ExportError: Packed sequences (``cu_seqlens``) were asked for.
    """
    import torch

    from irkit.llm.kernels._ops import gated_delta

    refuse("chunk_gated_delta_rule", kwargs)
    dtype = query.dtype
    batch, _, _, k_dim = key.shape
    v_heads, v_dim = value.shape[-2:]
    q, k, v, b, decay = (x.to(torch.float32) for x in (query, key, value, beta, g))
    if use_qk_l2norm_in_kernel:  # (the query's scale inside its norm: one RMSNormalization)
        q, k = l2norm(q, scale=k_dim**-0.5), l2norm(k)
    else:
        q = q * k_dim**-0.5
    if initial_state is None:
        state = q.new_zeros(batch, v_heads, k_dim, v_dim)
    else:
        state = initial_state.to(torch.float32)
    decay, b = held(decay, 1), held(b, 1)  # a pad step: no decay (exp 0 = 1), no write (β = 0)
    out, final = gated_delta(q, k, v, decay, b, state)
    return out.to(dtype), (final if output_final_state else None)


#: Export kernels by hub-kernel contract name.
KERNELS = {
    "chunk_gated_delta_rule": gated_delta_rule,
    "fused_recurrent_gated_delta_rule": gated_delta_rule,
}
