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
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import onnx_ir as ir

from irkit._irutil import node_attributes
from irkit.rewriting import (
    Match,
    MatchFailure,
    RewriteBuilder,
    Rule,
    RuleSet,
    Verdict,
    attr,
    const_value,
    dims,
    fail,
    optional,
    var,
)
from irkit.rewriting import op as pat
from irkit.rules._ort_types import ORT_FLOAT_TYPES

MS = "com.microsoft"


def _input(node: ir.Node, i: int) -> ir.Value | None:
    return node.inputs[i] if i < len(node.inputs) else None


def _to3(op: RewriteBuilder, t: ir.Value) -> ir.Value:
    """``(B, N, S, H)`` → ``(B, S, N·H)``."""
    shape = op.const(np.array([0, 0, -1], dtype=np.int64))
    return op.Reshape(op.Transpose(t, perm=[0, 2, 1, 3]), shape)


def _to4(op: RewriteBuilder, t: ir.Value, heads: int) -> ir.Value:
    """``(B, S, N·H)`` → ``(B, N, S, H)``."""
    shape = op.const(np.array([0, 0, heads, -1], dtype=np.int64))
    return op.Transpose(op.Reshape(t, shape), perm=[0, 2, 1, 3])


class _Heads:
    """The head layout of an ``Attention`` node with 4-D inputs, or why it has none."""

    def __init__(self, q_heads: int, kv_heads: int, head_size: int):
        self.q_heads = q_heads
        self.kv_heads = kv_heads
        self.head_size = head_size


def _common(node: ir.Node) -> _Heads | MatchFailure:
    """Checks shared by both attention rules."""
    q, k, v = (_input(node, i) for i in range(3))
    if q is None or k is None or v is None:
        return fail("Q, K or V absent", None, node)
    if q.dtype not in ORT_FLOAT_TYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        return fail(f"dtype {q.dtype}: the contrib ops run float16/float32", q)
    dq, dk, dv = dims(q), dims(k), dims(v)
    if dq is None or dk is None or dv is None or not len(dq) == len(dk) == len(dv) == 4:
        return fail("Q, K, V must be 4-D (batch, heads, seq, head_size) with known rank", q)
    heads = (dq[1], dk[1], dv[1])
    sizes = (dq[3], dk[3], dv[3])
    if not all(isinstance(d, int) for d in (*heads, *sizes)):
        return fail(f"head counts {heads} / head sizes {sizes} not static", q)
    if len(set(sizes)) != 1:
        return fail(f"head sizes differ: {sizes}", v)
    if dk[1] != dv[1] or dq[1] % dk[1]:  # type: ignore[operator]
        return fail(f"{dq[1]} query heads do not group over {dk[1]} / {dv[1]} key/value heads", k)
    if len(node.outputs) > 3 and (node.outputs[3].uses() or node.outputs[3].is_graph_output()):
        return fail("qk_matmul_output is used", node.outputs[3])
    past_k, past_v = _input(node, 4), _input(node, 5)
    if (past_k is None) != (past_v is None):
        return fail("only one of past_key / past_value given", past_k or past_v)
    extra = [i for i, v in enumerate(node.inputs) if i >= len(_INPUTS) and v is not None]
    if len(node.inputs) > 6 and node.inputs[6] is not None:
        return fail(
            "nonpad_kv_seqlen (opset 24) is not supported: the contrib ops take no per-batch "
            "key/value lengths of this meaning",
            node.inputs[6],
        )
    if extra or len(node.outputs) > 4:
        return fail("inputs or outputs of an Attention newer than opset 25", None, node)
    refused = _uncarried_attribute(node, q.dtype)
    if refused is not None:
        return refused
    return _Heads(int(dq[1]), int(dk[1]), int(dq[3]))  # type: ignore[arg-type]


_INPUTS = ("Q", "K", "V", "attn_mask", "past_key", "past_value", "nonpad_kv_seqlen")


def _any(value: object, dtype: ir.DataType | None) -> str | None:
    return None


def _window(value: object, dtype: ir.DataType | None) -> str | None:
    if value == -1:
        return None
    return "a sliding window (opset 25): the contrib ops' window differs in meaning; kept"


def _precision(value: object, dtype: ir.DataType | None) -> str | None:
    if dtype is not None and value == dtype.value:
        return None
    return f"softmax in another precision than the input's {dtype} (data type {value})"


_ValueCheck = Callable[[object, ir.DataType | None], str | None]

CARRIED: Mapping[str, _ValueCheck] = {
    "scale": _any,  # passed on
    "is_causal": _any,  # each rule decides (GroupQueryAttention: causal; MHA: not causal)
    "softcap": _any,  # GroupQueryAttention passes it on; MultiHeadAttention refuses a non-zero one
    "q_num_heads": _any,  # (the head counts of 3-D inputs; the rules take 4-D ones)
    "kv_num_heads": _any,
    "qk_matmul_output_mode": _any,  # (what the qk_matmul_output holds: refused when it is used)
    "softmax_precision": _precision,
    "left_window_size": _window,
    "right_window_size": _window,
}
"""``Attention``'s attributes (opsets 23 – 25) the contrib ops carry, each with a check of its
value (``None``: carried; otherwise why not). Any other attribute stops the rewrite."""


def _uncarried_attribute(node: ir.Node, dtype: ir.DataType | None) -> MatchFailure | None:
    """Why an attribute of ``node`` cannot be carried, or ``None``."""
    for name, attribute in node.attributes.items():
        check = CARRIED.get(name)
        if check is None:
            return fail(
                f"attribute {name}={attribute.value!r}: not one the contrib ops are known to "
                f"carry ({', '.join(CARRIED)})",
                None,
                node,
            )
        why = check(attribute.value, dtype)
        if why is not None:
            return fail(f"{name}={attribute.value!r}: {why}", None, node)
    return None


_ELEMENTWISE = frozenset({"Where", "Add", "Sub", "Mul", "Div", "Max", "Min", "Neg", "Cast"})


def _mask_type(v: ir.Value, depth: int = 4) -> tuple[ir.DataType | None, int | None]:
    """Dtype and rank of a mask, also when it is an untyped intermediate (torchlib's ``Where``):
    read through elementwise producers (broadcast: the largest input rank)."""
    d = dims(v)
    if v.dtype is None and (const := const_value(v)) is not None:  # (an untyped Constant)
        return ir.DataType.from_numpy(const.dtype), const.ndim
    if v.dtype is not None and d is not None:
        return v.dtype, len(d)
    p = v.producer()
    if depth == 0 or p is None or p.domain != "" or p.op_type not in _ELEMENTWISE:
        return v.dtype, None if d is None else len(d)
    found = [_mask_type(i, depth - 1) for i in p.inputs if i is not None]
    ranks = [r for _, r in found]
    rank = None if d is None and None in ranks else (len(d) if d is not None else max(ranks))  # type: ignore[type-var]
    if v.dtype is not None:
        return v.dtype, rank
    if p.op_type == "Cast":
        return ir.DataType(p.attributes["to"].value), rank
    values = found[1:] if p.op_type == "Where" else found
    dtypes = {t for t, _ in values}
    return (dtypes.pop() if len(dtypes) == 1 else None), rank


def _mask_rank(mask: ir.Value, q: ir.Value) -> int | MatchFailure:
    """The rank of an additive float mask the contrib ops take as ``attention_bias``, or why
    they cannot."""
    dtype, rank = _mask_type(mask)
    if dtype != q.dtype:
        return fail(f"mask dtype {dtype}: only an additive mask of the input dtype", mask)
    if rank is None or rank > 4:
        return fail(f"mask rank {rank} unknown or > 4", mask)
    return rank


def _bias4(op: RewriteBuilder, mask: ir.Value | None, rank: int | None) -> ir.Value | None:
    """The mask (of ``rank``, see :func:`_mask_rank`) as the contrib ops' 4-D ``attention_bias``."""
    if mask is None or rank is None or rank == 4:
        return mask
    return op.Unsqueeze(mask, op.const(np.arange(4 - rank, dtype=np.int64)))


def _rotary(value: ir.Value) -> ir.Node | None:
    p = value.producer()
    if p is None or p.op_type != "RotaryEmbedding" or p.domain not in ("", MS):
        return None
    return p


def _rotary_parts(
    node: ir.Node,
) -> tuple[ir.Value, ir.Value | None, ir.Value, ir.Value, dict[str, Any]] | None:
    """``(x, position_ids, cos, sin, attributes)`` of an ONNX or contrib RotaryEmbedding."""
    if node.domain == MS:
        x, pos, cos, sin = (_input(node, i) for i in range(4))
    else:
        x, cos, sin, pos = (_input(node, i) for i in range(4))
    if x is None or cos is None or sin is None:
        return None
    return x, pos, cos, sin, node_attributes(node)


_Folded = tuple[ir.Value, ir.Value, ir.Value, ir.Value, ir.Value, int]


def _fold_rotary(q: ir.Value, k: ir.Value, head_size: int) -> _Folded | None:
    """The inputs of ``do_rotary``: un-rotated Q, K, cos, sin, position ids, interleaved."""
    rq, rk = _rotary(q), _rotary(k)
    if head_size % 16:  # (onnxruntime's CPU kernel rotates only such heads)
        return None
    if rq is None or rk is None or len(q.uses()) != 1 or len(k.uses()) != 1:
        return None
    pq, pk = _rotary_parts(rq), _rotary_parts(rk)
    if pq is None or pk is None:
        return None
    if pq[1:4] != pk[1:4] or pq[1] is None:
        return None  # different caches / positions, or per-token cos/sin
    aq, ak = pq[4], pk[4]
    interleaved = int(aq.get("interleaved", 0))
    if interleaved != int(ak.get("interleaved", 0)) or float(aq.get("scale", 1.0)) != 1.0:
        return None
    if aq.get("rotary_embedding_dim", 0) not in (0, head_size):
        return None
    cos, sin = pq[2], pq[3]
    cd = dims(cos)
    if const_value(cos) is None or const_value(sin) is None or cd is None or len(cd) != 2:
        return None
    if cd[1] != head_size // 2:
        return None
    return pq[0], pk[0], cos, sin, pq[1], interleaved  # (pq[1] checked above)


def _graph_input(node: ir.Node, name: str) -> ir.Value | None:
    """The input ``name`` of the graph ``node`` is in, or ``None``."""
    graph = node.graph
    if graph is None:
        return None
    return next((v for v in graph.inputs if v.name == name), None)


def _reaches(value: ir.Value, target: ir.Value, limit: int = 400) -> bool:
    """Whether ``target`` is ``value`` or among the values it is computed from."""
    seen: set[int] = set()
    stack = [value]
    while stack and len(seen) < limit:
        v = stack.pop()
        if v is target:
            return True
        if id(v) in seen:
            continue
        seen.add(id(v))
        p = v.producer()
        if p is not None:
            stack.extend(i for i in p.inputs if i is not None)
    return False


_SHAPE_ONLY = frozenset({"Expand", "Unsqueeze", "Reshape", "Identity", "Squeeze"})


def _keep_mask(mask: ir.Value) -> str | None:
    """``None`` when ``mask`` only keeps or drops keys (a boolean mask, or
    ``Where(keep, 0, ≤ -1e4)``, through shape-only ops); otherwise why not: an additive bias
    (ALiBi, relative positions) that ``GroupQueryAttention`` on the shared buffer would lose."""
    v = mask
    while (p := v.producer()) is not None and p.domain == "" and p.op_type in _SHAPE_ONLY:
        if p.inputs[0] is None:
            break
        v = p.inputs[0]
    if v.dtype == ir.DataType.BOOL:
        return None
    p = v.producer()
    if p is not None and p.op_type == "Where" and p.domain == "" and len(p.inputs) == 3:
        keep, drop = const_value(p.inputs[1]), const_value(p.inputs[2])
        scalars = keep is not None and drop is not None and keep.size == drop.size == 1
        if scalars and float(keep.reshape(())) == 0.0 and float(drop.reshape(())) <= -1e4:  # type: ignore[union-attr]
            return None
    return (
        "the mask adds more than 0 / -inf (ALiBi or another bias): GroupQueryAttention on "
        "the shared buffer would drop it"
    )


def _sliding_window(mask: ir.Value, limit: int = 400) -> int | None | MatchFailure:
    """The window ``W`` of a Hugging Face sliding-window mask (``kv_idx > q_idx - W``: the query
    sees itself and the ``W - 1`` keys before it), ``None`` for a mask without one."""
    found: set[int] = set()
    seen: set[int] = set()
    stack = [mask]
    while stack and len(seen) < limit:
        v = stack.pop()
        if id(v) in seen:
            continue
        seen.add(id(v))
        p = v.producer()
        if p is None:
            continue
        if p.op_type == "Greater" and p.domain == "" and len(p.inputs) == 2:
            sub = p.inputs[1].producer() if p.inputs[1] is not None else None
            if sub is not None and sub.op_type == "Sub" and sub.inputs[1] is not None:
                w = const_value(sub.inputs[1])
                if w is not None and w.size == 1:
                    found.add(int(w.reshape(())))
        stack.extend(i for i in p.inputs if i is not None)
    if stack:
        return fail(f"the mask's computation has over {limit} values: its window is unknown", mask)
    if len(found) > 1:
        return fail(f"the mask has several windows {sorted(found)}", mask)
    return found.pop() if found else None


def _cone(outputs: list[ir.Value], source: ir.Value, limit: int = 200) -> list[ir.Node] | str:
    """The nodes computing ``outputs`` from ``source`` and constants (topological order), or
    why there are none."""
    order: list[ir.Node] = []
    seen: set[int] = set()

    def visit(v: ir.Value) -> str | None:
        p = v.producer()
        if p is None:
            if v is source or v.const_value is not None:
                return None
            return f"{v.name!r} is neither {source.name!r} nor a constant"
        if id(p) in seen:
            return None
        seen.add(id(p))
        if len(seen) > limit or p.domain not in ("", "ai.onnx"):
            return f"{p.op_type} ({p.domain or 'ai.onnx'}) in the cos/sin computation"
        for i in p.inputs:
            why = None if i is None else visit(i)
            if why is not None:
                return why
        order.append(p)
        return None

    for out in outputs:
        why = visit(out)
        if why is not None:
            return why
    return order


def _evaluate(
    nodes: list[ir.Node], source: ir.Value, outputs: list[ir.Value], feed: np.ndarray
) -> list[np.ndarray]:
    """Run ``nodes`` (``source`` fed with ``feed``) in onnx's reference evaluator."""
    import onnx
    import onnx.reference

    graph = nodes[0].graph
    consts = {
        id(i): i
        for n in nodes
        for i in n.inputs
        if i is not None and i.producer() is None and i is not source
    }
    initializers = []
    for v in consts.values():
        tensor = v.const_value
        if tensor is None:  # (checked by _cone)
            continue
        proto = ir.serde.serialize_tensor(tensor)
        proto.name = v.name or ""
        initializers.append(proto)
    model = onnx.helper.make_model(
        onnx.helper.make_graph(
            [ir.serde.serialize_node(n) for n in nodes],
            "rotary_caches",
            [onnx.helper.make_tensor_value_info(source.name or "", onnx.TensorProto.INT64, None)],
            [onnx.helper.make_tensor_value_info(o.name or "", 0, None) for o in outputs],
            initializers,
        ),
        opset_imports=[
            onnx.helper.make_opsetid(d, v)
            for d, v in (graph.opset_imports.items() if graph is not None else [("", 23)])
        ],
    )
    results = onnx.reference.ReferenceEvaluator(model).run(None, {source.name or "": feed})
    return [np.asarray(r) for r in results]


def _rotary_caches(
    node: ir.Node, q: ir.Value, k: ir.Value, head_size: int, shared: SharedBuffer
) -> tuple[ir.Value, ir.Value, np.ndarray, np.ndarray, int] | MatchFailure:
    """``(q, k, cos_cache, sin_cache, interleaved)`` when ``q`` and ``k`` are rotated by the
    same per-token ``RotaryEmbedding(x, cos, sin)`` whose ``cos``/``sin`` are a function of each
    token's position id alone: the caches are that function at positions
    ``0 … max_positions - 1`` (``GroupQueryAttention`` reads the positions from ``seqlens_k``).
    A rotation that depends on more (dynamic NTK, longrope's factor switch past
    ``original_max_position_embeddings`` within ``max_positions``) stays unfused."""
    rq, rk = _rotary(q), _rotary(k)
    if rq is None or rk is None or rq.domain != "" or rk.domain != "":
        return fail("Q and K are not both rotated by a RotaryEmbedding", q)
    if head_size % 16:
        return fail(f"head size {head_size}: onnxruntime's CPU rotary needs a multiple of 16", q)
    if len(q.uses()) != 1 or len(k.uses()) != 1:
        return fail("the rotated Q or K has other uses", q)
    pq, pk = _rotary_parts(rq), _rotary_parts(rk)
    if pq is None or pk is None or pq[1] is not None or pk[1] is not None:
        return fail("Q or K rotated with position ids (constant caches)", q)
    attributes = pq[4]
    if attributes != pk[4] or set(attributes) - {"interleaved"}:
        return fail(f"rotary attributes {attributes} / {pk[4]}", q)
    positions = _graph_input(node, shared.position_input)
    if positions is None:
        return fail(f"the graph has no input {shared.position_input!r}", q)
    cos, sin = pq[2], pq[3]
    angles = [cos, sin, pk[2], pk[3]]  # (Q's and K's: often two computations of one value)
    nodes = _cone(angles, positions)
    if isinstance(nodes, str):
        return fail(f"cos/sin not a function of {positions.name!r}: {nodes}", cos)
    if not nodes:
        return fail("cos/sin are constants", cos)
    total = shared.max_positions
    try:
        full = _evaluate(nodes, positions, angles, np.arange(total, dtype=np.int64)[None])
        probes = [
            _evaluate(nodes, positions, angles, np.arange(n, dtype=np.int64)[None])
            for n in sorted({1, min(total, 4096) // 2, min(total, 4096) // 16} - {0})
        ]
    except Exception as exc:  # (the evaluator's own errors: kept unfused, said why)
        return fail(f"cos/sin could not be evaluated: {type(exc).__name__}: {exc}", cos)
    if any(a.shape != (1, total, head_size // 2) for a in full):
        return fail(f"cos/sin of shape {full[0].shape}, not (1, {total}, {head_size // 2})", cos)
    if not (np.array_equal(full[0], full[2]) and np.array_equal(full[1], full[3])):
        return fail("Q and K rotated by different angles", k)
    for probe in probes:
        n = probe[0].shape[1]
        if not all(np.array_equal(p[0], f[0, :n]) for p, f in zip(probe, full, strict=True)):
            return fail(
                "cos/sin depend on more than each token's position (dynamic NTK, or longrope "
                f"switching factors within {total} positions): the rotation stays unfused",
                cos,
            )
    dtype = q.dtype.numpy() if q.dtype is not None else np.float32
    interleaved = int(attributes.get("interleaved", 0))
    return pq[0], pk[0], full[0][0].astype(dtype), full[1][0].astype(dtype), interleaved


class SharedBuffer:
    """How ``GroupQueryAttention`` runs on onnxruntime-genai's shared KV buffer.

    Under ``past_present_share_buffer`` the past and present are one static buffer of the
    capacity ``search.max_length``: the past's length is not the number of cached tokens. The
    rule then feeds the op from the graph input ``mask_input`` (``(batch, total)`` of 0/1, each
    row right-padded, as genai writes it), the way genai's own builder does:
    ``seqlens_k = ReduceSum(mask, 1) - 1`` and ``total_sequence_length = mask.shape[1]``
    (int32), and drops the ``Attention``'s additive mask, which must be computed from that
    input (Hugging Face's causal + padding mask: ``GroupQueryAttention`` is causal and skips
    the keys past each row's length).

    Rotary embeddings move into the op (``do_rotary=1``) with ``cos``/``sin`` caches of
    ``max_positions`` rows when both Q and K are rotated by the same ``RotaryEmbedding`` whose
    angles are a function of each token's position id alone (default, linear, llama3, yarn; a
    longrope whose factors do not switch within ``max_positions``): the rule evaluates that
    function at positions ``0 … max_positions - 1``.

    Attributes:
        max_positions: Rows of the rotary caches (genai's ``search.max_length``).
        mask_input: The name of the 2-D 0/1 attention-mask graph input.
        position_input: The name of the position-ids graph input.
    """

    def __init__(
        self,
        max_positions: int = 4096,
        mask_input: str = "attention_mask",
        position_input: str = "position_ids",
    ):
        self.max_positions = max_positions
        self.mask_input = mask_input
        self.position_input = position_input


_q, _k, _v, _mask = var("q"), var("k"), var("v"), var("mask")
_past_key, _past_value = var("past_key"), var("past_value")
_nonpad = var("nonpad_kv_seqlen")

_ATTENTION = pat.Attention(
    _q,
    _k,
    _v,
    optional(_mask),
    None,
    None,
    optional(_nonpad),
    scale=attr("scale"),
    softcap=attr("softcap"),
    is_causal=attr("is_causal"),
)
"""``Y = Attention(Q, K, V, mask?)``: no cache (``nonpad_kv_seqlen`` matched to be refused)."""

_ATTENTION_KV_CACHE = pat.Attention(
    _q,
    _k,
    _v,
    optional(_mask),
    optional(_past_key),
    optional(_past_value),
    optional(_nonpad),
    scale=attr("scale"),
    softcap=attr("softcap"),
    is_causal=attr("is_causal"),
    _outputs=3,
)
"""``Y, present_key, present_value = Attention(Q, K, V, mask?, past_key?, past_value?)``: the op
writes the cache (the past may be absent: the presents are then ``K``, ``V``)."""

_ATTENTION_WITH_PAST = pat.Attention(
    _q,
    _k,
    _v,
    optional(_mask),
    _past_key,
    _past_value,
    scale=attr("scale"),
    softcap=attr("softcap"),
    _outputs=3,
)
"""``Y, present_key, present_value = Attention(Q, K, V, mask?, past_key, past_value)``."""


def _check_gqa(
    q: ir.Value,
    k: ir.Value,
    mask: ir.Value | None,
    past_key: ir.Value | None,
    is_causal: int,
    match: Match,
    dynamic_past: bool,
    masked: bool,
) -> Verdict:
    """The preconditions of ``GroupQueryAttention`` (see the module docstring); findings:
    ``heads``, ``mask_rank`` (of the mask passed as ``attention_bias``) and ``rotary`` (the
    rotations the op absorbs, or ``None``)."""
    node = match.nodes[0]
    heads = _common(node)
    if isinstance(heads, MatchFailure):
        return heads
    if not masked and not is_causal:
        return fail(
            "not causal (is_causal=0): GroupQueryAttention is causal "
            "(ort.default_rules(gqa_masked=True) sets causal=0: onnxruntime > 1.20)",
            None,
            node,
        )
    if not masked and mask is not None:
        return fail(
            "has an attention mask besides the causal one (ort.default_rules(gqa_masked=True) "
            "passes it as attention_bias: onnxruntime > 1.20)",
            mask,
        )
    mask_rank = None if mask is None else _mask_rank(mask, q)
    if isinstance(mask_rank, MatchFailure):
        return mask_rank
    if heads.head_size % 8:
        return fail(
            f"head size {heads.head_size} is not a multiple of 8 (onnxruntime CPU)", None, node
        )
    dq, dk = dims(q), dims(k)
    if dq is None or dk is None or dq[2] is None or dq[2] != dk[2]:
        return fail(f"query length {dq and dq[2]} and new key length {dk and dk[2]} differ", k)
    if past_key is not None and dq[0] != 1 and dq[2] != 1 and not dynamic_past:
        return fail(
            f"batch {dq[0]} and {dq[2]} new tokens with a past: onnxruntime's "
            "GroupQueryAttention runs a past only with batch 1 or one new token "
            "(ort.default_rules(gqa_dynamic_past=True) fuses anyway)",
            q,
        )
    if mask is not None and past_key is not None and q.dtype == ir.DataType.FLOAT16 and dq[0] != 1:
        # Measured (tests/rules/ort/test_attention.py): onnxruntime 1.32's CPU kernel gives
        # wrong numbers for every batch row but the first (max error 0.85).
        return fail(
            f"float16 with an attention_bias, a past and batch {dq[0]}: onnxruntime's CPU "
            "GroupQueryAttention computes rows after the first wrongly in this form",
            q,
        )
    return {"heads": heads, "mask_rank": mask_rank, "rotary": _fold_rotary(q, k, heads.head_size)}


def _gqa(
    op: RewriteBuilder,
    q: ir.Value,
    k: ir.Value,
    v: ir.Value,
    mask: ir.Value | None,
    past_key: ir.Value | None,
    past_value: ir.Value | None,
    scale: float | None,
    softcap: float,
    is_causal: int,
    heads: _Heads,
    mask_rank: int | None,
    rotary: _Folded | None,
) -> tuple[ir.Value, ir.Value, ir.Value]:
    """``to4(GroupQueryAttention(to3(Q), to3(K), to3(V), past_key, past_value, seqlens_k,
    total_len, cos?, sin?, position_ids?, attention_bias?))``, the presents."""
    cos = sin = pos = None
    interleaved = 0
    if rotary is not None:
        q, k, cos, sin, pos, interleaved = rotary
    i32 = ir.DataType.INT32
    new = op.Shape(k, start=2, end=3)
    total = new if past_key is None else op.Add(new, op.Shape(past_key, start=2, end=3))
    total32 = op.Cast(total, to=i32)
    batch = op.Shape(q, start=0, end=1)
    one = op.const(np.array([1], dtype=np.int32))
    seqlens = op.Expand(op.Sub(total32, one), batch)
    total_scalar = op.Squeeze(total32)
    y, present_k, present_v = op.domain(MS).GroupQueryAttention(
        _to3(op, q),
        _to3(op, k),
        _to3(op, v),
        past_key,
        past_value,
        seqlens,
        total_scalar,
        cos,
        sin,
        pos,
        _bias4(op, mask, mask_rank),
        num_heads=heads.q_heads,
        kv_num_heads=heads.kv_heads,
        causal=None if is_causal else 0,
        scale=scale,
        softcap=softcap or None,
        do_rotary=1 if rotary is not None else None,
        rotary_interleaved=interleaved if rotary is not None else None,
        _outputs=3,
    )
    return _to4(op, y, heads.q_heads), present_k, present_v


def _gqa_y(
    op: RewriteBuilder,
    q: ir.Value,
    k: ir.Value,
    v: ir.Value,
    mask: ir.Value | None,
    scale: float | None,
    softcap: float,
    is_causal: int,
    heads: _Heads,
    mask_rank: int | None,
    rotary: _Folded | None,
) -> ir.Value:
    """``to4(GroupQueryAttention(to3(Q), to3(K), to3(V), , , seqlens_k, total_len, …))``."""
    args = (scale, softcap, is_causal, heads, mask_rank, rotary)
    return _gqa(op, q, k, v, mask, None, None, *args)[0]


def group_query_attention(
    dynamic_past: bool = False, masked: bool = False, shared: SharedBuffer | None = None
) -> RuleSet:
    """The ``GroupQueryAttention`` rules (by default: causal ``Attention`` without a mask):
    ``GroupQueryAttentionKVCache`` for an ``Attention`` with present outputs (and a past or
    not), ``GroupQueryAttention`` for one without.

    Args:
        dynamic_past: Also fuse when batch and new-token count are dynamic and there is a past.
            onnxruntime then runs prefill (empty past) and decoding (one new token) at any batch
            size, but raises an error for a step with several new tokens, a non-empty past and
            batch > 1 (chunked prefill in a batch). Off by default: the fusion must not make a
            valid input fail.
        masked: Also fuse ``Attention`` with an additive float mask (HF's causal + padding
            mask) or without ``is_causal``: the mask becomes the op's ``attention_bias`` input
            and ``causal`` is the node's ``is_causal``. Both are newer than onnxruntime 1.20
            (tested with 1.32), so this is opt-in.
        shared: Write the op for onnxruntime-genai's shared KV buffer (see
            :class:`SharedBuffer`): every ``Attention`` with a past whose mask, if any, is
            computed from the attention-mask input (the one rule
            ``GroupQueryAttentionKVCache``, :func:`shared_buffer_rule`).
    """
    if shared is not None:
        return RuleSet("ort_gqa", [shared_buffer_rule(shared)])

    def check(
        q: ir.Value,
        k: ir.Value,
        mask: ir.Value | None,
        past_key: ir.Value | None,
        is_causal: int,
        match: Match,
    ) -> Verdict:
        return _check_gqa(q, k, mask, past_key, is_causal, match, dynamic_past, masked)

    return RuleSet(
        "ort_gqa",
        [
            Rule(  # (Y, presents) = Attention(Q, K, V, mask?, past?) = to4(GQA(to3(Q), …))
                "GroupQueryAttentionKVCache",
                _ATTENTION_KV_CACHE,
                check=check,
                rewrite=_gqa,
                min_opset=23,
            ),
            Rule(  # Y = Attention(Q, K, V, mask?) = to4(GQA(to3(Q), to3(K), to3(V), …))
                "GroupQueryAttention",
                _ATTENTION,
                check=lambda q, k, mask, is_causal, match: check(
                    q, k, mask, None, is_causal, match
                ),
                rewrite=_gqa_y,
                min_opset=23,
            ),
        ],
    )


def _check_shared(
    q: ir.Value, k: ir.Value, mask: ir.Value | None, match: Match, shared: SharedBuffer
) -> Verdict:
    """The preconditions of the shared-buffer form; findings: ``heads``, ``window``,
    ``rotary`` (or ``None``: the rotation stays outside), ``attention_mask``."""
    node = match.nodes[0]
    heads = _common(node)
    if isinstance(heads, MatchFailure):
        return heads
    if heads.head_size % 8:
        return fail(
            f"head size {heads.head_size} is not a multiple of 8 (onnxruntime CPU)", None, node
        )
    attention_mask = _graph_input(node, shared.mask_input)
    if attention_mask is None:
        return fail(f"the graph has no input {shared.mask_input!r}", None, node)
    if mask is None and not node_attributes(node).get("is_causal", 0):
        return fail("not causal and no mask", None, node)
    if mask is not None and not _reaches(mask, attention_mask):
        return fail(f"the mask is not computed from {shared.mask_input!r}", mask)
    if mask is not None and (why := _keep_mask(mask)) is not None:
        return fail(why, mask)
    window = None if mask is None else _sliding_window(mask)
    if isinstance(window, MatchFailure):
        return window
    if window is not None and window < 1:
        return fail(f"sliding window {window} < 1", mask)
    dq, dk = dims(q), dims(k)
    if dq is None or dk is None or dq[2] != dk[2]:
        return fail(f"query length {dq and dq[2]} and new key length {dk and dk[2]} differ", k)
    rotary = _rotary_caches(node, q, k, heads.head_size, shared)
    return {
        "heads": heads,
        "window": window,
        "rotary": None if isinstance(rotary, MatchFailure) else rotary,
        "attention_mask": attention_mask,
    }


def _gqa_shared(
    op: RewriteBuilder,
    q: ir.Value,
    k: ir.Value,
    v: ir.Value,
    past_key: ir.Value,
    past_value: ir.Value,
    scale: float | None,
    softcap: float,
    heads: _Heads,
    window: int | None,
    rotary: tuple[ir.Value, ir.Value, np.ndarray, np.ndarray, int] | None,
    attention_mask: ir.Value,
) -> tuple[ir.Value, ir.Value, ir.Value]:
    """``to4(GroupQueryAttention(to3(Q), to3(K), to3(V), past_key, past_value, seqlens_k,
    total_sequence_length, cos_cache?, sin_cache?))`` fed from the attention-mask input (see
    :class:`SharedBuffer`)."""
    cos = sin = None
    interleaved = 0
    if rotary is not None:
        q, k, cos_cache, sin_cache, interleaved = rotary
        cos, sin = op.const(cos_cache), op.const(sin_cache)
    i32 = ir.DataType.INT32
    ones = op.ReduceSum(attention_mask, op.const(np.array([1], dtype=np.int64)), keepdims=0)
    seqlens = op.Cast(op.Sub(ones, op.const(np.array(1, dtype=np.int64))), to=i32)
    total = op.Cast(op.Squeeze(op.Shape(attention_mask, start=1, end=2)), to=i32)
    y, present_k, present_v = op.domain(MS).GroupQueryAttention(
        _to3(op, q),
        _to3(op, k),
        _to3(op, v),
        past_key,
        past_value,
        seqlens,
        total,
        cos,
        sin,
        num_heads=heads.q_heads,
        kv_num_heads=heads.kv_heads,
        scale=scale,
        softcap=softcap or None,
        # measured (tests/llm/test_genai_ort.py, mistral): W, not W - 1 nor W + 1
        local_window_size=window,
        do_rotary=None if cos is None else 1,
        rotary_interleaved=None if cos is None else interleaved,
        _outputs=3,
    )
    return _to4(op, y, heads.q_heads), present_k, present_v


def shared_buffer_rule(shared: SharedBuffer) -> Rule:
    """The ``GroupQueryAttention`` rule for onnxruntime-genai's shared buffer."""

    def check(q: ir.Value, k: ir.Value, mask: ir.Value | None, match: Match) -> Verdict:
        return _check_shared(q, k, mask, match, shared)

    return Rule(
        "GroupQueryAttentionKVCache",
        _ATTENTION_WITH_PAST,
        check=check,
        rewrite=_gqa_shared,
        min_opset=23,
    )


def _check_mha(q: ir.Value, mask: ir.Value | None, softcap: float, match: Match) -> Verdict:
    """The preconditions of ``MultiHeadAttention``; findings: ``heads``, ``mask_rank``."""
    node = match.nodes[0]
    heads = _common(node)
    if isinstance(heads, MatchFailure):
        return heads
    if node_attributes(node).get("is_causal", 0):
        return fail("causal (is_causal=1): left to GroupQueryAttention", None, node)
    if softcap:
        return fail("softcap: MultiHeadAttention has none", None, node)
    if heads.q_heads != heads.kv_heads:
        return fail(f"{heads.q_heads} query heads but {heads.kv_heads} key/value heads", None, node)
    mask_rank = None if mask is None else _mask_rank(mask, q)
    if isinstance(mask_rank, MatchFailure):
        return mask_rank
    return {"heads": heads, "mask_rank": mask_rank}


def _mha(
    op: RewriteBuilder,
    q: ir.Value,
    k: ir.Value,
    v: ir.Value,
    mask: ir.Value | None,
    past_key: ir.Value | None,
    past_value: ir.Value | None,
    scale: float | None,
    heads: _Heads,
    mask_rank: int | None,
) -> tuple[ir.Value, ir.Value, ir.Value]:
    """``to4(MultiHeadAttention(to3(Q), to3(K), to3(V), , , bias?, past_key?, past_value?))``,
    the presents."""
    y, present_k, present_v = op.domain(MS).MultiHeadAttention(
        _to3(op, q),
        _to3(op, k),
        _to3(op, v),
        None,
        None,
        _bias4(op, mask, mask_rank),
        past_key,
        past_value,
        num_heads=heads.q_heads,
        scale=scale,
        _outputs=3,
    )
    return _to4(op, y, heads.q_heads), present_k, present_v


def _mha_y(
    op: RewriteBuilder,
    q: ir.Value,
    k: ir.Value,
    v: ir.Value,
    mask: ir.Value | None,
    scale: float | None,
    heads: _Heads,
    mask_rank: int | None,
) -> ir.Value:
    """``to4(MultiHeadAttention(to3(Q), to3(K), to3(V), , , bias?))``."""
    return _mha(op, q, k, v, mask, None, None, scale, heads, mask_rank)[0]


MULTI_HEAD_ATTENTION = RuleSet(
    "ort_mha",
    [
        Rule(  # (Y, presents) = Attention(Q, K, V, bias?, past?) = to4(MHA(to3(Q), …))
            "MultiHeadAttentionKVCache",
            _ATTENTION_KV_CACHE,
            check=_check_mha,
            rewrite=_mha,
            min_opset=23,
        ),
        Rule(  # Y = Attention(Q, K, V, bias?) = to4(MHA(to3(Q), to3(K), to3(V), , , bias))
            "MultiHeadAttention",
            _ATTENTION,
            check=_check_mha,
            rewrite=_mha_y,
            min_opset=23,
        ),
    ],
)
"""The non-causal ``Attention`` → ``MultiHeadAttention`` rules (with and without a cache)."""


_x, _cos, _sin, _pos = var("x"), var("cos"), var("sin"), var("position_ids")

_ROTARY = pat.RotaryEmbedding(
    _x,
    _cos,
    _sin,
    optional(_pos),
    interleaved=attr("interleaved"),
    num_heads=attr("num_heads"),
    rotary_embedding_dim=attr("rotary_embedding_dim"),
    _exact_attributes=True,  # (an attribute of a newer opset stops the rewrite)
)
"""``RotaryEmbedding(x, cos, sin, position_ids?)`` with the attributes the contrib op carries."""


def _check_contrib_rotary(
    x: ir.Value, cos: ir.Value, sin: ir.Value, position_ids: ir.Value | None, num_heads: int
) -> Verdict:
    """The contrib op's preconditions; the finding ``heads``: the head count it needs."""
    if position_ids is None:
        return fail("no position_ids: per-token cos/sin, the contrib op needs caches", x)
    if x.dtype not in ORT_FLOAT_TYPES or cos.dtype != x.dtype:
        return fail(f"dtype {x.dtype}: the contrib op runs float16/float32", x)
    dx = dims(x)
    if dx is None or len(dx) not in (3, 4):
        return fail("input must be 3-D or 4-D with known rank", x)
    heads = num_heads or (dx[1] if len(dx) == 4 else None)
    if not isinstance(heads, int) or heads <= 0:
        # (onnxruntime's kernel needs num_heads with a 3-D input or a rotary_embedding_dim)
        return fail(f"head count unknown ({len(dx)}-D input {dx}, no num_heads)", x)
    return {"heads": heads}


def _contrib_rotary(
    op: RewriteBuilder,
    x: ir.Value,
    cos: ir.Value,
    sin: ir.Value,
    position_ids: ir.Value,
    interleaved: int,
    rotary_embedding_dim: int,
    heads: int,
) -> ir.Value:
    """``RotaryEmbedding(x, cos, sin, position_ids) = com.microsoft.RotaryEmbedding(x,
    position_ids, cos, sin)`` (same attributes; the contrib op takes the position ids second)."""
    return op.domain(MS).RotaryEmbedding(
        x,
        position_ids,
        cos,
        sin,
        interleaved=interleaved or None,
        num_heads=heads,
        rotary_embedding_dim=rotary_embedding_dim or None,
    )


CONTRIB_ROTARY = Rule(
    "ContribRotaryEmbedding",
    _ROTARY,
    check=_check_contrib_rotary,
    rewrite=_contrib_rotary,
    min_opset=23,
)
"""``RotaryEmbedding`` with position ids → ``com.microsoft.RotaryEmbedding``."""


def attention_rules(
    gqa_dynamic_past: bool = False, gqa_masked: bool = False, shared: SharedBuffer | None = None
) -> RuleSet:
    """The attention rules; the options: see :func:`group_query_attention`."""
    return RuleSet(
        "ort_attention",
        [
            group_query_attention(gqa_dynamic_past, gqa_masked, shared),
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


def runs_on_shared_buffer(model: ir.Model, layers: int) -> bool:
    """Whether ``model`` runs ``layers`` ``GroupQueryAttention`` nodes per call (the
    :class:`SharedBuffer` rule's, one per cached layer) and no other attention (standard
    ``Attention``, ``MultiHeadAttention``, or one left unfused, ``Softmax``): onnxruntime-genai
    may then run it with ``past_present_share_buffer: true``."""
    runs = _run_counts(model)
    others = ("", "Attention"), (MS, "MultiHeadAttention"), (MS, "Attention"), ("", "Softmax")
    return runs[MS, "GroupQueryAttention"] == layers and not any(runs[o] for o in others)
