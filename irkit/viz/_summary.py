"""The model's call hierarchy as a tree of :class:`Call` instances, with counts and shapes.

A call node is a node whose ``(domain, op_type, overload)`` names an entry of
``model.functions``. A function body shared by many call nodes (a deduplicated layer) is
analysed once; every call *instance* gets its own :class:`Call` (its module path, parameter
count, outputs) in the tree. Models not made by irkit (no ``irkit.call`` metadata) fall back to
function names and node names.

Nothing here re-implements another stage: call frames are read with
:func:`irkit.metadata.node_call`, the module paths inside a shared body are re-rooted at each
call site with :func:`irkit.hierarchy.reroot_scope` (as :func:`irkit.inline` and
:func:`irkit.function_tree` do, so ``enc@1``'s submodules read ``enc.lin@1`` everywhere), and
dims are :func:`irkit.rewriting.dims`.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import re
from collections import Counter
from collections.abc import Iterator, Sequence

import onnx_ir as ir

from irkit import metadata
from irkit.errors import MetadataError, VizError
from irkit.hierarchy import reroot_scope
from irkit.rewriting import dims
from irkit.viz import _flops

logger = logging.getLogger(__name__)

__all__ = [
    "Body",
    "Call",
    "ModelSummary",
    "TensorInfo",
    "summarize",
    "function_key",
    "call_frame",
    "function_origin",
    "scope_of",
    "numel_bytes",
]

FunctionId = tuple[str, str, str]


def function_key(identifier: FunctionId) -> str:
    """``"domain::name"`` (plus ``":overload"``) — how functions are named in every output."""
    domain, name, overload = identifier
    key = f"{domain}::{name}" if domain else name
    return f"{key}:{overload}" if overload else key


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    """Name, element type and shape of a value; ``shape`` is ``None`` when unknown."""

    name: str
    dtype: str | None
    shape: tuple[int | str | None, ...] | None

    @classmethod
    def of(cls, value: ir.Value | None) -> TensorInfo:
        if value is None:
            return cls("", None, None)
        dtype = value.dtype.short_name() if value.dtype is not None else None
        return cls(value.name or "", dtype, dims(value))

    def type_text(self) -> str:
        """``f32[B,S,64]``; ``?`` for what is unknown."""
        if self.shape is None:
            dims = "?"
        else:
            dims = "[" + ",".join("?" if d is None else str(d) for d in self.shape) + "]"
        if self.dtype is None and self.shape is None:
            return "?"
        return f"{self.dtype or '?'}{dims}"


@dataclasses.dataclass
class Body:
    """What is known about one graph body (the main graph or one function), independent of calls.

    Attributes:
        key: ``"main"`` or the function key (see :func:`function_key`).
        graph: The ``ir.Graph`` or ``ir.Function``.
        identifier: ``(domain, name, overload)`` for functions, ``None`` for the main graph.
        own_ops: Histogram of the non-call nodes directly in this body.
        ops: Histogram of all primitive nodes executed by one call (callees expanded).
        flops: Estimated FLOPs of one call (see :mod:`irkit.viz._flops`).
        calls: Number of call nodes in the whole model (all instances) that call this body.
        input_infos: The body's inputs; for a function, types missing from the body (ONNX
            function inputs carry none) are taken from the first call site that knows them.
        owner: For a control-flow subgraph (``If``'s ``then_branch``, ``Loop``'s ``body``,
            ``Scan``'s ``body``): the node that owns it; ``None`` for the main graph and
            functions. A subgraph's ops are counted in its own body only, not in its owner's.
    """

    key: str
    graph: ir.Graph | ir.Function
    identifier: FunctionId | None
    own_ops: Counter[str] = dataclasses.field(default_factory=Counter)
    ops: Counter[str] = dataclasses.field(default_factory=Counter)
    flops: _flops.Flops = dataclasses.field(default_factory=_flops.Flops)
    calls: int = 0
    input_infos: list[TensorInfo] = dataclasses.field(default_factory=list)
    owner: ir.Node | None = None

    @property
    def is_main(self) -> bool:
        return self.key == "main"

    @property
    def node_count(self) -> int:
        """Primitive nodes executed by one call of this body."""
        return sum(self.ops.values())

    @property
    def stored_nodes(self) -> int:
        """Nodes stored in this body (call nodes included)."""
        return len(self.graph)


@dataclasses.dataclass
class Call:
    """One call instance in the hierarchy (the root stands for the main graph).

    Attributes:
        path: Module path of this instance (``"layers.3.attn"``; ``""`` for the root).
        cls: Qualified class name (``irkit.call``) or the function's ``domain.name``.
        body: The callee's :class:`Body`.
        node: The call node in its caller (``None`` for the root).
        params: Parameter elements flowing into this call (graph initializers, by shape).
        param_bytes: Their size in bytes.
        outputs: The call's outputs (for the root: the graph outputs).
        children: The calls made by this instance's body, in graph order.
        depth: 0 for the root.
        part: ``(k, n)`` when the outliner split this module call into ``n`` convex parts and
            this call node is part ``k`` (0-based; its node is named ``"<path>/part<k>"``).
        subgraph: For a control-flow subgraph (``node`` is its If/Loop/Scan): the attribute
            (``"then_branch"``); its path is ``"<caller path>/<node name>.<attribute>"``.
        scope: The module calls enclosing this instance, itself last (``()`` for the root and
            for calls without ``irkit.call``): the call site its body is re-rooted at.
    """

    path: str
    cls: str
    body: Body
    node: ir.Node | None
    params: int = 0
    param_bytes: int = 0
    outputs: list[TensorInfo] = dataclasses.field(default_factory=list)
    children: list[Call] = dataclasses.field(default_factory=list)
    depth: int = 0
    part: tuple[int, int] | None = None
    subgraph: str | None = None
    scope: tuple[metadata.Frame, ...] = ()

    @property
    def class_name(self) -> str:
        return self.cls.rsplit(".", 1)[-1]

    @property
    def function_name(self) -> str:
        """The callee's function name (``"Linear_1"`` for a variant of ``Linear``); ``""`` for
        the root."""
        identifier = self.body.identifier
        return identifier[1] if identifier is not None else ""

    def label(self, parent: str) -> str:
        """The path relative to ``parent``, with ``[part 1/2]`` for a split call."""
        text = relative_name(self.path, parent)
        return text if self.part is None else f"{text} [part {self.part[0] + 1}/{self.part[1]}]"

    def walk(self) -> Iterator[Call]:
        """This call and all calls below it, depth first, in graph order."""
        yield self
        for child in self.children:
            yield from child.walk()


@dataclasses.dataclass
class ModelSummary:
    """Everything the renderers need, computed once from an ``ir.Model``.

    Attributes:
        model: The model (not modified).
        root: The call tree; ``root.body.key == "main"``.
        bodies: ``{key: Body}`` for the main graph and every function (functions never called
            from the main graph included).
        inputs: Graph inputs (initializers excluded).
        outputs: Graph outputs.
        params: Total parameter elements (all graph initializers, by shape).
        param_bytes: Their total size.
        name: A display name (file name or graph name).
        call_names: For each call node, its instance name relative to the caller's module path
            (``"attn"`` inside a ``Block`` body; the full path in the main graph).
        subgraphs: ``{(node, attribute): body key}`` for every control-flow subgraph
            (attribute ``"then_branch"``; ``"name[i]"`` for a list of graphs).
    """

    model: ir.Model
    root: Call
    bodies: dict[str, Body]
    inputs: list[TensorInfo]
    outputs: list[TensorInfo]
    params: int
    param_bytes: int
    name: str
    call_names: dict[ir.Node, str] = dataclasses.field(default_factory=dict)
    subgraphs: dict[tuple[ir.Node, str], str] = dataclasses.field(default_factory=dict)

    def functions(self) -> list[tuple[FunctionId, Body]]:
        """Each function body with its ``(domain, name, overload)``."""
        return [(b.identifier, b) for b in self.bodies.values() if b.identifier is not None]

    def function_bodies(self) -> list[Body]:
        return [body for _, body in self.functions()]

    def find_body(self, name: str) -> Body | None:
        """The body named ``name``: a function key, a bare function name, or a module path."""
        if name in self.bodies:
            return self.bodies[name]
        for (_, function_name, _), body in self.functions():
            if name in (function_name, body.key):
                return body
        for call in self.root.walk():
            if call.path == name:
                return call.body
        return None


def numel_bytes(value: ir.Value) -> tuple[int, int]:
    """Element count and bytes of a parameter, from its shape and dtype (data not read)."""
    tensor = value.const_value
    shape = dims(value)
    if tensor is not None and shape is None:
        shape = tuple(tensor.shape.numpy())
    sizes = [d for d in shape or () if isinstance(d, int)]
    if shape is None or len(sizes) != len(shape):
        return 0, 0
    numel = math.prod(sizes)
    dtype = value.dtype if value.dtype is not None else (tensor.dtype if tensor else None)
    if dtype is None:
        return numel, 0
    return numel, (numel * dtype.bitwidth + 7) // 8


def call_frame(node: ir.Node) -> metadata.Frame | None:
    """:func:`irkit.metadata.node_call`, where malformed metadata counts as none (logged at debug
    level): a broken model is still shown."""
    try:
        return metadata.node_call(node.metadata_props)
    except MetadataError:
        logger.debug("ignoring malformed %s on node %r", metadata.CALL_MODULE, node.name)
        return None


def scope_of(node: ir.Node) -> tuple[metadata.Frame, ...]:
    """:func:`irkit.metadata.node_scope`, malformed metadata counting as the root scope."""
    try:
        return metadata.node_scope(node.metadata_props)
    except MetadataError:
        logger.debug("ignoring malformed %s on node %r", metadata.SCOPE, node.name)
        return ()


def function_origin(function: ir.Function) -> tuple[metadata.Frame, ...]:
    """The scope of the module call ``function``'s body was built from (``irkit.outline.origin``,
    ending with that call's frame); ``()`` when absent or malformed."""
    try:
        return metadata.decode_scope(function.metadata_props.get(metadata.OUTLINE_ORIGIN))
    except MetadataError:
        logger.debug("ignoring malformed %s on %s", metadata.OUTLINE_ORIGIN, function.name)
        return ()


def _borrow_input_types(caller: Body, callee: Body, node: ir.Node) -> None:
    """Fill unknown input types of ``callee`` from the arguments of call node ``node``."""
    formal = {v: i for i, v in enumerate(caller.graph.inputs)}
    for i, (info, arg) in enumerate(zip(callee.input_infos, node.inputs, strict=False)):
        if arg is not None and (info.dtype is None or info.shape is None):
            known = caller.input_infos[formal[arg]] if arg in formal else TensorInfo.of(arg)
            callee.input_infos[i] = TensorInfo(
                info.name, info.dtype or known.dtype, info.shape or known.shape
            )


class _Builder:
    """Builds the tree; holds per-model state so nothing is global."""

    def __init__(self, model: ir.Model):
        self.model = model
        self.functions: dict[FunctionId, ir.Function] = dict(model.functions)
        self.bodies: dict[str, Body] = {}
        self.call_sites: dict[FunctionId, list[tuple[metadata.Frame, ...]]] = {}
        self.call_names: dict[ir.Node, str] = {}
        self.subgraphs: dict[tuple[ir.Node, str], str] = {}
        self.node_subgraphs: dict[ir.Node, list[tuple[str, str]]] = {}
        self._stack: list[FunctionId] = []

    def callee(self, node: ir.Node) -> ir.Function | None:
        return self.functions.get((node.domain, node.op_type, node.overload))

    def body(self, graph: ir.Graph | ir.Function, identifier: FunctionId | None) -> Body:
        key = "main" if identifier is None else function_key(identifier)
        if identifier is not None and identifier in self._stack:
            raise VizError(
                f"function {key!r} calls itself (directly or through other functions); "
                "recursion is not valid ONNX. Fix the model's functions."
            )
        if key in self.bodies:
            return self.bodies[key]
        body = Body(key, graph, identifier)
        body.input_infos = [TensorInfo.of(v) for v in graph.inputs]
        self.bodies[key] = body
        if identifier is not None:
            self._stack.append(identifier)
        for index, node in enumerate(graph):
            self.subgraph_bodies(key, node, index)
            function = self.callee(node)
            if function is None:
                body.own_ops[_op_name(node)] += 1
                body.ops[_op_name(node)] += 1
                continue
            callee = self.body(function, function.identifier())
            body.ops.update(callee.ops)
            frame = call_frame(node)
            if frame is not None:
                site = (*scope_of(node), frame)
                self.call_sites.setdefault(function.identifier(), []).append(site)
        if identifier is not None:
            self._stack.pop()
        return body

    def subgraph_bodies(self, parent: str, node: ir.Node, index: int) -> None:
        """Bodies for the subgraphs ``node`` owns (If, Loop, Scan), keyed
        ``"<parent key>/<node name>.<attribute>"``."""
        for attr in node.attributes.values():
            if attr.type == ir.AttributeType.GRAPH:
                graphs = [(attr.name, attr.as_graph())]
            elif attr.type == ir.AttributeType.GRAPHS:
                graphs = [(f"{attr.name}[{i}]", g) for i, g in enumerate(attr.as_graphs())]
            else:
                continue
            name = node.name or f"{node.op_type}#{index}"
            for label, graph in graphs:
                key = f"{parent}/{name}.{label}"
                body = Body(key, graph, None, owner=node)
                body.input_infos = [TensorInfo.of(v) for v in graph.inputs]
                self.bodies[key] = body
                self.subgraphs[(node, label)] = key
                self.node_subgraphs.setdefault(node, []).append((label, key))
                for k, inner in enumerate(graph):
                    self.subgraph_bodies(key, inner, k)
                    function = self.callee(inner)
                    if function is None:
                        body.own_ops[_op_name(inner)] += 1
                        body.ops[_op_name(inner)] += 1
                    else:
                        body.ops.update(self.body(function, function.identifier()).ops)

    def flops(self, body: Body, done: set[str]) -> _flops.Flops:
        """Fill ``body.flops`` (callees first); input shapes come from ``body.input_infos``."""
        if body.key in done:
            return body.flops
        done.add(body.key)
        formal = {v: info for v, info in zip(body.graph.inputs, body.input_infos, strict=True)}

        def shape_of(value: ir.Value) -> tuple[int | str | None, ...] | None:
            return (formal[value] if value in formal else TensorInfo.of(value)).shape

        shapes = _flops.ShapeTracker(shape_of)
        for node in body.graph:
            function = self.callee(node)
            if function is None:
                body.flops += shapes.flops(node)
            else:
                body.flops += self.flops(self.bodies[function_key(function.identifier())], done)
        return body.flops

    def instance_scope(
        self, node: ir.Node, function: ir.Function, parent: Call, index: int
    ) -> tuple[str, str, tuple[metadata.Frame, ...]]:
        """(module path, class, scope) of a call node of ``function`` called from ``parent``'s
        body."""
        frame = call_frame(node)
        cls = f"{function.domain}.{function.name}" if function.domain else function.name
        if frame is None:
            name = node.name or f"{node.op_type}_{index}"
            return (f"{parent.path}.{name}" if parent.path else name), cls, parent.scope
        scope = (*scope_of(node), frame)
        parent_fn = self.callee(parent.node) if parent.node is not None else None
        if parent_fn is not None and parent.scope:
            # Inside a shared body the stored scope is that of the call the body was made from;
            # re-root it at this instance, the way irkit.inline does.
            origin = self.origin(parent_fn, frame)
            if origin and len(scope) == 1 and frame.path.startswith(origin[-1].path + "."):
                scope = (*origin, frame)  # a call node without irkit.scope (other tools)
            if origin and scope[: len(origin)] == origin:
                scope = reroot_scope(scope, origin, parent.scope)
        return scope[-1].call_id, frame.cls, scope

    def origin(self, function: ir.Function, inner: metadata.Frame) -> tuple[metadata.Frame, ...]:
        """The scope of the call the body of ``function`` was built from: its recorded origin,
        else (models outlined by other tools) the first of its call sites that encloses
        ``inner``."""
        recorded = function_origin(function)
        if recorded:
            return recorded
        sites = self.call_sites.get(function.identifier(), [])
        for site in sites:
            if inner.path.startswith(site[-1].path + "."):
                return site
        return sites[0] if sites else ()

    def expand(self, call: Call, params: dict[ir.Value, tuple[int, int]]) -> None:
        """Fill ``call.children`` recursively; ``params`` maps body values to parameter sizes."""
        for index, node in enumerate(call.body.graph):
            for label, key in self.node_subgraphs.get(node, ()):
                self.expand_subgraph(call, node, label, key, params)
            function = self.callee(node)
            if function is None:
                continue
            path, cls, scope = self.instance_scope(node, function, call, index)
            _borrow_input_types(call.body, self.bodies[function_key(function.identifier())], node)
            self.call_names.setdefault(node, relative_name(path, call.path))
            child = Call(
                path,
                cls,
                self.bodies[function_key(function.identifier())],
                node,
                depth=call.depth + 1,
                outputs=[TensorInfo.of(v) for v in node.outputs],
                scope=scope,
            )
            inner: dict[ir.Value, tuple[int, int]] = {}
            seen: set[ir.Value] = set()
            for arg, formal in zip(node.inputs, function.inputs, strict=False):
                if arg is not None and arg in params:
                    inner[formal] = params[arg]
                    if arg not in seen:
                        seen.add(arg)
                        child.params += params[arg][0]
                        child.param_bytes += params[arg][1]
            call.children.append(child)
            self.expand(child, inner)
        _mark_parts(call.children)

    def expand_subgraph(
        self,
        call: Call,
        node: ir.Node,
        label: str,
        key: str,
        params: dict[ir.Value, tuple[int, int]],
    ) -> None:
        """A control-flow subgraph as a child call: path ``<caller>/<node>.<attribute>``."""
        body = self.bodies[key]
        name = f"{node.name or node.op_type}.{label}"
        path = f"{call.path}/{name}" if call.path else name
        self.call_names.setdefault(node, node.name or node.op_type)
        child = Call(
            path,
            node.op_type,
            body,
            node,
            depth=call.depth + 1,
            outputs=[TensorInfo.of(v) for v in body.graph.outputs],
            subgraph=label,
            scope=call.scope,
        )
        call.children.append(child)
        self.expand(child, params)


_PART = re.compile(r"/part(\d+)$")


def _mark_parts(children: list[Call]) -> None:
    """Number the convex parts of split module calls (call nodes named ``"<path>/part<k>"``)."""
    parts: dict[str, list[tuple[Call, int]]] = {}
    for child in children:
        name = (child.node.name if child.node is not None else None) or ""
        match = _PART.search(name)
        if match and name[: match.start()] == child.path:
            parts.setdefault(child.path, []).append((child, int(match.group(1))))
    for group in parts.values():
        for child, k in group:
            child.part = (k, len(group))


def relative_name(path: str, parent: str) -> str:
    """``"layers.0.attn"`` under ``"layers.0"`` → ``"attn"`` (``"layers.0/If_3.then_branch"``
    → ``"If_3.then_branch"``); unrelated paths stay whole."""
    if parent and (path.startswith(parent + ".") or path.startswith(parent + "/")):
        return path[len(parent) + 1 :]
    return path


def _op_name(node: ir.Node) -> str:
    return f"{node.domain}::{node.op_type}" if node.domain not in ("", "ai.onnx") else node.op_type


def summarize(model: ir.Model, *, name: str | None = None) -> ModelSummary:
    """Analyse ``model``'s call hierarchy, op counts, parameters and shapes (read only).

    Args:
        model: Any ONNX model as ``ir.Model`` (with or without irkit metadata).
        name: Display name (default: the main graph's name).

    Returns:
        The :class:`ModelSummary`.

    Raises:
        VizError: A function calls itself (directly or through others).

    Example:
        >>> import onnx_ir as ir
        >>> m = ir.from_onnx_text('<ir_version: 10, opset_import: ["" : 21]> g (float[2] x) => (float[2] y) { y = Relu(x) }')
        >>> s = summarize(m)
        >>> s.root.body.node_count, dict(s.root.body.ops)
        (1, {'Relu': 1})
    """
    builder = _Builder(model)
    main = builder.body(model.graph, None)
    for function in model.functions.values():
        builder.body(function, function.identifier())
    params: dict[ir.Value, tuple[int, int]] = {
        v: numel_bytes(v) for v in model.graph.initializers.values()
    }
    root = Call(
        "",
        model.graph.name or "main",
        main,
        None,
        outputs=[TensorInfo.of(v) for v in model.graph.outputs],
    )
    root.params = sum(p[0] for p in params.values())
    root.param_bytes = sum(p[1] for p in params.values())
    builder.expand(root, params)
    done: set[str] = set()
    for body in builder.bodies.values():
        builder.flops(body, done)
    for call in root.walk():
        if call.node is not None:
            call.body.calls += 1
    initializers = set(model.graph.initializers)
    inputs = [TensorInfo.of(v) for v in model.graph.inputs if v.name not in initializers]
    return ModelSummary(
        subgraphs=builder.subgraphs,
        model=model,
        root=root,
        bodies=builder.bodies,
        inputs=inputs,
        outputs=list(root.outputs),
        params=root.params,
        param_bytes=root.param_bytes,
        name=name or model.graph.name or "model",
        call_names=builder.call_names,
    )


def call_sites(summary: ModelSummary, key: str) -> Sequence[Call]:
    """Every call instance of the body ``key``, in tree order."""
    return [c for c in summary.root.walk() if c.node is not None and c.body.key == key]
