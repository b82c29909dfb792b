"""The padding mask of the step being traced, for the export kernels.

irkit.llm's flat forward sets it for the duration of one trace only (a context variable, never
process state); a kernel reads it with :func:`step_mask` and holds its state where it is 0.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any

__all__ = [
    "padding_mask",
    "step_mask",
    "held",
    "layer_state",
    "current_state",
    "enter_state",
    "leave_state",
]

_STEP_MASK: contextvars.ContextVar[Any] = contextvars.ContextVar("irkit_step_mask", default=None)
_LAYER_STATE: contextvars.ContextVar[Any] = contextvars.ContextVar("irkit_state", default=None)


@contextlib.contextmanager
def padding_mask(mask: Any) -> Iterator[None]:
    """Inside the ``with``, :func:`step_mask` is ``mask`` (the new tokens' 0/1 mask).

    Export kernels hold their state where the mask is 0, so a state is the one after each
    row's last real token whether the batch is left-padded (transformers' ``generate``) or
    right-padded (onnxruntime-genai: a shorter prompt's pads come after it).

    Args:
        mask: ``(batch, new tokens)`` tensor, or ``None`` (no padding).

    Yields:
        Nothing.
    """
    token = _STEP_MASK.set(mask)
    try:
        yield
    finally:
        _STEP_MASK.reset(token)


def step_mask() -> Any:
    """The ``(batch, new tokens)`` 0/1 mask of the step being traced, or ``None``."""
    return _STEP_MASK.get()


def held(tensor: Any, sequence_axis: int) -> Any:
    """``tensor`` (a step size, a decay in log space, a write strength) zeroed on pad steps.

    A recurrence ``h ← exp(a·dt) h + dt·b`` (or ``exp(g)``, ``β``) with ``dt = 0`` on a step
    keeps ``h`` exactly: multiplying these by the step mask holds the state over pads.

    Args:
        tensor: Batch first, the new tokens on ``sequence_axis``.
        sequence_axis: The axis of the tokens.

    Returns:
        ``tensor`` times the mask broadcast along its other axes (``tensor`` itself when no
        mask is set).
    """
    mask = step_mask()
    if mask is None:
        return tensor
    shape = [1] * tensor.dim()
    shape[0], shape[sequence_axis] = mask.shape[0], mask.shape[1]
    return tensor * mask.reshape(shape).to(tensor.dtype)


@contextlib.contextmanager
def layer_state(state: Any) -> Iterator[None]:
    """Inside the ``with``, :func:`current_state` is the running layer's cached recurrent state.

    Mixers whose multi-token path starts their scan from zeros (transformers' Mamba1 mixers:
    a prompt is always a first step there) continue from it instead, so one program serves a
    prefill and the decode steps after it.

    Args:
        state: The layer's past recurrent state.

    Yields:
        Nothing.
    """
    token = _LAYER_STATE.set(state)
    try:
        yield
    finally:
        _LAYER_STATE.reset(token)


def current_state() -> Any:
    """The recurrent state of the layer being traced, or ``None``."""
    return _LAYER_STATE.get()


def enter_state(state: Any) -> Any:
    """A forward pre-hook making ``state`` the :func:`current_state` while its module runs."""

    def hook(module: Any, args: Any) -> None:
        _LAYER_STATE.set(state)

    return hook


def leave_state(module: Any, args: Any, output: Any) -> None:
    """A forward hook: no :func:`current_state` after the module ran."""
    _LAYER_STATE.set(None)
