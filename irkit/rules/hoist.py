"""Layer-invariant nodes out of the layer functions, computed once in the main graph.

A hierarchical model calls one function per layer (``LlamaDecoderLayer`` → ``LlamaAttention``)
with the layer's weights and the same model-wide values (``attention_mask``, the rotary
``cos``/``sin``, the mask the model built). Work a function does on those values alone, say
``Where(mask, 0, -inf)`` or ``Slice(cos, 0, 32)`` or ``GroupQueryAttention``'s ``seqlens_k``
from ``attention_mask``, is the same in every layer: onnxruntime inlines the functions and runs it
once a layer.

:func:`hoist_invariants` moves such nodes to the main graph: a function input is *bound* to a
main-graph value when every call of the function (through every caller, up to the main graph)
passes that value; a node of a function the model runs more than once, of standard op (no function call, no subgraph, no random op, no
reference attribute) whose inputs are bound values, constants or outputs of such nodes, with at
least one bound, is cloned into the main graph, and the function reads its value from a new
input (threaded through the callers) instead. Functions called inside a control-flow subgraph
are left alone. Clones of equal computations from different functions (a sliding-window and a
full-attention layer function both derive ``seqlens_k`` from ``attention_mask``) are then merged
(:func:`irkit.rewriting.cse`).
"""

from __future__ import annotations

from collections.abc import Iterator

import onnx_ir as ir

from irkit.errors import RewriteError
from irkit.rewriting import cse

__all__ = ["Threader", "hoist_invariants"]

FunctionKey = tuple[str, str, str]
_Owner = FunctionKey | None  # None: the main graph
Source = tuple["FunctionKey | None", ir.Value]  # a value and the graph it lives in


def _calls(
    model: ir.Model,
) -> tuple[dict[FunctionKey, list[tuple[_Owner, ir.Node]]], set[FunctionKey]]:
    """Each function's call sites (owner, node) and the functions called inside a subgraph."""
    calls: dict[FunctionKey, list[tuple[_Owner, ir.Node]]] = {k: [] for k in model.functions}
    nested: set[FunctionKey] = set()
    owners: list[tuple[_Owner, ir.Graph | ir.Function]] = [(None, model.graph)]
    owners += list(model.functions.items())
    for owner, graph in owners:
        top = graph.graph if isinstance(graph, ir.Function) else graph
        for node in ir.traversal.RecursiveGraphIterator(graph):
            key = (node.domain, node.op_type, node.overload)
            if key not in calls:
                continue
            if node.graph is not top:
                nested.add(key)
            else:
                calls[key].append((owner, node))
    return calls, nested


class Threader:
    """Where each function input comes from, and values threaded into functions.

    An input of function ``F`` is *bound* to ``(owner, value)`` when every call of ``F``
    passes ``value`` of graph ``owner`` (None: the main graph; else a function), through
    inputs of the functions in between: ``F`` computes on one value of ``owner`` however many
    times ``owner`` calls it.

    Args:
        model: The model (its functions' inputs and call sites are extended in place).
    """

    def __init__(self, model: ir.Model) -> None:
        self.model = model
        self.calls, self.nested = _calls(model)
        self.bound: dict[FunctionKey, dict[int, Source]] = {}  # id(formal) → its source
        self._formals: dict[tuple[FunctionKey, _Owner, int], ir.Value] = {}
        self._runs: dict[FunctionKey, int] = {}
        for key in model.functions:
            self._bind(key)

    def runs(self, key: _Owner) -> int:
        """How many times a run of the model runs ``key`` (None: the main graph; 0: a
        function called inside control flow)."""
        if key is None:
            return 1
        if key not in self._runs:
            self._runs[key] = 0  # no recursion in ONNX functions; guards a malformed model
            if key not in self.nested:
                self._runs[key] = sum(self.runs(owner) for owner, _ in self.calls[key])
        return self._runs[key]

    def _bind(self, key: FunctionKey) -> dict[int, Source]:
        """The source of each of ``key``'s inputs that every call passes."""
        if key in self.bound:
            return self.bound[key]
        found: dict[int, Source] = {}
        self.bound[key] = found
        function = self.model.functions[key]
        sites = self.calls.get(key, [])
        if not sites or key in self.nested:
            return found
        for i, formal in enumerate(function.inputs):
            sources: set[tuple[_Owner, int]] = set()
            source: Source | None = None
            for owner, node in sites:
                actual = node.inputs[i] if i < len(node.inputs) else None
                source = self.source(owner, actual)
                if source is None:
                    break
                sources.add((source[0], id(source[1])))
            if source is not None and len(sources) == 1:
                found[id(formal)] = source
                self._formals.setdefault((key, source[0], id(source[1])), formal)
        return found

    def source(self, owner: _Owner, value: ir.Value | None) -> Source | None:
        """Where ``value`` (of graph ``owner``) comes from: a bound input's source, else
        ``(owner, value)``; None for a missing input."""
        if value is None:
            return None
        if owner is not None:
            found = self._bind(owner).get(id(value))
            if found is not None:
                return found
        return owner, value

    def formal(self, key: _Owner, source: Source, name: str, like: ir.Value) -> ir.Value:
        """The value inside ``key`` (None: the main graph) that is ``source``: its value in
        its own graph, an input bound to it, else a new input named ``name`` typed like
        ``like`` (and so on up every caller to ``source``'s graph)."""
        owner, value = source
        if key == owner:
            return value
        if key is None:
            raise RewriteError(
                f"hoist: {value.name!r} of function {owner!r} is not reachable from the main "
                "graph; thread only values the callers bind (Threader.bound)"
            )
        found = self._formals.get((key, owner, id(value)))
        if found is not None:
            return found
        function = self.model.functions[key]
        position = len(function.inputs)
        formal = ir.Value(name=name, type=like.type, shape=like.shape)
        function.inputs.append(formal)
        self._formals[(key, owner, id(value))] = formal
        self._bind(key)[id(formal)] = source
        for caller, node in self.calls[key]:
            actual = self.formal(caller, source, name, like)
            node.resize_inputs(position + 1)
            node.replace_input_with(position, actual)
        return formal


def _constant(node: ir.Node) -> bool:
    return (
        node.op_type == "Constant"
        and node.domain == ""
        and not node.inputs
        and not any(a.is_ref() for a in node.attributes.values())
    )


def _movable(model: ir.Model, node: ir.Node) -> bool:
    if (node.domain, node.op_type, node.overload) in model.functions:
        return False  # a function call: its body is hoisted on its own
    if "Random" in node.op_type or node.op_type in ("Dropout", "Multinomial"):
        return False
    return not any(a.is_ref() or a.type in _GRAPH_ATTRS for a in node.attributes.values())


_GRAPH_ATTRS = (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS)


def _clone(node: ir.Node, inputs: list[ir.Value | None], prefix: str) -> ir.Node:
    """A copy of ``node`` on ``inputs``, its outputs named ``prefix`` + their name."""
    attributes = [ir.Attr(a.name, a.type, a.value) for a in node.attributes.values()]
    clone = ir.Node(
        node.domain,
        node.op_type,
        inputs,
        attributes,
        overload=node.overload,
        num_outputs=len(node.outputs),
        version=node.version,
        name=f"{prefix}{node.name}",
    )
    for i, (new, old) in enumerate(zip(clone.outputs, node.outputs, strict=True)):
        new.name = f"{prefix}{old.name or i}"
        new.type, new.shape = old.type, old.shape
    return clone


def _invariant(
    model: ir.Model, threader: Threader, key: FunctionKey
) -> Iterator[tuple[ir.Node, _Owner]]:
    """The nodes of function ``key`` that compute on bound inputs of one graph ``owner`` that
    runs less often, and constants, alone; with ``owner``."""
    function = model.functions[key]
    runs = threader.runs(key)
    known: dict[int, _Owner] = {}  # id(value) → the graph it can be computed in
    for formal in function.inputs:
        source = threader.bound.get(key, {}).get(id(formal))
        if source is not None and threader.runs(source[0]) < runs:
            known[id(formal)] = source[0]
    constant: set[int] = set()
    outputs = {id(v) for v in function.outputs}
    for node in function:
        if _constant(node):
            constant.update(id(o) for o in node.outputs)
            continue
        if not _movable(model, node) or any(id(o) in outputs for o in node.outputs):
            continue
        ins = [v for v in node.inputs if v is not None]
        owners = {known[id(v)] for v in ins if id(v) in known}
        deeper = owners - {None}  # the main graph's values reach every function
        if owners and len(deeper) <= 1 and all(id(v) in known or id(v) in constant for v in ins):
            owner = next(iter(deeper), None)
            known.update((id(o), owner) for o in node.outputs)
            yield node, owner


def hoist_invariants(model: ir.Model) -> int:
    """Move every function's layer-invariant nodes (module docstring) to the graph that
    holds what they read (the main graph, or a function the model runs fewer times).

    Args:
        model: A hierarchical model (changed in place).

    Returns:
        How many nodes left the functions.
    """
    threader = Threader(model)
    moved = 0
    touched: dict[_Owner, ir.Graph | ir.Function] = {}
    for count, key in enumerate(list(model.functions)):
        function = model.functions[key]
        found = list(_invariant(model, threader, key))
        if not found:
            continue
        prefix = f"hoist/{count}/{function.name}/"
        bound = threader.bound.get(key, {})
        there: dict[int, ir.Value] = {}  # id(value in the function) → its clone
        constants: dict[tuple[_Owner, int], ir.Value] = {}
        target = {id(node): owner for node, owner in found}
        for node, owner in found:
            graph = model.graph if owner is None else model.functions[owner]
            touched[owner] = graph
            inputs: list[ir.Value | None] = []
            for v in node.inputs:
                if v is None:
                    inputs.append(None)
                elif id(v) in there:  # a clone's output, in ``owner`` or the main graph
                    source = (target[id(v.producer())], there[id(v)])
                    inputs.append(threader.formal(owner, source, f"hoisted.{v.name}", v))
                elif id(v) in bound:  # an input of the function: its value in ``owner``
                    inputs.append(threader.formal(owner, bound[id(v)], f"hoisted.{v.name}", v))
                elif (owner, id(v)) in constants:
                    inputs.append(constants[(owner, id(v))])
                elif (producer := v.producer()) is not None:  # a constant of the function
                    copy = _clone(producer, [], f"{prefix}{owner is None}/")
                    graph.append(copy)
                    constants[(owner, id(v))] = copy.outputs[0]
                    inputs.append(copy.outputs[0])
                else:
                    inputs.append(None)  # unreachable: _invariant checked every input
            clone = _clone(node, inputs, prefix)
            graph.append(clone)
            imports = model.opset_imports if owner is None else graph.opset_imports
            if node.domain not in imports:  # e.g. com.microsoft, used only in the layers so far
                imports[node.domain] = function.opset_imports.get(node.domain, 1)
            there.update((id(o), c) for o, c in zip(node.outputs, clone.outputs, strict=True))
        for node, owner in found:
            for out in node.outputs:
                readers = [u for u in out.uses() if id(u.node) not in target]
                if readers:
                    formal = threader.formal(
                        key, (owner, there[id(out)]), f"hoisted.{out.name}", out
                    )
                    for use in readers:
                        use.node.replace_input_with(use.idx, formal)
        for node in reversed(list(function)):
            dead = (id(node) in target or _constant(node)) and not any(
                o.uses() or o.is_graph_output() for o in node.outputs
            )
            if dead:
                function.remove(node, safe=True)
                moved += id(node) in target
    for graph in touched.values():
        _drop_dead(graph)
        graph.sort()
    if moved:  # functions that computed the same (a windowed and a full layer's seqlens_k): once
        cse(model)
    return moved


def _drop_dead(graph: ir.Graph | ir.Function) -> None:
    """Remove the hoisted nodes that nothing reads (outputs only read in their function, all
    of whose readers moved too)."""
    for node in reversed(list(graph)):
        if str(node.name).startswith("hoist/") and not any(
            o.uses() or o.is_graph_output() for o in node.outputs
        ):
            graph.remove(node, safe=True)
