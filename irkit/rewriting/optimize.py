"""``irkit.optimize``: cleanup and fusion rules to a fixed point, then the standard passes.

Only the rule engine is irkit's own. Constant folding, dead-code removal, CSE and initializer
deduplication are onnxscript / onnx-ir passes, configured so that **no function is inlined**:
the module hierarchy (``model.functions`` and their call nodes) survives.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterable

import onnx_ir as ir
import onnx_ir.passes.common as common_passes

from irkit.errors import RewriteError
from irkit.rewriting.apply import count_nodes, rewrite
from irkit.rewriting.report import RewriteReport
from irkit.rewriting.rule import BaseRule, RuleSet

__all__ = ["optimize", "Target", "TARGETS"]

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Target:
    """What the optimized model will run on.

    Attributes:
        name: The name users pass (``"onnx"``).
        rules: Returns the default rule set for this target.
    """

    name: str
    rules: Callable[[], RuleSet]


def _onnx_rules() -> RuleSet:
    import rewrites  # the top-level rule library; imported lazily (it imports irkit)

    return rewrites.default_rules()


TARGETS: dict[str, Target] = {"onnx": Target("onnx", _onnx_rules)}
"""Known targets. ``"onnx"``: standard ONNX ops only (fusions into ONNX ops such as ``Gelu``)."""


def _cse(model: ir.Model) -> None:
    cse = common_passes.CommonSubexpressionEliminationPass()
    cse(model)
    # The pass only visits the main graph; run its graph routine on each function body too.
    for function in model.functions.values():
        cse._eliminate_common_subexpression(function.graph)


def optimize(
    model: ir.Model,
    target: str = "onnx",
    *,
    rules: RuleSet | BaseRule | Iterable[BaseRule | RuleSet] | None = None,
    opset: int | None = None,
    fold_constants: bool = True,
    explain: str | None = None,
) -> RewriteReport:
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

    Returns:
        The :class:`RewriteReport` of the rewrite, with the time of each pass in ``passes``.

    Raises:
        RewriteError: Unknown ``target``.

    Example:
        >>> import onnx_ir as ir, irkit
        >>> m = ir.from_onnx_text('''
        ...   <ir_version: 10, opset_import: ["" : 20]>
        ...   g (float[2, 3] x) => (float[2, 3] y) { t = Identity(x)  y = Relu(t) }''')
        >>> report = irkit.optimize(m)
        >>> [n.op_type for n in m.graph]
        ['Relu']
    """
    if target not in TARGETS:
        raise RewriteError(f"unknown optimize target {target!r}; known targets: {sorted(TARGETS)}")
    rule_set = TARGETS[target].rules() if rules is None else rules
    start = time.perf_counter()
    nodes_before = count_nodes(model)
    timings: dict[str, float] = {}

    def timed(name: str, fn: Callable[[], object]) -> None:
        t0 = time.perf_counter()
        fn()
        timings[name] = timings.get(name, 0.0) + time.perf_counter() - t0

    if fold_constants:
        from onnxscript.optimizer import fold_constants as fold

        timed("fold_constants", lambda: fold(model))
    t0 = time.perf_counter()
    report = rewrite(model, rule_set, max_opset=opset, explain=explain)
    timings["rewrite"] = time.perf_counter() - t0
    timed("remove_unused", lambda: common_passes.RemoveUnusedNodesPass()(model))
    timed("cse", lambda: _cse(model))
    # Main-graph Constant nodes become initializers (function bodies keep their Constant nodes).
    timed(
        "lift_constants",
        lambda: common_passes.LiftConstantsToInitializersPass(
            lift_all_constants=True, size_limit=0
        )(model),
    )
    timed("dedupe_initializers", lambda: common_passes.DeduplicateInitializersPass()(model))
    timed("remove_unused_functions", lambda: common_passes.RemoveUnusedFunctionsPass()(model))
    report.passes = timings
    report.nodes_before = nodes_before
    report.nodes_after = count_nodes(model)
    report.seconds = time.perf_counter() - start
    logger.info("optimize: %s", report)
    return report
