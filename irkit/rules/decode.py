"""Decode-step rules for a quantized model (the ``"onnx"`` target after :func:`irkit.quantize`).

A float model of the ``"onnx"`` target holds standard ONNX ops only. A quantized one already
depends on onnxruntime's ``com.microsoft`` domain (``MatMulNBits``), so the contrib fusions
that shorten a decode step cost it nothing more; and a step that reads rotary angles from a
table stops recomputing them. Identities:

- ``RMSNormalization(a + b, w), a + b = SkipSimplifiedLayerNormalization(a, b, w)`` — the
  residual add joins the norm (:mod:`irkit.rules.ort.skip_norm`, reused as is).
- ``RotaryEmbedding(x, Cos(Cast(Unsqueeze(p, -1)) · f), Sin(Cast(Unsqueeze(p, -1)) · f))
  = RotaryEmbedding(x, cos(P ⊗ f), sin(P ⊗ f), p)`` with ``P = 0, 1, …, max_positions - 1``:
  opset 23's ``RotaryEmbedding`` gathers the rows of 2-D caches at the ``position_ids`` it is
  given, so the per-step ``Unsqueeze``, ``Cast``, ``Mul``, ``Cos`` and ``Sin`` go. The tables are
  computed as the graph computes the angles (float32 positions times ``f`` in float32). A
  position ≥ ``max_positions`` is then refused by onnxruntime ("position_ids value … is out of
  range"): the rule is opt-in, with the bound the model was exported for
  (``export_causal_lm(max_sequence=…)``).
- ``x · Sigmoid(x) = com.microsoft.QuickGelu(x, alpha=1)`` (``SiLU``; float32, the op's CPU
  kernel). onnxruntime fuses it itself when it loads the model: one node less in the file, no
  change in kernel time.
- The export's mask ``Where(causal ∧ padding, 0, -inf)`` (``lowest``: also matched), with ``causal[i, j] = j ≤ P + i``
  (``Range`` over ``T = P + S`` against ``Range(S) + P``) and ``padding = attention_mask[:, :T] ≠ 0``,
  is ``Attention(is_causal=1)`` with the padding alone, ``Where(padding, 0, lowest)`` expanded
  to ``[B, 1, S, T]`` (``CausalPaddingMask``: 17 nodes → ``Cast``, ``Unsqueeze``, ``Where``,
  ``Shape``, ``Concat``, ``Expand``). onnxruntime 1.32's CPU ``Attention`` aligns ``is_causal``
  to the bottom right when it has a past (query ``i`` sees keys ``≤ P + i``), gives the
  export's numbers, also in the query rows whose every key is masked (left padding longer than
  the past: 0 there, as torch's SDPA and the export's NaN guard give for its ``-inf`` fill;
  with a ``lowest`` fill the graph — floored by :mod:`irkit.rules.attention` — averages them
  where the op gives 0; a padded token's row, tested), and
  refuses a mask whose query axis is 1 when ``S > 1`` (hence the ``Expand``). The mask stays
  float: a bool one gives the same numbers in onnxruntime, but the spec's −∞ for ``False``
  makes fully masked rows NaN, which the next layer's values spread to every row. An ``attention_mask`` wider than ``T`` was
  cut to ``T`` by the ``Slice``; it is now refused by onnxruntime (its width must be ``T``).

Preconditions (``RotaryPositionTable``): opset ≥ 23; the ``RotaryEmbedding`` has no
``position_ids`` yet; its ``cos``/``sin`` inputs are ``Cos``/``Sin`` of one ``Mul`` of
``Cast(Unsqueeze(p, [-1]), to=float)`` by a constant ``f`` (1-D, or every dim but the last 1);
``p`` int64 ``(batch, sequence)``; ``x`` float32.

Preconditions (``CausalPaddingMask``): opset ≥ 23; a 3-D float32 ``Attention`` with a past and
present key/value, q, k and v of one sequence length, ``is_causal``, ``softcap`` and
``qk_matmul_output_mode`` unset or 0; its mask exactly the chain above with the fill float32's
lowest or ``-inf``; ``S`` and ``P`` read by ``Squeeze(Shape(x, start=a, end=a + 1))`` from dims equal (same
int or symbol) to q's sequence and the past key's length; ``attention_mask`` 2-D.

Measured (bench/bench_quantize.py's reference model, int4, decode@127, one thread, a busy
machine): the skip-norm and rotary rules each move the step by 2-3 % (median ratio to the
unfused graph), within the noise of single runs; 89 → 76 nodes per step with both, 61 with
``SiLU`` and ``CausalPaddingMask``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx_ir as ir

from irkit._irutil import node_attributes
from irkit.errors import RuleDefinitionError
from irkit.rewriting import (
    Const,
    Match,
    RewriteBuilder,
    Rule,
    RuleSet,
    Verdict,
    attr,
    const_ints,
    dims,
    fail,
    matches,
    op,
    scalar,
    var,
)

__all__ = ["causal_padding_mask", "quantized_rules", "quick_gelu", "rotary_position_table"]

MS = "com.microsoft"

x, c, s, p, f = var("x"), var("c"), var("s"), var("p"), var("f")
_ANGLES = op.Cast(op.Unsqueeze(p, var("axes")), to=int(ir.DataType.FLOAT)) * f
_ROTARY = op.RotaryEmbedding(
    x,
    c,
    s,
    interleaved=attr("interleaved"),
    num_heads=attr("num_heads"),
    rotary_embedding_dim=attr("rotary_embedding_dim"),
)


def _frequencies(f: ir.Value) -> np.ndarray | None:
    """``f`` as a 1-D float32 array (a constant, every dim but the last 1), else ``None``."""
    tensor = f.const_value
    if tensor is None or f.dtype != ir.DataType.FLOAT:
        return None
    array = tensor.numpy()
    if array.ndim == 0 or any(n != 1 for n in array.shape[:-1]):
        return None
    return array.reshape(-1)


def rotary_position_table(max_positions: int) -> Rule:
    """The ``RotaryPositionTable`` rule for positions ``0 … max_positions - 1`` (see the module
    docstring).

    Args:
        max_positions: Rows of the cos/sin tables: the longest sequence the model serves.

    Raises:
        RuleDefinitionError: ``max_positions`` is not a positive int.
    """
    if isinstance(max_positions, bool) or not isinstance(max_positions, int) or max_positions < 1:
        raise RuleDefinitionError(
            f"RotaryPositionTable: max_positions={max_positions!r}; give the number of positions "
            "the model serves (a positive int, e.g. export_causal_lm's max_sequence)"
        )

    def check(x: ir.Value, c: ir.Value, s: ir.Value, match: Match) -> Verdict:
        if x.dtype != ir.DataType.FLOAT:
            return fail(f"x is {x.dtype}; the tables are written for float32", x)
        found = matches(op.Cos(_ANGLES), c, match.opset)
        if not isinstance(found, dict):
            return fail("cos is not Cos(Cast(Unsqueeze(position_ids)) · f)", c)
        same = {k: found[k] for k in ("p", "f", "axes")}
        if not isinstance(matches(op.Sin(_ANGLES), s, match.opset, **same), dict):
            return fail("sin is not the Sin of the same angles", s)
        positions: ir.Value = found["p"]
        pd = dims(positions)
        if positions.dtype != ir.DataType.INT64 or pd is None or len(pd) != 2:
            return fail("position ids are not int64 (batch, sequence)", positions)
        if const_ints(found["axes"]) not in ([-1], [2]):
            return fail("the positions are not unsqueezed on the last axis", positions)
        freq = _frequencies(found["f"])
        if freq is None:
            return fail("the frequencies are not a float32 constant vector", found["f"])
        angles = np.arange(max_positions, dtype=np.float32)[:, None] * freq[None, :]
        return {"positions": positions, "cos_table": np.cos(angles), "sin_table": np.sin(angles)}

    def rewrite(
        op: RewriteBuilder,
        x: ir.Value,
        positions: ir.Value,
        cos_table: np.ndarray,
        sin_table: np.ndarray,
        interleaved: int | None,
        num_heads: int | None,
        rotary_embedding_dim: int | None,
    ) -> ir.Value:
        """RotaryEmbedding(x, cos_table, sin_table, position_ids)"""
        attributes: dict[str, Any] = {
            k: v
            for k, v in [
                ("interleaved", interleaved),
                ("num_heads", num_heads),
                ("rotary_embedding_dim", rotary_embedding_dim),
            ]
            if v is not None
        }
        return op.RotaryEmbedding(
            x, op.const(cos_table), op.const(sin_table), positions, **attributes
        )

    return Rule("RotaryPositionTable", _ROTARY, check=check, rewrite=rewrite, min_opset=23)


# --- SiLU ----------------------------------------------------------------------------------------


def _check_silu(x: ir.Value) -> Verdict:
    if x.dtype != ir.DataType.FLOAT:
        return fail(f"x is {x.dtype}; onnxruntime's CPU QuickGelu runs float32", x)
    return True


def quick_gelu() -> Rule:
    """The ``SiLU`` rule: ``x · Sigmoid(x) = com.microsoft.QuickGelu(x, alpha=1)`` (float32)."""
    return Rule(
        "SiLU",
        op.Mul(x, op.Sigmoid(x)),
        check=_check_silu,
        rewrite=lambda op, x: op.domain(MS).QuickGelu(x, alpha=1.0),
    )


# --- the attention mask --------------------------------------------------------------------------

_S, _P = var("S"), var("P")
_TOTAL = op.Add(_P, _S)
_CAUSAL = op.LessOrEqual(  # key position ≤ query position (absolute: past + i)
    op.Unsqueeze(op.Range(0, _TOTAL, 1), var("key_axes")),
    op.Unsqueeze(op.Range(0, _S, 1) + _P, var("query_axes")),
)
_PADDING = op.Unsqueeze(
    op.Slice(
        op.Cast(var("attention_mask"), to=int(ir.DataType.BOOL)),
        Const(0),
        op.Reshape(_TOTAL, var("total_shape")),
        var("slice_axes"),
    ),
    var("padding_axes"),
)
_MASK = op.Where(op.And(_CAUSAL, _PADDING), 0.0, var("fill"))
q, k, v, pk, pv, mask = var("q"), var("k"), var("v"), var("pk"), var("pv"), var("mask")


def _axes(value: ir.Value | None, rank: int) -> list[int] | None:
    ints = const_ints(value)
    return None if ints is None else sorted(a % rank for a in ints)


def _length_source(length: ir.Value) -> tuple[ir.Value, ir.Value, int] | None:
    """``length = Squeeze(Shape(x, start=a, end=a + 1))``: ``(x, the 1-D shape, a)``."""
    squeeze = length.producer()
    if squeeze is None or squeeze.op_type != "Squeeze" or squeeze.domain != "":
        return None
    axes = squeeze.inputs[1] if len(squeeze.inputs) > 1 else None
    if axes is not None and _axes(axes, 1) != [0]:
        return None
    shape = squeeze.inputs[0]
    node = shape.producer() if shape is not None else None
    if shape is None or node is None or node.op_type != "Shape" or node.domain != "":
        return None
    source, start, end = node.inputs[0], node.attributes.get("start"), node.attributes.get("end")
    rank = len(dims(source) or ())
    if source is None or start is None or end is None or rank == 0:
        return None
    first, last = start.as_int(), end.as_int()
    first, last = first % rank if first < 0 else first, last % rank if last < 0 else last
    return (source, shape, first) if last == first + 1 < rank + 1 else None


def _same_dim(a: ir.Value | None, i: int, b: ir.Value | None, j: int) -> bool:
    da, db = dims(a), dims(b)
    if da is None or db is None or len(da) <= i or len(db) <= j:
        return False
    return da[i] is not None and da[i] == db[j]


def _unfloored(mask: ir.Value) -> ir.Value:
    """``x`` of ``Max(x, floor)`` with the floor :mod:`irkit.rules.attention` gives a mask (one
    step above float32's lowest; ``is_causal`` with the padding mask gives the export's
    numbers without it), else ``mask``."""
    p = mask.producer()
    if p is None or (p.domain, p.op_type) != ("", "Max") or len(p.inputs) != 2:
        return mask
    floor = np.nextafter(np.finfo(np.float32).min, np.float32(0))
    return p.inputs[0] if scalar(p.inputs[1]) == float(floor) and p.inputs[0] else mask


def _check_mask(
    q: ir.Value,
    k: ir.Value,
    v: ir.Value,
    pk: ir.Value,
    pv: ir.Value,
    mask: ir.Value,
    match: Match,
) -> Verdict | dict[str, Any]:
    att = match.nodes[0]
    attrs = node_attributes(att)
    if attrs.get("is_causal", 0):
        return fail("the Attention is causal already", mask)
    for name in ("softcap", "qk_matmul_output_mode"):
        if attrs.get(name, 0):
            return fail(f"{name}={attrs[name]}: the rule is proven on a plain Attention", mask)
    if q.dtype != ir.DataType.FLOAT:
        return fail(f"q is {q.dtype}: the rule is proven on float32", q)
    if len(dims(q) or ()) != 3 or len(dims(pk) or ()) != 4:
        return fail("q is not 3-D (batch, sequence, hidden) or the past key not 4-D", q)
    if not (_same_dim(k, 1, q, 1) and _same_dim(v, 1, q, 1)):
        return fail("the new keys/values are not as long as the queries (is_causal aligns on k)", k)
    found = matches(_MASK, _unfloored(mask), match.opset)
    if not isinstance(found, dict):
        return fail(f"the mask is not the export's causal ∧ padding mask ({found.reason})", mask)
    if found["fill"].dtype != ir.DataType.FLOAT:
        return fail(f"the mask is {found['fill'].dtype}: the rule is proven on float32", mask)
    fill = scalar(found["fill"])
    if fill is None or fill not in (float(np.finfo(np.float32).min), -np.inf):
        return fail("the masked fill is not float32's lowest or -inf", found["fill"])
    seq, past = _length_source(found["S"]), _length_source(found["P"])
    if seq is None or not _same_dim(seq[0], seq[2], q, 1):
        return fail("S is not read from a dim equal to q's sequence length", found["S"])
    if past is None or not (_same_dim(past[0], past[2], pk, 2) and _same_dim(pk, 2, pv, 2)):
        return fail("P is not read from a dim equal to the past key's length", found["P"])
    if _axes(found["key_axes"], 4) != [0, 1, 2] or _axes(found["query_axes"], 4) != [0, 1, 3]:
        return fail("the positions are not unsqueezed to [1, 1, 1, T] and [1, 1, S, 1]", mask)
    attention_mask: ir.Value = found["attention_mask"]
    if len(dims(attention_mask) or ()) != 2:
        return fail("the attention mask is not 2-D (batch, total)", attention_mask)
    if _axes(found["slice_axes"], 2) != [1] or const_ints(found["total_shape"]) not in ([1], [-1]):
        return fail("the padding mask is not sliced to the total length on axis 1", mask)
    if _axes(found["padding_axes"], 4) != [1, 2]:
        return fail("the padding mask is not unsqueezed to [B, 1, 1, T]", mask)
    return {"attention_mask": attention_mask, "sequence": seq[1], "fill": found["fill"]}


def _mask_rewrite(
    op: RewriteBuilder,
    q: ir.Value,
    k: ir.Value,
    v: ir.Value,
    pk: ir.Value,
    pv: ir.Value,
    attention_mask: ir.Value,
    sequence: ir.Value,
    fill: ir.Value,
    match: Match,
) -> tuple[ir.Value, ...]:
    """Attention(q, k, v, Expand(Where(mask[:, None, None] ≠ 0, 0, lowest), [1, 1, S, 1]), pk, pv,
    is_causal=1)"""
    kept = op.Unsqueeze(
        op.Cast(attention_mask, to=int(ir.DataType.BOOL)), op.Constant(value_ints=[1, 2])
    )
    padding = op.Where(kept, op.const(np.array(0.0, np.float32)), fill)
    rows = op.Concat(op.Constant(value_ints=[1, 1]), sequence, op.Constant(value_ints=[1]), axis=0)
    attrs = {**node_attributes(match.nodes[0]), "is_causal": 1}
    return tuple(op.Attention(q, k, v, op.Expand(padding, rows), pk, pv, _outputs=3, **attrs))


def causal_padding_mask() -> Rule:
    """The ``CausalPaddingMask`` rule (see the module docstring)."""
    return Rule(
        "CausalPaddingMask",
        op.Attention(q, k, v, mask, pk, pv, _outputs=3),
        check=_check_mask,
        rewrite=_mask_rewrite,
        min_opset=23,
    )


def quantized_rules(*, max_positions: int | None = None) -> RuleSet:
    """What a quantized ``"onnx"``-target model gets after :func:`irkit.quantize`:
    ``SkipSimplifiedLayerNormalization``, ``QuickGelu`` for SiLU, the causal mask as
    ``is_causal=1`` with the padding mask alone, and with ``max_positions`` the rotary tables.

    >>> quantized_rules(max_positions=1024).names()  # doctest: +NORMALIZE_WHITESPACE
    ['SkipSimplifiedLayerNormalizationOffset', 'SkipSimplifiedLayerNormalization',
     'SkipLayerNormalization', 'SiLU', 'CausalPaddingMask', 'RotaryPositionTable']
    """
    from irkit.rules.ort import skip_norm  # (lazy: irkit.rules.ort imports irkit.rules)

    members: list[Rule | RuleSet] = [skip_norm.rules, quick_gelu(), causal_padding_mask()]
    if max_positions is not None:
        members.append(rotary_position_table(max_positions))
    return RuleSet("quantized", members)
