"""Export kernels for the Mamba1 hub-kernel contracts (``mamba_ssm``'s selective scan).

transformers' Mamba1 mixers (``mamba``, ``falcon_mamba``, ``jamba``, ``zamba``) call their
recurrence through module-level functions decorated
``@use_kernel_func_from_hub_with_fallback("<contract>", "mamba_ssm")``; the torch fallback of
``selective_scan_fn`` loops over the tokens in Python, which ``torch.export`` unrolls into a
program for one sequence length. The kernels here have the same signature and semantics, with
the token recurrence written as one ``torch._higher_order_ops.scan.scan`` (lowered to ONNX
``Scan``), so the sequence length stays dynamic.

``selective_state_update`` (one decode step), shared with the Mamba2 layout, lives in
:mod:`irkit.llm.kernels.mamba2`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from irkit.errors import ExportError
from irkit.llm.kernels._common import refuse
from irkit.llm.kernels._mask import current_state, held

if TYPE_CHECKING:
    import torch

__all__ = ["KERNELS", "mamba_inner_fn", "selective_scan_fn"]


def selective_scan_fn(
    hidden_states: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
    delta_bias: torch.Tensor | None = None,
    delta_softplus: bool = False,
    return_last_state: bool = False,
    use_mambapy: bool = False,
    use_associative_scan: bool = False,
    *,
    initial_state: torch.Tensor | None = None,
    **kwargs: Any,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Mamba1's selective scan over a whole sequence, as one ``scan``.

    With ``dt ← softplus(dt + delta_bias)`` (each step optional), per channel ``d`` and token
    ``t``: ``h_t = exp(dt_t · A) ⊙ h_{t-1} + dt_t · B_t · u_t`` (state ``h`` of size ``N``,
    ``h_0 = 0`` or ``initial_state``, float32), ``y_t = h_t · C_t + D · u_t``, then ``y ← y · silu(z)``. The same
    identity (and the same float32 state math) as the ``selective_scan_fn`` torch fallback of
    transformers' Mamba1 models; ``use_mambapy`` and ``use_associative_scan`` pick other
    algorithms for the same result there and are ignored here.

    Args:
        hidden_states: ``u``, ``(batch, channels, seq)``.
        dt: ``(batch, channels, seq)``.
        A: ``(channels, N)``, the (negative) state decay rates.
        B: ``(batch, N, seq)``, input-dependent.
        C: ``(batch, N, seq)``, input-dependent.
        D: ``(channels,)`` skip weights, or None.
        z: ``(batch, channels, seq)`` gate, or None.
        delta_bias: ``(channels,)`` added to ``dt``, or None.
        delta_softplus: Apply softplus to ``dt`` (after the bias).
        return_last_state: Also return the last state.
        use_mambapy: Ignored (the reference's choice of algorithm).
        use_associative_scan: Ignored (the reference's choice of algorithm).
        initial_state: ``(batch, channels, N)``, the state before the first token, or None
            for zeros. An irkit extension: neither ``mamba_ssm``'s contract nor transformers'
            mixers have it (their multi-token path always starts from zeros), so a caller that
            continues from a cached state (one exported program for prefill and decode)
            passes it.
        **kwargs: Ignored, except ``seq_idx`` / ``cu_seqlens``, refused when not None.

    Returns:
        ``y`` ``(batch, channels, seq)`` in the dtype of ``hidden_states`` (float32 where
        ``D`` is float32, as in the reference), and with ``return_last_state`` the last state
        ``(batch, channels, N)``, float32.

    Raises:
        ExportError: Packed sequences, or ``B`` / ``C`` not of rank 3 (input-independent or
            grouped ``B`` / ``C`` of ``mamba_ssm`` are not used by transformers' models).
    """
    import torch
    import torch.nn.functional as F

    from irkit.llm.kernels._scan import scan_along as scan

    refuse("selective_scan_fn", kwargs)
    if B.dim() != 3 or C.dim() != 3:
        raise ExportError(
            "irkit export kernel 'selective_scan_fn': B and C must be input-dependent, "
            f"(batch, state, seq); got shapes {tuple(B.shape)} and {tuple(C.shape)}. "
            "Pass per-token B and C as transformers' Mamba mixers do"
        )
    input_dtype = hidden_states.dtype
    if delta_bias is not None:
        dt = dt + delta_bias.to(dt.dtype)[..., None]
    if delta_softplus:
        dt = F.softplus(dt)
    dt = held(dt, 2)  # pad steps: dt = 0, the state is held

    # Discretize for the whole sequence, as the reference does: (batch, channels, seq, N)
    discrete_A = torch.exp(A[None, :, None, :] * dt[:, :, :, None])
    discrete_B = dt[:, :, :, None] * B.transpose(1, 2)[:, None, :, :].float()
    delta_b_u = discrete_B * hidden_states[:, :, :, None].float()
    state_dtype = torch.promote_types(discrete_A.dtype, delta_b_u.dtype)
    batch, channels = hidden_states.shape[0], hidden_states.shape[1]
    if initial_state is None:
        initial_state = current_state()  # the layer's cached state (a multi-token decode step)
    if initial_state is None or tuple(initial_state.shape) != (
        hidden_states.shape[0],
        hidden_states.shape[1],
        A.shape[-1],
    ):
        init = torch.zeros(
            batch, channels, A.shape[-1], dtype=state_dtype, device=hidden_states.device
        )
    else:
        init = initial_state.to(dtype=state_dtype, device=hidden_states.device)

    def step(
        state: torch.Tensor, x: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        decay, input_, c = x  # (batch, channels, N), (batch, channels, N), (batch, N)
        state = (decay * state + input_).to(state_dtype)
        out = torch.matmul(state.to(input_dtype), c.unsqueeze(-1))[..., 0]
        return state, out

    # the scanned axis: 2 of (batch, channels, seq, N) and of C's (batch, N, seq)
    last_state, scan_output = scan(step, init, (discrete_A, delta_b_u, C), dim=2)

    if D is not None:
        scan_output = scan_output + hidden_states * D[None, :, None]
    if z is not None:
        scan_output = scan_output * F.silu(z)
    if return_last_state:
        return scan_output, last_state
    return scan_output


def mamba_inner_fn(
    xz: torch.Tensor,
    conv1d_weight: torch.Tensor,
    conv1d_bias: torch.Tensor | None,
    x_proj_weight: torch.Tensor,
    delta_proj_weight: torch.Tensor,
    out_proj_weight: torch.Tensor,
    out_proj_bias: torch.Tensor | None,
    A: torch.Tensor,
    B: torch.Tensor | None = None,
    C: torch.Tensor | None = None,
    D: torch.Tensor | None = None,
    delta_bias: torch.Tensor | None = None,
    delta_softplus: bool = True,
    b_rms_weight: torch.Tensor | None = None,
    c_rms_weight: torch.Tensor | None = None,
    dt_rms_weight: torch.Tensor | None = None,
    b_c_dt_rms_eps: float = 1e-6,
    **kwargs: Any,
) -> None:
    """The fused Mamba1 mixer (conv, projections, scan, out projection): "not fused here".

    Mixers call it only when training without a cache, and take their unfused path when it
    returns None, as transformers' torch fallback does. That path reaches the export kernels
    :func:`selective_scan_fn` and ``selective_state_update``; fusing again in torch would export
    the same ops. The arguments are those of ``mamba_ssm.mamba_inner_fn``.

    Args:
        xz: ``(batch, 2·channels, seq)``, the input projection (unused).
        conv1d_weight: Unused.
        conv1d_bias: Unused.
        x_proj_weight: Unused.
        delta_proj_weight: Unused.
        out_proj_weight: Unused.
        out_proj_bias: Unused.
        A: Unused.
        B: Unused.
        C: Unused.
        D: Unused.
        delta_bias: Unused.
        delta_softplus: Unused.
        b_rms_weight: Unused.
        c_rms_weight: Unused.
        dt_rms_weight: Unused.
        b_c_dt_rms_eps: Unused.
        **kwargs: Ignored, except ``seq_idx`` / ``cu_seqlens``, refused when not None.

    Returns:
        None (the caller takes its unfused path).
    """
    refuse("mamba_inner_fn", kwargs)
    return None


#: Contract name (``use_kernel_func_from_hub_with_fallback``) → export kernel.
KERNELS: dict[str, Callable[..., Any]] = {
    "selective_scan_fn": selective_scan_fn,
    "mamba_inner_fn": mamba_inner_fn,
}
