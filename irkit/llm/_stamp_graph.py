"""Graph pieces of the layer stamp (:func:`irkit.llm._stamp.stamp_layers`): cache names by layer,
the per-layer chains in front of a layer call, and the per-layer outputs of a control-flow node.

A traced program of ``P`` layers reads its cache inputs by name (``past_key_values.N.key``,
``past.N.conv``, ``past.N.recurrent``, … — the formats of :data:`irkit.llm._states.KINDS`),
sometimes through a node or two in the main graph before the layer call (an ``Identity`` copy,
the ``Pad`` of a conv state), and returns some per-layer values to the main graph besides its
cache: the export's choice of each conv layer's held state (one ``If`` over all conv layers,
:func:`irkit.llm._states._settle_held_states`) reads every conv layer's past state, new inputs
and last columns. Stamping layer ``i`` from layer ``r = i mod P`` clones each of those with
layer ``r``'s values replaced by layer ``i``'s.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["cache_name", "clone_chain", "copy_node", "source_chain", "stamp_control_flow"]


@functools.cache
def _patterns() -> tuple[tuple[str, re.Pattern[str]], ...]:
    from irkit.llm._states import KINDS

    formats = dict.fromkeys(f for kind in KINDS for f in (kind.past_format, kind.present_format))
    return tuple(
        (f, re.compile("^" + re.escape(f).replace("%d", r"(\d+)") + r"((?:\.\d+)?)$"))
        for f in formats
    )


def cache_name(name: str | None) -> tuple[str, int, str] | None:
    """``(format, layer, suffix)`` of a cache input or output name (``past.3.conv.1`` →
    ``("past.%d.conv", 3, ".1")``), or ``None`` for any other name."""
    if not name:
        return None
    for pattern, regex in _patterns():
        found = regex.match(name)
        if found:
            return pattern, int(found.group(1)), found.group(2)
    return None


def _is_constant(value: Any) -> bool:
    producer = value.producer()
    return value.is_initializer() or (producer is not None and producer.op_type == "Constant")


def source_chain(value: Any) -> tuple[Any, list[Any]]:
    """The value ``value`` is computed from through a chain of main-graph nodes of one
    non-constant input and one output each (``Pad(past.0.conv, pads)``, ``Identity``), and the
    chain's nodes from that source on (empty where ``value`` is the source). A chain through
    ``Shape`` or ``Size`` computes a size, not a layer's tensor: ``value`` is its own source
    (``Squeeze(Shape(past.2.recurrent))``, the batch size every layer reads)."""
    chain: list[Any] = []
    start = value
    while True:
        node = value.producer()
        if node is not None and node.op_type in ("Shape", "Size"):
            return start, []
        if (
            node is None
            or len(node.outputs) != 1
            or any(a.type.name == "GRAPH" for a in node.attributes.values())
        ):
            return value, chain[::-1]
        live = [v for v in node.inputs if v is not None and not _is_constant(v)]
        if len(live) != 1:
            return value, chain[::-1]
        chain.append(node)
        value = live[0]


def copy_node(
    node: Any, inputs: Sequence[Any], outputs: int, name: str | None = None, **metadata: str
) -> Any:
    """A new node of ``node``'s op, attributes and metadata (``metadata`` replacing some) on
    ``inputs``, with ``outputs`` outputs (unnamed) and ``name`` (default: ``node``'s)."""
    import onnx_ir as ir

    return ir.Node(
        node.domain,
        node.op_type,
        list(inputs),
        attributes=list(node.attributes.values()),
        overload=node.overload,
        num_outputs=outputs,
        name=node.name if name is None else name,
        metadata_props={**node.metadata_props, **metadata},
    )


def _clone(node: Any, inputs: Sequence[Any], layer: int) -> Any:
    clone = copy_node(
        node, inputs, len(node.outputs), f"{node.name}.{layer}" if node.name else None
    )
    for out, old in zip(clone.outputs, node.outputs, strict=True):
        out.name = f"{old.name}.{layer}"
        out.shape, out.type = old.shape, old.type
    return clone


def clone_chain(chain: Sequence[Any], source: Any, layer: int) -> tuple[list[Any], Any]:
    """``chain`` (of :func:`source_chain`) again from ``source``: its nodes and last value."""
    nodes, value = [], source
    for node in chain:
        inputs = [value if v is not None and not _is_constant(v) else v for v in node.inputs]
        clone = _clone(node, inputs, layer)
        nodes.append(clone)
        value = clone.outputs[0]
    return nodes, value


def _graphs(node: Any) -> list[Any]:
    return [a.as_graph() for a in node.attributes.values() if a.type.name == "GRAPH"]


def _cone(graph: Any, value: Any) -> set[int]:
    """The ids of ``graph``'s nodes ``value`` is computed from (within ``graph``)."""
    seen: set[int] = set()
    stack = [value]
    while stack:
        node = stack.pop().producer()
        if node is None or node.graph is not graph or id(node) in seen:
            continue
        seen.add(id(node))
        stack.extend(v for v in node.inputs if v is not None)
    return seen


def _stamp_branch_output(
    graph: Any, value: Any, subst: Mapping[int, Any], layer: int, refuse: Callable[[str], Any]
) -> Any:
    """``value`` (an output of subgraph ``graph``) computed again with the outer values
    ``subst`` replaces: the nodes of its cone that read them (transitively) are cloned at the
    end of ``graph``; the others are shared. Returns the clone of ``value``."""
    cone = _cone(graph, value)
    new: dict[int, Any] = {}
    for node in list(graph):
        if id(node) not in cone:
            continue
        if not any(v is not None and (id(v) in subst or id(v) in new) for v in node.inputs):
            continue
        if _graphs(node):
            raise refuse(f"{node.op_type} {node.name!r} in a branch holds a subgraph")
        inputs = [None if v is None else new.get(id(v), subst.get(id(v), v)) for v in node.inputs]
        clone = _clone(node, inputs, layer)
        graph.append(clone)
        new.update({id(o): c for o, c in zip(node.outputs, clone.outputs, strict=True)})
    if id(value) not in new:
        raise refuse(f"branch output {value.name!r} does not depend on its layer's values")
    return new[id(value)]


def stamp_control_flow(
    graph: Any,
    node: Any,
    layers: Mapping[int, tuple[int, Mapping[int, Any]]],
    refuse: Callable[[str], Any],
) -> list[Any]:
    """Give a main-graph control-flow node (the held conv states' ``If``) the outputs of the
    stamped layers.

    Each output of ``node`` must be a graph output named for a cache layer ``r``; for each
    stamped layer ``i`` (``layers[i] = (r, subst)``, ``subst`` mapping the ids of layer ``r``'s
    main-graph values to layer ``i``'s), every branch computes layer ``r``'s outputs again
    from layer ``i``'s values, as new outputs after the old ones. ``node`` is replaced by a copy
    with those outputs (the branches are edited in place), its old outputs keep their uses.

    Returns:
        The new outputs, named ``present…`` for layer ``i``, in the order of ``layers`` and of
        ``node``'s outputs.
    """

    named = [cache_name(out.name) for out in node.outputs]
    if any(n is None for n in named) or not all(out in graph.outputs for out in node.outputs):
        raise refuse(f"{node.op_type} {node.name!r} has outputs other than cache outputs")
    branches = _graphs(node)
    added: list[tuple[str, int, str, Any, Any]] = []  # format, layer, suffix, shape, type
    for i, (r, subst) in sorted(layers.items()):
        for j, found in enumerate(named):
            fmt, layer, suffix = found  # type: ignore[misc]
            if layer != r:
                continue
            for branch in branches:
                clone = _stamp_branch_output(branch, branch.outputs[j], subst, i, refuse)
                branch.outputs.append(clone)
            old = node.outputs[j]
            added.append((fmt, i, suffix, old.shape, old.type))
    if not added:
        return []
    copy = copy_node(node, node.inputs, len(node.outputs) + len(added))
    old_outputs = list(node.outputs)
    for out, old in zip(copy.outputs, old_outputs, strict=False):
        out.name, out.shape, out.type = old.name, old.shape, old.type
    news = list(copy.outputs[len(old_outputs) :])
    for out, (fmt, i, suffix, shape, type_) in zip(news, added, strict=True):
        out.name, out.shape, out.type = fmt % i + suffix, shape, type_
    graph.insert_after(node, [copy])
    for old, out in zip(old_outputs, copy.outputs, strict=False):
        name = old.name
        old.replace_all_uses_with(out, replace_graph_outputs=True)
        old.name, out.name = None, name
    graph.remove(node, safe=True)
    return news
