"""Hand-built hierarchical models shaped like ``irkit.lower`` + outlining output.

``stack(n)`` is a pre-norm toy transformer: ``n`` identical ``Block`` calls in the main graph,
each ``Block`` body calling ``Attention`` and ``MLP`` functions; weights are graph initializers
passed to the calls as inputs. Every node carries the irkit metadata keys (scope, FX node,
target, source); call nodes carry ``irkit.call``. Deterministic: same model every call.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from irkit import metadata

PKG = "tests.viz.toy"
OPSET = 21
F32 = ir.DataType.FLOAT


def _val(name: str, shape: list[int | str]) -> ir.Value:
    return ir.val(name, F32, shape)


class _Body:
    """Builds one function body (or the main graph) node by node, stamping metadata."""

    def __init__(self, scope: tuple[metadata.Frame, ...], prefix: str):
        self.nodes: list[ir.Node] = []
        self.scope = scope
        self.prefix = prefix
        self.line = 10

    def op(self, op_type, inputs, shape, *, attrs=None, domain="", name=None, call=None):
        self.line += 1
        out_name = f"{name or op_type.lower()}_{len(self.nodes)}"
        node_name = name or f"{self.prefix}{op_type}_{len(self.nodes)}"
        props = {
            metadata.SCOPE: metadata.encode_scope(self.scope),
            metadata.FX_NODE: f"{op_type.lower()}_{len(self.nodes)}",
            metadata.FX_TARGET: f"aten.{op_type.lower()}.default",
            metadata.SOURCE: f"toy/modeling.py:{self.line}",
        }
        if call is not None:
            props = {metadata.CALL_MODULE: _json_frame(call)}
        node = ir.node(
            op_type,
            inputs,
            attributes=attrs,
            domain=domain,
            name=node_name,
            outputs=[_val(out_name, shape)],
            metadata_props=props,
        )
        self.nodes.append(node)
        return node.outputs[0]


def _json_frame(frame: metadata.Frame) -> str:
    import json

    return json.dumps(frame.to_json(), separators=(",", ":"))


def _function(name: str, inputs: list[ir.Value], outputs: list[ir.Value], body: _Body, opsets):
    graph = ir.Graph(inputs, outputs, nodes=body.nodes, opset_imports=opsets, name=name)
    return ir.Function(PKG, name, graph=graph, attributes=[])


def _attention(d: int, first: str) -> ir.Function:
    frames = (
        metadata.Frame(first, 0, f"{PKG}.modeling.Block"),
        metadata.Frame(f"{first}.attn", 0, f"{PKG}.modeling.Attention"),
    )
    b = _Body(frames, "attn/")
    x, wq, bq, wo = (
        _val("x", ["B", "S", d]),
        _val("wq", [d, d]),
        _val("bq", [d]),
        _val("wo", [d, d]),
    )
    q = b.op("MatMul", [x, wq], ["B", "S", d])
    q = b.op("Add", [q, bq], ["B", "S", d])
    s = b.op("Softmax", [q], ["B", "S", d], attrs={"axis": -1})
    o = b.op("MatMul", [s, wo], ["B", "S", d])
    return _function("Attention", [x, wq, bq, wo], [o], b, {"": OPSET})


def _mlp(d: int, first: str, extra_ops: int) -> ir.Function:
    frames = (
        metadata.Frame(first, 0, f"{PKG}.modeling.Block"),
        metadata.Frame(f"{first}.mlp", 0, f"{PKG}.modeling.MLP"),
    )
    b = _Body(frames, "mlp/")
    x, w1, b1, w2, b2 = (
        _val("x", ["B", "S", d]),
        _val("w1", [d, 4 * d]),
        _val("b1", [4 * d]),
        _val("w2", [4 * d, d]),
        _val("b2", [d]),
    )
    h = b.op("MatMul", [x, w1], ["B", "S", 4 * d], name="mlp/fc1")
    h = b.op("Add", [h, b1], ["B", "S", 4 * d], name="mlp/fc1_bias")
    h = b.op("Relu", [h], ["B", "S", 4 * d])
    for _ in range(extra_ops):
        h = b.op("Tanh", [h], ["B", "S", 4 * d])
    h = b.op("MatMul", [h, w2], ["B", "S", d])
    h = b.op("Add", [h, b2], ["B", "S", d])
    return _function("MLP", [x, w1, b1, w2, b2], [h], b, {"": OPSET})


def _block(d: int, first: str) -> ir.Function:
    b = _Body((metadata.Frame(first, 0, f"{PKG}.modeling.Block"),), "block/")
    names = ["x", "wq", "bq", "wo", "w1", "b1", "w2", "b2"]
    shapes = [["B", "S", d], [d, d], [d], [d, d], [d, 4 * d], [4 * d], [4 * d, d], [d]]
    ins = [_val(n, s) for n, s in zip(names, shapes, strict=True)]
    x = ins[0]
    a = b.op(
        "Attention",
        ins[:4],
        ["B", "S", d],
        domain=PKG,
        name=f"{first}.attn",
        call=metadata.Frame(f"{first}.attn", 0, f"{PKG}.modeling.Attention"),
    )
    h = b.op("Add", [x, a], ["B", "S", d])
    m = b.op(
        "MLP",
        [h, *ins[4:]],
        ["B", "S", d],
        domain=PKG,
        name=f"{first}.mlp",
        call=metadata.Frame(f"{first}.mlp", 0, f"{PKG}.modeling.MLP"),
    )
    y = b.op("Add", [h, m], ["B", "S", d])
    return _function("Block", ins, [y], b, {"": OPSET, PKG: 1})


def _init(name: str, shape: list[int], rng: np.random.Generator) -> ir.Value:
    array = rng.standard_normal(shape).astype(np.float32)
    return ir.val(name, F32, shape, const_value=ir.tensor(array, name=name))


def stack(n_layers: int = 3, d: int = 8, *, extra_ops: int = 0) -> ir.Model:
    """A toy hierarchical transformer stack with ``n_layers`` calls of one ``Block`` body.

    Args:
        n_layers: Number of ``Block`` calls (``layers.0`` … ``layers.{n-1}``).
        d: Model width.
        extra_ops: Extra elementwise ops in the MLP body (to grow the node count in benches).
    """
    rng = np.random.default_rng(0)
    main = _Body((), "")
    x = _val("input_ids_embeds", ["B", "S", d])
    inits: list[ir.Value] = []
    h = x
    for i in range(n_layers):
        path = f"layers.{i}"
        weights = []
        for wname, shape in [
            ("attn.wq", [d, d]),
            ("attn.bq", [d]),
            ("attn.wo", [d, d]),
            ("mlp.w1", [d, 4 * d]),
            ("mlp.b1", [4 * d]),
            ("mlp.w2", [4 * d, d]),
            ("mlp.b2", [d]),
        ]:
            weights.append(_init(f"{path}.{wname}", shape, rng))
        inits.extend(weights)
        h = main.op(
            "Block",
            [h, *weights],
            ["B", "S", d],
            domain=PKG,
            name=path,
            call=metadata.Frame(path, 0, f"{PKG}.modeling.Block"),
        )
    head = _init("lm_head.weight", [d, 11], rng)
    inits.append(head)
    main.scope = (metadata.Frame("lm_head", 0, "torch.nn.modules.linear.Linear"),)
    logits = main.op("MatMul", [h, head], ["B", "S", 11], name="lm_head/MatMul")
    logits.name = "logits"
    graph = ir.Graph(
        [x],
        [logits],
        nodes=main.nodes,
        initializers=inits,
        opset_imports={"": OPSET, PKG: 1},
        name="ToyStack",
    )
    first = "layers.0"
    functions = [_attention(d, first), _mlp(d, first, extra_ops), _block(d, first)]
    return ir.Model(
        graph, ir_version=10, producer_name=metadata.MODEL_PRODUCER, functions=functions
    )


def fuse_mlp_gemm(model: ir.Model) -> ir.Model:
    """Simulate an optimizer: in the ``MLP`` body, replace ``fc1`` MatMul + Add by one Gemm.

    Modifies ``model`` in place and returns it. The Gemm carries ``irkit.rewrite.rule``.
    """
    mlp = model.functions[(PKG, "MLP", "")]
    nodes = {n.name: n for n in mlp}
    matmul, add = nodes["mlp/fc1"], nodes["mlp/fc1_bias"]
    gemm = ir.node(
        "Gemm",
        [matmul.inputs[0], matmul.inputs[1], add.inputs[1]],
        name="mlp/fc1_gemm",
        metadata_props={
            metadata.REWRITE_RULE: "toy.matmul_add_to_gemm",
            metadata.REWRITE_SOURCES: metadata.encode_list(["toy/modeling.py:11"]),
            metadata.SCOPE: matmul.metadata_props[metadata.SCOPE],
        },
    )
    gemm.outputs[0].shape = add.outputs[0].shape
    gemm.outputs[0].dtype = F32
    gemm.outputs[0].name = "fc1_gemm"
    mlp.insert_before(matmul, gemm)
    add.outputs[0].replace_all_uses_with(gemm.outputs[0])
    mlp.remove([add, matmul], safe=True)
    return model


def torch_exporter_flat(n_layers: int = 200, ops_per_layer: int = 100, d: int = 8) -> ir.Model:
    """A flat model (no functions) with the scope metadata PyTorch's exporter writes.

    ``torch.onnx.export(..., dynamo=True)`` stamps every node with
    ``pkg.torch.onnx.name_scopes`` (``['', 'layers.3', 'layers.3.mlp', 'add_7']``: the root,
    the module paths, then the FX node) and ``pkg.torch.onnx.class_hierarchy`` beside it. Each
    of the ``n_layers`` ``Block`` layers has an ``attn`` and an ``mlp`` module with
    ``ops_per_layer`` nodes in all (MatMul on a weight, then elementwise ops), so 200 × 100 is a
    20,000-node graph. Built directly (no torch): a second or so.
    """
    rng = np.random.default_rng(0)
    x = _val("x", ["B", d])
    h = x
    nodes: list[ir.Node] = []
    inits: list[ir.Value] = []
    block, attn_cls, mlp_cls = "model.Block", "model.Attention", "model.MLP"
    for i in range(n_layers):
        for part, cls, count in (("attn", attn_cls, ops_per_layer // 2), ("mlp", mlp_cls, None)):
            count = count if count is not None else ops_per_layer - ops_per_layer // 2
            module = f"layers.{i}.{part}"
            weight = _init(f"{module}.weight", [d, d], rng)
            inits.append(weight)
            for k in range(count):
                op = "MatMul" if k == 0 else ("Relu", "Add", "Mul", "Sigmoid")[k % 4]
                inputs = (
                    [h, weight] if op == "MatMul" else ([h, h] if op in ("Add", "Mul") else [h])
                )
                fx = f"{op.lower()}_{len(nodes)}"
                props = {
                    "pkg.torch.onnx.name_scopes": repr(["", f"layers.{i}", module, fx]),
                    "pkg.torch.onnx.class_hierarchy": repr(
                        ["model.Net", block, cls, f"aten.{op.lower()}.default"]
                    ),
                }
                node = ir.node(
                    op,
                    inputs,
                    name=f"node_{fx}",
                    outputs=[_val(fx, ["B", d])],
                    metadata_props=props,
                )
                nodes.append(node)
                h = node.outputs[0]
    h.name = "y"
    graph = ir.Graph(
        [x], [h], nodes=nodes, initializers=inits, opset_imports={"": OPSET}, name="main_graph"
    )
    return ir.Model(graph, ir_version=10, producer_name="pytorch")


def control_flow() -> ir.Model:
    """A main graph with an ``If`` (two branches), and a ``Loop`` whose body holds another
    ``If``: control flow for the viz to open like calls. Valid ONNX; built with onnx.helper."""
    import onnx
    from onnx import TensorProto, helper

    def branch(name: str, op: str) -> onnx.GraphProto:
        return helper.make_graph(
            [
                helper.make_node(op, ["x", "x"], [f"{name}_t"], name=f"{name}_{op}"),
                helper.make_node("Relu", [f"{name}_t"], [f"{name}_out"], name=f"{name}_Relu"),
            ],
            name,
            [],
            [helper.make_tensor_value_info(f"{name}_out", TensorProto.FLOAT, [2])],
        )

    inner_if = helper.make_node(
        "If",
        ["cond_in"],
        ["inner_out"],
        name="inner_if",
        then_branch=branch("inner_then", "Add"),
        else_branch=branch("inner_else", "Sub"),
    )
    loop_body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"], name="loop_cond"),
            inner_if,
            helper.make_node("Add", ["carry", "inner_out"], ["carry_out"], name="loop_add"),
        ],
        "loop_body",
        [
            helper.make_tensor_value_info("iter", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("carry", TensorProto.FLOAT, [2]),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("carry_out", TensorProto.FLOAT, [2]),
        ],
    )
    graph = helper.make_graph(
        [
            helper.make_node(
                "If",
                ["cond"],
                ["y"],
                name="top_if",
                then_branch=branch("then", "Mul"),
                else_branch=branch("else", "Add"),
            ),
            helper.make_node("Loop", ["trips", "cond", "y"], ["z"], name="loop"),
        ],
        "control_flow",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2]),
            helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
            helper.make_tensor_value_info("trips", TensorProto.INT64, []),
        ],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [2])],
    )
    graph.node[1].attribute.append(helper.make_attribute("body", loop_body))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 10
    onnx.checker.check_model(model, full_check=True)
    return ir.from_proto(model)
