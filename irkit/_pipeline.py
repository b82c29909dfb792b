"""Where the stages meet the rule library: targets and their default rule sets.

The rewrite engine (:mod:`irkit.rewriting`) knows no rules; the rule library
(:mod:`irkit.rules`) is written against the engine. This module is the one layer above both: it
binds each optimization target to its default rules, so dependencies point one way
(``_pipeline → rules → rewriting``); ``irkit/rewriting/ruff.toml`` bans the reverse edge.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Callable, Iterable, Mapping

import onnx_ir as ir

from irkit import rules as library
from irkit.errors import RewriteError
from irkit.rewriting import BaseRule, RewriteReport, RuleSet
from irkit.rewriting._optimize import optimize_with

__all__ = ["Target", "TARGETS", "optimize"]


@dataclasses.dataclass(frozen=True)
class Target:
    """What the optimized model will run on.

    Attributes:
        name: The name users pass (``"onnx"``).
        rules: Returns the default rule set for this target.
    """

    name: str
    rules: Callable[[], RuleSet]


TARGETS: Mapping[str, Target] = types.MappingProxyType(
    {"onnx": Target("onnx", library.default_rules)}
)
"""Known targets (read-only). ``"onnx"``: standard ONNX ops only (fusions such as ``Gelu``)."""


def optimize(
    model: ir.Model,
    target: str = "onnx",
    *,
    rules: RuleSet | BaseRule | Iterable[BaseRule | RuleSet] | None = None,
    opset: int | None = None,
    fold_constants: bool = True,
    explain: str | None = None,
    report: RewriteReport | None = None,
) -> ir.Model:
    """Optimize ``model`` **in place**: fold constants, apply rules to a fixed point, clean up.

    Steps: constant folding (``onnxscript.optimizer`` ``FoldConstantsPass``, which never inlines),
    :func:`irkit.rewrite` with the target's default rules (or ``rules``), unused-node removal,
    common-subexpression elimination (main graph and every function body), lifting the main
    graph's ``Constant`` nodes to initializers, initializer deduplication, unused-function
    removal. Local functions are kept: the hierarchy survives.

    Args:
        model: The model; modified in place.
        target: ``"onnx"`` (standard ONNX ops only).
        rules: Rules to use instead of the target's defaults.
        opset: The highest ONNX opset the target runtime supports: fusions into newer ops (e.g.
            ``Gelu`` at 20, ``RMSNormalization`` at 23) do not fire above it. The model's own
            opset is never changed.
        fold_constants: Run constant folding first.
        explain: Record near misses of this rule (see :meth:`RewriteReport.explain`).
        report: If given, filled with the :class:`RewriteReport` of the rewrite, with the time
            of each pass in ``passes``.

    Returns:
        ``model`` itself, so stages compose: ``irkit.save(irkit.optimize(m), path)``.

    Raises:
        RewriteError: Unknown ``target``, or a rule failed.

    Example:
        >>> import onnx_ir as ir, irkit
        >>> m = ir.from_onnx_text(\'\'\'
        ...   <ir_version: 10, opset_import: ["" : 20]>
        ...   g (float[2, 3] x) => (float[2, 3] y) { t = Identity(x)  y = Relu(t) }\'\'\')
        >>> [n.op_type for n in irkit.optimize(m).graph]
        ['Relu']
    """
    if target not in TARGETS:
        raise RewriteError(f"unknown optimize target {target!r}; known targets: {sorted(TARGETS)}")
    rule_set = TARGETS[target].rules() if rules is None else rules
    return optimize_with(
        model,
        rule_set,
        opset=opset,
        fold_constants=fold_constants,
        explain=explain,
        report=report,
    )
