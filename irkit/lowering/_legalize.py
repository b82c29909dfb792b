"""Kernel-type legalization: every emitted op runs on a dtype its kernel accepts.

torchlib writes some ops for dtypes that neither the ONNX schema nor onnxruntime's CPU kernels
accept — ``Ceil`` / ``Conv`` / ``Gemm`` on int64, ``TopK`` / ``Clip`` / ``ArgMax`` on bool,
``Where`` on bool (no onnxruntime kernel) — and the file then fails to load. After lowering, each
such node gets its inputs cast to the nearest dtype that holds every value of the original one
(bool → uint8, int32 → int64, float16 → float, …; int64 → double is exact up to 2**53) and its
same-typed outputs cast back, so it computes what torch computes.

The accepted dtypes come from onnxruntime's CPU kernel registry when onnxruntime is installed
(it is the runtime a written file must load in), otherwise from the ONNX schema's type
constraints. Dtypes irkit cannot tell (an untyped intermediate value) are inferred from the
schema where its output type is bound to an input's; a node whose dtypes stay unknown is left
as it is.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping, Sequence

import onnx
import onnx_ir as ir

from irkit import metadata
from irkit._irutil import fresh_name, nested_subgraphs
from irkit._runtime import kernel_defs
from irkit.errors import LoweringError

__all__ = ["legalize_kernel_types"]

logger = logging.getLogger(__name__)

_D = ir.DataType
# Wider dtypes that hold every value of the key, nearest first.
_WIDER: Mapping[ir.DataType, tuple[ir.DataType, ...]] = {
    _D.BOOL: (_D.UINT8, _D.INT32, _D.INT64, _D.FLOAT),
    _D.INT8: (_D.INT32, _D.INT64, _D.FLOAT),
    _D.UINT8: (_D.INT32, _D.INT64, _D.FLOAT),
    _D.INT16: (_D.INT32, _D.INT64, _D.FLOAT),
    _D.UINT16: (_D.INT32, _D.INT64, _D.FLOAT),
    _D.INT32: (_D.INT64, _D.DOUBLE),
    _D.UINT32: (_D.INT64, _D.DOUBLE),
    _D.INT64: (_D.DOUBLE,),
    _D.UINT64: (_D.DOUBLE,),
    _D.FLOAT16: (_D.FLOAT, _D.DOUBLE),
    _D.BFLOAT16: (_D.FLOAT, _D.DOUBLE),
    _D.FLOAT: (_D.DOUBLE,),
}
_PRECISION_CHOICES = frozenset({_D.FLOAT16, _D.BFLOAT16})
# Ops whose type parameters are about conversion or structure, never about a kernel's math.
_UNTOUCHED = frozenset({"Cast", "CastLike", "Constant", "Identity", "If", "Loop", "Scan"})

_Constraints = Mapping[str, frozenset[ir.DataType]]


@functools.cache
def _onnx_names() -> Mapping[str, ir.DataType]:
    """``"float"`` → ``DataType.FLOAT`` (the spelling of ``tensor(float)``), for the types both
    the installed onnx and onnx-ir know (onnx-ir may know newer ones than onnx 1.18 names)."""
    named = set(onnx.TensorProto.DataType.values())
    return {
        onnx.TensorProto.DataType.Name(int(d)).lower(): d
        for d in ir.DataType
        if d != ir.DataType.UNDEFINED and int(d) in named
    }


def _parse(type_str: str) -> ir.DataType | None:
    if not type_str.startswith("tensor(") or not type_str.endswith(")"):
        return None
    return _onnx_names().get(type_str[len("tensor(") : -1])


@functools.cache
def _ort_kernels() -> Mapping[tuple[str, str], tuple[tuple[int, int, _Constraints], ...]]:
    """onnxruntime's CPU kernels: ``(domain, op) → ((since, until, {T: dtypes}), …)``."""
    merged: dict[tuple[str, str, int, int], dict[str, set[ir.DataType]]] = {}
    for domain, op, start, end, type_constraints in kernel_defs():  # (() without onnxruntime)
        slot = merged.setdefault((domain, op, start, end), {})
        for name, types in type_constraints.items():
            slot.setdefault(name, set()).update(d for d in map(_parse, types) if d is not None)
    table: dict[tuple[str, str], list[tuple[int, int, _Constraints]]] = {}
    for (domain, op, start, end), constraints in merged.items():
        frozen = {name: frozenset(types) for name, types in constraints.items()}
        table.setdefault((domain, op), []).append((start, end, frozen))
    return {key: tuple(entries) for key, entries in table.items()}


def _schema(node: ir.Node, opset: int) -> onnx.defs.OpSchema | None:
    try:
        return onnx.defs.get_schema(node.op_type, opset, node.domain)
    except onnx.defs.SchemaError:
        return None


def _accepted(schema: onnx.defs.OpSchema, domain: str, runtime: bool) -> _Constraints:
    """The dtypes each type parameter accepts: onnxruntime's CPU kernel (``runtime``), else the
    ONNX schema."""
    if runtime:
        for start, end, constraints in _ort_kernels().get((domain, schema.name), ()):
            if start <= schema.since_version <= end:
                return constraints
    return _schema_constraints(schema)


@functools.cache
def _schema_constraints(schema: onnx.defs.OpSchema) -> _Constraints:
    return {
        c.type_param_str: frozenset(d for d in map(_parse, c.allowed_type_strs) if d is not None)
        for c in schema.type_constraints
    }


@functools.cache
def _type_params(schema: onnx.defs.OpSchema) -> frozenset[str]:
    return frozenset(c.type_param_str for c in schema.type_constraints)


def _formal(params: Sequence[onnx.defs.OpSchema.FormalParameter], i: int) -> str | None:
    if i < len(params):
        return params[i].type_str
    last = params[-1] if params else None
    variadic = onnx.defs.OpSchema.FormalParameterOption.Variadic
    return last.type_str if last is not None and last.option == variadic else None


class _Names:
    """The model's value and node names, collected on first use (most models need none)."""

    def __init__(self, model: ir.Model):
        self._model = model
        self._taken: set[str] | None = None

    @property
    def taken(self) -> set[str]:
        if self._taken is None:
            graph = self._model.graph
            self._taken = {v.name for v in graph.inputs if v.name}
            nodes = [*ir.traversal.RecursiveGraphIterator(graph)]
            for function in self._model.functions.values():
                nodes += ir.traversal.RecursiveGraphIterator(function)
            for node in nodes:
                self._taken.update(n for n in (node.name, *(o.name for o in node.outputs)) if n)
        return self._taken


class _Legalizer:
    def __init__(self, graph: ir.Graph | ir.Function, opset: int, names: _Names):
        self.graph = graph
        self.opset = opset
        self.names = names
        self.inferred: dict[ir.Value, ir.DataType] = {}
        self.changed = 0
        self._schemas: dict[tuple[str, str], onnx.defs.OpSchema | None] = {}

    def schema(self, node: ir.Node) -> onnx.defs.OpSchema | None:
        key = (node.domain, node.op_type)
        if key not in self._schemas:
            ok = node.domain in ("", "ai.onnx")
            self._schemas[key] = _schema(node, self.opset) if ok else None
        return self._schemas[key]

    def dtype(self, value: ir.Value) -> ir.DataType | None:
        return value.dtype if value.dtype is not None else self.inferred.get(value)

    def run(self) -> int:
        for node in list(self.graph):
            schema = self.schema(node)
            if schema is None:
                continue
            bound = self._bind_inputs(node, schema)
            if node.op_type not in _UNTOUCHED:
                self._legalize(node, schema, bound)
            self._infer_outputs(node, schema, bound)
        return self.changed

    def _bind_inputs(
        self, node: ir.Node, schema: onnx.defs.OpSchema
    ) -> dict[str, list[tuple[int, ir.Value]]]:
        params = _type_params(schema)
        bound: dict[str, list[tuple[int, ir.Value]]] = {}
        for i, value in enumerate(node.inputs):
            name = _formal(schema.inputs, i)
            if value is not None and name in params:
                bound.setdefault(name, []).append((i, value))
        return bound

    def _legalize(
        self,
        node: ir.Node,
        schema: onnx.defs.OpSchema,
        bound: dict[str, list[tuple[int, ir.Value]]],
    ) -> None:
        for param, inputs in bound.items():
            dtypes = {self.dtype(v) for _, v in inputs}
            dtype = dtypes.pop() if len(dtypes) == 1 else None
            if dtype is None:
                continue
            # A float16/bfloat16 op is a precision choice for the accelerator the model is for:
            # only the ONNX schema can reject it (onnxruntime's CPU provider computes float16
            # ops it has no kernel for in float32 by itself).
            runtime = dtype not in _PRECISION_CHOICES
            allowed = _accepted(schema, node.domain, runtime).get(param)
            if not allowed:
                continue
            if dtype in allowed:
                continue
            wide = next((w for w in _WIDER.get(dtype, ()) if w in allowed), None)
            if wide is None:
                raise _no_kernel(node, dtype, allowed)
            for i, value in inputs:
                node.replace_input_with(i, self._cast(value, wide, node, before=True))
            for j, out in enumerate(node.outputs):
                if _formal(schema.outputs, j) == param:
                    self._cast_back(out, dtype, wide, node)
            self.changed += 1
            logger.debug("legalized %s: %s computed in %s", node.name, dtype, wide)

    def _cast(self, value: ir.Value, to: ir.DataType, node: ir.Node, *, before: bool) -> ir.Value:
        name = fresh_name(f"{value.name or 'v'}_as_{to.name.lower()}", self.names.taken)
        cast = ir.Node(
            "",
            "Cast",
            [value],
            attributes=[ir.AttrInt64("to", int(to))],
            outputs=[ir.Value(name=name, type=ir.TensorType(to), shape=value.shape)],
            name=fresh_name(f"{node.name or node.op_type}/legalize", self.names.taken),
        )
        cast.metadata_props.update(node.metadata_props)
        if before:
            self.graph.insert_before(node, cast)
        else:
            self.graph.insert_after(node, cast)
        return cast.outputs[0]

    def _cast_back(
        self, out: ir.Value, dtype: ir.DataType, wide: ir.DataType, node: ir.Node
    ) -> None:
        """``out`` becomes the wide result; a Cast back takes over its name, type and uses."""
        uses = list(out.uses())
        outputs = self.graph.outputs
        name = out.name
        out.name = fresh_name(f"{name}_{wide.name.lower()}", self.names.taken)
        out.type = ir.TensorType(wide)
        back = self._cast(out, dtype, node, before=False)
        back.name = name
        for user, index in uses:
            user.replace_input_with(index, back)
        for k, graph_out in enumerate(outputs):
            if graph_out is out:
                outputs[k] = back

    def _infer_outputs(
        self,
        node: ir.Node,
        schema: onnx.defs.OpSchema,
        bound: dict[str, list[tuple[int, ir.Value]]],
    ) -> None:
        for j, out in enumerate(node.outputs):
            if out.dtype is not None:
                continue
            type_str = _formal(schema.outputs, j)
            if type_str is None:
                continue
            fixed = _parse(type_str)
            if fixed is not None:
                self.inferred[out] = fixed
            elif node.op_type == "Cast" and "to" in node.attributes:
                self.inferred[out] = ir.DataType(node.attributes["to"].as_int())
            elif type_str in bound:
                dtype = self.dtype(bound[type_str][0][1])
                if dtype is not None:
                    self.inferred[out] = dtype


def _no_kernel(node: ir.Node, dtype: ir.DataType, allowed: frozenset[ir.DataType]) -> LoweringError:
    props = node.metadata_props
    scope = metadata.node_scope(props)
    kinds = ", ".join(sorted(d.name.lower() for d in allowed))
    target = props.get(metadata.FX_TARGET, node.op_type)  # aten.conv1d.default
    namespace, dot, rest = target.partition(".")
    return LoweringError(
        f"it is lowered to ONNX {node.op_type}, which has no kernel for {dtype.name.lower()} "
        f"(accepted: {kinds}) and no wider dtype that holds every {dtype.name.lower()} value "
        "exactly. Fix: convert the tensors to a supported dtype in the model (e.g. .float()), or "
        "pass a custom_lowerings entry for this op.",
        fx_node=props.get(metadata.FX_NODE, node.name or ""),
        target=f"{namespace}::{rest}" if dot else target,  # errors' spelling: aten::conv1d.default
        module_path=scope[-1].path if scope else "",
        source=props.get(metadata.SOURCE, ""),
    )


def legalize_kernel_types(model: ir.Model) -> int:
    """Cast around every node whose dtype its kernel does not accept; returns how many.

    Raises:
        LoweringError: A node's dtype has no kernel and no exact wider dtype that has one.
    """
    opset = model.opset_imports.get("", model.graph.opset_imports.get("", 0))
    names, changed = _Names(model), 0
    for graph in [*nested_subgraphs(model.graph), model.graph]:
        changed += _Legalizer(graph, opset, names).run()
    for function in model.functions.values():
        for graph in nested_subgraphs(function):
            changed += _Legalizer(graph, opset, names).run()
        changed += _Legalizer(function, opset, names).run()
    if changed:
        logger.info(
            "irkit.lower: %d node(s) computed in a wider dtype their kernel accepts", changed
        )
    return changed
