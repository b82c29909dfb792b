"""Control-flow higher-order ops: ``cond`` → ``If``, ``while_loop`` → ``Loop``, ``scan`` and
``map`` → ``Scan``, ``invoke_subgraph`` → a call of one ONNX local function per subgraph.

``torch.export`` keeps data-dependent control flow as higher-order ops whose bodies are
``get_attr`` submodules. Each body is planned like the program itself (:func:`plan_bodies`) and
emitted node by node by the same :class:`~irkit.lowering._emit.Emitter` — the frame's target
graph is the body's ``ir.Graph`` instead of the main graph — so torchlib, irkit's own lowerings,
decompositions, context regions and dtype reconciliation all work inside bodies unchanged.

ONNX shapes of the bodies (ONNX lets a subgraph read any value of an enclosing graph by name):

* ``cond(pred, true_fn, false_fn, operands)`` → ``If(pred)``; both branches have no inputs and
  read the operands from the outer graph.
* ``while_loop(cond_fn, body_fn, carried, additional)`` → ``Loop("", cond_fn(carried), carried)``;
  the body takes ``(iteration, condition, *carried)``, runs ``body_fn`` and then ``cond_fn`` on
  its results, and returns ``(condition, *carried)``.
* ``scan(combine_fn, init, xs, additional)`` → ``Scan(*init, *xs)`` (axis 0; ``torch.export``
  already moved the scanned dim to 0 and flipped reversed inputs); the body takes the carries and
  one slice of each ``xs`` and returns the new carries and one slice of each output.
* ``map_impl(body, xs, args)`` → ``Scan(*xs)`` with no carries.
* ``invoke_subgraph(subgraph, identifier, *operands)`` → a call of an ONNX local function, one
  function per identifier, named like :func:`irkit.outline` names module functions (the Python
  package of the module class as domain, the class name as name) and marked with
  :data:`irkit.metadata.INVOKE_SUBGRAPH` so that outlining and optimization keep it.
* A ``torch.library.custom_op`` lowered through its Python implementation
  (``decompose_custom_ops``) → a call of an ONNX local function named after the op (its
  namespace as domain, its name as name), one function per distinct traced body, marked with
  :data:`irkit.metadata.CUSTOM_OP`: the op stays one recognizable unit that a rule can replace
  by a runtime's own kernel (see :func:`lower_custom_op`).

``torch.export`` records no module stack inside control-flow bodies (measured with torch 2.13),
so body nodes take the scope of the higher-order op's node.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

import onnx_ir as ir
import torch

from irkit import metadata
from irkit.errors import IrkitError, LoweringError, LoweringOptionsError
from irkit.lowering._plan_types import Decomposition, Frame
from irkit.lowering._recorder import Recorder
from irkit.lowering._source import MetadataStamper, module_path, node_location, node_scope

__all__ = [
    "BodyEmitter",
    "ControlFlowState",
    "is_control_flow",
    "plan_bodies",
    "lower_control_flow",
    "lower_custom_op",
    "SUBGRAPH_DOMAIN",
]

SUBGRAPH_DOMAIN = "irkit.subgraph"
"""Domain of an ``invoke_subgraph`` function called outside any module."""

_ARROW = " → "


@dataclasses.dataclass(frozen=True)
class _Hop:
    label: str
    bodies: tuple[tuple[str, int], ...]  # (body name, argument index of its get_attr node)


@functools.cache
def _table() -> dict[Any, _Hop]:
    hop = torch.ops.higher_order
    return {
        hop.cond: _Hop("cond", (("true_branch", 1), ("false_branch", 2))),
        hop.while_loop: _Hop("while_loop", (("cond_fn", 0), ("body_fn", 1))),
        hop.scan: _Hop("scan", (("combine_fn", 0),)),
        hop.map_impl: _Hop("map", (("body_fn", 0),)),
        hop.invoke_subgraph: _Hop("invoke_subgraph", (("subgraph", 0),)),
    }


def is_control_flow(target: object) -> bool:
    """Whether ``target`` is a control-flow higher-order op this module lowers."""
    return isinstance(target, torch._ops.HigherOrderOperator) and target in _table()


@dataclasses.dataclass
class ControlFlowState:
    """Per-:func:`irkit.lower` state: the ``invoke_subgraph`` functions built so far."""

    functions: dict[str, ir.Function] = dataclasses.field(default_factory=dict)
    names: set[tuple[str, str]] = dataclasses.field(default_factory=set)


def _label(node: torch.fx.Node) -> str:
    hop = _table()[node.target]
    if hop.label == "invoke_subgraph":
        return f"invoke_subgraph[{node.args[1]}]"
    return hop.label


def _body(node: torch.fx.Node, index: int) -> torch.fx.GraphModule:
    attr = node.args[index]
    owner = node.graph.owning_module
    if not (isinstance(attr, torch.fx.Node) and attr.op == "get_attr" and owner is not None):
        raise LoweringError(
            f"expected a get_attr submodule as argument {index}, got {attr!r}. Fix: export the "
            "model with torch.export.export (bodies are then submodules).",
            fx_node=node.name,
            target=_label(node),
            source=node_location(node),
        )
    body: Any = owner
    for part in str(attr.target).split("."):
        body = getattr(body, part)
    if not isinstance(body, torch.fx.GraphModule):
        raise LoweringError(
            f"argument {index} names {attr.target!r}, a {type(body).__name__}, not a "
            "torch.fx.GraphModule. Fix: export the model with torch.export.export (bodies are "
            "then submodules).",
            fx_node=node.name,
            target=_label(node),
            source=node_location(node),
        )
    return body


def plan_bodies(
    node: torch.fx.Node,
    plan_one: Callable[[torch.fx.GraphModule], tuple[Decomposition, Any]],
    missing: Any,
) -> dict[str, Decomposition]:
    """Plan every body of a control-flow node; ops without a lowering go to ``missing``.

    An op missing inside a body is listed under its path through the bodies
    (``cond.true_branch → layers.3.attn → aten.foo.default``), so the
    :class:`~irkit.errors.UnsupportedOpError` says where it is.
    """
    plans = {}
    for name, index in _table()[node.target].bodies:
        plans[name], sub = plan_one(_body(node, index))
        for op, nodes in sub.nodes.items():
            where = module_path(nodes[0])
            inner = op if _ARROW in op or not where else f"{where}{_ARROW}{op}"
            key = f"{_label(node)}.{name}{_ARROW}{inner}"
            missing.nodes.setdefault(key, []).extend(nodes)
            if op in sub.reasons:
                missing.reasons.setdefault(key, sub.reasons[op])
    return plans


# --- emission -------------------------------------------------------------------------------
class BodyEmitter(Protocol):
    """What control flow needs of the emitter (:class:`~irkit.lowering._emit.Emitter`)."""

    recorder: Recorder
    stamper: MetadataStamper
    graph: ir.Graph
    control_flow: ControlFlowState

    def emit_body(
        self,
        body: Decomposition,
        inputs: Sequence[Any],
        *,
        graph: ir.Graph | None,
        prefix: str,
        stamp_from: torch.fx.Node | None,
    ) -> Any:
        """Emit ``body`` into ``graph``; returns its outputs."""

    def append(
        self, nodes: list[ir.Node], props: dict[str, str], name: str, graph: ir.Graph | None = None
    ) -> None:
        """Name, stamp and append ``nodes`` to ``graph``."""

    def set_type(self, value: ir.Value, val: Any) -> None:
        """Type ``value`` like the FX value ``val``."""


def lower_control_flow(
    emitter: BodyEmitter, frame: Frame, node: torch.fx.Node, bodies: dict[str, Decomposition]
) -> Any:
    """Lower one control-flow node with its planned ``bodies``; returns its outputs (recorded,
    not yet appended)."""
    lowering = _LOWERINGS[_table()[node.target].label]
    return lowering(_Context(emitter, frame, node, bodies))


@dataclasses.dataclass
class _Context:
    emitter: BodyEmitter
    frame: Frame
    node: torch.fx.Node
    bodies: dict[str, Decomposition]

    @property
    def recorder(self) -> Recorder:
        return self.emitter.recorder

    @property
    def args(self) -> Any:
        """The control-flow node's FX arguments (bodies, operand tuples)."""
        return self.node.args

    def value(self, arg: Any) -> Any:
        """An FX argument's lowered value (a Python constant stays as it is)."""
        if isinstance(arg, torch.fx.Node):
            return self.frame.env[arg]
        if isinstance(arg, (list, tuple)):
            return type(arg)(self.value(a) for a in arg)
        return arg

    def as_value(self, arg: Any, graph: ir.Graph | None = None) -> ir.Value:
        """``arg`` as an ONNX value; a Python scalar becomes a ``Constant`` in ``graph``."""
        value = self.value(arg)
        if isinstance(value, ir.Value):
            return value
        if not isinstance(value, (bool, int, float)):
            raise LoweringError(
                f"a {type(value).__name__} operand cannot be a control-flow value. Fix: pass "
                "tensors (or Python numbers) to the control-flow op.",
                fx_node=self.node.name,
                target=_label(self.node),
                module_path=module_path(self.node),
                source=node_location(self.node),
            )
        constant = self.recorder.constant(value, None)
        self.flush(graph, "const")
        return constant

    def flush(self, graph: ir.Graph | None, what: str) -> None:
        """Append the nodes recorded so far to ``graph`` (default: the frame's graph)."""
        name = f"{self.frame.prefix}{self.node.name}/{what}"
        self.emitter.append(
            self.recorder.take_nodes(),
            self.emitter.stamper.props(self.frame.stamp_from or self.node),
            name,
            self.frame.graph if graph is None else graph,
        )

    def new_input(self, placeholder: torch.fx.Node, name: str) -> ir.Value:
        """A body graph input typed like the body's placeholder."""
        value = self.recorder.new_value(name=name)
        self.emitter.set_type(value, placeholder.meta.get("val"))
        return value

    def emit(
        self,
        body: str,
        inputs: Sequence[Any],
        graph: ir.Graph | None,
        *,
        prefix: str | None = None,
    ) -> list[Any]:
        """Emit body ``body`` into ``graph`` (``None``: the frame's graph) with the given inputs.

        Returns the body's results (values or Python constants), in output order.
        """
        target = self.frame.graph if graph is None else graph
        if target is None:  # (a frame's graph is always set; None would mean the main graph)
            target = self.emitter.graph
        if prefix is None:
            prefix = f"{self.frame.prefix}{self.node.name}/{body}/"
        before = len(target)
        try:
            results = self.emitter.emit_body(
                self.bodies[body],
                inputs,
                graph=target,
                prefix=prefix,
                stamp_from=self.frame.stamp_from,
            )
        except LoweringError as exc:
            raise LoweringError(
                f"in {_label(self.node)}.{body}: {exc}",
                fx_node=f"{self.node.name}.{body}{_ARROW}{exc.fx_node}",
                target=exc.target,
                module_path=exc.module_path or module_path(self.node),
                source=exc.source,
            ) from exc
        self._adopt_scope(list(target)[before:])
        flat = list(results) if isinstance(results, (list, tuple)) else [results]
        return flat

    def _adopt_scope(self, nodes: Sequence[ir.Node]) -> None:
        """Body nodes without a module scope take the control-flow node's scope."""
        scope = self.emitter.stamper.props(self.frame.stamp_from or self.node)[metadata.SCOPE]
        if scope in ("", "[]"):
            return
        for ir_node in nodes:
            for inner in _all_nodes(ir_node):
                if inner.metadata_props.get(metadata.SCOPE, "[]") == "[]":
                    inner.metadata_props[metadata.SCOPE] = scope

    def outputs(self, graph: ir.Graph, results: Sequence[Any], body: str) -> list[ir.Value]:
        """Make ``results`` the outputs of ``graph``: each produced inside it, each once."""
        seen: set[int] = set()
        outputs = []
        for i, result in enumerate(results):
            value = self.as_value(result, graph)
            producer = value.producer()
            if id(value) in seen or producer is None or producer.graph is not graph:
                out = self.recorder.new_value(shape=value.shape, type=value.type)
                self.recorder.nodes.append(ir.Node("", "Identity", [value], outputs=[out]))
                self.flush(graph, f"{body}/out{i}")
                value = out
            value.name = f"{self.frame.prefix}{self.node.name}/{body}/out{i}"
            seen.add(id(value))
            outputs.append(value)
        return outputs

    def node_outputs(self, count: int) -> list[ir.Value]:
        return [self.recorder.new_value() for _ in range(count)]

    def record(self, ir_node: ir.Node) -> tuple[ir.Value, ...]:
        self.recorder.nodes.append(ir_node)
        return tuple(ir_node.outputs)

    def fail(self, message: str) -> IrkitError:
        return LoweringError(
            message,
            fx_node=self.node.name,
            target=_label(self.node),
            module_path=module_path(self.node),
            source=node_location(self.node),
        )


def _all_nodes(node: ir.Node) -> Iterator[ir.Node]:
    yield node
    for attr in node.attributes.values():
        if attr.type == ir.AttributeType.GRAPH:
            for inner in attr.value:
                yield from _all_nodes(inner)
        elif attr.type == ir.AttributeType.GRAPHS:
            for graph in attr.value:
                for inner in graph:
                    yield from _all_nodes(inner)


def _placeholders(ctx: _Context, body: str) -> list[torch.fx.Node]:
    graph = ctx.bodies[body].graph_module.graph
    return [n for n in graph.nodes if n.op == "placeholder"]


def _subgraph(ctx: _Context, body: str, inputs: Sequence[ir.Value]) -> ir.Graph:
    return ir.Graph(list(inputs), [], nodes=[], name=f"{ctx.frame.prefix}{ctx.node.name}/{body}")


# --- cond → If ---------------------------------------------------------------------------------
def _cond(ctx: _Context) -> Any:
    pred_arg, _, _, operands = ctx.args
    pred = ctx.value(pred_arg)
    operands = [ctx.value(a) for a in operands]
    if isinstance(pred, (bool, int)):  # a predicate torch.export already knew: one branch
        return tuple(ctx.emit("true_branch" if pred else "false_branch", operands, None))
    if not isinstance(pred, ir.Value):
        raise ctx.fail(f"the predicate is a {type(pred).__name__}, expected a tensor or SymBool.")
    if pred.dtype not in (None, ir.DataType.BOOL):
        pred = ctx.recorder.opset.Cast(pred, to=int(ir.DataType.BOOL))
        ctx.flush(None, "pred")
    branches = []
    for body in ("true_branch", "false_branch"):
        graph = _subgraph(ctx, body, [])
        graph.outputs.extend(ctx.outputs(graph, ctx.emit(body, operands, graph), body))
        branches.append(graph)
    count = len(branches[0].outputs)
    if count != len(branches[1].outputs):
        raise ctx.fail("the branches return different numbers of outputs.")
    return ctx.record(
        ir.Node(
            "",
            "If",
            [pred],
            attributes=[
                ir.AttrGraph("then_branch", branches[0]),
                ir.AttrGraph("else_branch", branches[1]),
            ],
            outputs=ctx.node_outputs(count),
        )
    )


# --- while_loop → Loop -------------------------------------------------------------------------
def _while_loop(ctx: _Context) -> Any:
    _, _, carried_args, additional_args = ctx.args
    carried = [ctx.as_value(a) for a in carried_args]
    additional = [ctx.value(a) for a in additional_args]
    prefix = f"{ctx.frame.prefix}{ctx.node.name}"
    # The condition before the first iteration, in the enclosing graph.
    [first] = ctx.emit("cond_fn", [*carried, *additional], None, prefix=f"{prefix}/cond_init/")
    first = _as_bool(ctx, ctx.as_value(first), None)

    holders = _placeholders(ctx, "body_fn")[: len(carried)]
    iteration = ctx.recorder.new_value(
        name=f"{prefix}/iter", type=ir.TensorType(ir.DataType.INT64), shape=ir.Shape([])
    )
    condition = ctx.recorder.new_value(
        name=f"{prefix}/cond_in", type=ir.TensorType(ir.DataType.BOOL), shape=ir.Shape([])
    )
    states = [ctx.new_input(p, f"{prefix}/body_fn/{p.name}") for p in holders]
    graph = _subgraph(ctx, "body_fn", [iteration, condition, *states])
    updated = ctx.emit("body_fn", [*states, *additional], graph)
    updated_values = [ctx.as_value(u, graph) for u in updated]
    [again] = ctx.emit("cond_fn", [*updated_values, *additional], graph)
    again = _as_bool(ctx, ctx.as_value(again, graph), graph)
    graph.outputs.extend(ctx.outputs(graph, [again, *updated_values], "body_fn"))
    return ctx.record(
        ir.Node(
            "",
            "Loop",
            [None, first, *carried],
            attributes=[ir.AttrGraph("body", graph)],
            outputs=ctx.node_outputs(len(carried)),
        )
    )


def _as_bool(ctx: _Context, value: ir.Value, graph: ir.Graph | None) -> ir.Value:
    if value.dtype in (None, ir.DataType.BOOL):
        return value
    cast: ir.Value = ctx.recorder.opset.Cast(value, to=int(ir.DataType.BOOL))
    ctx.flush(graph, "cond_cast")
    return cast


# --- scan / map → Scan -------------------------------------------------------------------------
def _scan(ctx: _Context) -> Any:
    _, init_args, xs_args, additional_args = ctx.args
    return _emit_scan(ctx, "combine_fn", init_args, xs_args, additional_args)


def _map_impl(ctx: _Context) -> Any:
    _, xs_args, args = ctx.args
    return _emit_scan(ctx, "body_fn", (), xs_args, args)


def _emit_scan(
    ctx: _Context, body: str, init_args: Sequence[Any], xs_args: Sequence[Any], extra: Sequence[Any]
) -> Any:
    init = [ctx.as_value(a) for a in init_args]
    xs = [ctx.as_value(a) for a in xs_args]
    if not xs:
        raise ctx.fail("nothing to scan over (no xs). Fix: pass at least one tensor to scan.")
    additional = [ctx.value(a) for a in extra]
    prefix = f"{ctx.frame.prefix}{ctx.node.name}/{body}/"
    holders = _placeholders(ctx, body)[: len(init) + len(xs)]
    inputs = [ctx.new_input(p, f"{prefix}{p.name}") for p in holders]
    graph = _subgraph(ctx, body, inputs)
    results = ctx.emit(body, [*inputs, *additional], graph)
    graph.outputs.extend(ctx.outputs(graph, results, body))
    return ctx.record(
        ir.Node(
            "",
            "Scan",
            [*init, *xs],
            attributes=[ir.AttrGraph("body", graph), ir.AttrInt64("num_scan_inputs", len(xs))],
            outputs=ctx.node_outputs(len(results)),
        )
    )


# --- invoke_subgraph → a local function --------------------------------------------------------
def _invoke_subgraph(ctx: _Context) -> Any:
    _, identifier, *operands = ctx.args
    key = str(identifier) if identifier is not None else f"{ctx.node.name}"
    state: ControlFlowState = ctx.emitter.control_flow
    function = state.functions.get(key)
    if function is None:
        function = state.functions[key] = _build_function(ctx, key)
        ctx.emitter.graph.opset_imports.setdefault(function.domain, 1)
        ctx.recorder.functions[function.identifier()] = function  # (kept by the assembly)
    args = [ctx.as_value(a) for a in operands]
    return ctx.record(
        ir.Node(
            function.domain,
            function.name,
            args,
            outputs=ctx.node_outputs(len(function.outputs)),
        )
    )


def _build_function(ctx: _Context, key: str) -> ir.Function:
    from irkit.metadata import function_domain  # (named like outlined modules)

    scope = node_scope(ctx.node)
    if scope:
        domain, base = function_domain(scope[-1]), scope[-1].class_name
    else:
        domain, base = SUBGRAPH_DOMAIN, key
    function = _new_function(ctx, "subgraph", domain, base)
    function.doc_string = f"torch invoke_subgraph {key!r}"
    function.metadata_props[metadata.INVOKE_SUBGRAPH] = key
    if scope:
        function.metadata_props[metadata.OUTLINE_ORIGIN] = metadata.encode_scope(scope)
    return function


_LOWERINGS: dict[str, Callable[[_Context], Any]] = {
    "cond": _cond,
    "while_loop": _while_loop,
    "scan": _scan,
    "map": _map_impl,
    "invoke_subgraph": _invoke_subgraph,
}


def lower_custom_op(
    emitter: BodyEmitter, frame: Frame, node: torch.fx.Node, body: Decomposition
) -> Any:
    """A call of the local function whose body is ``body``, the traced Python implementation of
    ``node``'s custom op; returns its outputs (recorded, not yet appended).

    Calls whose traced bodies are the same code share one function (a model calls its mixer
    kernel once per layer). The function's inputs are the node's tensor arguments in order; its
    Python arguments (flags, scales) are baked into the body.
    """
    from torch._library.custom_ops import _maybe_get_opdef

    ctx = _Context(emitter, frame, node, {"body": body})
    opdef = _maybe_get_opdef(node.target)
    qualname = opdef._qualname if opdef is not None else str(node.target)
    key = f"{qualname}\n{body.graph_module.code}"
    state = emitter.control_flow
    function = state.functions.get(key)
    if function is None:
        domain, _, base = qualname.partition("::")
        function = state.functions[key] = _new_function(ctx, "body", domain, base)
        function.doc_string = f"torch custom op {qualname} (its Python implementation)"
        function.metadata_props[metadata.CUSTOM_OP] = qualname
        emitter.graph.opset_imports.setdefault(domain, 1)
        emitter.recorder.functions[function.identifier()] = function
    import torch.utils._pytree as pytree

    flat, _ = pytree.tree_flatten((node.args, node.kwargs))
    args = [ctx.as_value(a) for a in flat if isinstance(a, torch.fx.Node)]
    outputs = ctx.record(
        ir.Node(
            function.domain, function.name, args, outputs=ctx.node_outputs(len(function.outputs))
        )
    )
    return outputs if isinstance(node.meta.get("val"), (list, tuple)) else outputs[0]


def _new_function(ctx: _Context, body: str, domain: str, base: str) -> ir.Function:
    """A local function whose graph is ``body`` emitted on fresh inputs, named ``base`` (or
    ``base_1``, … when another function of ``domain`` has the name)."""
    state = ctx.emitter.control_flow
    name, k = base, 0
    while (domain, name) in state.names:
        k += 1
        name = f"{base}_{k}"
    state.names.add((domain, name))
    inputs = [ctx.new_input(p, p.name) for p in _placeholders(ctx, body)]
    graph = ir.Graph(inputs, [], nodes=[], name=name)
    results = ctx.emit(body, inputs, graph, prefix="")
    graph.outputs.extend(ctx.outputs(graph, results, body))
    for i, out in enumerate(graph.outputs):
        out.name = f"output_{i}"
    opsets = {"": ctx.emitter.graph.opset_imports.get("", 18)}
    for body_node in graph:
        if body_node.domain not in opsets:
            opsets[body_node.domain] = 1
    graph.opset_imports.update(opsets)
    return ir.Function(domain, name, graph=graph, attributes=[])


def convert_keeping_functions(model: ir.Model, convert: Callable[[ir.Model], None]) -> None:
    """Run an opset conversion on ``model`` without inlining its ``invoke_subgraph`` and custom
    op functions.

    onnxscript's version converter inlines every local function first; the functions the user
    marked as repeated (and those of custom ops) are taken out, the main graph converted, and each
    function body converted on its own (a body's calls of other functions are left alone by the
    converter).
    """
    kept = {
        key: function
        for key, function in model.functions.items()
        if metadata.INVOKE_SUBGRAPH in function.metadata_props
        or metadata.CUSTOM_OP in function.metadata_props
    }
    for key in kept:
        del model.functions[key]
    convert(model)
    for key, function in kept.items():
        body = ir.Model(function.graph, ir_version=model.ir_version)
        convert(body)
        if body.graph is not function.graph:  # the converter must convert in place
            raise LoweringOptionsError(
                f"the opset conversion replaced the body of function {key} instead of "
                "converting it in place: the function would keep torchlib's opset. This is "
                "likely a bug in irkit (or onnxscript's version converter); please report it "
                "with this message."
            )
        model.functions[key] = function


def uses_predispatch_vmap(graph: torch.fx.Graph) -> bool:
    """Whether the program holds pre-dispatch ``vmap`` nodes (``_add_batch_dim`` …).

    ``torch.export`` traces ``associative_scan(..., combine_mode="generic")`` (and ``torch.vmap``)
    into them; they have no ONNX meaning, and ``ep.run_decompositions({})`` replaces them by
    plain aten ops.
    """
    return any(
        node.op == "call_function"
        and getattr(node.target, "__module__", "") == "torch._functorch.predispatch"
        for node in graph.nodes
    )
