"""irkit's linear-attention kernels → onnxruntime's ``LinearAttention``.

Identity (``com.microsoft::LinearAttention``, onnxruntime ≥ 1.25; heads packed into the last
axis, ``to3(t) = Reshape(t, [0, 0, -1])`` over ``(B, T, H, D)``)::

    irkit_kernels::gated_delta(q, k, v, decay, beta, state)
      = to4(LinearAttention(to3(q), to3(k), to3(v), state, decay, beta, q_num_heads=Hq,
                            kv_num_heads=H, update_rule="gated_delta", scale=1))

    irkit_kernels::gated_linear(q, k, v, decay, state)
      = to4(LinearAttention(to3(q), to3(k), to3(v), state, decay, q_num_heads=H,
                            kv_num_heads=H, update_rule="gated", scale=1))

``irkit_kernels::gated_linear`` (MiniMax's lightning attention,
:mod:`irkit.llm.kernels.lightning`) is ``S = exp(g)·S + k ⊗ v``, ``o = Sᵀq``, one head count
for all operands: the contrib op's ``gated`` rule at scale 1, the same preconditions.

``irkit_kernels::gated_delta`` is the local function ``irkit.lower`` makes of the export kernel's
custom op (:mod:`irkit.llm.kernels._ops`): per token ``S = exp(g)·S``,
``S = S + k ⊗ (β·(v − Sᵀk))``, ``o = Sᵀq`` with the query scaled already — exactly the
contrib op's ``gated_delta`` rule at scale 1, with its grouping: ``q`` and ``k`` have ``Hq``
heads, ``v``, the decay, ``β`` and the state ``H`` (a multiple), each query/key head serving
``H/Hq`` consecutive value heads. The kernel leaves the L2 normalization, the query scale and
the padding hold (``decay = β = 0`` on a pad) to ordinary ops before the call, so the contrib op
needs none of its own options.

Preconditions (each declined with the reason, ``irkit.explain``): every operand float32 (the
op's ``S`` type is the state's, ``T`` the others'); ``q``/``k``/``v`` rank 4 with known head
counts, ``q``'s equal to ``k``'s and dividing ``v``'s, ``q`` and ``k`` the same known head size,
``v`` a known one; ``decay`` and ``beta`` rank 3; ``state`` rank 4.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from irkit.rewriting import RewriteBuilder, Rule, RuleSet, Verdict, dims, fail, op, var

__all__ = ["rules", "KERNELS"]

MS = "com.microsoft"
KERNELS = "irkit_kernels"
"""The domain of irkit's kernel functions (:data:`irkit.llm.kernels._ops.NAMESPACE`)."""

q, k, v, decay, beta, state = (var(n) for n in ("q", "k", "v", "decay", "beta", "state"))
_GATED_DELTA = op.domain(KERNELS).gated_delta(q, k, v, decay, beta, state, _outputs=2)
_GATED_LINEAR = op.domain(KERNELS).gated_linear(q, k, v, decay, state, _outputs=2)


def _check(
    q: ir.Value, k: ir.Value, v: ir.Value, decay: ir.Value, beta: ir.Value, state: ir.Value
) -> Verdict:
    for value in (q, k, v, decay, beta, state):
        if value.dtype != ir.DataType.FLOAT:
            return fail(f"operand dtype {value.dtype}: the rule writes float32 only", value)
    dq, dk, dv = dims(q), dims(k), dims(v)
    if dq is None or dk is None or dv is None or not len(dq) == len(dk) == len(dv) == 4:
        return fail("query, key and value must have known rank 4 (B, T, H, D)", q)
    hq, hk, hv = dq[2], dk[2], dv[2]
    if not (isinstance(hq, int) and isinstance(hv, int) and hq == hk and hq and hv % hq == 0):
        return fail(f"head counts q {hq}, k {hk}, v {hv}: need known, q = k dividing v", q)
    if not isinstance(dq[3], int) or dq[3] != dk[3] or not isinstance(dv[3], int):
        return fail(f"head sizes {dq[3]}, {dk[3]}, {dv[3]} unknown or query ≠ key", k)
    for value, want in ((decay, 3), (beta, 3), (state, 4)):
        if (d := dims(value)) is None or len(d) != want:
            return fail(f"rank {None if d is None else len(d)}, the contrib op needs {want}", value)
    return True


def _check_gated(
    q: ir.Value, k: ir.Value, v: ir.Value, decay: ir.Value, state: ir.Value
) -> Verdict:
    return _check(q, k, v, decay, decay, state)  # (no β: the decay's checks stand for it)


def _gated_linear_attention(
    op: RewriteBuilder, q: ir.Value, k: ir.Value, v: ir.Value, decay: ir.Value, state: ir.Value
) -> tuple[ir.Value, ir.Value]:
    """gated_linear(q, k, v, decay, state) → to4(LinearAttention(…, update_rule="gated"))"""
    return _linear_attention(op, q, k, v, decay, None, state)


def _linear_attention(
    op: RewriteBuilder,
    q: ir.Value,
    k: ir.Value,
    v: ir.Value,
    decay: ir.Value,
    beta: ir.Value | None,
    state: ir.Value,
) -> tuple[ir.Value, ir.Value]:
    """gated_delta(q, k, v, decay, beta, state) → to4(LinearAttention(to3 q, to3 k, to3 v, …));
    without ``beta``, the ``gated`` rule."""
    _, _, q_heads, _ = dims(q) or ()
    _, _, heads, v_dim = dims(v) or ()
    out, final = op.domain(MS).LinearAttention(
        *(_to3(op, x) for x in (q, k, v)),
        state,
        decay,
        *(() if beta is None else (beta,)),
        q_num_heads=q_heads,
        kv_num_heads=heads,
        update_rule="gated" if beta is None else "gated_delta",
        scale=1.0,
        _outputs=2,
    )
    out.type, out.shape = v.type, _packed(v)  # (checkers know no contrib op's type inference)
    final.type, final.shape = state.type, state.shape
    four: ir.Value = op.Reshape(out, op.const(np.array([0, 0, heads, v_dim], dtype=np.int64)))
    four.type, four.shape = v.type, v.shape
    return four, final


def _packed(t: ir.Value) -> ir.Shape | None:
    """``(B, T, H, D)``'s shape ``(B, T, H·D)`` (heads and sizes known)."""
    if t.shape is None or len(t.shape) != 4:
        return None
    b, s, h, d = t.shape
    return ir.Shape([b, s, h * d]) if isinstance(h, int) and isinstance(d, int) else None


def _to3(op: RewriteBuilder, t: ir.Value) -> ir.Value:
    """``(B, T, H, D)`` → ``(B, T, H·D)``; the result carries its shape, so that the cleanup rules
    see a ``Reshape`` chain back to a value of that shape as the identity it is."""
    out: ir.Value = op.Reshape(t, op.const(np.array([0, 0, -1], dtype=np.int64)))
    out.type, out.shape = t.type, _packed(t)
    return out


rules = RuleSet(
    "ort_linear_attention",
    [
        Rule(  # gated_delta(q, k, v, g, β, S) = LinearAttention(q, k, v, S, g, β) (3-D packed)
            "LinearAttention",
            (_GATED_DELTA[0], _GATED_DELTA[1]),
            check=_check,
            rewrite=_linear_attention,
        ),
        Rule(  # gated_linear(q, k, v, g, S) = LinearAttention(q, k, v, S, g, "gated")
            "GatedLinearAttention",
            (_GATED_LINEAR[0], _GATED_LINEAR[1]),
            check=_check_gated,
            rewrite=_gated_linear_attention,
        ),
    ],
)
"""The linear-attention rules."""
