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
and :func:`check_half_range` the known activation sites (:data:`HALF_OVERFLOW_SITES`, e.g.
Gemma's ``sqrt(hidden)`` embedding scale) before anything is written;
:func:`irkit.rules.fp32_islands.keep_fp32` keeps a named list of ops in float32.

torch and transformers are imported on first call only. See ``docs/precision.md``.
"""

from __future__ import annotations

import copy
import enum
from typing import Any

import numpy as np

from irkit.errors import LoweringOptionsError, WeightsError
from irkit.llm._meta import MetaModel, meta_causal_lm
from irkit.weights import open_weights

__all__ = [
    "HALF_OVERFLOW_SITES",
    "Precision",
    "check_half_range",
    "convert_model",
    "meta_model",
]

#: Activation sites that leave float16's range for some weights, checked by
#: :func:`check_half_range`: the module attribute that marks one, and what it computes.
HALF_OVERFLOW_SITES: dict[str, str] = {
    "embed_scale": "embedding rows times embed_scale (Gemma's sqrt(hidden_size))",
}
_HALF_MAX = float(np.finfo(np.float16).max)


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
            raise LoweringOptionsError(f"precision {name!r} is not one of {choices}{why}") from None

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
    """``model`` with its floating-point parameters in ``precision``.

    The model itself when they already are; else a converted copy in eval mode (the caller's
    model is not modified; the copy holds the weights a second time, in the new dtype). Buffers
    keep their dtype, as ``from_pretrained(dtype=...)`` builds them: the rotary ``inv_freq``
    stays float32 (``model.half()`` would round it to float16).

    Args:
        model: A ``torch.nn.Module`` (a transformers causal LM).
        precision: ``"fp32"`` or ``"fp16"`` (or a :class:`Precision`).

    Returns:
        The model, or a converted copy.

    Raises:
        LoweringOptionsError: An unknown precision, or ``model`` is not a torch module.
    """
    dtype = Precision.parse(precision).torch_dtype()
    if not hasattr(model, "named_parameters") or not hasattr(model, "named_buffers"):
        raise LoweringOptionsError(
            f"convert_model: {type(model).__name__} is not a torch module; pass the "
            "transformers model"
        )
    if all(p.dtype == dtype for p in model.parameters() if p.is_floating_point()):
        return model
    converted = copy.deepcopy(model)
    buffers = [(name, b) for name, b in converted.named_buffers() if b is not None]
    converted.to(dtype)
    for name, buffer in buffers:  # back to the dtype they were built in
        owner, _, leaf = name.rpartition(".")
        converted.get_submodule(owner)._buffers[leaf] = buffer
    if hasattr(converted, "config"):
        converted.config.dtype = dtype  # (what from_pretrained(dtype=...) records)
    return converted.eval()


def _tensor(module_tensor: Any, key: str, source: Any) -> np.ndarray | None:
    """``module_tensor`` as float32 numpy, read from ``source`` when it is on ``meta``."""
    if module_tensor is None:
        return None
    if not hasattr(module_tensor, "device"):
        return np.asarray(float(module_tensor), dtype=np.float32)
    if module_tensor.device.type != "meta":
        return np.asarray(module_tensor.detach().float().cpu().numpy())
    stored = source.get(key) if source is not None else None
    return None if stored is None else np.asarray(stored.numpy(), dtype=np.float32)


def check_half_range(model: Any, weights: object = None) -> None:
    """Refuse a float16 export whose :data:`HALF_OVERFLOW_SITES` overflow for these weights.

    For each module with an ``embed_scale`` (Gemma's scaled embedding), the largest embedding
    value times the scale must stay within float16's 65504, else the float16 graph computes
    ``inf`` on the first layer. Weights on the ``meta`` device are read from ``weights`` (what
    :func:`irkit.save` gets: a folder, a ``.safetensors`` file, a state dict, a list of them).

    Args:
        model: The transformers model (real or ``meta`` parameters).
        weights: Where ``meta`` tensors are read (default: only the model's own tensors).

    Raises:
        WeightsError: A site overflows (the message names the module, the bound and the fix),
            or a ``meta`` tensor is in none of ``weights``.
    """
    source = open_weights(weights) if weights is not None else None
    for name, module in model.named_modules():
        for attribute, what in HALF_OVERFLOW_SITES.items():
            marker = getattr(module, attribute, None)
            if marker is None or getattr(module, "weight", None) is None:
                continue
            prefix = f"{name}." if name else ""
            table = _tensor(module.weight, f"{prefix}weight", source)
            scale = _tensor(marker, f"{prefix}{attribute}", source)
            if table is None or scale is None:
                raise WeightsError(
                    f"check_half_range: {prefix}weight or {prefix}{attribute} is on the meta "
                    "device and in none of the weights given; pass the checkpoint folder "
                    "(and MetaModel.buffers) as weights="
                )
            scale16 = float(np.float16(scale.reshape(-1)[0]))  # as the float16 model rounds it
            bound = float(np.abs(table).max()) * abs(scale16)
            if bound > _HALF_MAX:
                raise WeightsError(
                    f"float16 export: {name or 'the model'} ({type(module).__name__}) computes "
                    f"{what}: max |row| {float(np.abs(table).max()):g} × {scale16:g} = "
                    f"{bound:g}, past float16's {_HALF_MAX:g} (inf in the float16 graph). "
                    "Fix: export in float32 (precision 'fp32', --precision fp32)."
                )
