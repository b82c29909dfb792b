"""Export kernels for the Mamba2 hub-kernel contracts (``mamba_ssm``'s SSD), and the decode step.

transformers' Mamba2-family mixers (``mamba2``, ``bamba``, ``falcon_h1``, ``granitemoehybrid``,
``nemotron_h``, ``zamba2``) call their recurrence through module-level functions decorated
``@use_kernel_func_from_hub_with_fallback("<contract>", "mamba_ssm")``. The kernels here have
the same signatures and semantics, with the token recurrence written as one
``torch._higher_order_ops.scan.scan`` (lowered to ONNX ``Scan``, one step per token) instead of
the reference's chunked (SSD) form, so one exported program serves any sequence length.

``selective_state_update`` (one decode step, no recurrence over the sequence) serves both the
Mamba2 layout (state ``(batch, heads, head_dim, N)``) and the Mamba1 layout (state
``(batch, channels, N)``), as ``mamba_ssm``'s does: it is one contract name for both families.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from irkit.errors import ExportError
from irkit.llm.kernels._common import refuse
from irkit.llm.kernels._mask import held

if TYPE_CHECKING:
    import torch

__all__ = [
    "KERNELS",
    "mamba_chunk_scan_combined",
    "mamba_split_conv1d_scan_combined",
    "selective_state_update",
]


def _update_mamba1(
    state: torch.Tensor,
    hidden_states: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None,
    dt_bias: torch.Tensor | None,
    dt_softplus: bool,
    z: torch.Tensor | None,
) -> torch.Tensor:
    import torch
    import torch.nn.functional as F

    input_dtype = hidden_states.dtype
    if dt_bias is not None:
        dt = dt + dt_bias.to(dt.dtype)
    if dt_softplus:
        dt = F.softplus(dt)
    d_a = torch.exp(dt.float()[..., None] * A.float())
    d_b = dt.float()[..., None] * B.float()[:, None, :]
    d_b_x = d_b * hidden_states.float()[..., None]
    ssm_state = state.float() * d_a + d_b_x
    state.copy_(ssm_state.to(state.dtype))
    out = torch.matmul(ssm_state.to(C.dtype), C.unsqueeze(-1)).squeeze(-1)
    if D is not None:
        out = out + hidden_states * D
    if z is not None:
        out = out * F.silu(z)
    return out.to(input_dtype)


def _update_mamba2(
    state: torch.Tensor,
    hidden_states: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None,
    dt_bias: torch.Tensor | None,
    dt_softplus: bool,
    z: torch.Tensor | None,
) -> torch.Tensor:
    import torch
    import torch.nn.functional as F

    batch, heads, head_dim = hidden_states.shape
    groups, state_size = B.shape[1], B.shape[-1]
    if dt_bias is not None:
        dt = dt + dt_bias.to(dt.dtype)
    if dt_softplus:
        dt = F.softplus(dt)
    dt = dt[..., None]
    d_a = torch.exp(dt.float() * A.float())

    def per_head(t: torch.Tensor) -> torch.Tensor:  # (batch, groups, N) → (batch, heads, N)
        return (
            t[:, :, None, :]
            .expand(batch, groups, heads // groups, state_size)
            .reshape(batch, heads, state_size)
        )

    d_b_x = dt * per_head(B)[:, :, None, :] * hidden_states[..., None]
    ssm_states = state * d_a + d_b_x
    state.copy_(ssm_states.to(state.dtype))
    out = torch.matmul(ssm_states.to(C.dtype), per_head(C)[..., None])[..., 0]
    if D is not None:
        out = (out + hidden_states * D).to(out.dtype)
    if z is not None:
        out = out * F.silu(z)
    return out.to(hidden_states.dtype)


def selective_state_update(
    state: torch.Tensor,
    hidden_states: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    dt_softplus: bool = False,
    z: torch.Tensor | None = None,
    **kwargs: Any,
) -> torch.Tensor:
    """One decode step of the selective state space: updates ``state`` in place.

    With ``dt ← softplus(dt + dt_bias)`` (each step optional): ``h ← exp(dt · A) ⊙ h +
    dt · B · x`` (written back into ``state``), ``y = h · C + D · x``, then ``y ← y · silu(z)``.
    Two layouts, told apart by the rank of ``state``, each with the dtype handling of its
    transformers torch fallback:

    - Mamba1 (``mamba``, ``falcon_mamba``, ``jamba``, ``zamba``): ``state`` ``(batch, D, N)``,
      ``hidden_states``, ``dt``, ``z`` ``(batch, D)``, ``A`` ``(D, N)``, ``B``, ``C``
      ``(batch, N)``, ``D``, ``dt_bias`` ``(D,)``; float32 state math.
    - Mamba2 (``mamba2``, ``bamba``, ``falcon_h1``, ``granitemoehybrid``, ``nemotron_h``,
      ``zamba2``): ``state`` ``(batch, H, P, N)``, ``hidden_states``, ``dt``, ``z``
      ``(batch, H, P)``, ``A`` ``(H, P, N)``, ``B``, ``C`` ``(batch, G, N)`` (``G`` groups
      shared by ``H / G`` heads each), ``D``, ``dt_bias`` ``(H, P)``.

    Args:
        state: The recurrent state, updated in place.
        hidden_states: ``x``, one token.
        dt: The time step.
        A: The (negative) decay rates.
        B: The input projection of the state.
        C: The output projection of the state.
        D: Skip weights, or None.
        dt_bias: Added to ``dt``, or None.
        dt_softplus: Apply softplus to ``dt`` (after the bias).
        z: The gate, or None.
        **kwargs: Ignored, except ``seq_idx`` / ``cu_seqlens``, refused when not None.

    Returns:
        ``y``, shaped and typed like ``hidden_states``.

    Raises:
        ExportError: ``state`` of rank other than 3 or 4, or packed sequences.
    """
    refuse("selective_state_update", kwargs)
    if state.dim() == 3:
        return _update_mamba1(state, hidden_states, dt, A, B, C, D, dt_bias, dt_softplus, z)
    if state.dim() == 4:
        return _update_mamba2(state, hidden_states, dt, A, B, C, D, dt_bias, dt_softplus, z)
    raise ExportError(
        "irkit export kernel 'selective_state_update': state must be (batch, channels, N) "
        f"(Mamba1) or (batch, heads, head_dim, N) (Mamba2); got shape {tuple(state.shape)}"
    )


def mamba_chunk_scan_combined(
    hidden_states: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    chunk_size: int,
    D: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    initial_states: torch.Tensor | None = None,
    dt_softplus: bool = False,
    dt_limit: tuple[float, float] = (0.0, float("inf")),
    return_final_states: bool = False,
    **kwargs: Any,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Mamba2's SSD over a sequence, as a per-token ``scan`` (the same identity as the chunks).

    With ``dt ← clamp(softplus(dt + dt_bias), *dt_limit)`` (bias and softplus optional; the
    clamp always, as in transformers' fallback), per head ``h`` and token ``t``:
    ``S_t = exp(dt_t · A_h) · S_{t-1} + (dt_t · x_t) ⊗ B_t`` (state ``(P, N)`` per head,
    float32, ``S_0 = initial_states`` or 0), ``y_t = S_t · C_t + D_h · x_t``; head ``h`` reads
    group ``h // (H / G)`` of ``B`` and ``C``. ``chunk_size`` only shapes the reference's
    computation, not its result, and is ignored.

    Args:
        hidden_states: ``x``, ``(batch, seq, H, P)``.
        dt: ``(batch, seq, H)``.
        A: ``(H,)``, the (negative) decay rates.
        B: ``(batch, seq, G, N)``.
        C: ``(batch, seq, G, N)``.
        chunk_size: Ignored (the reference's chunk length).
        D: ``(H,)`` (or ``(H, P)``) skip weights, or None.
        dt_bias: ``(H,)`` added to ``dt``, or None.
        initial_states: ``(batch, H, P, N)``, or None for zeros.
        dt_softplus: Apply softplus to ``dt`` (after the bias).
        dt_limit: ``(min, max)`` clamp of ``dt``.
        return_final_states: Also return the last state.
        **kwargs: Ignored, except ``seq_idx`` / ``cu_seqlens`` (packed sequences),
            ``return_varlen_states`` and ``z``, refused when set (transformers' fallback
            ignores ``z`` where ``mamba_ssm`` gates with it; its models pass None).

    Returns:
        ``y`` ``(batch, seq, H, P)``, float32 (as the reference), and with
        ``return_final_states`` the last state ``(batch, H, P, N)``, float32.

    Raises:
        ExportError: For a refused keyword.
    """
    refuse(
        "mamba_chunk_scan_combined",
        kwargs,
        {
            "return_varlen_states": "varlen states are not supported",
            "z": "a gate z is ignored by transformers' reference and applied by mamba_ssm; "
            "gate the output after the call instead",
        },
    )
    import torch
    import torch.nn.functional as F

    from irkit.llm.kernels._scan import scan_along as scan

    heads, groups = hidden_states.shape[2], B.shape[2]
    if dt_bias is not None:
        dt = dt + dt_bias.to(dt.dtype)
    if dt_softplus:
        dt = F.softplus(dt)
    dt = held(torch.clamp(dt, min=dt_limit[0], max=dt_limit[1]), 1)  # pads: dt = 0, held

    x = hidden_states.float()
    B = B.float().repeat_interleave(heads // groups, dim=2, output_size=heads)
    C = C.float().repeat_interleave(heads // groups, dim=2, output_size=heads)
    decay = torch.exp(A.to(x.dtype) * dt.float())  # (batch, seq, H)
    x_dt = x * dt[..., None].float()  # (batch, seq, H, P)
    if initial_states is None:
        batch, head_dim, state_size = x.shape[0], x.shape[3], B.shape[3]
        init = torch.zeros(batch, heads, head_dim, state_size, dtype=x.dtype, device=x.device)
    else:
        init = initial_states.to(dtype=x.dtype, device=x.device)

    def step(
        state: torch.Tensor, xs: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        a, u, b, c = xs  # (batch, H), (batch, H, P), (batch, H, N), (batch, H, N)
        state = state * a[..., None, None] + u[..., None] * b[:, :, None, :]
        return state, torch.matmul(state, c[..., None])[..., 0]

    final_state, y = scan(step, init, (decay, x_dt, B, C), dim=1)
    if D is not None:
        y = y + (D[:, None] if D.dim() == 1 else D) * x
    y = y.contiguous()  # callers .view() the result
    if return_final_states:
        return y, final_state
    return y


def mamba_split_conv1d_scan_combined(
    zxbcdt: torch.Tensor,
    conv1d_weight: torch.Tensor,
    conv1d_bias: torch.Tensor | None,
    dt_bias: torch.Tensor,
    A: torch.Tensor,
    D: torch.Tensor,
    chunk_size: int,
    initial_states: torch.Tensor | None = None,
    dt_limit: tuple[float, float] = (0.0, float("inf")),
    return_final_states: bool = False,
    activation: str = "silu",
    rmsnorm_weight: torch.Tensor | None = None,
    rmsnorm_eps: float = 1e-6,
    outproj_weight: torch.Tensor | None = None,
    outproj_bias: torch.Tensor | None = None,
    headdim: int | None = None,
    ngroups: int = 1,
    norm_before_gate: bool = True,
    **kwargs: Any,
) -> None:
    """The fused Mamba2 mixer (split, conv, SSD, gated norm, out projection): "not fused here".

    Mixers call it only when training without a cache, and take their unfused path when it
    returns None, as transformers' torch fallback does. That path reaches the export kernels
    :func:`mamba_chunk_scan_combined` and :func:`selective_state_update`; fusing again in torch
    would export the same ops. The arguments are those of
    ``mamba_ssm.mamba_split_conv1d_scan_combined``.

    Args:
        zxbcdt: ``(batch, seq, 2·D + 2·G·N + H)``, the input projection (unused).
        conv1d_weight: Unused.
        conv1d_bias: Unused.
        dt_bias: Unused.
        A: Unused.
        D: Unused.
        chunk_size: Unused.
        initial_states: Unused.
        dt_limit: Unused.
        return_final_states: Unused.
        activation: Unused.
        rmsnorm_weight: Unused.
        rmsnorm_eps: Unused.
        outproj_weight: Unused.
        outproj_bias: Unused.
        headdim: Unused.
        ngroups: Unused.
        norm_before_gate: Unused.
        **kwargs: Ignored, except ``seq_idx`` / ``cu_seqlens``, refused when not None.

    Returns:
        None (the caller takes its unfused path).
    """
    refuse("mamba_split_conv1d_scan_combined", kwargs)
    return None


#: Contract name (``use_kernel_func_from_hub_with_fallback``) → export kernel.
KERNELS: dict[str, Callable[..., Any]] = {
    "mamba_chunk_scan_combined": mamba_chunk_scan_combined,
    "mamba_split_conv1d_scan_combined": mamba_split_conv1d_scan_combined,
    "selective_state_update": selective_state_update,
}
