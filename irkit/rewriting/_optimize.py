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

import numpy as np
import onnx_ir as ir
import onnx_ir.passes.common as common_passes

from irkit import _derived as derived
from irkit._irutil import nested_subgraphs
from irkit._weights import WeightlessTensor, hide_weightless
from irkit.errors import IrkitError, RewriteError
from irkit.rewriting._apply import count_nodes, rewrite
from irkit.rewriting._match import const_tensor
from irkit.rewriting._report import RewriteReport
from irkit.rewriting._rule import BaseRule, RuleSet

__all__ = [
    "optimize_with",
    "cse",
    "fold_weightless",
    "lift_weightless_constants",
    "dedupe_derived",
]

logger = logging.getLogger(__name__)


def _default_folding(node: ir.Node) -> bool | None:
    return None


def _keeps_weight_transposes(node: ir.Node) -> bool | None:
    """Leave ``Transpose(initializer)`` alone in a model whose module calls were opened.

    In the outlined model the weight is a function parameter, so nothing folds its
    ``Transpose`` (torchlib's 3-D ``linear``); folding it in the opened model would copy every
    weight. Rules see ``MatMul(x, Transpose(w))`` and fold it without a copy (``FusedMatMul``).
    """
    if node.op_type == "Transpose" and node.domain == "" and node.inputs:
        weight = node.inputs[0]
        if weight is not None and weight.is_initializer():
            return False
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
    keep_hierarchy: bool = False,
) -> ir.Model:
    """Optimize ``model`` **in place** with ``rules``: fold constants, rules to a fixed point, clean up.

    Steps: constant folding (``onnxscript.optimizer`` ``FoldConstantsPass``, which never inlines;
    ``Transpose``/``Cast``/``Reshape``/``(Un)Squeeze``/``Concat``/``Mul``/``Cos``/``Sin`` of weightless
    initializers become derived weightless initializers, see
    :func:`fold_weightless`),
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
        keep_hierarchy: For models whose module calls were inlined to be outlined again:
            :func:`irkit.rewrite` refuses rewrites that would make calls of one module differ,
            common-subexpression elimination is skipped (it would merge identical nodes of
            different calls; run :func:`cse` after re-outlining), and folding leaves
            ``Transpose(initializer)`` alone (it would copy weights that are function
            parameters in the outlined model).

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

        should_fold = _keeps_weight_transposes if keep_hierarchy else _default_folding

        def fold_known() -> None:
            with (
                hide_weightless(model, "optimize: fold_constants"),  # never read (or invent) them
                hide_from_folder(model),
            ):
                fold(model, should_fold=should_fold)
            # What the folder would have computed from weightless weights becomes derived ones.
            fold_weightless(model, should_fold)

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
            keep_hierarchy=keep_hierarchy,
        ),
    )
    timed("remove_unused", lambda: common_passes.RemoveUnusedNodesPass()(model))
    # An initializer of IR < 4 must also be a graph input: there constants stay Constant nodes.
    lift = (model.ir_version or 0) >= _IR_INITIALIZERS_NEED_NO_INPUT
    # Weights rules derived from weightless ones: initializers before CSE reads Constant values.
    if lift:
        timed("lift_constants", lambda: lift_weightless_constants(model))
    if not keep_hierarchy:  # (across calls opened for re-outlining, CSE would merge them)
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
        dedupe_derived(model)  # (equal recipes: equal values)

    timed("dedupe_initializers", dedupe_known)
    timed("remove_unused_functions", lambda: common_passes.RemoveUnusedFunctionsPass()(model))
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


def lift_weightless_constants(model: ir.Model) -> int:
    """Main-graph ``Constant`` nodes whose value is weightless (a weight a rule derived, see
    :func:`irkit.rewriting.weight_constant`) become initializers named after their output, as
    the pipeline's constant lifting makes them (passes that read ``Constant`` values, such as
    CSE, cannot read theirs).

    Returns:
        The number of constants lifted.
    """
    graph = model.graph
    lifted = 0
    for node in list(graph):
        attribute = node.attributes.get("value")
        if node.op_type != "Constant" or node.domain != "" or attribute is None:
            continue
        tensor = attribute.value
        out = node.outputs[0]
        if not isinstance(tensor, WeightlessTensor) or out.is_graph_output():
            continue
        value = ir.Value(
            name=out.name,
            type=ir.TensorType(tensor.dtype),
            shape=ir.Shape(tuple(int(d) for d in tensor.shape.numpy())),
            const_value=tensor,
        )
        value.metadata_props.update(out.metadata_props)
        out.replace_all_uses_with(value)
        graph.remove(node, safe=True)
        graph.register_initializer(value)
        lifted += 1
    return lifted


def dedupe_derived(model: ir.Model) -> int:
    """Merge the main graph's derived initializers that have the same recipe (so the same
    values, as initializer deduplication merges equal real tensors); the first one is kept.

    Returns:
        The number of initializers removed.
    """
    graph = model.graph
    first: dict[str, ir.Value] = {}
    removed = 0
    for value in list(graph.initializers.values()):
        tensor = value.const_value
        if not isinstance(tensor, derived.DerivedTensor) or value.is_graph_output():
            continue
        key = tensor.metadata_props[derived.DERIVED_KEY]
        kept = first.setdefault(key, value)
        if kept is value or value.is_graph_input():
            continue
        value.replace_all_uses_with(kept)
        graph.initializers.pop(value.name or "")
        removed += 1
    return removed


# onnxscript's folder's defaults (onnxscript.optimizer._constant_folding), mirrored so that a
# weightless model folds exactly what the same model with data folds.
_INPUT_SIZE_LIMIT = 8192
_OUTPUT_SIZE_LIMIT = 512 * 512
_ALWAYS_FOLD = frozenset({"Transpose"})  # (when each large input has no other consumer)

ShouldFold = Callable[[ir.Node], "bool | None"]


def fold_weightless(model: ir.Model, should_fold: ShouldFold = _default_folding) -> int:
    """Fold, in the main graph, the ``Transpose``, ``Cast``, ``Reshape``, ``Unsqueeze``,
    ``Squeeze``, ``Concat``, ``Mul``, ``Cos``, ``Sin`` and ``Neg`` nodes whose inputs are weightless initializers and
    constants: each becomes a derived weightless initializer (:mod:`irkit._derived`) named
    after its output, computed when the model is saved with weights.

    The decision mirrors onnxscript's constant folder (its default size limits, ``Transpose``
    folded whatever its size when its input has no other use, ``should_fold``), so the
    optimized weightless model has the graph of the same model with weights.

    Args:
        model: The model; modified in place.
        should_fold: As onnxscript's ``fold_constants`` takes it: False never folds the node,
            True always does, None lets the size limits decide.

    Returns:
        The number of nodes folded.
    """
    graph = model.graph
    folded = 0
    for node in list(graph):
        if node.domain != "" or node.op_type not in _FOLDERS or len(node.outputs) != 1:
            continue
        out = node.outputs[0]
        inputs = [const_tensor(v) for v in node.inputs]
        if out.is_graph_output() or any(v is not None and v.is_graph_input() for v in node.inputs):
            continue
        if any(t is None for t in inputs) or not any(
            isinstance(t, WeightlessTensor) for t in inputs
        ):
            continue
        tensors = [t for t in inputs if t is not None]
        if not _allowed(node, tensors, should_fold):
            continue
        try:
            tensor = _FOLDERS[node.op_type](node, tensors)
        except (ValueError, IndexError, TypeError, IrkitError) as exc:
            logger.debug("fold_weightless: %s not folded (%s)", node.name, exc)
            continue
        if tensor is None or not _small_enough(node, tensor):
            continue
        if not isinstance(tensor, derived.DerivedTensor):  # (some input was a weightless leaf)
            continue
        value = ir.Value(
            name=out.name,
            type=ir.TensorType(tensor.dtype),
            shape=ir.Shape(tuple(int(d) for d in tensor.shape.numpy())),
            const_value=derived.DerivedTensor(tensor.recipe, name=out.name),
        )
        value.metadata_props.update(out.metadata_props)
        out.replace_all_uses_with(value)
        sources = [v for v in node.inputs if v is not None]
        graph.remove(node, safe=True)
        graph.register_initializer(value)
        for source in sources:  # inputs nothing else reads go, as the folder drops them
            if source.is_initializer() and not source.uses() and not source.is_graph_output():
                graph.initializers.pop(source.name or "", None)
        folded += 1
    if folded:
        logger.info("optimize: %d node(s) on weightless weights folded to derived ones", folded)
    return folded


def _size(tensor: ir.TensorProtocol) -> int:
    return int(np.prod(tensor.shape.numpy(), dtype=np.int64))


def _allowed(node: ir.Node, tensors: Sequence[ir.TensorProtocol], should_fold: ShouldFold) -> bool:
    verdict = should_fold(node)
    if verdict is not None:
        return verdict
    large = [_size(t) > _INPUT_SIZE_LIMIT for t in tensors]
    if not any(large):
        return True
    return node.op_type in _ALWAYS_FOLD and all(
        len(v.consumers()) == 1 or not is_large
        for v, is_large in zip(node.inputs, large, strict=True)
        if v is not None
    )


def _small_enough(node: ir.Node, tensor: ir.TensorProtocol) -> bool:
    if _size(tensor) <= _OUTPUT_SIZE_LIMIT:
        return True
    removed = 0
    for value in node.inputs:
        if value is not None and len(value.uses()) == 1:
            held = const_tensor(value)
            removed += 0 if held is None else _size(held)
    return _size(tensor) - removed <= 0


def _ints(tensor: ir.TensorProtocol) -> list[int]:
    if isinstance(tensor, WeightlessTensor):
        raise ValueError("a shape or axes input without data")
    return [int(d) for d in tensor.numpy().reshape(-1)]


def _dims(tensor: ir.TensorProtocol) -> list[int]:
    return [int(d) for d in tensor.shape.numpy()]


def _attr(node: ir.Node, name: str, default: object = None) -> object:
    attribute = node.attributes.get(name)
    return default if attribute is None else attribute.value


def _transpose(node: ir.Node, tensors: Sequence[ir.TensorProtocol]) -> ir.TensorProtocol:
    rank = len(tensors[0].shape)
    perm = _attr(node, "perm") or list(reversed(range(rank)))
    return derived.transpose(tensors[0], [int(p) for p in perm])  # type: ignore[attr-defined]


def _cast(node: ir.Node, tensors: Sequence[ir.TensorProtocol]) -> ir.TensorProtocol | None:
    to = ir.DataType(int(_attr(node, "to")))  # type: ignore[call-overload]
    if to.itemsize < 1 or to.name.startswith("FLOAT8") or to == ir.DataType.STRING:
        return None  # (saturating float8 casts and packed 4-bit types: left to the runtime)
    return derived.cast(tensors[0], to)


def _reshape(node: ir.Node, tensors: Sequence[ir.TensorProtocol]) -> ir.TensorProtocol:
    shape, dims = _ints(tensors[1]), _dims(tensors[0])
    if not _attr(node, "allowzero", 0):
        shape = [dims[i] if d == 0 else d for i, d in enumerate(shape)]
    return derived.reshape(tensors[0], shape)


def _axes(node: ir.Node, tensors: Sequence[ir.TensorProtocol]) -> list[int] | None:
    if len(tensors) > 1:
        return _ints(tensors[1])
    axes = _attr(node, "axes")
    return None if axes is None else [int(a) for a in axes]  # type: ignore[attr-defined]


def _unsqueeze(node: ir.Node, tensors: Sequence[ir.TensorProtocol]) -> ir.TensorProtocol:
    dims, axes = _dims(tensors[0]), _axes(node, tensors)
    if axes is None:
        raise ValueError("Unsqueeze without axes")
    rank = len(dims) + len(axes)
    for axis in sorted(a % rank for a in axes):
        dims.insert(axis, 1)
    return derived.reshape(tensors[0], dims)


def _squeeze(node: ir.Node, tensors: Sequence[ir.TensorProtocol]) -> ir.TensorProtocol:
    dims, axes = _dims(tensors[0]), _axes(node, tensors)
    drop = (
        {i for i, d in enumerate(dims) if d == 1} if axes is None else {a % len(dims) for a in axes}
    )
    if any(dims[i] != 1 for i in drop):
        raise ValueError("Squeeze of a dimension that is not 1")
    return derived.reshape(tensors[0], [d for i, d in enumerate(dims) if i not in drop])


def _concat(node: ir.Node, tensors: Sequence[ir.TensorProtocol]) -> ir.TensorProtocol:
    return derived.concat(tensors, int(_attr(node, "axis")))  # type: ignore[call-overload]


def _mul(node: ir.Node, tensors: Sequence[ir.TensorProtocol]) -> ir.TensorProtocol:
    return derived.multiply(tensors[0], tensors[1])


def _unary(
    function: derived.Function,
) -> Callable[[ir.Node, Sequence[ir.TensorProtocol]], ir.TensorProtocol | None]:
    def fold(node: ir.Node, tensors: Sequence[ir.TensorProtocol]) -> ir.TensorProtocol | None:
        if not tensors[0].dtype.is_floating_point():
            return None
        return derived.unary(tensors[0], function)

    return fold


_FOLDERS: dict[str, Callable[[ir.Node, Sequence[ir.TensorProtocol]], ir.TensorProtocol | None]] = {
    "Transpose": _transpose,
    "Cast": _cast,
    "Reshape": _reshape,
    "Unsqueeze": _unsqueeze,
    "Squeeze": _squeeze,
    "Concat": _concat,
    "Mul": _mul,
    "Cos": _unary(derived.Function.COS),
    "Sin": _unary(derived.Function.SIN),
    "Neg": _unary(derived.Function.NEG),
}


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
        if split is not None and split.const_value is None and (shape is None or len(shape) != 1):
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
