"""Causal LMs whose weights are on the ``meta`` device: build one, run it for its shapes.

:func:`meta_causal_lm` builds a transformers model from its config with every parameter on
the ``meta`` device (no memory, no initialization) while the buffers its ``__init__`` computes
(rotary ``inv_freq``, …) are real; :func:`probe_mode` lets a model with ``meta`` weights run
eagerly for its output shapes (what :func:`irkit.llm.cache_layout` reads).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

__all__ = ["MetaModel", "meta_causal_lm", "probe_mode"]


def probe_mode(model: Any) -> contextlib.AbstractContextManager[Any]:
    """A context in which ``model`` runs for shapes only when its weights are on ``meta``.

    transformers reads tensor values on the way (``padding_mask.all()`` in the causal-mask
    code) unless the tensors are fake, as under ``torch.export``; a ``FakeTensorMode`` makes
    them fake, so the eager run gives the output shapes (fake tensors) without data. For a
    model with real weights this is a no-op context.

    Args:
        model: A ``torch.nn.Module``.

    Returns:
        A ``FakeTensorMode`` (non-fake inputs allowed) or ``contextlib.nullcontext()``.
    """
    param = next(iter(model.parameters()), None)
    if param is None or param.device.type != "meta":
        return contextlib.nullcontext()
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode: contextlib.AbstractContextManager[Any] = FakeTensorMode(allow_non_fake_inputs=True)
    return mode


@contextlib.contextmanager
def _parameters_on_meta() -> Iterator[None]:
    """Every parameter registered inside is moved to ``meta`` as it is registered.

    ``torch.nn.Linear`` & co. create their weights with ``torch.empty`` (untouched memory) and
    initialize them after registering them: on ``meta`` the initialization does nothing.
    Buffers are left alone, so the values ``__init__`` computes for them are real. The patch of
    ``torch.nn.Module.register_parameter`` lasts for the ``with`` block only.
    """
    import torch

    original = torch.nn.Module.register_parameter

    def register(module: Any, name: str, param: Any) -> None:
        original(module, name, param)
        if param is not None and param.device.type != "meta":
            module._parameters[name] = torch.nn.Parameter(
                param.to("meta"), requires_grad=param.requires_grad
            )

    torch.nn.Module.register_parameter = register
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = original


class MetaModel:
    """What :func:`meta_causal_lm` returns.

    Attributes:
        model: The transformers model in eval mode, parameters and buffers on ``meta``.
        buffers: The real values of its buffers by fully qualified name (the non-persistent
            ones, e.g. rotary ``inv_freq``, are in no checkpoint: pass them to
            :func:`irkit.save` after the checkpoint folder).
    """

    def __init__(self, model: Any, buffers: dict[str, Any]) -> None:
        self.model = model
        self.buffers = buffers


def meta_causal_lm(config: Any, *, dtype: Any, trust_remote_code: bool = False) -> MetaModel:
    """``AutoModelForCausalLM.from_config(config)`` with no weight in memory.

    Parameters are created on ``meta``; buffers are computed for real by the model's
    ``__init__`` (and transformers' weight init), kept in :attr:`MetaModel.buffers`, then moved
    to ``meta`` too, so the whole model exports as one weightless program.

    Args:
        config: A transformers ``PretrainedConfig``.
        dtype: The ``torch.dtype`` of the parameters (``torch.float32``, …).
        trust_remote_code: Passed to ``from_config``.

    Returns:
        The :class:`MetaModel`.
    """
    from transformers import AutoModelForCausalLM

    with _parameters_on_meta():
        model = AutoModelForCausalLM.from_config(  # type: ignore[no-untyped-call]
            config, dtype=dtype, trust_remote_code=trust_remote_code
        )
    model.eval()
    buffers = {}
    for name, buffer in list(model.named_buffers()):
        buffers[name] = buffer.detach().clone()
        owner, _, leaf = name.rpartition(".")
        model.get_submodule(owner)._buffers[leaf] = buffer.to("meta")
    return MetaModel(model, buffers)
