"""The rewrite itself: each site becomes ``MatMulNBits`` (or ``GatherBlockQuantized``), then the
float weights, Transposes and function inputs nothing reads any more are removed."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx_ir as ir

from irkit import metadata
from irkit.rules._calls import Calls, Owner, owner_name
from irkit.rules.quantize._options import Settings
from irkit.rules.quantize._packer import PackedValues, Packer
from irkit.rules.quantize._report import QuantizedNode, QuantizeReport
from irkit.rules.quantize._sites import MS, Chosen, Site, function_input


def _int64s(owner: Owner, values: Sequence[int], nodes: list[ir.Node]) -> ir.Value:
    """A ``Constant`` of int64 ``values`` (appended to ``nodes``)."""
    node = ir.node("Constant", [], {"value": ir.tensor(np.array(values, np.int64))})
    node.outputs[0].type = ir.TensorType(ir.DataType.INT64)
    node.outputs[0].shape = ir.Shape([len(values)])
    nodes.append(node)
    return node.outputs[0]


def _replace_gather(site: Site, packed: PackedValues, settings: Settings, bits: int) -> None:
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
        domain=MS,
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


def replace_site(site: Site, packed: PackedValues, settings: Settings, bits: int) -> None:
    """Replace the site's node by ``MatMulNBits``, ``DynamicQuantizeMatMul`` or
    ``GatherBlockQuantized`` reading ``packed``."""
    if site.node.op_type == "Gather":
        _replace_gather(site, packed, settings, bits)
        return
    q, scales, zp = packed
    old = site.node
    name = f"{old.name}_Q{bits}" if old.name else None
    before: list[ir.Node] = []
    activation = site.activation
    if site.activation_transposed:  # (FusedMatMul's transA: the swap as its own Transpose)
        rank = len(activation.shape or ())
        perm = [*range(rank - 2), rank - 1, rank - 2]
        before.append(ir.node("Transpose", [activation], {"perm": perm}))
        activation = before[0].outputs[0]
        if site.activation.dtype is not None:
            activation.dtype = site.activation.dtype
        if site.activation.shape is not None:
            dims = list(site.activation.shape)
            activation.shape = ir.Shape([*dims[:-2], dims[-1], dims[-2]])
    if settings.activations.dynamic:  # (A, B, b_scale, b_zero_point, bias)
        inputs: list[ir.Value | None] = [activation, q, scales, zp, site.bias]
        attributes: dict[str, int] = {}
    else:
        inputs = [activation, q, scales, zp, None, site.bias]
        attributes = {
            "K": site.k,
            "N": site.n,
            "bits": bits,
            "block_size": settings.block_size,
            "accuracy_level": settings.accuracy_level,
        }
    while inputs[-1] is None:
        inputs.pop()
    new = ir.node(settings.op_type, inputs, attributes, domain=MS, name=name)
    for node in (*before, new):
        node.metadata_props.update(old.metadata_props)
        node.metadata_props[metadata.REWRITE_RULE] = "Quantize"
    ir.convenience.replace_nodes_and_values(
        site.owner, old, [old], [*before, new], [old.outputs[0]], [new.outputs[0]]
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


def remove_dead_transpose(site: Site) -> None:
    """Drop the weight's ``Transpose`` once no node reads it."""
    node = site.transpose
    if node is None or node.graph is None:
        return
    out = node.outputs[0]
    if not out.uses() and not out.is_graph_output():
        node.graph.remove(node, safe=True)


def clean_up(packer: Packer, calls: Calls, report: QuantizeReport) -> None:
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
            lifted = function_input(owner, value)
            if lifted is not None:
                function, index = lifted
                unused.setdefault(id(function), (function, set()))[1].add(index)
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


def initializer_bytes(model: ir.Model) -> int:
    total = 0
    for value in model.graph.initializers.values():
        if value.const_value is not None:
            total += value.const_value.nbytes
    return total


def apply_sites(
    model: ir.Model, sites: Sequence[Chosen], packer: Packer, result: QuantizeReport
) -> None:
    """Replace each site by its quantized op, then drop the float weights nothing reads any
    more."""
    for site, chosen, shown in sites:
        packed = packer.packed(site.owner, site.weight, site.transposed, chosen)
        replace_site(site, packed, packer.settings, chosen)
        node = site.node
        where = owner_name(site.owner)
        result.quantized.append(
            QuantizedNode(node.name or "", node.op_type, where, shown, site.k, site.n, chosen)
        )
    for site, _, _ in sites:
        remove_dead_transpose(site)
    clean_up(packer, packer.calls, result)
    if sites:
        model.opset_imports.setdefault(MS, 1)
        for owner in {id(s.owner): s.owner for s, _, _ in sites}.values():
            if isinstance(owner, ir.Function):
                owner.opset_imports.setdefault(MS, 1)
