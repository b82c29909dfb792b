"""The optimization pipeline of the engine: fold, rules to a fixed point, the standard passes.

:func:`optimize_with` takes its rules explicitly: the engine does not know the rule library.
``irkit.optimize`` (in :mod:`irkit._pipeline`, one layer above) binds a target name to its
default rules and calls it.

Only the rule engine is irkit's own. Constant folding, dead-code removal, CSE and initializer
deduplication are onnxscript / onnx-ir passes, configured so that **no function is inlined**:
the module hierarchy (``model.functions`` and their call nodes) survives.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Sequence

import onnx_ir as ir
import onnx_ir.passes.common as common_passes

from irkit._irutil import nested_subgraphs
from irkit.errors import IrkitError, RewriteError
from irkit.rewriting._apply import Guard, count_nodes, rewrite
from irkit.rewriting._report import RewriteReport
from irkit.rewriting._rule import BaseRule, RuleSet
from irkit.weights import (
    DedupeDerivedPass,
    FoldWeightlessPass,
    LiftWeightlessConstantsPass,
    ShouldFold,
    hide_weightless,
)

__all__ = ["optimize_with", "cse"]

logger = logging.getLogger(__name__)


def _size_limits_decide(node: ir.Node) -> bool | None:
    return None


def cse(model: ir.Model) -> None:
    """Common-subexpression elimination in the main graph and in every function body."""
    cse = common_passes.CommonSubexpressionEliminationPass()
    cse(model)
    # The pass only visits the main graph; run its graph routine on each function body too.
    for function in model.functions.values():
        cse._eliminate_common_subexpression(function.graph)


def optimize_with(
    model: ir.Model,
    rules: RuleSet | BaseRule | Iterable[BaseRule | RuleSet],
    *,
    opset: int | None = None,
    fold_constants: bool = True,
    explain: str | None = None,
    report: RewriteReport | None = None,
    guards: Sequence[Guard] = (),
    should_fold: ShouldFold | None = None,
    common_subexpressions: bool = True,
) -> ir.Model:
    """Optimize ``model`` **in place** with ``rules``: fold constants, rules to a fixed point, clean up.

    Steps: constant folding (``onnxscript.optimizer`` ``FoldConstantsPass``, which never inlines;
    ``Transpose``/``Cast``/``Reshape``/``(Un)Squeeze``/``Concat``/``Mul``/``Cos``/``Sin`` of weightless
    initializers become derived weightless initializers, see
    :class:`irkit.weights.FoldWeightlessPass`),
    :func:`irkit.rewrite` with ``rules``, unused-node removal,
    common-subexpression elimination (main graph and every function body), lifting the main
    graph's ``Constant`` nodes to initializers (IR version 4 and newer: before, an initializer
    must also be a graph input), initializer deduplication, unused-function removal. Local functions are kept: the hierarchy survives.

    Args:
        model: The model; modified in place.
        rules: The rules (a :class:`RuleSet`, a rule, or an iterable of them).
        opset: The highest ONNX opset the target runtime supports: fusions into newer ops (e.g.
            ``Gelu`` at 20, ``RMSNormalization`` at 23) do not fire above it. The model's own
            opset is never changed.
        fold_constants: Run constant folding first.
        explain: Record near misses of this rule (see :meth:`RewriteReport.explain`).
        report: If given, filled with the rewrite's :class:`RewriteReport`, with the time of each
            pass in ``passes``.
        guards: Vetoes on rewrites, passed to :func:`irkit.rewrite` (see :class:`Guard`).
        should_fold: The constant-folding policy, as onnxscript's ``fold_constants`` takes it
            (False never folds the node, True always does, None lets the size limits decide);
            by default the size limits decide everywhere.
        common_subexpressions: Run common-subexpression elimination.

        ``irkit.optimize`` passes the last three for a model whose module calls were opened to
        be outlined again: ``irkit.hierarchy.HierarchyGuard()`` (refuses rewrites that would
        make calls of one module differ), ``irkit.hierarchy.keeps_weight_transposes`` (leaves
        ``Transpose(initializer)`` alone: it would copy weights that are function parameters
        in the outlined model) and no CSE (it would merge identical nodes of different calls;
        it runs :func:`cse` after re-outlining).

    Returns:
        ``model`` itself, so stages compose.

    Raises:
        RewriteError: A rule or a pass failed (a rule bug, or a malformed model).

    Example:
        >>> import onnx_ir as ir
        >>> from irkit.rewriting import Rule, op, var
        >>> m = ir.from_onnx_text('''
        ...   <ir_version: 10, opset_import: ["" : 20]>
        ...   g (float[2, 3] x) => (float[2, 3] y) { t = Neg(x)  u = Neg(t)  y = Relu(u) }''')
        >>> double_neg = Rule("DoubleNeg", op.Neg(op.Neg(var("x"))), rewrite=lambda x: x)
        >>> [n.op_type for n in optimize_with(m, double_neg).graph]
        ['Relu']
    """
    start = time.perf_counter()
    nodes_before = count_nodes(model)
    timings: dict[str, float] = {}

    def timed(name: str, fn: Callable[[], object]) -> None:
        t0 = time.perf_counter()
        try:
            fn()
        except IrkitError:
            raise
        except Exception as exc:  # onnx-ir / onnxscript passes on a malformed model
            raise RewriteError(_pass_failure(model, name, exc)) from exc
        timings[name] = timings.get(name, 0.0) + time.perf_counter() - t0

    if fold_constants:
        from onnxscript.optimizer import fold_constants as fold

        policy = _size_limits_decide if should_fold is None else should_fold

        def fold_known() -> None:
            with (
                hide_weightless(model, "optimize: fold_constants"),  # never read (or invent) them
                hide_from_folder(model),
            ):
                fold(model, should_fold=policy)
            # What the folder would have computed from weightless weights becomes derived ones.
            FoldWeightlessPass(policy)(model)

        timed("fold_constants", fold_known)
    result = RewriteReport()
    timed(
        "rewrite",
        lambda: rewrite(
            model,
            rules,
            max_opset=opset,
            explain=explain,
            report=result,
            guards=guards,
        ),
    )
    timed("remove_unused", lambda: common_passes.RemoveUnusedNodesPass()(model))
    # An initializer of IR < 4 must also be a graph input: there constants stay Constant nodes.
    lift = (model.ir_version or 0) >= _IR_INITIALIZERS_NEED_NO_INPUT
    # Weights rules derived from weightless ones: initializers before CSE reads Constant values.
    if lift:
        timed("lift_constants", lambda: LiftWeightlessConstantsPass()(model))
    if common_subexpressions:
        timed("cse", lambda: cse(model))
    # Main-graph Constant nodes become initializers (function bodies keep their Constant nodes).
    if lift:
        timed(
            "lift_constants",
            lambda: common_passes.LiftConstantsToInitializersPass(
                lift_all_constants=True, size_limit=0
            )(model),
        )

    def dedupe_known() -> None:
        with hide_weightless(model, "optimize: dedupe_initializers"):
            common_passes.DeduplicateInitializersPass()(model)
        DedupeDerivedPass()(model)  # (equal recipes: equal values)

    timed("dedupe_initializers", dedupe_known)
    timed("remove_unused_functions", lambda: common_passes.RemoveUnusedFunctionsPass()(model))

    # The folder and rules name what they create per graph (``val_10``); ONNX wants a name once
    # in a graph and the subgraphs it holds (two ``Loop`` bodies each folding one value).
    def unique_names() -> None:
        _rename_subgraph_initializers(model)
        common_passes.NameFixPass()(model)

    timed("unique_names", unique_names)
    result.passes = timings
    result.nodes_before = nodes_before
    result.nodes_after = count_nodes(model)
    result.seconds = time.perf_counter() - start
    logger.info("optimize: %s", result)
    if report is not None:
        report.fill_from(result)
    return model


_IR_INITIALIZERS_NEED_NO_INPUT = 4
"""The first ONNX IR version whose initializers need not be graph inputs as well."""


def _rename_subgraph_initializers(model: ir.Model) -> None:
    """Give each ``If``/``Loop``/``Scan`` body's initializer a name no other value of the main
    graph's scope has (``val_3`` of a constant the lift made in an ``If`` branch and ``val_3``
    in the main graph: the model is not in SSA form). onnx-ir's name pass renames them too,
    but onnx-ir 0.1.16 (the oldest lane) renames while iterating a body's initializers and
    fails ("dictionary keys changed during iteration"): they are renamed here first, from a
    copy."""
    taken = {v.name for v in model.graph.inputs}
    taken |= set(model.graph.initializers)
    bodies = list(nested_subgraphs(model.graph))
    for graph_like in (model.graph, *bodies):
        taken |= {v.name for v in graph_like.inputs}
        taken |= {o.name for node in graph_like for o in node.outputs if o.name}
    count = 0
    for body in bodies:
        for value in list(body.initializers.values()):
            name = value.name or "init"
            if name not in taken:
                taken.add(name)
                continue
            while f"{name}_{count}" in taken:
                count += 1
            value.name = f"{name}_{count}"
            taken.add(value.name)


# ----------------------------------------------------------------------------------------------
# What onnxscript's constant folder must not see

_HIDDEN_DOMAIN = "irkit.hidden_from_folder"  # (imported by no model: the folder skips the node)

# onnxscript's folder rewrites some ops by partial evaluation (without constant inputs), into
# forms of other ops that need a newer default opset than the model may have:
# ``ConcatFromSequence(new_axis=1)`` → ``Unsqueeze`` with an axes input (opset 13);
# ``SplitToSequence`` → ``Split`` with a ``split`` input (13) or ``num_outputs`` (18), ``Squeeze``
# with an axes input (13). In a graph of an older opset these nodes are left alone.
_REWRITTEN_FROM_OPSET: dict[str, int] = {"ConcatFromSequence": 13, "SplitToSequence": 18}


def _unfoldable(node: ir.Node, opset: int | None) -> str | None:
    """Why onnxscript's folder must not see ``node`` (``None``: it may)."""
    if node.domain != "":
        return None
    needed = _REWRITTEN_FROM_OPSET.get(node.op_type)
    if needed is not None and opset is not None and opset < needed:
        return f"its folded form needs opset {needed}, the graph has {opset}"
    if node.op_type == "SplitToSequence" and len(node.inputs) > 1:
        # onnxscript 0.7's evaluator reads a `split` that is neither a constant nor of a known
        # 1-D shape (a 0-d graph input) as an array and fails (AttributeError on None).
        split = node.inputs[1]
        shape = None if split is None else split.shape
        producer = None if split is None else split.producer()
        constant = (
            split is None
            or split.const_value is not None
            or (producer is not None and producer.op_type == "Constant" and producer.domain == "")
        )
        if not constant and (shape is None or len(shape) != 1):
            return "its split sizes are neither constant nor a known 1-D shape"
    return None


def _graph_likes_with_opset(model: ir.Model) -> Iterator[tuple[ir.Graph | ir.Function, int | None]]:
    """Every graph-like (main graph, functions, their subgraphs) with its default-domain opset."""
    opset = model.opset_imports.get("")
    owners: list[tuple[ir.Graph | ir.Function, int | None]] = [(model.graph, opset)]
    owners += [(f, f.opset_imports.get("", opset)) for f in model.functions.values()]
    for owner, owner_opset in owners:
        yield owner, owner_opset
        for graph in nested_subgraphs(owner):
            yield graph, owner_opset


@contextlib.contextmanager
def hide_from_folder(model: ir.Model) -> Iterator[list[ir.Node]]:
    """Within the block, the nodes onnxscript's constant folder would rewrite into ops the graph's
    opset does not have, or would fail on, are in a domain no model imports (the folder leaves
    such nodes alone). Restored on exit, even on error.

    Yields:
        The hidden nodes.
    """
    hidden: list[ir.Node] = []
    for graph, opset in _graph_likes_with_opset(model):
        for node in graph:
            why = _unfoldable(node, opset)
            if why is not None:
                logger.info("optimize: not folding %s (%s): %s", node.name, node.op_type, why)
                hidden.append(node)
    for node in hidden:
        node.domain = _HIDDEN_DOMAIN
    try:
        yield hidden
    finally:
        for node in hidden:
            node.domain = ""


def _pass_failure(model: ir.Model, name: str, exc: Exception) -> str:
    """The message for a pass that failed: the model's fault if ``irkit.check`` rejects it,
    otherwise the pass's (so ``optimize`` and ``check`` agree about the model)."""
    from irkit._io import check  # (the checker: only on this error path)

    what = f"optimize: the {name} pass failed ({type(exc).__name__}: {exc})"
    try:
        check(model, runtime=False)  # (validity: what onnxruntime lacks is no malformation)
    except IrkitError as problem:
        first = str(problem).splitlines()[0]
        return f"{what}. The model is malformed: irkit.check says: {first}"
    fix = " Fix: skip it (irkit.optimize(..., fold_constants=False), irkit optimize --no-fold)."
    return (
        f"{what}, on a model irkit.check accepts: a bug in that pass, not in the model."
        f"{fix if name == 'fold_constants' else ''}"
    )
