"""The stable machine-readable form (schema ``irkit.viz/2``, documented in docs/viz.md)."""

from __future__ import annotations

import json
from collections import Counter

import onnx_ir as ir

from irkit.viz import _flops, _scopes
from irkit.viz._summary import Call, ModelSummary, TensorInfo, numel_bytes

__all__ = ["SCHEMA", "to_json_data", "render_json"]

SCHEMA = "irkit.viz/2"


def _tensor(info: TensorInfo) -> dict[str, object]:
    return {
        "name": info.name,
        "dtype": info.dtype,
        "shape": None if info.shape is None else list(info.shape),
    }


def _histogram(ops: Counter[str]) -> dict[str, int]:
    return {k: ops[k] for k in sorted(ops)}


def _call(call: Call, scopes: _scopes.ScopeNode | None = None) -> dict[str, object]:
    """One CALL entry; for a flat root, ``scopes`` gives its children from ``irkit.scope``."""
    origin = "graph" if call.node is None else "function"
    if call.subgraph is not None:
        origin = "subgraph"
    data: dict[str, object] = {
        "path": call.path,
        "class": call.cls,
        "origin": origin,
        "function": None if call.node is None or call.subgraph else call.body.key,
        "node_name": None if call.node is None else call.node.name,
        "part": None if call.part is None else list(call.part),
        "nodes": call.body.node_count,
        "params": call.params,
        "param_bytes": call.param_bytes,
        "flops": call.body.flops.to_json(),
        "outputs": [_tensor(o) for o in call.outputs],
        "children": [_call(c) for c in call.children],
    }
    if scopes is not None:
        graph = call.body.graph  # (the main graph: scopes are those of a flat model)
        weights = graph.initializers.values() if isinstance(graph, ir.Graph) else ()
        params = {v: numel_bytes(v) for v in weights}
        data["children"] = [_scope(s, params) for s in scopes.children.values()]
    return data


def _scope(node: _scopes.ScopeNode, params: dict[ir.Value, tuple[int, int]]) -> dict[str, object]:
    """A module call of a flat model, from the ``irkit.scope`` of the nodes it ran."""
    inside = set(node.members)
    used = {v for n in node.members for v in n.inputs if v is not None and v in params}
    flops, shapes = _flops.Flops(), _flops.ShapeTracker()
    outputs = []
    for n in node.members:
        flops += shapes.flops(n)
        outputs += [
            v
            for v in n.outputs
            if v.is_graph_output() or any(use.node not in inside for use in v.uses())
        ]
    return {
        "path": node.path,
        "class": node.cls,
        "origin": "scope",
        "function": None,
        "node_name": None,
        "part": None,
        "nodes": node.nodes,
        "params": sum(params[v][0] for v in used),
        "param_bytes": sum(params[v][1] for v in used),
        "flops": flops.to_json(),
        "outputs": [_tensor(TensorInfo.of(v)) for v in outputs],
        "children": [_scope(c, params) for c in node.children.values()],
    }


def _flat_scopes(summary: ModelSummary) -> _scopes.ScopeNode | None:
    if summary.root.children:
        return None
    return _scopes.scope_tree(summary.model.graph)


def to_json_data(summary: ModelSummary) -> dict[str, object]:
    """The summary as plain JSON-able data (keys sorted where order is not meaningful)."""
    model = summary.model
    functions = []
    for (domain, name, overload), body in sorted(summary.functions(), key=lambda f: f[1].key):
        functions.append(
            {
                "id": body.key,
                "domain": domain,
                "name": name,
                "overload": overload,
                "calls": body.calls,
                "stored_nodes": body.stored_nodes,
                "nodes": body.node_count,
                "op_histogram": _histogram(body.ops),
                "flops": body.flops.to_json(),
            }
        )
    return {
        "schema": SCHEMA,
        "model": {
            "name": summary.name,
            "graph_name": model.graph.name,
            "ir_version": model.ir_version,
            "producer": model.producer_name,
            "opset_imports": dict(sorted(model.opset_imports.items())),
        },
        "inputs": [_tensor(i) for i in summary.inputs],
        "outputs": [_tensor(o) for o in summary.outputs],
        "totals": {
            "nodes": summary.root.body.node_count,
            "stored_nodes": sum(b.stored_nodes for b in summary.bodies.values()),
            "functions": len(functions),
            "params": summary.params,
            "param_bytes": summary.param_bytes,
            "flops": summary.root.body.flops.to_json(),
        },
        "op_histogram": _histogram(summary.root.body.ops),
        "functions": functions,
        "tree": _call(summary.root, _flat_scopes(summary)),
    }


def render_json(summary: ModelSummary) -> str:
    """:func:`to_json_data` as indented JSON text (deterministic).

    Example:
        >>> import json, onnx_ir as ir
        >>> from irkit.viz import summarize
        >>> m = ir.from_onnx_text('<ir_version: 10, opset_import: ["" : 21]> g (float[2] x) => (float[2] y) { y = Relu(x) }')
        >>> json.loads(render_json(summarize(m)))["op_histogram"]
        {'Relu': 1}
    """
    return json.dumps(to_json_data(summary), indent=1, ensure_ascii=False) + "\n"
