"""Windowed KV compressors (DeepSeek-V4's compressed sparse and heavily compressed attention)
with one branch-free path for every sequence length, for the export without a cache.

A compressor folds each closed window of ``compress_rate`` tokens into one KV entry: a softmax
over the window (gate logits plus a learned ``position_bias``) weights the projected values, an
RMS norm and a rotary embedding at the window's first position follow. The *overlapping* kind
(``position_bias`` twice the head size wide: the sparse attention's compressor and its indexer)
reads two halves, the previous window's first half ``Ca`` and the current one's second half
``Cb``; window 0 has no previous one (zero values, ``-inf`` gates). The indexer scores every
query against its own compressed keys and keeps the ``index_topk`` best entries the query may
see; the compressor turns them into an attention bias.

transformers writes these with branches on the length — ``if chunk.shape[1] > 0`` (a window
closed at all), ``if n_windows > 1``, ``if seq_len == 1 or compressed_len == 0`` — and the
attention appends the compressed entries to its keys only ``if kv.shape[2] >
attention_mask.shape[-1]``: ``torch.export`` keeps the example's side, so a program exported on
a short prompt is wrong past the first window (it narrowed the sequence to ``≤ 3``). Here every
length takes one path: the tokens are padded with zeros to ``S // rate + 2`` windows (never an
empty or size-1 tensor, which torch would specialize), each window is compressed (the previous
halves shifted in with ``cat``), and the padded windows — closing at or after the sequence's
end — get bias ``-inf`` like any entry a query may not see (weight exactly 0 after the
softmax); the attention then always takes its concatenating branch. The kernels serve
``cache=None`` only (a cached call runs the model's own forward: the cache classes of these
layers hold buffers of a varying length, refused at the export).
"""

from __future__ import annotations

import sys
from typing import Any

import torch

__all__ = [
    "MODULE_KERNELS",
    "is_window_compressor",
    "is_window_indexer",
    "window_compressor",
    "window_indexer",
]

_COMPRESSOR = ("compress_rate", "kv_proj", "gate_proj", "position_bias", "kv_norm", "rotary_emb")
_COMPRESSOR_TOO = ("rope_layer_type", "head_dim")


def _compressor_like(module: Any) -> bool:
    if not all(hasattr(module, name) for name in _COMPRESSOR + _COMPRESSOR_TOO):
        return False
    bias, rate, width = module.position_bias, module.compress_rate, module.head_dim
    return (
        isinstance(rate, int)
        and isinstance(bias, torch.Tensor)
        and bias.dim() == 2
        and bias.shape[0] == rate
        and bias.shape[1] in (width, 2 * width)
        and hasattr(sys.modules.get(type(module).__module__), "apply_rotary_pos_emb")
    )


def is_window_indexer(module: Any) -> bool:
    """Whether ``module`` is an indexer :func:`window_indexer` serves: a compressor of
    overlapping windows with a ``scorer``, ``index_topk`` and its query projection ``q_b_proj``.

    Args:
        module: Any ``nn.Module``.

    Returns:
        Whether it is.
    """
    return (
        _compressor_like(module)
        and all(hasattr(module, name) for name in ("scorer", "index_topk", "q_b_proj"))
        and module.position_bias.shape[1] == 2 * module.head_dim
    )


def is_window_compressor(module: Any) -> bool:
    """Whether ``module`` is a compressor :func:`window_compressor` serves: non-overlapping
    windows without an indexer, or overlapping ones with an ``indexer``
    (:func:`is_window_indexer`).

    Args:
        module: Any ``nn.Module``.

    Returns:
        Whether it is.
    """
    if not _compressor_like(module) or hasattr(module, "scorer"):
        return False
    overlap = module.position_bias.shape[1] == 2 * module.head_dim
    indexer = getattr(module, "indexer", None)
    return is_window_indexer(indexer) if overlap else indexer is None


def _entries(self: Any, hidden_states: torch.Tensor) -> torch.Tensor:
    """The compressed entries of ``S // rate + 2`` windows, ``(batch, S // rate + 2,
    head_dim)``: every closed window's, then those of the tokens padded with zeros to two more
    windows (no query sees them: each closes at or after the sequence's end)."""
    batch, tokens, _ = hidden_states.shape
    rate, width = self.compress_rate, self.head_dim
    kv, gate = self.kv_proj(hidden_states), self.gate_proj(hidden_states)
    channels = kv.shape[-1]
    windows = tokens // rate + 2  # (never 0 or 1: no empty or broadcast case to specialize)
    pad = (0, 0, 0, windows * rate - tokens)
    kv = torch.nn.functional.pad(kv, pad).reshape(batch, windows, rate, channels)
    gate = torch.nn.functional.pad(gate, pad).reshape(batch, windows, rate, channels)
    gate = gate + self.position_bias
    if channels == 2 * width:  # overlapping: [previous window's Ca | this window's Cb]
        none = kv.new_zeros((batch, 1, rate, width))  # (window 0's: zero values, -inf gates)
        unseen = gate.new_full((batch, 1, rate, width), float("-inf"))
        previous = torch.cat([none, kv[..., :width]], dim=1)[:, :windows]
        previous_gate = torch.cat([unseen, gate[..., :width]], dim=1)[:, :windows]
        kv = torch.cat([previous, kv[..., width:]], dim=2)
        gate = torch.cat([previous_gate, gate[..., width:]], dim=2)
    weights = gate.softmax(dim=2, dtype=torch.float32).to(kv.dtype)
    compressed = self.kv_norm((kv * weights).sum(dim=2))
    positions = (torch.arange(windows, device=kv.device) * rate).unsqueeze(0).expand(batch, -1)
    cos, sin = self.rotary_emb(compressed, position_ids=positions, layer_type=self.rope_layer_type)
    rotate = sys.modules[type(self).__module__].apply_rotary_pos_emb
    return rotate(compressed.unsqueeze(1), cos, sin).squeeze(1)


def _visible(position_ids: torch.Tensor, rate: int, entries: int) -> torch.Tensor:
    """``(batch, S, entries)``: whether a query may see an entry (its window closed before)."""
    threshold = (position_ids + 1) // rate
    return torch.arange(entries, device=position_ids.device) < threshold.unsqueeze(-1)


def window_indexer(
    self: Any,
    hidden_states: torch.Tensor,
    q_residual: torch.Tensor,
    position_ids: torch.Tensor,
    cache: Any = None,
    layer_idx: int = 0,
    **kwargs: Any,
) -> torch.Tensor:
    """The indexer's ``forward`` without a cache: per query, the top ``index_topk`` entries it
    may see, ``-1`` where fewer are visible (transformers' semantics for ``cache=None``).

    Args:
        self: The module (:func:`is_window_indexer`).
        hidden_states: ``(batch, S, hidden)``.
        q_residual: The attention's query latent.
        position_ids: ``(batch, S)``.
        cache: The model's cache (not None: the model's own forward).
        layer_idx: The layer.
        **kwargs: ``past_key_values``, the cache's older name.

    Returns:
        ``(batch, S, k)`` entry indices.
    """
    cache = cache if cache is not None else kwargs.get("past_key_values")
    if cache is not None:
        return type(self).forward(self, hidden_states, q_residual, position_ids, cache, layer_idx)
    batch, tokens, _ = hidden_states.shape
    keys = _entries(self, hidden_states)
    cos, sin = self.rotary_emb(
        hidden_states, position_ids=position_ids, layer_type=self.rope_layer_type
    )
    rotate = sys.modules[type(self).__module__].apply_rotary_pos_emb
    q = self.q_b_proj(q_residual).view(batch, tokens, -1, self.head_dim).transpose(1, 2)
    q = rotate(q, cos, sin).transpose(1, 2)
    scores = self.scorer(q, keys, hidden_states)  # (batch, S, entries)
    entries = keys.shape[1]
    visible = _visible(position_ids, self.compress_rate, entries)
    scores = scores.masked_fill(~visible, float("-inf"))
    # (k of all S // rate + 2 entries: the padded ones are never visible, so a pick of one is
    # marked -1 like any pick a query may not see: the same valid picks as transformers', up to
    # which of equal scores a top k keeps)
    top = scores.topk(torch.sym_min(self.index_topk, entries), dim=-1).indices
    seen = (position_ids + 1) // self.compress_rate
    return torch.where(top >= seen.unsqueeze(-1), torch.full_like(top, -1), top)


def window_compressor(
    self: Any,
    hidden_states: torch.Tensor,
    q_residual: torch.Tensor,
    position_ids: torch.Tensor,
    cache: Any = None,
    layer_idx: int = 0,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The compressor's ``forward`` without a cache: the entries of ``W = S // rate + 2``
    windows (``(batch, 1, W, head_dim)``, the last two or more of zero-padded tokens) and their
    attention bias ``(batch, 1, S, W)``: 0 where a query reads an entry (every window closed
    before it, or the indexer's picks among those), ``-inf`` else — on every padded window.

    Args:
        self: The module (:func:`is_window_compressor`).
        hidden_states: ``(batch, S, hidden)``.
        q_residual: The attention's query latent (the indexer's input).
        position_ids: ``(batch, S)``.
        cache: The model's cache (not None: the model's own forward).
        layer_idx: The layer.
        **kwargs: ``past_key_values``, the cache's older name.

    Returns:
        ``(entries, bias)``.
    """
    cache = cache if cache is not None else kwargs.get("past_key_values")
    if cache is not None:
        own: tuple[torch.Tensor, torch.Tensor] = type(self).forward(
            self, hidden_states, q_residual, position_ids, cache, layer_idx
        )
        return own
    batch, tokens, _ = hidden_states.shape
    entries = _entries(self, hidden_states)
    count = entries.shape[1]
    indexer = getattr(self, "indexer", None)
    if indexer is None:  # every entry whose window closed before the query
        keep = _visible(position_ids, self.compress_rate, count).unsqueeze(1)
        keep = keep.expand(batch, 1, tokens, count)
    else:  # the indexer's picks (-1: none; scattered into one spare column, then dropped)
        picks = indexer(hidden_states, q_residual, position_ids, None, layer_idx)
        picks = torch.where(picks >= 0, picks, torch.full_like(picks, count))
        chosen = torch.zeros((batch, 1, tokens, count + 1), dtype=torch.bool, device=picks.device)
        keep = chosen.scatter(-1, picks.unsqueeze(1), True)[..., :count]
    bias = torch.zeros(keep.shape, dtype=entries.dtype, device=entries.device)
    return entries.unsqueeze(1), bias.masked_fill(~keep, float("-inf"))


#: Export forwards keyed by what the module is: ``(is it, forward)`` pairs.
MODULE_KERNELS = (
    (is_window_indexer, window_indexer),
    (is_window_compressor, window_compressor),
)
