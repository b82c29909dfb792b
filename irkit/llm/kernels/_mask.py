"""The padding mask of the step being traced, for the export kernels.

irkit.llm's flat forward sets it for the duration of one trace only (a context variable, never
process state); a kernel reads it with :func:`step_mask` and holds its state where it is 0.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any

__all__ = ["padding_mask", "step_mask"]

_STEP_MASK: contextvars.ContextVar[Any] = contextvars.ContextVar("irkit_step_mask", default=None)


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
