"""A causal depthwise convolution over a state and new inputs → ``CausalConvWithState``.

transformers' short convolutions (LFM2's ``ShortConv``, the gated delta net's ``conv1d`` of
Qwen3-Next / Qwen3.5, Mamba's) run on ``cat(state, x)`` — the state the last inputs of the step
before — as ``conv1d(..., padding=K-1)[..., :n][..., -S:]`` (``n`` the length of the
concatenation, ``S`` that of ``x``), sometimes with a SiLU between the two slices. onnxruntime's
contrib ``CausalConvWithState(x, W, B, state, activation=)`` computes exactly those ``S``
outputs, ``y[i] = act(B + Σ_k W[k] · cat(state, x)[i + k])``, in one kernel (what the
onnxruntime-genai model builder emits) instead of ``Conv`` over twice the padding and two
``Slice``\\ s. Its second output (the new state, the last ``K − 1`` columns) is not used: the
graph keeps computing its own, which may differ (irkit's export gathers each row's state at its
last real token).

Identity, with ``c = Concat(z zeros, state, x)`` along the last axis (``z`` leading zero columns
from a ``Pad`` of the state, or none), ``K`` the kernel width, ``state`` of length ``K − 1``::

    Slice(act(Slice(Conv(c, W, B, pads=[K−1, K−1], group=C), 0, c₁ + v)), −v, ∞)
        = CausalConvWithState(x, W, B, state, activation=act)

where ``act`` is SiLU (``t · Sigmoid(t)``) or absent, ``c₁ = K − 1 + z`` (the first output
whose window starts at ``c``'s first non-padding column is ``K − 1 + z``, so output ``c₁ + i``
reads ``cat(state, x)[i … i + K − 1]``) and ``v = S``: the result's length is ``S`` (its shape
and ``x``'s name the same dim) and ``c₁ + S ≤ len(Conv) = n + K − 1``, so neither slice clamps.

Preconditions (declined with the reason, ``irkit.explain``): a 1-D depthwise ``Conv``
(``group`` = channels, weight ``(C, 1, K)`` static, strides and dilations 1, no ``auto_pad``),
both slices on the last axis with step 1, ``c₁`` and the slice bounds as above.
"""

from __future__ import annotations

from typing import Any

import onnx_ir as ir

from irkit.rewriting import (
    Const,
    RewriteBuilder,
    Rule,
    RuleSet,
    Verdict,
    attr,
    const_ints,
    dims,
    either,
    fail,
    matches,
    op,
    optional,
    scalar,
    static_shape,
    var,
)

__all__ = ["rules"]

cat, w, bias = var("cat"), var("w"), var("bias")
_CONV = op.Conv(
    cat,
    w,
    optional(bias),
    pads=attr("pads"),
    group=attr("group"),
    strides=attr("strides"),
    dilations=attr("dilations"),
    auto_pad=attr("auto_pad"),
    kernel_shape=attr("kernel_shape"),
)


_FIRST = op.Slice(_CONV, Const(0), var("end1"), var("axes1"), optional(var("steps1")))
_KEPT = either(op.Mul(_FIRST, op.Sigmoid(_FIRST)), _FIRST, tag="silu")
_PATTERN = op.Slice(_KEPT, var("start2"), var("end2"), var("axes2"), optional(var("steps2")))


def _bound(inner: Any) -> Any:
    """A scalar slice bound, bare or reshaped / unsqueezed to one element."""
    return either(op.Reshape(inner, var("r1")), op.Unsqueeze(inner, var("r2")), inner)


#: The bounds (read with ``matches``: the length ``v`` and ``c₁ + v`` have other uses).
_END1 = _bound(op.Add(var("c1"), var("v")))
_START2 = _bound(op.Neg(var("v")))

_STATE = either(
    op.Concat(
        op.Pad(var("state"), var("pad_pads"), optional(var("pad_value")), mode=attr("pad_mode")),
        var("x"),
        axis=attr("cat_axis"),
    ),
    op.Concat(var("state"), var("x"), axis=attr("cat_axis")),
    tag="padded",
)

_FAR = 1 << 31  # an end at or past this reads to the end of any axis


def _last_axis(axes: ir.Value, steps: ir.Value | None, rank: int) -> bool:
    return const_ints(axes) in ([rank - 1], [-1]) and (steps is None or const_ints(steps) == [1])


def _check(
    cat: ir.Value,
    w: ir.Value,
    end1: ir.Value,
    start2: ir.Value,
    axes1: ir.Value,
    steps1: ir.Value | None,
    end2: ir.Value,
    axes2: ir.Value,
    steps2: ir.Value | None,
    pads: list[int] | None,
    group: int | None,
    strides: list[int] | None,
    dilations: list[int] | None,
    auto_pad: str | None,
    kernel_shape: list[int] | None,
    match: Any,
) -> Verdict:
    weight = static_shape(w)
    if weight is None or len(weight) != 3 or weight[1] != 1:
        return fail("the weight is not a static (C, 1, K) depthwise kernel", w)
    channels, _, width = weight
    if group != channels:
        return fail(f"group {group} is not the {channels} channels (not depthwise)", w)
    if (
        auto_pad not in (None, "NOTSET")
        or list(strides or [1]) != [1]
        or list(dilations or [1]) != [1]
    ):
        return fail("strides, dilations or auto_pad other than 1, 1, NOTSET", cat)
    if (kernel_shape is not None and list(kernel_shape) != [width]) or list(pads or []) != [
        width - 1,
        width - 1,
    ]:
        return fail(f"pads {list(pads or [])} are not K − 1 = {width - 1} on both sides", cat)
    if not _last_axis(axes1, steps1, 3) or not _last_axis(axes2, steps2, 3):
        return fail("the slices are not on the last axis with step 1", axes1)
    far = const_ints(end2)
    if far is None or len(far) != 1 or far[0] < _FAR:
        return fail("the last slice does not read to the end", end2)
    first = matches(_END1, end1, match.opset)
    if not isinstance(first, dict):
        return fail("the first slice does not end at c₁ + v", end1)
    if not isinstance(matches(_START2, start2, match.opset, v=first["v"]), dict) and not (
        _negated_vector_of(start2, first["v"])
    ):
        return fail("the last slice does not start at −v (v of the first slice's end)", start2)
    c1 = first["c1"]
    parts = matches(_STATE, cat, match.opset)
    if not isinstance(parts, dict):
        return fail("the conv input is not Concat(state, x) or Concat(Pad(state), x)", cat)
    if parts["cat_axis"] not in (2, -1):
        return fail("the concatenation is not on the last axis", cat)
    state, x = parts["state"], parts["x"]
    zeros = 0
    if parts["padded"] == 0:
        value = parts["pad_value"]
        if (
            parts["pad_mode"] not in (None, "constant")
            or const_ints(parts["pad_pads"]) != [0, 0, 1, 0, 0, 0]
            or (value is not None and scalar(value) != 0)
        ):
            return fail("the state's Pad is not one leading zero column", state)
        zeros = 1
    if dims(state) is None or dims(state)[-1] != width - 1:  # type: ignore[index]
        return fail(f"the state is not {width - 1} columns", state)
    if const_ints(c1) != [width - 1 + zeros]:
        return fail(f"the kept outputs do not start at K − 1 + {zeros}", c1)
    kept, new = dims(match.outputs[0]), dims(x)
    if kept is None or new is None or kept[-1] is None or kept[-1] != new[-1]:
        return fail("the result's length is not proved to be x's", x)
    return {"x": x, "state": state}


def _negated_vector_of(start: ir.Value, v: ir.Value) -> bool:
    """``start = Neg(u)`` with ``v = Squeeze(u)``: −v as the one-element vector the slice takes
    (what :class:`irkit.rules.unit_axes.ScalarRoundTrip` leaves of ``Reshape(Neg(v), [1])``)."""
    neg, squeeze = start.producer(), v.producer()
    return (
        neg is not None
        and squeeze is not None
        and (neg.domain, neg.op_type, squeeze.domain, squeeze.op_type) == ("", "Neg", "", "Squeeze")
        and neg.inputs[0] is not None
        and neg.inputs[0] is squeeze.inputs[0]
    )


def _causal_conv(
    op: RewriteBuilder,
    x: ir.Value,
    w: ir.Value,
    bias: ir.Value | None,
    state: ir.Value,
    silu: int | None,
) -> ir.Value:
    """CausalConvWithState(x, W, B, state, activation)"""
    y, _ = op.domain("com.microsoft").CausalConvWithState(
        x, w, bias, state, activation="silu" if silu == 0 else "none", _outputs=2
    )
    return y


#: The last ``K − 1`` columns of the convolution's input (the new state, as irkit's export keeps
#: it where every row's last new token is real: ``irkit.llm._states._settle_held_states``).
_LAST = op.Slice(_STATE, var("start"), var("end"), var("axes"), optional(var("steps")))


def _check_last(
    state: ir.Value,
    x: ir.Value,
    start: ir.Value,
    end: ir.Value,
    axes: ir.Value,
    steps: ir.Value | None,
    cat_axis: int | None,
    padded: int | None,
    pad_pads: ir.Value | None,
) -> Verdict:
    if cat_axis not in (2, -1):
        return fail("the concatenation is not on the last axis", x)
    width = dims(state)[-1] if dims(state) is not None else None  # type: ignore[index]
    if not isinstance(width, int) or const_ints(start) != [-width]:
        return fail("the slice does not start at −(K − 1), the state's length", start)
    far = const_ints(end)
    if far is None or len(far) != 1 or far[0] < _FAR or not _last_axis(axes, steps, 3):
        return fail("the slice does not read the last axis to its end", end)
    if padded == 0 and const_ints(pad_pads) != [0, 0, 1, 0, 0, 0]:
        return fail("the state's Pad is not one leading column", state)
    for use in x.uses():
        node = use.node
        if (
            node.op_type == "CausalConvWithState"
            and node.domain == "com.microsoft"
            and len(node.inputs) > 3
            and node.inputs[0] is x
            and node.inputs[3] is state
            and len(node.outputs) > 1
        ):
            return {"present": node.outputs[1]}
    return fail("no CausalConvWithState of this state and x (yet)", x)


rules = RuleSet(
    "ort_causal_conv",
    [
        Rule("CausalConvWithState", _PATTERN, check=_check, rewrite=_causal_conv),
        Rule(
            "CausalConvWithStatePresent", _LAST, check=_check_last, rewrite=lambda present: present
        ),
    ],
)
"""The causal convolution rule, and its new state read where the graph keeps the last
``K − 1`` columns of the convolution's input: ``Slice(Concat(state, x), −(K − 1), ∞) =
CausalConvWithState(x, W, B, state)[1]`` (the op's second output: the last ``K − 1`` columns
of ``cat(state, x)``)."""
