"""Outlining module calls into ONNX local functions, bottom-up, with deduplication."""

from __future__ import annotations

import dataclasses
import logging
import warnings
from collections.abc import Callable, Mapping, Sequence

import onnx_ir as ir
from onnx_ir.passes.common import TopologicalSortPass

from irkit import metadata as md
from irkit._irutil import fresh_name
from irkit._scope_tree import ScopeTree
from irkit.errors import OutlineError
from irkit.hierarchy._analysis import (
    SUBGRAPH_OPS,
    ContractionPlan,
    Dataflow,
    Scope,
    captured_uses,
    nested_nodes,
    used_outside,
)
from irkit.hierarchy._constants import constant_cones, localize_constants
from irkit.hierarchy._dedupe import (
    CanonicalKey,
    FunctionRegistry,
    canonical_key,
    region_key,
    remember_entries,
)
from irkit.hierarchy._replay import Pending, Template, make_template, relative_labels
from irkit.hierarchy._select import FunctionsOption, make_predicate
from irkit.metadata import function_domain

__all__ = ["outline", "CallSignatures", "OutlineWarning", "function_domain"]

logger = logging.getLogger(__name__)

CallSignatures = md.CallSignatures
"""Module call id → (input value names, output value names); see :data:`irkit.metadata.CallSignatures`."""

FUNCTION_OPSET_VERSION = 1


class OutlineWarning(UserWarning):
    """A module call was split into convex parts, or left inline (control flow, no used output)."""


@dataclasses.dataclass(frozen=True)
class _Options:
    """What the caller asked for; read-only during a run."""

    selected: Callable[[md.Frame], bool]
    max_depth: int | None
    signatures: CallSignatures


@dataclasses.dataclass
class _Caches:
    """For speed only: emptying any of them changes no result."""

    scope_texts: dict[Scope, str] = dataclasses.field(default_factory=dict)
    function_keys: dict[str, tuple[str, str]] = dataclasses.field(default_factory=dict)
    node_keys: dict[ir.Node, tuple[object, ...]] = dataclasses.field(default_factory=dict)
    label_ids: dict[tuple[object, ...], int] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class _Replay:
    """Templates of outlined calls and the repeats waiting to be replayed from them."""

    templates: dict[tuple[str, CanonicalKey], Template] = dataclasses.field(default_factory=dict)
    pending: dict[Scope, Pending] = dataclasses.field(default_factory=dict)
    replayed: int = 0


@dataclasses.dataclass
class _Context:
    """One outlining run: options, the state it changes, caches, replay bookkeeping, notes."""

    model: ir.Model
    options: _Options
    registry: FunctionRegistry
    dataflow: Dataflow
    used_call_names: set[str]
    caches: _Caches = dataclasses.field(default_factory=_Caches)
    replay: _Replay = dataclasses.field(default_factory=_Replay)
    notes: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class _CallPlan:
    """A call to install: ``body`` (the nodes of ``region``, of the call ``scope[-1]``) becomes one
    call node named ``name`` of ``function`` (a new function when ``None``, registered under
    ``key``); the call passes ``bound.inputs[order_in[j]]`` as input ``j`` and its output ``j``
    replaces ``bound.outputs[order_out[j]]``."""

    scope: Scope
    body: list[ir.Node]
    region: set[ir.Node]
    bound: _Boundary
    name: str
    function: ir.Function | None
    order_in: Sequence[int]
    order_out: Sequence[int]
    key: CanonicalKey | None = None


def outline(
    model: ir.Model,
    functions: FunctionsOption = True,
    *,
    max_depth: int | None = None,
    call_signatures: CallSignatures | None = None,
) -> ir.Model:
    """Turn module calls into ONNX local functions, bottom-up, sharing identical bodies. In place.

    Works on any model whose nodes carry ``irkit.scope`` metadata (:mod:`irkit.metadata`), also
    after rewrites. Each chosen call becomes a call node (named after the call, e.g.
    ``layers.0@1``, with ``irkit.call`` and ``irkit.scope`` metadata) of a function named after
    the module class in a domain named after its Python package. Everything a body uses from
    outside — activations and initializers — becomes a function input; values used outside
    become outputs. Structurally identical bodies share one function; different bodies of one
    class get distinct names (``Linear``, ``Linear_1``). A call whose region is not convex (a path
    leaves it and comes back, so one call node would create a cycle) is split into convex parts
    (``enc/part0``, ``enc/part1``), with an :class:`OutlineWarning` and an ``irkit.outline.note``.

    Args:
        model: The model; its main graph is outlined, the result is topologically sorted.
        functions: Which calls: ``True`` (all), ``False`` (none: the model is returned as is),
            classes / class names, a :class:`ModuleSelector` (classes and path globs) or a
            predicate ``(path, qualified_class) -> bool``. See ``docs/hierarchy.md``.
        max_depth: Only outline calls at most this deep (top-level modules are depth 1).
        call_signatures: Input/output order of module calls (:data:`CallSignatures`). Default:
            what the model stores under :data:`irkit.metadata.CALL_SIGNATURES` (written by
            :func:`irkit.lower`), so ``outline(lower(ep, functions=False))`` equals
            ``lower(ep)``.

    Returns:
        ``model`` itself.

    Raises:
        OutlineError: Bad ``functions``/``max_depth`` options (or a bug in irkit, said so).
        MetadataError: Malformed ``irkit.*`` metadata.

    Example:
        >>> import irkit, onnx_ir as ir
        >>> m = ir.from_onnx_text('<ir_version: 10, opset_import: ["" : 21]> g (float[2] x) => (float[2] y) { y = Relu(x) }')
        >>> m.graph.node(0).metadata_props["irkit.scope"] = '[["act",0,"torch.nn.modules.activation.ReLU"]]'
        >>> _ = irkit.outline(m)
        >>> [(n.name, n.domain, n.op_type) for n in m.graph]
        [('act', 'torch.nn.modules', 'ReLU')]
    """
    if max_depth is not None and (not isinstance(max_depth, int) or max_depth < 0):
        raise OutlineError(f"max_depth={max_depth!r}: expected a non-negative int or None.")
    selected = make_predicate(functions)
    if functions is False or functions is None or max_depth == 0:
        return model
    nodes = list(model.graph)
    cones = constant_cones(nodes)  # (also checks the order)
    if cones is None:
        TopologicalSortPass()(model)
        nodes = list(model.graph)
        cones = constant_cones(nodes)
    copied = localize_constants(model.graph, cones)
    if copied:  # copies sit before *a* consumer of their scope, not necessarily the first
        model.graph.sort()
    if copied or len(model.graph) != len(nodes):  # (unused constants are dropped)
        nodes = list(model.graph)
    tree = ScopeTree(nodes)
    members = {scope: list(own) for scope, own in tree.members.items()}  # (the working lists)
    signatures = (
        md.decode_call_signatures(model.metadata_props.get(md.CALL_SIGNATURES))
        if call_signatures is None
        else call_signatures
    )
    ctx = _Context(
        model,
        _Options(selected, max_depth, signatures),
        FunctionRegistry(),
        Dataflow(nodes),
        {n.name for n in nodes if n.name},
    )
    marked = _register_subgraph_functions(ctx)
    repeated = _repeated_classes(tree)
    events = _walk(tree, ctx.dataflow, members)
    exit_at = {scope: i for i, (scope, entering) in enumerate(events) if not entering}
    i = 0
    while i < len(events):
        scope, entering = events[i]
        i += 1
        if entering:  # on the way down: a repeat of an outlined call is replayed as a whole
            if scope[-1].cls in marked:  # a call torch inlined, of a class marked as repeated
                subtree = [s for s, down in events[i : exit_at[scope]] if down]
                if _reuse_subgraph_function(ctx, scope, subtree, members, marked[scope[-1].cls]):
                    i = exit_at[scope] + 1
                    continue
            if scope[-1].cls in repeated:
                subtree = [s for s, down in events[i : exit_at[scope]] if down]  # (DFS order)
                if _replay(ctx, scope, subtree, members):
                    i = exit_at[scope] + 1
            continue
        items = members.pop(scope)
        result = _maybe_outline(ctx, scope, items) if items else []
        members[scope[:-1]].extend(result)
        if scope in ctx.replay.pending:
            _record(ctx, scope, result)
    if ctx.dataflow.reordered:  # (call nodes took their regions' places: else still sorted)
        model.graph.sort()  # function bodies were built in topological order already
    if logger.isEnabledFor(logging.INFO):  # (counting the calls visits every node)
        logger.info(
            "outlined %d module calls into %d functions (%d replayed, %d notes, %d constants "
            "copied)",
            sum(1 for n in model.graph.all_nodes() if md.CALL_MODULE in n.metadata_props),
            len(model.functions),
            ctx.replay.replayed,
            len(ctx.notes),
            copied,
        )
    return model


def _walk(
    tree: ScopeTree, flow: Dataflow, members: Mapping[Scope, list[ir.Node]]
) -> list[tuple[Scope, bool]]:
    """Depth-first ``(call, entering?)`` events, root excluded; siblings in order of their
    first node (deterministic). Leaving a call comes after leaving all its children."""
    pos, end = flow.pos, len(flow.order)
    first = {scope: pos[own[0]] if own else end for scope, own in members.items()}  # (in order)
    for scope in sorted(first, key=len, reverse=True):  # children before their parents
        if scope and first[scope] < first[scope[:-1]]:
            first[scope[:-1]] = first[scope]

    def children(scope: Scope) -> list[Scope]:
        return sorted(tree.children[scope], key=lambda c: (first[c], c))

    events: list[tuple[Scope, bool]] = []
    stack: list[tuple[Scope, bool]] = [((), False)]
    while stack:  # iterative DFS with sorted children
        scope, expanded = stack.pop()
        events.append((scope, not expanded))
        if not expanded:
            stack.append((scope, True))
            stack.extend((c, False) for c in reversed(children(scope)))
    return events[1:-1]  # without the root


def _repeated_classes(tree: ScopeTree) -> set[str]:
    """Classes of calls that have child calls and occur more than once: replay candidates."""
    seen: set[str] = set()
    repeated: set[str] = set()
    for scope in tree.calls():
        if tree.children[scope]:
            cls = scope[-1].cls
            (repeated if cls in seen else seen).add(cls)
    return repeated


def _outlined(ctx: _Context, scope: Scope) -> bool:
    """Whether outlining is asked for this call (``functions`` and ``max_depth``)."""
    if ctx.options.max_depth is not None and len(scope) > ctx.options.max_depth:
        return False
    return ctx.options.selected(scope[-1])


def _replay(
    ctx: _Context, scope: Scope, descendants: list[Scope], members: dict[Scope, list[ir.Node]]
) -> bool:
    """Outline the whole subtree of ``scope`` as one call of a recorded template, if one fits.

    On a miss the flat key is kept (:attr:`_Context.pending`) so that the call's own result
    becomes a template once it is outlined. See :mod:`irkit.hierarchy._replay`.
    """
    if not _outlined(ctx, scope):
        return False
    if any(scope[:k] in ctx.replay.pending for k in range(1, len(scope))):
        return False  # inside a first call: its repeats replay it whole, not its parts
    labels = relative_labels(scope, descendants, lambda s: _outlined(ctx, s))
    pos, control_flow = ctx.dataflow.pos, ctx.dataflow.control_flow
    label_ids = ctx.caches.label_ids  # (an int per distinct label: keys hash and compare faster)
    labelled = []
    for s, label in labels.items():
        label_id = label_ids.setdefault(label, len(label_ids))
        labelled.extend([(pos[n], n, label_id) for n in members[s]])
    if not labelled or (control_flow and any(n in control_flow for _, n, _ in labelled)):
        return False
    labelled.sort(key=lambda t: t[0])
    if labelled[-1][0] - labelled[0][0] >= len(labelled):  # not contiguous: children may differ
        return False
    body = [n for _, n, _ in labelled]
    region = set(body)
    frame = scope[-1]
    key, inputs, input_uses, outputs = region_key(body, region, [t[2] for t in labelled])
    if not outputs:
        return False
    bound = _Boundary(inputs, outputs, input_uses)
    template = ctx.replay.templates.get((frame.cls, key))
    if template is None:  # the first call: outlined normally, its children keyed from here
        remember_entries(key, body, ctx.caches.node_keys)
        ctx.replay.pending[scope] = Pending(
            key, bound.inputs, [v.name for v in bound.outputs], len(ctx.notes)
        )
        return False
    plan = ctx.dataflow.plan(region)
    if not isinstance(plan, ContractionPlan):
        return False
    call = _install(
        ctx,
        _CallPlan(
            scope,
            body,
            region,
            bound,
            frame.call_id,
            template.function,
            template.inputs,
            template.outputs,
        ),
    )
    ctx.dataflow.contract(plan, call)
    for s in labels:
        del members[s]
    members[scope[:-1]].append(call)
    ctx.replay.replayed += 1
    return True


def _record(ctx: _Context, scope: Scope, result: list[ir.Node]) -> None:
    """Keep the first call's outlined result as the template of its flat key, if it is clean."""
    pending = ctx.replay.pending.pop(scope)
    if len(result) != 1 or len(ctx.notes) != pending.notes:
        return
    call = result[0]
    function = ctx.model.functions.get((call.domain, call.op_type, ""))
    if function is None or call.metadata_props.get(md.CALL_MODULE) is None:
        return
    template = make_template(pending, call, function)
    if template is not None:
        ctx.replay.templates.setdefault((scope[-1].cls, pending.key), template)


def _maybe_outline(ctx: _Context, scope: Scope, items: list[ir.Node]) -> list[ir.Node]:
    """Outline one module call; return what now stands for it in its parent's region."""
    frame = scope[-1]
    if not _outlined(ctx, scope):
        return items
    if _adopt_subgraph_call(ctx, scope, items):
        return items
    control_flow = ctx.dataflow.control_flow
    if control_flow and any(n in control_flow and n.op_type not in SUBGRAPH_OPS for n in items):
        return _leave_inline(ctx, frame, items, "it contains an op with a graph attribute")
    plan = ctx.dataflow.plan(items)
    if isinstance(plan, ContractionPlan):
        call = _contract(ctx, scope, plan, frame.call_id)
        return [call] if call is not None else _leave_inline(ctx, frame, items, _NO_OUTPUT)
    return _split(ctx, scope, items, plan)


_NO_OUTPUT = "none of its outputs is used"


def _register_subgraph_functions(ctx: _Context) -> dict[str, list[ir.Function]]:
    """Let module calls share the functions ``irkit.lower`` made of torch's ``invoke_subgraph``.

    Such a function is named after its module class (like outlined ones); registering it under
    its class lets a structurally identical call (torch inlines the first call of a
    ``nested_compile_region``) reuse it instead of getting a second function. Returns the
    functions by qualified class.
    """
    marked: dict[str, list[ir.Function]] = {}
    for function in list(ctx.model.functions.values()):
        origin = md.decode_scope(function.metadata_props.get(md.OUTLINE_ORIGIN))
        if md.INVOKE_SUBGRAPH not in function.metadata_props or not origin:
            continue
        domain, cls_name = _function_key(ctx, origin[-1])
        key = canonical_key(function.inputs, list(function), function.outputs)
        ctx.registry.add(domain, cls_name, function, key if function.name == cls_name else None)
        marked.setdefault(origin[-1].cls, []).append(function)
    return marked


def _reuse_subgraph_function(
    ctx: _Context,
    scope: Scope,
    descendants: list[Scope],
    members: dict[Scope, list[ir.Node]],
    functions: list[ir.Function],
) -> bool:
    """Make a whole call (its submodules included) one call of an ``invoke_subgraph`` function
    of its class whose body is the call's flat body; a miss leaves the call to the normal path.

    torch lowers every call of a ``nested_compile_region`` but the first to ``invoke_subgraph``,
    whose body is flat (no module calls inside); the first call is compared flat too.
    """
    if not _outlined(ctx, scope):
        return False
    pos = ctx.dataflow.pos
    body = sorted(
        (n for s in (scope, *descendants) for n in members.get(s, ())), key=pos.__getitem__
    )
    if not body:
        return False
    region = set(body)
    plan = ctx.dataflow.plan(region)
    if not isinstance(plan, ContractionPlan):
        return False
    bound = _boundary(ctx, scope[-1], body, region)
    key = canonical_key(bound.inputs, body, bound.outputs)
    for function in functions:
        candidates = FunctionRegistry()
        candidates.add(
            "", "", function, canonical_key(function.inputs, list(function), function.outputs)
        )
        if candidates.find("", "", key) is function:
            order_in: Sequence[int] = range(len(bound.inputs))
            order_out: Sequence[int] = range(len(bound.outputs))
        else:
            match = candidates.find_isomorphic("", "", key, bound.inputs, body, bound.outputs)
            if match is None:
                continue
            order_in, order_out = match.inputs, match.outputs
        call = _install(
            ctx,
            _CallPlan(scope, body, region, bound, scope[-1].call_id, function, order_in, order_out),
        )
        ctx.dataflow.contract(plan, call)
        for s in (scope, *descendants):
            members.pop(s, None)
        members[scope[:-1]].append(call)
        return True
    return False


def _adopt_subgraph_call(ctx: _Context, scope: Scope, items: list[ir.Node]) -> bool:
    """A module call that is exactly one call of an ``invoke_subgraph`` function already is the
    module's call node: it gets the call metadata instead of a wrapper function."""
    if len(items) != 1:
        return False
    function = ctx.model.functions.get(items[0].op_identifier())
    if function is None or md.INVOKE_SUBGRAPH not in function.metadata_props:
        return False
    items[0].name = _call_name(ctx, scope[-1].call_id)
    items[0].metadata_props[md.CALL_MODULE] = md.encode_call(scope[-1])
    items[0].metadata_props[md.SCOPE] = _scope_text(ctx, scope[:-1])
    return True


def _split(
    ctx: _Context, scope: Scope, items: list[ir.Node], witness: list[ir.Node]
) -> list[ir.Node]:
    """Outline a non-convex call as several convex parts (``enc/part0``, ``enc/part1`` …)."""
    frame, remaining, k = scope[-1], set(items), 0
    result: list[ir.Node] = []
    while remaining:
        part = ctx.dataflow.first_convex_part(remaining)
        plan = ctx.dataflow.plan(part)
        if not isinstance(plan, ContractionPlan):  # (the early part of a region is convex)
            raise OutlineError(
                f"the first convex part of module call {frame.call_id!r} is not convex. This is "
                "a bug in irkit; please report it with this message (outline(..., "
                "functions=...) can leave this module call out meanwhile)."
            )
        call = _contract(ctx, scope, plan, f"{frame.call_id}/part{k}")
        result.extend([call] if call is not None else part)
        remaining -= part
        k += 1
    names = ", ".join(repr(n.name or n.op_type) for n in witness[:3])
    _note(
        ctx,
        frame,
        result,
        f"split into {k} convex parts: its region is not convex (a path leaves it and re-enters "
        f"it through {names}; one call node would create a cycle)",
    )
    return result


def _contract(ctx: _Context, scope: Scope, plan: ContractionPlan, name: str) -> ir.Node | None:
    body = sorted(plan.region, key=ctx.dataflow.pos.__getitem__)
    call = _build_call(ctx, scope, body, plan.region, name)
    if call is not None:
        ctx.dataflow.contract(plan, call)
    return call


def _leave_inline(ctx: _Context, frame: md.Frame, items: list[ir.Node], why: str) -> list[ir.Node]:
    _note(ctx, frame, items, f"left inline: {why}")
    return items


def _note(ctx: _Context, frame: md.Frame, items: list[ir.Node], what: str) -> None:
    note = f"module call {frame.call_id!r} ({frame.cls}) {what}"
    ctx.notes.append(note)
    logger.info("%s", note)  # the warning below is the user-facing report
    warnings.warn(note, OutlineWarning, stacklevel=5)
    for node in items:
        old = node.metadata_props.get(md.OUTLINE_NOTE)
        node.metadata_props[md.OUTLINE_NOTE] = note if not old else f"{old}\n{note}"


def _ordered(values: list[ir.Value], names: Sequence[str]) -> list[ir.Value]:
    """``values`` with those named in ``names`` first, in that order; the rest keep their order."""
    if not names:
        return values
    rank = {name: i for i, name in enumerate(names)}
    first = sorted((v for v in values if v.name in rank), key=lambda v: rank[v.name or ""])
    return first + [v for v in values if v.name not in rank]


@dataclasses.dataclass
class _Boundary:
    inputs: list[ir.Value]  # values the body uses from outside, in call-signature order
    outputs: list[ir.Value]  # body values used outside (or graph outputs), in signature order
    input_uses: list[tuple[ir.Node, int]]  # the body's inputs that are outside values


def _boundary(
    ctx: _Context, frame: md.Frame, body: list[ir.Node], region: set[ir.Node]
) -> _Boundary:
    inputs: dict[ir.Value, None] = {}
    input_uses: list[tuple[ir.Node, int]] = []
    outputs: list[ir.Value] = []
    inside = _with_nested(ctx, body, region)
    for node in body:
        for i, value in enumerate(node.inputs):
            if value is not None and value.producer() not in region:
                inputs[value] = None
                input_uses.append((node, i))
        if inside is not region and node in ctx.dataflow.control_flow:
            for inner, i, value in captured_uses(node):  # read by name inside a subgraph
                if value.producer() not in region:
                    inputs[value] = None
                    input_uses.append((inner, i))
        outputs.extend(v for v in node.outputs if used_outside(v, inside))
    signature = ctx.options.signatures.get(frame.call_id) or ctx.options.signatures.get(frame.path)
    if signature is None:
        return _Boundary(list(inputs), outputs, input_uses)
    return _Boundary(
        _ordered(list(inputs), signature[0]), _ordered(outputs, signature[1]), input_uses
    )


def _with_nested(ctx: _Context, body: list[ir.Node], region: set[ir.Node]) -> set[ir.Node]:
    """``region`` plus the nodes inside its nodes' subgraphs (their reads are inside reads)."""
    control_flow = ctx.dataflow.control_flow
    if not control_flow or not any(n in control_flow for n in body):
        return region
    return region.union(*(nested_nodes(n) for n in body if n in control_flow))


def _local_name(name: str | None, frame: md.Frame, taken: set[str]) -> str:
    """Function input names relative to the module (``layers.3.attn.q.weight`` → ``attn.q.weight``)."""
    base = name or "input"
    if frame.path and base.startswith(frame.path + "."):
        base = base[len(frame.path) + 1 :]
    return fresh_name(base, taken)


def _build_call(
    ctx: _Context, scope: Scope, body: list[ir.Node], region: set[ir.Node], name: str
) -> ir.Node | None:
    """Move ``body`` into a (possibly shared) function; return the call node now standing for it.

    The body is compared with the existing functions while it still reads the outer values;
    only a new function's body is rewired to fresh parameters, a duplicate's is detached.
    """
    frame = scope[-1]
    bound = _boundary(ctx, frame, body, region)
    outer_inputs, outputs = bound.inputs, bound.outputs
    if not outputs:
        return None
    domain, cls_name = _function_key(ctx, frame)
    key = canonical_key(outer_inputs, body, outputs, memo=ctx.caches.node_keys)
    function = ctx.registry.find(domain, cls_name, key)
    order_in: Sequence[int] = range(len(outer_inputs))
    order_out: Sequence[int] = range(len(outputs))
    if function is None:  # same body in another node order?
        match = ctx.registry.find_isomorphic(domain, cls_name, key, outer_inputs, body, outputs)
        if match is not None:
            function, order_in, order_out = match.function, match.inputs, match.outputs
    plan = _CallPlan(scope, body, region, bound, name, function, order_in, order_out, key)
    return _install(ctx, plan)


def _install(ctx: _Context, plan: _CallPlan) -> ir.Node:
    """Put a call node in the place of ``plan.body`` and take the body out of the graph.

    Without a ``plan.function`` the body becomes a new function; otherwise it is dropped.
    """
    scope, body, region, bound = plan.scope, plan.body, plan.region, plan.bound
    function, order_in, order_out = plan.function, plan.order_in, plan.order_out
    frame, graph = scope[-1], ctx.model.graph
    outer_inputs, outputs = bound.inputs, bound.outputs
    call = ir.Node(
        *_function_key(ctx, frame),
        [outer_inputs[i] for i in order_in],
        num_outputs=len(outputs),
        name=_call_name(ctx, plan.name),
        metadata_props={
            md.CALL_MODULE: md.encode_call(frame),
            md.SCOPE: _scope_text(ctx, scope[:-1]),
        },
    )
    for new, old in zip(call.outputs, [outputs[m] for m in order_out], strict=True):
        new.name, new.type, new.shape = old.name, old.type, old.shape
        for use in old.uses():
            if use.node not in region:
                use.node.replace_input_with(use.idx, new)
        if old.is_graph_output():
            graph.outputs[:] = [new if v is old else v for v in graph.outputs]
    graph.insert_before(body[0], call)
    graph.remove(body)
    if function is None:
        params = _rewire_to_params(frame, bound)
        function = _new_function(ctx, scope, params, body, outputs, plan.key)
    else:  # the body is dropped: it must no longer count as a user of the outer values
        for node, i in bound.input_uses:
            node.replace_input_with(i, None)
    call.op_type = function.name
    return call


def _rewire_to_params(frame: md.Frame, bound: _Boundary) -> list[ir.Value]:
    """Fresh function inputs for the body's outer values; the body reads them instead."""
    taken: set[str] = set()
    params = [
        ir.Value(name=_local_name(v.name, frame, taken), type=v.type, shape=v.shape)
        for v in bound.inputs
    ]
    param_of: dict[ir.Value | None, ir.Value] = dict(zip(bound.inputs, params, strict=True))
    for node, i in bound.input_uses:
        node.replace_input_with(i, param_of[node.inputs[i]])
    return params


def _function_key(ctx: _Context, frame: md.Frame) -> tuple[str, str]:
    """(domain, name) of the class's functions, computed once per class."""
    key = ctx.caches.function_keys.get(frame.cls)
    if key is None:
        key = ctx.caches.function_keys[frame.cls] = (function_domain(frame), frame.class_name)
    return key


def _new_function(
    ctx: _Context,
    scope: Scope,
    params: list[ir.Value],
    body: list[ir.Node],
    outputs: list[ir.Value],
    key: CanonicalKey | None,
) -> ir.Function:
    frame, model = scope[-1], ctx.model
    domain, cls_name = function_domain(frame), frame.class_name
    name = ctx.registry.next_name(domain, cls_name)
    while (domain, name, "") in model.functions:  # e.g. outlining a model twice
        ctx.registry.add(domain, cls_name, model.functions[(domain, name, "")], None)
        name = ctx.registry.next_name(domain, cls_name)
    opsets = {"": model.opset_imports.get("", 18)}
    for node in body:
        if node.domain not in opsets:
            opsets[node.domain] = model.opset_imports.get(node.domain, FUNCTION_OPSET_VERSION)
    fgraph = ir.Graph(params, outputs, nodes=body, opset_imports=opsets, name=name)
    function = ir.Function(domain, name, graph=fgraph, attributes=[])
    function.doc_string = f"Module class {frame.cls}"
    function.metadata_props[md.OUTLINE_ORIGIN] = md.encode_scope(scope)
    model.functions[function.identifier()] = function
    model.opset_imports.setdefault(domain, FUNCTION_OPSET_VERSION)
    ctx.registry.add(domain, cls_name, function, key)
    return function


def _scope_text(ctx: _Context, scope: Scope) -> str:
    text = ctx.caches.scope_texts.get(scope)
    if text is None:
        text = ctx.caches.scope_texts[scope] = md.encode_scope(scope)
    return text


def _call_name(ctx: _Context, wanted: str) -> str:
    return fresh_name(wanted, ctx.used_call_names, sep="#")
