"""Mixture-of-experts loops over the experts tokens chose, as one gather and two batched products.

transformers 5.24 routes most MoE experts through ``use_experts_implementation`` (the
``config._experts_implementation`` switch: ``grouped_mm``, ``batched_mm``, which ``torch.export``
traces), but a few expert classes keep their own ``forward``, a Python loop over the experts
some token chose::

    expert_hit = torch.greater(expert_mask.sum(dim=(-1, -2)), 0).nonzero()
    for expert_idx in expert_hit:                     # data-dependent: which experts were hit
        selection_idx, token_idx = torch.where(expert_mask[expert_idx].squeeze(0))
        ... F.linear(hidden_states[token_idx], gate_up_proj[expert_idx]) ...
        final.index_add_(0, token_idx, out * top_k_weights[token_idx, selection_idx, None])

which ``torch.export`` cannot trace (a branch on tensor values). LongCat-Flash's
``LongcatFlashExperts`` is one, with *zero-computation experts*: an index at or past the routed
experts' count is the identity (its ``identity_expert``). Per token ``t`` and choice ``k``
(``e = top_k_index[t, k]``, ``w = top_k_weights[t, k]``) the loop computes::

    out[t] = Σ_k w · (down[e] · (act(gate[e] · x_t) ⊙ up[e] · x_t))   where e < routed
           + Σ_k w · x_t                                               where e ≥ routed

and so does :func:`gathered_experts`, for every ``(t, k)`` at once: the chosen experts'
weights gathered by index (an index past the routed ones clamped for the gather, its product
replaced by ``x_t``), two batched matrix products, the weighted sum over ``k`` — the
``batched_mm`` form of transformers' own switch. The sums are the loop's, in another order
(float rounding only).

:data:`MODULE_KERNELS` swaps it in while a model is exported, for a module whose ``forward``
takes ``(hidden_states, top_k_index, top_k_weights)``, that is not under transformers' switch
(no ``is_concatenated`` attribute, which the switch sets), whose ``gate_up_proj``
``(experts, 2·intermediate, hidden)`` and ``down_proj`` ``(routed, hidden, intermediate)`` are
the concatenated, untransposed layout the loop above reads, with an ``act_fn`` and no gate of
its own (``_apply_gate``), and that has an ``identity_expert`` (``nn.Identity``): an index past
the routed experts is the identity there, while in another loop it may mean "skip" (Step-3.7's
``num_experts`` index), which this kernel does not compute.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

__all__ = ["MODULE_KERNELS", "gathered_experts", "is_expert_loop"]

_ARGUMENTS = ["hidden_states", "top_k_index", "top_k_weights"]


def is_expert_loop(module: Any) -> bool:
    """Whether ``module`` is an expert loop :func:`gathered_experts` computes (module docstring).

    Args:
        module: Any ``nn.Module``.

    Returns:
        True for an expert module with its own loop and the concatenated weight layout.
    """
    gate_up = getattr(module, "gate_up_proj", None)
    down = getattr(module, "down_proj", None)
    if not isinstance(gate_up, torch.Tensor) or not isinstance(down, torch.Tensor):
        return False
    if gate_up.ndim != 3 or down.ndim != 3 or not callable(getattr(module, "act_fn", None)):
        return False
    if hasattr(module, "is_concatenated"):  # under transformers' experts switch already
        return False
    if not isinstance(getattr(module, "identity_expert", None), torch.nn.Identity):
        return False  # (an index past the routed experts might mean "skip", not "identity")
    if "_apply_gate" in vars(type(module)):  # a gate of its own (a clamp): not act(gate) * up
        return False
    try:
        names = list(inspect.signature(type(module).forward).parameters)[1:]
    except (TypeError, ValueError):
        return False
    experts, double, hidden = gate_up.shape
    routed, down_hidden, intermediate = down.shape
    return (
        names == _ARGUMENTS
        and double == 2 * intermediate
        and hidden == down_hidden
        and routed <= experts
    )


def gathered_experts(
    self: Any, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
) -> torch.Tensor:
    """The expert loop's sum without the loop (module docstring): the export ``forward``.

    Args:
        self: The expert module (:func:`is_expert_loop`).
        hidden_states: ``(tokens, hidden)``.
        top_k_index: ``(tokens, k)`` chosen experts; an index ``≥`` the routed experts' count
            is the identity.
        top_k_weights: ``(tokens, k)`` their weights.

    Returns:
        ``(tokens, hidden)``, in ``hidden_states``' dtype.
    """
    routed = self.down_proj.shape[0]
    tokens, k = top_k_index.shape
    index = top_k_index.reshape(-1)
    identity = index >= routed
    chosen = index.clamp(max=routed - 1)
    x = hidden_states.repeat_interleave(k, dim=0)  # (tokens·k, hidden): token t's k choices
    gate_up = torch.bmm(self.gate_up_proj[chosen], x.unsqueeze(-1).to(self.gate_up_proj.dtype))
    gate, up = gate_up.squeeze(-1).chunk(2, dim=-1)
    inner = (self.act_fn(gate) * up).unsqueeze(-1)
    out = torch.bmm(self.down_proj[chosen], inner).squeeze(-1)
    out = torch.where(identity.unsqueeze(-1), x.to(out.dtype), out)
    weighted = out * top_k_weights.reshape(-1, 1).to(out.dtype)
    return weighted.reshape(tokens, k, -1).sum(dim=1).to(hidden_states.dtype)


#: Export forwards for modules without a hub-kernel contract: ``(is it, forward)`` pairs.
MODULE_KERNELS = ((is_expert_loop, gathered_experts),)
