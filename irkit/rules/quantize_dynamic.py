"""Dynamic int8: ``MatMul`` with a constant weight → ``com.microsoft.DynamicQuantizeMatMul``.

Identity: ``A @ W ≈ DynamicQuantizeMatMul(A, Wq, s)`` with ``W ≈ Wq · s`` per output column
(``Wq`` int8, symmetric: ``s = max|W[:, n]| / L``, ``Wq = clamp(round(W / s), -L, L)``, halves
to even as numpy rounds) and ``A`` quantized to uint8 per call by the kernel (its own scale and
zero point, computed at run time). ``L = 64`` by default (``reduce_range``, 7-bit weights):
onnxruntime's u8×s8 kernels on x86 CPUs without VNNI (AVX2, AVX-512F) add pairs of products in
16-bit saturating arithmetic, and ``2 · 255 · 127`` overflows it — measured on an AVX2 machine,
a 64-deep product was off by 1.7 (11% of its range) with ``L = 127`` and by 0.12 with
``L = 64`` (``2 · 255 · 64 = 32640`` fits). ``reduce_range=False`` (``L = 127``) is for VNNI
and ARM CPUs. Unlike ``MatMulNBits`` (weight-only: the product is
computed in float, or with ``accuracy_level=4`` in int8 blocks), every product is an int8 GEMM,
so a long prompt — compute-bound — gets faster: this is the prefill-fast option. Decode, bound by
weight bytes, reads 8-bit weights (vs 4 for int4).

Which nodes: ``MatMul(A, W)`` and ``MatMul(A, Transpose(W))`` (irkit's ``Linear``), ``A`` float32,
``W`` a 2-D float32 constant (an initializer that is not a graph input, or a ``Constant``) with
data, in the main graph or in a function body. A weight that is a function's input (a model
lowered with functions: ``irkit.lower(..., functions=False)`` gives constants) or has no data
(the ``meta`` device) is reported, with every other ``MatMul`` not taken and why.

A pass, like :func:`irkit.quantize`: it adds initializers to the main graph (or ``Constant``
nodes in a function body). The model is changed in place.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import onnx_ir as ir

from irkit.errors import QuantizationError

__all__ = ["DynamicQuantizeReport", "quantize_dynamic"]

_MS = "com.microsoft"
_OP = "DynamicQuantizeMatMul"
_Owner = ir.Graph | ir.Function


@dataclasses.dataclass
class DynamicQuantizeReport:
    """What :func:`quantize_dynamic` did: nodes taken (owner, node) and skipped (with why)."""

    quantized: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    skipped: list[tuple[str, str, str]] = dataclasses.field(default_factory=list)
    bytes_before: int = 0
    bytes_after: int = 0

    def __str__(self) -> str:
        lines = [
            f"quantize_dynamic: {len(self.quantized)} MatMul → {_OP}, {len(self.skipped)} "
            f"skipped, weights {self.bytes_before / 2**20:.2f} → {self.bytes_after / 2**20:.2f} MiB"
        ]
        lines += [f"  ✗ {node} in {owner}: {why}" for owner, node, why in self.skipped]
        return "\n".join(lines)


def quantize_weight(w: np.ndarray, reduce_range: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """``(Wq int8 [K, N], scale float32 [N])``, symmetric per column (see the module docstring).

    >>> q, s = quantize_weight(np.array([[1.0, -2.0], [0.5, 4.0]], np.float32), False)
    >>> q.tolist(), s.tolist()
    ([[127, -64], [64, 127]], [0.007874015718698502, 0.031496062874794006])
    >>> quantize_weight(np.array([[1.0, -2.0], [0.5, 4.0]], np.float32))[0].tolist()
    [[64, -32], [32, 64]]
    """
    limit = np.float32(64 if reduce_range else 127)
    peak = np.abs(w).max(axis=0).astype(np.float32)
    scale = np.where(peak > 0, peak / limit, np.float32(1)).astype(np.float32)
    q = np.ascontiguousarray(np.clip(np.round(w / scale), -limit, limit).astype(np.int8))
    return q, scale


def _owner_name(owner: _Owner) -> str:
    return f"{owner.domain}::{owner.name}" if isinstance(owner, ir.Function) else "<main>"


def _constant(owner: _Owner, value: ir.Value) -> ir.TensorProtocol | str:
    if isinstance(owner, ir.Graph) and value.is_graph_input():
        return f"weight {value.name!r} is a graph input (it can be fed at run time)"
    if isinstance(owner, ir.Graph) and value.is_initializer() and value.const_value is not None:
        return value.const_value
    producer = value.producer()
    if producer is not None and producer.op_type == "Constant" and producer.domain == "":
        attr = producer.attributes.get("value")
        if attr is not None and attr.type == ir.AttributeType.TENSOR:
            return attr.as_tensor()
    if isinstance(owner, ir.Function) and value in owner.inputs:
        return (
            f"weight {value.name!r} is an input of the function (lower with functions=False "
            "so weights are constants)"
        )
    return f"weight {value.name!r} is not a constant"


def _weight(owner: _Owner, node: ir.Node) -> tuple[np.ndarray, ir.Node | None, ir.Value] | str:
    """The ``(K, N)`` weight of a MatMul (through a 2-D ``Transpose``), that Transpose and the
    weight's value."""
    a = node.inputs[0] if node.inputs else None
    b = node.inputs[1] if len(node.inputs) > 1 else None
    if a is None or b is None:
        return "an input is missing"
    if a.dtype not in (ir.DataType.FLOAT, None):  # (None: untyped inside a function body)
        return f"activation dtype {a.dtype}: the kernel takes float32"
    transpose = b.producer()
    source = b
    if transpose is not None and transpose.op_type == "Transpose" and transpose.domain == "":
        perm = transpose.attributes.get("perm")
        if transpose.inputs[0] is not None and (perm is None or list(perm.as_ints()) == [1, 0]):
            source = transpose.inputs[0]
        else:
            transpose = None
    else:
        transpose = None
    tensor = _constant(owner, source)
    if isinstance(tensor, str):
        return tensor
    if len(tensor.shape) != 2 or tensor.dtype != ir.DataType.FLOAT:
        return f"weight is {tensor.dtype} of rank {len(tensor.shape)}, not a 2-D float32"
    try:
        array = tensor.numpy()
    except Exception:  # a weightless (meta) tensor has no data to round
        return "weight has no data (a meta-device model): quantize a model with weights"
    return np.ascontiguousarray(array.T if transpose is not None else array), transpose, source


def _constant_value(owner: _Owner, name: str, array: np.ndarray, nodes: list[ir.Node]) -> ir.Value:
    tensor = ir.tensor(array, name=name)
    if isinstance(owner, ir.Graph):
        value = ir.Value(name=name, type=ir.TensorType(tensor.dtype), shape=ir.Shape(array.shape))
        value.const_value = tensor
        owner.register_initializer(value)
        return value
    node = ir.Node("", "Constant", [], [ir.AttrTensor("value", tensor)], name=f"{name}_const")
    node.outputs[0].name = name
    node.outputs[0].const_value = tensor
    node.outputs[0].type = ir.TensorType(tensor.dtype)
    node.outputs[0].shape = ir.Shape(array.shape)
    nodes.append(node)
    return node.outputs[0]


def _unique(taken: set[str], base: str) -> str:
    name, i = base, 1
    while name in taken:
        name, i = f"{base}_{i}", i + 1
    taken.add(name)
    return name


def _names(model: ir.Model) -> set[str]:
    names = set(model.graph.initializers)
    for owner in (model.graph, *model.functions.values()):
        names.update(v.name for n in owner for v in n.outputs if v.name)
    return names


def quantize_dynamic(
    model: ir.Model,
    *,
    exclude: Sequence[str] = (),
    reduce_range: bool = True,
    report: DynamicQuantizeReport | None = None,
) -> ir.Model:
    """Dynamic int8 (``DynamicQuantizeMatMul``) for every ``MatMul`` with a constant weight.

    Args:
        model: The model; changed in place.
        exclude: Node names to keep in float (e.g. the ``lm_head`` product's name).
        reduce_range: 7-bit weights (``|Wq| <= 64``), exact on every x86 CPU; ``False`` for
            the full int8 range on CPUs with VNNI or ARM dot products (see the module
            docstring).
        report: Filled with what was taken and what was skipped, with why.

    Returns:
        ``model`` itself.

    Raises:
        QuantizationError: ``exclude`` is a string (give a sequence of names) or the model
            already holds ``DynamicQuantizeMatMul`` nodes.
    """
    if isinstance(exclude, str):
        raise QuantizationError(
            f"quantize_dynamic: exclude={exclude!r} is one string; pass a list of node names"
        )
    owners: list[_Owner] = [model.graph, *model.functions.values()]
    if any(n.op_type == _OP and n.domain == _MS for o in owners for n in o):
        raise QuantizationError(
            f"quantize_dynamic: the model already holds {_OP} nodes; quantize the float model"
        )
    result = report if report is not None else DynamicQuantizeReport()
    taken = _names(model)
    consumed: list[ir.Value] = []
    for owner in owners:
        changed = False
        for node in list(owner):
            if node.op_type != "MatMul" or node.domain != "":
                continue
            where = _owner_name(owner)
            if node.name in exclude:
                result.skipped.append((where, node.name or "", "excluded by exclude="))
                continue
            found = _weight(owner, node)
            if isinstance(found, str):
                result.skipped.append((where, node.name or "", found))
                continue
            w, transpose, source = found
            q, scale = quantize_weight(w, reduce_range)
            base = (node.name or "matmul").replace("/", "_")
            new_constants: list[ir.Node] = []
            wq = _constant_value(owner, _unique(taken, f"{base}_Wq8"), q, new_constants)
            ws = _constant_value(owner, _unique(taken, f"{base}_Wscale"), scale, new_constants)
            new = ir.Node(_MS, _OP, [node.inputs[0], wq, ws], name=node.name)
            new.metadata_props.update(node.metadata_props)
            out, y = new.outputs[0], node.outputs[0]
            out.type, out.shape = y.type, y.shape
            owner.insert_before(node, [*new_constants, new])
            y.replace_all_uses_with(out, replace_graph_outputs=True)
            owner.remove(node, safe=True)
            out.name = y.name
            if transpose is not None and not transpose.outputs[0].uses():
                owner.remove(transpose, safe=True)
            consumed.append(source)
            result.quantized.append((where, node.name or ""))
            result.bytes_before += w.nbytes
            result.bytes_after += q.nbytes + scale.nbytes
            changed = True
        if changed:
            owner.opset_imports.setdefault(_MS, 1)
    if result.quantized:
        model.opset_imports.setdefault(_MS, 1)
    _drop_unused(model, consumed)
    return model


def _drop_unused(model: ir.Model, consumed: Sequence[ir.Value]) -> None:
    """Remove the float weights (initializers, ``Constant`` nodes) nothing reads any more."""
    for value in consumed:
        if value.uses() or value.is_graph_output() or value.is_graph_input():
            continue
        producer = value.producer()
        if producer is not None and producer.graph is not None:
            producer.graph.remove(producer, safe=True)
        elif value.name is not None and value.name in model.graph.initializers:
            del model.graph.initializers[value.name]
