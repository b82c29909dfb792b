"""A causal LM that carries its own state list (RWKV: ``state``, five ``(batch, hidden, layers)``
tensors, no transformers ``Cache``) exports with one input and output per layer and kind
(``past.N.wkv_num`` …), its WKV recurrence one ``Scan`` (``irkit.llm.kernels.wkv``), so one
program serves a prefill of any length and a one-token decode; ``irkit export`` refuses it
before tracing (onnxruntime-genai carries no such kinds).

transformers 5.24's RWKV decodes one token right only for batch 1: its one-token path mixes the
token shift ``(batch, hidden)`` into ``(batch, 1, hidden)`` by broadcasting, so a batch of ``b``
rows decodes as ``b`` tokens of crossed rows (logits ``(b, b, vocab)``). A batch is therefore
compared with transformers row by row (each row with its pads, which RWKV reads as tokens: it
ignores the attention mask).
"""

from __future__ import annotations

import pathlib

import numpy as np
import pytest

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from irkit.llm.kernels import export_kernels, padding_mask  # noqa: E402
from irkit.llm.kernels.wkv import rwkv_linear_attention  # noqa: E402

_RWKV = "transformers.models.rwkv.modeling_rwkv"


def _rwkv() -> object:
    torch.manual_seed(0)
    config = transformers.RwkvConfig(
        vocab_size=300, hidden_size=64, num_hidden_layers=2, attention_hidden_size=64,
        intermediate_size=128, context_length=128, bos_token_id=0, eos_token_id=1,
    )  # fmt: skip
    return transformers.RwkvForCausalLM(config).eval()


def _operands(batch: int = 2, seq: int = 6, channels: int = 8) -> list[object]:
    torch.manual_seed(0)
    return [
        torch.randn(channels),
        torch.randn(channels),
        3 * torch.randn(batch, seq, channels),  # keys spread: the exponent path matters
        torch.randn(batch, seq, channels),
    ]


def test_wkv_kernel_is_the_reference_bit_for_bit() -> None:
    from transformers.models.rwkv.modeling_rwkv import rwkv_linear_attention_cpu

    operands = _operands()
    want, want_state = rwkv_linear_attention_cpu(*operands, return_state=True)
    got, got_state = rwkv_linear_attention(*operands, return_state=True)
    assert torch.equal(got, want)
    assert all(torch.equal(g, w) for g, w in zip(got_state, want_state, strict=True))
    state = [torch.randn(2, 8), torch.rand(2, 8), torch.randn(2, 8)]
    want, want_state = rwkv_linear_attention_cpu(*operands, state=[s.clone() for s in state])
    got, got_state = rwkv_linear_attention(*operands, state=state)
    assert torch.equal(got, want)
    assert all(torch.equal(g, w) for g, w in zip(got_state, want_state, strict=True))
    assert rwkv_linear_attention(*operands)[1] is None


def test_wkv_kernel_holds_its_state_on_pad_steps() -> None:
    from transformers.models.rwkv.modeling_rwkv import rwkv_linear_attention_cpu

    decay, first, key, value = _operands()
    mask = torch.tensor([[1] * 6, [1, 1, 1, 1, 0, 0]])  # row 1 right-padded by two
    with padding_mask(mask):
        _, state = rwkv_linear_attention(decay, first, key, value, return_state=True)
    _, want = rwkv_linear_attention_cpu(decay, first, key[1:, :4], value[1:, :4], return_state=True)
    assert all(torch.equal(s[1:], w) for s, w in zip(state, want, strict=True))


def test_export_kernels_swap_rwkv_by_qualified_name() -> None:
    import transformers.models.rwkv.modeling_rwkv as modeling

    original = modeling.rwkv_linear_attention
    with export_kernels(_rwkv()) as swapped:
        assert modeling.rwkv_linear_attention is rwkv_linear_attention
        assert modeling.rwkv_linear_attention_cpu is rwkv_linear_attention
    assert swapped == ["rwkv_linear_attention", "rwkv_linear_attention_cpu"]
    assert modeling.rwkv_linear_attention is original


@pytest.mark.slow
@pytest.mark.parametrize("target", ["onnx", "ort"])
def test_rwkv_exports_and_generates(target: str, tmp_path: pathlib.Path) -> None:
    ort = pytest.importorskip("onnxruntime")
    import irkit
    from irkit.llm import causal_lm_feeds, export_causal_lm, generate_greedy, run_eager

    model = _rwkv()
    exported = export_causal_lm(model)
    kinds = ["ffn_shift", "att_shift", "wkv_num", "wkv_den", "wkv_max"]
    assert exported.input_names[2:] == [f"past.{n}.{k}" for k in kinds for n in (0, 1)]
    assert exported.output_names[1:] == [f"present.{n}.{k}" for k in kinds for n in (0, 1)]
    lowered = irkit.lower(exported.program, **exported.lower_kwargs())
    irkit.optimize(lowered, target=target)
    irkit.save(lowered, tmp_path / "rwkv.onnx")
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(tmp_path / "rwkv.onnx"), options)
    # random states: a prefill, a multi-token step, a decode (batch 1: see the module docstring)
    for batch, seq, past in [(2, 7, 0), (2, 3, 5), (1, 1, 4)]:
        feeds = causal_lm_feeds(model, batch=batch, seq=seq, past=past, layout=exported.cache)
        for want, got in zip(run_eager(model, feeds), session.run(None, feeds), strict=True):
            np.testing.assert_allclose(got, want, atol=5e-5, rtol=1e-4)

    ids = np.array([[5, 17, 42, 9, 11, 33], [2, 2, 2, 7, 8, 9]])
    mask = np.array([[1] * 6, [0, 0, 0, 1, 1, 1]])  # left-padded, as generate pads
    got = generate_greedy(session, ids, mask, max_new_tokens=12, pad_token_id=2)
    for row in range(2):  # transformers decodes right for batch 1 only
        want = model.generate(
            input_ids=torch.from_numpy(ids[row : row + 1]), attention_mask=None,
            do_sample=False, max_new_tokens=12, pad_token_id=2,
        )  # fmt: skip
        np.testing.assert_array_equal(got[row : row + 1], want.numpy())
        assert len(set(want[0, 6:].tolist())) >= 3  # varied ids, not one token repeated
    one = generate_greedy(session, ids[:1], mask[:1], max_new_tokens=12, pad_token_id=2)
    np.testing.assert_array_equal(one, got[:1])


@pytest.mark.slow
def test_export_refuses_a_state_list_before_tracing(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from irkit.cli import main
    from tests.llm import genai_support as gs

    folder = gs.save_folder(tmp_path / "hf", _rwkv(), gs.tokenizer(vocab_size=300))
    assert main(["export", str(folder), "-o", str(tmp_path / "out"), "-q"]) == 2
    err = capsys.readouterr().err
    assert "'rwkv'" in err and "wkv_num" in err and "generate_greedy" in err
    assert not (tmp_path / "out").exists()
