"""A deterministic text dump of a model's function tree (for humans, goldens and the docs)."""

from __future__ import annotations

from collections import Counter

import onnx_ir as ir

from irkit import metadata as md
from irkit.hierarchy._analysis import Scope
from irkit.hierarchy._inline import call_frame, reroot_scope

__all__ = ["function_tree"]


def _fid(node_or_fn: ir.Node | ir.Function) -> str:
    overload = f":{node_or_fn.overload}" if node_or_fn.overload else ""
    return f"{node_or_fn.domain}::{node_or_fn.op_type if isinstance(node_or_fn, ir.Node) else node_or_fn.name}{overload}"


def function_tree(model: ir.Model, *, sizes: bool = True) -> str:
    """The module calls of ``model`` as an indented tree (call id → function), then per function
    its body size (``sizes=True``) and how many times it is instantiated in total.

    Example:
        >>> import irkit, onnx_ir as ir
        >>> m = ir.from_onnx_text('<ir_version: 10, opset_import: ["" : 21]> g (float[2] x) => (float[2] y) { y = Relu(x) }')
        >>> m.graph.node(0).metadata_props["irkit.scope"] = '[["act",0,"torch.nn.modules.activation.ReLU"]]'
        >>> print(function_tree(irkit.outline(m)))
        act  ->  torch.nn.modules::ReLU
        <BLANKLINE>
        functions:
          torch.nn.modules::ReLU  nodes=1  calls=1
    """
    lines: list[str] = []
    instances: Counter[str] = Counter()
    _walk(model, model.graph, (), (), 0, lines, instances)
    lines += ["", "functions:"]
    for fn in sorted(model.functions.values(), key=_fid):
        size = f"  nodes={len(fn)}" if sizes else ""
        lines.append(f"  {_fid(fn)}{size}  calls={instances[_fid(fn)]}")
    return "\n".join(lines)


def _walk(
    model: ir.Model,
    body: ir.Graph | ir.Function,
    origin: Scope,
    site: Scope,
    depth: int,
    lines: list[str],
    instances: Counter[str],
) -> None:
    for node in body:
        function = model.functions.get(node.op_identifier())
        if function is None:
            continue
        frame = call_frame(node)
        if frame is None:
            label = node.name or "?"
            here = site
        else:
            here = (
                reroot_scope((*md.node_scope(node.metadata_props), frame), origin, site)
                if origin
                else (*md.node_scope(node.metadata_props), frame)
            )
            name = node.name or ""
            part = name[len(frame.call_id) :] if name.startswith(frame.call_id + "/") else ""
            label = here[-1].call_id + part  # "/partK" of a call split into convex parts
        lines.append(f"{'  ' * depth}{label}  ->  {_fid(node)}")
        instances[_fid(node)] += 1
        inner_origin = md.decode_scope(function.metadata_props.get(md.OUTLINE_ORIGIN))
        _walk(model, function, inner_origin, here, depth + 1, lines, instances)
