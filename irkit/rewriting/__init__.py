"""Declarative graph rewriting over onnx-ir models (no torch needed).

Write a rule as the identity it implements — a pattern built with :data:`op`, an optional check,
a rewrite — compose rules into :class:`RuleSet`\\ s with ``+`` and apply them with
:func:`rewrite` (in place, to a fixed point) or :func:`optimize_with` (folding, rules, CSE).
The engine knows no rules: the library is :mod:`irkit.rules`, bound to targets by
``irkit.optimize``.
See ``docs/rules.md`` for a worked example.

Everything a rule author needs is imported from here — the pattern language, :class:`Rule`,
:func:`fail`, :class:`Const` and the check helpers (:func:`dims`, :func:`known_dims`,
:func:`scalar`, :func:`reduced_axis`, :func:`matches`, :func:`outer_dims` …), and the helpers that make a weight from weights
(:func:`transpose_weight`, :func:`concat_weights`, :func:`cast_weight`, :func:`reshape_weight`,
:func:`multiply_weight`, :func:`weight_constant`): they return a real tensor when the inputs
have data and a :class:`DerivedTensor` (computed at save time) when some are weightless. The
``_*.py`` modules behind this facade are private.
"""

from __future__ import annotations

from irkit._shapes import known_dims
from irkit.rewriting._apply import Guard, count_nodes, graph_io_guard, rewrite
from irkit.rewriting._builder import RewriteBuilder, weight_constant
from irkit.rewriting._checks import (
    FLOAT_TYPES,
    Verdict,
    const_ints,
    dims,
    is_float,
    outer_dims,
    outer_dtype,
    rank,
    reduced_axis,
    same_dims,
    scalar,
    static_shape,
)
from irkit.rewriting._match import Match, MatchFailure, const_tensor, const_value, fail, matches
from irkit.rewriting._module_rule import ModuleCall, ModuleRule
from irkit.rewriting._optimize import cse, optimize_with
from irkit.rewriting._pattern import Const, Pattern, attr, either, op, optional, var
from irkit.rewriting._report import NearMiss, RewriteReport, RuleStats
from irkit.rewriting._rule import (
    BaseRule,
    NodeRule,
    Rewrite,
    RewriteContext,
    Rule,
    RuleSet,
    node_rule,
)
from irkit.weights import DerivedTensor, has_data
from irkit.weights import cast as cast_weight
from irkit.weights import concat as concat_weights
from irkit.weights import multiply as multiply_weight
from irkit.weights import reshape as reshape_weight
from irkit.weights import transpose as transpose_weight

__all__ = [
    "rewrite",
    "optimize_with",
    "cse",
    "count_nodes",
    "op",
    "var",
    "attr",
    "either",
    "optional",
    "Const",
    "Rule",
    "RuleSet",
    "NodeRule",
    "node_rule",
    "ModuleRule",
    "ModuleCall",
    "BaseRule",
    "Rewrite",
    "RewriteContext",
    "RewriteBuilder",
    "Match",
    "MatchFailure",
    "fail",
    "matches",
    "const_value",
    "const_tensor",
    "Pattern",
    "Verdict",
    "rank",
    "dims",
    "known_dims",
    "outer_dims",
    "outer_dtype",
    "static_shape",
    "is_float",
    "FLOAT_TYPES",
    "scalar",
    "const_ints",
    "same_dims",
    "reduced_axis",
    "graph_io_guard",
    "Guard",
    "RewriteReport",
    "RuleStats",
    "NearMiss",
    "transpose_weight",
    "concat_weights",
    "cast_weight",
    "reshape_weight",
    "multiply_weight",
    "weight_constant",
    "has_data",
    "DerivedTensor",
]
