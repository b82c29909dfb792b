"""Opset-23 ``Attention`` / ``RotaryEmbedding`` → onnxruntime's ``GroupQueryAttention``,
``MultiHeadAttention`` and contrib ``RotaryEmbedding`` (``com.microsoft``).

These start from the standard ops the ``"onnx"`` fusions produce (4-D ``Q``/``K``/``V`` of shape
``(batch, heads, seq, head_size)``, ``past_key``/``past_value`` → ``present_key``/``present_value``
of shape ``(batch, kv_heads, past, head_size)``). ``to3(t) = Reshape(Transpose(t, [0,2,1,3]),
[0,0,-1])`` and ``to4`` its inverse.

Identities:

- ``Attention(Q, K, V, , past_k, past_v, is_causal=1)
  = to4(GroupQueryAttention(to3(Q), to3(K), to3(V), past_k, past_v, seqlens_k, total_len))``
  with ``total_len = past + seq`` (int32 scalar) and ``seqlens_k = total_len - 1`` per batch row
  (no padding: the causal ``Attention`` has no other mask). onnxruntime aligns the causal mask
  bottom-right when there is a past, as ``GroupQueryAttention`` does.
  When ``Q`` and ``K`` are both ``RotaryEmbedding(·, cos, sin, position_ids)`` with the same
  constant caches and position ids, and the head size is a multiple of 16 (onnxruntime's CPU
  kernel), the rotations move into the op (``do_rotary=1``, the caches
  as initializers, ``position_ids`` passed).
- onnxruntime-genai's shared KV buffer (``group_query_attention(shared=SharedBuffer(L))``,
  ``default_rules(gqa_shared_buffer=L)``; the pattern ``Rule`` :func:`shared_buffer_rule`):
  ``Attention(Q, K, V, mask(attention_mask)?, past_k, past_v)
  = to4(GroupQueryAttention(to3(Q), to3(K), to3(V), past_k, past_v,
  int32(ReduceSum(attention_mask, 1) - 1), int32(attention_mask.shape[1]),
  local_window_size=W))`` when the mask only keeps or drops keys and is computed from the
  ``attention_mask`` input (right-padded rows, genai's layout; ``W`` the Hugging Face sliding
  window found in it); with ``Q``/``K`` ``RotaryEmbedding(·, cos, sin)`` of angles that are a
  function of each position id alone, ``do_rotary=1`` with caches evaluated at positions
  ``0 … L-1`` (see :class:`SharedBuffer`).
- opt-in (``group_query_attention(masked=True)``, onnxruntime > 1.20): any such ``Attention``
  with an additive float ``mask`` and/or ``is_causal=0`` → ``GroupQueryAttention(…,
  attention_bias=mask, causal=is_causal)`` — HF decoders hand the attention their causal +
  padding mask, which is exact this way.
- ``Attention(Q, K, V, bias?, past_k?, past_v?, is_causal=0)
  = to4(MultiHeadAttention(to3(Q), to3(K), to3(V), , , bias, past_k, past_v))`` (same number
  of query and key/value heads; ``bias`` additive, broadcast to 4-D).
- ``RotaryEmbedding(x, cos, sin, position_ids) = com.microsoft.RotaryEmbedding(x, position_ids,
  cos, sin)`` (same attributes; the contrib op takes the position ids second).

Preconditions: float16/float32; 4-D ``Q``/``K``/``V`` with known head counts and one head size
(for ``GroupQueryAttention`` a multiple of 8 — onnxruntime's CPU kernel —, as many new keys
as queries, and with a past a static batch of 1 or a static single new token: onnxruntime
refuses a past with several new tokens in a batch, so a model with dynamic batch and sequence
keeps the standard ``Attention`` unless :func:`group_query_attention` is asked for
``dynamic_past``); no ``qk_matmul_output`` used; a past given as both key and value or not at all.
The attributes are whitelisted (:data:`CARRIED`): an attribute the contrib op cannot carry, or a
value of one it carries only in part (``softcap`` for ``MultiHeadAttention``, a
``left_window_size`` / ``right_window_size`` other than -1, a ``softmax_precision`` other than the
input dtype, any attribute of a newer opset), and any input but ``Q``, ``K``, ``V``, the mask and
the past (``nonpad_kv_seqlen``), stop the rewrite. Every refusal says why (see ``explain``).

The rules are patterns with a findings check. A pattern fixes how many outputs it replaces, so
each op has two: ``GroupQueryAttentionKVCache`` / ``MultiHeadAttentionKVCache`` match
``Y, present_key, present_value = Attention(Q, K, V, mask?, past_key?, past_value?)`` and
``GroupQueryAttention`` / ``MultiHeadAttention`` match ``Y = Attention(Q, K, V, mask?)``; the
shared-buffer form is a ``GroupQueryAttentionKVCache`` too.

Modules: :mod:`~irkit.rules.ort.attention.gqa` (``GroupQueryAttention``),
:mod:`~irkit.rules.ort.attention.shared_buffer` (genai's shared buffer),
:mod:`~irkit.rules.ort.attention.alibi` and :mod:`~irkit.rules.ort.attention.alibi_bloom`
(eager ALiBi attention, 4-D and bloom's batch·heads layout, on the shared buffer:
``attention_bias``),
:mod:`~irkit.rules.ort.attention.mha` (``MultiHeadAttention``),
:mod:`~irkit.rules.ort.attention.rotary` (``do_rotary`` folding, rotary caches, contrib
``RotaryEmbedding``), ``_base`` (head layout, attributes, masks, patterns, :class:`SharedBuffer`).
"""

from __future__ import annotations

import collections

import onnx_ir as ir

from irkit.rewriting import RuleSet
from irkit.rules.ort.attention._base import (
    CARRIED,
    MS,
    SharedBuffer,
    readers,
    reads_its_buffer,
    windowed_buffer,
)
from irkit.rules.ort.attention.gqa import group_query_attention
from irkit.rules.ort.attention.mha import MULTI_HEAD_ATTENTION
from irkit.rules.ort.attention.packed_qkv import (
    PACKED_QKV_ATTENTION,
    PACKED_QKV_ATTENTION_SLICES,
    PackedQKVAttentionOfWiderPack,
)
from irkit.rules.ort.attention.rotary import CONTRIB_ROTARY
from irkit.rules.ort.attention.shared_buffer import shared_buffer_rule
from irkit.rules.ort.attention.windowed import WindowedCache, bound_windowed_caches

__all__ = [
    "CARRIED",
    "CONTRIB_ROTARY",
    "MS",
    "MULTI_HEAD_ATTENTION",
    "SharedBuffer",
    "WindowedCache",
    "attention_rules",
    "bound_windowed_caches",
    "group_query_attention",
    "group_query_attentions",
    "rules",
    "runs_on_shared_buffer",
    "shared_buffer_rule",
]


def attention_rules(
    gqa_dynamic_past: bool = False, gqa_masked: bool = False, shared: SharedBuffer | None = None
) -> RuleSet:
    """The attention rules; the options: see :func:`group_query_attention`."""
    return RuleSet(
        "ort_attention",
        [
            group_query_attention(gqa_dynamic_past, gqa_masked, shared),
            PACKED_QKV_ATTENTION,
            PACKED_QKV_ATTENTION_SLICES,
            PackedQKVAttentionOfWiderPack(),
            MULTI_HEAD_ATTENTION,
            CONTRIB_ROTARY,
        ],
    )


rules = attention_rules()
"""The attention rules (``GroupQueryAttention`` first: it also absorbs the rotations)."""


def _run_counts(model: ir.Model) -> collections.Counter[tuple[str, str]]:
    """How many times each op runs in one call of ``model`` (function calls expanded)."""
    memo: dict[ir.OperatorIdentifier, collections.Counter[tuple[str, str]]] = {}

    def count(graph: ir.Graph | ir.Function) -> collections.Counter[tuple[str, str]]:
        total: collections.Counter[tuple[str, str]] = collections.Counter()
        for node in graph:
            key = (node.domain, node.op_type, node.overload)
            function = model.functions.get(key)
            if function is None:
                total[node.domain, node.op_type] += 1
                for attr in node.attributes.values():
                    if attr.type == ir.AttributeType.GRAPH:
                        total.update(count(attr.value))
                continue
            if key not in memo:
                memo[key] = count(function)
            total.update(memo[key])
        return total

    return count(model.graph)


def group_query_attentions(model: ir.Model) -> int:
    """How many ``GroupQueryAttention`` nodes one call of ``model`` runs."""
    return _run_counts(model)[MS, "GroupQueryAttention"]


def runs_on_shared_buffer(model: ir.Model, layers: int) -> bool:
    """Whether ``model`` runs ``layers`` ``GroupQueryAttention`` nodes per call (the
    :class:`SharedBuffer` rule's, one per cached layer), no other attention op (standard
    ``Attention``, ``MultiHeadAttention``), and nothing but a ``GroupQueryAttention``'s past
    inputs reads a ``past_key_values.*`` input (an attention left unfused reads its cache by
    ``Concat``; a ``Softmax`` elsewhere, e.g. a mixture of experts' router, is no attention):
    onnxruntime-genai may then run it with ``past_present_share_buffer: true``. No cached
    layer (a cache of states only): no buffer to share, False."""
    runs = _run_counts(model)
    others = ("", "Attention"), (MS, "MultiHeadAttention"), (MS, "Attention")
    if layers == 0 or runs[MS, "GroupQueryAttention"] != layers or any(runs[o] for o in others):
        return False
    pasts = [v for v in model.graph.inputs if str(v.name).startswith("past_key_values.")]
    for past in pasts:
        found = readers(model, past)
        windowed = any(windowed_buffer(node) for node, _ in found)
        if not all(reads_its_buffer(node, index, windowed) for node, index in found):
            return False
    return True
