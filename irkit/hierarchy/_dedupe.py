"""Structural identity of function bodies, for sharing one function among identical calls.

Two bodies are identical when they have the same ops (domain, type, overload), attributes
(tensor attributes by content), wiring, and input/output/intermediate types and shapes, in the
same node order. Names and metadata are ignored. The canonical form renumbers every value by
where it is defined (function input ``i3``, output 1 of body node 7 ``7.1``), so it is exact and
linear in the body size; bodies are bucketed by a hash of it and confirmed by comparing the
full canonical text. (A Weisfeiler-Lehman hash would also match bodies whose nodes are ordered
differently, but it is a heuristic that needs the same confirmation and costs more; the bodies
irkit compares come from one lowering and share their node order.)
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import onnx_ir as ir

__all__ = ["canonical_text", "FunctionRegistry"]


_TENSOR = ir.AttributeType.TENSOR
_TENSORS = ir.AttributeType.TENSORS


def _attr_text(attr: ir.Attr) -> str:
    if attr.is_ref():
        return f"{attr.name}=@{attr.ref_attr_name}"
    kind = attr.type
    if kind is _TENSOR:
        tensor = attr.value  # (not as_tensor(): its protocol isinstance check is slow)
        digest = hashlib.sha1(tensor.tobytes()).hexdigest()
        return f"{attr.name}=T({tensor.dtype},{tensor.shape},{digest})"
    if kind is _TENSORS:
        parts = [hashlib.sha1(t.tobytes()).hexdigest() for t in attr.value]
        return f"{attr.name}=Ts({parts})"
    return f"{attr.name}:{kind.value}={attr.value!r}"


def canonical_text(
    inputs: Sequence[ir.Value],
    nodes: Sequence[ir.Node],
    outputs: Sequence[ir.Value],
    type_texts: dict[object, str] | None = None,
) -> str:
    """A name-free serialization of a function body (see the module docstring).

    Args:
        inputs: The body's inputs (``i0``, ``i1`` … in this order).
        nodes: The body's nodes, in order.
        outputs: The body's outputs.
        type_texts: A cache of type texts, shared across calls for speed.

    Example:
        >>> x = ir.Value(name="x", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([2]))
        >>> n = ir.Node("", "Relu", [x])
        >>> canonical_text([x], [n], n.outputs).splitlines()[1]
        ':Relu:(i0)>None?'
    """
    cache = {} if type_texts is None else type_texts

    def type_text(v: ir.Value) -> str:
        shape, vtype = v.shape, v.type  # (TensorType hashes via repr: key on class + dtype)
        key = (
            v.dtype if vtype.__class__ is ir.TensorType else vtype,
            None if shape is None else shape.dims,
        )
        text = cache.get(key)
        if text is None:
            text = cache[key] = f"{v.type}{'?' if shape is None else shape}"
        return text

    ids: dict[ir.Value, str] = {v: f"i{i}" for i, v in enumerate(inputs)}
    lines = [" ".join([type_text(v) for v in inputs])]
    for k, node in enumerate(nodes):
        outs = node.outputs
        refs = ",".join(["" if v is None else ids.get(v, "?") for v in node.inputs])
        attributes = node.attributes
        attrs = sorted([_attr_text(a) for a in attributes.values()]) if attributes else ""
        types = " ".join([type_text(v) for v in outs])
        lines.append(f"{node.domain}:{node.op_type}:{node.overload}({refs}){attrs}>{types}")
        for j, out in enumerate(outs):
            ids[out] = f"{k}.{j}"
    lines.append("out " + ",".join([ids.get(v, "?") for v in outputs]))
    return "\n".join(lines)


class FunctionRegistry:
    """Functions created so far, bucketed by ``(domain, name)`` and body hash.

    :meth:`find` returns an existing structurally identical function; :meth:`next_name` gives
    the function name for a new, different body of the same class: the class name for the first,
    then ``<class>_1``, ``<class>_2`` … in creation order (deterministic). A name suffix, not the
    ONNX ``overload`` field: onnxruntime 1.31 resolves calls *inside function bodies* by
    ``domain:name`` only and binds the wrong overload (checked in tests/hierarchy).
    """

    def __init__(self) -> None:
        self.type_texts: dict[object, str] = {}  # cache for canonical_text
        self._buckets: dict[tuple[str, str, str], list[tuple[str, ir.Function]]] = {}
        self._count: dict[tuple[str, str], int] = {}

    def find(self, domain: str, name: str, text: str) -> ir.Function | None:
        key = (domain, name, hashlib.sha256(text.encode()).hexdigest())
        for candidate_text, function in self._buckets.get(key, ()):
            if candidate_text == text:
                return function
        return None

    def next_name(self, domain: str, name: str) -> str:
        n = self._count.get((domain, name), 0)
        return name if n == 0 else f"{name}_{n}"

    def add(self, domain: str, name: str, function: ir.Function, text: str) -> None:
        """Register ``function`` as the body ``text`` of class ``name`` in ``domain``."""
        key = (domain, name, hashlib.sha256(text.encode()).hexdigest())
        self._buckets.setdefault(key, []).append((text, function))
        self._count[(domain, name)] = self._count.get((domain, name), 0) + 1
