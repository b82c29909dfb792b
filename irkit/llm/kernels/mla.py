"""Multi-head latent attention (MLA, DeepSeek-V2/V3) in absorbed form, so its cache is K and V.

transformers 5.24's ``DeepseekV3Attention`` caches the compressed latent ``c`` (one head of
``kv_lora_rank``, after ``kv_a_layernorm``) and the rotated ``k_pe`` (one head of
``qk_rope_head_dim``), and decompresses the *whole* cache through ``kv_b_proj`` every step.
The attention it exports therefore has no past: onnxruntime's ``GroupQueryAttention``, which
writes the cache it attends over, cannot take it. Per head ``h``, with ``kv_b_proj``'s weight
split into ``W_uk[h]`` (``qk_nope_head_dim × kv_lora_rank``) and ``W_uv[h]``
(``v_head_dim × kv_lora_rank``)::

    k_nope[h] = c · W_uk[h]ᵀ           v[h] = c · W_uv[h]ᵀ
    q_nope[h] · k_nope[h]ᵀ = (q_nope[h] · W_uk[h]) · cᵀ
    softmax(s) · v[h] = (softmax(s) · c) · W_uv[h]ᵀ

so the same attention is one of ``heads`` query heads over ONE key/value head::

    Q[h] = [q_nope[h] · W_uk[h] | q_pe[h]]   (kv_lora_rank + qk_rope_head_dim)
    K    = [c | k_pe]                        (one head, the same width)
    V    = [c | 0]                           (one head, padded to K's width)
    out[h] = Attention(Q, K, V)[h][:, :kv_lora_rank] · W_uv[h]ᵀ

at the module's own ``scaling`` (yarn's mscale included), the mask transformers passes, and
through the model's own attention interface (``config._attn_implementation``; ``sdpa``
expands the one head with ``repeat_kv`` as it does Llama's groups). The cache holds ``K`` and
``V``, appended by ``cache.update`` right before the attention as in every other decoder, so
``irkit.rules.attention`` gives an ``Attention`` with a past and presents, which
``GroupQueryAttentionKVCache`` (shared buffer) takes: one KV head of 576 for DeepSeek-V3. ``V``
is padded with zeros to ``K``'s width because the op (and onnxruntime-genai's one head size)
wants equal widths; the padded columns of the output are dropped. The results differ from
transformers' by float rounding only (the products are reassociated).

:data:`MODULE_KERNELS` swaps this ``forward`` in while a model is exported, and
:data:`CACHE_LAYOUT` names it as one that changes what the cache holds, so
:func:`irkit.llm.cache_layout` probes and :func:`irkit.llm.run_eager` runs the model with it
too: the exported cache and the eager one agree.

The forward replaced is ``DeepseekV3Attention.forward`` (glm4_moe_lite, youtu and axk1 share
it): the predicate :func:`is_latent_attention` asks for what it reads — the projections, the
latent norm, ``expand_kv`` (the latent cache), the modeling module's ``apply_rotary_pos_emb`` and
``apply_rotary_pos_emb_interleave`` — and refuses a forward taking ``position_ids`` (Mistral 4
scales the query by position, which this forward does not).
"""

from __future__ import annotations

import inspect
import sys
import types
from typing import Any

import torch

__all__ = ["CACHE_LAYOUT", "MODULE_KERNELS", "absorbed_latent_attention", "is_latent_attention"]

# what the forward reads on the module
_READS = (
    "kv_a_proj_with_mqa",
    "kv_a_layernorm",
    "kv_b_proj",
    "o_proj",
    "expand_kv",
    "kv_lora_rank",
    "qk_rope_head_dim",
    "qk_nope_head_dim",
    "v_head_dim",
    "q_lora_rank",
    "num_heads",
    "scaling",
    "layer_idx",
    "config",
)
_ROTARY = ("apply_rotary_pos_emb", "apply_rotary_pos_emb_interleave")


def _modeling(module: Any) -> dict[str, Any]:
    """The globals of the module's modeling module (``{}`` where it is not loaded)."""
    found = sys.modules.get(type(module).__module__)
    return vars(found) if found is not None else {}


def is_latent_attention(module: Any) -> bool:
    """Whether ``module`` is an MLA attention caching its latent that this kernel can serve.

    Args:
        module: Any ``nn.Module``.

    Returns:
        True when it has the latent projections and sizes (``kv_a_proj_with_mqa``,
        ``kv_a_layernorm``, a bias-free ``kv_b_proj`` of ``num_heads · (qk_nope_head_dim +
        v_head_dim)`` rows, ``kv_lora_rank``, ``qk_rope_head_dim``, ``scaling`` …), the query
        projection its ``q_lora_rank`` asks for, ``expand_kv``, a config with
        ``rope_interleave``, its modeling module's two rotary functions, and a ``forward``
        without ``position_ids``.
    """
    if not all(hasattr(module, name) for name in _READS):
        return False
    if not hasattr(module.config, "rope_interleave"):
        return False
    lora = module.q_lora_rank
    wanted = ("q_proj",) if lora is None else ("q_a_proj", "q_a_layernorm", "q_b_proj")
    if any(getattr(module, name, None) is None for name in wanted):
        return False
    if not all(callable(_modeling(module).get(name)) for name in _ROTARY):
        return False
    try:
        parameters = inspect.signature(type(module).forward).parameters
    except (TypeError, ValueError):
        return False
    if "position_ids" in parameters:
        return False
    up = module.kv_b_proj
    rows = module.num_heads * (module.qk_nope_head_dim + module.v_head_dim)
    weight = getattr(up, "weight", None)
    return (
        isinstance(weight, torch.Tensor)
        and getattr(up, "bias", None) is None
        and tuple(weight.shape) == (rows, module.kv_lora_rank)
    )


def _attention(self: Any) -> tuple[Any, Any]:
    """The model's attention interface, and the module it reads, grouping every query head
    over the one key/value head."""
    globals_ = _modeling(self)
    eager = globals_["eager_attention_forward"]
    interface = globals_["ALL_ATTENTION_FUNCTIONS"].get_interface(
        self.config._attn_implementation, eager
    )
    grouped = types.SimpleNamespace(
        num_key_value_groups=self.num_heads,
        is_causal=getattr(self, "is_causal", True),
        training=self.training,
        config=self.config,
        layer_idx=self.layer_idx,
    )
    return interface, grouped


def absorbed_latent_attention(
    self: Any,
    hidden_states: torch.Tensor,
    position_embeddings: tuple[torch.Tensor, torch.Tensor],
    attention_mask: torch.Tensor | None = None,
    cache: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``DeepseekV3Attention.forward`` in absorbed form (module docstring).

    Args:
        self: The module (:func:`is_latent_attention`).
        hidden_states: ``(batch, tokens, hidden)``.
        position_embeddings: ``(cos, sin)`` of the rotary embedding.
        attention_mask: The mask transformers built for the attention interface, or None.
        cache: The model's cache, or None; it is given ``K = [c | k_pe]`` and ``V = [c | 0]``
            (one head each, ``kv_lora_rank + qk_rope_head_dim`` wide).
        **kwargs: ``past_key_values`` (the cache's older name); the rest goes to the cache
            and the attention interface as transformers passes it.

    Returns:
        ``(output (batch, tokens, hidden), attention weights or None)``.
    """
    if cache is None:
        cache = kwargs.pop("past_key_values", None)
    batch, tokens = hidden_states.shape[:-1]
    heads, nope, rope = self.num_heads, self.qk_nope_head_dim, self.qk_rope_head_dim
    rank, v_dim = self.kv_lora_rank, self.v_head_dim
    if self.q_lora_rank is None:
        q_states = self.q_proj(hidden_states)
    else:
        q_states = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(hidden_states)))
    q_states = q_states.view(batch, tokens, heads, nope + rope).transpose(1, 2)
    q_nope, q_rot = torch.split(q_states, [nope, rope], dim=-1)

    compressed = self.kv_a_proj_with_mqa(hidden_states)
    latent, k_rot = torch.split(compressed, [rank, rope], dim=-1)
    latent = self.kv_a_layernorm(latent).view(batch, 1, tokens, rank)
    k_rot = k_rot.view(batch, 1, tokens, rope)
    cos, sin = position_embeddings
    rotary = _modeling(self)[_ROTARY[1] if self.config.rope_interleave else _ROTARY[0]]
    q_rot, k_rot = rotary(q_rot, k_rot, cos, sin)

    # kv_b_proj's rows per head: qk_nope_head_dim of W_uk, then v_head_dim of W_uv
    up = self.kv_b_proj.weight.view(heads, nope + v_dim, rank)
    w_uk, w_uv = torch.split(up, [nope, v_dim], dim=1)
    q_latent = torch.matmul(q_nope, w_uk)  # (batch, heads, tokens, rank)
    query = torch.cat((q_latent, q_rot), dim=-1)
    key = torch.cat((latent, k_rot), dim=-1)
    value = torch.nn.functional.pad(latent, (0, rope))  # [c | 0]: K's width
    if cache is not None:
        key, value = cache.update(key, value, self.layer_idx, kwargs=kwargs)

    interface, grouped = _attention(self)
    out, weights = interface(
        grouped,
        query,
        key,
        value,
        attention_mask,
        dropout=getattr(self, "attention_dropout", 0.0) if self.training else 0.0,
        scaling=self.scaling,
        **kwargs,
    )  # (batch, tokens, heads, rank + rope)
    out = out[..., :rank].transpose(1, 2)  # (batch, heads, tokens, rank)
    out = torch.matmul(out, w_uv.transpose(1, 2))  # (batch, heads, tokens, v_head_dim)
    out = out.transpose(1, 2).reshape(batch, tokens, heads * v_dim).contiguous()
    return self.o_proj(out), weights


#: Export forwards for modules without a hub-kernel contract: ``(is it, forward)`` pairs.
MODULE_KERNELS = ((is_latent_attention, absorbed_latent_attention),)

#: Module kernels that change what the cache holds: the probe and eager runs use them too.
CACHE_LAYOUT = (absorbed_latent_attention,)
