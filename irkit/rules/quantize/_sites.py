"""Which nodes can be quantized: MatMul-like nodes (and embedding Gathers) whose weight is a
constant, directly, through a ``Transpose`` or through the calls of local functions."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import numpy as np
import onnx_ir as ir

from irkit.errors import QuantizationError
from irkit.rules._calls import Calls, Owner, owner_name, owners
from irkit.rules.quantize._options import Activations, Settings
from irkit.weights import has_data

MS = "com.microsoft"
QUANTIZED_OP = "MatMulNBits"
DYNAMIC_OP = "DynamicQuantizeMatMul"
IN_SUBGRAPH = "inside an If/Loop/Scan body"


@dataclasses.dataclass
class Site:
    """A MatMul-like node whose weight can be packed."""

    owner: Owner
    node: ir.Node
    activation: ir.Value
    weight: ir.Value  # the (K, N) or, when transposed, (N, K) weight as the owner sees it
    transposed: bool
    transpose: ir.Node | None  # the Transpose the weight was seen through
    bias: ir.Value | None
    k: int
    n: int
    dtype: np.dtype
    activation_transposed: bool = False  # (FusedMatMul's transA: A's last two axes swapped)


def int_attr(node: ir.Node, name: str, default: int) -> int:
    attr = node.attributes.get(name)
    return default if attr is None else int(attr.as_int())


def float_attr(node: ir.Node, name: str, default: float) -> float:
    attr = node.attributes.get(name)
    return default if attr is None else float(attr.as_float())


def _is_candidate(node: ir.Node) -> bool:
    if node.domain in ("", "ai.onnx"):
        return node.op_type in ("MatMul", "Gemm")
    return node.domain == MS and node.op_type == "FusedMatMul"


def _operands(
    node: ir.Node,
) -> tuple[ir.Value | None, ir.Value | None, bool, ir.Value | None, bool] | str:
    """``(A, B, transB, bias, transA)`` of a candidate, or why its form is not MatMulNBits'."""
    a = node.inputs[0] if node.inputs else None
    b = node.inputs[1] if len(node.inputs) > 1 else None
    if node.op_type == "MatMul":
        return a, b, False, None, False
    if node.op_type == "FusedMatMul":
        if float_attr(node, "alpha", 1.0) != 1.0:
            return "FusedMatMul with alpha != 1"
        if any(int_attr(node, n, 0) for n in ("transBatchA", "transBatchB")):
            return "FusedMatMul transposes a batch dimension"
        trans_a = bool(int_attr(node, "transA", 0))
        if trans_a and (a is None or a.shape is None or len(a.shape) < 2):
            return "FusedMatMul transposes an A of unknown rank (the Transpose needs its perm)"
        return a, b, bool(int_attr(node, "transB", 0)), None, trans_a
    if float_attr(node, "alpha", 1.0) != 1.0 or float_attr(node, "beta", 1.0) != 1.0:
        return "Gemm with alpha or beta != 1"
    if int_attr(node, "transA", 0):
        return "Gemm with transA = 1"
    c = node.inputs[2] if len(node.inputs) > 2 else None
    return a, b, bool(int_attr(node, "transB", 0)), c, False


def _through_transpose(b: ir.Value, transposed: bool) -> tuple[ir.Value, bool]:
    """Look through a 2-D ``Transpose`` (irkit's ``Linear`` is ``Transpose(W) → MatMul``)."""
    producer = b.producer()
    if (
        producer is None
        or producer.op_type != "Transpose"
        or producer.domain not in ("", "ai.onnx")
    ):
        return b, transposed
    source = producer.inputs[0]
    perm = producer.attributes.get("perm")  # (none: reverse the dims; the rank-2 check follows)
    if source is None or (perm is not None and list(perm.as_ints()) != [1, 0]):
        return b, transposed
    return source, not transposed


def constant_tensor(owner: Owner, value: ir.Value) -> ir.TensorProtocol | str:
    """The tensor of a constant value, or why the value is not one."""
    if isinstance(owner, ir.Graph) and value.is_initializer():
        if value.is_graph_input():
            return f"weight {value.name!r} is a graph input (it can be fed at run time)"
        if value.const_value is not None:
            return value.const_value
    producer = value.producer()
    if (
        producer is not None
        and producer.op_type == "Constant"
        and producer.domain in ("", "ai.onnx")
    ):
        attr = producer.attributes.get("value")
        if attr is not None and attr.type == ir.AttributeType.TENSOR:
            tensor = attr.as_tensor()
            if not has_data(tensor):
                return (
                    f"weight is a weightless Constant {producer.name!r}: irkit.save streams "
                    "only initializers (run irkit.optimize first, it lifts such constants)"
                )
            return tensor
    if producer is not None:
        return f"weight is computed by {producer.op_type} {producer.name!r}, not a constant"
    return f"weight {value.name!r} is not a constant"


def function_input(owner: Owner, value: ir.Value) -> tuple[ir.Function, int] | None:
    """``(function, input index)`` when ``value`` is an input of the local function ``owner``."""
    if not isinstance(owner, ir.Function):
        return None
    for i, v in enumerate(owner.inputs):
        if v is value:
            return owner, i
    return None


def constant_leaves(
    owner: Owner, value: ir.Value, calls: Calls, depth: int = 0
) -> list[ir.TensorProtocol] | str:
    """The constants a weight value takes, one per chain of calls, or why it is not constant."""
    lifted = function_input(owner, value)
    if lifted is None:
        tensor = constant_tensor(owner, value)
        return tensor if isinstance(tensor, str) else [tensor]
    function, index = lifted
    sites = calls.of_function(function)
    if not sites:
        return f"function {owner_name(function)} is never called"
    if depth > 64:
        return "calls nested deeper than 64"
    tensors: list[ir.TensorProtocol] = []
    for caller, call in sites:
        arg = call.inputs[index] if index < len(call.inputs) else None
        if arg is None:
            return f"a call of {owner_name(function)} omits the weight input {value.name!r}"
        found = constant_leaves(caller, arg, calls, depth + 1)
        if isinstance(found, str):
            return f"at a call in {owner_name(caller)}: {found}"
        tensors += found
    return tensors


def _gather_site(owner: Owner, node: ir.Node, calls: Calls) -> Site | str:
    """An embedding ``Gather(E, ids)`` (axis 0, constant 2-D ``E``) as a site: ``E`` is packed
    as the transposed ``(K, N) = (hidden, vocab)`` weight, the layout ``GatherBlockQuantized``
    reads (``quantize_axis = 1``) and the one a tied lm_head's ``MatMul(x, Transpose(E))`` packs."""
    if int_attr(node, "axis", 0) != 0:
        return "Gather on an axis other than 0 (GatherBlockQuantized gathers rows here)"
    data = node.inputs[0] if node.inputs else None
    ids = node.inputs[1] if len(node.inputs) > 1 else None
    if data is None or ids is None:
        return "an input is missing"
    leaves = constant_leaves(owner, data, calls)
    if isinstance(leaves, str):
        return leaves
    shapes = {tuple(t.shape.numpy()) for t in leaves}
    dtypes = {t.dtype for t in leaves}
    if len(shapes) != 1 or len(dtypes) != 1:
        return (
            f"the calls of this shared body pass tables of different shapes/dtypes {sorted(shapes)}"
        )
    (shape,), (dtype,) = shapes, dtypes
    if len(shape) != 2:
        return f"the table has rank {len(shape)}, GatherBlockQuantized takes a 2-D one here"
    if dtype not in (ir.DataType.FLOAT, ir.DataType.FLOAT16):
        return f"table dtype {dtype} is not float32/float16"
    if ids.dtype is not None and ids.dtype not in (ir.DataType.INT32, ir.DataType.INT64):
        return f"indices of dtype {ids.dtype}, GatherBlockQuantized takes int32/int64"
    n, k = shape
    return Site(owner, node, ids, data, True, None, None, k, n, dtype.numpy())


def find_site(owner: Owner, node: ir.Node, calls: Calls, settings: Settings) -> Site | str:
    """The node as a site to quantize with ``settings``, or why it is not one."""
    if node.op_type == "Gather":
        return _gather_site(owner, node, calls)
    operands = _operands(node)
    if isinstance(operands, str):
        return operands
    a, b, transposed, bias, activation_transposed = operands
    if a is None or b is None:
        return "an input is missing"
    weight, transposed = _through_transpose(b, transposed)
    transpose = b.producer() if weight is not b else None
    leaves = constant_leaves(owner, weight, calls)
    if isinstance(leaves, str):
        return leaves
    shapes = {tuple(t.shape.numpy()) for t in leaves}
    dtypes = {t.dtype for t in leaves}
    if len(shapes) != 1 or len(dtypes) != 1:
        return f"the calls of this shared body pass weights of different shapes/dtypes {sorted(shapes)}"
    (shape,), (dtype,) = shapes, dtypes
    op = settings.op_type
    if len(shape) != 2:
        return f"weight has rank {len(shape)}, {op} takes a 2-D weight"
    if settings.activations.dynamic and dtype != ir.DataType.FLOAT:
        return f"weight dtype {dtype} is not float32 ({op} takes float32)"
    if dtype not in (ir.DataType.FLOAT, ir.DataType.FLOAT16):
        return f"weight dtype {dtype} is not float32/float16"
    if a.dtype is not None and a.dtype != dtype:
        return f"activation dtype {a.dtype} differs from the weight's {dtype}"
    k, n = (shape[1], shape[0]) if transposed else shape
    if not settings.activations.dynamic and k < settings.block_size:
        return f"K={k} is smaller than one block ({settings.block_size})"
    if bias is not None and (bias.shape is None or list(bias.shape.dims) != [n]):
        return f"Gemm's C has shape {bias.shape}, {op}'s bias must be [{n}]"
    site = Site(owner, node, a, weight, transposed, transpose, bias, k, n, dtype.numpy())
    site.activation_transposed = activation_transposed
    return site


def _is_gather(node: ir.Node) -> bool:
    return node.op_type == "Gather" and node.domain in ("", "ai.onnx")


def candidates(model: ir.Model, gathers: bool) -> Iterator[tuple[Owner, ir.Node, bool]]:
    """Every MatMul-like node (and, with ``gathers``, every ``Gather`` of a constant table):
    ``(owner, node, directly in the owner's body)``."""
    for owner in owners(model):
        top = owner.graph if isinstance(owner, ir.Function) else owner
        for node in ir.traversal.RecursiveGraphIterator(owner):
            if _is_candidate(node) or (gathers and _is_gather(node) and _table_like(node)):
                yield owner, node, node.graph is top


def _table_like(node: ir.Node) -> bool:
    """A Gather whose data is a 2-D float table (not shape arithmetic on int64 vectors)."""
    data = node.inputs[0] if node.inputs else None
    return (
        data is not None
        and data.dtype in (None, ir.DataType.FLOAT, ir.DataType.FLOAT16)
        and (data.shape is None or len(data.shape) == 2)
    )


Chosen = tuple[Site, int, tuple[str, ...]]
"""A site to quantize, its bits and its module paths."""


def weightless_message(name: str) -> str:
    """Why a weightless weight cannot become ``DynamicQuantizeMatMul``'s, and the fix."""
    return (
        f"weight {name!r} has no data (a model lowered from the meta device): the int8 weights "
        "of DynamicQuantizeMatMul are not derived while saving. Fix: lower the model with its "
        "weights, or quantize with activations=None (MatMulNBits, packed while irkit.save "
        "streams the checkpoint)"
    )


def refuse_weightless(model: ir.Model, settings: Settings) -> None:
    """Raise before any change if a weight the dynamic path would quantize has no data.

    Raises:
        QuantizationError: Naming the first such node and the fix.
    """
    calls = Calls.of(model)
    for owner, node, top in candidates(model, gathers=False):
        site = find_site(owner, node, calls, settings) if top else None
        if not isinstance(site, Site):
            continue
        leaves = constant_leaves(owner, site.weight, calls)
        for tensor in [] if isinstance(leaves, str) else leaves:
            if not has_data(tensor):
                name = tensor.name or site.weight.name or "?"
                raise QuantizationError(
                    f"quantize: {node.op_type} {node.name!r} in {owner_name(owner)}: "
                    + weightless_message(name)
                )


def dynamic_note(activations: Activations) -> str:
    """The report's line on what dynamic int8 computes."""
    full = activations is Activations.DYNAMIC_FULL_RANGE
    codes = "8-bit codes (VNNI/ARM CPUs)" if full else "7-bit codes, exact on every x86 CPU"
    return (
        f"dynamic int8: weights int8 with one scale per output column ({codes}); the kernel "
        "quantizes the activations to uint8 per call (prefill-fast; decode reads 8-bit weights)"
    )
