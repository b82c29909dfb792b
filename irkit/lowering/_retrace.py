"""``ExportedProgram.run_decompositions`` that survives pytree containers which make tensors.

torch retraces ``ep.module()``, which rebuilds the inputs and the outputs from the program's
``TreeSpec``s. A registered container whose constructor creates tensors (transformers'
``DynamicCache`` makes an empty tensor per cache layer) adds constants during the retrace that
torch then drops: ``SpecViolationError: Constant tensor lifted_tensor_N is not in the constants
dictionary``. :func:`run_decompositions` retraces with flat specs (one leaf per user input and
output, so no container is built) and puts the original specs back on the result: the leaves,
their order and their names are the same.
"""

from __future__ import annotations

import collections
import copy
import dataclasses
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch.export.graph_signature import InputKind

__all__ = ["run_decompositions"]

_PLAIN = (tuple, list, dict, collections.OrderedDict, collections.defaultdict, type(None))


def _has_container(spec: Any) -> bool:
    """Whether a ``TreeSpec`` holds a node other than tuples, lists, dicts and namedtuples."""
    if spec.is_leaf():
        return False
    plain = spec.type in _PLAIN or pytree.is_namedtuple_class(spec.type)
    return not plain or any(_has_container(child) for child in spec.children())


def _with_specs(ep: torch.export.ExportedProgram, signature: Any) -> torch.export.ExportedProgram:
    """A copy of ``ep`` whose root call has ``signature``'s specs and argument names."""
    graph = list(ep.module_call_graph)
    root = copy.copy(graph[0])
    root.signature = dataclasses.replace(
        root.signature,
        in_spec=signature.in_spec,
        out_spec=signature.out_spec,
        forward_arg_names=signature.forward_arg_names,
    )
    graph[0] = root
    return torch.export.ExportedProgram(
        root=ep.graph_module,
        graph=ep.graph,
        graph_signature=ep.graph_signature,
        state_dict=ep.state_dict,
        range_constraints=ep.range_constraints,
        module_call_graph=graph,
        example_inputs=None,
        constants=ep.constants,
        verifiers=[ep.verifier],
    )


def run_decompositions(ep: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """``ep.run_decompositions({})`` (a new program; ``ep`` is not modified), retraced with flat
    specs when the inputs or outputs hold a registered container (see the module docstring)."""
    signature = ep.module_call_graph[0].signature if ep.module_call_graph else None
    if signature is None or not (
        _has_container(signature.in_spec) or _has_container(signature.out_spec)
    ):
        return ep.run_decompositions({})
    names = [s.arg.name for s in ep.graph_signature.input_specs if s.kind == InputKind.USER_INPUT]
    outputs = signature.out_spec.num_leaves
    if len(names) != signature.in_spec.num_leaves:
        return ep.run_decompositions({})
    flat = dataclasses.replace(
        signature,
        in_spec=pytree.tree_structure((tuple(names), {})),
        out_spec=pytree.tree_structure(tuple(range(outputs))),
        forward_arg_names=names,
    )
    decomposed = _with_specs(ep, flat).run_decompositions({})
    return _with_specs(decomposed, signature)
