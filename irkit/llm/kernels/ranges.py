"""Index ranges a model builds from a Python ``range`` over the sequence, as ``torch.arange``.

``torch.tensor(list(range(n)))`` turns the sequence length ``n`` into Python integers, so
``torch.export`` specializes ``n`` to the example's length (no program serves another prompt
length); ``torch.arange`` says the same and keeps ``n`` symbolic. CPM-Ant's
``CpmAntModel._prepare_attention_mask`` builds its left-padding mask so::

    torch.tensor(list(range(seqlen - prompt_length))[::-1])[None, :].repeat(batch, 1) < length[:, None]

(the reversed positions ``n-1 … 0`` of the tokens after its prompt: a token is real where
fewer than ``length`` real tokens follow it); :func:`cpmant_attention_mask` is that method
with ``torch.arange(n - 1, -1, -1)``, the same values, swapped in by qualified name
(:data:`METHODS`, as RG-LRU's recurrence is) while a model is exported.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["METHODS", "cpmant_attention_mask"]


def cpmant_attention_mask(
    self: Any, input_ids: torch.Tensor, span: torch.Tensor, context: torch.Tensor, length: Any
) -> torch.Tensor:
    """``CpmAntModel._prepare_attention_mask`` with its reversed positions from ``arange``.

    Args:
        self: The ``CpmAntModel`` (its ``prompt_length``).
        input_ids: ``(batch, prompt_length + tokens)`` ids, the prompt's included.
        span: ``(batch, prompt_length + tokens)`` span ids.
        context: ``(batch, prompt_length + tokens)`` context flags.
        length: ``(batch,)`` the real (non-pad) tokens of each row.

    Returns:
        ``(batch, seqlen, seqlen)`` boolean attention mask, as the method returns it.
    """
    batch, seqlen = input_ids.size(0), input_ids.size(1)
    device = input_ids.device
    directional = torch.arange(seqlen, device=device) <= torch.arange(seqlen, device=device).view(
        -1, 1
    )
    mask = context[:, None, :] | (
        context[:, :, None].logical_not() & directional.view(1, seqlen, seqlen)
    )
    mask = mask & (span[:, None, :] == span[:, :, None])
    after = torch.arange(seqlen - self.prompt_length - 1, -1, -1, device=device)
    real = after[None, :].repeat(batch, 1) < length[:, None]
    prompt = torch.ones(batch, self.prompt_length, device=device).bool()
    real = torch.cat((prompt, real), dim=1)
    return real.view(batch, seqlen, 1) & real.view(batch, 1, seqlen) & mask


#: Export methods by qualified name (``"Class.method"``), as ``__qualname__`` spells them.
METHODS = {"CpmAntModel._prepare_attention_mask": cpmant_attention_mask}
