"""``export_causal_lm(model, cache=False)``: the cached export's refusal of a model whose
one-token step fails (CPM-Ant: the whole sequence at every step) naming that remedy, the model
exported without a cache (ids in, logits out, :func:`irkit.llm.generate_greedy` re-feeding the
whole sequence), and the export-only mechanisms of the same work: the layout guard
relaxation (``_export_narrowing``) and the expert-loop kernel (``kernels.experts``)."""

from __future__ import annotations

import numpy as np
import pytest

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from irkit.errors import ExportError  # noqa: E402
from irkit.llm import export_causal_lm  # noqa: E402


def _cpmant() -> object:
    torch.manual_seed(0)
    config = transformers.CpmAntConfig(
        vocab_size=120, hidden_size=32, num_attention_heads=2, dim_head=16, dim_ff=64,
        num_hidden_layers=1, prompt_length=4, position_bias_num_buckets=16,
        position_bias_max_distance=64, init_std=0.3, prompt_types=4, segment_types=4,
    )  # fmt: skip
    return transformers.CpmAntForCausalLM(config).eval()


def test_cached_export_refuses_a_whole_sequence_convention_and_names_cache_false() -> None:
    model = _cpmant()
    with pytest.raises(ExportError) as info:
        export_causal_lm(model)
    message = str(info.value)
    assert "fails on one new token with the cache" in message
    assert "export_causal_lm(model, cache=False)" in message
    # without a cache: ids and mask in, logits out (its Python range over the tokens an
    # arange: kernels.ranges), for the whole sequence at every step
    exported = export_causal_lm(model, cache=False)
    assert exported.input_names == ["input_ids", "attention_mask"]
    assert exported.output_names == ["logits"]
    assert exported.cache.keys == () and not exported.cache.states
    program = exported.program.module()
    rng = np.random.default_rng(0)
    for length in (1, 6, 11):  # one program, every length (onnxruntime: the sweep, GPT-1's test)
        ids = torch.from_numpy(rng.integers(1, 120, (2, length)))
        mask = torch.ones_like(ids)
        with torch.no_grad():
            want = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
        torch.testing.assert_close(program(input_ids=ids, attention_mask=mask), want)


class _Delayed(torch.nn.Module):
    """ZAYA's delayed values: ``cat([state, v[:, :-1]])`` then a view, which makes torch's
    contiguity check guard ``sequence - 1 != 1``."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        d = self.proj(x)
        v = torch.cat([torch.zeros_like(d[:, :1]), d[:, :-1]], dim=1)
        return torch.cat([x, v], dim=-1).view(x.shape[0], x.shape[1], 2, 8)


def test_the_refusal_on_meta_weights_logs_no_torch_traceback(caplog) -> None:
    """``irkit export`` builds the model on ``meta``: the one-token probe runs on fake tensors,
    and its failure is irkit's error alone, not also a traceback torch logs on stderr."""
    with torch.device("meta"):
        model = _cpmant()
    with pytest.raises(ExportError, match="fails on one new token with the cache"):
        export_causal_lm(model)
    logged = [r for r in caplog.records if r.name == "torch._subclasses.fake_tensor"]
    assert not logged, [r.getMessage() for r in logged]


def test_a_layout_guard_is_relaxed_and_the_program_serves_every_length() -> None:
    from irkit.llm._causal_lm import _export_narrowing

    torch.manual_seed(0)
    model = _Delayed().eval()
    kwargs = {"x": torch.randn(2, 5, 8)}
    dims = {0: torch.export.Dim("batch", max=64), 1: torch.export.Dim("sequence", max=64)}
    with pytest.raises(torch._dynamo.exc.UserError, match="satisfy the generated guard"):
        torch.export.export(model, (), kwargs, dynamic_shapes={"x": dims})
    program = _export_narrowing(model, kwargs, {"x": dims})
    for length in (1, 2, 3, 7):
        x = torch.randn(3, length, 8)
        torch.testing.assert_close(program.module()(x=x), model(x))


class _Taps(torch.nn.Module):
    """Inkling2's dynamic short convolution: windows of the left-padded sequence
    (``unfold(-1, 4, 1).flip(-1)``), weighted per token. The ``flip`` makes torch order its new
    tensor's strides by comparing the sequence with the kernel width (``sequence < 4`` at a
    3-token example), and suggest that narrowing."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        context = torch.nn.functional.pad(x.transpose(1, 2), (3, 0))
        windows = context.unfold(-1, 4, 1).flip(-1).transpose(1, 2)  # (batch, seq, 8, 4)
        return (windows * self.proj(x)[:, :, None, :]).sum(-1)


def test_a_narrowing_from_a_layout_decision_is_relaxed_and_serves_every_length() -> None:
    from irkit.llm._causal_lm import _export_narrowing

    torch.manual_seed(0)
    model = _Taps().eval()
    kwargs = {"x": torch.randn(2, 3, 8)}
    dims = {"x": {1: torch.export.Dim("sequence", max=64)}}
    with pytest.raises(torch._dynamo.exc.UserError, match=r"sequence = Dim\('sequence', max=3\)"):
        torch.export.export(model, (), kwargs, dynamic_shapes=dims)  # (torch alone: narrowed)
    program = _export_narrowing(model, kwargs, dims)
    [(low, high)] = [(int(r.lower), int(r.upper)) for r in program.range_constraints.values()]
    assert high == 64
    for length in (1, 3, 4, 17):
        x = torch.randn(2, length, 8)
        torch.testing.assert_close(program.module()(x=x), model(x))


class _Streams(torch.nn.Module):
    """ProphetNet's streams: ``(1 + ngram)·sequence`` rows ``chunk``\\ ed back into ``1 + ngram``
    parts, whose part count torch's ``chunk`` guards as ``(4·s - 1) // s == 3``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        main, first, second = torch.cat([x, 2 * x, 3 * x], dim=1).chunk(3, dim=1)
        return main + first * second


def test_an_even_chunk_of_a_dynamic_dim_serves_every_length() -> None:
    from irkit.llm._causal_lm import _export_narrowing

    model, kwargs = _Streams(), {"x": torch.randn(2, 5, 4)}
    dims = {"x": {1: torch.export.Dim("sequence", max=64)}}
    with pytest.raises(torch._dynamo.exc.UserError, match="sequence = 5"):
        torch.export.export(model, (), kwargs, dynamic_shapes=dims)  # (torch alone: specialized)
    program = _export_narrowing(model, kwargs, dims)
    for length in (1, 2, 9):
        x = torch.randn(2, length, 4)
        torch.testing.assert_close(program.module()(x=x), model(x))


class _Shifted(torch.nn.Module):
    """A branch on ``(2·s - 1) mod s != 0`` (XLNet's relative-position shift makes the same
    guard): true for every ``s ≥ 2``, which torch's solver cannot show."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[1]
        return x * 2 if (2 * n - 1) % n != 0 else x


def test_an_assertion_true_on_a_narrower_range_is_checked_at_every_size() -> None:
    from irkit.llm._causal_lm import _export_narrowing

    model, kwargs = _Shifted(), {"x": torch.randn(2, 5)}
    dims = {"x": {1: torch.export.Dim("sequence", max=64)}}
    with pytest.raises(torch._dynamo.exc.UserError, match="satisfy the generated guard"):
        torch.export.export(model, (), kwargs, dynamic_shapes=dims)
    program = _export_narrowing(model, kwargs, dims)
    # (false at s = 1 only: the program serves 2 … 64, where it holds at every size)
    [(low, high)] = [(int(r.lower), int(r.upper)) for r in program.range_constraints.values()]
    assert (low, high) == (2, 64)
    for length in (2, 3, 64):
        x = torch.randn(2, length)
        torch.testing.assert_close(program.module()(x=x), model(x))


@pytest.mark.slow
def test_xlnet_exports_without_its_memory_and_runs_every_length() -> None:
    """XLNet's memory (``mems``, cut to ``mem_len``) is a cache by another name: off
    (``use_mems=False``); its relative positions' guards hold from 2 tokens on (checked at
    every length), its ``eye`` of the sequence length lowers through torch's decomposition."""
    import irkit
    from tests.helpers import FP32_ATOL, assert_close, ort_session

    torch.manual_seed(0)
    config = transformers.XLNetConfig(
        vocab_size=120, d_model=32, n_layer=1, n_head=2, d_inner=64, mem_len=16,
    )  # fmt: skip
    model = transformers.XLNetLMHeadModel(config).eval()
    exported = export_causal_lm(model, cache=False)
    ranges = [(int(r.lower), int(r.upper)) for r in exported.program.range_constraints.values()]
    # the sequence: from 2 tokens on with torch 2.13 (its guards fail at 1), every length with
    # 2.15 (the batch's range is the other)
    assert any(low <= 2 and high == 4095 for low, high in ranges), ranges
    onnx_model = irkit.lower(exported.program, **exported.lower_kwargs())
    irkit.optimize(onnx_model)
    session = ort_session(onnx_model)
    names = [i.name for i in session.get_inputs()]
    rng = np.random.default_rng(0)
    for length in (2, 9, 40):  # (past mem_len too)
        ids = rng.integers(3, 120, (2, length))
        feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
        with torch.no_grad():
            want = model(
                input_ids=torch.from_numpy(ids), attention_mask=torch.ones(2, length),
                use_mems=False,
            ).logits  # fmt: skip
        actual = session.run(None, {k: v for k, v in feeds.items() if k in names})
        assert_close(actual, [want.numpy()], FP32_ATOL)


@pytest.mark.slow
def test_deepseek_v4_compressors_export_without_a_cache_for_every_length() -> None:
    """DeepSeek-V4's compressed sparse (windows of 4, overlapping, its indexer's top 3 picks) and
    heavily compressed (windows of 8) attention: the branch-free kernels (``kernels.compressed``)
    equal the model's own forward with and without closed windows, and the one program, exported
    on a 3-token example (no window closed), runs every length in onnxruntime."""
    import irkit
    from irkit.llm.kernels import export_kernels
    from tests.helpers import FP32_ATOL, assert_close, ort_session

    config = transformers.AutoConfig.for_model(
        "deepseek_v4", vocab_size=512, hidden_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=1, head_dim=16, q_lora_rank=32,
        o_groups=8, o_lora_rank=32, qk_rope_head_dim=2, index_n_heads=4, index_head_dim=16,
        index_topk=512, moe_intermediate_size=32, n_routed_experts=4, num_experts_per_tok=2,
        sliding_window=8, max_position_embeddings=128, bos_token_id=0, eos_token_id=1,
        layer_types=["compressed_sparse_attention", "heavily_compressed_attention"],
        mlp_layer_types=["moe", "moe"],
        compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    indexers = [m for m in model.modules() if hasattr(m, "index_topk")]
    rng = np.random.default_rng(0)
    with torch.no_grad():
        # (a top 3 of more entries may keep other entries of equal score than torch's own call:
        # the index scores are ReLU sums, 0 for many entries; all picked at 512)
        for topk, length in [(3, 1), (3, 3), (3, 13), *((512, n) for n in (1, 3, 13, 40))]:
            for indexer in indexers:
                indexer.index_topk = topk
            ids = torch.from_numpy(rng.integers(3, 512, (2, length)))
            want = model(input_ids=ids, use_cache=False).logits
            with export_kernels(model) as swapped:
                got = model(input_ids=ids, use_cache=False).logits
            assert swapped == ["window_compressor", "window_indexer"]
            torch.testing.assert_close(got, want)
    # onnxruntime: every visible entry picked (its scores are ReLU sums, 0 for many entries:
    # a top 3 among ties may pick other, equally valid, entries than torch's CPU topk)
    exported = export_causal_lm(model, cache=False)
    onnx_model = irkit.lower(exported.program, **exported.lower_kwargs())
    irkit.optimize(onnx_model)
    session = ort_session(onnx_model)
    names = [i.name for i in session.get_inputs()]
    for length in (2, 13, 40):
        ids = rng.integers(3, 512, (2, length))
        feeds = {
            "input_ids": ids,
            "attention_mask": np.ones_like(ids),
            "position_ids": np.tile(np.arange(length), (2, 1)),
        }
        with torch.no_grad():
            want = model(input_ids=torch.from_numpy(ids), use_cache=False).logits
        actual = session.run(None, {k: v for k, v in feeds.items() if k in names})
        assert_close(actual, [want.numpy()], FP32_ATOL)


@pytest.mark.slow
def test_prophetnet_exports_without_a_cache_and_runs_every_length() -> None:
    """ProphetNet's decoder takes its cache one token at a time only (its own assert); without
    one, its n-gram streams need the even ``chunk`` and its layout checks the relaxation, and one
    program serves the sequence up to its position table (``2 ≤ sequence ≤ 510``)."""
    import irkit
    from tests.helpers import FP32_ATOL, assert_close, ort_session

    torch.manual_seed(0)
    config = transformers.ProphetNetConfig(
        vocab_size=120, hidden_size=32, encoder_ffn_dim=64, decoder_ffn_dim=64,
        num_encoder_layers=1, num_decoder_layers=1, num_encoder_attention_heads=2,
        num_decoder_attention_heads=2, max_position_embeddings=512, ngram=2,
    )  # fmt: skip
    model = transformers.ProphetNetForCausalLM(config).eval()
    exported = export_causal_lm(model, cache=False)
    assert exported.output_names == ["logits"]
    onnx_model = irkit.lower(exported.program, **exported.lower_kwargs())
    irkit.optimize(onnx_model)
    session = ort_session(onnx_model)
    names = [i.name for i in session.get_inputs()]
    rng = np.random.default_rng(0)
    for length in (2, 7, 40):
        ids = rng.integers(3, 120, (2, length))
        mask = np.ones_like(ids)
        mask[1, length - 1 :] = 0  # (a right-padded row)
        feeds = {"input_ids": ids, "attention_mask": mask}
        with torch.no_grad():
            want = model(
                input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask),
                use_cache=False,
            ).logits  # fmt: skip
        actual = session.run(None, {k: v for k, v in feeds.items() if k in names})
        assert_close(actual, [want.numpy()], FP32_ATOL)


def test_expert_loop_kernel_equals_the_loop_and_keeps_to_its_layout() -> None:
    from irkit.llm.kernels.experts import gathered_experts, is_expert_loop

    modeling = pytest.importorskip("transformers.models.longcat_flash.modeling_longcat_flash")
    config = transformers.LongcatFlashConfig(
        hidden_size=16, expert_ffn_hidden_size=8, n_routed_experts=4, zero_expert_num=2,
        moe_topk=2, hidden_act="silu",
    )  # fmt: skip
    torch.manual_seed(0)
    experts = modeling.LongcatFlashExperts(config)
    torch.nn.init.normal_(experts.gate_up_proj, std=0.3)
    torch.nn.init.normal_(experts.down_proj, std=0.3)
    assert is_expert_loop(experts)
    x = torch.randn(9, 16)
    index = torch.randint(0, 6, (9, 2))  # 4 and 5: zero-computation (identity) experts
    weights = torch.rand(9, 2)
    assert bool((index >= 4).any()) and bool((index < 4).any())
    with torch.no_grad():
        torch.testing.assert_close(
            gathered_experts(experts, x, index, weights), experts(x, index, weights)
        )
    mixtral = transformers.MixtralConfig(hidden_size=16, intermediate_size=8, num_local_experts=4)
    switched = transformers.models.mixtral.modeling_mixtral.MixtralExperts(mixtral)
    assert not is_expert_loop(switched)  # under transformers' experts switch: not this kernel
