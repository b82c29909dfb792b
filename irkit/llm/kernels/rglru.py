"""Export kernels for the RG-LRU recurrent block (Griffin / Hawk: transformers' RecurrentGemma).

No hub-kernel contract covers it: the recurrence is a method, ``RecurrentGemmaRglru._rnn_scan``,
a Python loop over the tokens, and the block around it, ``RecurrentGemmaRecurrentBlock.forward``,
branches on the number of new tokens (a prompt starts its convolution from zeros, one token
continues from the module's ``conv1d_state``). ``torch.export`` fixes both to the example length.
The kernels here replace those two methods by their qualified names (:data:`METHODS`, see
:func:`irkit.llm.kernels.export_kernels`), with one path for every length:

- the recurrence, per channel and token ``t`` (float32 state ``h``, ``h_0`` the module's
  ``recurrent_states`` or zeros)::

      a_t = recurrent_gate_t · (1 − reset_t)
      h_t = a_t · h_{t−1} + x_t
      y_t = h_t

  as one ``torch`` ``scan`` (→ ONNX ``Scan``). Where the step's padding mask is 0 the step holds
  ``h`` (``a = 1``, ``x = 0``), so a right-padded row's state is the one after its last real
  token;
- the block's causal depthwise convolution over ``cat(conv1d_state, inputs)`` (the last
  ``K − 1`` inputs before the step, zeros before the first token): for a prompt this is the
  convolution's own zero padding, for one token the block's decode sum, so both of
  transformers' paths are one. The new ``conv1d_state`` is the last ``K − 1`` columns up to
  each row's last real token.

The states stay the modules' own attributes (``conv1d_state``, ``rg_lru.recurrent_states``);
:mod:`irkit.llm._states` carries them as the ``conv`` and ``recurrent`` cache kinds.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from irkit.llm.kernels._mask import step_mask

if TYPE_CHECKING:
    import torch

__all__ = ["METHODS", "rnn_scan", "recurrent_block_forward", "causal_conv"]


def rnn_scan(
    self: Any,
    hidden_states: torch.Tensor,
    recurrent_gate: torch.Tensor,
    reset: torch.Tensor,
    recurrent_states: torch.Tensor | None,
    acc_dtype: Any = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``RecurrentGemmaRglru._rnn_scan`` as one ``scan`` over the tokens (module docstring).

    Args:
        self: The ``RecurrentGemmaRglru`` module (unused: the method's own argument).
        hidden_states: ``x``, ``(batch, seq, width)``, the normalized gated inputs.
        recurrent_gate: ``a``, ``(batch, seq, width)``, the diagonal recurrence.
        reset: ``(batch, seq, 1)`` bool, true at a document start (position 0).
        recurrent_states: ``(batch, width)``, the state before the first token, or None
            (zeros).
        acc_dtype: The state's dtype (default float32, as the method's).

    Returns:
        ``(y (batch, seq, width) in the dtype of hidden_states, last state (batch, width))``.
    """
    import torch

    from irkit.llm.kernels._scan import scan_along as scan

    acc = torch.float32 if acc_dtype is None else acc_dtype
    gate = (recurrent_gate * ~reset).to(acc)
    inputs = hidden_states.to(acc)
    mask = step_mask()
    if mask is not None:  # a pad step holds the state: a = 1, x = 0
        keep = mask[:, :, None].to(torch.bool)
        gate = torch.where(keep, gate, torch.ones_like(gate))
        inputs = torch.where(keep, inputs, torch.zeros_like(inputs))
    if recurrent_states is None:
        init = inputs.new_zeros(inputs.shape[0], inputs.shape[2])
    else:
        init = recurrent_states.to(dtype=acc, device=inputs.device)

    def step(
        state: torch.Tensor, x: tuple[torch.Tensor, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        a_t, x_t = x
        state = a_t * state + x_t
        return state, state.clone()

    last, out = scan(step, init, (gate, inputs), dim=1)
    return out.to(hidden_states.dtype), last


def causal_conv(
    inputs: torch.Tensor, state: torch.Tensor | None, weight: torch.Tensor, bias: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """A depthwise causal convolution continuing from ``state``, and the state after it.

    Args:
        inputs: ``(batch, channels, seq)``.
        state: ``(batch, channels, K - 1)``, the inputs before these, or None (zeros).
        weight: ``(channels, 1, K)``, a depthwise ``Conv1d``'s weight.
        bias: ``(channels,)`` or None.

    Returns:
        ``(outputs (batch, channels, seq), the last K - 1 inputs up to each row's last real
        token (the padding mask of the step, else the last ones))``.
    """
    import torch
    import torch.nn.functional as F

    width = int(weight.shape[-1]) - 1
    if state is None:
        state = inputs.new_zeros(inputs.shape[0], inputs.shape[1], width)
    window = torch.cat([state.to(inputs.dtype), inputs], dim=-1)
    out = F.conv1d(window, weight, bias, groups=int(weight.shape[0]))
    mask = step_mask()
    if mask is None:
        return out, window[..., window.shape[-1] - width :]
    steps = torch.arange(1, inputs.shape[-1] + 1, device=mask.device)
    end = width + (mask.to(steps.dtype) * steps).amax(-1)  # (batch,): after the last real token
    index = end[:, None] - width + torch.arange(width, device=mask.device)
    index = index[:, None, :].expand(window.shape[0], window.shape[1], width)
    return out, torch.gather(window, -1, index)


def recurrent_block_forward(
    self: Any,
    input_states: torch.Tensor,
    position_ids: torch.Tensor,
    attention_mask: Any = None,
    use_cache: bool = True,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """``RecurrentGemmaRecurrentBlock.forward`` with one path for a prompt and a decode step.

    The block's own submodules (``linear_y``, ``linear_x``, ``conv_1d``, ``rg_lru``,
    ``linear_out``, ``act_fn``) in the block's order; the convolution by :func:`causal_conv`
    from ``self.conv1d_state`` (module docstring).

    Args:
        self: The ``RecurrentGemmaRecurrentBlock``.
        input_states: ``(batch, seq, hidden)``.
        position_ids: ``(batch, seq)``; position 0 resets the recurrence.
        attention_mask: Unused (the block's own signature).
        use_cache: Keep the states on the modules (else they are cleared, as the block does).
        **kwargs: Ignored.

    Returns:
        ``(hidden states (batch, seq, hidden), None)``.
    """
    branch_y = self.act_fn(self.linear_y(input_states))
    branch_x = self.linear_x(input_states).transpose(1, 2)
    state = self.conv1d_state if use_cache else None
    conv = self.conv_1d
    branch_x, state = causal_conv(branch_x, state, conv.weight, conv.bias)
    if not use_cache:
        self.rg_lru.recurrent_states = None
    self.conv1d_state = state if use_cache else None
    branch_x = self.rg_lru(branch_x.transpose(1, 2), position_ids)
    if not use_cache:
        self.rg_lru.recurrent_states = None
    return self.linear_out(branch_x * branch_y), None


#: Qualified name (in the model's modeling module) of the method replaced → export kernel.
METHODS: dict[str, Callable[..., Any]] = {
    "RecurrentGemmaRglru._rnn_scan": rnn_scan,
    "RecurrentGemmaRecurrentBlock.forward": recurrent_block_forward,
}
