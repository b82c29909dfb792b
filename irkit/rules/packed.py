"""Three or more projections of one input packed into one ``MatMul`` (Q/K/V), and a packed pair
unpacked (gate/up): standard ONNX ops.

Identity (``x`` read by several matrix products with constant weights ``W₁ … Wₙ`` of shapes
``(K, Nᵢ)``):

``x @ W₁, …, x @ Wₙ = Split(x @ Concat(W₁, …, Wₙ, axis=1), [N₁ … Nₙ], axis=-1)``

One wide product reads ``x`` once and, after :func:`irkit.quantize`, is one ``MatMulNBits``
instead of n (the onnxruntime-genai builder packs Q/K/V so). The products are matched as
``MatMul(x, W)``, ``MatMul(x, Transpose(w))`` (torchlib's 3-D ``linear``) and
``FusedMatMul(x, w, transB=1)`` (the ``"ort"`` target). When every product is followed by the
``Add`` of a constant 1-D bias (its only use), the biases are packed too:
``x @ Wᵢ + bᵢ = Split(x @ Concat(Wᵢ) + Concat(bᵢ))`` — so biased ``Linear`` calls are replaced
whole. The concatenated weight is built once with :func:`~irkit.rewriting.concat_weights`
(each weight copied once, into the packed tensor), as a constant the pipeline lifts to an
initializer; when the weights are weightless (a model lowered on the ``meta`` device) it is a
derived weightless tensor, concatenated per tensor by ``irkit.save(..., weights=...)``.

Where it fires: ``irkit.optimize(target="onnx")`` on a model whose weights are constants where
the products are (a flat model: ``irkit.lower(..., functions=False)``); inside a local function
the weights are the function's inputs and the rule reports ``not a constant (a function
input?)``. ``target="ort"`` opens the module calls for the rewrite
(:mod:`irkit.rules.ort.packed`), so there weights that were function parameters are
initializers; the re-outlined function takes the packed weight as an input passed at each call
site.

Only where it cuts kernels: at least three such products of ``x`` (the anchor among them).
Two products packed are two kernels again (the wide product and the ``Split``), and the
``Split`` copies the outputs: on onnxruntime 1.32's CPU kernels (one thread, ``K`` 512) gate/up
packed into one ``MatMulNBits`` of ``N`` 3072 + ``Split`` took 5.02 ms on 128 rows against
4.89 ms for the two products of 1536 (76.5 vs 75.4 µs on one row; float32 ``MatMul``: 4.81 vs
4.60 ms), while three or four products (Q/K/V; the gated delta net's q/k/v, z, a and b) packed
are faster (int4, 128 rows: 2.07 vs 2.11 ms for ``N`` 1024 + 128 + 128).

A product ``GroupQueryAttention`` reads whole as its packed ``[Q | K | V]`` is not packed again:
:mod:`irkit.rules.ort.attention.packed_qkv` cuts it out of a wider pack (a parallel block's
first MLP projection packed with the attention's) so that the attention needs no ``Split``.

The converse for a pair (``UnpackedMatMulPair``): a model's own packed projection cut in two
(phi3's ``gate_up_proj`` and its ``chunk(2, dim=-1)``), with ``W`` the constant ``(K, a + c)``
weight and ``b`` its bias, if any::

    Split(x @ W + b, [a, c], axis=-1) = x @ W[:, :a] + b[:a], x @ W[:, a:] + b[a:]

two products instead of one and a ``Split`` that copies both halves: the same kernel count, no
copy (phi3 int4, a 128-token prefill in onnxruntime: the 4 ``Split`` nodes were 388 µs of 33.7 ms),
as the onnxruntime-genai builder writes it (two ``MatMulNBits``).

Preconditions: at least three such products of ``x``; each weight a
2-D constant (initializer or ``Constant``: with data or weightless); same ``K`` and dtype
(biases: of the weights' dtype); float16/float32; ``x`` of known rank ≥ 2; each ``Transpose``
used only by its product. The pair: a ``Split`` into two on the last axis (sizes constant or
``num_outputs``) of a product with a constant 2-D weight (and bias) that nothing else reads.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from irkit.rewriting import (
    BaseRule,
    Match,
    MatchFailure,
    Rewrite,
    RewriteBuilder,
    RewriteContext,
    RuleSet,
    concat_weights,
    const_ints,
    dims,
    fail,
    transpose_weight,
    weight_constant,
)
from irkit.rules._ort_types import ORT_FLOAT_TYPES
from irkit.weights import narrow

MS = "com.microsoft"


class _Product:
    """One matched product ``x @ W``: its nodes, the weight value and whether it is ``W.T``."""

    def __init__(self, node: ir.Node, nodes: list[ir.Node], weight: ir.Value, transposed: bool):
        self.node = node
        self.nodes = nodes
        self.weight = weight
        self.transposed = transposed


def _product(node: ir.Node, x: ir.Value) -> _Product | MatchFailure:
    """``node`` as ``x @ W`` with a constant weight, or why not."""
    if len(node.inputs) != 2 or node.inputs[0] is not x:
        return fail("does not multiply the shared input from the left", None, node)
    w = node.inputs[1]
    if w is None:
        return fail("weight absent", None, node)
    if node.op_type == "MatMul" and node.domain == "":
        producer = w.producer()
        if producer is not None and producer.op_type == "Transpose" and producer.domain == "":
            perm = producer.attributes.get("perm")
            inner = producer.inputs[0]
            swapped = inner is not None and (perm is None or list(perm.value) == [1, 0])
            if not swapped or inner is None or len(w.uses()) != 1:
                return fail("weight Transpose is not a plain 2-D transpose used once", w)
            return _Product(node, [node, producer], inner, True)
        return _Product(node, [node], w, False)
    if node.op_type == "FusedMatMul" and node.domain == MS:
        attrs = {k: a.value for k, a in node.attributes.items()}
        if attrs.get("transA", 0) or attrs.get("transBatchA", 0) or attrs.get("transBatchB", 0):
            return fail("FusedMatMul transposes its left input", None, node)
        if attrs.get("alpha", 1.0) != 1.0:
            return fail("FusedMatMul scales by alpha", None, node)
        return _Product(node, [node], w, bool(attrs.get("transB", 0)))
    return fail("not a MatMul / FusedMatMul", None, node)


def weight_tensor(w: ir.Value) -> ir.TensorProtocol | MatchFailure:
    """The tensor of a constant weight (with data, or weightless), or why there is none."""
    tensor = w.const_value
    if tensor is None:
        return fail(f"weight {w.name!r} is not a constant (a function input?)", w)
    return tensor


class PackedMatMul(BaseRule):
    """``x @ W₁ … x @ Wₙ = Split(x @ Concat(W₁ … Wₙ))``: see the module docstring."""

    name = "PackedMatMul"
    anchors = frozenset({("", "MatMul"), (MS, "FusedMatMul")})
    doc = "one MatMul for the projections of one input"
    min_products = 3
    """Fewest products packed: two packed are two kernels again, plus the ``Split``'s copy."""

    def find(self, node: ir.Node, ctx: RewriteContext) -> Rewrite | MatchFailure:
        x = node.inputs[0] if node.inputs else None
        if x is None:
            return fail("no left input", None, node)
        dx = dims(x)
        if dx is None or len(dx) < 2:
            return fail("shared input rank unknown or < 2", x)
        if x.dtype not in ORT_FLOAT_TYPES:
            return fail(f"dtype {x.dtype}: packed only for float16/float32", x)
        products: list[_Product] = []
        tensors: list[ir.TensorProtocol] = []  # (K, Nᵢ): the weights as the products use them
        seen: set[ir.Node] = set()
        for use in x.uses():  # (in the order the uses were made: deterministic)
            other = use.node
            if use.idx != 0 or other.graph is not node.graph or other in seen:
                continue
            if (other.domain, other.op_type) not in self.anchors:
                continue
            seen.add(other)
            if _read_whole_by_attention(other):
                continue
            found = _product(other, x)
            data = found if isinstance(found, MatchFailure) else weight_tensor(found.weight)
            if not isinstance(data, MatchFailure) and len(data.shape) != 2:
                data = fail(f"a weight has rank {len(data.shape)}, not 2", x)
            if isinstance(found, MatchFailure) or isinstance(data, MatchFailure):
                if other is node:
                    return found if isinstance(found, MatchFailure) else data  # type: ignore[return-value]
                continue
            products.append(found)
            tensors.append(transpose_weight(data, (1, 0)) if found.transposed else data)
        if len(products) < 2:
            return fail("no other product of the same input with a constant weight", x)
        if len(products) < self.min_products:
            return fail(
                f"{len(products)} products of the same input: packing fewer than "
                f"{self.min_products} saves no kernel and adds the Split's copy",
                x,
            )
        shapes = [tuple(int(d) for d in t.shape.numpy()) for t in tensors]
        k = shapes[0][0]
        if any(
            s[0] != k or t.dtype != tensors[0].dtype for s, t in zip(shapes, tensors, strict=True)
        ):
            return fail("the weights differ in inner size or dtype", products[0].weight)
        if isinstance(dx[-1], int) and dx[-1] != k:
            return fail(f"input size {dx[-1]} differs from the weights' {k}", x)
        biases = [_bias(p.node, s[1]) for p, s in zip(products, shapes, strict=True)]
        with_bias = all(b is not None and b[1].dtype == tensors[0].dtype for b in biases)
        packed = concat_weights(tensors, axis=1)  # each weight copied once (or at save time)
        op = RewriteBuilder()
        y = op.MatMul(x, weight_constant(op, packed))
        outputs = [p.node.outputs[0] for p in products]
        nodes = [n for p in products for n in p.nodes if n is not node]
        if with_bias:  # x @ Wᵢ + bᵢ: the biases packed too (the Linear calls are replaced whole)
            packed_bias = concat_weights([b[1] for b in biases if b is not None], axis=0)
            y = op.Add(y, weight_constant(op, packed_bias))
            nodes += [b[0] for b in biases if b is not None]
            outputs = [b[0].outputs[0] for b in biases if b is not None]
        sizes = op.const(np.array([s[1] for s in shapes], dtype=np.int64))
        outs = op.Split(y, sizes, axis=-1, _outputs=len(tensors))
        match = Match([node, *nodes], outputs, {}, ctx.opset)
        return Rewrite(match, op.nodes, list(outs))


def _read_whole_by_attention(product: ir.Node) -> bool:
    """Whether ``GroupQueryAttention`` reads the product (or its bias ``Add``) whole as its packed
    ``[Q | K | V]`` (no key, no value input): the projections are one product already, cut
    from a wider pack by :mod:`irkit.rules.ort.attention.packed_qkv`; packing them again would
    only bring back the ``Split``'s copy."""
    out = product.outputs[0]
    reads = [use.node for use in out.uses()]
    if len(reads) == 1 and reads[0].op_type == "Add" and reads[0].domain == "":
        reads = [use.node for use in reads[0].outputs[0].uses()]
    return any(
        node.op_type == "GroupQueryAttention"
        and node.domain == MS
        and len(node.inputs) > 2
        and node.inputs[1] is None
        and node.inputs[2] is None
        for node in reads
    )


def _bias(product: ir.Node, size: int) -> tuple[ir.Node, ir.TensorProtocol] | None:
    """The ``Add`` of a constant 1-D bias of ``size`` that is the product's only use, if any."""
    out = product.outputs[0]
    uses = list(out.uses())
    if len(uses) != 1 or out.is_graph_output():
        return None
    add = uses[0].node
    if add.op_type != "Add" or add.domain != "" or len(add.inputs) != 2:
        return None
    other = add.inputs[1 - uses[0].idx]
    tensor = None if other is None else other.const_value
    if tensor is None or tuple(tensor.shape.numpy()) != (size,):
        return None
    return add, tensor


class UnpackedMatMulPair(BaseRule):
    """``Split(x @ W + b, [a, c]) = x @ W[:, :a] + b[:a], x @ W[:, a:] + b[a:]``: a packed pair
    as two products (module docstring)."""

    name = "UnpackedMatMulPair"
    anchors = frozenset({("", "Split")})
    doc = "a product split in two as two products (no Split copy)"

    def find(self, node: ir.Node, ctx: RewriteContext) -> Rewrite | MatchFailure:
        if len(node.outputs) != 2:
            return fail(
                f"a Split into {len(node.outputs)}: three or more stay packed (PackedMatMul)",
                None,
                node,
            )
        y = node.inputs[0]
        if y is None or y.shape is None:
            return fail("the split value's rank is unknown", y, node)
        axis = node.attributes.get_int("axis", 0)
        if axis not in (-1, len(y.shape) - 1):
            return fail(f"the Split is on axis {axis}, not the last", y)
        chain = _biased_product(y)
        if isinstance(chain, MatchFailure):
            return chain
        product, bias_add, bias = chain
        data = weight_tensor(product.weight)
        if isinstance(data, MatchFailure):
            return data
        if len(data.shape) != 2:
            return fail(f"the weight has rank {len(data.shape)}, not 2", product.weight)
        weight = transpose_weight(data, (1, 0)) if product.transposed else data  # (K, N)
        total = weight.shape[1]
        if not isinstance(total, int):
            return fail("the weight's column count is not static", product.weight)
        sizes = _split_sizes(node, total)
        if sizes is None or sum(sizes) != total or min(sizes) <= 0:
            return fail(f"the Split's sizes are not two parts of the {total} columns", y)
        op = RewriteBuilder()
        outs = []
        for start, length in ((0, sizes[0]), (sizes[0], sizes[1])):
            part = op.MatMul(
                product.node.inputs[0], weight_constant(op, narrow(weight, 1, start, length))
            )
            if bias is not None:
                part = op.Add(part, weight_constant(op, narrow(bias, 0, start, length)))
            outs.append(part)
        nodes = [node, *product.nodes, *([bias_add] if bias_add is not None else [])]
        return Rewrite(Match(nodes, list(node.outputs), {}, ctx.opset), op.nodes, outs)


def _biased_product(
    y: ir.Value,
) -> tuple[_Product, ir.Node | None, ir.TensorProtocol | None] | MatchFailure:
    """``y`` as ``x @ W`` or ``x @ W + b`` (constant 1-D ``b``) that only the Split reads:
    the product, the bias ``Add`` and the bias."""
    node = y.producer()
    if node is None or len(y.uses()) != 1 or y.is_graph_output():
        return fail("the split value is not a node's output read only by the Split", y)
    bias_add, bias = None, None
    if node.op_type == "Add" and node.domain == "":
        inner = node.inputs[0]
        tensor = node.inputs[1].const_value if node.inputs[1] is not None else None
        if inner is None or tensor is None or len(tensor.shape) != 1:
            return fail("the split value's Add is not of a constant 1-D bias", y)
        product = inner.producer()
        if len(inner.uses()) != 1 or inner.is_graph_output() or product is None:
            return fail("the product has other readers than its bias Add", inner)
        bias_add, bias, node = node, tensor, product
    x = node.inputs[0] if node.inputs else None
    if x is None:
        return fail("the product has no left input", None, node)
    found = _product(node, x)
    if isinstance(found, MatchFailure):
        return found
    return found, bias_add, bias


def _split_sizes(split: ir.Node, total: int) -> list[int] | None:
    """The two sizes of a ``Split`` of ``total`` columns: its ``split`` input, else
    ``num_outputs``' (the first ``ceil(total / 2)``)."""
    if len(split.inputs) > 1 and split.inputs[1] is not None:
        return const_ints(split.inputs[1])
    if split.attributes.get_int("num_outputs", 0) == 2:
        first = -(-total // 2)
        return [first, total - first]
    return None


rules = RuleSet("packed", [PackedMatMul(), UnpackedMatMulPair()])
"""The packing rule and its converse for a pair."""
