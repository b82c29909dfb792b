"""The pattern language: what a rewrite rule looks for.

A pattern is a small expression tree written with the op builder :data:`op`, over *pattern
variables* (:func:`var`), constants (:class:`Const`, or plain Python numbers), alternatives
(:func:`either`, which can bind the index of the alternative that matched) and optional inputs
(:func:`optional`):

>>> x = var("x")
>>> print(op.Mul(x, op.Sigmoid(x)))
Mul(x, Sigmoid(x))
>>> print(op.Div(x, 2.0))
Div(x, 2.0)
>>> print(op.domain("com.microsoft").FusedMatMul(x, x, alpha=attr("alpha")))
com.microsoft::FusedMatMul(x, x, alpha=?alpha)

Patterns are immutable data: building one has no side effect and needs no graph. The matcher
(:mod:`irkit.rewriting._match`) matches them against ``onnx_ir`` values.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from irkit.errors import RuleDefinitionError

__all__ = [
    "Pattern",
    "Var",
    "Const",
    "Either",
    "OptionalInput",
    "NodePattern",
    "NodeOutput",
    "AttrVar",
    "PatternBuilder",
    "op",
    "var",
    "attr",
    "either",
    "optional",
    "COMMUTATIVE_OPS",
]

COMMUTATIVE_OPS = frozenset(
    {
        "Add",
        "Mul",
        "Max",
        "Min",
        "And",
        "Or",
        "Xor",
        "Equal",
        "BitwiseAnd",
        "BitwiseOr",
        "BitwiseXor",
        "Sum",
        "Mean",
    }
)
"""Default-domain ops whose two inputs the matcher tries in either order."""


class Pattern:
    """Base class of value patterns (what one input or output of a node must look like).

    Arithmetic operators build ONNX op patterns, so a pattern reads like the identity it matches:
    ``a + b`` is ``op.Add(a, b)``, ``a - b`` ``op.Sub``, ``a * b`` ``op.Mul``, ``a / b``
    ``op.Div``, ``a @ b`` ``op.MatMul``, ``a ** b`` ``op.Pow`` and ``-a`` ``op.Neg``; a Python
    number on either side becomes a :class:`Const`. ``Add`` and ``Mul`` match their inputs in
    either order (as ``op.Add`` / ``op.Mul`` do); association is as written, so list the other
    groupings with :func:`either`.

    >>> x = var("x")
    >>> print(0.5 * x * (1 + op.Erf(x / 1.4142135)))
    Mul(Mul(0.5, x), Add(1, Erf(Div(x, 1.4142135))))
    """

    __slots__ = ()

    def variables(self) -> Iterator[str]:
        """Names bound by this pattern (values and captured attributes), with repeats."""
        return iter(())

    def __add__(self, other: object) -> NodeOutput:
        return _binary("Add", self, other)

    def __radd__(self, other: object) -> NodeOutput:
        return _binary("Add", other, self)

    def __sub__(self, other: object) -> NodeOutput:
        return _binary("Sub", self, other)

    def __rsub__(self, other: object) -> NodeOutput:
        return _binary("Sub", other, self)

    def __mul__(self, other: object) -> NodeOutput:
        return _binary("Mul", self, other)

    def __rmul__(self, other: object) -> NodeOutput:
        return _binary("Mul", other, self)

    def __truediv__(self, other: object) -> NodeOutput:
        return _binary("Div", self, other)

    def __rtruediv__(self, other: object) -> NodeOutput:
        return _binary("Div", other, self)

    def __matmul__(self, other: object) -> NodeOutput:
        return _binary("MatMul", self, other)

    def __rmatmul__(self, other: object) -> NodeOutput:
        return _binary("MatMul", other, self)

    def __pow__(self, other: object) -> NodeOutput:
        return _binary("Pow", self, other)

    def __rpow__(self, other: object) -> NodeOutput:
        return _binary("Pow", other, self)

    def __neg__(self) -> NodeOutput:
        result: NodeOutput = _OpFactory("", "Neg")(self)
        return result


def _binary(op_type: str, left: object, right: object) -> NodeOutput:
    """``op.<op_type>(left, right)`` (the default-domain op, commutative if the op is)."""
    result: NodeOutput = _OpFactory("", op_type)(left, right)
    return result


@dataclasses.dataclass(frozen=True, eq=False)
class Var(Pattern):
    """A pattern variable: matches any value and binds it to ``name``.

    The same name used twice must match the same value (``op.Mul(x, x)`` is a square).
    """

    name: str

    def variables(self) -> Iterator[str]:
        yield self.name

    def __str__(self) -> str:
        return self.name


@dataclasses.dataclass(frozen=True, eq=False)
class Const(Pattern):
    """A constant: matches an initializer or ``Constant`` output equal to ``value`` (within tolerance).

    A scalar pattern matches tensors of rank 0, and rank-1 tensors with one element (those
    broadcast like a scalar against any input of rank ≥ 1).

    Attributes:
        value: The expected value (scalar or array).
        rtol: Relative tolerance.
        atol: Absolute tolerance.
    """

    value: Any
    rtol: float = 1e-5
    atol: float = 1e-7

    def __str__(self) -> str:
        arr = np.asarray(self.value)
        if arr.ndim == 0:
            return repr(arr.item())
        return f"Const({arr.tolist()!r})"


@dataclasses.dataclass(frozen=True, eq=False)
class Either(Pattern):
    """Alternatives: the first alternative that matches wins (later ones are tried on backtrack).

    Variables bound only in some alternatives are bound to ``None`` when another one matched.

    Attributes:
        alternatives: The patterns, in the order they are tried.
        tag: If set, a variable bound to the index of the alternative that matched (``None``
            when an enclosing alternative without this ``either`` matched). The same tag used
            twice must choose the same index.
    """

    alternatives: tuple[Pattern, ...]
    tag: str | None = None

    def variables(self) -> Iterator[str]:
        if self.tag is not None:
            yield self.tag
        for alt in self.alternatives:
            yield from alt.variables()

    def __str__(self) -> str:
        return _either_text([str(a) for a in self.alternatives], self.tag)


def _either_text(alternatives: Sequence[str], tag: str | None) -> str:
    suffix = "" if tag is None else f", tag={tag}"
    return "either(" + " | ".join(alternatives) + suffix + ")"


@dataclasses.dataclass(frozen=True, eq=False)
class OptionalInput(Pattern):
    """An optional input: matches an absent input (its variables bind ``None``) or ``inner``."""

    inner: Pattern

    def variables(self) -> Iterator[str]:
        yield from self.inner.variables()

    def __str__(self) -> str:
        return f"{self.inner}?"


@dataclasses.dataclass(frozen=True)
class AttrVar:
    """Captures an attribute's value under ``name`` (``None`` if absent and without default)."""

    name: str

    def __str__(self) -> str:
        return f"?{self.name}"


@dataclasses.dataclass(frozen=True, eq=False)
class NodePattern:
    """One node of a pattern.

    Attributes:
        domain: Operator domain (``""`` for ONNX, ``"com.microsoft"``, or a function's domain).
        op_type: Operator type or function name.
        inputs: One pattern per input; ``None`` matches an absent input only.
        attributes: Attribute name → required value or :class:`AttrVar`. Attributes not listed
            may have any value unless ``exact_attributes``.
        num_outputs: How many outputs the pattern uses (extra node outputs must be unused).
        commutative: Try the two inputs in either order.
        exact_attributes: Reject nodes carrying attributes not listed in ``attributes``.
        name: If set, a variable bound to the node's (single) output, so a check can read an
            intermediate value of the match (its shape, its dtype) by name.
    """

    domain: str
    op_type: str
    inputs: tuple[Pattern | None, ...]
    attributes: Mapping[str, Any]
    num_outputs: int = 1
    commutative: bool = False
    exact_attributes: bool = False
    name: str | None = None

    @property
    def outputs(self) -> tuple[NodeOutput, ...]:
        return tuple(NodeOutput(self, i) for i in range(self.num_outputs))

    def variables(self) -> Iterator[str]:
        for p in self.inputs:
            if p is not None:
                yield from p.variables()
        for a in self.attributes.values():
            if isinstance(a, AttrVar):
                yield a.name
        if self.name is not None:
            yield self.name

    @property
    def qualified_name(self) -> str:
        return f"{self.domain}::{self.op_type}" if self.domain else self.op_type

    def __str__(self) -> str:
        args = ["_" if p is None else str(p) for p in self.inputs]
        args += [f"{k}={_attr_text(v)}" for k, v in self.attributes.items()]
        return _named(f"{self.qualified_name}({', '.join(args)})", self.name)


def _named(text: str, name: str | None) -> str:
    return text if name is None else f"{text} as {name}"


@dataclasses.dataclass(frozen=True, eq=False)
class NodeOutput(Pattern):
    """Output ``index`` of a :class:`NodePattern` (what ``op.X(...)`` returns)."""

    node: NodePattern
    index: int = 0

    def variables(self) -> Iterator[str]:
        return self.node.variables()

    def __str__(self) -> str:
        text = str(self.node)
        return text if self.node.num_outputs == 1 else f"{text}[{self.index}]"


def _attr_text(value: Any) -> str:
    return str(value) if isinstance(value, AttrVar) else repr(value)


def as_pattern(value: Any) -> Pattern | None:
    """Coerce a builder argument: patterns pass through, numbers and arrays become :class:`Const`."""
    if value is None or isinstance(value, Pattern):
        return value
    if isinstance(value, (bool, int, float, np.ndarray, np.generic, list, tuple)):
        return Const(np.asarray(value) if not isinstance(value, (int, float)) else value)
    raise RuleDefinitionError(
        f"cannot use {value!r} ({type(value).__name__}) in a pattern. Fix: use a pattern "
        "variable (var), an op pattern, a number or a numpy array."
    )


class _OpFactory:
    __slots__ = ("_domain", "_op_type")

    def __init__(self, domain: str, op_type: str):
        self._domain = domain
        self._op_type = op_type

    def __call__(
        self,
        *inputs: Any,
        _outputs: int = 1,
        _commute: bool | None = None,
        _exact_attributes: bool = False,
        _name: str | None = None,
        **attributes: Any,
    ) -> Any:
        commutative = (
            _commute
            if _commute is not None
            else (self._domain == "" and self._op_type in COMMUTATIVE_OPS and len(inputs) == 2)
        )
        if _name is not None and (not _name or _outputs != 1):
            raise RuleDefinitionError(
                f"op.{self._op_type}(..., _name={_name!r}): a name binds the one output of a "
                "node. Fix: give a non-empty name, to an op pattern with one output."
            )
        node = NodePattern(
            self._domain,
            self._op_type,
            tuple(as_pattern(i) for i in inputs),
            dict(attributes),
            _outputs,
            commutative,
            _exact_attributes,
            _name,
        )
        return node.outputs[0] if _outputs == 1 else node.outputs


class PatternBuilder:
    """Builds :class:`NodePattern`\\ s: ``op.Mul(a, b)``, ``op.domain("com.microsoft").Gelu(x)``.

    Keyword arguments are attribute patterns (a literal value, or :func:`attr` to capture).
    Reserved keywords: ``_outputs`` (number of outputs; a tuple is returned when > 1),
    ``_commute`` (override the commutativity of the op), ``_exact_attributes`` and ``_name``
    (a variable bound to the node's output: ``op.Expand(x, e, _name="expanded")``).
    The builder is stateless: the module-level :data:`op` is safe to share.
    """

    __slots__ = ("_domain",)

    def __init__(self, domain: str = ""):
        self._domain = "" if domain == "ai.onnx" else domain

    def domain(self, domain: str) -> PatternBuilder:
        """A builder for ops (or function calls) of another domain."""
        return PatternBuilder(domain)

    def __getattr__(self, op_type: str) -> _OpFactory:
        if op_type.startswith("_"):
            raise AttributeError(op_type)
        return _OpFactory(self._domain, op_type)


op = PatternBuilder()
"""The default pattern builder (ONNX domain)."""


def var(name: str) -> Var:
    """A pattern variable named ``name``."""
    return Var(name)


def attr(name: str) -> AttrVar:
    """Capture an attribute's value under ``name``: ``op.Transpose(x, perm=attr("perm"))``."""
    return AttrVar(name)


def either(*alternatives: Any, tag: str | None = None) -> Either:
    """Match any one of ``alternatives`` (tried in order).

    Args:
        alternatives: Two or more patterns (numbers become constants).
        tag: Name of a variable bound to the index of the alternative that matched, so that a
            check or rewrite knows which form it got instead of guessing it from which
            variables are ``None``.

    Raises:
        RuleDefinitionError: Fewer than two alternatives, or an empty tag.

    Example:
        >>> x, s = var("x"), var("s")
        >>> scaled = either(x * s, x / s, tag="divided")
        >>> print(scaled)
        either(Mul(x, s) | Div(x, s), tag=divided)
        >>> list(dict.fromkeys(scaled.variables()))
        ['divided', 'x', 's']
    """
    if len(alternatives) < 2:
        raise RuleDefinitionError(
            f"either() needs at least two alternatives, got {len(alternatives)}. Fix: pass the "
            "pattern itself when there is only one."
        )
    if tag is not None and not tag:
        raise RuleDefinitionError("either(tag=...) needs a non-empty variable name")
    return Either(tuple(as_pattern(a) for a in alternatives), tag)  # type: ignore[misc]


def optional(inner: Any) -> OptionalInput:
    """An input that may be absent; when present it must match ``inner``."""
    return OptionalInput(as_pattern(inner))  # type: ignore[arg-type]


def root_nodes(outputs: Sequence[Pattern]) -> list[NodePattern]:
    """The distinct node patterns producing ``outputs`` (each output must be a NodeOutput)."""
    roots: list[NodePattern] = []
    for o in outputs:
        if isinstance(o, NodeOutput) and o.node not in roots:
            roots.append(o.node)
    return roots


def anchor_ops(pattern: Pattern) -> set[tuple[str, str]] | None:
    """``(domain, op_type)`` pairs a pattern's root can have; ``None`` if any node may match."""
    if isinstance(pattern, NodeOutput):
        return {(pattern.node.domain, pattern.node.op_type)}
    if isinstance(pattern, Either):
        result: set[tuple[str, str]] = set()
        for alt in pattern.alternatives:
            sub = anchor_ops(alt)
            if sub is None:
                return None
            result |= sub
        return result
    return None


def pattern_text(outputs: Sequence[Pattern]) -> str:
    """Print a pattern; sub-patterns used more than once are named once (``where t1 = ...``).

    >>> x = var("x")
    >>> d = op.Sub(x, op.ReduceMean(x))
    >>> print(pattern_text([op.Div(d, op.Sqrt(op.ReduceMean(op.Mul(d, d))))]))
    Div(t1, Sqrt(ReduceMean(Mul(t1, t1)))) where t1 = Sub(x, ReduceMean(x))
    """
    counts: dict[int, int] = {}

    def count(p: Pattern | None) -> None:
        if isinstance(p, NodeOutput):
            counts[id(p.node)] = counts.get(id(p.node), 0) + 1
            if counts[id(p.node)] == 1:
                for i in p.node.inputs:
                    count(i)
        elif isinstance(p, Either):
            for a in p.alternatives:
                count(a)
        elif isinstance(p, OptionalInput):
            count(p.inner)

    for o in outputs:
        count(o)
    names: dict[int, str] = {}
    lets: list[str] = []

    def text(p: Pattern | None, top: bool = False) -> str:
        if p is None:
            return "_"
        if isinstance(p, NodeOutput):
            key = id(p.node)
            if key in names:
                return names[key] if p.node.num_outputs == 1 else f"{names[key]}[{p.index}]"
            n = p.node
            args = [text(i) for i in n.inputs]
            args += [f"{k}={_attr_text(v)}" for k, v in n.attributes.items()]
            body = _named(f"{n.qualified_name}({', '.join(args)})", n.name)
            if counts.get(key, 0) > 1 and not top:
                names[key] = f"t{len(names) + 1}"
                lets.append(f"{names[key]} = {body}")
                return names[key] if n.num_outputs == 1 else f"{names[key]}[{p.index}]"
            return body if n.num_outputs == 1 else f"{body}[{p.index}]"
        if isinstance(p, Either):
            return _either_text([text(a) for a in p.alternatives], p.tag)
        if isinstance(p, OptionalInput):
            return f"{text(p.inner)}?"
        return str(p)

    body = ", ".join(text(o, top=True) for o in outputs)
    if len(outputs) > 1:
        body = f"({body})"
    return body + (f" where {', '.join(lets)}" if lets else "")
