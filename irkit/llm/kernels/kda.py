"""Export kernels for the Kimi delta attention (KDA) hub-kernel contracts (``fla``).

transformers' KDA layers (``kimi_linear``, ``bailing_hybrid``, ``glm5_next``) call their
recurrence through module-level functions decorated
``@use_kernel_func_from_hub_with_fallback("chunk_kda" | "fused_recurrent_kda", "fla")``, whose
torch fallbacks loop in Python over tokens or chunks (unrolled by ``torch.export``). Both
kernels here compute the same gated delta rule with a per-channel decay, token by token, as
one ``torch._higher_order_ops.scan.scan`` (lowered to ONNX ``Scan``), so the sequence length
stays dynamic: the chunked and the recurrent contract are the same identity.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from irkit.llm.kernels._common import l2norm, refuse
from irkit.llm.kernels._mask import held

if TYPE_CHECKING:
    import torch

__all__ = ["KERNELS", "chunk_kda", "fused_recurrent_kda"]

_SCALE = {
    "scale": "a query scale other than 1/sqrt(head_dim) is ignored by transformers' reference "
    "and applied by fla; scale the query before the call instead",
}


def _kda(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None,
    output_final_state: bool,
    use_qk_l2norm_in_kernel: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    import torch

    from irkit.llm.kernels._scan import scan_along as scan

    initial_dtype = query.dtype
    query, key, value, g, beta = (t.to(torch.float32) for t in (query, key, value, g, beta))
    g, beta = held(g, 1), held(beta, 1)  # pad steps: no decay, no write: the state is held
    if use_qk_l2norm_in_kernel:
        query, key = l2norm(query), l2norm(key)
    query = query * (1 / (query.shape[-1] ** 0.5))
    if initial_state is None:
        batch, _, heads, k_dim = key.shape
        init = torch.zeros(
            batch, heads, k_dim, value.shape[-1], dtype=value.dtype, device=value.device
        )
    else:
        init = initial_state.to(value)

    def step(
        state: torch.Tensor,
        xs: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        q_t, k_t, v_t, g_t, b_t = xs  # (batch, H, K) ×2, (batch, H, V), (batch, H, K), (batch, H)
        state = state * g_t[..., None].exp()
        kv_mem = (state * k_t[..., None]).sum(dim=-2)
        delta = (v_t - kv_mem) * b_t[..., None]
        state = state + k_t.unsqueeze(-1) * delta.unsqueeze(-2)
        return state, (state * q_t.unsqueeze(-1)).sum(dim=-2)

    final_state, out = scan(step, init, (query, key, value, g, beta), dim=1)
    return out.to(initial_dtype), final_state if output_final_state else None


def fused_recurrent_kda(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None,
    output_final_state: bool,
    use_qk_l2norm_in_kernel: bool = False,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Kimi delta attention, token by token, as one ``scan`` (``fla``'s ``fused_recurrent_kda``).

    In float32, with ``q``, ``k`` L2-normalized when ``use_qk_l2norm_in_kernel`` and
    ``q ← q / sqrt(K)``, per head and token: ``S ← S · exp(g_t)`` (per key channel),
    ``S ← S + k_t ⊗ β_t (v_t − kᵀ_t S)``, ``o_t = qᵀ_t S`` (state ``S`` ``(K, V)``, from
    ``initial_state`` or 0). The identity of transformers' torch fallback.

    Args:
        query: ``(batch, seq, H, K)``.
        key: ``(batch, seq, H, K)``.
        value: ``(batch, seq, H, V)``.
        g: ``(batch, seq, H, K)``, the log decay per key channel.
        beta: ``(batch, seq, H)``, the write strength.
        initial_state: ``(batch, H, K, V)``, or None for zeros.
        output_final_state: Return the last state (else None in its place).
        use_qk_l2norm_in_kernel: L2-normalize ``query`` and ``key`` first.
        **kwargs: Ignored, except ``cu_seqlens`` / ``seq_idx`` (packed sequences) and
            ``scale``, refused when not None.

    Returns:
        ``(o, S)``: ``o`` ``(batch, seq, H, V)`` in the dtype of ``query``; the last state
        ``(batch, H, K, V)`` float32, or None.

    Raises:
        ExportError: For a refused keyword.
    """
    refuse("fused_recurrent_kda", kwargs, _SCALE)
    return _kda(
        query,
        key,
        value,
        g,
        beta,
        initial_state,
        output_final_state,
        use_qk_l2norm_in_kernel,
    )


def chunk_kda(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    chunk_size: int = 64,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Kimi delta attention over a sequence (``fla``'s ``chunk_kda``), as a per-token ``scan``.

    The same identity as :func:`fused_recurrent_kda` (the chunked form of the reference is a
    reordering of that recurrence); ``chunk_size`` only shapes the reference's computation and
    is ignored.

    Args:
        query: ``(batch, seq, H, K)``.
        key: ``(batch, seq, H, K)``.
        value: ``(batch, seq, H, V)``.
        g: ``(batch, seq, H, K)``, the log decay per key channel.
        beta: ``(batch, seq, H)``, the write strength.
        chunk_size: Ignored (the reference's chunk length).
        initial_state: ``(batch, H, K, V)``, or None for zeros.
        output_final_state: Return the last state (else None in its place).
        use_qk_l2norm_in_kernel: L2-normalize ``query`` and ``key`` first.
        **kwargs: Ignored, except ``cu_seqlens`` / ``seq_idx`` (packed sequences) and
            ``scale``, refused when not None.

    Returns:
        ``(o, S)``: ``o`` ``(batch, seq, H, V)`` in the dtype of ``query``; the last state
        ``(batch, H, K, V)`` float32, or None.

    Raises:
        ExportError: For a refused keyword.
    """
    refuse("chunk_kda", kwargs, _SCALE)
    return _kda(
        query,
        key,
        value,
        g,
        beta,
        initial_state,
        output_final_state,
        use_qk_l2norm_in_kernel,
    )


#: Contract name (``use_kernel_func_from_hub_with_fallback``) → export kernel.
KERNELS: dict[str, Callable[..., Any]] = {
    "chunk_kda": chunk_kda,
    "fused_recurrent_kda": fused_recurrent_kda,
}
