"""The weightless passes: what constant folding and the standard passes would do to weights,
done to weights that have no data.

A model lowered from a ``meta``-device program has weightless initializers; onnxscript's constant
folder and onnx-ir's initializer deduplication must not read them (``hide_weightless`` hides them
from those passes). These onnx-ir passes do the weightless part, so the optimized weightless model
has the graph of the same model with weights:

- :class:`FoldWeightlessPass`: ``Transpose``, ``Cast``, ``Reshape``, ``(Un)Squeeze``, ``Concat``,
  ``Mul``, ``Cos``, ``Sin``, ``Neg`` of weightless initializers and constants become derived
  weightless initializers (a recipe, computed at save time);
- :class:`LiftWeightlessConstantsPass`: main-graph ``Constant`` nodes holding a weightless tensor
  (a weight a rule derived) become initializers;
- :class:`DedupeDerivedPass`: derived initializers with the same recipe are merged.

``irkit.optimize`` (``irkit.rewriting.optimize_with``) runs them. This module imports no torch
and no stage.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import numpy as np
import onnx_ir as ir

from irkit._irutil import const_tensor
from irkit._shapes import Dims, reshape_target, squeezed, unsqueezed
from irkit.errors import IrkitError
from irkit.metadata import DERIVED_KEY
from irkit.weights import _derived as derived
from irkit.weights._weightless import WeightlessTensor

__all__ = [
    "ShouldFold",
    "FoldWeightlessPass",
    "LiftWeightlessConstantsPass",
    "DedupeDerivedPass",
]

logger = logging.getLogger(__name__)

ShouldFold = Callable[[ir.Node], "bool | None"]
"""A folding policy, as onnxscript's ``fold_constants`` takes it: False never folds the node,
True always does, None lets the size limits decide."""


def _default_folding(node: ir.Node) -> bool | None:
    return None


class FoldWeightlessPass(ir.passes.InPlacePass):
    """Fold, in the main graph, the nodes on weightless weights to derived weightless
    initializers (see :func:`fold_weightless`).

    Args:
        should_fold: The folding policy (the one given to onnxscript's folder); by default the
            size limits decide.
    """

    def __init__(self, should_fold: ShouldFold | None = None) -> None:
        super().__init__()
        self.should_fold = _default_folding if should_fold is None else should_fold

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        return ir.passes.PassResult(model, modified=fold_weightless(model, self.should_fold) > 0)


class LiftWeightlessConstantsPass(ir.passes.InPlacePass):
    """Main-graph ``Constant`` nodes holding a weightless tensor become initializers (see
    :func:`lift_weightless_constants`)."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        return ir.passes.PassResult(model, modified=lift_weightless_constants(model) > 0)


class DedupeDerivedPass(ir.passes.InPlacePass):
    """Derived initializers of the main graph with the same recipe are merged (see
    :func:`dedupe_derived`)."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        return ir.passes.PassResult(model, modified=dedupe_derived(model) > 0)


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
        key = tensor.metadata_props[DERIVED_KEY]
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


def fold_weightless(model: ir.Model, should_fold: ShouldFold = _default_folding) -> int:
    """Fold, in the main graph, the ``Transpose``, ``Cast``, ``Reshape``, ``Unsqueeze``,
    ``Squeeze``, ``Concat``, ``Mul``, ``Add``, ``Cos``, ``Sin`` and ``Neg`` nodes whose inputs are weightless initializers and
    constants: each becomes a derived weightless initializer (:class:`~irkit.weights.DerivedTensor`) named
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
    allowzero = int(_attr(node, "allowzero", 0))  # type: ignore[call-overload]
    return derived.reshape(
        tensors[0], _static(reshape_target(_dims(tensors[0]), _ints(tensors[1]), allowzero), node)
    )


def _axes(node: ir.Node, tensors: Sequence[ir.TensorProtocol]) -> list[int] | None:
    if len(tensors) > 1:
        return _ints(tensors[1])
    axes = _attr(node, "axes")
    return None if axes is None else [int(a) for a in axes]  # type: ignore[attr-defined]


def _unsqueeze(node: ir.Node, tensors: Sequence[ir.TensorProtocol]) -> ir.TensorProtocol:
    axes = _axes(node, tensors)
    if axes is None:
        raise ValueError("Unsqueeze without axes")
    return derived.reshape(tensors[0], _static(unsqueezed(_dims(tensors[0]), axes), node))


def _squeeze(node: ir.Node, tensors: Sequence[ir.TensorProtocol]) -> ir.TensorProtocol:
    dims = _static(squeezed(_dims(tensors[0]), _axes(node, tensors)), node)
    return derived.reshape(tensors[0], dims)


def _static(dims: Dims | None, node: ir.Node) -> list[int]:
    """``dims`` (of a tensor with data or a weightless one: all known), or why they are not."""
    if dims is None or not all(isinstance(d, int) for d in dims):
        raise ValueError(f"{node.op_type} does not apply to its input's shape")
    return [int(d) for d in dims]  # type: ignore[arg-type]


def _concat(node: ir.Node, tensors: Sequence[ir.TensorProtocol]) -> ir.TensorProtocol:
    return derived.concat(tensors, int(_attr(node, "axis")))  # type: ignore[call-overload]


def _mul(node: ir.Node, tensors: Sequence[ir.TensorProtocol]) -> ir.TensorProtocol:
    return derived.multiply(tensors[0], tensors[1])


def _add(node: ir.Node, tensors: Sequence[ir.TensorProtocol]) -> ir.TensorProtocol:
    return derived.add(tensors[0], tensors[1])


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
    "Add": _add,
    "Cos": _unary(derived.Function.COS),
    "Sin": _unary(derived.Function.SIN),
    "Neg": _unary(derived.Function.NEG),
}
