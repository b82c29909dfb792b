"""Weights: tensors that may have no data yet, and how their bytes reach the saved model.

A model lowered from a ``meta``-device program has **weightless** initializers
(:class:`WeightlessTensor`: name, dtype, shape, no data). A weight that a rule or constant folding
computes from them is a **derived** weightless tensor (:class:`DerivedTensor`: a small
:class:`Recipe` tree over weightless leaves and constants). :func:`irkit.save` streams the data
in: :func:`open_weights` reads a checkpoint without loading it, :func:`resolve_weights` matches
initializers to checkpoint tensors (and computes derived ones), :func:`write_external` writes the
external data files at the disk's speed. The weightless passes (:class:`FoldWeightlessPass`,
:class:`LiftWeightlessConstantsPass`, :class:`DedupeDerivedPass`) are onnx-ir passes that
``irkit.optimize`` runs so that a weightless model optimizes to the graph of the same model with
weights.

This package is the floor under the stages: it imports no stage (lowering, hierarchy, rewriting,
rules, viz, cli) and never torch. Everything the stages use is imported from here; the
``_*.py`` modules behind this facade are private. The metadata keys it writes are
:data:`irkit.metadata.WEIGHTLESS_KEY` and :data:`irkit.metadata.DERIVED_KEY`.
"""

from __future__ import annotations

from irkit.weights._checkpoints import SAFETENSORS_DTYPES, FileTensor, WeightSource, open_weights
from irkit.weights._derived import (
    Add,
    Cast,
    Concat,
    Constant,
    DerivedTensor,
    Function,
    Leaf,
    Mul,
    Narrow,
    Packed,
    PackedPart,
    Recipe,
    Reshape,
    Transpose,
    Unary,
    add,
    as_recipe,
    cast,
    concat,
    evaluate,
    from_marker,
    has_data,
    multiply,
    narrow,
    packed_parts,
    recipe_from_json,
    reshape,
    transpose,
    unary,
)
from irkit.weights._passes import (
    DedupeDerivedPass,
    FoldWeightlessPass,
    LiftWeightlessConstantsPass,
    ShouldFold,
)
from irkit.weights._stream import Rename, parse_size, resolve_weights, write_external
from irkit.weights._weightless import (
    WeightlessTensor,
    hide_weightless,
    is_weightless,
    weightless_initializers,
)

__all__ = [
    # weightless tensors
    "WeightlessTensor",
    "is_weightless",
    "weightless_initializers",
    "hide_weightless",
    # derived tensors and their recipes
    "DerivedTensor",
    "from_marker",
    "has_data",
    "as_recipe",
    "evaluate",
    "recipe_from_json",
    "transpose",
    "concat",
    "narrow",
    "cast",
    "reshape",
    "add",
    "multiply",
    "unary",
    "Recipe",
    "Leaf",
    "Constant",
    "Transpose",
    "Concat",
    "Narrow",
    "Cast",
    "Reshape",
    "Add",
    "Mul",
    "Unary",
    "Function",
    "Packed",
    "PackedPart",
    "packed_parts",
    # the passes irkit.optimize runs
    "FoldWeightlessPass",
    "LiftWeightlessConstantsPass",
    "DedupeDerivedPass",
    "ShouldFold",
    # checkpoints and the streamed save
    "WeightSource",
    "FileTensor",
    "open_weights",
    "SAFETENSORS_DTYPES",
    "Rename",
    "resolve_weights",
    "write_external",
    "parse_size",
]
