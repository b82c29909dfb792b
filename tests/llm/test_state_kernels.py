"""irkit.llm.kernels: the gated delta rule export kernel against transformers' own fallbacks, the
padding hold, and the swap of hub-kernel contract functions (fast: no model is exported)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
qwen = pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5")

from irkit.errors import ExportError  # noqa: E402
from irkit.llm import kernels  # noqa: E402
from irkit.llm.kernels.gated_delta import gated_delta_rule  # noqa: E402


def _inputs(seq: int, batch: int = 2, k_heads: int = 2, v_heads: int = 4, dim: int = 8):
    g = torch.Generator().manual_seed(seq)
    q = torch.randn(batch, seq, k_heads, dim, generator=g)
    k = torch.randn(batch, seq, k_heads, dim, generator=g)
    v = torch.randn(batch, seq, v_heads, dim, generator=g)
    decay = -torch.rand(batch, seq, v_heads, generator=g)
    beta = torch.rand(batch, seq, v_heads, generator=g)
    state = torch.randn(batch, v_heads, dim, dim, generator=g)
    return q, k, v, decay, beta, state


@pytest.mark.parametrize("seq", [1, 5, 70])  # 70: more than one chunk of the chunked fallback
@pytest.mark.parametrize("initial", [False, True])
def test_gated_delta_rule_equals_transformers_fallbacks(seq: int, initial: bool) -> None:
    q, k, v, g, beta, state = _inputs(seq)
    init = state if initial else None
    got, got_state = gated_delta_rule(
        q, k, v, g=g, beta=beta, initial_state=init, output_final_state=True,
        use_qk_l2norm_in_kernel=True,
    )  # fmt: skip
    for reference in (qwen.torch_chunk_gated_delta_rule, qwen.torch_recurrent_gated_delta_rule):
        want, want_state = reference(
            q, k, v, g=g, beta=beta, initial_state=init, output_final_state=True,
            use_qk_l2norm_in_kernel=True,
        )  # fmt: skip
        torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)
        torch.testing.assert_close(got_state, want_state, atol=2e-5, rtol=1e-4)


def test_gated_delta_rule_holds_state_at_pads() -> None:
    q, k, v, g, beta, state = _inputs(6)
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0]])  # row 1 right-padded
    with kernels.padding_mask(mask):
        _, held = gated_delta_rule(q, k, v, g, beta, initial_state=state, output_final_state=True)
    _, whole = gated_delta_rule(q, k, v, g, beta, initial_state=state, output_final_state=True)
    _, prefix = gated_delta_rule(
        q[1:, :3], k[1:, :3], v[1:, :3], g[1:, :3], beta[1:, :3],
        initial_state=state[1:], output_final_state=True,
    )  # fmt: skip
    torch.testing.assert_close(held[0], whole[0])
    torch.testing.assert_close(held[1], prefix[0])
    assert not torch.allclose(whole[1], prefix[0])  # without the hold the pads move the state
    assert kernels.step_mask() is None


def test_packed_sequences_are_refused() -> None:
    q, k, v, g, beta, _ = _inputs(3)
    with pytest.raises(ExportError, match="cu_seqlens"):
        gated_delta_rule(q, k, v, g, beta, cu_seqlens=torch.tensor([0, 3]))


def test_contract_names_are_read_from_transformers_decorator() -> None:
    assert kernels.contract_name(qwen.torch_chunk_gated_delta_rule) == "chunk_gated_delta_rule"
    assert kernels.contract_name(qwen.causal_conv1d_fn) == "causal_conv1d_fn"
    assert kernels.contract_name(qwen.l2norm) is None
    assert kernels.contract_name(len) is None


def test_export_kernels_swaps_and_restores_the_model_modules_globals() -> None:
    import transformers

    config = transformers.Qwen3_5TextConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, vocab_size=64, linear_num_key_heads=1,
        linear_num_value_heads=2, linear_key_head_dim=8, linear_value_head_dim=8,
        layer_types=["linear_attention", "full_attention"],
    )  # fmt: skip
    model = transformers.Qwen3_5ForCausalLM(config)
    before = qwen.torch_chunk_gated_delta_rule
    with kernels.export_kernels(model) as swapped:
        assert swapped == ["chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule"]
        assert qwen.torch_chunk_gated_delta_rule is gated_delta_rule
        assert qwen.causal_conv1d_fn.__wrapped__ is not None  # no kernel: left as it is
    assert qwen.torch_chunk_gated_delta_rule is before
