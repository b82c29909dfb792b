"""The export kernel of RWKV's WKV recurrence (RWKV-4's time-mixing linear attention).

transformers' RWKV calls its recurrence through the module-level ``rwkv_linear_attention`` of
``modeling_rwkv`` (a CUDA kernel for prompts on a GPU, else ``rwkv_linear_attention_cpu``),
whose CPU form loops over the tokens in Python: ``torch.export`` unrolls it for the example
length. No hub-kernel contract names it, so the kernel is swapped by the qualified name of the
function it replaces (:data:`METHODS`, read by :func:`irkit.llm.kernels.export_kernels`).

Per channel and token ``t``, with ``w = -exp(time_decay)``, ``u = time_first`` and the state
``(num, den, max)`` (``num·exp(max)``, ``den·exp(max)`` the running weighted sums of values
and of weights, kept in float32 with their exponent apart for stability)::

    m = max(max, k_t + u)
    out_t = (exp(max - m)·num + exp(k_t + u - m)·v_t) / (exp(max - m)·den + exp(k_t + u - m))
    m' = max(max + w, k_t)
    num = exp(max + w - m')·num + exp(k_t - m')·v_t
    den = exp(max + w - m')·den + exp(k_t - m')
    max = m'

the same operations in the same order as the reference, as one ``scan`` over the tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from irkit.llm.kernels._mask import step_mask

if TYPE_CHECKING:
    import torch

__all__ = ["METHODS", "rwkv_linear_attention"]

#: The ``max`` of a state before any token when the caller passes none (the reference's).
_EMPTY_MAX = -1e38


def rwkv_linear_attention(
    time_decay: torch.Tensor,
    time_first: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    state: Any = None,
    return_state: bool = False,
) -> tuple[torch.Tensor, list[torch.Tensor] | None]:
    """RWKV's WKV recurrence over a whole sequence, as one ``scan`` (module docstring).

    Where :func:`irkit.llm.kernels.step_mask` is set, a step whose mask is 0 leaves the state
    as it was (a pad after a row's last token: its output is computed and not read).

    Args:
        time_decay: ``(channels,)``, ``w = -exp(time_decay)`` the per-token decay in log space.
        time_first: ``(channels,)``, ``u``, the bonus of the current token.
        key: ``(batch, seq, channels)``.
        value: ``(batch, seq, channels)``.
        state: ``(num, den, max)``, each ``(batch, channels)`` float32, or None for an empty
            state.
        return_state: Also return the state when ``state`` is None.

    Returns:
        ``(out (batch, seq, channels) in key's dtype, [num, den, max] or None)``: the state
        after the last token where ``state`` was given or ``return_state`` is set.
    """
    import torch

    from irkit.llm.kernels._scan import scan_along as scan

    if state is None:
        num = torch.zeros_like(key[:, 0], dtype=torch.float32)
        den = torch.zeros_like(key[:, 0], dtype=torch.float32)
        high = torch.zeros_like(key[:, 0], dtype=torch.float32) + _EMPTY_MAX
    else:  # (slices of the model's state list: the scan's carry must be contiguous)
        num, den, high = (s.contiguous() for s in state)
    decay = -torch.exp(time_decay)
    out_dtype = key.dtype
    keys = key.float()
    # per-token operands (batch, seq, channels); the constants expanded, not closed over
    first = time_first.expand_as(keys)
    decays = decay.expand_as(keys)
    mask = step_mask()
    operands = [keys, value, first, decays]
    if mask is not None:  # pads hold the state
        operands.append((mask[:, :, None] != 0).expand_as(keys))

    def step(
        carry: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
        x: list[torch.Tensor],
    ) -> tuple[tuple[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]:
        num, den, high = carry
        k, v, u, w = x[:4]
        max_for_output = torch.maximum(high, k + u)
        e1 = torch.exp(high - max_for_output)
        e2 = torch.exp(k + u - max_for_output)
        out = ((e1 * num + e2 * v) / (e1 * den + e2)).to(out_dtype)
        max_for_state = torch.maximum(high + w, k)
        e1 = torch.exp(high + w - max_for_state)
        e2 = torch.exp(k - max_for_state)
        new = (e1 * num + e2 * v, e1 * den + e2, max_for_state)
        if len(x) > 4:  # a pad step: the state as it was
            new = tuple(torch.where(x[4], n, o) for n, o in zip(new, carry, strict=True))
        return (new[0], new[1], new[2]), out

    (num, den, high), output = scan(step, (num, den, high), operands, dim=1)
    if return_state or state is not None:
        return output, [num, den, high]
    return output, None


#: Qualified name (in the model's modeling module) of the function replaced → export kernel.
METHODS: dict[str, Callable[..., Any]] = {
    "rwkv_linear_attention": rwkv_linear_attention,
    "rwkv_linear_attention_cpu": rwkv_linear_attention,
}
