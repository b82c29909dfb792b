"""irkit's own lowering of ``aten.lstm.input`` with a projection (``nn.LSTM(proj_size=P)``).

ONNX's ``LSTM`` has no projection: torch feeds back ``h_t = (o_t ⊙ tanh(c_t)) W_hr^T`` (``P``
wide) where ONNX feeds back the ``H``-wide ``o_t ⊙ tanh(c_t)``, so torchlib's ``LSTM`` node is
wrong for it (onnxruntime refuses the file: the initial state is ``P`` wide). Here the cells are
unrolled over the sequence, per layer and direction, with torch's equations::

    gates = x_t W_ih^T + b_ih + b_hh + h_{t-1} W_hh^T         (i, f, g, o: 4 chunks of H)
    c_t   = σ(f) ⊙ c_{t-1} + σ(i) ⊙ tanh(g)
    h_t   = (σ(o) ⊙ tanh(c_t)) W_hr^T

The input projection of every step is one ``MatMul`` per layer and direction. ``torch.export``
specializes ``nn.LSTM``'s sequence length (measured with torch 2.13: a ``Dim`` on it is a
constraint violation), so the unrolled length is the program's; a symbolic length is refused
with a ``LoweringError``. Batch may be dynamic. Inter-layer dropout only runs in training
(``train=True`` with ``dropout > 0`` is left to the other lowerings).
"""

from __future__ import annotations

from collections.abc import Sequence

import onnx_ir as ir
import torch
from onnxscript import opset18 as op

from irkit.lowering._own_common import ints
from irkit.lowering._registration import own

__all__: list[str] = []  # (lowerings registered with @own, collected by _own.own_lowerings)


def _cell_steps(
    steps: Sequence[ir.Value],
    h: ir.Value,
    c: ir.Value,
    w_hh_t: ir.Value,
    w_hr_t: ir.Value,
    reverse: bool,
) -> tuple[list[ir.Value], ir.Value, ir.Value]:
    """Run the cell over the precomputed input gates ``steps`` (each ``(N, 4H)``)."""
    order = range(len(steps) - 1, -1, -1) if reverse else range(len(steps))
    outputs: list[ir.Value | None] = [None] * len(steps)
    for t in order:
        gates = op.Add(steps[t], op.MatMul(h, w_hh_t))
        i, f, g, o = op.Split(gates, axis=-1, num_outputs=4)
        c = op.Add(op.Mul(op.Sigmoid(f), c), op.Mul(op.Sigmoid(i), op.Tanh(g)))
        h = op.MatMul(op.Mul(op.Sigmoid(o), op.Tanh(c)), w_hr_t)
        outputs[t] = h
    return [x for x in outputs if x is not None], h, c


def _lstm_projected_applies(node: torch.fx.Node) -> bool:
    """A projection is there: one more weight (``w_hr``) per layer and direction."""
    args = list(node.args)
    if len(args) < 9:
        return False
    _, _, params, has_biases, num_layers, dropout, train, bidirectional, _ = args[:9]
    directions = 2 if bidirectional else 1
    per = len(params) // max(1, num_layers * directions)
    if train and dropout > 0:
        return False
    return per == (5 if has_biases else 3) and len(params) == per * num_layers * directions


@own(torch.ops.aten.lstm.input, applies=_lstm_projected_applies)
def _lstm_projected(
    input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first
):
    x = op.Transpose(input, perm=[1, 0, 2]) if batch_first else input  # (T, N, In)
    length = input.shape[1 if batch_first else 0]
    if not isinstance(length, int):
        raise ValueError(
            f"nn.LSTM with proj_size needs a static sequence length, got {length}; export "
            "with a fixed length (torch.export specializes it for nn.LSTM)"
        )
    directions = 2 if bidirectional else 1
    per = 5 if has_biases else 3
    h0, c0 = hx
    h_n, c_n = [], []
    for layer in range(num_layers):
        outs = []
        for d in range(directions):
            k = layer * directions + d
            w_ih, w_hh, *rest = params[k * per : (k + 1) * per]
            w_hr = rest[-1]
            projected = op.MatMul(x, op.Transpose(w_ih, perm=[1, 0]))  # (T, N, 4H)
            if has_biases:
                projected = op.Add(projected, op.Add(rest[0], rest[1]))
            steps = (
                [op.Squeeze(s, ints(0)) for s in op.Split(projected, axis=0, num_outputs=length)]
                if length > 1
                else [op.Squeeze(projected, ints(0))]
            )
            h = op.Squeeze(op.Slice(h0, ints(k), ints(k + 1), ints(0)), ints(0))
            c = op.Squeeze(op.Slice(c0, ints(k), ints(k + 1), ints(0)), ints(0))
            hs, h, c = _cell_steps(
                steps,
                h,
                c,
                op.Transpose(w_hh, perm=[1, 0]),
                op.Transpose(w_hr, perm=[1, 0]),
                reverse=d == 1,
            )
            seq = [op.Unsqueeze(s, ints(0)) for s in hs]
            outs.append(op.Concat(*seq, axis=0) if len(seq) > 1 else seq[0])
            h_n.append(op.Unsqueeze(h, ints(0)))
            c_n.append(op.Unsqueeze(c, ints(0)))
        x = op.Concat(*outs, axis=-1) if len(outs) > 1 else outs[0]
    output = op.Transpose(x, perm=[1, 0, 2]) if batch_first else x
    return output, op.Concat(*h_n, axis=0), op.Concat(*c_n, axis=0)
