"""Small onnx-ir helpers that several stages share (one home each; no torch, no other stage).

>>> fresh_name("x", {"x", "x_1"}), fresh_name("y", set()), fresh_name("y", set(), keep=False)
('x_2', 'y', 'y_1')
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import onnx_ir as ir

__all__ = [
    "fresh_name",
    "node_subgraphs",
    "nested_subgraphs",
    "const_tensor",
    "node_attributes",
]


def fresh_name(base: str, taken: set[str], *, sep: str = "_", keep: bool = True) -> str:
    """A name not in ``taken`` (which it is then added to): ``base``, else ``base<sep>k``.

    Args:
        base: The wanted name.
        taken: Names in use; updated.
        sep: Between ``base`` and the counter (``"_"``; call nodes use ``"#"``).
        keep: Return ``base`` itself when it is free; ``False`` always adds a counter.
    """
    if keep and base not in taken:
        result = base
    else:
        k = 1
        while f"{base}{sep}{k}" in taken:
            k += 1
        result = f"{base}{sep}{k}"
    taken.add(result)
    return result


def node_subgraphs(node: ir.Node) -> list[ir.Graph]:
    """The graphs ``node`` owns (the bodies of If/Loop/Scan, any graph attribute)."""
    graphs: list[ir.Graph] = []
    for attr in node.attributes.values():
        if attr.type == ir.AttributeType.GRAPH:
            graphs.append(attr.value)
        elif attr.type == ir.AttributeType.GRAPHS:
            graphs.extend(attr.value)
    return graphs


def nested_subgraphs(graph_like: ir.Graph | ir.Function) -> Iterator[ir.Graph]:
    """Every subgraph under ``graph_like``, inner before outer (post-order)."""
    for node in graph_like:
        for graph in node_subgraphs(node):
            yield from nested_subgraphs(graph)
            yield graph


def const_tensor(value: ir.Value | None) -> ir.TensorProtocol | None:
    """The constant tensor held by ``value`` (initializer or ``Constant`` output), with data or
    weightless, else None."""
    if value is None:
        return None
    if value.const_value is not None:
        return value.const_value
    producer = value.producer()
    if producer is None or producer.op_type != "Constant" or producer.domain != "":
        return None
    return ir.convenience.get_const_tensor(value)


def node_attributes(node: ir.Node) -> dict[str, Any]:
    """``node``'s attributes as ``{name: value}``, e.g. to carry them onto a replacement node.

    Example:
        >>> node_attributes(ir.node("Softmax", [ir.val("x")], {"axis": -1}))
        {'axis': -1}
    """
    return {a.name: a.value for a in node.attributes.values()}
