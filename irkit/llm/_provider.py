"""The execution provider an ``irkit export`` folder is written for (``--execution-provider``).

onnxruntime-genai reads the provider from ``genai_config.json``
(``model.decoder.session_options.provider_options``: empty for the CPU, ``[{"cuda": {}}]`` for
CUDA), and the provider decides the float type the graph computes in:

- **cpu**: as ``--precision`` says (``int4``/``int8``: float32 activations beside the packed
  weights, what the CPU's ``MatMulNBits`` and ``GroupQueryAttention`` run fastest).
- **cuda**: float16 everywhere: onnxruntime's CUDA ``GroupQueryAttention`` takes float16 and
  bfloat16 only, so ``int4``/``int8`` export a float16 model whose matmul weights are packed
  (genai's builder does the same for ``-e cuda``) and ``fp32`` is refused (its attention would
  fall back to the CPU, copying every layer's activations between the devices); and the
  residual add + norm pairs become ``SkipSimplifiedLayerNormalization`` (:attr:`skip_norm`)
  and per-head Q/K norms move into ``GroupQueryAttention`` (:attr:`gqa_qk_norm`).

torch-free. See ``docs/gpu.md``.
"""

from __future__ import annotations

import enum
from typing import Any

from irkit.errors import LoweringOptionsError

__all__ = ["ExecutionProvider"]

_QUANTIZED = ("int4", "int8")


class ExecutionProvider(enum.Enum):
    """Where onnxruntime-genai runs the exported folder (the ``--execution-provider`` choices)."""

    CPU = "cpu"
    CUDA = "cuda"

    @classmethod
    def parse(cls, name: str | ExecutionProvider) -> ExecutionProvider:
        """The provider named ``name`` (``"cpu"``, ``"cuda"``; an :class:`ExecutionProvider` as
        is).

        Raises:
            LoweringOptionsError: Not one of the names.

        Example:
            >>> ExecutionProvider.parse("cuda").provider_options()
            [{'cuda': {}}]
        """
        if isinstance(name, ExecutionProvider):
            return name
        try:
            return cls(name)
        except ValueError:
            choices = ", ".join(p.value for p in cls)
            raise LoweringOptionsError(
                f"execution provider {name!r} is not one of {choices}"
            ) from None

    def compute_dtype(self, precision: str) -> str:
        """The float type (``"fp32"`` or ``"fp16"``) a ``precision`` export computes in here.

        Args:
            precision: One of ``irkit.llm._export.PRECISIONS`` (checked by the caller).

        Returns:
            ``"fp16"`` for ``fp16``, and on CUDA for ``int4``/``int8`` too; else ``"fp32"``.

        Raises:
            LoweringOptionsError: ``fp32`` on CUDA, with the choices that run there.

        Example:
            >>> ExecutionProvider.CUDA.compute_dtype("int4")
            'fp16'
            >>> ExecutionProvider.CPU.compute_dtype("int4")
            'fp32'
        """
        if precision == "fp16":
            return "fp16"
        if self is ExecutionProvider.CUDA:
            if precision in _QUANTIZED:
                return "fp16"
            raise LoweringOptionsError(
                f"precision {precision!r} on the cuda execution provider: onnxruntime's CUDA "
                "GroupQueryAttention computes in float16 or bfloat16 only, so a float32 graph "
                "would run its attention on the CPU. Use --precision fp16, int4 or int8 (all "
                "float16 compute on cuda), or --execution-provider cpu"
            )
        return "fp32"

    @property
    def skip_norm(self) -> bool:
        """Fuse residual add + norm into ``SkipSimplifiedLayerNormalization`` (``--target ort``).

        On CUDA: one kernel instead of two per fusion (a decode step is bound by kernel
        launches: the Llama-3.2-1B shape runs 32 fewer per step), inside each layer and at each
        seam of two layers (``docs/fusion_across_modules.md``). Not on the CPU, whose kernel for
        the fused op is slower than ``Add`` + ``RMSNormalization`` on many rows (128 × 512:
        101 vs 49 µs) and no faster on one: a Qwen3.5-shaped int4 folder with all 8 fusions
        decoded at the same speed in onnxruntime-genai (per token 1.024 vs 1.026 of the
        builder's, 7 interleaved rounds) (:mod:`irkit.rules.ort`).
        """
        return self is ExecutionProvider.CUDA

    @property
    def gqa_qk_norm(self) -> bool:
        """Move per-head Q/K RMS norms into ``GroupQueryAttention`` (``--target ort``).

        onnxruntime's CUDA kernel normalizes Q and K itself (``q_norm_weight``,
        ``k_norm_weight``: :mod:`irkit.rules.ort.attention.qk_norm`); its CPU kernel refuses
        them, so a CUDA folder of a model with Q/K norms (Qwen3, LFM2, …) runs on CUDA only.
        """
        return self is ExecutionProvider.CUDA

    @property
    def accuracy_level(self) -> int | None:
        """``MatMulNBits``' ``accuracy_level`` for ``int4``/``int8`` (``None``: irkit.quantize's
        default, 4: activations quantized to int8 inside the CPU kernel, its fast path; CUDA:
        0, unset, as the builder's ``-e cuda`` writes — the CUDA kernels compute in float16,
        and the folder run on a CPU then computes in float too)."""
        return 0 if self is ExecutionProvider.CUDA else None

    @property
    def half_norms(self) -> bool:
        """Compute the float32 RMS-norm islands of a float16 graph in float16
        (:mod:`irkit.rules.ort.half_norm`).

        On CUDA: the float16 ``RMSNormalization`` kernel computes in float32 itself, so the
        ``Cast`` pair around a norm Hugging Face upcasts whole (Qwen3.5's, Gemma's) is two
        kernels for nothing, and it kept the residual add from fusing with the norm
        (:attr:`skip_norm`). Not on the CPU: the kernels read are CUDA's; CPU graphs keep their
        islands.
        """
        return self is ExecutionProvider.CUDA

    def provider_options(self) -> list[dict[str, Any]]:
        """``session_options.provider_options`` of ``genai_config.json`` (the CPU: none)."""
        if self is ExecutionProvider.CUDA:
            return [{"cuda": {}}]
        return []
