"""Emission: walk the FX graph node by node and append ONNX nodes to an ``ir.Graph``."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import onnx_ir as ir
import torch
from onnxscript import evaluator as os_evaluator
from torch.export.graph_signature import ConstantArgument, InputKind, OutputKind

from irkit.errors import IrkitError, LoweringError, LoweringOptionsError, OpCallError
from irkit.lowering._control_flow import (
    ControlFlowState,
    lower_control_flow,
    lower_custom_op,
)
from irkit.lowering._plan_types import Choice, Decomposition, Env, Frame, Plan, Via
from irkit.lowering._promotion import input_casts, output_cast
from irkit.lowering._rank0 import is_rank0_dim_op, lift_rank0, lower_to_rank0
from irkit.lowering._recorder import Recorder, call_lowering
from irkit.lowering._regions import region_op, region_operands
from irkit.lowering._source import (
    MetadataStamper,
    module_path,
    node_location,
    op_name,
    python_spelling,
)
from irkit.lowering._types import SymbolNames, has_no_data, onnx_dtype, torch_tensor_to_ir
from irkit.weights import WeightlessTensor

__all__ = ["Emitter"]

logger = logging.getLogger(__name__)


class Emitter:
    """Lowers one ExportedProgram into ``self.graph``. Create one per :func:`irkit.lower` call."""

    def __init__(
        self,
        ep: torch.export.ExportedProgram,
        recorder: Recorder,
        *,
        input_names: Sequence[str] | None,
        output_names: Sequence[str] | None,
        dim_names: Mapping[str, str] | None = None,
        progress: Callable[[int], None] | None = None,
    ):
        self.ep = ep
        self.recorder = recorder
        self.symbols = SymbolNames(ep, dim_names)
        self.stamper = MetadataStamper()
        self.graph = ir.Graph([], [], nodes=[], name="main_graph")
        self._input_specs = {s.arg.name: s for s in ep.graph_signature.input_specs}
        # torch.export specializes Python constants (``use_cache=True``, ``mask=None``): they are
        # ConstantArgument user inputs, baked into the graph, and never ONNX inputs.
        self._user_inputs = [
            s.arg.name
            for s in ep.graph_signature.input_specs
            if s.kind == InputKind.USER_INPUT and not isinstance(s.arg, ConstantArgument)
        ]
        self._input_names = _check_names("input_names", input_names, len(self._user_inputs))
        self._output_names = output_names
        self._tensors_by_storage: dict[tuple[Any, ...], ir.Value] = {}
        self.env: Env = {}
        self._required: dict[Any, frozenset[str]] = {}
        self._alias_memo: dict[Any, bool] = {}
        self.control_flow = ControlFlowState()
        self._progress = progress
        self._handlers: Mapping[str, Callable[[Frame, torch.fx.Node], None]] = {
            "placeholder": self._placeholder,
            "call_function": self._call_function,
            "output": self._output,
            "get_attr": self._get_attr,
        }

    def run(self, plan: Plan) -> ir.Graph:
        frame = Frame(plan, self.env, graph=self.graph)
        for node in self.ep.graph.nodes:
            try:
                self._handlers[node.op](frame, node)
            except IrkitError:
                raise
            except Exception as exc:  # a bug or an unforeseen input: say where it happened
                raise LoweringError(
                    f"{type(exc).__name__}: {exc}. This is likely a bug in irkit; please report "
                    "it with this message.",
                    fx_node=node.name,
                    target=op_name(node.target) if node.op == "call_function" else node.op,
                    module_path=module_path(node),
                    source=node_location(node),
                ) from exc
            if self._progress is not None:
                self._progress(1)
        return self.graph

    def call_signatures(self) -> dict[str, tuple[list[str], list[str]]]:
        """Module call id → (input, output) ONNX value names, in the module's signature order.

        Only modules listed in ``preserve_module_call_signature`` at export time have one.
        """
        by_name = {node.name: value for node, value in self.env.items()}

        def names(specs: Sequence[Any]) -> list[str]:
            out = []
            for spec in specs:
                value = by_name.get(getattr(spec, "name", None))
                if isinstance(value, ir.Value) and value.name:
                    out.append(value.name)
            return out

        return {
            entry.fqn: (names(entry.signature.inputs), names(entry.signature.outputs))
            for entry in self.ep.module_call_graph
            if entry.fqn and entry.signature is not None
        }

    # --- placeholders: user inputs and weights ----------------------------------------------------
    def _placeholder(self, frame: Frame, node: torch.fx.Node) -> None:
        spec = self._input_specs[node.name]
        if spec.kind == InputKind.USER_INPUT and isinstance(spec.arg, ConstantArgument):
            frame.env[node] = spec.arg.value
        elif spec.kind == InputKind.USER_INPUT:
            index = self._user_inputs.index(node.name)
            name = self._input_names[index] if self._input_names else node.name
            value = self.recorder.new_value(name=name)
            self.set_type(value, node.meta.get("val"))
            self.graph.inputs.append(value)
            frame.env[node] = value
        elif spec.kind in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
            frame.env[node] = self._initializer(spec.target, node)
        else:
            raise LoweringError(
                f"input kind {spec.kind.name} is not supported by irkit.lower. "
                "Fix: export a model without custom objects or effect tokens.",
                fx_node=node.name,
                target="placeholder",
            )

    def _initializer(self, fqn: str, node: torch.fx.Node) -> ir.Value:
        tensor = self.ep.state_dict.get(fqn)
        if tensor is None:
            tensor = self.ep.constants.get(fqn)
        if not isinstance(tensor, torch.Tensor):
            raise LoweringError(
                f"no tensor named {fqn!r} in the program's state_dict or constants",
                fx_node=node.name,
                target="placeholder",
            )
        # Tied weights: several FQNs, one storage → one initializer.
        storage = tensor.untyped_storage()
        key = (
            storage._cdata if has_no_data(tensor) else storage.data_ptr(),  # meta: all 0
            tensor.storage_offset(),
            tuple(tensor.shape),
            tuple(tensor.stride()),
            tensor.dtype,
        )
        existing = self._tensors_by_storage.get(key)
        if existing is not None and tensor.numel() > 0:
            if isinstance(existing.const_value, WeightlessTensor):
                existing.const_value.aliases.append(fqn)  # the checkpoint may name it so
            return existing
        ir_tensor = torch_tensor_to_ir(tensor, fqn)
        value = self.recorder.new_value(
            name=fqn,
            shape=ir.Shape(ir_tensor.shape),
            type=ir.TensorType(ir_tensor.dtype),
            const_value=ir_tensor,
        )
        self.graph.register_initializer(value)
        self._tensors_by_storage[key] = value
        return value

    def _get_attr(self, frame: Frame, node: torch.fx.Node) -> None:
        """A submodule reference (the body of a higher-order op): nothing to emit.

        The higher-order op that uses it resolves the body from the node itself.
        """
        owner = node.graph.owning_module
        target: Any = owner
        for part in str(node.target).split("."):
            target = getattr(target, part, None)
        if isinstance(target, torch.fx.GraphModule):
            frame.env[node] = target
            return
        raise LoweringError(
            f"get_attr {node.target!r} refers to a {type(target).__name__}, not a submodule; "
            "irkit lowers get_attr only as the body of a higher-order op. Fix: lift the "
            "attribute into a parameter, buffer or constant of the exported module.",
            fx_node=node.name,
            target=str(node.target),
            source=node_location(node),
        )

    # --- outputs ------------------------------------------------------------------------------
    def _output(self, frame: Frame, node: torch.fx.Node) -> None:
        specs = self.ep.graph_signature.output_specs
        results = list(node.args[0])
        user = [
            (s, r) for s, r in zip(specs, results, strict=False) if s.kind == OutputKind.USER_OUTPUT
        ]
        dropped = [s.target or s.arg.name for s in specs if s.kind != OutputKind.USER_OUTPUT]
        if dropped:
            logger.warning(
                "irkit.lower: the program mutates %s; ONNX inference graphs keep only the user "
                "outputs, so these updates are not emitted.",
                ", ".join(map(str, dropped)),
            )
        # A None leaf (``hidden_states=None`` in a ``ModelOutput`` without ``use_cache``) is no
        # tensor: ONNX has no output for it, as the stock exporter has none.
        kept = [index for index, (_, result) in enumerate(user) if result is not None]
        names = _check_names("output_names", self._output_names, len(kept))
        if names is None:
            every = _output_key_names(self.ep, [s.arg.name for s, _ in user])
            names = [every[index] for index in kept]
            # An output that is an input passed through (``x.contiguous()``) would share its name.
            taken = {v.name for v in self.graph.inputs} | set(self.graph.initializers)
            names = [f"{n}_output" if n in taken else n for n in names]
        if len(kept) < len(user):
            logger.info("irkit.lower: %d None outputs have no ONNX output.", len(user) - len(kept))
        seen: set[int] = set()
        for name, index in zip(names, kept, strict=True):
            result = user[index][1]
            value = self._as_output_value(frame, result, name)
            if (
                id(value) in seen
                or value.is_graph_input()
                or value.is_initializer()
                or value.producer() is None
            ):
                value = self._identity(value, name)
            value.name = name
            seen.add(id(value))
            self.graph.outputs.append(value)

    def _as_output_value(self, frame: Frame, result: Any, name: str) -> ir.Value:
        if isinstance(result, torch.fx.Node):
            value = frame.env[result]
            if not isinstance(value, ir.Value):
                raise LoweringError(
                    f"output {name!r} is a {type(value).__name__}, not a tensor; ONNX outputs "
                    "are tensors. Fix: return tensors from the exported module.",
                    fx_node=result.name,
                    target="output",
                    module_path=module_path(result),
                    source=node_location(result),
                )
            return value
        with os_evaluator.default_as(self.recorder):
            value = self.recorder.constant(result, None)
        self.append(self.recorder.take_nodes(), {}, name)
        return value

    def _identity(self, value: ir.Value, name: str) -> ir.Value:
        out = self.recorder.new_value(name=name, shape=value.shape, type=value.type)
        identity = ir.Node("", "Identity", [value], outputs=[out], name=f"{name}/Identity")
        self.graph.append(identity)
        return out

    # --- call_function --------------------------------------------------------------------------
    def _call_function(self, frame: Frame, node: torch.fx.Node) -> None:
        choice = frame.plan.choices[node]
        if choice.via is Via.GETITEM:
            source = frame.env[node.args[0]]
            if isinstance(source, (tuple, list)):
                frame.env[node] = source[node.args[1]]
                return
        stamp_node = frame.stamp_from or node
        try:
            if choice.via is Via.DECOMPOSE and frame.plan.decompositions[node].custom_op:
                body = frame.plan.decompositions[node]
                outputs = lower_custom_op(self, frame, node, body)
                self._finish(frame, node, outputs, self.stamper.props(stamp_node))
            elif choice.via is Via.DECOMPOSE:
                outputs = self._decomposed(frame, node)
            elif choice.via is Via.REGION:
                outputs = self._region(frame, node)
            elif choice.via is Via.CONTROL_FLOW:
                outputs = lower_control_flow(self, frame, node, frame.plan.bodies[node])
                self._finish(frame, node, outputs, self.stamper.props(stamp_node))
            else:
                args, kwargs = _convert_args(node, frame.env)
                if choice.via is not Via.CUSTOM and isinstance(node.target, torch._ops.OpOverload):
                    self._fill_defaults(choice.fn, node.target, args, kwargs)
                with os_evaluator.default_as(self.recorder):
                    rank0 = choice.via is not Via.CUSTOM and is_rank0_dim_op(node)
                    if rank0:
                        lift_rank0(self.recorder, node, args, kwargs)
                    if choice.via is not Via.CUSTOM:
                        self._cast_inputs(node, args, kwargs)
                    if choice.via is Via.TORCHLIB:
                        self._pin_result_dtype(choice.fn, node, args, kwargs)
                    outputs = call_lowering(self.recorder, _lowering_of(choice, node), args, kwargs)
                    if rank0:
                        outputs = lower_to_rank0(self.recorder, outputs)
                    outputs = self._cast_outputs(node, outputs)
                self._finish(frame, node, outputs, self.stamper.props(stamp_node))
        except OpCallError as exc:  # (from the recorder, which cannot name the FX node)
            raise self._failed(node, stamp_node, str(exc)) from exc
        except IrkitError:
            raise
        except Exception as exc:
            raise self._failed(node, stamp_node, f"{type(exc).__name__}: {exc}.") from exc
        frame.env[node] = outputs
        if choice.functional is not None:
            frame.env[node.args[0]] = outputs  # later reads of the mutated tensor see the result

    def _failed(self, node: torch.fx.Node, stamp_node: torch.fx.Node, what: str) -> LoweringError:
        """The error for a lowering of ``node`` that raised (its recorded nodes are dropped)."""
        self.recorder.take_nodes()
        return LoweringError(
            f"{what} Fix: check the op's arguments, or pass "
            f"custom_lowerings={{{python_spelling(node.target)}: fn}}.",
            fx_node=stamp_node.name,
            target=op_name(node.target),
            module_path=module_path(stamp_node),
            source=node_location(stamp_node),
        )

    def _fill_defaults(
        self, fn: Any, target: torch._ops.OpOverload, args: list[Any], kwargs: dict[str, Any]
    ) -> None:
        """Spell out schema defaults the node omitted where the lowering has no default.

        ``amax(x)`` leaves ``dim=[]`` implicit and torchlib's ``aten_amax`` requires it;
        ``bernoulli_.float(x)`` leaves ``p=0.5`` implicit and its functional counterpart
        ``bernoulli.p`` has no default for ``p``.
        """
        required = self._required_params(fn)
        if not required:
            return
        for i, arg in enumerate(target._schema.arguments):
            if (
                i >= len(args)
                and arg.name in required
                and arg.name not in kwargs
                and arg.has_default_value()
            ):
                kwargs[arg.name] = arg.default_value

    def _required_params(self, fn: Any) -> frozenset[str]:
        """Names of ``fn``'s parameters without a default (cached per lowering)."""
        cached = self._required.get(fn)
        if cached is None:
            func = getattr(fn, "func", None)
            if func is not None or (callable(fn) and not hasattr(fn, "op_signature")):
                params = self.recorder.python_signature(func or fn).parameters.values()
                cached = frozenset(p.name for p in params if p.default is p.empty)
            else:
                cached = frozenset(
                    p.name for p in fn.op_signature.params if p.required and not p.has_default()
                )
            self._required[fn] = cached
        return cached

    def _cast_inputs(self, node: torch.fx.Node, args: list[Any], kwargs: dict[str, Any]) -> None:
        """Cast the inputs torch promotes to the dtype torch computes in (see ``_promotion``)."""
        places, dtype = input_casts(node, self._alias_memo)
        if dtype is None:
            return
        to = onnx_dtype(dtype)
        for where, index in places:
            holder: Any = args if isinstance(where, int) else kwargs
            item = holder[where]
            if index is not None:
                item = list(item)
                holder[where] = item
                holder, where = item, index
            value = holder[where]
            if isinstance(value, ir.Value) and value.dtype is not None and value.dtype != to:
                holder[where] = self._cast(value, to)

    def _cast_outputs(self, node: torch.fx.Node, outputs: Any) -> Any:
        """Cast results whose ONNX dtype differs from the dtype torch computed."""
        val = node.meta.get("val")
        if isinstance(outputs, ir.Value):
            to = output_cast(outputs, val)
            return outputs if to is None else self._cast(outputs, to)
        if isinstance(outputs, (tuple, list)) and isinstance(val, (tuple, list)):
            cast = []
            for value, v in zip(outputs, val, strict=False):
                to = output_cast(value, v)
                cast.append(value if to is None else self._cast(value, to))
            return type(outputs)(cast)
        return outputs

    def _cast(self, value: ir.Value, to: ir.DataType) -> ir.Value:
        cast: ir.Value = self.recorder.opset.Cast(value, to=int(to))
        cast.dtype, cast.shape = to, value.shape
        return cast

    def _pin_result_dtype(
        self, fn: Any, node: torch.fx.Node, args: list[Any], kwargs: dict[str, Any]
    ) -> None:
        """Pass the result dtype torch computed as ``dtype=`` when torch would have promoted.

        With ``dtype=None`` torch accumulates/creates in a promoted dtype (``cumsum`` of bool is
        int64, ``arange(5.0)`` is float); the FX node's ``val`` knows it, torchlib does not.
        Nothing is pinned when the (already reconciled) first tensor input has that dtype.
        """
        if kwargs.get("dtype") is not None:
            return
        val = node.meta.get("val")
        func = getattr(fn, "func", None)  # script functions (OnnxFunction) have no Python body
        params = (
            list(self.recorder.python_signature(func).parameters)
            if func is not None
            else [p.name for p in fn.op_signature.params]
        )
        if (
            not isinstance(val, torch.Tensor)
            or "dtype" not in params
            or len(node.args) > params.index("dtype")
        ):
            return
        result = onnx_dtype(val.dtype)
        first = next((a for a in args if isinstance(a, ir.Value) and a.dtype is not None), None)
        if first is not None and first.dtype == result:
            return
        kwargs["dtype"] = result

    def _finish(
        self, frame: Frame, node: torch.fx.Node, outputs: Any, props: dict[str, str]
    ) -> None:
        nodes = self.recorder.take_nodes()
        name = frame.prefix + node.name
        produced = {id(o) for n in nodes for o in n.outputs}
        meta = node.meta.get("val")
        if isinstance(outputs, ir.Value):
            if id(outputs) in produced:
                self.set_type(outputs, meta)
                outputs.name = name
        elif isinstance(outputs, (tuple, list)):
            metas = meta if isinstance(meta, (tuple, list)) else [None] * len(outputs)
            for i, (value, val) in enumerate(zip(outputs, metas, strict=False)):
                if isinstance(value, ir.Value) and id(value) in produced:
                    self.set_type(value, val)
                    value.name = f"{name}__{i}"
        self.append(nodes, props, name, frame.graph)

    def append(
        self, nodes: list[ir.Node], props: dict[str, str], name: str, graph: ir.Graph | None = None
    ) -> None:
        """Name ``nodes`` after ``name``, stamp them with ``props`` and append them to ``graph``
        (None: the main graph)."""
        for counter, ir_node in enumerate(nodes):
            ir_node.name = name if len(nodes) == 1 else f"{name}/{ir_node.op_type}_{counter}"
            ir_node.metadata_props.update(props)
            for k, out in enumerate(ir_node.outputs):
                if out.name is None:
                    out.name = f"{ir_node.name}/{k}" if len(nodes) > 1 else f"{name}/{k}"
            _name_subgraphs(ir_node)
        (self.graph if graph is None else graph).extend(nodes)

    def _decomposed(self, frame: Frame, node: torch.fx.Node) -> Any:
        decomposition = frame.plan.decompositions[node]
        result = self._inline(
            frame,
            node,
            decomposition,
            list(_fx_inputs_flat(node, frame.env)),
            stamp_from=frame.stamp_from or node,
        )
        if (
            isinstance(result, (list, tuple))
            and len(result) == 1
            and not isinstance(node.meta.get("val"), (list, tuple))
        ):
            result = result[0]
        return result

    def _region(self, frame: Frame, node: torch.fx.Node) -> Any:
        """A context region (no_grad, autocast): its body inline, each node with its own stamp."""
        region = region_op(node.target)
        if region is None:  # (the plan chose REGION for it)
            raise _bug(node, "planned as a context region, but its target is none")
        operands = [_map_fx(a, frame.env) for a in region_operands(node, region)]
        result = self._inline(
            frame, node, frame.plan.decompositions[node], operands, stamp_from=frame.stamp_from
        )
        return tuple(result) if isinstance(result, (list, tuple)) else (result,)

    def _inline(
        self,
        frame: Frame,
        node: torch.fx.Node,
        decomposition: Decomposition,
        inputs: Sequence[Any],
        stamp_from: torch.fx.Node | None,
    ) -> Any:
        """Emit a sub-graph (a traced decomposition or a region body) in place of ``node``."""
        return self.emit_body(
            decomposition,
            inputs,
            graph=frame.graph,
            prefix=f"{frame.prefix}{node.name}/",
            stamp_from=stamp_from,
        )

    def emit_body(
        self,
        body: Decomposition,
        inputs: Sequence[Any],
        *,
        graph: ir.Graph | None,
        prefix: str,
        stamp_from: torch.fx.Node | None,
    ) -> Any:
        """Emit an FX sub-graph (a decomposition, a region or a control-flow body) into ``graph``.

        Args:
            body: The sub-graph and its plan.
            inputs: One lowered value per placeholder, in order.
            graph: Where its nodes go (None: the main graph).
            prefix: Prepended to the names of its nodes and values.
            stamp_from: The node whose metadata its nodes carry (None: each its own).

        Returns:
            The sub-graph's output structure, with lowered values in place of FX nodes.
        """
        frame = Frame(body.plan, {}, prefix=prefix, stamp_from=stamp_from, graph=graph)
        feed = iter(inputs)
        for sub_node in body.graph_module.graph.nodes:
            if sub_node.op == "placeholder":
                frame.env[sub_node] = next(feed)
            elif sub_node.op == "output":
                return _map_fx(sub_node.args[0], frame.env)
            else:
                self._body_handler(sub_node)(frame, sub_node)
        return None

    def _body_handler(self, node: torch.fx.Node) -> Callable[[Frame, torch.fx.Node], None]:
        handler = self._handlers.get(node.op)
        if handler is None or node.op in ("placeholder", "output"):
            raise LoweringError(
                f"a sub-graph holds a {node.op!r} node; irkit emits call_function and get_attr "
                "nodes in sub-graphs. Fix: export with torch.export (which records only those).",
                fx_node=node.name,
                target=node.op,
                module_path=module_path(node),
                source=node_location(node),
            )
        return handler

    # --- types ----------------------------------------------------------------------------------
    def set_type(self, value: ir.Value, val: Any) -> None:
        """Give ``value`` the ONNX type and shape of the FX value ``val`` (a tensor or a scalar)."""
        if isinstance(val, torch.Tensor) and val.dtype.is_complex:
            # torchlib represents a complex tensor as real numbers with a trailing dim of 2.
            value.dtype = onnx_dtype(val.dtype.to_real())
            value.shape = ir.Shape([*self.symbols.shape(val.shape), 2])
        elif isinstance(val, torch.Tensor):
            value.dtype = onnx_dtype(val.dtype)
            value.shape = self.symbols.shape(val.shape)
        elif isinstance(val, (bool, torch.SymBool)):
            value.dtype, value.shape = ir.DataType.BOOL, ir.Shape([])
        elif isinstance(val, (int, torch.SymInt)):
            value.dtype, value.shape = ir.DataType.INT64, ir.Shape([])
        elif isinstance(val, (float, torch.SymFloat)):
            value.dtype, value.shape = ir.DataType.FLOAT, ir.Shape([])


def _lowering_of(choice: Choice, node: torch.fx.Node) -> Callable[..., Any]:
    """The function ``choice`` lowers ``node`` with."""
    if choice.fn is None:
        raise _bug(node, f"planned {choice.via.value!r} without a lowering function")
    return choice.fn


def _bug(node: torch.fx.Node, what: str) -> LoweringError:
    return LoweringError(
        f"{what}. This is a bug in irkit; please report it with this message.",
        fx_node=node.name,
        target=op_name(node.target),
        module_path=module_path(node),
        source=node_location(node),
    )


def _name_subgraphs(node: ir.Node) -> None:
    """Name the unnamed values of the graphs an own lowering built for ``node`` (a ``Loop``
    body) after the node: ``pow_1/Loop_9/body/3``, unique in the model as ONNX requires."""
    for attr in node.attributes.values():
        if attr.type != ir.AttributeType.GRAPH:
            continue
        prefix = f"{node.name}/{attr.name}"
        graph = attr.as_graph()
        values = [
            *graph.inputs,
            *(o for n in ir.traversal.RecursiveGraphIterator(graph) for o in n.outputs),
        ]
        for index, value in enumerate(values):
            if value.name is None:
                value.name = f"{prefix}/{index}"
        for index, inner in enumerate(ir.traversal.RecursiveGraphIterator(graph)):
            if inner.name is None:
                inner.name = f"{prefix}/{inner.op_type}_{index}"


def _check_names(what: str, names: Sequence[str] | None, expected: int) -> Sequence[str] | None:
    if names is not None and len(names) != expected:
        raise LoweringOptionsError(
            f"{what} has {len(names)} names but the program has {expected}. "
            f"Fix: pass exactly {expected} names (or None)."
        )
    return names


def _output_key_names(ep: torch.export.ExportedProgram, fx_names: list[str]) -> list[str]:
    """Name outputs after their keys in the returned structure (``last_hidden_state``).

    The keys are read off the output ``TreeSpec`` (dict keys, namedtuple fields, the key lists
    of registered classes such as transformers' ``ModelOutput``) without rebuilding the
    structure: a user's pytree class is never instantiated on placeholders. Outputs reached
    only through positions keep their FX names.
    """
    signature = ep.module_call_graph[0].signature if ep.module_call_graph else None
    if signature is None or signature.out_spec.num_leaves != len(fx_names):
        return fx_names
    names = list(fx_names)
    taken = set(fx_names)
    for index, keys in enumerate(_leaf_keys(signature.out_spec, ())):
        candidate = "_".join(keys)
        if candidate.isidentifier() and candidate not in taken:
            names[index] = candidate
            taken.add(candidate)
    return names


def _leaf_keys(spec: Any, prefix: tuple[str, ...]) -> Iterator[tuple[str, ...]]:
    """The string keys on the path to every leaf of a pytree ``TreeSpec``, in leaf order."""
    if spec.is_leaf():
        yield prefix
        return
    children = spec.children()
    context = spec.context
    fields = getattr(context, "_fields", context)  # namedtuple: the class is the context
    keys: Sequence[Any] = (
        fields
        if isinstance(fields, (list, tuple)) and len(fields) == len(children)
        else [None] * len(children)
    )
    for i, (key, child) in enumerate(zip(keys, children, strict=True)):
        if not isinstance(key, str):
            key = str(i) if prefix else None  # positions only below a named part: cache_0
        yield from _leaf_keys(child, (*prefix, key) if key is not None else prefix)


def _convert(arg: Any, env: Env) -> Any:
    """FX argument → lowering argument: nodes to values, dtypes to ONNX dtypes, devices to str."""
    if isinstance(arg, torch.fx.Node):
        return env[arg]
    if isinstance(arg, (list, tuple)):
        return [_convert(a, env) for a in arg]
    if isinstance(arg, torch.dtype):
        return onnx_dtype(arg)
    if isinstance(arg, (torch.device, torch.memory_format, torch.layout)):
        return str(arg)
    return arg


def _convert_args(node: torch.fx.Node, env: Env) -> tuple[list[Any], dict[str, Any]]:
    args = [_convert(a, env) for a in node.args]
    kwargs = {k: _convert(v, env) for k, v in node.kwargs.items()}
    return args, kwargs


def _fx_inputs_flat(node: torch.fx.Node, env: Env) -> Iterator[Any]:
    import torch.utils._pytree as pytree

    flat, _ = pytree.tree_flatten((node.args, node.kwargs))
    return (env[a] for a in flat if isinstance(a, torch.fx.Node))


def _map_fx(arg: Any, env: Env) -> Any:
    if isinstance(arg, torch.fx.Node):
        return env[arg]
    if isinstance(arg, (list, tuple)):
        return type(arg)(_map_fx(a, env) for a in arg)
    return arg
