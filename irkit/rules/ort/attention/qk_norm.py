"""Per-head Q/K RMS norms → ``GroupQueryAttention``'s own (``q_norm_weight``, ``k_norm_weight``).

Identity (onnxruntime's ``com.microsoft.GroupQueryAttention``, inputs 14 and 15 and the
``qk_norm_epsilon`` attribute: the op normalizes each head of Q and K over its head dim, before
its rotary)::

    GroupQueryAttention(Reshape(RMSNormalization(Reshape(q, [B, S, H, D]), w_q, eps), [B, S, H·D]),
                        Reshape(RMSNormalization(Reshape(k, [B, S, Hk, D]), w_k, eps), …), v, …)
      = GroupQueryAttention(q, k, v, …, q_norm_weight=w_q, k_norm_weight=w_k, qk_norm_epsilon=eps)

The Q/K norms of Qwen3, Qwen3.5's attention layers, LFM2, Gemma 3, OLMoE, … (the per-head RMS
norm before the rotary), as genai's builder writes them for CUDA.

Preconditions: both Q and K are normalized, over the last axis (the head dim ``D`` =
``hidden / num_heads``), with one epsilon and ``stash_type`` float32; the norms' inputs are the
head splits of 3-D ``q``/``k`` whose shape the outer ``Reshape`` gives back; the scales are 1-D of
``D`` values in Q's float type; the op has no Q/K norm yet and takes Q and K apart (not packed).

**CUDA and WebGPU only**: onnxruntime's CPU kernel refuses the two inputs ("q_norm_weight /
k_norm_weight inputs are not supported"), so :func:`irkit.rules.ort.default_rules` applies the
rule only when asked (``gqa_qk_norm=True``: ``irkit export -e cuda``).
"""

from __future__ import annotations

import onnx_ir as ir

from irkit.rewriting import MatchFailure, NodeRule, RewriteBuilder, RuleSet, dims, fail

MS = "com.microsoft"
_Q_NORM, _K_NORM = 14, 15  # the op's inputs (after k_scale, v_scale: 12, 13)


def _head_norm(value: ir.Value | None, heads: int) -> tuple[ir.Value, ir.Value, float] | str:
    """``(x, w, eps)`` when ``value = Reshape(RMSNormalization(Reshape(x, [.., heads, D]), w),
    dims(x))``, else why not."""
    if value is None:
        return "absent"
    outer = value.producer()
    if outer is None or (outer.domain, outer.op_type) != ("", "Reshape"):
        return "not a Reshape"
    norm = outer.inputs[0].producer() if outer.inputs[0] is not None else None
    if norm is None or norm.op_type != "RMSNormalization" or norm.domain != "":
        return "not the Reshape of an RMSNormalization"
    if len(norm.outputs) != 1 and any(o.uses() for o in norm.outputs[1:]):
        return "the norm's other outputs are used"
    attributes = norm.attributes
    axis = attributes["axis"].as_int() if "axis" in attributes else -1
    stash = attributes["stash_type"].as_int() if "stash_type" in attributes else 1
    eps = attributes["epsilon"].as_float() if "epsilon" in attributes else 1e-5
    split = norm.inputs[0]
    inner = split.producer() if split is not None else None
    if inner is None or (inner.domain, inner.op_type) != ("", "Reshape"):
        return "the norm's input is not a Reshape"
    source = inner.inputs[0]
    if source is None:
        return "the head split has no input"
    head_dims, out_dims, source_dims = dims(split), dims(value), dims(source)
    if head_dims is None or source_dims is None or out_dims != source_dims:
        return "the outer Reshape does not give the head split's input shape back"
    if len(head_dims) != len(source_dims) + 1 or axis not in (-1, len(head_dims) - 1):
        return "not a norm over the head dim of a head split"
    if stash != 1:
        return "stash_type is not float32"
    if head_dims[-2] != heads or not isinstance(head_dims[-1], int):
        return f"the head split {list(head_dims)} is not [.., {heads}, D]"
    scale = norm.inputs[1]
    if scale is None or dims(scale) != head_dims[-1:] or scale.dtype != value.dtype:
        return "the scale is not 1-D of the head dim in the activations' type"
    return source, scale, eps


def _fold(op: RewriteBuilder, node: ir.Node) -> tuple[ir.Value, ...] | MatchFailure:
    """GroupQueryAttention(norm(q), norm(k), …) → GroupQueryAttention(q, k, …, w_q, w_k)."""
    inputs = list(node.inputs)
    if len(inputs) > _Q_NORM and inputs[_Q_NORM] is not None:
        return fail("the op already normalizes Q and K", node.outputs[0])
    if len(inputs) < 3 or inputs[1] is None or inputs[2] is None:
        return fail("Q, K and V are packed", node.outputs[0])
    attributes = node.attributes
    heads = attributes["num_heads"].as_int()
    kv_heads = attributes["kv_num_heads"].as_int()
    q, k = _head_norm(inputs[0], heads), _head_norm(inputs[1], kv_heads)
    if isinstance(q, str) or isinstance(k, str):
        why = q if isinstance(q, str) else k
        return fail(f"{'Q' if isinstance(q, str) else 'K'}: {why}", node.outputs[0])
    (q_source, q_scale, q_eps), (k_source, k_scale, k_eps) = q, k
    if q_eps != k_eps:
        return fail(f"Q's epsilon {q_eps} is not K's {k_eps}", node.outputs[0])
    if dims(q_scale) != dims(k_scale):
        return fail("Q's and K's head dims differ", node.outputs[0])
    inputs += [None] * (_K_NORM + 1 - len(inputs))
    inputs[0], inputs[1] = q_source, k_source
    inputs[_Q_NORM], inputs[_K_NORM] = q_scale, k_scale
    kept = {name: a.value for name, a in attributes.items()}
    outputs = op.domain(MS).GroupQueryAttention(
        *inputs, **kept, qk_norm_epsilon=q_eps, _outputs=len(node.outputs)
    )
    return tuple(outputs) if isinstance(outputs, (tuple, list)) else (outputs,)


rules = RuleSet(
    "ort_gqa_qk_norm",
    [NodeRule("GroupQueryAttentionQKNorm", [(MS, "GroupQueryAttention")], _fold)],
)
"""The rule (CUDA/WebGPU only; see the module docstring)."""
