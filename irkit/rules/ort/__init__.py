"""The ``"ort"`` target's rule library: onnxruntime ``com.microsoft`` contrib ops (ORT ≥ 1.20).

Each module exports ``rules`` (its docstring states the identity and the preconditions):

=========================================  =========================================================
module                                     identity
=========================================  =========================================================
:mod:`irkit.rules.ort.attention`           opset-23 ``Attention`` / ``RotaryEmbedding`` →
                                           ``GroupQueryAttention`` (``do_rotary``),
                                           ``MultiHeadAttention``, contrib ``RotaryEmbedding``
:mod:`irkit.rules.ort.attention.qk_norm`   per-head Q/K RMS norms → ``GroupQueryAttention``'s
                                           ``q_norm_weight``/``k_norm_weight`` (CUDA/WebGPU
                                           only: opt-in, ``gqa_qk_norm=True``)
:mod:`irkit.rules.ort.packed`              ``x @ W₁ … x @ Wₙ`` → one ``MatMul`` + ``Split``
                                           (Q/K/V: three or more products)
:mod:`irkit.rules.ort.skip_norm`           residual add + RMS / layer norm →
                                           ``SkipSimplifiedLayerNormalization`` /
                                           ``SkipLayerNormalization`` (the sum is an output too)
:mod:`irkit.rules.ort.half_norm`           a float16 graph's float32 RMS-norm island
                                           ``Cast(RMSNorm(Cast(x)))`` → the float16 norm (CUDA)
:mod:`irkit.rules.ort.matmul`              ``MatMul`` with transposed operands → ``FusedMatMul``
:mod:`irkit.rules.ort.gelu`                ``Gelu`` (+ bias) → ``BiasGelu`` / ``FastGelu``
:mod:`irkit.rules.ort.linear_attention`    irkit's state-mixer kernel functions
                                           (``irkit_kernels::gated_delta``) → ``LinearAttention``
:mod:`irkit.rules.ort.causal_conv`         ``Slice(Slice(Conv(cat(state, x), pads=K−1)))`` →
                                           ``CausalConvWithState`` (+ SiLU)
:mod:`irkit.rules.ort.gate`                ``n · Softplus(a + d)`` → ``LinearAttentionGate``;
                                           the ``Sigmoid`` of β beside it → its second output
:mod:`irkit.rules.ort.gated_norm`          RMS norm · SiLU(gate) → ``GatedRMSNorm``
:mod:`irkit.rules.ort.softplus`            torch's thresholded softplus → ``Softplus``
=========================================  =========================================================

:func:`default_rules` is what ``irkit.optimize(model, target="ort")`` applies: the ``"onnx"``
fusions first (``RMSNormalization``, ``LayerNormalization``, ``Gelu`` … that these rules start
from), then the contrib-op rules. The pipeline opens the module calls for the rewrite, so the
rules see across module boundaries (``docs/fusion_across_modules.md``).

The residual-add + norm fusions are opt-in (``skip_norm=True``): onnxruntime 1.32's CPU kernels
for ``SkipLayerNormalization`` / ``SkipSimplifiedLayerNormalization`` are slower than ``Add`` and
the standard ``LayerNormalization`` / ``RMSNormalization`` they replace (float32, one thread,
measured on 197 × 256 and 128 × 512 rows: 308 µs vs 57 µs and 95 µs vs 45 µs; equal at one
row), so the default ``"ort"`` target keeps the standard pair; turn them on for execution
providers whose kernels gain from them (CUDA).

>>> from irkit.rules.ort import default_rules
>>> [n for n in default_rules().names() if n.startswith("Skip")]
[]
>>> [n for n in default_rules(skip_norm=True).names() if n.startswith("Skip")]
['SkipSimplifiedLayerNormalizationOffset', 'SkipSimplifiedLayerNormalization', 'SkipLayerNormalization']
"""

from __future__ import annotations

from irkit import rules as library
from irkit.rewriting import RuleSet
from irkit.rules import glue, unit_axes
from irkit.rules.ort import (
    attention,
    causal_conv,
    gate,
    gated_norm,
    gelu,
    half_norm,
    linear_attention,
    matmul,
    packed,
    skip_norm,
    softplus,
)
from irkit.rules.ort.attention import qk_norm

__all__ = [
    "attention",
    "causal_conv",
    "gate",
    "gated_norm",
    "gelu",
    "half_norm",
    "linear_attention",
    "matmul",
    "packed",
    "skip_norm",
    "softplus",
    "contrib_rules",
    "default_rules",
]

_SKIP_NORM_RULES = skip_norm.rules  # (the functions' ``skip_norm`` flag shadows the module)


def contrib_rules(
    *,
    gqa_dynamic_past: bool = False,
    gqa_masked: bool = False,
    gqa_shared_buffer: bool | int = False,
    skip_norm: bool = False,
    gqa_qk_norm: bool = False,
    half_norms: bool = False,
) -> RuleSet:
    """The ``com.microsoft`` fusions, in priority order (packing before ``FusedMatMul``).

    Args:
        gqa_dynamic_past: Fuse ``GroupQueryAttention`` also for dynamic batch and sequence with
            a past (see :func:`irkit.rules.ort.attention.group_query_attention`).
        gqa_masked: Fuse ``GroupQueryAttention`` also for ``Attention`` with an additive mask
            or without ``is_causal`` (``attention_bias`` / ``causal=0``: onnxruntime > 1.20).
        gqa_shared_buffer: Write ``GroupQueryAttention`` for onnxruntime-genai's shared KV
            buffer, fed from the ``attention_mask`` input (see
            :class:`irkit.rules.ort.attention.SharedBuffer`), its rotary caches for
            ``gqa_shared_buffer`` positions (``True``: 4096); takes precedence over the two
            options above.
        skip_norm: Fuse residual add + norm into ``SkipLayerNormalization`` /
            ``SkipSimplifiedLayerNormalization`` (slower than the standard ops on
            onnxruntime's CPU kernels; see the module docstring).
        gqa_qk_norm: Move per-head Q/K RMS norms into ``GroupQueryAttention``
            (:mod:`irkit.rules.ort.attention.qk_norm`; onnxruntime's CUDA and WebGPU kernels
            only: the CPU's refuses the inputs).
        half_norms: Compute a float16 graph's float32 RMS-norm islands in float16
            (:mod:`irkit.rules.ort.half_norm`: exact where the kernel computes in float32
            itself, as onnxruntime's CUDA one does), before the skip fusion that then takes them.
    """
    shared = None
    if gqa_shared_buffer is True:
        shared = attention.SharedBuffer()
    elif gqa_shared_buffer:
        shared = attention.SharedBuffer(max_positions=gqa_shared_buffer)
    members = [attention.attention_rules(gqa_dynamic_past, gqa_masked, shared), packed.rules]
    if half_norms and skip_norm:
        members.append(half_norm.skip_rules)
    if half_norms:
        members.append(half_norm.rules)
    if skip_norm:
        members.append(_SKIP_NORM_RULES)
    if gqa_qk_norm:
        members.append(qk_norm.rules)
    # the head reshapes the attention fusions leave around the 3-D contrib ops (``to3``/``to4``)
    # meet the model's own: the chains that come back to their input's shape are identities
    # and the rotary tables sliced to their first half by the rotary fusions, Slice(Concat(f, f));
    # the unit axes of the state models' padding-mask glue (irkit.rules.unit_axes)
    shapes = RuleSet(
        "ort_shapes",
        [
            glue.ShapeKeepingReshape(),
            glue.ShapeKeepingExpand(),
            glue.SliceOfConcat(),
            unit_axes.rules,
        ],
    )
    return RuleSet(
        "ort_contrib",
        [
            *members,
            linear_attention.rules,
            causal_conv.rules,
            gated_norm.rules,
            softplus.rules,
            gate.rules,
            gelu.rules,
            matmul.rules,
            shapes,
        ],
    )


def default_rules(
    *,
    gqa_dynamic_past: bool = False,
    gqa_masked: bool = False,
    gqa_shared_buffer: bool | int = False,
    skip_norm: bool = False,
    gqa_qk_norm: bool = False,
    half_norms: bool = False,
) -> RuleSet:
    """The ``"onnx"`` target's rules (cleanup, standard fusions), then :func:`contrib_rules`.

    ``irkit.optimize(m, target="ort", rules=default_rules(gqa_dynamic_past=True,
    gqa_masked=True))`` lets a Hugging Face decoder exported with dynamic batch and sequence and
    its attention mask use ``GroupQueryAttention`` on a recent onnxruntime (prefill with an
    empty past and one-token decoding work at any batch size; see
    :func:`irkit.rules.ort.attention.group_query_attention`). ``skip_norm=True`` adds the
    residual-add + norm fusions (for CUDA; see the module docstring), ``gqa_qk_norm=True`` the
    Q/K norms inside ``GroupQueryAttention`` (CUDA/WebGPU only). ``gqa_shared_buffer=True``
    is what ``irkit export --target ort`` uses (onnxruntime-genai's shared KV buffer).
    ``half_norms=True`` adds :mod:`irkit.rules.ort.half_norm` (for CUDA: float16 norms, gated
    norms and their skip fusions).
    """
    return RuleSet(
        "ort",
        [
            library.default_rules(),
            contrib_rules(
                gqa_dynamic_past=gqa_dynamic_past,
                gqa_masked=gqa_masked,
                gqa_shared_buffer=gqa_shared_buffer,
                skip_norm=skip_norm,
                gqa_qk_norm=gqa_qk_norm,
                half_norms=half_norms,
            ),
        ],
    )
