"""Control flow: cond → If, while_loop → Loop, scan/map → Scan, invoke_subgraph → a kept function.

Every model is exported, lowered with functions off and on, optimized, and run in onnxruntime on
inputs that take each branch / run several iteration counts, against eager PyTorch.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Sequence

import onnx_ir as ir
import pytest
import torch
from torch._higher_order_ops.associative_scan import associative_scan
from torch._higher_order_ops.map import map as torch_map
from torch._higher_order_ops.scan import scan
from torch._higher_order_ops.while_loop import while_loop

import irkit
from irkit import metadata
from tests import helpers

ATOL = 1e-5


def _ops(graph_like) -> collections.Counter[str]:
    """Op histogram of a graph, function body or subgraph, bodies included (``If/then:Sin``)."""
    counts: collections.Counter[str] = collections.Counter()
    for node in graph_like:
        counts[node.op_type] += 1
        for attr in node.attributes.values():
            if attr.type == ir.AttributeType.GRAPH:
                for op, n in _ops(attr.value).items():
                    counts[f"{node.op_type}/{attr.name}:{op}"] += n
    return counts


def _check_numbers(
    model: ir.Model, module: torch.nn.Module, inputs: Sequence[Sequence[torch.Tensor]]
) -> None:
    _check_expected(model, [(args, helpers.flatten_outputs(module(*args))) for args in inputs])


def _check_expected(model: ir.Model, cases: Sequence[tuple[Sequence[torch.Tensor], list]]) -> None:
    for args, expected in cases:
        helpers.assert_close(helpers.run_ort(model, list(args)), expected, ATOL)


def _lower_all_ways(
    module: torch.nn.Module,
    example: Sequence[torch.Tensor],
    inputs: Sequence[Sequence[torch.Tensor]],
    dynamic_shapes=None,
    check: Callable[[ir.Model], None] | None = None,
) -> dict[str, ir.Model]:
    """Lower flat and hierarchical, then optimize each; check numbers (and ``check``) on all four."""
    ep = torch.export.export(module, tuple(example), dynamic_shapes=dynamic_shapes)
    # (eager control flow compiles its bodies on each call: compute the references once)
    cases = [(args, helpers.flatten_outputs(module(*args))) for args in inputs]
    models = {}
    for functions in (False, True):
        model = irkit.lower(ep, functions=functions)
        irkit.check(model)
        _check_expected(model, cases)
        models[f"functions={functions}"] = model
        if check is not None:
            check(model)
        model = ir.serde.deserialize_model(ir.serde.serialize_model(model))  # a copy
        models[f"functions={functions},optimized"] = model
        irkit.optimize(model)
        irkit.check(model)
        _check_expected(model, cases)
        models[f"functions={functions},optimized"] = model
    return models


# --- cond → If ----------------------------------------------------------------------------------
class Cond(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)

    def forward(self, x, y):
        def true_fn(x, y):
            return self.lin(x).sin() + y, x.cos()

        def false_fn(x, y):
            return x.cos() - y, x + 1

        return torch.cond(x.sum() > 0, true_fn, false_fn, (x, y))


def test_cond_lowers_to_if_and_takes_both_branches():
    torch.manual_seed(0)
    x, y = torch.randn(2, 3), torch.randn(2, 3)
    inputs = [(x.abs(), y), (-x.abs(), y)]  # each branch

    def check(model: ir.Model) -> None:
        [if_node] = [n for n in model.graph.all_nodes() if n.op_type == "If"]
        then_ops = _ops(if_node.attributes["then_branch"].value)
        else_ops = _ops(if_node.attributes["else_branch"].value)
        assert then_ops == {"Gemm": 1, "Sin": 1, "Add": 1, "Cos": 1}
        assert else_ops == {"Cos": 1, "Sub": 1, "Add": 1, "Constant": 1}
        # the branches read x, y and the weights from the enclosing graph: no inputs
        assert not if_node.attributes["then_branch"].value.inputs
        assert if_node.metadata_props[metadata.FX_TARGET] == "torch.ops.higher_order.cond"

    _lower_all_ways(Cond(), (x, y), inputs, check=check)


def test_golden_cond():
    torch.manual_seed(0)
    ep = torch.export.export(Cond(), (torch.randn(2, 3), torch.randn(2, 3)))
    model = irkit.lower(ep, functions=False)
    helpers.assert_golden(
        ir.to_onnx_text(model, exclude_initializers=True), "lowering/control_flow_cond.txt"
    )


class SymPredicate(torch.nn.Module):
    """A SymBool predicate (from the dynamic batch) and a SymInt of the outer graph in a body."""

    def forward(self, x):
        n = x.shape[0]
        return torch.cond(n > 4, lambda x: x.sin() * n, lambda x: x.cos() - n, (x,))


def test_cond_on_a_symbolic_predicate_with_an_outer_symint_in_the_body():
    torch.manual_seed(0)
    batch = torch.export.Dim("batch")
    inputs = [(torch.randn(6, 3),), (torch.randn(2, 3),)]
    models = _lower_all_ways(SymPredicate(), inputs[0], inputs, dynamic_shapes=({0: batch},))
    model = models["functions=False"]
    assert [v.shape for v in model.graph.inputs] == [ir.Shape(["batch", 3])]
    [if_node] = [n for n in model.graph if n.op_type == "If"]
    assert if_node.inputs[0].dtype == ir.DataType.BOOL


class ConstantPredicate(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("flag", torch.ones(2))

    def forward(self, x):
        return torch.cond(self.flag.sum() > 0, lambda x: x.sin(), lambda x: x.cos(), (x,))


def test_constant_folding_of_a_constant_predicate_picks_the_branch():
    x = torch.randn(2, 3)
    ep = torch.export.export(ConstantPredicate(), (x,))
    model = irkit.lower(ep, functions=False)
    assert _ops(model.graph)["If"] == 1
    irkit.optimize(model)
    assert _ops(model.graph) == {"Sin": 1}
    _check_numbers(model, ConstantPredicate(), [(x,)])


# --- while_loop → Loop --------------------------------------------------------------------------
class While(torch.nn.Module):
    def forward(self, x, limit):
        def cond_fn(i, x):
            return i < limit

        def body_fn(i, x):
            return i + 1, x * 2 + 1

        return while_loop(cond_fn, body_fn, (torch.zeros((), dtype=torch.int64), x))


def test_while_loop_lowers_to_loop_for_several_iteration_counts():
    x = torch.randn(2, 3)
    inputs = [(x, torch.tensor(n)) for n in (0, 1, 5)]

    def check(model: ir.Model) -> None:
        [loop] = [n for n in model.graph.all_nodes() if n.op_type == "Loop"]
        body = loop.attributes["body"].value
        # (iteration, condition, *carried) → (condition, *carried); the condition recomputed
        assert len(body.inputs) == 4 and len(body.outputs) == 3
        assert _ops(body)["Less"] == 1
        assert loop.inputs[0] is None  # no trip count: a while loop

    _lower_all_ways(While(), inputs[2], inputs, check=check)


class DynamicWhile(torch.nn.Module):
    """Loops as often as the (dynamic) batch is long; the body reads the batch size."""

    def forward(self, x):
        def cond_fn(i, acc):
            return i < x.size(0)

        def body_fn(i, acc):
            return i + 1, acc * 0.5 + x.sum(0) * x.size(0)

        return while_loop(cond_fn, body_fn, (torch.zeros((), dtype=torch.int64), x.sum(0) * 0))


def test_while_loop_over_a_dynamic_batch():
    torch.manual_seed(0)
    batch = torch.export.Dim("batch", min=2)
    inputs = [(torch.randn(n, 3),) for n in (2, 3, 7)]
    _lower_all_ways(DynamicWhile(), inputs[1], inputs, dynamic_shapes=({0: batch},))


# --- scan / map → Scan --------------------------------------------------------------------------
class CumulativeScan(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.randn(3))

    def forward(self, init, xs):
        def combine(carry, x):
            new = carry * 0.5 + x * self.scale
            return new, new.sin()

        return scan(combine, init, xs)


def test_scan_lowers_to_scan_over_a_dynamic_length():
    torch.manual_seed(0)
    length = torch.export.Dim("length")
    inputs = [(torch.randn(3), torch.randn(n, 3)) for n in (1, 4, 9)]

    def check(model: ir.Model) -> None:
        [node] = [n for n in model.graph.all_nodes() if n.op_type == "Scan"]
        assert node.attributes["num_scan_inputs"].value == 1
        assert len(node.outputs) == 2  # final carry, stacked ys

    models = _lower_all_ways(
        CumulativeScan(), inputs[1], inputs, dynamic_shapes=(None, {0: length}), check=check
    )
    assert models["functions=False"].graph.outputs[1].shape == ir.Shape(["length", 3])


class ReverseScan(torch.nn.Module):
    def forward(self, init, xs):
        def combine(carry, x):
            new = carry * 0.9 + x
            return new, new.cos()

        return scan(combine, init, xs, dim=1, reverse=True)


def test_reverse_scan_over_dim_1():
    # torch.export moves the dim to 0 and flips with ordinary ops: one Scan, no Loop needed
    torch.manual_seed(0)
    inputs = [(torch.randn(2), torch.randn(2, 6))]

    def check(model: ir.Model) -> None:
        ops = _ops(model.graph)
        assert ops["Scan"] == 1 and "Loop" not in ops

    _lower_all_ways(ReverseScan(), inputs[0], inputs, check=check)


class Map(torch.nn.Module):
    def forward(self, xs, y):
        return torch_map(lambda x, y: x.sin() + y, xs, y)


def test_map_lowers_to_scan_without_carries():
    torch.manual_seed(0)
    inputs = [(torch.randn(4, 3), torch.randn(3))]

    def check(model: ir.Model) -> None:
        [node] = [n for n in model.graph.all_nodes() if n.op_type == "Scan"]
        assert len(node.inputs) == 1 and len(node.outputs) == 1

    _lower_all_ways(Map(), inputs[0], inputs, check=check)


class Gate(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)

    def forward(self, x):
        return torch.cond(x.sum() > 0, lambda x: self.lin(x), lambda x: x - 1, (x,))


class NestedScan(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.gate = Gate()

    def forward(self, init, xs):
        def combine(carry, x):
            y = self.gate(carry + x)
            return y, y * 2

        return scan(combine, init, xs)


def test_cond_inside_a_module_inside_a_scan():
    torch.manual_seed(0)
    inputs = [(torch.randn(3), torch.randn(5, 3)), (-torch.ones(3) * 4, torch.randn(5, 3) * 0.1)]

    def check(model: ir.Model) -> None:
        ops = _ops(model.graph)
        assert ops["Scan"] == 1 and ops["Scan/body:If"] == 1

    _lower_all_ways(NestedScan(), inputs[0], inputs, check=check)


# --- nodes that own subgraphs through the other stages ------------------------------------------
class Repeated(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.gates = torch.nn.ModuleList([Gate() for _ in range(3)])

    def forward(self, x):
        for gate in self.gates:
            x = gate(x) + 1
        return x


def test_control_flow_inside_a_repeated_module_is_one_function():
    torch.manual_seed(0)
    x = torch.randn(2, 3)
    inputs = [(x,), (-x.abs() - 3,)]
    module = Repeated()
    models = _lower_all_ways(module, (x,), inputs)
    for name in ("functions=True", "functions=True,optimized"):
        model = models[name]
        assert list(model.functions) == [("tests.lowering", "Gate", "")]
        assert _ops(model.graph)["Gate"] == 3
        gate = model.functions[("tests.lowering", "Gate", "")]
        # the weights the branches read by name are inputs of the function
        assert [v.name for v in gate.inputs] == ["x", "lin.weight", "lin.bias"]
        assert _ops(gate)["If"] == 1 and _ops(gate)["If/then_branch:Gemm"] == 1
    # inline gives each call site its own copy of the branches, reading that site's weights
    model = models["functions=True"]
    irkit.inline(model)
    irkit.check(model)
    assert not model.functions and _ops(model.graph)["If"] == 3
    reads = {
        v.name
        for n in model.graph
        if n.op_type == "If"
        for inner in n.attributes["then_branch"].value
        for v in inner.inputs
    }
    assert {"gates.0.lin.weight", "gates.1.lin.weight", "gates.2.lin.weight"} <= reads
    _check_numbers(model, module, inputs)


def test_save_load_roundtrip_keeps_bodies_and_metadata(tmp_path):
    torch.manual_seed(0)
    x = torch.randn(3)
    module = NestedScan()
    model = irkit.lower(torch.export.export(module, (x, torch.randn(5, 3))), functions=False)
    path = tmp_path / "nested.onnx"
    irkit.save(model, path)
    loaded = irkit.load(path)
    irkit.check(loaded)
    assert _ops(loaded.graph) == _ops(model.graph)
    [scan_node] = [n for n in loaded.graph if n.op_type == "Scan"]
    [if_node] = [n for n in scan_node.attributes["body"].value if n.op_type == "If"]
    assert if_node.metadata_props[metadata.FX_NODE] == "cond"
    _check_numbers(loaded, module, [(x, torch.randn(5, 3))])


def test_inline_of_an_outlined_model_keeps_the_bodies():
    torch.manual_seed(0)
    module = Cond()
    x, y = torch.randn(2, 3), torch.randn(2, 3)
    model = irkit.lower(torch.export.export(module, (x, y)))
    irkit.inline(model)
    assert not model.functions
    irkit.check(model)
    _check_numbers(model, module, [(x, y), (-x.abs(), y)])


# --- invoke_subgraph → one kept local function --------------------------------------------------
class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(4, 4))
        self.bias = torch.nn.Parameter(torch.randn(4))

    @torch.compiler.nested_compile_region
    def forward(self, x):
        return torch.relu(torch.nn.functional.linear(x, self.weight, self.bias))


class Stack(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList([Block() for _ in range(3)])

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


def test_nested_compile_region_used_three_times_is_one_function_called_three_times():
    torch.manual_seed(0)
    module, x = Stack(), torch.randn(2, 4)
    # Strict export keeps the region as invoke_subgraph (torch 2.13 inlines the first call).
    ep = torch.export.export(module, (x,), strict=True)
    targets = [n.target for n in ep.graph.nodes if n.op == "call_function"]
    assert targets.count(torch.ops.higher_order.invoke_subgraph) == 2

    flat = irkit.lower(ep, functions=False)
    assert list(flat.functions) == [("tests.lowering", "Block", "")]
    assert [n.op_type for n in flat.graph] == ["Gemm", "Relu", "Block", "Block"]
    function = flat.functions[("tests.lowering", "Block", "")]
    assert function.metadata_props[metadata.INVOKE_SUBGRAPH] == "subgraph_1"

    model = irkit.lower(ep)  # the outliner shares the function with the inlined first call
    assert list(model.functions) == [("tests.lowering", "Block", "")]
    assert [(n.name, n.domain, n.op_type) for n in model.graph] == [
        ("blocks.0", "tests.lowering", "Block"),
        ("blocks.1", "tests.lowering", "Block"),
        ("blocks.2", "tests.lowering", "Block"),
    ]
    for m in (flat, model):
        irkit.optimize(m)
        irkit.check(m)
        assert list(m.functions) == [("tests.lowering", "Block", "")]
        _check_numbers(m, module, [(x,)])
    assert _ops(model.graph) == {"Block": 3}


def test_non_strict_export_inlines_the_region_and_dedupe_does_the_work():
    torch.manual_seed(0)
    module, x = Stack(), torch.randn(2, 4)
    ep = torch.export.export(module, (x,))
    assert torch.ops.higher_order.invoke_subgraph not in [n.target for n in ep.graph.nodes]
    model = irkit.lower(ep)
    assert list(model.functions) == [("tests.lowering", "Block", "")]
    assert _ops(model.graph) == {"Block": 3}
    _check_numbers(model, module, [(x,)])


class LinearBlock(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    @torch.compiler.nested_compile_region
    def forward(self, x):
        return torch.cond(x.sum() > 0, lambda x: torch.relu(self.lin(x)), lambda x: x - 1, (x,))


def test_a_region_with_submodules_and_control_flow_is_still_one_function():
    # The inlined first call has a Linear call inside, the invoke_subgraph body is flat: the
    # first call is compared flat with the function and becomes one call of it.
    torch.manual_seed(0)
    module, x = torch.nn.Sequential(*[LinearBlock() for _ in range(3)]), torch.randn(2, 4)
    ep = torch.export.export(module, (x,), strict=True)
    model = irkit.lower(ep)
    assert list(model.functions) == [("tests.lowering", "LinearBlock", "")]
    assert [n.name for n in model.graph] == ["0", "1", "2"]
    irkit.optimize(model)
    irkit.check(model)
    assert _ops(model.graph) == {"LinearBlock": 3}
    assert _ops(model.functions[("tests.lowering", "LinearBlock", "")])["If"] == 1
    _check_numbers(model, module, [(x,), (-x.abs() - 2,)])


# --- errors -------------------------------------------------------------------------------------
@torch.library.custom_op("irkit_cflow_test::frob", mutates_args=())
def frob(x: torch.Tensor) -> torch.Tensor:
    return x * 2 + 1


@frob.register_fake
def _(x):
    return torch.empty_like(x)


class Frob(torch.nn.Module):
    def forward(self, x):
        return torch.ops.irkit_cflow_test.frob(x)


class BadBranch(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.frob = Frob()

    def forward(self, init, xs):
        def combine(carry, x):
            y = torch.cond(
                x.sum() > 0, lambda v: torch.ops.irkit_cflow_test.frob(v), lambda v: v * 1, (x,)
            )
            return carry + y, y

        return scan(combine, init, xs)


def test_an_unsupported_op_in_a_body_is_reported_with_its_path():
    ep = torch.export.export(BadBranch(), (torch.randn(3), torch.randn(4, 3)))
    with pytest.raises(irkit.UnsupportedOpError) as info:
        irkit.lower(ep)
    [(name, count, _, _)] = info.value.ops
    assert name == "scan.combine_fn → cond.true_branch → irkit_cflow_test::frob.default"
    assert count == 1
    assert "custom_lowerings" in str(info.value)
    # and with a lowering for it, the same program lowers and runs
    model = irkit.lower(
        ep,
        custom_lowerings={
            torch.ops.irkit_cflow_test.frob.default: lambda x: x * 2.0 + 1.0,
        },
    )
    args = (torch.randn(3), torch.randn(4, 3))
    _check_numbers(model, BadBranch(), [args])


# --- associative_scan ---------------------------------------------------------------------------
class PrefixSum(torch.nn.Module):
    def forward(self, xs):
        return associative_scan(lambda a, b: a + b * 0.5, xs, dim=0, combine_mode="generic")


def test_associative_scan_generic_mode_lowers_through_its_decomposition():
    # On CPU torch.export traces the generic mode into pre-dispatch vmap nodes (the "pointwise"
    # mode needs CUDA); irkit.lower decomposes those and gets plain ops: no loop at all.
    torch.manual_seed(0)
    xs = torch.randn(5, 3)
    ep = torch.export.export(PrefixSum(), (xs,))
    before = [n.target for n in ep.graph.nodes]
    model = irkit.lower(ep, functions=False)
    assert [n.target for n in ep.graph.nodes] == before  # the input program is untouched
    assert not {"If", "Loop", "Scan"} & set(_ops(model.graph))
    _check_numbers(model, PrefixSum(), [(xs,)])


def test_a_failure_inside_a_body_names_the_path_through_the_bodies():
    def broken(x):
        raise ValueError("no")

    ep = torch.export.export(BadBranch(), (torch.randn(3), torch.randn(4, 3)))
    with pytest.raises(irkit.LoweringError) as info:
        irkit.lower(ep, custom_lowerings={torch.ops.irkit_cflow_test.frob.default: broken})
    assert info.value.fx_node == "scan.combine_fn → cond.true_branch → frob"
    assert "ValueError: no" in str(info.value)


# --- rewrite inside bodies ----------------------------------------------------------------------
class DoubleRelu(torch.nn.Module):
    def forward(self, x):
        return torch.cond(
            x.sum() > 0, lambda x: torch.relu(torch.relu(x)) * 2, lambda x: x - 1, (x,)
        )


class TwoDoubleRelus(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = DoubleRelu(), DoubleRelu()

    def forward(self, x):
        return self.b(self.a(x) + 1)


def test_rules_apply_inside_if_bodies_and_in_functions_reached_from_them():
    x_var = irkit.var("x")
    rule = irkit.Rule(
        "ReluIdempotent",
        irkit.op.Relu(irkit.op.Relu(x_var)),  # relu(relu(x))
        lambda op, x: op.Relu(x),  # = relu(x)
    )
    torch.manual_seed(0)
    module, x = TwoDoubleRelus(), torch.randn(2, 3)
    ep = torch.export.export(module, (x,))
    for functions, fired in ((False, 2), (True, 1)):  # two If bodies; one shared function
        model = irkit.lower(ep, functions=functions)
        report = irkit.RewriteReport()
        irkit.rewrite(model, irkit.RuleSet("mine", [rule]), report=report)
        assert report.fired == {"ReluIdempotent": fired}
        bodies = [model.graph, *(f for f in model.functions.values())]
        counts = sum((_ops(b) for b in bodies), collections.Counter())
        assert counts["If/then_branch:Relu"] == fired
        irkit.check(model)
        _check_numbers(model, module, [(x,), (-x.abs(),)])


class Difference(torch.nn.Module):
    def __init__(self, swap: bool):
        super().__init__()
        self.swap = swap

    def forward(self, x, y):
        def true_fn(x, y):
            return (y - x) if self.swap else (x - y)

        return torch.cond(x.sum() > 0, true_fn, lambda x, y: x * y, (x, y))


class TwoDifferences(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = Difference(False), Difference(True)

    def forward(self, x, y):
        return self.a(x, y) + self.b(x, y)


def test_bodies_that_read_outer_values_in_other_places_are_not_shared():
    # Same ops, same function inputs; only which captured value each branch op reads differs.
    torch.manual_seed(0)
    module, x, y = TwoDifferences(), torch.randn(2, 3), torch.randn(2, 3)
    model = irkit.lower(torch.export.export(module, (x.abs(), y)))
    assert sorted(model.functions) == [
        ("tests.lowering", "Difference", ""),
        ("tests.lowering", "Difference_1", ""),
    ]
    irkit.check(model)
    _check_numbers(model, module, [(x.abs(), y), (-x.abs(), y)])
