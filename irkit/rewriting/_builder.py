"""The replacement builder: the ``op`` a rule's ``rewrite`` function receives.

A fresh :class:`RewriteBuilder` is made for every application of a rule, so no state is kept on
rule objects and there is no "current builder" global. It records the nodes it creates; the
engine inserts them into the graph (or function body) being rewritten.

>>> import onnx_ir as ir
>>> b = RewriteBuilder()
>>> x = ir.val("x", ir.DataType.FLOAT, [2, 3])
>>> y = b.Gelu(x, approximate="tanh")
>>> [n.op_type for n in b.nodes], y.producer().attributes["approximate"].value
(['Gelu'], 'tanh')
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx_ir as ir

from irkit.errors import RewriteError

__all__ = ["RewriteBuilder", "weight_constant"]


class _OpCall:
    __slots__ = ("_builder", "_domain", "_op_type")

    def __init__(self, builder: RewriteBuilder, domain: str, op_type: str):
        self._builder = builder
        self._domain = domain
        self._op_type = op_type

    def __call__(
        self,
        *inputs: ir.Value | None,
        _outputs: int = 1,
        _overload: str = "",
        _version: int | None = None,
        **attributes: Any,
    ) -> Any:
        node = self._builder.node(
            self._domain,
            self._op_type,
            inputs,
            attributes,
            num_outputs=_outputs,
            overload=_overload,
            version=_version,
        )
        return node.outputs[0] if _outputs == 1 else tuple(node.outputs)


class _DomainView:
    __slots__ = ("_builder", "_domain")

    def __init__(self, builder: RewriteBuilder, domain: str):
        self._builder = builder
        self._domain = domain

    def __getattr__(self, op_type: str) -> _OpCall:
        if op_type.startswith("_"):
            raise AttributeError(op_type)
        return _OpCall(self._builder, self._domain, op_type)


class RewriteBuilder:
    """Creates replacement nodes: ``op.Gemm(a, b, c, transB=1)``, ``op.domain("com.ms").X(a)``.

    Reserved keywords on op calls: ``_outputs`` (number of outputs; a tuple is returned when
    > 1), ``_overload`` (function overload) and ``_version`` (op version). Other keywords are
    attributes (Python values; ``None`` values are dropped).

    Attributes:
        nodes: The nodes created so far, in creation order.
        domains: Domains used by the created nodes (the engine adds them to the opset imports).
    """

    def __init__(self) -> None:
        self.nodes: list[ir.Node] = []
        self.domains: set[str] = set()

    def domain(self, domain: str) -> _DomainView:
        """Ops of another domain (custom ops, contrib ops, function calls)."""
        return _DomainView(self, "" if domain == "ai.onnx" else domain)

    def __getattr__(self, op_type: str) -> _OpCall:
        if op_type.startswith("_"):
            raise AttributeError(op_type)
        return _OpCall(self, "", op_type)

    def node(
        self,
        domain: str,
        op_type: str,
        inputs: Sequence[ir.Value | None],
        attributes: dict[str, Any] | None = None,
        *,
        num_outputs: int = 1,
        overload: str = "",
        version: int | None = None,
    ) -> ir.Node:
        """Create a node (any domain, any number of outputs) and record it."""
        for i, value in enumerate(inputs):
            if value is not None and not isinstance(value, ir.Value):
                raise RewriteError(
                    f"input {i} of {op_type} is {type(value).__name__}, not an ir.Value. "
                    "Fix: make constants with op.const(numpy_array)."
                )
        inputs = list(inputs)
        while inputs and inputs[-1] is None:  # trailing absent optional inputs are omitted
            inputs.pop()
        attrs = ir.convenience.convert_attributes(
            {k: v for k, v in (attributes or {}).items() if v is not None}
        )
        node = ir.Node(
            domain,
            op_type,
            inputs,
            attrs,
            num_outputs=num_outputs,
            overload=overload,
            version=version,
        )
        self.nodes.append(node)
        self.domains.add(domain)
        return node

    def const(self, value: Any, dtype: np.dtype | type | None = None) -> ir.Value:
        """A constant as a ``Constant`` node (valid in graphs and in function bodies alike).

        Args:
            value: Anything ``numpy.asarray`` accepts. Give ``dtype`` or a typed array: a plain
                Python float would silently become float64.
            dtype: Optional numpy dtype to convert to.
        """
        array = np.asarray(value, dtype=dtype)
        tensor = ir.tensor(array)
        out: ir.Value = self.Constant(value=tensor)
        out.type = ir.TensorType(tensor.dtype)
        out.shape = ir.Shape(array.shape)
        out.const_value = tensor
        return out


def weight_constant(op: RewriteBuilder, tensor: ir.TensorProtocol) -> ir.Value:
    """A ``Constant`` holding ``tensor`` (real or derived) made with a rule's builder ``op``;
    ``irkit.optimize`` lifts it to an initializer."""
    out: ir.Value = op.Constant(value=tensor)
    out.type = ir.TensorType(tensor.dtype)
    out.shape = ir.Shape(tuple(int(d) for d in tensor.shape.numpy()))
    out.const_value = tensor
    return out
