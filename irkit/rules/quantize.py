"""Weight-only quantization: MatMul / FusedMatMul / Gemm with a constant weight → MatMulNBits.

Identity: ``A @ W = MatMulNBits(A, pack(W))`` up to the rounding of ``W`` to ``bits`` per value
(round to nearest, per block of ``block_size`` rows of ``K``; packing in
:mod:`irkit.weights.packing`, byte-equal to onnxruntime's ``MatMulNBitsQuantizer``).

Which nodes (each one not taken is reported with why, see :class:`QuantizeReport`):

- ``MatMul(A, W)``, ``MatMul(A, Transpose(W))`` (irkit lowers every ``Linear`` so),
  ``com.microsoft.FusedMatMul`` (``alpha = 1``, no ``transA``/batch transposes; ``transB`` is the
  ``Transpose``), ``Gemm`` (``alpha = beta = 1``, ``transA = 0``, a 1-D ``C`` of ``N`` values
  becomes MatMulNBits' ``bias``);
- the weight is a 2-D float32/float16 constant (an initializer that is not a graph input, or a
  ``Constant``) of the activation's dtype, with ``K >= block_size``;
- or the weight is an input of a local function whose every call passes such a constant (through
  any depth of calls). The function body is rewritten once: that input becomes the packed
  weight, scales (and zero points) inputs, and every call passes its own packed initializers, so
  a deduplicated body stays one function. When the calls of one body want different settings
  (``exclude=``/``bits_for=`` by module path), the functions are copied from the innermost level
  of calls that parts them down to the body (:class:`Specializer`).

This is a pass rather than a :class:`~irkit.rewriting.Rule`: a rule rewrites inside one graph or
function body, while quantizing a function's weight changes the function's signature and every
call of it, up to the main graph.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import time
from collections.abc import Iterator, Mapping, Sequence

import numpy as np
import onnx_ir as ir

from irkit import metadata
from irkit.errors import QuantizationError
from irkit.rules._calls import (
    Calls,
    Instance,
    Owner,
    Specializer,
    chain_path,
    chains,
    node_path,
    owner_name,
    owners,
)
from irkit.weights import has_data, packed_parts, transpose
from irkit.weights.packing import Method, PackedWeight, check_settings, quantize_blockwise

__all__ = ["quantize", "QuantizeReport", "QuantizedNode", "SkippedNode", "DEFAULT_ACCURACY_LEVEL"]

DEFAULT_ACCURACY_LEVEL = 4
"""``accuracy_level`` when none is given: 4 (activations quantized to int8 inside the kernel),
the onnxruntime-genai builder's CPU default, about 2× faster decode on CPU than 0."""

_MS = "com.microsoft"
_QUANTIZED_OP = "MatMulNBits"


@dataclasses.dataclass(frozen=True)
class QuantizedNode:
    """One node replaced by ``MatMulNBits``.

    Attributes:
        node: The replaced node's name.
        op_type: ``MatMul``, ``FusedMatMul`` or ``Gemm``.
        where: ``"<main>"`` or the ``domain::function`` whose body held it.
        modules: The module paths it computes for (one per call of a shared body).
        k: Inner dimension.
        n: Output dimension.
        bits: Bits per weight.
    """

    node: str
    op_type: str
    where: str
    modules: tuple[str, ...]
    k: int
    n: int
    bits: int


@dataclasses.dataclass(frozen=True)
class SkippedNode:
    """A MatMul-like node left as it was, and why.

    Attributes:
        node: The node's name.
        op_type: Its op type.
        where: ``"<main>"`` or ``domain::function``.
        modules: Its module paths (empty when the model has no scope metadata).
        reason: Why it was not quantized.
    """

    node: str
    op_type: str
    where: str
    modules: tuple[str, ...]
    reason: str


@dataclasses.dataclass
class QuantizeReport:
    """What :func:`quantize` did: every MatMul-like node, quantized or not (with why).

    Attributes:
        quantized: The nodes now ``MatMulNBits`` (a shared function body counts once).
        skipped: The ``MatMul``/``FusedMatMul``/``Gemm`` nodes left alone, each with its reason.
        notes: Model-level remarks (already quantized, weights kept for other uses, …).
        functions: Local functions whose signature changed.
        bytes_before: Bytes of the main graph's initializers before.
        bytes_after: Bytes after.
        seconds: Wall time.
    """

    quantized: list[QuantizedNode] = dataclasses.field(default_factory=list)
    skipped: list[SkippedNode] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)
    functions: list[str] = dataclasses.field(default_factory=list)
    bytes_before: int = 0
    bytes_after: int = 0
    seconds: float = 0.0

    def fill_from(self, other: QuantizeReport) -> None:
        """Make this report a copy of ``other`` (how ``report=`` out-parameters are filled)."""
        for field in dataclasses.fields(self):
            setattr(self, field.name, getattr(other, field.name))

    def __str__(self) -> str:
        mib = 1 << 20
        gathers = sum(1 for q in self.quantized if q.op_type == "Gather")
        also = f", {gathers} Gather → GatherBlockQuantized" if gathers else ""
        lines = [
            f"quantize: {len(self.quantized) - gathers} node(s) → MatMulNBits{also}, "
            f"{len(self.skipped)} "
            f"skipped, {len(self.functions)} function(s) changed, weights "
            f"{self.bytes_before / mib:.2f} → {self.bytes_after / mib:.2f} MiB, "
            f"{self.seconds * 1000:.0f} ms"
        ]
        lines += [f"  note: {n}" for n in self.notes]
        for s in self.skipped:
            mods = f" [{', '.join(s.modules[:3])}{', …' if len(s.modules) > 3 else ''}]"
            lines.append(
                f"  ✗ {s.op_type} {s.node} in {s.where}{mods if s.modules else ''}: {s.reason}"
            )
        return "\n".join(lines)


def _matches(pattern: str, path: str, name: str) -> bool:
    """``pattern`` names this module (or one above it), or the node by name."""
    return (
        fnmatch.fnmatchcase(path, pattern)
        or fnmatch.fnmatchcase(path, pattern + ".*")
        or fnmatch.fnmatchcase(name, pattern)
    )


# --- matching one node ---------------------------------------------------------------------------


@dataclasses.dataclass
class _Site:
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


def _int_attr(node: ir.Node, name: str, default: int) -> int:
    attr = node.attributes.get(name)
    return default if attr is None else int(attr.as_int())


def _float_attr(node: ir.Node, name: str, default: float) -> float:
    attr = node.attributes.get(name)
    return default if attr is None else float(attr.as_float())


def _is_candidate(node: ir.Node) -> bool:
    if node.domain in ("", "ai.onnx"):
        return node.op_type in ("MatMul", "Gemm")
    return node.domain == _MS and node.op_type == "FusedMatMul"


def _operands(
    node: ir.Node,
) -> tuple[ir.Value | None, ir.Value | None, bool, ir.Value | None] | str:
    """``(A, B, transB, bias)`` of a candidate, or why its form is not MatMulNBits'."""
    a = node.inputs[0] if node.inputs else None
    b = node.inputs[1] if len(node.inputs) > 1 else None
    if node.op_type == "MatMul":
        return a, b, False, None
    if node.op_type == "FusedMatMul":
        if _float_attr(node, "alpha", 1.0) != 1.0:
            return "FusedMatMul with alpha != 1"
        if any(_int_attr(node, n, 0) for n in ("transA", "transBatchA", "transBatchB")):
            return "FusedMatMul transposes A or a batch dimension"
        return a, b, bool(_int_attr(node, "transB", 0)), None
    if _float_attr(node, "alpha", 1.0) != 1.0 or _float_attr(node, "beta", 1.0) != 1.0:
        return "Gemm with alpha or beta != 1"
    if _int_attr(node, "transA", 0):
        return "Gemm with transA = 1"
    c = node.inputs[2] if len(node.inputs) > 2 else None
    return a, b, bool(_int_attr(node, "transB", 0)), c


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


def _constant_tensor(owner: Owner, value: ir.Value) -> ir.TensorProtocol | str:
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


def _function_input_index(owner: Owner, value: ir.Value) -> int | None:
    if not isinstance(owner, ir.Function):
        return None
    for i, v in enumerate(owner.inputs):
        if v is value:
            return i
    return None


def _leaves(
    owner: Owner, value: ir.Value, calls: Calls, depth: int = 0
) -> list[ir.TensorProtocol] | str:
    """The constants a weight value takes, one per chain of calls, or why it is not constant."""
    index = _function_input_index(owner, value)
    if index is None:
        tensor = _constant_tensor(owner, value)
        return tensor if isinstance(tensor, str) else [tensor]
    assert isinstance(owner, ir.Function)
    sites = calls.of_function(owner)
    if not sites:
        return f"function {owner_name(owner)} is never called"
    if depth > 64:
        return "calls nested deeper than 64"
    tensors: list[ir.TensorProtocol] = []
    for caller, call in sites:
        arg = call.inputs[index] if index < len(call.inputs) else None
        if arg is None:
            return f"a call of {owner_name(owner)} omits the weight input {value.name!r}"
        found = _leaves(caller, arg, calls, depth + 1)
        if isinstance(found, str):
            return f"at a call in {owner_name(caller)}: {found}"
        tensors += found
    return tensors


def _gather_site(owner: Owner, node: ir.Node, calls: Calls) -> _Site | str:
    """An embedding ``Gather(E, ids)`` (axis 0, constant 2-D ``E``) as a site: ``E`` is packed
    as the transposed ``(K, N) = (hidden, vocab)`` weight, the layout ``GatherBlockQuantized``
    reads (``quantize_axis = 1``) and the one a tied lm_head's ``MatMul(x, Transpose(E))`` packs."""
    if _int_attr(node, "axis", 0) != 0:
        return "Gather on an axis other than 0 (GatherBlockQuantized gathers rows here)"
    data = node.inputs[0] if node.inputs else None
    ids = node.inputs[1] if len(node.inputs) > 1 else None
    if data is None or ids is None:
        return "an input is missing"
    leaves = _leaves(owner, data, calls)
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
    return _Site(owner, node, ids, data, True, None, None, k, n, dtype.numpy())


def _site(owner: Owner, node: ir.Node, calls: Calls, block_size: int) -> _Site | str:
    """The node as a site to quantize, or why it is not one."""
    if node.op_type == "Gather":
        return _gather_site(owner, node, calls)
    operands = _operands(node)
    if isinstance(operands, str):
        return operands
    a, b, transposed, bias = operands
    if a is None or b is None:
        return "an input is missing"
    weight, transposed = _through_transpose(b, transposed)
    transpose = b.producer() if weight is not b else None
    leaves = _leaves(owner, weight, calls)
    if isinstance(leaves, str):
        return leaves
    shapes = {tuple(t.shape.numpy()) for t in leaves}
    dtypes = {t.dtype for t in leaves}
    if len(shapes) != 1 or len(dtypes) != 1:
        return f"the calls of this shared body pass weights of different shapes/dtypes {sorted(shapes)}"
    (shape,), (dtype,) = shapes, dtypes
    if len(shape) != 2:
        return f"weight has rank {len(shape)}, MatMulNBits takes a 2-D weight"
    if dtype not in (ir.DataType.FLOAT, ir.DataType.FLOAT16):
        return f"weight dtype {dtype} is not float32/float16"
    if a.dtype is not None and a.dtype != dtype:
        return f"activation dtype {a.dtype} differs from the weight's {dtype}"
    k, n = (shape[1], shape[0]) if transposed else shape
    if k < block_size:
        return f"K={k} is smaller than one block ({block_size})"
    if bias is not None and (bias.shape is None or list(bias.shape.dims) != [n]):
        return f"Gemm's C has shape {bias.shape}, MatMulNBits' bias must be [{n}]"
    return _Site(owner, node, a, weight, transposed, transpose, bias, k, n, dtype.numpy())


# --- rewriting -----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Settings:
    bits: int
    block_size: int
    symmetric: bool
    accuracy_level: int
    method: Method
    embeddings: bool


_Packed = tuple[ir.Value, ir.Value, ir.Value | None]


class _Packer:
    """Makes packed weight values in each owner, once per (owner, weight, layout, bits)."""

    def __init__(self, model: ir.Model, calls: Calls, settings: _Settings):
        self.model, self.calls, self.settings = model, calls, settings
        self.done: dict[tuple[int, int, bool, int], _Packed] = {}
        self.arrays: dict[tuple[int, bool, int], PackedWeight] = {}
        self.replaced: list[tuple[Owner, ir.Value]] = []
        self.changed_functions: dict[ir.OperatorIdentifier, ir.Function] = {}
        self.names: dict[int, set[str]] = {}

    def packed(self, owner: Owner, weight: ir.Value, transposed: bool, bits: int) -> _Packed:
        key = (id(owner), id(weight), transposed, bits)
        if key not in self.done:
            index = _function_input_index(owner, weight)
            if index is None:
                self.done[key] = self._constant(owner, weight, transposed, bits)
            else:
                assert isinstance(owner, ir.Function)
                self.done[key] = self._lift(owner, index, weight, transposed, bits)
            self.replaced.append((owner, weight))
        return self.done[key]

    def prepare(self, site: _Site, bits: int) -> str | None:
        """Pack every constant the site's weight takes; why not, if a weight cannot be packed."""
        leaves = _leaves(site.owner, site.weight, self.calls)
        assert not isinstance(leaves, str)
        for tensor in leaves:
            if not has_data(tensor):  # (packed while irkit.save streams the checkpoint)
                continue
            try:
                self._pack(tensor, site.transposed, bits)
            except QuantizationError as exc:
                return str(exc)
        return None

    def _pack(self, tensor: ir.TensorProtocol, transposed: bool, bits: int) -> PackedWeight:
        key = (id(tensor), transposed, bits)
        if key not in self.arrays:
            array = tensor.numpy()
            s = self.settings
            self.arrays[key] = quantize_blockwise(
                array.T if transposed else array,
                bits=bits,
                block_size=s.block_size,
                symmetric=s.symmetric,
                method=s.method,
            )
        return self.arrays[key]

    def _parts(
        self, tensor: ir.TensorProtocol, transposed: bool, bits: int
    ) -> list[ir.TensorProtocol | None]:
        """The packed data, scales and zero points of a constant: real, or derived recipes
        over a weightless one (packed per tensor while :func:`irkit.save` streams it)."""
        if has_data(tensor):
            packed = self._pack(tensor, transposed, bits)
            arrays = [packed.data, packed.scales, packed.zero_points]
            return [None if a is None else ir.Tensor(a) for a in arrays]
        s = self.settings
        weight = transpose(tensor, (1, 0)) if transposed else tensor
        parts = packed_parts(
            weight, bits=bits, block_size=s.block_size, symmetric=s.symmetric, method=s.method
        )
        return list(parts)

    def _unique(self, owner: Owner, base: str) -> str:
        names = self.names.get(id(owner))
        if names is None:
            names = self.names[id(owner)] = _value_names(owner)
        name, i = base, 1
        while name in names:
            name, i = f"{base}_{i}", i + 1
        names.add(name)
        return name

    def _constant(self, owner: Owner, weight: ir.Value, transposed: bool, bits: int) -> _Packed:
        tensor = _constant_tensor(owner, weight)
        assert not isinstance(tensor, str)
        parts = self._parts(tensor, transposed, bits)
        suffixes = (f"_Q{bits}", "_scales", "_zero_points")
        base = weight.name or "weight"
        values: list[ir.Value | None] = []
        new_nodes: list[ir.Node] = []
        for part, suffix in zip(parts, suffixes, strict=True):
            if part is None:
                values.append(None)
                continue
            name = self._unique(owner, base + suffix)
            part.name = name
            shape = ir.Shape(part.shape.numpy())
            if isinstance(owner, ir.Graph):  # (a main-graph Constant becomes an initializer)
                value = ir.Value(name=name, const_value=part)
                value.shape, value.type = shape, ir.TensorType(part.dtype)
                owner.register_initializer(value)
            else:
                node = ir.node("Constant", [], {"value": part})
                value = node.outputs[0]
                value.name = name
                value.shape = shape
                value.type = ir.TensorType(part.dtype)
                new_nodes.append(node)
            values.append(value)
        if new_nodes:
            producer = weight.producer()
            assert producer is not None and producer.graph is not None
            producer.graph.insert_after(producer, new_nodes)
        q, scales, zp = values
        assert q is not None and scales is not None
        return q, scales, zp

    def _lift(
        self, function: ir.Function, index: int, weight: ir.Value, transposed: bool, bits: int
    ) -> _Packed:
        """New inputs of ``function`` for the packed weight, fed at every call."""
        sites = self.calls.of_function(function)
        caller_values = [
            self.packed(caller, call.inputs[index], transposed, bits)  # type: ignore[arg-type]
            for caller, call in sites
        ]
        example = caller_values[0]
        base = weight.name or "weight"
        suffixes = (f"_Q{bits}", "_scales", "_zero_points")
        new_inputs: list[ir.Value | None] = []
        for template, suffix in zip(example, suffixes, strict=True):
            if template is None:
                new_inputs.append(None)
                continue
            value = ir.Value(
                name=self._unique(function, base + suffix),
                type=template.type,
                shape=template.shape,
            )
            function.inputs.append(value)
            new_inputs.append(value)
        for (_, call), packed in zip(sites, caller_values, strict=True):
            _pass_arguments(call, function, [v for v in packed if v is not None])
        self.changed_functions[function.identifier()] = function
        q, scales, zp = new_inputs
        assert q is not None and scales is not None
        return q, scales, zp


def _value_names(owner: Owner) -> set[str]:
    names = {v.name for v in owner.inputs if v.name}
    if isinstance(owner, ir.Graph):
        names |= set(owner.initializers)
    for node in ir.traversal.RecursiveGraphIterator(owner):
        names |= {v.name for v in node.outputs if v.name}
    return names


def _pass_arguments(call: ir.Node, function: ir.Function, args: Sequence[ir.Value]) -> None:
    """Give ``call`` the arguments of ``function``'s last ``len(args)`` (new) inputs."""
    total = len(function.inputs)
    call.resize_inputs(total)
    for i, arg in enumerate(args):
        call.replace_input_with(total - len(args) + i, arg)


def _int64s(owner: Owner, values: Sequence[int], nodes: list[ir.Node]) -> ir.Value:
    """A ``Constant`` of int64 ``values`` (appended to ``nodes``)."""
    node = ir.node("Constant", [], {"value": ir.tensor(np.array(values, np.int64))})
    node.outputs[0].type = ir.TensorType(ir.DataType.INT64)
    node.outputs[0].shape = ir.Shape([len(values)])
    nodes.append(node)
    return node.outputs[0]


def _replace_gather(site: _Site, packed: _Packed, settings: _Settings, bits: int) -> None:
    """``Gather(E, ids)`` → ``GatherBlockQuantized(Reshape(B), ids, scales[, zero_points])``:
    ``B`` (``[vocab, n_blocks, blob]``, shared with a tied lm_head's MatMulNBits) is read as
    ``[vocab, n_blocks * blob]``; when ``hidden`` is not a multiple of the block the padded
    rows are gathered and a ``Slice`` drops the padding (as onnxruntime-genai's builder)."""
    q, scales, zp = packed
    old = site.node
    n_blocks = -(-site.k // settings.block_size)
    width = n_blocks * settings.block_size * bits // 8
    nodes: list[ir.Node] = []
    shape = _int64s(site.owner, [site.n, width], nodes)
    reshape = ir.node("Reshape", [q, shape])
    reshape.outputs[0].type = ir.TensorType(ir.DataType.UINT8)
    reshape.outputs[0].shape = ir.Shape([site.n, width])
    nodes.append(reshape)
    inputs = [reshape.outputs[0], site.activation, scales] + ([zp] if zp is not None else [])
    gather = ir.node(
        "GatherBlockQuantized",
        inputs,
        {"bits": bits, "block_size": settings.block_size, "gather_axis": 0, "quantize_axis": 1},
        domain=_MS,
        name=f"{old.name}_Q{bits}" if old.name else None,
    )
    nodes.append(gather)
    result = gather.outputs[0]
    result.type = old.outputs[0].type
    if n_blocks * settings.block_size != site.k:
        ends = [_int64s(site.owner, v, nodes) for v in ([0], [site.k], [-1])]
        cut = ir.node("Slice", [result, *ends])
        nodes.append(cut)
        result = cut.outputs[0]
        result.type = old.outputs[0].type
    result.shape = old.outputs[0].shape
    for node in nodes:
        node.metadata_props.update(old.metadata_props)
        node.metadata_props[metadata.REWRITE_RULE] = "Quantize"
    ir.convenience.replace_nodes_and_values(
        site.owner, old, [old], nodes, [old.outputs[0]], [result]
    )


def _replace(site: _Site, packed: _Packed, settings: _Settings, bits: int) -> None:
    if site.node.op_type == "Gather":
        _replace_gather(site, packed, settings, bits)
        return
    q, scales, zp = packed
    inputs: list[ir.Value | None] = [site.activation, q, scales, zp, None, site.bias]
    while inputs[-1] is None:
        inputs.pop()
    old = site.node
    new = ir.node(
        _QUANTIZED_OP,
        inputs,
        {
            "K": site.k,
            "N": site.n,
            "bits": bits,
            "block_size": settings.block_size,
            "accuracy_level": settings.accuracy_level,
        },
        domain=_MS,
        name=f"{old.name}_Q{bits}" if old.name else None,
    )
    new.metadata_props.update(old.metadata_props)
    new.metadata_props[metadata.REWRITE_RULE] = "Quantize"
    ir.convenience.replace_nodes_and_values(
        site.owner, old, [old], [new], [old.outputs[0]], [new.outputs[0]]
    )


def _remove_if_unused(owner: Owner, value: ir.Value) -> bool:
    """Drop a packed-away initializer or ``Constant`` that nothing uses any more; whether it
    was dropped (function inputs: :func:`_remove_function_inputs`)."""
    if value.uses() or (isinstance(owner, ir.Graph) and value.is_graph_output()):
        return False
    if isinstance(owner, ir.Graph) and value.is_initializer() and value.name:
        owner.initializers.pop(value.name)
        return True
    producer = value.producer()
    if producer is not None and producer.op_type == "Constant":
        owner.remove(producer, safe=True)
        return True
    return False


def _remove_dead_transpose(site: _Site) -> None:
    """Drop the weight's ``Transpose`` once no node reads it."""
    node = site.transpose
    if node is None or node.graph is None:
        return
    out = node.outputs[0]
    if not out.uses() and not out.is_graph_output():
        node.graph.remove(node, safe=True)


def _clean_up(packer: _Packer, calls: Calls, report: QuantizeReport) -> None:
    """Remove the weights nothing reads any more (in callees first, so callers follow).

    Function inputs are removed a round at a time, all of one function's together: each call's
    arguments are shifted once per round (onnx-ir replaces one input in O(inputs)), which keeps
    a 7B model's wide layer-stack calls from costing O(inputs^2) per removed weight.
    """
    pending = list(packer.replaced)
    changed = True
    while changed:
        changed = False
        unused: dict[int, tuple[ir.Function, set[int]]] = {}
        for owner, value in list(pending):
            if value.uses() or (isinstance(owner, ir.Graph) and value.is_graph_output()):
                continue
            index = _function_input_index(owner, value)
            if isinstance(owner, ir.Function) and index is not None:
                unused.setdefault(id(owner), (owner, set()))[1].add(index)
            elif not _remove_if_unused(owner, value):
                continue
            pending.remove((owner, value))
            changed = True
        for function, indices in unused.values():
            _remove_function_inputs(function, indices, calls)
    for owner, value in pending:
        users = sorted({u.node.op_type for u in value.uses()})
        if users:
            report.notes.append(
                f"{value.name!r} in {owner_name(owner)} is also read by {', '.join(users)}: "
                "kept beside its packed form"
            )


def _remove_function_inputs(function: ir.Function, indices: set[int], calls: Calls) -> None:
    """Drop ``function``'s inputs at ``indices`` and the matching argument of every call."""
    for index in sorted(indices, reverse=True):
        function.inputs.pop(index)
    first = min(indices)
    for _, call in calls.of_function(function):
        rest = [arg for i, arg in enumerate(call.inputs) if i not in indices]
        for i in range(first, len(rest)):
            if call.inputs[i] is not rest[i]:
                call.replace_input_with(i, rest[i])
        call.resize_inputs(len(rest))


def _initializer_bytes(model: ir.Model) -> int:
    total = 0
    for value in model.graph.initializers.values():
        if value.const_value is not None:
            total += value.const_value.nbytes
    return total


def _is_gather(node: ir.Node) -> bool:
    return node.op_type == "Gather" and node.domain in ("", "ai.onnx")


def _candidates(model: ir.Model, gathers: bool) -> Iterator[tuple[Owner, ir.Node, bool]]:
    """Every MatMul-like node (and, with ``gathers``, every ``Gather`` of a constant table):
    ``(owner, node, directly in the owner's body)``."""
    for owner in owners(model):
        top = owner.graph if isinstance(owner, ir.Function) else owner
        for node in ir.traversal.RecursiveGraphIterator(owner):
            if _is_candidate(node) or (gathers and _is_gather(node) and _table_like(node)):
                yield owner, node, node.graph is top


@dataclasses.dataclass(frozen=True)
class _Choice:
    """What the options ask for one module: its bits, or ``None`` (excluded)."""

    default: int
    exclude: tuple[str, ...]
    bits_for: Mapping[str, int]

    def setting(self, path: str, name: str) -> int | None:
        if any(_matches(p, path, name) for p in self.exclude):
            return None
        return next((b for p, b in self.bits_for.items() if _matches(p, path, name)), self.default)


def _settings_of(owner: Owner, node: ir.Node, calls: Calls, choice: _Choice) -> list[Instance]:
    """``(chain, module path, setting)`` for each instance of a node."""
    base = node_path(node)
    out = []
    for chain in chains(owner, calls):
        path = chain_path(owner, base, chain)
        out.append((chain, path, choice.setting(path, node.name or "")))
    return out


def _choose_bits(instances: Sequence[Instance]) -> int | str:
    """The bits for a site, or why it is left alone (excluded, or its instances disagree)."""
    settings = {s for _, _, s in instances}
    if settings == {None}:
        return "excluded by exclude="
    if len(settings) > 1:
        shown = ", ".join(
            f"{p}: {'excluded' if b is None else f'{b} bits'}" for _, p, b in instances
        )
        return (
            f"a shared function body whose calls want different settings ({shown}) and that no "
            "level of calls parts: give them one setting, or outline them apart"
        )
    (bits,) = settings
    assert bits is not None
    return bits


def _specialize(model: ir.Model, choice: _Choice, settings: _Settings) -> list[str]:
    """Copy shared bodies until every quantizable node's calls want one setting (or no level of
    calls can part them)."""
    specializer = Specializer(model)
    for _ in range(_MAX_SPECIALIZE_ROUNDS):
        if not _specialize_one(model, choice, settings, specializer):
            break
    calls = Calls.of(model)
    for ident in specializer.key_of_copy:  # a copy whose calls all moved on to later copies
        if ident in model.functions and not calls.by_function.get(ident):
            del model.functions[ident]
    return specializer.notes


_MAX_SPECIALIZE_ROUNDS = 1000


def _specialize_one(
    model: ir.Model, choice: _Choice, settings: _Settings, specializer: Specializer
) -> bool:
    """Part the instances of the first node that needs it, one level; whether one was found."""
    calls = Calls.of(model)
    for owner, node, top in _candidates(model, settings.embeddings):
        if not top or not isinstance(owner, ir.Function):
            continue
        instances = _settings_of(owner, node, calls, choice)
        if len({s for _, _, s in instances}) < 2:
            continue
        quantizable = isinstance(_site(owner, node, calls, settings.block_size), _Site)
        if quantizable and specializer.specialize(owner, instances):
            return True
    return False


_Chosen = tuple[_Site, int, tuple[str, ...]]
"""A site to quantize, its bits and its module paths."""


def _collect(
    model: ir.Model, calls: Calls, choice: _Choice, packer: _Packer, result: QuantizeReport
) -> list[_Chosen]:
    """The sites to quantize (each weight packed already); the others go to the report."""
    sites: list[_Chosen] = []
    for owner, node, top in list(_candidates(model, packer.settings.embeddings)):
        instances = _settings_of(owner, node, calls, choice)
        shown = tuple(p for _, p, _ in instances if p)
        site = _site(owner, node, calls, packer.settings.block_size) if top else _IN_SUBGRAPH
        chosen = site if isinstance(site, str) else _choose_bits(instances)
        if not isinstance(site, str) and not isinstance(chosen, str):
            problem = packer.prepare(site, chosen)  # (every weight packed before any change)
            if problem is None:
                sites.append((site, chosen, shown))
                continue
            chosen = problem
        reason = site if isinstance(site, str) else str(chosen)
        where = owner_name(owner)
        result.skipped.append(SkippedNode(node.name or "", node.op_type, where, shown, reason))
    return sites


_IN_SUBGRAPH = "inside an If/Loop/Scan body"


def _table_like(node: ir.Node) -> bool:
    """A Gather whose data is a 2-D float table (not shape arithmetic on int64 vectors)."""
    data = node.inputs[0] if node.inputs else None
    return (
        data is not None
        and data.dtype in (None, ir.DataType.FLOAT, ir.DataType.FLOAT16)
        and (data.shape is None or len(data.shape) == 2)
    )


def _note_quantized(model: ir.Model, sites: Sequence[_Chosen], result: QuantizeReport) -> None:
    already = sum(
        1
        for owner in owners(model)
        for n in owner
        if n.domain == _MS and n.op_type == _QUANTIZED_OP
    )
    if already:
        result.notes.append(f"the model already holds {already} MatMulNBits node(s)")
    if not sites:
        result.notes.append("nothing was quantized")


def _note_tied(sites: Sequence[_Chosen], calls: Calls, result: QuantizeReport) -> None:
    """Say, for each table both gathered and multiplied by (a tied embedding / lm_head),
    whether one packed initializer serves both ops (same bits) or each gets its own."""
    uses: dict[int, tuple[str, set[tuple[str, int]]]] = {}
    for site, bits, _ in sites:
        leaves = _leaves(site.owner, site.weight, calls)
        if isinstance(leaves, str) or not site.transposed:
            continue
        kind = "GatherBlockQuantized" if site.node.op_type == "Gather" else _QUANTIZED_OP
        for tensor in leaves:
            name = tensor.name or site.weight.name or "?"
            uses.setdefault(id(tensor), (name, set()))[1].add((kind, bits))
    for name, kinds in uses.values():
        if len({k for k, _ in kinds}) < 2:
            continue
        shown = ", ".join(f"{k} at {b} bits" for k, b in sorted(kinds))
        if len({b for _, b in kinds}) == 1:
            result.notes.append(f"tied {name!r}: one packed initializer for {shown}")
        else:
            result.notes.append(
                f"tied {name!r}: packed once per bit width ({shown}): give both one setting "
                "to share one initializer"
            )


def _apply(
    model: ir.Model, sites: Sequence[_Chosen], packer: _Packer, result: QuantizeReport
) -> None:
    """Replace each site by MatMulNBits, then drop the float weights nothing reads any more."""
    for site, chosen, shown in sites:
        packed = packer.packed(site.owner, site.weight, site.transposed, chosen)
        _replace(site, packed, packer.settings, chosen)
        node = site.node
        where = owner_name(site.owner)
        result.quantized.append(
            QuantizedNode(node.name or "", node.op_type, where, shown, site.k, site.n, chosen)
        )
    for site, _, _ in sites:
        _remove_dead_transpose(site)
    _clean_up(packer, packer.calls, result)
    if sites:
        model.opset_imports.setdefault(_MS, 1)
        for owner in {id(s.owner): s.owner for s, _, _ in sites}.values():
            if isinstance(owner, ir.Function):
                owner.opset_imports.setdefault(_MS, 1)


def _checked_options(
    bits: int, block_size: int, accuracy_level: int | None, bits_for: Mapping[str, int]
) -> int:
    check_settings(bits, block_size)
    for pattern, b in bits_for.items():
        if not isinstance(pattern, str):
            raise QuantizationError(f"bits_for keys are module path globs, got {pattern!r}")
        check_settings(b, block_size)
    level = DEFAULT_ACCURACY_LEVEL if accuracy_level is None else accuracy_level
    if isinstance(level, bool) or level not in (0, 1, 2, 3, 4):
        raise QuantizationError(
            f"accuracy_level={accuracy_level!r}: MatMulNBits takes 0 (unset), 1 (fp32), "
            "2 (fp16), 3 (bf16) or 4 (int8)"
        )
    return int(level)


def quantize(
    model: ir.Model,
    *,
    bits: int = 4,
    block_size: int = 32,
    symmetric: bool = True,
    accuracy_level: int | None = None,
    exclude: str | Sequence[str] = (),
    bits_for: Mapping[str, int] | None = None,
    method: Method | str = Method.RTN,
    embeddings: bool = False,
    report: QuantizeReport | None = None,
) -> ir.Model:
    """Quantize the model's constant matmul weights **in place** into ``com.microsoft.MatMulNBits``.

    See the module docstring for which nodes are taken; every ``MatMul``/``FusedMatMul``/``Gemm``
    left alone is listed in the report with why. Inside local functions the weight inputs become
    packed inputs, so deduplicated bodies stay deduplicated. A model that holds no quantizable
    node (an already quantized one, say) is left as it is, with a report note.

    Args:
        model: The model; modified in place.
        bits: 4 or 8.
        block_size: Rows of ``K`` per scale: 16, 32, 64, 128 or 256.
        symmetric: No zero points (else per-block zero points: slightly more accurate, more bytes).
        accuracy_level: MatMulNBits' ``accuracy_level``; ``None`` means
            :data:`DEFAULT_ACCURACY_LEVEL` (4: int8 activations inside the kernel, the CPU
            choice of onnxruntime-genai's builder). 0 computes in the activation's float type.
        exclude: Module path globs (or node names) to leave in float: ``"lm_head"``,
            ``"layers.0.*"``. A pattern also covers the modules below the one it names.
        bits_for: Per-module bit widths overriding ``bits`` (first matching glob wins), e.g.
            ``{"lm_head": 8}``.
        method: ``"rtn"`` (round to nearest, onnxruntime's bytes) or ``"kquant"`` (a search
            of scales with least squares: less reconstruction error, 25–120× the packing time);
            see :class:`irkit.weights.packing.Method`.
        embeddings: Also turn each embedding ``Gather`` of a constant 2-D float table into
            ``com.microsoft.GatherBlockQuantized`` (same bits, block size and zero points; 4
            or 8 bits). A table tied to a quantized lm_head (``MatMul(x, Transpose(E))``) with
            the same bits is packed once: both ops read one initializer.
        report: If given, filled with the :class:`QuantizeReport`.

    On a weightless model (lowered from a ``meta``-device program) the packed weights, scales
    and zero points are derived tensors (:class:`irkit.weights.Packed` recipes over the
    checkpoint tensors): :func:`irkit.save` with ``weights=`` packs them one tensor at a time
    while streaming the shards, to the same bytes as quantizing the real model in memory.

    Returns:
        ``model`` itself.

    Raises:
        QuantizationError: Unsupported ``bits``, ``block_size``, ``accuracy_level``,
            ``bits_for`` or ``method``.

    Example:
        >>> import numpy as np, onnx_ir as ir
        >>> x = ir.Value(name="x", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([1, 64]))
        >>> w = ir.Value(name="w", const_value=ir.tensor(np.ones((64, 8), np.float32)))
        >>> mm = ir.node("MatMul", [x, w])
        >>> graph = ir.Graph([x], mm.outputs, nodes=[mm], initializers=[w], opset_imports={"": 21})
        >>> [n.op_type for n in quantize(ir.Model(graph, ir_version=10)).graph]
        ['MatMulNBits']
    """
    start = time.perf_counter()
    patterns = (exclude,) if isinstance(exclude, str) else tuple(exclude)
    overrides = dict(bits_for or {})
    level = _checked_options(bits, block_size, accuracy_level, overrides)
    settings = _Settings(bits, block_size, symmetric, level, Method.of(method), embeddings)
    result = QuantizeReport(bytes_before=_initializer_bytes(model))
    choice = _Choice(bits, patterns, overrides)
    result.notes += _specialize(model, choice, settings)
    calls = Calls.of(model)
    packer = _Packer(model, calls, settings)
    sites = _collect(model, calls, choice, packer, result)
    _note_quantized(model, sites, result)
    _note_tied(sites, calls, result)
    _apply(model, sites, packer, result)
    result.functions = sorted(f"{f.domain}::{f.name}" for f in packer.changed_functions.values())
    result.bytes_after = _initializer_bytes(model)
    result.seconds = time.perf_counter() - start
    if report is not None:
        report.fill_from(result)
    return model
