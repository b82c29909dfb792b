"""Export precision: the dtype the exported graph computes in, and how the weights get there.

``irkit export --precision fp16`` builds the model on the ``meta`` device in float16
(:func:`meta_model`): the graph is float16 from the start (``torch.export`` sees float16
parameters, so transformers writes its own float32 islands — the norms' statistics, the rotary
angles — as in eager float16), and :func:`irkit.save` converts each checkpoint tensor of another
float dtype (float32, bfloat16) to float16 while streaming it (one tensor at a time; a value
outside float16's range is an error naming the tensor). A model already in memory is converted
as a copy (:func:`convert_model`); the caller's model is never modified.

bfloat16 is read, never written: onnxruntime's CPU kernels have almost no bfloat16 support
(``MatMul``, ``RMSNormalization``, ``Attention`` have none), so a bfloat16 checkpoint exports as
float32 (the default) or float16 (``Precision.FP16``). float16 has 5 fewer exponent bits than
bfloat16: values past 65504 become ``inf``; the conversion refuses weights outside the range,
and :func:`irkit.rules.fp32_islands.check_half_range` the known activation sites (e.g. Gemma's
``sqrt(hidden)`` embedding scale) before anything is written.

torch and transformers are imported on first call only. See ``docs/precision.md``.
"""

from __future__ import annotations

import copy
import enum
from typing import Any

from irkit.errors import LoweringOptionsError
from irkit.llm._meta import MetaModel, meta_causal_lm

__all__ = ["Precision", "convert_model", "meta_model"]


class Precision(enum.Enum):
    """The float type an export computes in (the ``--precision`` choices that are a dtype)."""

    FP32 = "fp32"
    FP16 = "fp16"

    @classmethod
    def parse(cls, name: str | Precision) -> Precision:
        """The precision named ``name`` (``"fp32"``, ``"fp16"``; a :class:`Precision` as is).

        Raises:
            LoweringOptionsError: Not one of the names (``bf16`` is refused with the reason).
        """
        if isinstance(name, Precision):
            return name
        try:
            return cls(name)
        except ValueError:
            why = (
                ": onnxruntime's CPU kernels do not run bfloat16 graphs; a bfloat16 checkpoint "
                "exports as fp32 or fp16 (its tensors are converted while saved)"
                if name in ("bf16", "bfloat16")
                else ""
            )
            choices = ", ".join(p.value for p in cls)
            raise LoweringOptionsError(
                f"precision {name!r} is not one of {choices}{why}"
            ) from None

    def torch_dtype(self) -> Any:
        """The ``torch.dtype`` of the parameters (``torch.float32`` / ``torch.float16``)."""
        import torch

        return torch.float16 if self is Precision.FP16 else torch.float32


def meta_model(
    config: Any, precision: str | Precision, *, trust_remote_code: bool = False
) -> MetaModel:
    """The causal LM of ``config`` on the ``meta`` device, its parameters in ``precision``.

    Export the returned model with :func:`irkit.llm.export_causal_lm` (the example KV cache takes
    the parameters' dtype), lower and optimize it, and save with
    ``weights=[model_folder, meta.buffers]``: checkpoint tensors of another float dtype
    (float32, bfloat16) are converted to ``precision`` while they stream.

    Args:
        config: A transformers ``PretrainedConfig``.
        precision: ``"fp32"`` or ``"fp16"`` (or a :class:`Precision`).
        trust_remote_code: Passed to ``from_config``.

    Returns:
        The :class:`irkit.llm._meta.MetaModel` (model and the real values of its buffers).

    Raises:
        LoweringOptionsError: An unknown precision.
    """
    dtype = Precision.parse(precision).torch_dtype()
    return meta_causal_lm(config, dtype=dtype, trust_remote_code=trust_remote_code)


def convert_model(model: Any, precision: str | Precision) -> Any:
    """``model`` with its floating-point parameters and buffers in ``precision``.

    The model itself when they already are; else a converted copy in eval mode (the caller's
    model is not modified; the copy holds the weights a second time, in the new dtype).

    Args:
        model: A ``torch.nn.Module`` (a transformers causal LM).
        precision: ``"fp32"`` or ``"fp16"`` (or a :class:`Precision`).

    Returns:
        The model, or a converted copy.

    Raises:
        LoweringOptionsError: An unknown precision, or ``model`` is not a torch module.
    """
    dtype = Precision.parse(precision).torch_dtype()
    if not hasattr(model, "parameters") or not hasattr(model, "to"):
        raise LoweringOptionsError(
            f"convert_model: {type(model).__name__} is not a torch module; pass the "
            "transformers model"
        )
    floats = [t for t in (*model.parameters(), *model.buffers()) if t.is_floating_point()]
    if all(t.dtype == dtype for t in floats):
        return model
    converted = copy.deepcopy(model).to(dtype)
    if hasattr(converted, "config"):
        converted.config.dtype = dtype  # (what from_pretrained(dtype=...) records)
    return converted.eval()
