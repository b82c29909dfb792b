"""Where a lowered model first departs from its ExportedProgram: node-by-node values compared.

The program's graph module runs under an ``fx.Interpreter`` that keeps every node's value; the
flat lowered model (``irkit.lowering.lower``: values keep their FX names) gets every value of
the same name as an extra output and runs in onnxruntime (optimizations off). Values are
compared in the program's order; the first that differ is where to look (the lowering of that
node, or an op whose inputs tie as ``topk`` of equal scores does).

Each torch value is copied as its node computes it, so a value an in-place op mutates later
(``embeddings += …``) is compared as it was.

Usage::

    from bench.bisect_lowering import differences
    for d in differences(ep, (input_ids,))[:5]:
        print(d)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch.export.graph_signature import InputKind, TensorArgument

import irkit.lowering
from tests import helpers


@dataclasses.dataclass(frozen=True)
class Difference:
    """One FX node whose lowered value differs from torch's.

    Attributes:
        node: The FX node's name (the ONNX value's name).
        target: The node's op.
        max_abs: The largest absolute difference (inf for a shape mismatch).
        source: The last line of the node's stack trace.
    """

    node: str
    target: str
    max_abs: float
    source: str


def _flat_inputs(ep: torch.export.ExportedProgram, args: Sequence[Any]) -> list[Any]:
    user = iter(args)
    flat = []
    for spec in ep.graph_signature.input_specs:
        if spec.kind == InputKind.USER_INPUT:
            is_tensor = isinstance(spec.arg, TensorArgument)
            flat.append(next(user) if is_tensor else getattr(spec.arg, "value", None))
        elif spec.target in ep.state_dict:
            flat.append(ep.state_dict[spec.target])
        else:
            flat.append(ep.constants[spec.target])
    return flat


def torch_values(ep: torch.export.ExportedProgram, args: Sequence[Any]) -> dict[str, Any]:
    """Every node's value when the program runs on ``args`` (its tensor user inputs)."""
    values: dict[str, Any] = {}

    class Recording(torch.fx.Interpreter):
        def run_node(self, n: torch.fx.Node) -> Any:
            result = super().run_node(n)
            # a copy: an in-place op later must not change what this node computed
            values[n.name] = result.clone() if isinstance(result, torch.Tensor) else result
            return result

    with torch.no_grad():
        Recording(ep.graph_module).run(*_flat_inputs(ep, args))
    return values


def differences(
    ep: torch.export.ExportedProgram, args: Sequence[torch.Tensor], atol: float = 1e-4
) -> list[Difference]:
    """The FX nodes whose lowered values differ from torch's by more than ``atol``, in order."""
    expected = torch_values(ep, args)
    model = irkit.lowering.lower(ep)
    produced = {v.name: v for node in model.graph for v in node.outputs}
    outputs = set(model.graph.outputs)
    for name, value in expected.items():
        if name in produced and isinstance(value, torch.Tensor) and produced[name] not in outputs:
            model.graph.outputs.append(produced[name])
    session = helpers.ort_session(model)
    names = [i.name for i in session.get_inputs()]
    got = dict(
        zip(
            [o.name for o in session.get_outputs()],
            session.run(None, {n: a.numpy() for n, a in zip(names, args, strict=True)}),
            strict=True,
        )
    )
    nodes = {n.name: n for n in ep.graph.nodes}
    found = []
    for name, value in expected.items():
        if name not in got or not isinstance(value, torch.Tensor):
            continue
        want, have = value.detach().numpy(), got[name]
        if want.shape != have.shape:
            diff = float("inf")
        elif want.size == 0:
            continue
        else:
            diff = float(np.abs(have.astype(np.float64) - want.astype(np.float64)).max())
        if diff > atol:
            trace = (nodes[name].meta.get("stack_trace") or "").strip().splitlines()
            found.append(
                Difference(name, str(nodes[name].target), diff, trace[-1] if trace else "")
            )
    return found
