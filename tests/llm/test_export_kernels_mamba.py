"""The Mamba1, Mamba2 and KDA export kernels (``irkit/llm/kernels/{mamba,mamba2,kda}.py``).

Each kernel equals transformers' torch fallback of its hub-kernel contract on random inputs
(several lengths, one token and more than one chunk of the chunked references, with and without
an initial state); one kernel per family exports with a dynamic sequence length, lowers to ONNX
(``Scan``) and runs in onnxruntime like eager at lengths 1, 5 and more than a chunk.
"""

from __future__ import annotations

import importlib

import pytest
import torch
from transformers.models.bamba import modeling_bamba
from transformers.models.mamba import modeling_mamba

import irkit
from irkit.errors import ExportError
from irkit.llm.kernels import kda, mamba, mamba2
from tests import helpers

try:
    modeling_kimi = importlib.import_module("transformers.models.kimi_linear.modeling_kimi_linear")
except ImportError:  # transformers 4.x: no Kimi Linear
    modeling_kimi = None

# The references: transformers' torch fallbacks of the hub-kernel contracts (transformers 5;
# 4.x's Mamba models run their scans inline, with no function of the contract to compare with).
needs_mamba_reference = pytest.mark.skipif(
    not hasattr(modeling_mamba, "mamba_selective_scan"),
    reason="transformers' Mamba has no torch fallback of the kernel contract (mamba_selective_scan)",
)
needs_mamba2_reference = pytest.mark.skipif(
    not hasattr(modeling_bamba, "mamba2_chunk_scan"),
    reason="transformers' Bamba has no torch fallback of the kernel contract (mamba2_chunk_scan)",
)
needs_kda_reference = pytest.mark.skipif(
    modeling_kimi is None, reason="transformers has no Kimi Linear (its KDA references)"
)

ATOL = 1e-5
LENGTHS = (1, 5, 11)  # 11 > CHUNK: more than one chunk of the chunked references
CHUNK = 4


def _close(actual, expected, atol: float = ATOL) -> None:
    if isinstance(expected, tuple):
        assert isinstance(actual, tuple) and len(actual) == len(expected)
        for a, e in zip(actual, expected, strict=True):
            _close(a, e, atol)
        return
    if expected is None:
        assert actual is None
        return
    assert actual.shape == expected.shape and actual.dtype == expected.dtype
    torch.testing.assert_close(actual, expected, atol=atol, rtol=ATOL)


# --- inputs -------------------------------------------------------------------------------------
def _mamba1_inputs(length: int, batch: int = 2, channels: int = 6, n: int = 4):
    args = (
        torch.randn(batch, channels, length),  # u
        torch.randn(batch, channels, length),  # dt
        -torch.rand(channels, n) - 0.5,  # A
        torch.randn(batch, n, length),  # B
        torch.randn(batch, n, length),  # C
    )
    kwargs = {
        "D": torch.randn(channels),
        "z": torch.randn(batch, channels, length),
        "delta_bias": torch.randn(channels),
        "delta_softplus": True,
    }
    return args, kwargs


def _mamba2_inputs(length: int, batch: int = 2, heads: int = 4, head_dim: int = 3, groups: int = 2):
    n = 5
    args = (
        torch.randn(batch, length, heads, head_dim),  # x
        torch.randn(batch, length, heads),  # dt
        -torch.rand(heads) - 0.5,  # A
        torch.randn(batch, length, groups, n),  # B
        torch.randn(batch, length, groups, n),  # C
    )
    kwargs = {
        "D": torch.randn(heads),
        "dt_bias": torch.randn(heads),
        "dt_softplus": True,
        "dt_limit": (0.0, float("inf")),
    }
    return args, kwargs, torch.randn(batch, heads, head_dim, n)


def _kda_inputs(length: int, batch: int = 2, heads: int = 2, k_dim: int = 4, v_dim: int = 3):
    args = (
        torch.randn(batch, length, heads, k_dim),  # q
        torch.randn(batch, length, heads, k_dim),  # k
        torch.randn(batch, length, heads, v_dim),  # v
    )
    kwargs = {
        "g": -torch.rand(batch, length, heads, k_dim),
        "beta": torch.rand(batch, length, heads),
        "use_qk_l2norm_in_kernel": True,
    }
    return args, kwargs, torch.randn(batch, heads, k_dim, v_dim)


# --- (a) each kernel equals transformers' reference ---------------------------------------------
def test_every_contract_has_one_kernel():
    names = [*mamba.KERNELS, *mamba2.KERNELS, *kda.KERNELS]
    assert sorted(names) == sorted(set(names))
    assert set(names) == {
        "selective_scan_fn",
        "mamba_inner_fn",
        "selective_state_update",
        "mamba_chunk_scan_combined",
        "mamba_split_conv1d_scan_combined",
        "chunk_kda",
        "fused_recurrent_kda",
    }


@needs_mamba_reference
@pytest.mark.parametrize("last_state", [False, True])
def test_selective_scan_fn_equals_the_reference(last_state):
    torch.manual_seed(0)
    for length in LENGTHS:
        args, kwargs = _mamba1_inputs(length)
        kwargs["return_last_state"] = last_state
        expected = modeling_mamba.mamba_selective_scan(*args, **kwargs)
        _close(mamba.selective_scan_fn(*args, **kwargs), expected)
    # the bare form: no D, z, bias or softplus
    args, _ = _mamba1_inputs(5)
    _close(mamba.selective_scan_fn(*args), modeling_mamba.mamba_selective_scan(*args))


def test_selective_scan_fn_continues_from_an_initial_state():
    # irkit's extension (no initial state in the contract): a sequence scanned in two parts,
    # the second from the first's last state, equals the sequence scanned at once
    torch.manual_seed(0)
    args, kwargs = _mamba1_inputs(7)
    kwargs["return_last_state"] = True
    whole = mamba.selective_scan_fn(*args, **kwargs)
    head = [a[..., :4] if a.dim() == 3 else a for a in args]
    tail = [a[..., 4:] if a.dim() == 3 else a for a in args]
    first = mamba.selective_scan_fn(*head, **(kwargs | {"z": kwargs["z"][..., :4]}))
    second = mamba.selective_scan_fn(
        *tail, initial_state=first[1], **(kwargs | {"z": kwargs["z"][..., 4:]})
    )
    _close((torch.cat([first[0], second[0]], dim=-1), second[1]), whole)


@needs_mamba2_reference
@pytest.mark.parametrize("initial", [False, True])
def test_mamba_chunk_scan_combined_equals_the_reference(initial):
    torch.manual_seed(0)
    for length in LENGTHS:
        args, kwargs, state = _mamba2_inputs(length)
        kwargs |= {"initial_states": state if initial else None, "return_final_states": True}
        expected = modeling_bamba.mamba2_chunk_scan(*args, CHUNK, **kwargs)
        _close(mamba2.mamba_chunk_scan_combined(*args, CHUNK, **kwargs), expected)
    # what the mixers pass besides: z=None and the model's **kwargs; a dt limit that clamps
    args, kwargs, _ = _mamba2_inputs(7)
    kwargs |= {"dt_limit": (0.2, 0.9), "z": None, "seq_idx": None, "output_attentions": False}
    expected = modeling_bamba.mamba2_chunk_scan(*args, CHUNK, **kwargs)
    _close(mamba2.mamba_chunk_scan_combined(*args, CHUNK, **kwargs), expected)


@needs_mamba_reference
@needs_mamba2_reference
def test_selective_state_update_equals_both_references_and_updates_the_state():
    torch.manual_seed(0)
    batch, channels, n = 2, 6, 4
    state = torch.randn(batch, channels, n)
    args = (
        torch.randn(batch, channels),
        torch.randn(batch, channels),
        -torch.rand(channels, n),
        torch.randn(batch, n),
        torch.randn(batch, n),
        torch.randn(channels),
    )
    kwargs = {
        "z": torch.randn(batch, channels),
        "dt_bias": torch.randn(channels),
        "dt_softplus": True,
    }
    ours = state.clone()
    expected = modeling_mamba.mamba_selective_state_update(state, *args, **kwargs)
    _close(mamba2.selective_state_update(ours, *args, **kwargs), expected)
    _close(ours, state)

    heads, head_dim, groups, n = 4, 3, 2, 5
    state = torch.randn(batch, heads, head_dim, n)
    args = (
        torch.randn(batch, heads, head_dim),
        torch.randn(batch, heads, head_dim),
        (-torch.rand(heads))[:, None, None].expand(heads, head_dim, n),
        torch.randn(batch, groups, n),
        torch.randn(batch, groups, n),
        torch.randn(heads)[:, None].expand(heads, head_dim),
    )
    for z in (None, torch.randn(batch, heads, head_dim)):
        kwargs = {"z": z, "dt_bias": torch.randn(heads)[:, None].expand(heads, head_dim)}
        kwargs["dt_softplus"] = True
        ours = state.clone()
        expected = modeling_bamba.mamba2_selective_state_update(state, *args, **kwargs)
        _close(mamba2.selective_state_update(ours, *args, **kwargs), expected)
        _close(ours, state)


@needs_kda_reference
@pytest.mark.parametrize("initial", [False, True])
def test_kda_kernels_equal_both_references(initial):
    torch.manual_seed(0)
    for length in LENGTHS:
        args, kwargs, state = _kda_inputs(length)
        init = state if initial else None
        expected = modeling_kimi.chunk_kimi_delta_attention(
            *args, chunk_size=CHUNK, initial_state=init, output_final_state=True, **kwargs
        )
        ours = kda.chunk_kda(
            *args, chunk_size=CHUNK, initial_state=init, output_final_state=True, **kwargs
        )
        _close(ours, expected)
        kwargs |= {"initial_state": init, "output_final_state": True}
        expected = modeling_kimi.recurrent_kimi_delta_attention(*args, **kwargs)
        _close(kda.fused_recurrent_kda(*args, **kwargs), expected)
    # no final state asked for; no l2 norm
    args, kwargs, state = _kda_inputs(3)
    kwargs["use_qk_l2norm_in_kernel"] = False
    expected = modeling_kimi.chunk_kimi_delta_attention(*args, initial_state=state, **kwargs)
    _close(kda.chunk_kda(*args, initial_state=state, **kwargs), expected)


@needs_mamba2_reference
def test_the_fused_training_contracts_decline_like_the_reference():
    # the fallbacks return None: the mixer goes on down its unfused path (the other kernels)
    xz = torch.randn(1, 8, 3)
    assert modeling_mamba.mamba_inner_fn(xz, *[None] * 7) is None
    assert mamba.mamba_inner_fn(xz, *[None] * 7) is None
    assert modeling_bamba.mamba2_split_conv1d_scan_combined(xz, *[None] * 5, 4) is None
    assert mamba2.mamba_split_conv1d_scan_combined(xz, *[None] * 5, 4) is None


def test_packed_sequences_and_ambiguous_arguments_are_refused():
    args, kwargs = _mamba1_inputs(3)
    with pytest.raises(ExportError, match="seq_idx"):
        mamba.selective_scan_fn(*args, seq_idx=torch.zeros(2, 3, dtype=torch.int32), **kwargs)
    args, kwargs, _ = _mamba2_inputs(3)
    with pytest.raises(ExportError, match="cu_seqlens"):
        mamba2.mamba_chunk_scan_combined(*args, CHUNK, cu_seqlens=torch.tensor([0, 3]), **kwargs)
    with pytest.raises(ExportError, match="gate"):
        mamba2.mamba_chunk_scan_combined(*args, CHUNK, z=torch.randn(2, 3, 4, 3), **kwargs)
    with pytest.raises(ExportError, match="state must be"):
        mamba2.selective_state_update(torch.zeros(2, 3), *[None] * 5)
    args, kwargs, _ = _kda_inputs(3)
    with pytest.raises(ExportError, match="scale"):
        kda.chunk_kda(*args, scale=0.5, **kwargs)


# --- (b) export with a dynamic sequence, lower, run in onnxruntime ------------------------------
class _Mamba1(torch.nn.Module):
    def forward(self, u, dt, A, B, C, D, z, delta_bias):
        return mamba.selective_scan_fn(
            u,
            dt,
            A,
            B,
            C,
            D=D,
            z=z,
            delta_bias=delta_bias,
            delta_softplus=True,
            return_last_state=True,
        )


class _Mamba2(torch.nn.Module):
    def forward(self, x, dt, A, B, C, D, dt_bias, initial_states):
        return mamba2.mamba_chunk_scan_combined(
            x,
            dt,
            A,
            B,
            C,
            CHUNK,
            D=D,
            dt_bias=dt_bias,
            initial_states=initial_states,
            dt_softplus=True,
            return_final_states=True,
        )


class _Kda(torch.nn.Module):
    def forward(self, q, k, v, g, beta, initial_state):
        return kda.chunk_kda(
            q,
            k,
            v,
            g,
            beta,
            chunk_size=CHUNK,
            initial_state=initial_state,
            output_final_state=True,
            use_qk_l2norm_in_kernel=True,
        )


def _mamba1_case(length):
    args, kwargs = _mamba1_inputs(length)
    return (*args, kwargs["D"], kwargs["z"], kwargs["delta_bias"])


def _mamba2_case(length):
    args, kwargs, state = _mamba2_inputs(length)
    return (*args, kwargs["D"], kwargs["dt_bias"], state)


def _kda_case(length):
    args, kwargs, state = _kda_inputs(length)
    return (*args, kwargs["g"], kwargs["beta"], state)


_SEQ = torch.export.Dim("sequence", min=1, max=4096)
FAMILIES = {
    # module, inputs of one length, dynamic shapes (the sequence axis of each input)
    "mamba1": (
        _Mamba1,
        _mamba1_case,
        ({2: _SEQ}, {2: _SEQ}, None, {2: _SEQ}, {2: _SEQ}, None, {2: _SEQ}, None),
    ),
    "mamba2": (
        _Mamba2,
        _mamba2_case,
        ({1: _SEQ}, {1: _SEQ}, None, {1: _SEQ}, {1: _SEQ}, None, None, None),
    ),
    "kda": (_Kda, _kda_case, ({1: _SEQ},) * 5 + (None,)),
}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_one_program_serves_every_length_in_onnxruntime(family, tmp_path):
    module_type, case, dynamic_shapes = FAMILIES[family]
    torch.manual_seed(0)
    module = module_type()
    ep = torch.export.export(module, case(5), dynamic_shapes=dynamic_shapes)
    model = irkit.lower(ep)
    assert any(node.op_type == "Scan" for node in model.graph.all_nodes())
    path = tmp_path / f"{family}.onnx"
    irkit.save(model, path)
    for length in (1, 5, 3 * CHUNK - 1):
        inputs = case(length)
        expected = helpers.flatten_outputs(module(*inputs))
        helpers.assert_close(helpers.run_ort(path, list(inputs)), expected, ATOL)
