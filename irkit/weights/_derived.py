"""Derived weightless tensors: weights a rule or constant folding computes from other weights.

A model lowered from a ``meta``-device program has weightless initializers
(:class:`~irkit.weights.WeightlessTensor`). A rule that would compute a new weight from them
(the packed Q/K/V concatenation, a scale folded into a weight) or constant folding of
``Transpose(W)`` cannot read their data; instead it records **how** the new weight is computed:
a :class:`DerivedTensor` holds a small tree of recipes whose leaves are weightless tensors
(named by initializer / checkpoint name) or small real constants. It stays weightless (reading
its data raises :class:`~irkit.errors.WeightsError`). :func:`irkit.save` computes its bytes
while streaming the weights, one derived tensor at a time (the parts of one packed weight from
one quantization: :class:`PackCache`).

The recipes are a closed set of numpy computations with ONNX semantics: :class:`Transpose`,
:class:`Concat`, :class:`Cast`, :class:`Reshape`, :class:`Mul` and :class:`Add` (broadcasting) and :class:`Unary`
(``Cos``, ``Sin``, ``Neg``: the rotary caches a model computes from a buffer). They are
serialized as JSON in the initializer's ``metadata_props`` under
:data:`~irkit.metadata.DERIVED_KEY`, so a model saved without weights and loaded back keeps them
(:func:`from_marker` rebuilds the tensor).

Rules make weights from weights with :func:`transpose`, :func:`concat`, :func:`cast`,
:func:`reshape` and :func:`multiply` (re-exported by :mod:`irkit.rewriting`): each returns a
real ``onnx_ir.Tensor`` when every input has data, and a :class:`DerivedTensor` otherwise
(``irkit.rewriting.weight_constant`` puts one in a graph).

This module imports no torch.
"""

from __future__ import annotations

import abc
import base64
import dataclasses
import enum
import json
from collections.abc import Callable, Iterator, Sequence
from typing import Any, ClassVar

import numpy as np
import onnx_ir as ir

from irkit._shapes import reshape_target
from irkit.errors import WeightsError
from irkit.metadata import DERIVED_KEY, WEIGHTLESS_KEY
from irkit.weights._weightless import WeightlessTensor
from irkit.weights.packing import Method, PackedWeight, quantize_blockwise, rtn_scales

__all__ = [
    "Recipe",
    "Leaf",
    "Constant",
    "Transpose",
    "Concat",
    "Narrow",
    "Cast",
    "Reshape",
    "Mul",
    "Add",
    "Function",
    "Unary",
    "Packed",
    "PackedPart",
    "PackCache",
    "DerivedTensor",
    "transpose",
    "concat",
    "narrow",
    "cast",
    "reshape",
    "multiply",
    "add",
    "unary",
    "packed_parts",
    "as_recipe",
    "has_data",
    "evaluate",
    "recipe_from_json",
    "from_marker",
]

_VERSION = 1

Array = np.ndarray[Any, Any]
TensorLike = ir.TensorProtocol | Array


class Recipe(abc.ABC):
    """One node of a derived tensor's recipe tree: its dtype and shape, how to compute it."""

    @property
    @abc.abstractmethod
    def dtype(self) -> ir.DataType:
        """The element type of the result."""

    @property
    @abc.abstractmethod
    def shape(self) -> tuple[int, ...]:
        """The shape of the result."""

    def sources(self) -> tuple[Recipe, ...]:
        """The recipes this one reads (none for a leaf or a constant)."""
        return ()

    @abc.abstractmethod
    def compute(self, args: list[Array]) -> Array:
        """The result from the sources' values (in :meth:`sources` order)."""

    @abc.abstractmethod
    def to_json(self) -> dict[str, Any]:
        """The JSON form (see :func:`recipe_from_json`)."""

    def leaves(self) -> Iterator[Leaf]:
        """The weightless leaves, depth first (a leaf read twice is listed twice)."""
        for source in self.sources():
            yield from source.leaves()


@dataclasses.dataclass(frozen=True)
class Leaf(Recipe):
    """A weightless tensor, found at save time by name (or one of its aliases)."""

    name: str
    leaf_dtype: ir.DataType
    leaf_shape: tuple[int, ...]
    aliases: tuple[str, ...] = ()

    @property
    def dtype(self) -> ir.DataType:
        return self.leaf_dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return self.leaf_shape

    def compute(self, args: list[Array]) -> Array:
        raise WeightsError(f"leaf {self.name!r} is read by evaluate(), not computed.", [self.name])

    def leaves(self) -> Iterator[Leaf]:
        yield self

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"op": "leaf", "name": self.name}
        out.update(dtype=self.dtype.name, shape=list(self.shape))
        if self.aliases:
            out["aliases"] = list(self.aliases)
        return out


@dataclasses.dataclass(frozen=True, eq=False)
class Constant(Recipe):
    """A real constant (e.g. a scale); stored in the recipe itself."""

    value: Array
    value_dtype: ir.DataType

    @property
    def dtype(self) -> ir.DataType:
        return self.value_dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(int(d) for d in self.value.shape)

    def compute(self, args: list[Array]) -> Array:
        return self.value

    def to_json(self) -> dict[str, Any]:
        data = base64.b64encode(np.ascontiguousarray(self.value).tobytes()).decode("ascii")
        return {"op": "const", "dtype": self.dtype.name, "shape": list(self.shape), "data": data}


@dataclasses.dataclass(frozen=True)
class Transpose(Recipe):
    """``numpy.transpose(source, perm)`` (ONNX ``Transpose``)."""

    source: Recipe
    perm: tuple[int, ...]

    @property
    def dtype(self) -> ir.DataType:
        return self.source.dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.source.shape[p] for p in self.perm)

    def sources(self) -> tuple[Recipe, ...]:
        return (self.source,)

    def compute(self, args: list[Array]) -> Array:
        return np.transpose(args[0], self.perm)  # a view: the consumer copies once

    def to_json(self) -> dict[str, Any]:
        return {"op": "transpose", "perm": list(self.perm), "source": self.source.to_json()}


@dataclasses.dataclass(frozen=True)
class Concat(Recipe):
    """``numpy.concatenate(sources, axis)`` (ONNX ``Concat``)."""

    parts: tuple[Recipe, ...]
    axis: int

    @property
    def dtype(self) -> ir.DataType:
        return self.parts[0].dtype

    @property
    def shape(self) -> tuple[int, ...]:
        first = list(self.parts[0].shape)
        first[self.axis] = sum(p.shape[self.axis] for p in self.parts)
        return tuple(first)

    def sources(self) -> tuple[Recipe, ...]:
        return self.parts

    def compute(self, args: list[Array]) -> Array:
        return np.concatenate(args, axis=self.axis)

    def to_json(self) -> dict[str, Any]:
        return {"op": "concat", "axis": self.axis, "sources": [p.to_json() for p in self.parts]}


@dataclasses.dataclass(frozen=True)
class Narrow(Recipe):
    """``source[..., start:start + length, ...]`` on ``axis`` (ONNX ``Slice``)."""

    source: Recipe
    axis: int
    start: int
    length: int

    @property
    def dtype(self) -> ir.DataType:
        return self.source.dtype

    @property
    def shape(self) -> tuple[int, ...]:
        shape = list(self.source.shape)
        shape[self.axis] = self.length
        return tuple(shape)

    def sources(self) -> tuple[Recipe, ...]:
        return (self.source,)

    def compute(self, args: list[Array]) -> Array:
        index = [slice(None)] * args[0].ndim
        index[self.axis] = slice(self.start, self.start + self.length)
        return args[0][tuple(index)]  # a view: the consumer copies once

    def to_json(self) -> dict[str, Any]:
        return {
            "op": "narrow",
            "axis": self.axis,
            "start": self.start,
            "length": self.length,
            "source": self.source.to_json(),
        }


@dataclasses.dataclass(frozen=True)
class Cast(Recipe):
    """``source.astype(to)`` (ONNX ``Cast``, non-saturating)."""

    source: Recipe
    to: ir.DataType

    @property
    def dtype(self) -> ir.DataType:
        return self.to

    @property
    def shape(self) -> tuple[int, ...]:
        return self.source.shape

    def sources(self) -> tuple[Recipe, ...]:
        return (self.source,)

    def compute(self, args: list[Array]) -> Array:
        return args[0].astype(self.to.numpy())

    def to_json(self) -> dict[str, Any]:
        return {"op": "cast", "dtype": self.to.name, "source": self.source.to_json()}


@dataclasses.dataclass(frozen=True)
class Reshape(Recipe):
    """``source.reshape(new_shape)`` with a static shape (ONNX ``Reshape``/``Unsqueeze``/
    ``Squeeze``)."""

    source: Recipe
    new_shape: tuple[int, ...]

    @property
    def dtype(self) -> ir.DataType:
        return self.source.dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return self.new_shape

    def sources(self) -> tuple[Recipe, ...]:
        return (self.source,)

    def compute(self, args: list[Array]) -> Array:
        return args[0].reshape(self.new_shape)

    def to_json(self) -> dict[str, Any]:
        return {"op": "reshape", "shape": list(self.new_shape), "source": self.source.to_json()}


@dataclasses.dataclass(frozen=True)
class _Broadcast(Recipe):
    """An elementwise binary op with broadcasting, both operands of one dtype; floats are
    computed in float64 and rounded once to the dtype (the correctly rounded result)."""

    a: Recipe
    b: Recipe

    #: The JSON ``op`` name.
    _name: ClassVar[str]

    @staticmethod
    def _apply(a: Array, b: Array) -> Array:
        raise NotImplementedError

    @property
    def dtype(self) -> ir.DataType:
        return self.a.dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(int(d) for d in np.broadcast_shapes(self.a.shape, self.b.shape))

    def sources(self) -> tuple[Recipe, ...]:
        return (self.a, self.b)

    def compute(self, args: list[Array]) -> Array:
        a, b = args
        if self.dtype.is_floating_point():
            wide = self._apply(a.astype(np.float64), b.astype(np.float64))
            return wide.astype(self.dtype.numpy())
        return self._apply(a, b).astype(self.dtype.numpy())

    def to_json(self) -> dict[str, Any]:
        return {"op": self._name, "sources": [self.a.to_json(), self.b.to_json()]}


@dataclasses.dataclass(frozen=True)
class Mul(_Broadcast):
    """Elementwise ``a * b`` with broadcasting (ONNX ``Mul``), both of one dtype; floats are
    multiplied in float64 and rounded once to the dtype (the correctly rounded product)."""

    _name = "mul"

    @staticmethod
    def _apply(a: Array, b: Array) -> Array:
        return np.multiply(a, b)


@dataclasses.dataclass(frozen=True)
class Add(_Broadcast):
    """Elementwise ``a + b`` with broadcasting (ONNX ``Add``: Gemma's and Qwen3.5's norm weight
    ``1 + w``), both of one dtype; floats are added in float64 and rounded once."""

    _name = "add"

    @staticmethod
    def _apply(a: Array, b: Array) -> Array:
        return np.add(a, b)


class Function(enum.Enum):
    """The elementwise functions of :class:`Unary` (ONNX ``Cos``, ``Sin``, ``Neg``)."""

    COS = "cos"
    SIN = "sin"
    NEG = "neg"

    def apply(self, array: Array) -> Array:
        """``array`` mapped elementwise, in its dtype."""
        ufunc = {Function.COS: np.cos, Function.SIN: np.sin, Function.NEG: np.negative}[self]
        return np.asarray(ufunc(array)).astype(array.dtype, copy=False)


@dataclasses.dataclass(frozen=True)
class Unary(Recipe):
    """An elementwise function of ``source`` (e.g. the rotary cos/sin caches of a buffer)."""

    source: Recipe
    function: Function

    @property
    def dtype(self) -> ir.DataType:
        return self.source.dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return self.source.shape

    def sources(self) -> tuple[Recipe, ...]:
        return (self.source,)

    def compute(self, args: list[Array]) -> Array:
        return self.function.apply(args[0])

    def to_json(self) -> dict[str, Any]:
        source = self.source.to_json()
        return {"op": "unary", "function": self.function.value, "source": source}


class PackedPart(enum.Enum):
    """Which of ``MatMulNBits``' packed inputs a :class:`Packed` recipe computes."""

    DATA = "data"
    SCALES = "scales"
    ZERO_POINTS = "zero_points"


@dataclasses.dataclass(frozen=True)
class Packed(Recipe):
    """One part of the block quantization of a ``(K, N)`` weight
    (:func:`irkit.weights.packing.quantize_blockwise`): the packed codes, the scales or the
    zero points, laid out as ``MatMulNBits`` reads them. A quantized weight of a weightless model
    is packed per tensor while :func:`irkit.save` streams the checkpoint."""

    source: Recipe
    part: PackedPart
    bits: int
    block_size: int
    symmetric: bool
    method: Method = Method.RTN

    @property
    def dtype(self) -> ir.DataType:
        if self.part is PackedPart.SCALES:
            return self.source.dtype
        return ir.DataType.UINT8

    @property
    def shape(self) -> tuple[int, ...]:
        k, n = self.source.shape
        n_blocks = -(-k // self.block_size)
        if self.part is PackedPart.DATA:
            return (n, n_blocks, self.block_size * self.bits // 8)
        if self.part is PackedPart.SCALES:
            return (n, n_blocks)
        return (n, -(-n_blocks * self.bits // 8))

    def sources(self) -> tuple[Recipe, ...]:
        return (self.source,)

    def compute(
        self, args: list[Array], *, siblings: dict[PackedPart, Array] | None = None
    ) -> Array:
        """This part of the quantization of ``args[0]``; with ``siblings`` (a streamed save:
        :class:`PackCache`) the whole quantization is done and every part of it (this one
        included) is put into ``siblings``: the other parts then cost nothing more."""
        if siblings is None and self.method is Method.RTN and self.part is not PackedPart.DATA:
            # (alone: no codes needed)
            scales, zero_points = rtn_scales(
                args[0],
                bits=self.bits,
                block_size=self.block_size,
                symmetric=self.symmetric,
                dtype=self.source.dtype.numpy(),
            )
            if self.part is PackedPart.SCALES:
                return scales
            if zero_points is not None:
                return zero_points
            raise WeightsError("a symmetric quantization has no zero_points.")
        packed = self.pack(args[0])
        parts = {
            PackedPart.DATA: packed.data,
            PackedPart.SCALES: packed.scales,
            PackedPart.ZERO_POINTS: packed.zero_points,
        }
        if siblings is not None:
            siblings.update({p: v for p, v in parts.items() if v is not None})
        part = parts[self.part]
        if part is None:
            raise WeightsError(f"a symmetric quantization has no {self.part.value}.")
        return part

    def pack(self, weight: Array) -> PackedWeight:
        """The whole quantization of ``weight`` (the source's value, or a narrower float array
        of it that converts exactly, e.g. the float16 checkpoint tensor of a float32 source)
        with these settings."""
        return quantize_blockwise(
            weight,
            bits=self.bits,
            block_size=self.block_size,
            symmetric=self.symmetric,
            method=self.method,
            dtype=self.source.dtype.numpy(),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "op": "packed",
            "part": self.part.value,
            "bits": self.bits,
            "block_size": self.block_size,
            "symmetric": self.symmetric,
            "method": self.method.value,
            "source": self.source.to_json(),
        }


class DerivedTensor(WeightlessTensor):
    """A weightless tensor computed from other tensors by :attr:`recipe` (see the module doc).

    Like every :class:`~irkit.weights.WeightlessTensor` it has no data until saved with
    weights; its recipe is stored in ``metadata_props[DERIVED_KEY]``.

    Args:
        recipe: How the tensor is computed.
        name: The initializer's name.
    """

    __slots__ = ("recipe",)

    def __init__(self, recipe: Recipe, *, name: str | None = None) -> None:
        super().__init__(recipe.dtype, recipe.shape, name=name)
        self.recipe = recipe
        document = {"version": _VERSION, "recipe": recipe.to_json()}
        self.metadata_props[DERIVED_KEY] = json.dumps(document, separators=(",", ":"))

    def __repr__(self) -> str:
        leaves = sorted({leaf.name for leaf in self.recipe.leaves()})
        return f"DerivedTensor<{self.dtype.name},{self.shape}>(name={self.name!r}, from={leaves})"


def has_data(tensor: TensorLike) -> bool:
    """Whether ``tensor`` holds values (not a weightless or derived placeholder)."""
    return not isinstance(tensor, WeightlessTensor)


def as_recipe(tensor: TensorLike) -> Recipe:
    """``tensor`` as a recipe node: a derived tensor's recipe, a weightless leaf, or a constant."""
    if isinstance(tensor, DerivedTensor):
        return tensor.recipe
    if isinstance(tensor, WeightlessTensor):
        shape = tuple(int(d) for d in tensor.shape.numpy())
        return Leaf(tensor.name or "", tensor.dtype, shape, tuple(tensor.aliases))
    if isinstance(tensor, np.ndarray):
        return Constant(tensor, ir.DataType.from_numpy(tensor.dtype))
    return Constant(tensor.numpy(), tensor.dtype)


class PackCache:
    """One quantization per packed weight in a streamed save: the parts (data, scales, zero
    points) of one :class:`Packed` source and settings are separate initializers, each computed
    on its own; with a cache the first part asked for reads and converts the source once,
    quantizes it once, and keeps the sibling parts that are still to be asked for.

    :meth:`expect` counts the parts to come (each derived initializer to be written);
    :meth:`part` hands a kept part over, dropping it once its count is used up. Only parts some
    initializer still expects are kept, so memory holds the pending parts of the weights being
    written (one weight's scales and zero points when, as ``irkit.quantize`` registers them,
    the parts are adjacent initializers), never the model; a part asked for again after its
    count is used up is computed again.
    """

    def __init__(self) -> None:
        self._expected: dict[Packed, dict[PackedPart, int]] = {}
        self._kept: dict[Packed, dict[PackedPart, Array]] = {}

    @staticmethod
    def _key(recipe: Packed) -> Packed:
        return dataclasses.replace(recipe, part=PackedPart.DATA)  # (source and settings)

    def expect(self, recipe: Recipe) -> None:
        """Count the packed parts ``recipe`` will ask for once evaluated."""
        for node in _nodes(recipe):
            if isinstance(node, Packed):
                counts = self._expected.setdefault(self._key(node), {})
                counts[node.part] = counts.get(node.part, 0) + 1

    @property
    def kept_bytes(self) -> int:
        """Bytes of the parts kept for initializers still to come."""
        return sum(v.nbytes for parts in self._kept.values() for v in parts.values())

    def part(self, recipe: Packed, source: Callable[[], Array]) -> Array:
        """``recipe``'s value: kept from an earlier sibling, else computed from ``source()``
        with its siblings (those still expected are kept)."""
        key = self._key(recipe)
        counts = self._expected.get(key, {})
        if counts.get(recipe.part, 0) > 0:
            counts[recipe.part] -= 1
        kept = self._kept.get(key, {})
        if recipe.part in kept:
            value = kept[recipe.part]
            if counts.get(recipe.part, 0) == 0:
                del kept[recipe.part]
                if not kept:
                    del self._kept[key]
            return value
        if not any(counts.values()):  # (nothing else will ask: this part alone)
            return recipe.compute([source()])
        siblings: dict[PackedPart, Array] = {}
        value = recipe.compute([source()], siblings=siblings)
        pending = {p: v for p, v in siblings.items() if counts.get(p, 0) > 0}
        if pending:
            self._kept[key] = pending
        return value


def _nodes(recipe: Recipe) -> Iterator[Recipe]:
    yield recipe
    for source in recipe.sources():
        yield from _nodes(source)


def evaluate(
    recipe: Recipe,
    read: Callable[[Leaf], Array],
    packs: PackCache | None = None,
    *,
    read_stored: Callable[[Leaf], Array] | None = None,
) -> Array:
    """The values of ``recipe``, reading each leaf with ``read`` (C-contiguous); with ``packs``
    each :class:`Packed` node is quantized once for all its parts (see :class:`PackCache`).

    ``read_stored``, if given, reads a leaf as its checkpoint stores it when that converts
    exactly to the leaf's dtype (a float16 tensor for a float32 leaf), else as ``read``: a
    packed weight whose source only moves elements (:class:`Transpose`, :class:`Narrow`,
    :class:`Reshape`, :class:`Concat` of leaves) is quantized from it, each chunk converted on
    its way into the blocks, without a converted copy of the whole tensor (same bytes).

    Memory: the result and the leaves of one subtree; each leaf is released once consumed (a
    concatenation is filled part by part: the result and one part at a time).
    """
    value = _evaluate(recipe, read, packs, read_stored)
    if value.flags.c_contiguous:
        return value
    out = np.empty(value.shape, dtype=value.dtype)
    _assign(out, value)
    return out


def _evaluate(
    recipe: Recipe,
    read: Callable[[Leaf], Array],
    packs: PackCache | None,
    read_stored: Callable[[Leaf], Array] | None,
    packing: bool = False,
) -> Array:
    """``recipe``'s value; ``packing``: for the packer, which takes any layout and dtype
    (:func:`_concat`)."""
    if isinstance(recipe, Leaf):
        return read(recipe)
    if isinstance(recipe, Packed) and packs is not None:
        source = recipe.source
        stored = read_stored is not None and all(isinstance(n, _MOVES) for n in _nodes(source))
        reader = read_stored if stored and read_stored is not None else read
        return packs.part(recipe, lambda: _evaluate(source, reader, packs, read_stored, True))
    if isinstance(recipe, Concat):
        return _concat(recipe, read, packs, read_stored, packing)
    args = [_evaluate(source, read, packs, read_stored, packing) for source in recipe.sources()]
    return recipe.compute(args)


def _concat(
    recipe: Concat,
    read: Callable[[Leaf], Array],
    packs: PackCache | None,
    read_stored: Callable[[Leaf], Array] | None,
    packing: bool,
) -> Array:
    """The concatenation filled part by part: the result and one source read at a time.

    For the packer (``packing``) a ``(K, N)`` concatenation of transposed matrices along ``N``
    (packed Q/K/V, gate/up: ``Linear`` weights stacked) is filled as its transpose, each part a
    contiguous copy of the stored rows, and returned as a view: the packer reads the rows of
    ``Wᵀ`` (no transposed copy); and it keeps the parts' dtype while they all share one (the
    float16 checkpoint tensors of a float32 weight, converted by the packer chunk by chunk),
    else converts to the recipe's dtype.
    """
    rows_first = (
        packing
        and len(recipe.shape) == 2
        and recipe.axis == 1
        and all(isinstance(p, Transpose) and p.perm == (1, 0) for p in recipe.parts)
    )
    shape = recipe.shape[::-1] if rows_first else recipe.shape
    axis = 0 if rows_first else recipe.axis
    out: Array | None = None
    index: list[slice] = [slice(None)] * len(shape)
    start = 0
    for part in recipe.parts:
        value = _evaluate(part, read, packs, read_stored, packing)
        if rows_first:
            value = value.T
        if out is None:
            same = packing and value.dtype.kind == "f"
            out = np.empty(shape, dtype=value.dtype if same else recipe.dtype.numpy())
        elif value.dtype != out.dtype and not np.can_cast(value.dtype, out.dtype, "safe"):
            out = out.astype(recipe.dtype.numpy())  # (parts of several dtypes: the recipe's)
        index[axis] = slice(start, start + value.shape[axis])
        _assign(out[tuple(index)], value)
        start += value.shape[axis]
        del value
    if out is None:
        raise WeightsError("concat: a concatenation of no tensors.")
    return out.T if rows_first else out


_MOVES = (Leaf, Transpose, Narrow, Reshape, Concat)
"""Recipes that only move elements (a :class:`Concat` for the packer keeps its parts' dtype:
:func:`_concat`): over a narrower stored float tensor they give the same values, converted
later."""


_BLOCK = 64  # columns of a transposed copy per step: its source rows stay in the cache


def _assign(out: Array, value: Array) -> None:
    """``out[...] = value``; a transposed 2-D view is copied in blocks of columns (4× faster
    than numpy's element-strided copy for weight-sized matrices)."""
    if value.ndim == 2 and not value.flags.c_contiguous and value.strides[0] < value.strides[1]:
        for start in range(0, value.shape[1], _BLOCK):
            out[:, start : start + _BLOCK] = value[:, start : start + _BLOCK]
    else:
        out[...] = value


def _no_leaf(leaf: Leaf) -> Array:
    raise WeightsError(f"leaf {leaf.name!r} has no data.", [leaf.name])


def _make(recipe: Recipe, inputs: Sequence[TensorLike]) -> ir.TensorProtocol:
    if all(has_data(t) for t in inputs):
        return ir.Tensor(evaluate(recipe, _no_leaf), dtype=recipe.dtype)
    return DerivedTensor(recipe)


def transpose(tensor: TensorLike, perm: Sequence[int]) -> ir.TensorProtocol:
    """``tensor`` transposed by ``perm``: real if ``tensor`` has data, else derived."""
    source = as_recipe(tensor)
    if sorted(perm) != list(range(len(source.shape))):
        raise WeightsError(f"transpose: perm {list(perm)} does not fit shape {source.shape}.")
    return _make(Transpose(source, tuple(int(p) for p in perm)), [tensor])


def concat(tensors: Sequence[TensorLike], axis: int) -> ir.TensorProtocol:
    """``tensors`` concatenated along ``axis``: real if all have data, else derived."""
    parts = tuple(as_recipe(t) for t in tensors)
    rank = len(parts[0].shape) if parts else 0
    if not parts or not -rank <= axis < rank:
        raise WeightsError(f"concat: needs tensors and an axis within their rank, got {axis}.")
    axis %= rank
    for part in parts:
        if part.dtype != parts[0].dtype or len(part.shape) != rank:
            raise WeightsError("concat: the tensors differ in dtype or rank.")
        others = [d for i, d in enumerate(part.shape) if i != axis]
        if others != [d for i, d in enumerate(parts[0].shape) if i != axis]:
            raise WeightsError(f"concat: shapes {[p.shape for p in parts]} differ off axis {axis}.")
    return _make(Concat(parts, axis), tensors)


def narrow(tensor: TensorLike, axis: int, start: int, length: int) -> ir.TensorProtocol:
    """``length`` entries of ``tensor`` from ``start`` along ``axis``: real or derived."""
    source = as_recipe(tensor)
    rank = len(source.shape)
    if not -rank <= axis < rank:
        raise WeightsError(f"narrow: axis {axis} is outside the rank {rank}.")
    axis %= rank
    if start < 0 or length < 0 or start + length > source.shape[axis]:
        raise WeightsError(
            f"narrow: [{start}, {start + length}) does not fit axis {axis} of {source.shape}."
        )
    return _make(Narrow(source, axis, int(start), int(length)), [tensor])


def cast(tensor: TensorLike, dtype: ir.DataType) -> ir.TensorProtocol:
    """``tensor`` converted to ``dtype`` (ONNX ``Cast``): real if it has data, else derived."""
    return _make(Cast(as_recipe(tensor), dtype), [tensor])


def reshape(tensor: TensorLike, shape: Sequence[int]) -> ir.TensorProtocol:
    """``tensor`` reshaped to a static ``shape`` (one ``-1`` allowed): real or derived."""
    source = as_recipe(tensor)
    resolved = reshape_target(source.shape, [int(d) for d in shape], allowzero=1)
    new_shape = tuple(d for d in resolved or () if isinstance(d, int))
    if resolved is None or len(new_shape) != len(resolved):
        raise WeightsError(
            f"reshape: {source.shape} cannot become {list(shape)} (at most one -1, no other "
            "negative dimension, and as many elements as the tensor has)."
        )
    return _make(Reshape(source, new_shape), [tensor])


def _broadcast(kind: type[_Broadcast], tensor: TensorLike, other: TensorLike) -> ir.TensorProtocol:
    a, b = as_recipe(tensor), as_recipe(other)
    name = kind._name
    if a.dtype != b.dtype:
        raise WeightsError(f"{name}: dtypes {a.dtype.name} and {b.dtype.name} differ.")
    try:
        np.broadcast_shapes(a.shape, b.shape)
    except ValueError as exc:
        raise WeightsError(f"{name}: shapes {a.shape} and {b.shape} do not broadcast.") from exc
    return _make(kind(a, b), [tensor, other])


def multiply(tensor: TensorLike, other: TensorLike) -> ir.TensorProtocol:
    """``tensor * other`` with broadcasting, in ``tensor``'s dtype: real or derived."""
    return _broadcast(Mul, tensor, other)


def add(tensor: TensorLike, other: TensorLike) -> ir.TensorProtocol:
    """``tensor + other`` with broadcasting, in ``tensor``'s dtype: real or derived."""
    return _broadcast(Add, tensor, other)


def unary(tensor: TensorLike, function: Function) -> ir.TensorProtocol:
    """``function`` applied to each element of ``tensor``: real or derived."""
    return _make(Unary(as_recipe(tensor), function), [tensor])


def packed_parts(
    weight: TensorLike,
    *,
    bits: int,
    block_size: int,
    symmetric: bool,
    method: Method = Method.RTN,
) -> tuple[ir.TensorProtocol, ir.TensorProtocol, ir.TensorProtocol | None]:
    """``MatMulNBits``' packed data, scales and zero points (``None`` when symmetric) of a
    ``(K, N)`` weight: real tensors if it has data, else derived ones packed while saving."""
    source = as_recipe(weight)
    if len(source.shape) != 2 or source.dtype not in (ir.DataType.FLOAT, ir.DataType.FLOAT16):
        raise WeightsError(
            f"packed_parts: a (K, N) float32/float16 weight is needed, got "
            f"{source.dtype.name}{list(source.shape)}."
        )
    parts = [PackedPart.DATA, PackedPart.SCALES]
    if not symmetric:
        parts.append(PackedPart.ZERO_POINTS)
    if has_data(weight):
        packed = Packed(source, PackedPart.DATA, bits, block_size, symmetric, method).pack(
            evaluate(source, _no_leaf)
        )
        zp = None if packed.zero_points is None else ir.Tensor(packed.zero_points)
        return ir.Tensor(packed.data), ir.Tensor(packed.scales), zp
    made = [DerivedTensor(Packed(source, p, bits, block_size, symmetric, method)) for p in parts]
    return made[0], made[1], made[2] if len(made) > 2 else None


def recipe_from_json(document: str, where: str) -> Recipe:
    """The recipe stored under :data:`DERIVED_KEY` (``where`` names the initializer).

    Raises:
        WeightsError: The text is not a recipe this version of irkit knows.
    """
    try:
        parsed = json.loads(document)
        if parsed.get("version") != _VERSION:
            raise ValueError(f"recipe version {parsed.get('version')!r}, expected {_VERSION}")
        return _parse(parsed["recipe"])
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise WeightsError(
            f"initializer {where!r}: its {DERIVED_KEY} metadata is not a recipe irkit can read "
            f"({type(exc).__name__}: {exc}). Fix: save the model again with this irkit version.",
            [where],
        ) from exc


def _dtype(name: str) -> ir.DataType:
    return ir.DataType[name]


def _parse(node: dict[str, Any]) -> Recipe:
    kind = node["op"]
    if kind == "leaf":
        shape = tuple(int(d) for d in node["shape"])
        aliases = tuple(str(a) for a in node.get("aliases", ()))
        return Leaf(str(node["name"]), _dtype(node["dtype"]), shape, aliases)
    if kind == "const":
        dtype = _dtype(node["dtype"])
        data = np.frombuffer(base64.b64decode(node["data"]), dtype=dtype.numpy())
        return Constant(data.reshape([int(d) for d in node["shape"]]), dtype)
    if kind == "transpose":
        return Transpose(_parse(node["source"]), tuple(int(p) for p in node["perm"]))
    if kind == "concat":
        return Concat(tuple(_parse(s) for s in node["sources"]), int(node["axis"]))
    if kind == "narrow":
        return Narrow(
            _parse(node["source"]), int(node["axis"]), int(node["start"]), int(node["length"])
        )
    if kind == "cast":
        return Cast(_parse(node["source"]), _dtype(node["dtype"]))
    if kind == "reshape":
        return Reshape(_parse(node["source"]), tuple(int(d) for d in node["shape"]))
    if kind == "unary":
        return Unary(_parse(node["source"]), Function(node["function"]))
    if kind in ("mul", "add"):
        a, b = node["sources"]
        return (Mul if kind == "mul" else Add)(_parse(a), _parse(b))
    if kind == "packed":
        return Packed(
            _parse(node["source"]),
            PackedPart(node["part"]),
            int(node["bits"]),
            int(node["block_size"]),
            bool(node["symmetric"]),
            Method(node["method"]),
        )
    raise ValueError(f"unknown recipe op {kind!r}")


def from_marker(tensor: ir.TensorProtocol | None) -> WeightlessTensor | None:
    """The :class:`~irkit.weights.WeightlessTensor` a loaded initializer stands for, if it was
    saved weightless (a :class:`DerivedTensor` if it carries a recipe).

    Raises:
        WeightsError: The stored recipe cannot be read.
    """
    if tensor is None or isinstance(tensor, WeightlessTensor):
        return tensor
    if WEIGHTLESS_KEY not in tensor.metadata_props:
        return None
    recipe = tensor.metadata_props.get(DERIVED_KEY)
    if recipe is not None:
        where = tensor.name or "?"
        return DerivedTensor(recipe_from_json(recipe, where), name=tensor.name)
    return WeightlessTensor(tensor.dtype, list(tensor.shape.numpy()), name=tensor.name)
