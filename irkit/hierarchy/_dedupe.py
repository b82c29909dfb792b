"""Structural identity of function bodies, for sharing one function among identical calls.

Two bodies are identical when they have the same ops (domain, type, overload), attributes
(tensor attributes by content), wiring, and input/output/intermediate types and shapes, in the
same node order. Names and metadata are ignored. The canonical form (:func:`canonical_key`, a
nested tuple of strings and ints) renumbers every value by where it is defined (function inputs
first, then each node's outputs in order), so it is exact and linear in the body size; it is
the key of a dict (hashed once, confirmed by tuple equality). That catches the common case
(identical layers emitted in one order).

When the exact text misses, bodies emitted in a *different node order* (after rewrites, say)
are found through networkx: the body as a labelled DiGraph, bucketed by its
Weisfeiler-Lehman hash, confirmed by an isomorphism (``DiGraphMatcher``) whose mapping tells
how to permute the call's inputs and outputs onto the existing function's parameters.
"""

from __future__ import annotations

import dataclasses
import hashlib
import warnings
from collections import Counter
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    import networkx as nx

import onnx_ir as ir

from irkit.hierarchy._analysis import SUBGRAPH_OPS, used_outside

__all__ = [
    "canonical_key",
    "remember_entries",
    "region_key",
    "CanonicalKey",
    "body_graph",
    "FunctionRegistry",
    "Match",
    "node_captures",
]


_TENSOR = ir.AttributeType.TENSOR
_TENSORS = ir.AttributeType.TENSORS
_BY_VALUE = frozenset(  # value is hashable and compares like its text (not floats: -0.0, nan)
    {ir.AttributeType.INT, ir.AttributeType.INTS, ir.AttributeType.STRING, ir.AttributeType.STRINGS}
)
_KIND = {k: f":{k.value}=" for k in ir.AttributeType}

CanonicalKey = tuple[object, ...]
"""The hashable, name-free form of a body (see :func:`canonical_key`)."""


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
    return f"{attr.name}{_KIND[kind]}{attr.value!r}"


def _tensor_key(tensor: ir.TensorProtocol) -> tuple[object, ...]:
    """``(dtype, dims, content)`` of a tensor attribute: small contents as they are (no text
    formatting, no digest: most are reshape targets and scalars), larger ones by their SHA-1."""
    data = tensor.tobytes()
    return (
        tensor.dtype,
        tensor.shape.dims,
        data if len(data) <= 256 else hashlib.sha1(data).digest(),
    )


def _attribute_key(name: str, attr: ir.Attr) -> tuple[object, ...]:
    """``(name, kind, value)`` for ints, strings and tensors (by content), else ``(name, text)``."""
    kind = attr.type
    if attr.ref_attr_name is not None:
        return (name, _attr_text(attr))
    if kind in _BY_VALUE:
        return (name, kind, attr.value)
    if kind is _TENSOR:
        return (name, kind, _tensor_key(attr.value))
    if kind is _GRAPH:
        return (name, kind, _graph_key(attr.value)[0])
    if kind is _GRAPHS:
        return (name, kind, tuple(_graph_key(g)[0] for g in attr.value))
    return (name, _attr_text(attr))


_GRAPH = ir.AttributeType.GRAPH
_GRAPHS = ir.AttributeType.GRAPHS


def _graph_key(graph: ir.Graph) -> tuple[CanonicalKey, list[ir.Value]]:
    """A name-free key of a subgraph (an ``If`` branch, a ``Loop`` body), and what it captures.

    Numbered like :func:`canonical_key`; a value the subgraph reads from an enclosing graph is
    numbered ``("c", k)`` in order of first read, and returned as capture ``k``: the enclosing
    key wires those (:func:`node_captures`), so two bodies match only if they capture the same
    values at the same places.
    """
    ids: dict[ir.Value | None, object] = {v: i for i, v in enumerate(graph.inputs)}
    ids[None] = -1
    captures: list[ir.Value] = []

    def number(value: ir.Value | None) -> object:
        found = ids.get(value)
        if found is None:
            found = ids[value] = ("c", len(captures))
            captures.append(value)  # type: ignore[arg-type]
        return found

    parts: list[object] = [tuple([_type_key(v) for v in graph.inputs])]
    count = len(graph.inputs)
    for node in graph:
        reads = (
            [*node.inputs, *node_captures(node)] if node.op_type in SUBGRAPH_OPS else node.inputs
        )
        wiring = tuple([number(v) for v in reads])
        for out in node.outputs:
            ids[out] = count
            count += 1
        parts.append((*_node_entry(node), wiring))
    parts.append(tuple([number(v) for v in graph.outputs]))
    return tuple(parts), captures


def node_captures(node: ir.Node) -> list[ir.Value]:
    """The values ``node``'s subgraphs read from outside ``node``, in the order its key numbers
    them (attributes by name, then first read); repeated once per subgraph that reads them."""
    captured: list[ir.Value] = []
    for name in sorted(node.attributes):
        attr = node.attributes[name]
        if attr.type is _GRAPH:
            captured.extend(_graph_key(attr.value)[1])
        elif attr.type is _GRAPHS:
            for graph in attr.value:
                captured.extend(_graph_key(graph)[1])
    return captured


def _attributes_key(attributes: dict[str, ir.Attr]) -> tuple[object, ...]:
    """:func:`_attribute_key` of each attribute, sorted by name."""
    if len(attributes) == 1:  # (most nodes: no list, no sort)
        [(name, attr)] = attributes.items()
        return (_attribute_key(name, attr),)
    return tuple(sorted([_attribute_key(name, attr) for name, attr in attributes.items()]))


def _type_key(value: ir.Value) -> tuple[object, object]:
    """``(dtype, dims)`` of a tensor value (TensorType hashes via its repr: key on the dtype)."""
    vtype, shape = value.type, value.shape
    return (
        vtype.dtype if vtype.__class__ is ir.TensorType else vtype,
        None if shape is None else shape.dims,
    )


def _node_entry(node: ir.Node) -> tuple[object, ...]:
    """``(domain, op_type, overload, attributes, output (dtype, dims))`` of a node."""
    attributes = node.attributes.data  # (UserDict: the plain dict iterates much faster)
    outputs = node.outputs
    return (
        node.domain,
        node.op_type,
        node.overload,
        _attributes_key(attributes) if attributes else (),
        (_type_key(outputs[0]),) if len(outputs) == 1 else tuple(map(_type_key, outputs)),
    )


def canonical_key(
    inputs: Sequence[ir.Value],
    nodes: Sequence[ir.Node],
    outputs: Sequence[ir.Value],
    memo: Mapping[ir.Node, tuple[object, ...]] | None = None,
) -> CanonicalKey:
    """A name-free, hashable form of a function body (see the module docstring).

    Values are numbered where they are defined: input ``i`` is ``i``, then each node's outputs
    get the next numbers; a missing optional input is ``-1``. Each node contributes
    ``(domain, op_type, overload, attributes, output (dtype, dims), input numbers, label)``;
    the label is ``None`` here (:func:`region_key` fills it).

    Args:
        inputs: The body's inputs (numbered ``0, 1, …`` in this order).
        nodes: The body's nodes, in order.
        outputs: The body's outputs.
        memo: Wiring-free parts (op, attributes, output types) already computed for some of the
            nodes (:func:`remember_entries`): a call's children are keyed after its flat key.

    Example:
        >>> x = ir.Value(name="x", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([2]))
        >>> n = ir.Node("", "Relu", [x])
        >>> canonical_key([x], [n], n.outputs)
        (((FLOAT, (2,)),), ('', 'Relu', '', (), ((None, None),), (0,), None), (1,))
    """
    ids: dict[ir.Value | None, int] = {v: i for i, v in enumerate(inputs)}
    ids[None] = -1
    idget = ids.get
    parts: list[object] = [tuple([_type_key(v) for v in inputs])]
    count = len(inputs)
    known = memo.get if memo else None
    for node in nodes:
        for out in node.outputs:
            ids[out] = count
            count += 1
        fixed = known(node) if known else None
        if fixed is None:
            fixed = _node_entry(node)
        reads = (
            [*node.inputs, *node_captures(node)] if node.op_type in SUBGRAPH_OPS else node.inputs
        )
        parts.append((*fixed, tuple([idget(v, -2) for v in reads]), None))
    parts.append(tuple([idget(v, -2) for v in outputs]))
    return tuple(parts)


def region_key(
    nodes: Sequence[ir.Node], region: AbstractSet[ir.Node], labels: Sequence[object]
) -> tuple[CanonicalKey, list[ir.Value], list[tuple[ir.Node, int]], list[ir.Value]]:
    """:func:`canonical_key` of a region, finding its boundary on the way (one pass).

    ``nodes`` (the members of ``region``) must be in a topological order: then a value not
    numbered yet when a node reads it comes from outside. Such values are the region's inputs,
    numbered ``-2, -3, …`` in order of first use (their types close the key); outputs are the
    values used outside or graph outputs, in node order. The key has the layout of
    :func:`canonical_key` (entries ``key[1:-1]``); keys of both kinds never meet.

    Returns:
        ``(key, inputs, input_uses, outputs)``; ``input_uses`` lists each ``(node, index)``
        that reads an input.
    """
    ids: dict[ir.Value | None, int] = {None: -1}
    idget = ids.get
    inputs: list[ir.Value] = []
    input_uses: list[tuple[ir.Node, int]] = []
    outputs: list[ir.Value] = []
    parts: list[object] = []
    count = 0
    for k, node in enumerate(nodes):
        wiring = []
        for i, value in enumerate(node.inputs):
            number = idget(value)
            if number is None:
                number = ids[value] = -2 - len(inputs)
                if value is not None:  # (always: None is in ids)
                    inputs.append(value)
            if number < -1:
                input_uses.append((node, i))
            wiring.append(number)
        for value in node.outputs:
            ids[value] = count
            count += 1
            if used_outside(value, region):
                outputs.append(value)
        parts.append((*_node_entry(node), tuple(wiring), labels[k]))
    key = (
        tuple([_type_key(v) for v in inputs]),
        *parts,
        tuple([ids[v] for v in outputs]),
    )
    return key, inputs, input_uses, outputs


def remember_entries(
    key: CanonicalKey, nodes: Sequence[ir.Node], memo: dict[ir.Node, tuple[object, ...]]
) -> None:
    """Fill ``memo`` (see :func:`canonical_key`) with the wiring-free part of each node's entry
    in ``key``, a key computed for ``nodes``: their sub-bodies are then keyed without
    recomputing them."""
    for node, entry in zip(nodes, key[1:-1], strict=True):
        memo[node] = entry[:5]  # type: ignore[index]


def body_graph(
    inputs: Sequence[ir.Value], nodes: Sequence[ir.Node], outputs: Sequence[ir.Value]
) -> nx.DiGraph:
    """The body as a labelled :class:`networkx.DiGraph` for order-insensitive comparison.

    Nodes: ``("in", i)`` (label: type), ``("n", k)`` (label: op, attributes, output types),
    ``("out", m)`` (label ``out``). Edges carry the ports they connect (``"0>1"``: output 0 into
    input 1). Input and output *positions* are not labels, so an isomorphism may permute them.
    """
    import networkx as nx  # (imported on use: keeps `import irkit` fast)

    g = nx.DiGraph()
    source: dict[ir.Value, tuple[tuple[str, int], int]] = {}
    for i, v in enumerate(inputs):
        g.add_node(("in", i), label=f"in {v.type}{v.shape}")
        source[v] = (("in", i), 0)
    for k, node in enumerate(nodes):
        attrs = sorted(_attr_text(a) for a in node.attributes.values())
        types = " ".join(f"{v.type}{v.shape}" for v in node.outputs)
        g.add_node(("n", k), label=f"{node.domain}:{node.op_type}:{node.overload}{attrs}>{types}")
        for j, v in enumerate(node.outputs):
            source[v] = (("n", k), j)
        for j, used in enumerate(node.inputs):
            if used is not None:
                _add_port(g, *source[used], ("n", k), str(j))
    for m, v in enumerate(outputs):
        g.add_node(("out", m), label="out")
        _add_port(g, *source[v], ("out", m), "o")
    for _, _, data in g.edges(data=True):
        data["ports"] = ",".join(sorted(data["ports"]))
    return g


def _add_port(
    g: nx.DiGraph, src: tuple[str, int], out: int, dst: tuple[str, int], port: str
) -> None:
    if g.has_edge(src, dst):
        g.edges[src, dst]["ports"].append(f"{out}>{port}")
    else:
        g.add_edge(src, dst, ports=[f"{out}>{port}"])


def _match(existing: nx.DiGraph, new: nx.DiGraph) -> dict[tuple[str, int], tuple[str, int]] | None:
    """An isomorphism existing → new respecting labels and ports, or None."""
    import networkx as nx

    matcher = nx.algorithms.isomorphism.DiGraphMatcher(
        existing,
        new,
        node_match=lambda a, b: a["label"] == b["label"],
        edge_match=lambda a, b: a["ports"] == b["ports"],
    )
    return dict(matcher.mapping) if matcher.is_isomorphic() else None


def _wl_hash(graph: nx.DiGraph) -> str:
    import networkx as nx

    with warnings.catch_warnings():
        # networkx 3.5 changed directed hashes; irkit compares them within one run only.
        warnings.filterwarnings("ignore", message="The hashes produced for directed graphs")
        return str(nx.weisfeiler_lehman_graph_hash(graph, node_attr="label", edge_attr="ports"))


@dataclasses.dataclass
class Match:
    """A function to reuse and how the new call's inputs/outputs map onto its parameters.

    ``inputs[i]`` is the index (in the new body's order) of the value to pass as the function's
    input ``i``; ``outputs[m]`` the index of the new body's output that function output ``m`` is.
    """

    function: ir.Function
    inputs: list[int]
    outputs: list[int]


def _bag(key: CanonicalKey) -> Counter[object]:
    """What a canonical key says regardless of node order: input types, node entries without
    their wiring, and the number of outputs."""
    *entries, outputs = cast("tuple[tuple[object, ...], ...]", key[1:])
    bag: Counter[object] = Counter([e[:5] + e[6:] for e in entries])
    bag.update([("input", t) for t in cast("tuple[object, ...]", key[0])])
    bag[("outputs", len(outputs))] += 1
    return bag


class FunctionRegistry:
    """Functions created so far, by ``(domain, name)`` of their class and by canonical key.

    :meth:`find` returns an existing structurally identical function; :meth:`find_isomorphic`
    one whose body differs only in node order; :meth:`next_name` gives the function name for a
    new, different body of the same class: the class name for the first, then ``<class>_1``,
    ``<class>_2`` … in creation order (deterministic). A name suffix, not the ONNX ``overload``
    field: onnxruntime 1.31 resolves calls *inside function bodies* by ``domain:name`` only and
    binds the wrong overload (checked in tests/hierarchy).

    The labelled graphs for the isomorphism test are built lazily, only for classes that get a
    body that misses the exact key while a function of that class exists.
    """

    def __init__(self) -> None:
        self._by_key: dict[tuple[str, str, CanonicalKey], ir.Function] = {}
        self._count: dict[tuple[str, str], int] = {}
        self._functions: dict[tuple[str, str], list[tuple[CanonicalKey, ir.Function]]] = {}
        self._bags: dict[ir.Function, Counter[object]] = {}
        self._graphs: dict[ir.Function, tuple[str, nx.DiGraph]] = {}

    def find(self, domain: str, name: str, key: CanonicalKey) -> ir.Function | None:
        """An existing function of the class whose body's canonical key is ``key``."""
        return self._by_key.get((domain, name, key))

    def find_isomorphic(
        self,
        domain: str,
        name: str,
        key: CanonicalKey,
        inputs: Sequence[ir.Value],
        nodes: Sequence[ir.Node],
        outputs: Sequence[ir.Value],
    ) -> Match | None:
        """An existing function of the class whose body is this one (canonical ``key``) up to
        node order.

        Candidates have the same multiset of input types and node entries (:func:`_bag`) and
        share the Weisfeiler-Lehman hash of :func:`body_graph`; an isomorphism confirms them.
        """
        registered = self._functions.get((domain, name))
        if not registered:
            return None
        same_size = [(k, f) for k, f in registered if len(k) == len(key)]  # (node count)
        if not same_size:
            return None
        bag = _bag(key)
        candidates = [f for k, f in same_size if self._bag_of(f, k) == bag]
        if not candidates:
            return None
        graph = body_graph(inputs, nodes, outputs)
        wl = _wl_hash(graph)
        for function in candidates:
            candidate_wl, candidate = self._graph(function)
            if candidate_wl != wl:
                continue
            mapping = _match(candidate, graph)
            if mapping is not None:
                return Match(
                    function,
                    [mapping[("in", i)][1] for i in range(len(function.inputs))],
                    [mapping[("out", m)][1] for m in range(len(function.outputs))],
                )
        return None

    def _bag_of(self, function: ir.Function, key: CanonicalKey) -> Counter[object]:
        found = self._bags.get(function)
        if found is None:
            found = self._bags[function] = _bag(key)
        return found

    def _graph(self, function: ir.Function) -> tuple[str, nx.DiGraph]:
        found = self._graphs.get(function)
        if found is None:
            graph = body_graph(function.inputs, list(function), function.outputs)
            found = self._graphs[function] = (_wl_hash(graph), graph)
        return found

    def next_name(self, domain: str, name: str) -> str:
        n = self._count.get((domain, name), 0)
        return name if n == 0 else f"{name}_{n}"

    def add(self, domain: str, name: str, function: ir.Function, key: CanonicalKey | None) -> None:
        """Register ``function`` as a body of class ``name``; ``key`` ``None``: only take its name
        (a function that was there before, which is never reused)."""
        self._count[(domain, name)] = self._count.get((domain, name), 0) + 1
        if key is not None:
            self._by_key.setdefault((domain, name, key), function)
            self._functions.setdefault((domain, name), []).append((key, function))
