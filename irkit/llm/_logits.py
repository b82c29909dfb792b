"""A genai folder's logits at each sequence's last real new token only.

onnxruntime-genai reads, of a decoder's ``logits`` ``(batch, sequence, vocab)``, each
sequence's last non-pad position and copies it out; a decoder whose ``logits`` has a static
``1`` as its second dimension it takes as already trimmed (``Model::IsPruned``, genai ≥ 0.18:
"Using Trimmed Prefill Logits") and uses as is. So the folder gathers each row's hidden state at
its last real new token before the ``lm_head``, and a prefill runs the ``lm_head`` on one row per
sequence instead of ``sequence`` (LFM2-350M int4: prefill 0.81× the builder's instead of 1.00×;
Qwen3.5-0.8B, vocab 248320: 0.71×; ``docs/export.md``). Identity, ``h`` the ``lm_head``'s input,
``f`` the elementwise tail after it (softcap, logit scale, ``Cast``), ``m`` the attention mask
and ``S`` the new tokens' count (genai right-pads: a row's real new tokens come first)::

    f(lm_head(h))[b, c_b − 1] = f(lm_head(h[b, c_b − 1])),   c_b = Σ m[b, −S:]

(``c_b = 0``, no real new token: the last position, as ``GatherElements`` reads index −1).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

__all__ = ["last_token_logits"]

#: Ops of one input that act on each position alone (the tail after the ``lm_head``).
_UNARY = frozenset({"Tanh", "Cast", "Neg", "Identity", "Sigmoid"})
#: Ops of the tail that combine with a constant (softcap's division, a logit scale).
_WITH_CONSTANT = frozenset({"Mul", "Div", "Add", "Sub"})
#: The ``lm_head`` products: a matrix product on the last axis.
_PRODUCTS = frozenset(
    {
        ("", "MatMul"),
        ("", "Gemm"),
        ("com.microsoft", "FusedMatMul"),
        ("com.microsoft", "MatMulNBits"),
    }
)
_BODY = _PRODUCTS | {("", "Transpose"), ("", "Add"), ("", "Constant")}


def _tail(node: ir.Node) -> bool:
    """Whether ``node`` maps each position of its first input alone (and nothing else reads
    its first input's producer's output through it)."""
    if node.domain != "" or not node.inputs or node.inputs[0] is None:
        return False
    if node.op_type in _UNARY:
        return True
    if node.op_type in _WITH_CONSTANT and len(node.inputs) == 2 and node.inputs[1] is not None:
        other = _constant(node.inputs[1])
        return other is not None and other.size == 1
    return False


def _constant(value: ir.Value) -> ir.TensorProtocol | None:
    """The tensor of an initializer or of a ``Constant`` node's output."""
    if value.const_value is not None:
        return value.const_value
    producer = value.producer()
    if producer is None or (producer.domain, producer.op_type) != ("", "Constant"):
        return None
    attribute = producer.attributes.get("value")
    return attribute.as_tensor() if attribute is not None else None


def _is_product(node: ir.Node, model: ir.Model) -> bool:
    """A matrix product on the last axis: one of :data:`_PRODUCTS`, or a call of a local
    function made of them (a module call of ``nn.Linear``)."""
    if (node.domain, node.op_type) in _PRODUCTS:
        return True
    function = model.functions.get(node.op_identifier())
    if function is None:
        return False
    ops = {(n.domain, n.op_type) for n in function}
    return bool(ops & _PRODUCTS) and ops <= _BODY


def last_token_logits(model: ir.Model, name: str = "logits") -> bool:
    """Make the graph output ``name`` the logits of each row's last real new token only,
    ``(batch, 1, vocab)``; ``True`` where it did (module docstring).

    Left as it is (``False``) where the output is not rank 3, the node before its elementwise
    tail is not a matrix product on the last axis, or the graph has no ``attention_mask`` and
    ``input_ids`` / ``inputs_embeds`` input to count the new tokens with.

    Example:
        >>> import onnx_ir as ir
        >>> model = ir.from_onnx_text('''
        ...   <ir_version: 10, opset_import: ["" : 23]>
        ...   g (int64[b, s] input_ids, int64[b, t] attention_mask, float[b, s, 4] h,
        ...      float[4, 6] w) => (float[b, s, 6] logits) { logits = MatMul(h, w) }''')
        >>> last_token_logits(model)
        True
        >>> [d if isinstance(d, int) else str(d) for d in model.graph.outputs[0].shape]
        ['b', 1, 6]
    """
    graph = model.graph
    out = next((v for v in graph.outputs if v.name == name), None)
    if out is None or out.shape is None or len(out.shape) != 3:
        return False
    inputs = {v.name: v for v in graph.inputs}
    mask = inputs.get("attention_mask")
    new = inputs.get("input_ids") or inputs.get("inputs_embeds")
    if mask is None or new is None:
        return False
    tail: list[ir.Value] = [out]
    node = out.producer()
    while node is not None and _tail(node):
        value = node.inputs[0]
        if value is None or len(value.uses()) != 1 or value.is_graph_output():
            return False
        tail.append(value)
        node = value.producer()
    if node is None or not _is_product(node, model) or node.inputs[0] is None:
        return False
    h = node.inputs[0]
    if h.shape is None or len(h.shape) != 3:
        return False

    def const(values: list[int], label: str) -> ir.Value:
        value = ir.Value(name=f"last_token_logits_{label}")
        value.const_value = ir.tensor(np.array(values, dtype=np.int64), name=value.name)
        value.type, value.shape = ir.TensorType(ir.DataType.INT64), ir.Shape([len(values)])
        graph.register_initializer(value)
        return value

    one, big = const([1], "one"), const([1 << 62], "end")
    made: list[ir.Node] = []

    def add(op: str, args: list[ir.Value], **attributes: int) -> ir.Value:
        attrs = [ir.AttrInt64(k, v) for k, v in attributes.items()]
        node_ = ir.Node("", op, args, attrs, name=f"last_token_logits_{len(made)}_{op}")
        made.append(node_)
        return node_.outputs[0]

    count = add("Shape", [new], start=1, end=2)  # S
    new_mask = add("Slice", [mask, add("Neg", [count]), big, one])  # m[:, −S:]
    index = add("Sub", [add("ReduceSum", [new_mask, one], keepdims=1), one])  # (b, 1): c − 1
    index = add("Unsqueeze", [index, const([2], "axis2")])  # (b, 1, 1)
    width = add("Shape", [h], start=2, end=3)
    rows = add("Shape", [h], start=0, end=1)
    index = add("Expand", [index, add("Concat", [rows, one, width], axis=0)])
    gathered = add("GatherElements", [h, index], axis=1)
    gathered.type = h.type
    gathered.shape = ir.Shape([h.shape[0], 1, h.shape[2]])
    graph.insert_before(node, made)
    node.replace_input_with(0, gathered)
    for value in tail:
        if value.shape is not None and len(value.shape) == 3:
            value.shape = ir.Shape([value.shape[0], 1, value.shape[2]])
    for value in node.outputs:
        if value.shape is not None and len(value.shape) == 3:
            value.shape = ir.Shape([value.shape[0], 1, value.shape[2]])
    return True
