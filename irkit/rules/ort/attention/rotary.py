"""Rotations the contrib ops take: ``do_rotary`` folding (position-id caches, or caches
evaluated for the shared buffer) and ``RotaryEmbedding`` → contrib ``RotaryEmbedding``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import onnx_ir as ir

from irkit._irutil import node_attributes
from irkit.rewriting import (
    MatchFailure,
    RewriteBuilder,
    Rule,
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
from irkit.rules.ort.attention._base import (
    MS,
    SharedBuffer,
    _graph_input,
    _input,
)


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


def _cone(
    outputs: list[ir.Value],
    source: ir.Value,
    limit: int = 200,
    also: frozenset[ir.Value] = frozenset(),
) -> list[ir.Node] | str:
    """The nodes computing ``outputs`` from ``source``, the values ``also`` and constants
    (topological order), or why there are none."""
    order: list[ir.Node] = []
    seen: set[int] = set()

    def visit(v: ir.Value) -> str | None:
        p = v.producer()
        if p is None:
            if v is source or v in also or v.const_value is not None:
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
    nodes: list[ir.Node],
    source: ir.Value,
    outputs: list[ir.Value],
    feed: np.ndarray,
    also: Mapping[ir.Value, np.ndarray] | None = None,
) -> list[np.ndarray]:
    """Run ``nodes`` (``source`` fed with ``feed``, the values ``also`` with theirs) in onnx's
    reference evaluator."""
    import onnx
    import onnx.reference

    extra = dict(also or {})
    graph = nodes[0].graph
    consts = {
        id(i): i
        for n in nodes
        for i in n.inputs
        if i is not None and i.producer() is None and i is not source and i not in extra
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
            [onnx.helper.make_tensor_value_info(v.name or "", 0, None) for v in (source, *extra)],
            [onnx.helper.make_tensor_value_info(o.name or "", 0, None) for o in outputs],
            initializers,
        ),
        opset_imports=[
            onnx.helper.make_opsetid(d, v)
            for d, v in (graph.opset_imports.items() if graph is not None else [("", 23)])
        ],
    )
    feeds = {source.name or "": feed, **{v.name or "": a for v, a in extra.items()}}
    results = onnx.reference.ReferenceEvaluator(model).run(None, feeds)
    return [np.asarray(r) for r in results]


@dataclasses.dataclass(frozen=True)
class RotaryCaches:
    """The rotation ``GroupQueryAttention`` takes over on the shared buffer.

    Attributes:
        q: The un-rotated query.
        k: The un-rotated key.
        cos: ``(max_positions, rotary_dim / 2)``: the angles' cosines at positions
            ``0 … max_positions - 1`` (those of the long regime when ``switch`` is set);
            ``rotary_dim`` is the head size, or less for a partial rotation (the rest of each
            head passes unrotated).
        sin: The sines, likewise.
        interleaved: The rotation's ``interleaved``.
        switch: ``None``, or the total length from which ``cos``/``sin`` hold; below it
            ``short_cos``/``short_sin`` (longrope: ``original_max_position_embeddings + 1``).
        short_cos: The cosines of the short regime (its first ``switch - 1`` rows are used).
        short_sin: The sines of the short regime.
    """

    q: ir.Value
    k: ir.Value
    cos: np.ndarray
    sin: np.ndarray
    interleaved: int
    switch: int | None = None
    short_cos: np.ndarray | None = None
    short_sin: np.ndarray | None = None


_Evaluate = Callable[[int], list[np.ndarray]]


def _matches(angles: list[np.ndarray], reference: list[np.ndarray]) -> bool:
    """Whether ``angles`` (of ``n`` positions) are the first ``n`` rows of ``reference``."""
    n = angles[0].shape[1]
    return all(np.array_equal(a[0], r[0, :n]) for a, r in zip(angles, reference, strict=True))


def _switch(at: _Evaluate, full: list[np.ndarray], total: int) -> int | None | str:
    """``None`` when the angles of ``n < total`` positions are the first rows of ``full``
    (a function of each position alone); the total length ``n*`` from which they are, when
    below it they are those of one other, fixed function (two regimes: longrope); otherwise
    why neither holds."""
    probes = sorted({1, min(total, 4096) // 2, min(total, 4096) // 16} - {0})
    if all(_matches(at(n), full) for n in probes):
        return None
    low, high = 1, total  # (full matches itself at ``total``)
    while low < high:  # the smallest n from which the angles are full's (assumed monotone)
        mid = (low + high) // 2
        if _matches(at(mid), full):
            high = mid
        else:
            low = mid + 1
    start = low
    why = (
        "cos/sin depend on more than each token's position and are not two fixed regimes "
        f"(dynamic NTK?) within {total} positions: the rotation stays unfused"
    )
    if start < 2:
        return why
    short = at(start - 1)
    below = {1, max(1, (start - 1) // 2), start - 1}
    above = {start, (start + total) // 2}
    if not all(_matches(at(n), short) for n in below):
        return why
    if not all(_matches(at(n), full) for n in above):
        return why
    return start


def _rotary_caches(
    node: ir.Node, q: ir.Value, k: ir.Value, head_size: int, shared: SharedBuffer
) -> RotaryCaches | MatchFailure:
    """The :class:`RotaryCaches` when ``q`` and ``k`` are rotated by the same per-token
    ``RotaryEmbedding(x, cos, sin)`` whose ``cos``/``sin`` are a function of each token's
    position id alone: the caches are that function at positions ``0 … max_positions - 1``
    (``GroupQueryAttention`` reads the positions from ``seqlens_k``); or of the position and
    which of two regimes the total length is in (longrope's factor switch past
    ``original_max_position_embeddings``): the caches of both regimes and the switch point,
    found by evaluating the angles for ``n`` positions, ``n ≤ max_positions``. A rotation that
    depends on more (dynamic NTK) stays unfused."""
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
    if attributes != pk[4] or set(attributes) - {"interleaved", "rotary_embedding_dim"}:
        return fail(f"rotary attributes {attributes} / {pk[4]}", q)
    # partial rotary: GroupQueryAttention rotates the first ``2 · cos.shape[1]`` of each head
    width = int(attributes.get("rotary_embedding_dim", 0)) or head_size
    if width % 16 or not 0 < width <= head_size:
        return fail(
            f"rotary_embedding_dim {width}: onnxruntime's GroupQueryAttention rotates a "
            f"multiple of 16 up to the head size {head_size}",
            q,
        )
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

    def at(n: int) -> list[np.ndarray]:
        return _evaluate(nodes, positions, angles, np.arange(n, dtype=np.int64)[None])

    try:
        full = at(total)
        if any(a.shape != (1, total, width // 2) for a in full):
            return fail(f"cos/sin of shape {full[0].shape}, not (1, {total}, {width // 2})", cos)
        if not (np.array_equal(full[0], full[2]) and np.array_equal(full[1], full[3])):
            return fail("Q and K rotated by different angles", k)
        switch = _switch(at, full, total)
        short = None if not isinstance(switch, int) else at(switch - 1)
    except Exception as exc:  # (the evaluator's own errors: kept unfused, said why)
        return fail(f"cos/sin could not be evaluated: {type(exc).__name__}: {exc}", cos)
    if isinstance(switch, str):
        return fail(switch, cos)
    dtype = q.dtype.numpy() if q.dtype is not None else np.float32
    interleaved = int(attributes.get("interleaved", 0))
    caches = RotaryCaches(
        pq[0], pk[0], full[0][0].astype(dtype), full[1][0].astype(dtype), interleaved
    )
    if short is None:
        return caches
    # (the short regime's rows past ``switch - 1`` are never read: the long ones fill them)
    rows = (switch or 0) - 1
    short_cos, short_sin = caches.cos.copy(), caches.sin.copy()
    short_cos[:rows], short_sin[:rows] = short[0][0].astype(dtype), short[1][0].astype(dtype)
    return dataclasses.replace(caches, switch=switch, short_cos=short_cos, short_sin=short_sin)


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
