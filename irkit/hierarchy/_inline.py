"""Inlining function calls back into the graph, with module scopes re-rooted at each call site.

onnx-ir's ``InlinePass(criteria=...)`` does the same cloning, but it copies the call node's
metadata onto every inlined node and cannot re-root the module paths of a *shared* body (the body
of ``layers.0``'s function carries ``layers.0.*`` scopes; inlined at ``layers.5`` they must read
``layers.5.*``). So irkit clones here, node by node, and fixes the scopes on the way.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import onnx_ir as ir
from onnx_ir.passes.common import RemoveUnusedFunctionsPass

from irkit import metadata as md
from irkit._irutil import fresh_name
from irkit._scope_tree import common_scope
from irkit.errors import OutlineError
from irkit.hierarchy._analysis import Scope
from irkit.hierarchy._select import FunctionsOption, make_predicate

__all__ = ["adopt_unscoped", "inline", "open_module_calls", "call_frame", "reroot_scope"]

logger = logging.getLogger(__name__)


def call_frame(node: ir.Node) -> md.Frame | None:
    """The module call a function-call node stands for (its ``irkit.call``), or None."""
    return md.node_call(node.metadata_props)


def reroot_scope(scope: Scope, origin: Scope, site: Scope) -> Scope:
    """Move a body node's scope from the call the body was built from to another call site.

    Example:
        >>> F = md.Frame
        >>> origin = (F("layers.0", 0, "m.Block"),)
        >>> site = (F("layers.5", 0, "m.Block"),)
        >>> reroot_scope((*origin, F("layers.0.attn", 0, "m.Attn")), origin, site)[-1].path
        'layers.5.attn'
    """
    if not origin or scope[: len(origin)] != origin:
        return site if len(scope) < len(site) else (*site, *scope[len(site) :])
    old, new = origin[-1].path, site[-1].path
    # A second call of the *same* module (``enc@1``) calls its submodules for the second time
    # too (``enc.lin@1``): shift their call indices. (A heuristic: exact unless a submodule is
    # called a different number of times per call.)
    shift = site[-1].call_index - origin[-1].call_index if old == new else 0
    tail = tuple(
        md.Frame(new + f.path[len(old) :], max(0, f.call_index + shift), f.cls)
        if f.path == old or f.path.startswith(old + ".")
        else f
        for f in scope[len(origin) :]
    )
    return (*site, *tail)


def inline(
    model: ir.Model,
    predicate: Callable[[ir.Function], bool] | None = None,
    *,
    modules: FunctionsOption | None = None,
) -> ir.Model:
    """Inline local-function calls back into the graph (the reverse of :func:`outline`). In place.

    A call is inlined when ``predicate(function)`` is true *and* its module call (``irkit.call``)
    is selected by ``modules`` (same forms as ``outline``'s ``functions``); ``None`` means all.
    Inlined nodes get the scope of *their* call site, so ``outline(inline(m))`` finds the same
    modules again. Calls inside functions that are kept are inlined into those bodies. Functions
    no longer called are removed.

    Args:
        model: The model.
        predicate: Over the called :class:`onnx_ir.Function`; None selects all.
        modules: Over the module call of the call node; None selects all.

    Returns:
        ``model`` itself.

    Example:
        >>> import irkit, onnx_ir as ir
        >>> m = ir.from_onnx_text('<ir_version: 10, opset_import: ["" : 21]> g (float[2] x) => (float[2] y) { y = Relu(x) }')
        >>> m.graph.node(0).metadata_props["irkit.scope"] = '[["act",0,"torch.nn.modules.activation.ReLU"]]'
        >>> [n.op_type for n in irkit.inline(irkit.outline(m)).graph]
        ['Relu']
    """
    by_module = make_predicate(True if modules is None else modules)

    def wanted(node: ir.Node) -> ir.Function | None:
        function = model.functions.get(node.op_identifier())
        if function is None:
            return None
        frame = call_frame(node)
        if predicate is not None and not predicate(function):
            return None
        if modules is not None and (frame is None or not by_module(frame)):
            return None  # calls of functions irkit did not outline have no module to match
        return function

    count = _inline_in(model.graph, wanted)
    for function in list(model.functions.values()):
        count += _inline_in(function, wanted)
    RemoveUnusedFunctionsPass()(model)
    logger.info("inlined %d calls", count)
    return model


def open_module_calls(model: ir.Model) -> set[tuple[str, str]]:
    """Inline every module call of the main graph (nested ones too), to be re-outlined later.

    Only call nodes that stand for a module call (``irkit.call``) are opened; calls of other
    local functions stay. Functions no longer called are removed. In place.

    Returns:
        ``(path, qualified class)`` of every opened module call: the selection that makes
        :func:`irkit.outline` outline exactly these modules again.
    """
    opened: set[tuple[str, str]] = set()

    def wanted(node: ir.Node) -> ir.Function | None:
        frame = call_frame(node)
        function = model.functions.get(node.op_identifier())
        if frame is None or function is None:
            return None
        opened.add((frame.path, frame.cls))
        return function

    count = _inline_in(model.graph, wanted)
    RemoveUnusedFunctionsPass()(model)
    logger.info("opened %d module calls", count)
    return opened


def adopt_unscoped(model: ir.Model) -> int:
    """Give each main-graph node that carries no irkit metadata at all — one a pass made while
    the calls were open (onnxscript's constant folder writes a ``Shape`` it could partly
    evaluate as a ``Concat``) — the deepest scope common to its readers, so that
    :func:`irkit.outline` finds the calls' regions whole again (GPT-J under ``--target ort``:
    its attention and block were split in two around such a ``Concat``). A node read by a graph
    output, by a nested graph or by an unscoped node stays. In place.

    Returns:
        How many nodes took a scope.

    Example:
        >>> import onnx_ir as ir
        >>> from irkit import metadata as md
        >>> m = ir.from_onnx_text('''
        ...   <ir_version: 10, opset_import: ["" : 21]>
        ...   g (float[2] x) => (float[2] y) { t = Neg(x)  y = Relu(t) }''')
        >>> scope = md.encode_scope((md.Frame("act", 0, "torch.nn.ReLU"),))
        >>> m.graph.node(1).metadata_props[md.SCOPE] = scope
        >>> adopt_unscoped(m), m.graph.node(0).metadata_props[md.SCOPE] == scope
        (1, True)
    """
    adopted = 0
    changed = True
    while changed:  # (a chain of such nodes takes its scope from the last one back)
        changed = False
        for node in model.graph:
            if node.metadata_props:
                continue
            readers = [use.node for out in node.outputs for use in out.uses()]
            if (
                not readers
                or any(out.is_graph_output() for out in node.outputs)
                or any(
                    r.graph is not model.graph or md.SCOPE not in r.metadata_props for r in readers
                )
            ):
                continue
            scope = common_scope(md.node_scope(r.metadata_props) for r in readers)
            if scope:
                node.metadata_props[md.SCOPE] = md.encode_scope(scope)
                adopted += 1
                changed = True
    return adopted


def _inline_in(
    graph: ir.Graph | ir.Function, wanted: Callable[[ir.Node], ir.Function | None]
) -> int:
    used = {v.name for n in graph for v in n.outputs if v.name}
    used |= {v.name for v in graph.inputs if v.name} | {n.name for n in graph if n.name}
    count = 0
    worklist = list(graph)
    while worklist:
        node = worklist.pop(0)
        function = wanted(node)
        if function is None:
            continue
        new_nodes, new_outputs = _instantiate(node, function, used)
        ir.convenience.replace_nodes_and_values(
            graph, node, [node], new_nodes, node.outputs, new_outputs
        )
        worklist[:0] = new_nodes
        count += 1
    return count


def _instantiate(
    call: ir.Node, function: ir.Function, used: set[str]
) -> tuple[list[ir.Node], list[ir.Value]]:
    if len(call.inputs) > len(function.inputs):
        raise OutlineError(
            f"Call node {call.name!r} passes {len(call.inputs)} inputs to function "
            f"{function.domain}::{function.name} which takes {len(function.inputs)}."
        )
    vmap: dict[ir.Value, ir.Value | None] = dict(zip(function.inputs, call.inputs, strict=False))
    site_scope = md.node_scope(call.metadata_props)
    frame = call_frame(call)
    site = (*site_scope, frame) if frame is not None else site_scope
    origin = md.decode_scope(function.metadata_props.get(md.OUTLINE_ORIGIN))
    new_nodes = []
    for node in function:
        if any(a.is_ref() for a in node.attributes.values()):
            raise OutlineError(
                f"Function {function.domain}::{function.name} uses attribute references; "
                "irkit.inline only inlines functions without attribute parameters."
            )
        meta = dict(node.metadata_props)
        meta[md.SCOPE] = md.encode_scope(reroot_scope(md.node_scope(meta), origin, site))
        node_name = node.name
        inner = call_frame(node)
        if inner is not None:  # a nested call: it now stands for the call at this site
            moved = reroot_scope((*origin, inner), origin, site)[-1] if origin else inner
            meta[md.CALL_MODULE] = md.encode_call(moved)
            node_name = moved.call_id
        clone = ir.Node(
            node.domain,
            node.op_type,
            [vmap[v] if v is not None else None for v in node.inputs],
            attributes=[_clone_attr(a, vmap, origin, site) for a in node.attributes.values()],
            overload=node.overload,
            num_outputs=len(node.outputs),
            version=node.version,
            name=None if node_name is None else fresh_name(node_name, used),
            metadata_props=meta,
        )
        for old, new in zip(node.outputs, clone.outputs, strict=True):
            new.name = None if old.name is None else fresh_name(old.name, used)
            new.type, new.shape = old.type, old.shape
            vmap[old] = new
        new_nodes.append(clone)
    outputs: list[ir.Value] = []
    for v in function.outputs:
        mapped = vmap[v]
        if mapped is None:
            raise OutlineError(
                f"Call node {call.name!r}: output {v.name!r} of function "
                f"{function.domain}::{function.name} is an input the call omits; it cannot be "
                "inlined. Fix: pass that input."
            )
        outputs.append(mapped)
    return new_nodes, outputs


def _clone_attr(
    attr: ir.Attr, vmap: dict[ir.Value, ir.Value | None], origin: Scope, site: Scope
) -> ir.Attr:
    """``attr``, with a graph (an ``If`` branch, a ``Loop`` body) copied for this call site: its
    reads of the function's values read the call site's values, its nodes' scopes re-rooted."""
    if attr.type == ir.AttributeType.GRAPH:
        return ir.AttrGraph(attr.name, _clone_graph(attr.value, vmap, origin, site))
    if attr.type == ir.AttributeType.GRAPHS:
        graphs = [_clone_graph(g, vmap, origin, site) for g in attr.value]
        return ir.AttrGraphs(attr.name, graphs)
    return attr


def _clone_graph(
    graph: ir.Graph, vmap: dict[ir.Value, ir.Value | None], origin: Scope, site: Scope
) -> ir.Graph:
    copy = graph.clone(allow_outer_scope_values=True)
    for node in ir.traversal.RecursiveGraphIterator(copy):
        for i, value in enumerate(node.inputs):
            if value is not None and value in vmap:
                node.replace_input_with(i, vmap[value])
        meta = node.metadata_props
        if md.SCOPE in meta:
            meta[md.SCOPE] = md.encode_scope(reroot_scope(md.node_scope(meta), origin, site))
    return copy
