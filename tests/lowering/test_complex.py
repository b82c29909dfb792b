"""Complex tensors (``irkit/lowering/_complex.py``): the ops rotary code uses, against eager.

A complex tensor is torchlib's real tensor with a trailing (real, imaginary) dim of 2: complex
graph inputs are fed as ``torch.view_as_real(z)`` and complex outputs compared the same way.
Shape and data-movement ops without a complex lowering in torchlib, and arithmetic that mixes a
complex and a real operand, are decomposed over the real and imaginary parts.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

import irkit
from irkit.lowering._plan_types import Via
from irkit.lowering._registry import LoweringTable
from tests import helpers

torch.manual_seed(0)
Z = torch.randn(3, 4, dtype=torch.complex64)
R = torch.randn(3, 4)


class _Fn(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


def _real(t: torch.Tensor) -> np.ndarray:
    return (torch.view_as_real(t) if t.is_complex() else t).detach().numpy()


def _check(fn, *args, dynamic_shapes=None, atol=1e-6):
    module = _Fn(fn)
    model = irkit.lower(torch.export.export(module, args, dynamic_shapes=dynamic_shapes))
    actual = helpers.run_ort(model, [_real(a) for a in args])
    out = fn(*args)
    expected = [_real(t) for t in (out if isinstance(out, (tuple, list)) else [out])]
    helpers.assert_close(actual, expected, atol)
    return model


CASES = {
    # the complex values themselves
    "view_as_complex": (lambda x: torch.view_as_complex(x.reshape(3, 2, 2)), torch.randn(3, 4)),
    "view_as_real": (lambda z: torch.view_as_real(z) * 2, Z),
    "polar": (lambda a, b: torch.polar(a, b), R.abs(), R),
    "to_complex128": (lambda z: z.to(torch.complex128), Z),
    "real_imag": (lambda z: z.real * 2 + z.imag, Z),
    # arithmetic
    "mul_complex": (lambda a, b: a * b, Z, torch.randn(4, dtype=torch.complex64)),
    "mul_number": (lambda z: z * 0.5, Z),
    "mul_real_tensor": (lambda z, r: z * r, Z, R),
    "mul_real_first": (lambda z, r: r * z, Z, torch.randn(4)),
    "div_real": (lambda z, r: z / r, Z, torch.rand(4) + 1),
    "div_number": (lambda z: z / 2.0, Z),
    "add_real_tensor": (lambda z, r: z + r, Z, torch.randn(2, 3, 4)),
    "add_alpha": (lambda z, r: torch.add(r, z, alpha=3), Z, R),
    "sub_number": (lambda z: z - 1.5, Z),
    "number_sub": (lambda z: 1.5 - z, Z),
    "add_complex": (lambda a, b: a + b, Z, Z * 2),
    # shape ops
    "unsqueeze": (lambda z: z.unsqueeze(1), Z),
    "unsqueeze_last": (lambda z: z.unsqueeze(-1), Z),
    "reshape": (lambda z: z.reshape(2, 6), Z),
    "reshape_inferred": (lambda z: z.reshape(-1, 2, 2), Z),
    "expand": (lambda z: z[:, None, :].expand(3, 5, 4), Z),
    "transpose": (lambda z: z.transpose(0, 1), Z),
    "transpose_negative": (lambda z: z.unsqueeze(0).transpose(-1, -2), Z),
    "permute": (lambda z: z.unsqueeze(0).permute(2, 0, 1), Z),
    "flatten": (lambda z: z.unsqueeze(0).flatten(1), Z),
    "squeeze_dim": (lambda z: z.unsqueeze(-1).squeeze(-1), Z),
    "squeeze_all": (lambda z: z.unsqueeze(0).unsqueeze(-1).squeeze(), Z),
    # slicing and data movement
    "slice": (lambda z: z[:, 1:3], Z),
    "slice_step_last": (lambda z: z[..., ::2], Z),
    "select": (lambda z: z[:, 2], Z),
    "select_last": (lambda z: z.select(-1, 1), Z),
    "index": (lambda z, i: z[i], Z, torch.tensor([2, 0, 2])),
    "split": (lambda z: z.split(2, -1), Z),
    "chunk": (lambda z: z.chunk(3, 0)[1], Z),
    "cat": (lambda z: torch.cat([z, z * 2], -1), Z),
    "stack": (lambda z: torch.stack([z, z], -1), Z),
    "repeat": (lambda z: z.repeat(2, 1), Z),
    "flip": (lambda z: z.flip(-1), Z),
    "where": (lambda z, m: torch.where(m, z, z * 2), Z, R > 0),
    "clone": (lambda z: z.clone(), Z),
}


@pytest.mark.parametrize("name", list(CASES))
def test_op_equals_eager(name):
    fn, *args = CASES[name]
    _check(fn, *args)


def _rotary(q: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """DeepSeek-V2's ``apply_rotary_emb`` (Llama 4's is the same with ``unsqueeze(2)``)."""
    pairs = torch.view_as_complex(q.float().reshape(*q.shape[:-1], -1, 2))
    return torch.view_as_real(pairs * freqs.unsqueeze(1)).flatten(3).type_as(q)


def _freqs(positions: torch.Tensor, dim: int = 8) -> torch.Tensor:
    """DeepSeek-V2's rotary embedding: ``polar(1, positions · inv_freq)``, scaled."""
    inv_freq = 1.0 / 10000 ** (torch.arange(0, dim, 2).float() / dim)
    angles = positions[..., None].float() * inv_freq
    return torch.polar(torch.ones_like(angles), angles) * 1.0


def test_rotary_with_complex_frequencies_and_dynamic_sizes(caplog):
    q, positions = torch.randn(2, 4, 5, 8), torch.arange(5).repeat(2, 1)
    batch, seq = torch.export.Dim("batch"), torch.export.Dim("seq")
    with caplog.at_level(logging.WARNING):
        model = _check(
            lambda q, p: _rotary(q, _freqs(p)),
            q,
            positions,
            dynamic_shapes=(({0: batch, 2: seq}, {0: batch, 1: seq}),),
        )
    assert not caplog.records  # no decomposition followed an undecided size condition
    q2, p2 = torch.randn(3, 4, 7, 8), torch.arange(7).repeat(3, 1) + 2
    actual = helpers.run_ort(model, [q2.numpy(), p2.numpy()])
    helpers.assert_close(actual, [_rotary(q2, _freqs(p2)).numpy()], 1e-5)


def _choice(fn, *args):
    ep = torch.export.export(_Fn(fn), args)
    nodes = [n for n in ep.graph.nodes if n.op == "call_function"]
    return LoweringTable(None).choose(nodes[-1])


def test_ops_without_a_complex_lowering_are_decomposed_over_the_parts():
    choice = _choice(lambda z: z.unsqueeze(1), Z)
    assert choice.via is Via.DECOMPOSE
    assert [c.__name__ for c in choice.candidates] == ["complex_parts_unsqueeze_default"]


def test_complex_times_complex_keeps_torchlibs_complex_mul():
    assert _choice(lambda a, b: a * b, Z, Z).fn.name == "aten_mul_complex"


def test_own_lowerings_do_not_see_complex_inputs():
    # irkit's squeeze counts dims on the real representation's rank: not for complex tensors
    choice = _choice(lambda z: z.unsqueeze(-1).squeeze(-1), Z)
    assert choice.via is Via.TORCHLIB and choice.fn.name == "aten_squeeze_dim_complex"


def test_a_real_fill_value_is_not_decomposed_over_the_parts():
    # masked_fill(z, m, 1.0) would put 1.0 in the imaginary part too: not a "moves" op
    choice = _choice(lambda z, m: z.masked_fill(m, 1.0), Z, R > 0)
    assert not any("complex_parts" in getattr(c, "__name__", "") for c in choice.candidates)
