"""The pieces the attention rules share: head layout, the attributes carried, masks,
the ``Attention`` patterns, :class:`SharedBuffer`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
import onnx_ir as ir

from irkit.rewriting import (
    MatchFailure,
    RewriteBuilder,
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


def _merged(t: ir.Value) -> ir.Shape | None:
    """``(B, N, S, H)`` → the shape ``(B, S, N·H)`` where ``t``'s dims say so."""
    d = dims(t)
    if d is None or len(d) != 4 or not isinstance(d[1], int) or not isinstance(d[3], int):
        return None
    return ir.Shape([t.shape[0], t.shape[2], d[1] * d[3]]) if t.shape is not None else None


def _to3(op: RewriteBuilder, t: ir.Value) -> ir.Value:
    """``(B, N, S, H)`` → ``(B, S, N·H)``; the result carries its shape, so that the cleanup
    rules see a ``Reshape`` chain back to a value of that shape as the identity it is."""
    shape = op.const(np.array([0, 0, -1], dtype=np.int64))
    out: ir.Value = op.Reshape(op.Transpose(t, perm=[0, 2, 1, 3]), shape)
    out.type, out.shape = t.type, _merged(t)
    return out


def _to4(op: RewriteBuilder, t: ir.Value, heads: int, like: ir.Value | None = None) -> ir.Value:
    """``(B, S, N·H)`` → ``(B, N, S, H)``; with ``like`` (the replaced 4-D output), the
    values carry their shapes (``t``'s from ``like``'s)."""
    shape = op.const(np.array([0, 0, heads, -1], dtype=np.int64))
    four: ir.Value = op.Reshape(t, shape)
    out: ir.Value = op.Transpose(four, perm=[0, 2, 1, 3])
    if like is not None and like.shape is not None and len(like.shape) == 4:
        b, n, s, h = like.shape
        t.type, t.shape = like.type, _merged(like)
        four.type, four.shape = like.type, ir.Shape([b, s, n, h])
        out.type, out.shape = like.type, like.shape
    return out


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


# Ops that pass their data input's values through (shape-only ops, casts).
_VALUE_PRESERVING = frozenset(
    {"Cast", "Expand", "Identity", "Reshape", "Slice", "Squeeze", "Transpose", "Unsqueeze"}
)


def _keeps_minus_inf(where: ir.Node) -> bool:
    """``Where(Equal(x, lowest), floor, x)``: the floor :mod:`irkit.rules.attention` raises a
    mask to where ``-inf`` may occur (under torchlib's NaN guard, a mask of unknown fills)."""
    cond, _, other = where.inputs
    p = cond.producer() if cond is not None else None
    return p is not None and p.op_type == "Equal" and other is not None and other in p.inputs


def _holds_minus_inf(value: ir.Value | None, depth: int = 16) -> bool:
    """Whether ``value`` (an additive mask) is seen to hold ``-inf``: a constant with one, a
    ``Where`` with such a branch (the ``Where(mask, 0, -inf)`` of a boolean SDPA mask,
    ``masked_fill(-inf)``) or the floor of :mod:`irkit.rules.attention` that keeps ``-inf``
    (:func:`_keeps_minus_inf`), or a shape-only op or cast of one. A mask computed out of view
    (a graph input of an ONNX file from elsewhere) is not."""
    if value is None or depth == 0:
        return False
    arr = const_value(value)
    if arr is not None:
        return bool(arr.dtype.kind == "f" and np.any(np.isneginf(arr)))
    node = value.producer()
    if node is None or node.domain not in ("", "ai.onnx"):
        return False
    if node.op_type == "Where":
        if _keeps_minus_inf(node):
            return True
        return any(_holds_minus_inf(x, depth - 1) for x in node.inputs[1:])
    if node.op_type in _VALUE_PRESERVING:
        return _holds_minus_inf(node.inputs[0], depth - 1)
    return False


def _no_inf_bias(mask: ir.Value, op_type: str) -> Verdict:
    """A contrib op's ``attention_bias`` must not mask a query's every key with ``-inf``:
    onnxruntime 1.32's ``MultiHeadAttention`` returns NaN for such a row (measured), where the
    graph — torch's SDPA, ``Where(mask, 0, -inf)`` and the NaN guard — and the opset-23
    ``Attention`` return 0. ``GroupQueryAttention`` returns 0 there when causal, NaN with
    ``causal=0`` (``gqa_masked``). A mask seen to hold ``-inf`` (:func:`_holds_minus_inf`) keeps
    the ``Attention``."""
    if not _holds_minus_inf(mask):
        return True
    return fail(
        f"the mask holds -inf (a boolean mask's fill): a query masked at every key gives "
        f"NaN in {op_type}, 0 in Attention and in torch",
        mask,
    )


def _bias4(op: RewriteBuilder, mask: ir.Value | None, rank: int | None) -> ir.Value | None:
    """The mask (of ``rank``, see :func:`_mask_rank`) as the contrib ops' 4-D ``attention_bias``."""
    if mask is None or rank is None or rank == 4:
        return mask
    return op.Unsqueeze(mask, op.const(np.arange(4 - rank, dtype=np.int64)))


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


SEQUENCE_AXIS = 2


def readers(model: ir.Model, value: ir.Value) -> list[tuple[ir.Node, int]]:
    """Every node that reads ``value`` and is no function call, with the input position: the
    uses of a function's input followed into its body."""
    found: list[tuple[ir.Node, int]] = []
    for use in value.uses():
        node = use.node
        function = model.functions.get((node.domain, node.op_type, node.overload))
        if function is None:
            found.append((node, use.idx))
        else:
            found += readers(model, function.inputs[use.idx])
    return found


def reads_its_buffer(node: ir.Node, index: int, windowed: bool = False) -> bool:
    """``node`` reads a past input as the buffer it is: a ``GroupQueryAttention``'s past, or a
    ``Shape`` of axes before the sequence axis (the batch, the heads), not its capacity — but
    for a ``windowed`` buffer (``sliding_window_cache=1``), whose capacity is the window's
    (:mod:`irkit.rules.ort.attention.windowed`)."""
    if (node.domain, node.op_type) == (MS, "GroupQueryAttention"):
        return index in (3, 4)
    if (node.domain, node.op_type) != ("", "Shape"):
        return False
    start = node.attributes.get_int("start", 0)
    end = node.attributes.get_int("end", SEQUENCE_AXIS + 1)
    if windowed and (start, end) == (SEQUENCE_AXIS, SEQUENCE_AXIS + 1):
        return True
    return start >= 0 and 0 <= end <= SEQUENCE_AXIS


def windowed_buffer(node: ir.Node) -> bool:
    """``node`` is a ``GroupQueryAttention`` on a buffer of its window's capacity."""
    return (node.domain, node.op_type) == (MS, "GroupQueryAttention") and bool(
        node.attributes.get_int("sliding_window_cache", 0)
    )
