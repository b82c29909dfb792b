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

Preconditions (``RotaryPositionTable``): opset ≥ 23; the ``RotaryEmbedding`` has no
``position_ids`` yet; its ``cos``/``sin`` inputs are ``Cos``/``Sin`` of one ``Mul`` of
``Cast(Unsqueeze(p, [-1]), to=float)`` by a constant ``f`` (1-D, or every dim but the last 1);
``p`` int64 ``(batch, sequence)``; ``x`` float32.

Measured (bench/bench_quantize.py's reference model, int4, decode@127, one thread, a busy
machine): each rule alone moves the step by 2-3 % (median ratio to the unfused graph), within
the noise of single runs; 89 → 76 nodes per step with both.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx_ir as ir

from irkit.errors import RuleDefinitionError
from irkit.rewriting import (
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
    var,
)

__all__ = ["quantized_rules", "rotary_position_table"]

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


def quantized_rules(*, max_positions: int | None = None) -> RuleSet:
    """What a quantized ``"onnx"``-target model gets after :func:`irkit.quantize`:
    ``SkipSimplifiedLayerNormalization``, and with ``max_positions`` the rotary tables.

    >>> quantized_rules(max_positions=1024).names()
    ['SkipSimplifiedLayerNormalization', 'SkipLayerNormalization', 'RotaryPositionTable']
    """
    from irkit.rules.ort import skip_norm  # (lazy: irkit.rules.ort imports irkit.rules)

    members: list[Rule | RuleSet] = [skip_norm.rules]
    if max_positions is not None:
        members.append(rotary_position_table(max_positions))
    return RuleSet("quantized", members)
