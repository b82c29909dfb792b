"""Declarative graph rewriting over onnx-ir models (no torch needed).

Write a rule as the identity it implements — a pattern built with :data:`op`, an optional check,
a rewrite — compose rules into :class:`RuleSet`\\ s with ``+`` and apply them with
:func:`rewrite` (in place, to a fixed point) or :func:`optimize_with` (folding, rules, CSE).
The engine knows no rules: the library is :mod:`irkit.rules`, bound to targets by
``irkit.optimize``.
See ``docs/rules.md`` for a worked example.
"""

from __future__ import annotations

from irkit.rewriting.apply import count_nodes, rewrite
from irkit.rewriting.builder import RewriteBuilder
from irkit.rewriting.match import Match, MatchFailure, const_value, fail
from irkit.rewriting.module_rule import ModuleCall, ModuleRule
from irkit.rewriting.optimize import optimize_with
from irkit.rewriting.pattern import Const, attr, either, op, optional, var
from irkit.rewriting.report import NearMiss, RewriteReport, RuleStats
from irkit.rewriting.rule import (
    BaseRule,
    NodeRule,
    Rewrite,
    RewriteContext,
    Rule,
    RuleSet,
    node_rule,
)

__all__ = [
    "rewrite",
    "optimize_with",
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
    "const_value",
    "RewriteReport",
    "RuleStats",
    "NearMiss",
]
