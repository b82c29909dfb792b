"""Bounded key/value buffers for sliding-window layers on onnxruntime-genai's shared buffer.

Identity: a ``GroupQueryAttention(…, past_key, past_value, seqlens_k, total_sequence_length,
local_window_size=W)`` reads only the last ``W`` keys of each row. With
``sliding_window_cache=1`` the op keeps the most recent positions contiguously at rows
``[0, L)`` of its past/present buffer, ``min(T, W) ≤ L ≤ min(T, capacity)``, and evicts the
older ones itself (onnxruntime's schema): the same outputs from a buffer of ``capacity ≥ W``
positions instead of ``search.max_length``. onnxruntime-genai allocates such a buffer for the
layers ``genai_config.json`` lists under ``model.decoder.sliding_window`` (``window_size``,
``layers``, ``cache_slack``: the CPU keeps ``W + 16`` positions by default, CUDA ``W``), as
its own builder writes it for mixed sliding/full models (qwen2, gemma2/3, gpt-oss, …): the
windowed layers' attention then scans ``W + 16`` positions, not ``max_length``.

Preconditions, per cached layer: both its past inputs are read by nothing but the past inputs
of ``GroupQueryAttention`` nodes (and ``Shape`` of axes before the sequence axis), every such
node has one ``local_window_size > 0``, no ``attention_bias`` (ALiBi: a bias over absolute
slots) and no ``position_ids`` input. A node reached by a layer that does not qualify bounds
nothing: the layers that share a function body share its attribute.

Right-padded prompts (genai's batches of prompts of several lengths): the windowed kernel
derives each row's resident positions from ``seqlens_k`` alone and refuses a prompt row with
``seqlens_k + 1 < sequence_length``. Each bounded node therefore reads
``seqlens_k' = Max(seqlens_k, Min(S, C) - 1)`` (``S`` the new tokens, from ``input_ids``; ``C``
the buffer's capacity, from the first bounded layer's past input — genai gives every bounded
layer one; ``Min(S, C) - 1`` computed once at the top of the main graph and threaded into the
layer functions, where :func:`irkit.rules.hoist.hoist_invariants` finds the ``Max`` invariant
too): a prompt of ``S ≤ C`` positions is taken whole, pads included — a real token never
sees the pads after it (causal), and the next step's ``seqlens_k`` (the row's own length)
makes the kernel keep that row's real positions only and write over the pads, as the shared
buffer does. A decode step (``S = 1``) is unchanged. A padded batch whose prompt is longer
than ``C`` still has short rows, which the kernel refuses by name (genai's own builder model
refuses every padded batch there).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np
import onnx_ir as ir
import onnx_ir.tape

from irkit.rules.hoist import Threader
from irkit.rules.ort.attention._base import SEQUENCE_AXIS, readers, reads_its_buffer

#: ``GroupQueryAttention`` inputs the bounded buffer cannot carry: ``position_ids`` (9) and
#: ``attention_bias`` (10), both indexed by absolute slots of the buffer.
_SLOT_INPUTS = (9, 10)
_WINDOW_DIM = "past_window_sequence"
_FLOOR = "windowed_cache/floor"


@dataclasses.dataclass(frozen=True)
class WindowedCache:
    """The sliding-window layers whose key/value buffers genai may bound.

    Attributes:
        window: ``window_size`` (the widest ``local_window_size`` of the layers).
        layers: The cached layers' indices (``N`` of ``past_key_values.N.key``).
    """

    window: int
    layers: tuple[int, ...]

    def genai(self) -> dict[str, object]:
        """``model.decoder.sliding_window`` of ``genai_config.json`` (the buffers bounded, the
        prompt fed whole: ``slide_inputs`` and ``slide_key_value_cache`` off)."""
        return {
            "window_size": self.window,
            "slide_key_value_cache": False,
            "slide_inputs": False,
            "layers": list(self.layers),
            "cache_slack": 0,  # (genai's default for the execution provider)
        }


def _windowed_attentions(model: ir.Model, pasts: Sequence[ir.Value]) -> list[ir.Node] | None:
    """The ``GroupQueryAttention`` nodes reading ``pasts`` when they all qualify, else None."""
    nodes: list[ir.Node] = []
    for past in pasts:
        for node, index in readers(model, past):
            if not reads_its_buffer(node, index):
                return None
            if node.op_type == "Shape":  # (of the batch or heads axis)
                continue
            if any(i < len(node.inputs) and node.inputs[i] is not None for i in _SLOT_INPUTS):
                return None
            if node.attributes.get_int("local_window_size", -1) <= 0:
                return None
            nodes.append(node)
    return nodes or None


def _rename_sequence_dim(value: ir.Value) -> None:
    shape = value.shape
    if shape is None or len(shape) != 4:
        return
    dim = shape[SEQUENCE_AXIS]
    if isinstance(dim, ir.SymbolicDim) and dim.value is not None:
        name = dim.value.replace("past_sequence", _WINDOW_DIM)
        value.shape = ir.Shape([*shape[:SEQUENCE_AXIS], name, *shape[SEQUENCE_AXIS + 1 :]])


#: Graph inputs whose axis 1 is the number of new tokens, first found wins.
_NEW_TOKENS = ("input_ids", "inputs_embeds")


def _floor(model: ir.Model, capacity_of: ir.Value) -> ir.Value | None:
    """``int32(Min(S, C) - 1)`` at the top of the main graph (``S`` from ``input_ids``, ``C``
    the buffer ``capacity_of`` holds: every bounded layer has one capacity), or None without an
    input that gives ``S``."""
    inputs = {str(v.name): v for v in model.graph.inputs}
    tokens = next((inputs[n] for n in _NEW_TOKENS if n in inputs), None)
    if tokens is None:
        return None
    tape = onnx_ir.tape.Tape()
    new = tape.op("Shape", [tokens], {"start": 1, "end": 2}, name="windowed_cache/new_tokens")
    end = {"start": SEQUENCE_AXIS, "end": SEQUENCE_AXIS + 1}
    capacity = tape.op("Shape", [capacity_of], end, name="windowed_cache/capacity")
    one = tape.op("Constant", [], {"value": ir.tensor(np.array([1], dtype=np.int64))})
    whole = tape.op("Sub", [tape.op("Min", [new, capacity]), one])
    floor = tape.op("Cast", [whole], {"to": ir.DataType.INT32}, name=_FLOOR)
    floor.name, floor.dtype, floor.shape = _FLOOR, ir.DataType.INT32, ir.Shape([1])
    first = next(iter(model.graph), None)
    if first is None:
        model.graph.extend(tape.nodes)
    else:
        model.graph.insert_before(first, tape.nodes)
    return floor


def _take_padded_prompts(node: ir.Node, floor: ir.Value) -> None:
    """``seqlens_k`` → ``Max(seqlens_k, floor)`` before ``node`` (see the module docstring);
    ``floor`` is ``node``'s graph's own value of :func:`_floor`."""
    seqlens, graph = node.inputs[5], node.graph
    if seqlens is None or graph is None:
        return
    taken = ir.node("Max", [seqlens, floor], name=f"{node.name}/windowed_seqlens_k")
    out = taken.outputs[0]
    out.name, out.dtype = f"{node.name}/windowed_seqlens_k", ir.DataType.INT32
    out.shape = seqlens.shape
    graph.insert_before(node, taken)
    node.replace_input_with(5, out)


def bound_windowed_caches(
    model: ir.Model, layers: Mapping[int, tuple[Sequence[str], Sequence[str]]]
) -> WindowedCache | None:
    """Mark the sliding-window layers' ``GroupQueryAttention`` nodes ``sliding_window_cache=1``
    (see the module docstring) and name their buffers' sequence axis ``past_window_sequence``.

    Args:
        model: A model whose attention runs on genai's shared buffer (edited in place).
        layers: Per cached layer index, ``(past input names, present output names)`` of its
            keys and values.

    Returns:
        The bounded layers, or None where no layer qualifies or the graph has no input of the
        new tokens (``input_ids``, ``inputs_embeds``): the model is left as it was.
    """
    inputs = {str(v.name): v for v in model.graph.inputs}
    outputs = {str(v.name): v for v in model.graph.outputs}
    chosen: dict[int, list[ir.Node]] = {}
    refused: set[int] = set()  # ids of nodes a layer that does not qualify reads through
    for index, (past_names, _) in layers.items():
        pasts = [inputs[name] for name in past_names if name in inputs]
        found = _windowed_attentions(model, pasts) if len(pasts) == len(past_names) else None
        if found is None:
            refused.update(id(node) for past in pasts for node, _ in readers(model, past))
        else:
            chosen[index] = found
    if not chosen or any(id(n) in refused for nodes in chosen.values() for n in nodes):
        return None
    first_past = inputs[layers[min(chosen)][0][0]]
    floor = _floor(model, first_past)
    if floor is None:
        return None
    threader = Threader(model)
    owners = {id(f.graph): key for key, f in model.functions.items()}
    window = 0
    marked: dict[int, ir.Node] = {id(n): n for nodes in chosen.values() for n in nodes}
    for node in marked.values():
        node.attributes["sliding_window_cache"] = ir.AttrInt64("sliding_window_cache", 1)
        window = max(window, node.attributes.get_int("local_window_size", 0))
        owner = owners.get(id(node.graph))
        _take_padded_prompts(node, threader.formal(owner, (None, floor), _FLOOR, floor))
    for index in chosen:
        past_names, present_names = layers[index]
        for name in past_names:
            _rename_sequence_dim(inputs[name])
        for name in present_names:
            if name in outputs:
                _rename_sequence_dim(outputs[name])
    return WindowedCache(window=window, layers=tuple(sorted(chosen)))
