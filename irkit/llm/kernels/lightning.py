"""Lightning attention (MiniMax's linear attention) as a scan over tokens.

Linear attention with a constant decay per head: with the state ``S`` a
``(head_dim, head_dim)`` matrix per head and ``λ = exp(−slope)`` (the module's ``slope_rate``
buffer), per token ``t``::

    S = λ · S + k_t ⊗ v_t
    o_t = Sᵀ q_t

transformers' module computes it in two Python loops: over blocks of ``block_size`` tokens for a
prompt (the same sums, blocked: ``query_decay``/``key_decay``/``diagonal_decay`` are the powers
of ``λ`` inside a block) when its cache holds no state yet, and over the tokens when it does.
``torch.export`` unrolls either for the example length. The module calls no hub-kernel contract,
so :data:`MODULE_KERNELS` swaps its ``forward`` while a model is exported
(:func:`irkit.llm.kernels.export_kernels`), keyed by what the module is — one with a per-head
``slope_rate`` and the block decays, and the projections this forward reads — for one whose
recurrence is :data:`gated_linear`, a custom op whose body is a ``scan`` (one step per token,
the state as the carry). One program then serves a prefill of any length and a one-token
decode: the state is read from and written to the model's cache through the cache's own
accessors (``get_linear_cache`` / ``set_linear_cache``), zeros where it holds none.

On a pad step (:func:`irkit.llm.kernels.step_mask` is 0) the decay is ``exp(0) = 1`` and, as
transformers zeroes the pads' query, key and value (``apply_mask_to_padding_states``), nothing
is written: a right-padded row's state is the one after its last real token.

``irkit_kernels::gated_linear(q, k, v, decay, state) -> (out, final)`` is onnxruntime's
``LinearAttention(update_rule="gated", scale=1)``: ``S = exp(g_t)·S + k_t ⊗ v_t``,
``o_t = Sᵀ q_t``; ``(batch, tokens, heads, dim)`` operands, ``decay`` ``(batch, tokens, heads)``
in log space, float32.
"""

from __future__ import annotations

from typing import Any

import torch

from irkit.llm.kernels._mask import held
from irkit.llm.kernels._ops import NAMESPACE, _scan_tokens

__all__ = ["MODULE_KERNELS", "gated_linear", "is_lightning_attention", "lightning_attention"]

# what makes a module a lightning attention (its decays), then what the export forward reads
_IS = ("slope_rate", "block_size", "query_decay", "key_decay", "diagonal_decay")
_READS = ("qkv_proj", "act_fn", "norm", "output_gate", "out_proj", "num_attention_heads")
_READS_TOO = ("head_dim", "layer_idx")


def _gated_linear(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    decay: torch.Tensor,
    state: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Linear attention with a decay in log space per head and token (module docstring).

    Args:
        query: ``(batch, tokens, heads, k_dim)``, scaled already.
        key: ``(batch, tokens, heads, k_dim)``.
        value: ``(batch, tokens, heads, v_dim)``.
        decay: ``(batch, tokens, heads)``, log space (≤ 0).
        state: ``(batch, heads, k_dim, v_dim)``, the state before the first token.

    Returns:
        ``(out (batch, tokens, heads, v_dim), state after the last token)``.
    """

    def step(
        s: torch.Tensor, q_t: torch.Tensor, k_t: torch.Tensor, v_t: torch.Tensor, d_t: torch.Tensor
    ) -> list[torch.Tensor]:
        s = s * d_t.exp()[..., None, None] + k_t[..., :, None] * v_t[..., None, :]
        return [s.clone(), (s * q_t[..., None]).sum(-2)]

    out, final = _scan_tokens(step, state, query, key, value, decay)
    return out, final


def _gated_linear_shape(*operands: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The output shapes: ``value``'s and ``state``'s (operands as :func:`_gated_linear`'s)."""
    value, state = operands[2], operands[4]
    return value.new_empty(value.shape), state.new_empty(state.shape)


gated_linear = torch.library.custom_op(f"{NAMESPACE}::gated_linear", _gated_linear, mutates_args=())
gated_linear.register_fake(_gated_linear_shape)


def is_lightning_attention(module: Any) -> bool:
    """Whether ``module`` is a lightning attention this kernel's forward can serve.

    Args:
        module: Any ``nn.Module``.

    Returns:
        True when it has a per-head ``slope_rate`` buffer ``(heads, 1, 1)``, the block decays
        (``block_size``, ``query_decay``, ``key_decay``, ``diagonal_decay``) and what
        :func:`lightning_attention` reads.
    """
    if not all(hasattr(module, name) for name in _IS + _READS + _READS_TOO):
        return False
    slope = module.slope_rate
    heads = module.num_attention_heads
    return isinstance(slope, torch.Tensor) and tuple(slope.shape) == (heads, 1, 1)


def lightning_attention(
    self: Any,
    hidden_states: torch.Tensor,
    position_embeddings: Any = None,
    attention_mask: torch.Tensor | None = None,
    cache: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A lightning attention's ``forward`` whose recurrence is one ``scan`` over the tokens.

    The same projections, activation, padding, norm and output gate as transformers'
    ``MiniMaxLightningAttention.forward``; the state starts from the cache's
    (``cache.get_linear_cache(layer_idx)``, zeros where it holds none) and is stored back with
    ``cache.set_linear_cache``.

    Args:
        self: The module (:func:`is_lightning_attention`).
        hidden_states: ``(batch, tokens, hidden)``.
        position_embeddings: Unused (no rotary embedding in this mixer).
        attention_mask: The 2-d ``(batch, tokens)`` padding mask of the new tokens, or None.
        cache: The model's cache, or None.
        **kwargs: ``past_key_values`` (the cache's older name); others are ignored.

    Returns:
        ``(output (batch, tokens, hidden), state after the last token)``.
    """
    cache = cache if cache is not None else kwargs.get("past_key_values")
    batch, tokens, _ = hidden_states.shape
    heads, dim = self.num_attention_heads, self.head_dim
    qkv = self.act_fn(self.qkv_proj(hidden_states))
    if attention_mask is not None:  # transformers' apply_mask_to_padding_states
        qkv = (qkv * attention_mask[:, :, None]).to(qkv.dtype)
    qkv = qkv.reshape(batch, tokens, heads, 3 * dim).to(torch.float32)
    query, key, value = torch.split(qkv, dim, dim=3)
    cached = None if cache is None else cache.get_linear_cache(self.layer_idx)
    state = query.new_zeros(batch, heads, dim, dim)  # none yet: zeros, the recurrence's start
    if isinstance(cached, torch.Tensor) and cached.ndim == 4:
        state = cached
    slope = self.slope_rate.reshape(1, 1, heads).to(torch.float32)
    decay = held((-slope).expand(batch, tokens, heads), 1)  # a pad step: exp(0) = 1, no decay
    out, final = gated_linear(query, key, value, decay, state.to(torch.float32))
    final = final.to(hidden_states.dtype)
    out = out.to(hidden_states.dtype).reshape(batch, tokens, heads * dim)
    out = self.norm(out)
    out = torch.sigmoid(self.output_gate(hidden_states)) * out
    out = self.out_proj(out)
    if cache is not None:
        cache.set_linear_cache(self.layer_idx, final)
    return out, final


#: Export forwards for modules without a hub-kernel contract: ``(is it, forward)`` pairs.
MODULE_KERNELS = ((is_lightning_attention, lightning_attention),)
