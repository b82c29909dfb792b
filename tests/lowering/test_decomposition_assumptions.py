"""A decomposition traced with the program's guards suppressed may branch on a symbolic size;
``trace_decomposition`` records each condition the program's ranges do not decide
(``irkit/lowering/_trace.py``) and ``irkit.lower`` warns about it."""

from __future__ import annotations

import logging

import torch

from irkit.lowering._lower import _warn_assumptions
from irkit.lowering._plan import Decomposition, Plan
from irkit.lowering._trace import ASSUMPTIONS, trace_decomposition


class Double(torch.nn.Module):
    def forward(self, x):
        return x * 2


def _mul_node(max_batch: int) -> tuple[torch.export.ExportedProgram, torch.fx.Node]:
    batch = torch.export.Dim("batch", max=max_batch)
    ep = torch.export.export(Double(), (torch.ones(3, 4),), dynamic_shapes={"x": {0: batch}})
    node = next(n for n in ep.graph.nodes if n.op == "call_function")
    return ep, node


def _branchy(x, other):
    return x * other if x.shape[0] < 16 else x * other * 1.0


def test_a_branch_on_a_dynamic_size_is_recorded_with_its_input():
    _, node = _mul_node(max_batch=64)
    shape_env = node.args[0].meta["val"].shape[0].node.shape_env
    guards_before = len(shape_env.guards)
    gm = trace_decomposition(node, _branchy)
    (assumed,) = gm.meta[ASSUMPTIONS]
    symbol = assumed.split()[0]
    assert assumed == f"{symbol} < 16 ({symbol} = x.size(0))"
    assert len(shape_env.guards) == guards_before  # the user's program is not specialized
    assert "_log_guard" not in vars(shape_env)  # the hook is the class's again


def test_a_branch_the_ranges_decide_is_not_an_assumption():
    _, node = _mul_node(max_batch=8)  # batch <= 8: x.shape[0] < 16 always holds
    gm = trace_decomposition(node, _branchy)
    assert ASSUMPTIONS not in gm.meta


def test_lower_warns_once_per_op_and_condition(caplog):
    _, node = _mul_node(max_batch=64)
    gm = trace_decomposition(node, _branchy)
    plan = Plan(decompositions={node: Decomposition(gm, Plan())})
    with caplog.at_level(logging.WARNING, logger="irkit.lowering._lower"):
        _warn_assumptions(plan)
    # Only this logger's records: pytest >= 9.2 also captures other loggers' DEBUG records
    # (torch's trace logging) while the level is lowered.
    (record,) = [r for r in caplog.records if r.name == "irkit.lowering._lower"]
    assert "decomposition of aten::mul.Tensor branches on" in record.getMessage()
    assert "x.size(0)" in record.getMessage()
    assert "custom_lowerings={torch.ops.aten.mul.Tensor: fn}" in record.getMessage()


class Identity(torch.nn.Module):
    """``eye`` of a dynamic size: a factory node whose only inputs are sizes (no fake tensor
    among them: its decomposition is traced in the fake mode of its own result)."""

    def forward(self, x):
        return x.sum(0) + torch.eye(x.shape[1], dtype=x.dtype)


def test_a_factory_of_a_symbolic_size_lowers_through_its_decomposition():
    import numpy as np
    import onnx_ir as ir
    import onnxruntime as ort

    import irkit

    dims = ({0: torch.export.Dim("rows"), 1: torch.export.Dim("columns")},)
    ep = torch.export.export(Identity(), (torch.randn(2, 3),), dynamic_shapes=dims)
    model = irkit.lower(ep)  # (torchlib has no eye; torch's decomposition: Range, Equal, Cast)
    session = ort.InferenceSession(
        ir.to_proto(model).SerializeToString(), providers=["CPUExecutionProvider"]
    )
    for shape in ((4, 5), (1, 7)):
        x = np.random.default_rng(0).random(shape, dtype=np.float32)
        (got,) = session.run(None, {session.get_inputs()[0].name: x})
        np.testing.assert_array_equal(got, Identity()(torch.from_numpy(x)).numpy())
