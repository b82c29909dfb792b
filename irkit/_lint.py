"""``irkit.lint``: irkit's own invariants over a model, in the spirit of ``torch.fx.Graph.lint``.

The ONNX checker (``irkit.check``) validates the format; lint validates what irkit's stages
promise each other, and says *which* node or value breaks it:

- every graph (main graph, each function body, each If/Loop/Scan body) is in topological order,
  and every value a node uses is produced earlier in that graph, is one of its inputs or
  initializers, or comes from an enclosing graph (no dangling values);
- value names are unique within a graph;
- every node's domain is imported by its graph (or function), every default-domain op exists in
  ONNX, and every node that calls a local function (``irkit.call`` metadata, or a domain that
  only functions use) calls one the model defines;
- every local function is called (unless ``allow_unused_functions``);
- every ``irkit.*`` metadata key is one :mod:`irkit.metadata` defines, and its value decodes.

Lint never modifies the model and needs no torch.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterator

import onnx
import onnx_ir as ir

from irkit import metadata as md
from irkit._irutil import node_subgraphs
from irkit.errors import CheckError, MetadataError

__all__ = ["lint", "lint_problems"]

_STANDARD_DOMAINS = frozenset({"", "ai.onnx", "ai.onnx.ml", "ai.onnx.preview.training"})
_MAX_LISTED = 20

_NODE_KEYS: dict[str, Callable[[str], object] | None] = {
    md.SCOPE: md.decode_scope,
    md.CALL_MODULE: md.decode_call,
    md.REWRITE_SOURCES: md.decode_list,
    md.FX_NODE: None,
    md.FX_TARGET: None,
    md.SOURCE: None,
    md.OUTLINE_NOTE: None,
    md.REWRITE_RULE: None,
}
_FUNCTION_KEYS: dict[str, Callable[[str], object] | None] = {
    md.OUTLINE_ORIGIN: md.decode_scope,
    md.INVOKE_SUBGRAPH: None,
    md.CUSTOM_OP: None,
}
_MODEL_KEYS: dict[str, Callable[[str], object] | None] = {
    md.CALL_SIGNATURES: md.decode_call_signatures
}

GraphLike = ir.Graph | ir.Function


def lint(model: ir.Model, *, allow_unused_functions: bool = False) -> ir.Model:
    """Verify irkit's invariants over ``model`` (see the module docstring). Never modifies it.

    Args:
        model: The model.
        allow_unused_functions: Accept local functions that nothing calls (valid ONNX; left
            behind by ``irkit.rewrite`` with a ``ModuleRule`` until ``irkit.optimize``).

    Returns:
        ``model`` itself, so it can sit between stages.

    Raises:
        CheckError: One or more invariants are broken; ``problems`` lists each one.

    Example:
        >>> import onnx_ir as ir, irkit
        >>> m = ir.from_onnx_text('''
        ...   <ir_version: 10, opset_import: ["" : 21]>
        ...   g (float[2] x) => (float[2] y) { y = Relu(x) }''')
        >>> irkit.lint(m) is m
        True
        >>> m.graph.node(0).metadata_props["irkit.scope"] = "not json"
        >>> irkit.lint(m)
        Traceback (most recent call last):
        ...
        irkit.errors.CheckError: irkit.lint found 1 problem:
          - node '<unnamed>' (Relu) in the main graph: malformed irkit.scope metadata 'not json': ...
    """
    problems = lint_problems(model, allow_unused_functions=allow_unused_functions)
    if problems:
        listed = problems[:_MAX_LISTED]
        more = len(problems) - len(listed)
        lines = [f"irkit.lint found {len(problems)} problem{'s' if len(problems) > 1 else ''}:"]
        lines += [f"  - {p}" for p in listed]
        if more:
            lines.append(f"  ... and {more} more (CheckError.problems lists them all)")
        raise CheckError("\n".join(lines), problems)
    return model


def lint_problems(model: ir.Model, *, allow_unused_functions: bool = False) -> list[str]:
    """The problems :func:`lint` would raise for, one line each (``[]`` if none)."""
    problems: list[str] = []
    _check_keys(model.metadata_props, _MODEL_KEYS, "the model", problems)
    function_domains = {f.domain for f in model.functions.values()} - _STANDARD_DOMAINS
    for graph, where, outer in _graph_likes(model):
        _check_order(graph, where, outer, problems)
        _check_names(graph, where, problems)
        opsets = graph.opset_imports if isinstance(graph, ir.Function) else None
        for node in graph:
            if not all(isinstance(s, str) for s in (node.domain, node.op_type, node.overload)):
                problems.append(f"{_node_where(node, where)}: its op is not valid UTF-8 text.")
                continue
            _check_node(model, node, where, opsets, function_domains, problems)
    for function in model.functions.values():
        _check_keys(function.metadata_props, _FUNCTION_KEYS, _function_where(function), problems)
    if not allow_unused_functions:
        reachable = _reachable(model)
        for key, function in model.functions.items():
            if key not in reachable:
                problems.append(
                    f"{_function_where(function)} is never called. Fix: remove it "
                    "(onnx_ir.passes.common.RemoveUnusedFunctionsPass, or irkit.optimize)."
                )
    return problems


def _function_where(function: ir.Function) -> str:
    return f"function {function.domain}::{function.name}"


def _graph_likes(model: ir.Model) -> Iterator[tuple[GraphLike, str, frozenset[ir.Value]]]:
    """Every graph-like with a description and the values visible from enclosing graphs."""
    yield from _with_subgraphs(model.graph, "the main graph", frozenset())
    for function in model.functions.values():
        yield from _with_subgraphs(function, _function_where(function), frozenset())


def _with_subgraphs(
    graph: GraphLike, where: str, outer: frozenset[ir.Value]
) -> Iterator[tuple[GraphLike, str, frozenset[ir.Value]]]:
    yield graph, where, outer
    visible = outer | _own_values(graph)
    for node in graph:
        for sub in node_subgraphs(node):
            inner = f"{where} > {sub.name or 'a subgraph'} of node {node.name or node.op_type!r}"
            yield from _with_subgraphs(sub, inner, visible)


def _own_values(graph: GraphLike) -> frozenset[ir.Value]:
    values: set[ir.Value] = set(graph.inputs)
    if isinstance(graph, ir.Graph):
        values.update(graph.initializers.values())
    for node in graph:
        values.update(node.outputs)
    return frozenset(values)


def _node_where(node: ir.Node, where: str) -> str:
    return f"node {node.name or '<unnamed>'!r} ({node.op_type}) in {where}"


def _check_order(
    graph: GraphLike, where: str, outer: frozenset[ir.Value], problems: list[str]
) -> None:
    defined: set[ir.Value] = set(graph.inputs)
    if isinstance(graph, ir.Graph):
        defined.update(graph.initializers.values())
    members = set(graph)
    for node in graph:
        for value in node.inputs:
            if value is None or value in defined or value in outer:
                continue
            name = value.name or "<unnamed>"
            producer = value.producer()
            if producer is not None and producer in members:
                problems.append(
                    f"{_node_where(node, where)} uses {name!r} before its producer "
                    f"{producer.name or producer.op_type!r}: not in topological order (or a "
                    "cycle). Fix: graph.sort(), or break the cycle."
                )
            else:
                problems.append(
                    f"{_node_where(node, where)} uses {name!r}, which no node, input or "
                    "initializer of this graph provides (a dangling value)."
                )
        defined.update(node.outputs)
    for value in graph.outputs:
        if value not in defined and value not in outer:
            problems.append(
                f"output {value.name or '<unnamed>'!r} of {where} is not produced in it "
                "(a dangling value)."
            )


def _check_names(graph: GraphLike, where: str, problems: list[str]) -> None:
    counts: collections.Counter[str] = collections.Counter()
    values: list[ir.Value] = list(graph.inputs)
    if isinstance(graph, ir.Graph):
        values.extend(v for v in graph.initializers.values() if v not in graph.inputs)
    for node in graph:
        values.extend(node.outputs)
    counts.update(v.name for v in values if v.name)
    for name, n in counts.items():
        if n > 1:
            problems.append(f"{n} values in {where} are named {name!r}; names must be unique.")


def _check_node(
    model: ir.Model,
    node: ir.Node,
    where: str,
    opsets: dict[str, int] | None,
    function_domains: set[str],
    problems: list[str],
) -> None:
    imports = model.opset_imports if opsets is None else opsets
    domain = node.domain
    if domain not in imports and not (domain == "ai.onnx" and "" in imports):
        problems.append(
            f"{_node_where(node, where)} has domain {domain!r}, which is not in the opset "
            f"imports {sorted(imports)}. Fix: add it to the opset imports."
        )
    if (domain, node.op_type, node.overload) in model.functions:
        pass
    elif md.CALL_MODULE in node.metadata_props or domain in function_domains:
        problems.append(
            f"{_node_where(node, where)} calls function {domain}::{node.op_type} "
            f"(overload {node.overload!r}), which the model does not define. Fix: add the "
            "function, or inline/replace the call."
        )
    elif domain in ("", "ai.onnx") and not onnx.defs.has(node.op_type):
        problems.append(f"{_node_where(node, where)}: {node.op_type!r} is not an ONNX op.")
    _check_keys(node.metadata_props, _NODE_KEYS, _node_where(node, where), problems)


def _check_keys(
    props: dict[str, str],
    known: dict[str, Callable[[str], object] | None],
    where: str,
    problems: list[str],
) -> None:
    for key, value in props.items():
        if not isinstance(key, str) or not isinstance(value, str):
            problems.append(f"{where}: metadata {key!r} is not valid UTF-8 text.")
            continue
        if not key.startswith(md.PREFIX):
            continue
        if key not in known:
            problems.append(f"{where}: unknown metadata key {key!r} (see irkit.metadata).")
            continue
        decode = known[key]
        if decode is None:
            continue
        try:
            decode(value)
        except MetadataError as exc:
            problems.append(f"{where}: {exc}")


def _reachable(model: ir.Model) -> set[ir.OperatorIdentifier]:
    """The functions called from the main graph, directly or through other functions."""
    roots = {
        (n.domain, n.op_type, n.overload) for n in ir.traversal.RecursiveGraphIterator(model.graph)
    }
    stack = [k for k in roots if k in model.functions]
    seen: set[ir.OperatorIdentifier] = set()
    while stack:
        key = stack.pop()
        if key in seen:
            continue
        seen.add(key)
        for n in ir.traversal.RecursiveGraphIterator(model.functions[key]):
            inner = (n.domain, n.op_type, n.overload)
            if inner in model.functions and inner not in seen:
                stack.append(inner)
    return seen
