"""An onnxscript evaluator that records ONNX ops into ``ir.Node``s instead of running them.

torchlib's functions are ordinary Python (``TracedOnnxFunction``) calling ``op.X(...)``; while
a :class:`Recorder` is onnxscript's default evaluator, every such call becomes an ``ir.Node``.
The few torchlib functions still written as onnxscript *scripts* (``OnnxFunction``) are emitted
as calls of a function that the lowering inlines at the end.

Python constants given where the op expects a tensor are turned into ``Constant`` nodes whose
dtype follows the op's type constraints (``Mul(x_fp16, 0.5)`` gets an fp16 constant).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import onnx_ir as ir
from onnx_ir import schemas
from onnxscript import values as osv

from irkit.errors import OpCallError

__all__ = ["Recorder", "Tensor", "call_lowering"]

_PY_DTYPES: tuple[tuple[type, ir.DataType], ...] = (
    (bool, ir.DataType.BOOL),
    (int, ir.DataType.INT64),
    (float, ir.DataType.FLOAT),
    (str, ir.DataType.STRING),
)


class Tensor(ir.Value):
    """An ``ir.Value`` with Python operators, as torchlib's traced code expects of its inputs."""

    __slots__ = ("_recorder",)

    def __init__(self, recorder: Recorder, **kwargs: Any):
        super().__init__(**kwargs)
        self._recorder = recorder

    @property
    def rank(self) -> int | None:
        return None if self.shape is None else len(self.shape)

    def _op(self, name: str, *args: Any) -> Any:
        return getattr(self._recorder.opset, name)(*args)

    def __add__(self, other: Any) -> Any:
        return self._op("Add", self, other)  # noqa: E704

    def __radd__(self, other: Any) -> Any:
        return self._op("Add", other, self)  # noqa: E704

    def __sub__(self, other: Any) -> Any:
        return self._op("Sub", self, other)  # noqa: E704

    def __rsub__(self, other: Any) -> Any:
        return self._op("Sub", other, self)  # noqa: E704

    def __mul__(self, other: Any) -> Any:
        return self._op("Mul", self, other)  # noqa: E704

    def __rmul__(self, other: Any) -> Any:
        return self._op("Mul", other, self)  # noqa: E704

    def __truediv__(self, other: Any) -> Any:
        return self._op("Div", self, other)  # noqa: E704

    def __matmul__(self, other: Any) -> Any:
        return self._op("MatMul", self, other)  # noqa: E704

    def __pow__(self, other: Any) -> Any:
        return self._op("Pow", self, other)  # noqa: E704

    def __neg__(self) -> Any:
        return self._op("Neg", self)  # noqa: E704

    def __lt__(self, other: Any) -> Any:
        return self._op("Less", self, other)  # noqa: E704

    def __le__(self, other: Any) -> Any:
        return self._op("LessOrEqual", self, other)  # noqa: E704

    def __gt__(self, other: Any) -> Any:
        return self._op("Greater", self, other)  # noqa: E704

    def __ge__(self, other: Any) -> Any:
        return self._op("GreaterOrEqual", self, other)  # noqa: E704

    __hash__ = ir.Value.__hash__


class Recorder:
    """Records ops as ``ir.Node``s; install with ``onnxscript.evaluator.default_as(recorder)``.

    Attributes:
        opset: The onnxscript default-domain opset torchlib is written against.
        nodes: The nodes recorded since the last :meth:`take_nodes`, in creation order.
        functions: Script functions called so far, by ``(domain, name, overload)``.
    """

    def __init__(self, opset: osv.Opset):
        self.opset = opset
        self.nodes: list[ir.Node] = []
        self.functions: dict[ir.OperatorIdentifier, ir.Function] = {}
        self._function_cache: dict[int, ir.Function] = {}
        self._py_signatures: dict[Callable[..., Any], inspect.Signature] = {}
        self._op_signatures: dict[tuple[str, str, int], schemas.OpSignature] = {}

    def python_signature(self, func: Callable[..., Any]) -> inspect.Signature:
        """``inspect.signature(func)``, cached (it is slow and asked once per FX node)."""
        sig = self._py_signatures.get(func)
        if sig is None:
            sig = self._py_signatures[func] = inspect.signature(func)
        return sig

    def new_value(self, **kwargs: Any) -> Tensor:
        return Tensor(self, **kwargs)

    def take_nodes(self) -> list[ir.Node]:
        nodes, self.nodes = self.nodes, []
        return nodes

    # --- the onnxscript Evaluator protocol ---------------------------------------------------
    def eval_op(self, op: osv.Op, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
        key = (op.domain, op.name, op.opset.version)
        signature = self._op_signatures.get(key)
        if signature is None:
            signature = op.op_signature  # built from the OpSchema: slow, so cached per op
            if signature is None:
                raise OpCallError(
                    f"the ONNX op {op.domain!r}::{op.name} (opset {op.opset.version}) has no "
                    "schema, so its inputs and attributes cannot be told apart (call an op "
                    "onnx or onnxruntime defines, or register its schema with onnx.defs first)."
                )
            self._op_signatures[key] = signature
        kwargs = dict(kwargs)
        num_outputs = kwargs.pop("_outputs", None)
        inputs, attrs = _bind(signature, args, kwargs)
        if num_outputs is None:
            num_outputs = _num_outputs(signature, inputs, attrs)
        result = self._emit(
            signature, op.domain, op.name, op.opset.version, inputs, attrs, num_outputs
        )
        if op.domain == "" and op.name == "Constant" and attrs and attrs[0].name == "value":
            result.const_value = attrs[0].value  # later ops may need it (Split's output count)
        return result

    def eval_function(
        self, function: osv.OnnxFunction, args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> Any:
        signature = function.op_signature
        if signature is None:  # as for an op: the FX node's lowering wraps it in LoweringError
            raise OpCallError(
                f"the onnxscript function {function.name!r} has no signature, so its inputs "
                "and attributes cannot be told apart."
            )
        inputs, attrs = _bind(signature, args, kwargs)
        ir_function = self._ir_function(function)
        return self._emit(
            signature,
            ir_function.domain,
            ir_function.name,
            None,
            inputs,
            attrs,
            len(signature.outputs),
        )

    # --- helpers -------------------------------------------------------------------------------
    def _ir_function(self, function: osv.OnnxFunction) -> ir.Function:
        cached = self._function_cache.get(id(function))
        if cached is None:
            cached = ir.serde.deserialize_function(function.to_function_proto())
            self._function_cache[id(function)] = cached
            self.functions[cached.identifier()] = cached
        return cached

    def _emit(
        self,
        signature: schemas.OpSignature,
        domain: str,
        op_type: str,
        version: int | None,
        inputs: dict[str, Any],
        attrs: list[ir.Attr],
        num_outputs: int,
    ) -> Any:
        flat = self._materialize_inputs(signature, inputs)
        while flat and flat[-1] is None:
            flat.pop()
        outputs = [self.new_value() for _ in range(num_outputs)]
        node = ir.Node(domain, op_type, flat, attrs, outputs=outputs, version=version)
        self.nodes.append(node)
        _propagate_dtypes(signature, inputs, outputs)
        return outputs[0] if num_outputs == 1 else tuple(outputs)

    def _materialize_inputs(
        self, signature: schemas.OpSignature, inputs: dict[str, Any]
    ) -> list[ir.Value | None]:
        bound = _type_binding(signature, inputs)
        flat: list[ir.Value | None] = []
        for param, arg in _input_params(signature, inputs):
            if param.variadic:
                items = arg if isinstance(arg, (list, tuple)) else [arg]
                flat.extend(self.as_value(a, _dtype_for(param, a, bound)) for a in items)
            else:
                flat.append(self.as_value(arg, _dtype_for(param, arg, bound)))
        return flat

    def constant(self, value: Any, dtype: ir.DataType | None) -> ir.Value:
        """A ``Constant`` node holding ``value`` (a Python scalar/list, numpy array or tensor)."""
        if isinstance(value, (ir.Tensor, ir.TensorProtocol)):
            tensor = value
        elif isinstance(value, np.ndarray):
            tensor = ir.tensor(value if dtype is None else value.astype(dtype.numpy()))
        else:
            tensor = ir.tensor(value, dtype=dtype)
        result: ir.Value = self.opset.Constant(value=tensor)
        result.const_value = tensor  # lets later ops see the value (e.g. Split's output count)
        return result

    def as_value(self, arg: Any, dtype: ir.DataType | None) -> ir.Value | None:
        """``arg`` as an ONNX value: values pass through, constants become ``Constant`` nodes.

        A list mixing values (symbolic sizes) and ints becomes ``Concat`` of 1-D pieces.
        """
        if arg is None or isinstance(arg, ir.Value):
            return arg
        if isinstance(arg, (list, tuple)) and any(isinstance(a, ir.Value) for a in arg):
            dtype = dtype or next(a.dtype for a in arg if isinstance(a, ir.Value))
            pieces = [
                self.opset.Reshape(a, self.constant([-1], ir.DataType.INT64))
                if isinstance(a, ir.Value)
                else self.constant([a], dtype)
                for a in arg
            ]
            concat: ir.Value = self.opset.Concat(*pieces, axis=0)
            return concat
        return self.constant(list(arg) if isinstance(arg, tuple) else arg, dtype)


def _bind(
    signature: schemas.OpSignature, args: Sequence[Any], kwargs: Mapping[str, Any]
) -> tuple[dict[str, Any], list[ir.Attr]]:
    """Split ``args``/``kwargs`` into named inputs and typed attributes following ``signature``."""
    inputs: dict[str, Any] = {}
    attrs: list[ir.Attr] = []
    position = 0
    for param in signature.params:
        if isinstance(param, schemas.Parameter):
            if param.variadic:
                inputs[param.name] = tuple(args[position:])
                position = len(args)
                continue
            if position < len(args):
                inputs[param.name] = args[position]
                position += 1
            elif param.name in kwargs:
                inputs[param.name] = kwargs[param.name]
            elif param.required and not param.has_default():
                raise OpCallError(f"required input {param.name!r} of {signature.name} not given.")
            else:
                inputs[param.name] = param.default if param.has_default() else None
            continue
        if position < len(args):
            value = args[position]
            position += 1
        else:
            value = kwargs.get(param.name)
        if value is None:
            if param.required:
                raise OpCallError(
                    f"required attribute {param.name!r} of {signature.name} not given."
                )
            continue
        attrs.append(_attr(param, value))
    return inputs, attrs


def _attr(param: schemas.AttributeParameter, value: Any) -> ir.Attr:
    if isinstance(value, ir.Attr):
        return ir.Attr(param.name, value.type, value.value)
    kind = param.type
    if kind == ir.AttributeType.FLOAT:
        value = float(value)
    elif kind == ir.AttributeType.INT:
        value = int(value)
    elif kind in (ir.AttributeType.INTS, ir.AttributeType.FLOATS, ir.AttributeType.STRINGS):
        value = list(value) if isinstance(value, (list, tuple)) else [value]
        if kind == ir.AttributeType.FLOATS:
            value = [float(v) for v in value]
        elif kind == ir.AttributeType.INTS:
            value = [int(v) for v in value]
    elif kind == ir.AttributeType.TENSOR and not isinstance(value, ir.TensorProtocol):
        value = ir.tensor(value)
    return ir.Attr(param.name, kind, value)


def _num_outputs(
    signature: schemas.OpSignature, inputs: Mapping[str, Any], attrs: list[ir.Attr]
) -> int:
    if signature.domain == "" and signature.name == "Split":
        for attr in attrs:
            if attr.name == "num_outputs":
                return int(attr.value)
        split = inputs.get("split")
        if isinstance(split, (list, tuple)):
            return len(split)
        if isinstance(split, ir.Value) and split.const_value is not None:
            return int(split.const_value.numpy().size)
        raise OpCallError(
            "cannot tell the number of outputs of Split: no num_outputs, and its split sizes "
            "are not constant."
        )
    if signature.domain == "" and signature.name == "Loop":
        # one final value per loop-carried value (no scan outputs: irkit's bodies have none)
        carried = inputs.get("v_initial")
        return len(carried) if isinstance(carried, (list, tuple)) else 1
    if signature.domain == "" and signature.name == "BatchNormalization":
        training = any(a.name == "training_mode" and a.value for a in attrs)
        return 3 if training else 1
    return len(signature.outputs)


def _input_params(
    signature: schemas.OpSignature, inputs: Mapping[str, Any]
) -> Iterator[tuple[schemas.Parameter, Any]]:
    """``(parameter, argument)`` for each input :func:`_bind` bound, in the signature's order
    (the order ``_bind`` filled ``inputs`` in; attributes are not inputs)."""
    for param in signature.params:
        if isinstance(param, schemas.Parameter) and param.name in inputs:
            yield param, inputs[param.name]


def _type_binding(
    signature: schemas.OpSignature, inputs: Mapping[str, Any]
) -> dict[str, ir.DataType]:
    """Type-constraint name → dtype, from the inputs that are values with a known dtype."""
    bound: dict[str, ir.DataType] = {}
    for param, arg in _input_params(signature, inputs):
        candidates = arg if isinstance(arg, (list, tuple)) else (arg,)
        for item in candidates:
            if isinstance(item, ir.Value) and item.dtype is not None:
                bound.setdefault(param.type_constraint.name, item.dtype)
                break
    return bound


def _dtype_for(
    param: schemas.Parameter, arg: Any, bound: Mapping[str, ir.DataType]
) -> ir.DataType | None:
    constraint = param.type_constraint
    if constraint.name in bound:
        return bound[constraint.name]
    if len(constraint.allowed_types) == 1:
        only = next(iter(constraint.allowed_types))
        if isinstance(only, ir.TensorType):
            return only.dtype
    return _python_dtype(arg)


def _python_dtype(arg: Any) -> ir.DataType | None:
    if isinstance(arg, (list, tuple)):
        if not arg:
            return ir.DataType.INT64
        dtypes = {_python_dtype(a) for a in arg}
        if ir.DataType.FLOAT in dtypes:
            return ir.DataType.FLOAT
        return dtypes.pop() if len(dtypes) == 1 else ir.DataType.INT64
    for py_type, dtype in _PY_DTYPES:
        if isinstance(arg, py_type):
            return dtype
    return None


def _propagate_dtypes(
    signature: schemas.OpSignature, inputs: Mapping[str, Any], outputs: Sequence[ir.Value]
) -> None:
    """Give outputs the dtype their type constraint implies (cheap, local type inference)."""
    bound = _type_binding(signature, inputs)
    for param, value in zip(signature.outputs, outputs, strict=False):
        constraint = param.type_constraint
        if constraint.name in bound:
            value.dtype = bound[constraint.name]
        elif len(constraint.allowed_types) == 1:
            only = next(iter(constraint.allowed_types))
            if isinstance(only, ir.TensorType):
                value.dtype = only.dtype


def call_lowering(
    recorder: Recorder, fn: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any]
) -> Any:
    """Call a lowering function with FX-converted arguments under ``recorder``.

    torchlib's traced functions take Python constants as they are (they are written for it);
    keyword arguments they do not declare (``device=``, ``pin_memory=``) are dropped, and ``None``
    for an attribute lets the function's own default apply. Script functions become a function
    call; any other callable is called as is.
    """
    if isinstance(fn, osv.OnnxFunction):
        return recorder.eval_function(fn, args, kwargs)
    if not isinstance(fn, osv.TracedOnnxFunction):
        return fn(*args, **kwargs)
    signature = fn.op_signature
    py_signature = recorder.python_signature(fn.func)
    kept = {}
    for key, value in kwargs.items():
        if key not in py_signature.parameters:
            continue
        if value is None and isinstance(signature.params_map.get(key), schemas.AttributeParameter):
            continue
        kept[key] = value
    return fn.func(*args, **kept)
