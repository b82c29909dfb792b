"""Packed weights as values: initializers or ``Constant`` nodes in each owner, and new inputs of
the local functions whose weight inputs are packed (fed at every call)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx_ir as ir

from irkit.errors import QuantizationError
from irkit.rules._calls import Calls, Owner, owner_name
from irkit.rules.quantize._options import Activations, Settings
from irkit.rules.quantize._sites import (
    Site,
    constant_leaves,
    constant_tensor,
    function_input,
    weightless_message,
)
from irkit.weights import has_data, packed_parts, transpose
from irkit.weights.packing import quantize_blockwise, quantize_columns_int8

PackedValues = tuple[ir.Value, ir.Value, ir.Value | None]
"""The values of a packed weight: codes, scales and zero points (``None`` when symmetric)."""

_Arrays = tuple[np.ndarray, np.ndarray, np.ndarray | None]


class Packer:
    """Makes packed weight values in each owner, once per (owner, weight, layout, bits)."""

    def __init__(self, model: ir.Model, calls: Calls, settings: Settings):
        self.model, self.calls, self.settings = model, calls, settings
        self.done: dict[tuple[int, int, bool, int], PackedValues] = {}
        self.arrays: dict[tuple[int, bool, int], _Arrays] = {}
        self.replaced: list[tuple[Owner, ir.Value]] = []
        self.changed_functions: dict[ir.OperatorIdentifier, ir.Function] = {}
        self.names: dict[int, set[str]] = {}

    def packed(self, owner: Owner, weight: ir.Value, transposed: bool, bits: int) -> PackedValues:
        key = (id(owner), id(weight), transposed, bits)
        if key not in self.done:
            lifted = function_input(owner, weight)
            if lifted is None:
                self.done[key] = self._constant(owner, weight, transposed, bits)
            else:
                function, index = lifted
                self.done[key] = self._lift(function, index, weight, transposed, bits)
            self.replaced.append((owner, weight))
        return self.done[key]

    def prepare(self, site: Site, bits: int) -> str | None:
        """Pack every constant the site's weight takes; why not, if a weight cannot be packed."""
        leaves = constant_leaves(site.owner, site.weight, self.calls)
        if isinstance(leaves, str):
            return leaves
        for tensor in leaves:
            if not has_data(tensor):  # (packed while irkit.save streams the checkpoint)
                continue
            try:
                self._pack(tensor, site.transposed, bits)
            except QuantizationError as exc:
                return str(exc)
        return None

    def _pack(self, tensor: ir.TensorProtocol, transposed: bool, bits: int) -> _Arrays:
        key = (id(tensor), transposed, bits)
        if key not in self.arrays:
            array = tensor.numpy()
            weight = array.T if transposed else array
            s = self.settings
            if s.activations.dynamic:
                full = s.activations is Activations.DYNAMIC_FULL_RANGE
                codes, scale = quantize_columns_int8(weight, reduce_range=not full)
                self.arrays[key] = (codes, scale, None)
            else:
                packed = quantize_blockwise(
                    weight,
                    bits=bits,
                    block_size=s.block_size,
                    symmetric=s.symmetric,
                    method=s.method,
                )
                self.arrays[key] = (packed.data, packed.scales, packed.zero_points)
        return self.arrays[key]

    def _parts(
        self, tensor: ir.TensorProtocol, transposed: bool, bits: int
    ) -> tuple[ir.TensorProtocol, ir.TensorProtocol, ir.TensorProtocol | None]:
        """The packed data, scales and zero points of a constant: real, or derived recipes
        over a weightless one (packed per tensor while :func:`irkit.save` streams it)."""
        if has_data(tensor):
            data, scales, zero_points = self._pack(tensor, transposed, bits)
            zp = None if zero_points is None else ir.Tensor(zero_points)
            return ir.Tensor(data), ir.Tensor(scales), zp
        s = self.settings
        if s.activations.dynamic:  # (quantize() refuses weightless weights before any change)
            raise QuantizationError(weightless_message(tensor.name or "?"))
        weight = transpose(tensor, (1, 0)) if transposed else tensor
        return packed_parts(
            weight, bits=bits, block_size=s.block_size, symmetric=s.symmetric, method=s.method
        )

    def _unique(self, owner: Owner, base: str) -> str:
        names = self.names.get(id(owner))
        if names is None:
            names = self.names[id(owner)] = _value_names(owner)
        name, i = base, 1
        while name in names:
            name, i = f"{base}_{i}", i + 1
        names.add(name)
        return name

    def _constant(
        self, owner: Owner, weight: ir.Value, transposed: bool, bits: int
    ) -> PackedValues:
        tensor = constant_tensor(owner, weight)
        if isinstance(tensor, str):  # (prepare() found every weight of a site constant)
            raise QuantizationError(
                f"{weight.name!r} in {owner_name(owner)} was packable and is no longer: {tensor}. "
                "This is a bug in irkit; please report it with this message."
            )
        data, scales, zero_points = self._parts(tensor, transposed, bits)
        base = weight.name or "weight"
        new_nodes: list[ir.Node] = []

        def value_of(part: ir.TensorProtocol, suffix: str) -> ir.Value:
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
            return value

        q = value_of(data, f"_Q{bits}")
        scale_value = value_of(scales, "_scales")
        zp = None if zero_points is None else value_of(zero_points, "_zero_points")
        if new_nodes:  # (a function's weight is a Constant node's output: the new ones follow it)
            producer = weight.producer()
            graph = None if producer is None else producer.graph
            if producer is None or graph is None:
                raise QuantizationError(
                    f"the constant {weight.name!r} in {owner_name(owner)} is no node's output. "
                    "This is a bug in irkit; please report it with this message."
                )
            graph.insert_after(producer, new_nodes)
        return q, scale_value, zp

    def _lift(
        self, function: ir.Function, index: int, weight: ir.Value, transposed: bool, bits: int
    ) -> PackedValues:
        """New inputs of ``function`` for the packed weight, fed at every call."""
        sites = self.calls.of_function(function)
        caller_values = [
            self.packed(caller, call.inputs[index], transposed, bits)  # type: ignore[arg-type]
            for caller, call in sites
        ]
        q_example, scales_example, zp_example = caller_values[0]
        base = weight.name or "weight"

        def input_like(template: ir.Value, suffix: str) -> ir.Value:
            value = ir.Value(
                name=self._unique(function, base + suffix),
                type=template.type,
                shape=template.shape,
            )
            function.inputs.append(value)
            return value

        q = input_like(q_example, f"_Q{bits}")
        scales = input_like(scales_example, "_scales")
        zp = None if zp_example is None else input_like(zp_example, "_zero_points")
        for (_, call), packed in zip(sites, caller_values, strict=True):
            _pass_arguments(call, function, [v for v in packed if v is not None])
        self.changed_functions[function.identifier()] = function
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
