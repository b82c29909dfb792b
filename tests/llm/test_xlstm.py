"""xLSTM: the mLSTM recurrence (:mod:`irkit.llm.kernels.mlstm`) and its cache class of its own.

The export kernel equals transformers' ``xLSTMBackend.forward`` on its three paths (the step
kernel for one token, the loop of steps for fewer tokens than a chunk, the chunkwise form and a
remainder beyond); the model exports as one program whose states are ``xLSTMCache.rnn_state``'s
per-layer ``(C, n, m)`` tuples (``past.N.recurrent``, ``.1``, ``.2``), runs in onnxruntime like
eager and gives ``generate``'s greedy ids for a left-padded batch (xLSTM reads no mask: pads
are tokens to it, in both).
"""

from __future__ import annotations

import numpy as np
import pytest

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")
modeling = pytest.importorskip("transformers.models.xlstm.modeling_xlstm")

import irkit  # noqa: E402
from irkit.errors import ExportError  # noqa: E402
from irkit.llm import causal_lm_feeds, export_causal_lm, generate_greedy, run_eager  # noqa: E402
from irkit.llm.kernels.mlstm import backend_forward  # noqa: E402

CHUNK = 4  # the chunkwise form's chunk: the longer prompts below span several

pytestmark = pytest.mark.skipif(
    getattr(modeling, "external_xlstm", False),
    reason="transformers uses the external xlstm package's blocks (no xLSTMBackend to replace)",
)


def _require_state_layers() -> None:
    """Skips where transformers has no ``LinearAttentionLayer``, which irkit holds a model's own
    listed states in (``_states.find_listed_states`` finds none there)."""
    if not hasattr(pytest.importorskip("transformers.cache_utils"), "LinearAttentionLayer"):
        pytest.skip(f"transformers {transformers.__version__} has no LinearAttentionLayer")


def _config(**overrides: object) -> object:
    # qk_dim_factor 1: the layer's and the cache's head sizes agree below 64 channels
    fields = dict(
        vocab_size=300, hidden_size=64, num_heads=2, num_hidden_layers=2, chunk_size=CHUNK,
        qk_dim_factor=1.0, ffn_round_up_to_multiple_of=16, pad_token_id=1, bos_token_id=0,
        eos_token_id=2,
    )  # fmt: skip
    return transformers.xLSTMConfig(**(fields | overrides))


def _operands(seq: int, initial: bool) -> tuple[object, ...]:
    g = torch.Generator().manual_seed(seq)
    batch, heads, qk, v = 2, 2, 16, 32
    q, k = (
        torch.randn(batch, heads, seq, qk, generator=g),
        torch.randn(batch, heads, seq, qk, generator=g),
    )
    value = torch.randn(batch, heads, seq, v, generator=g)
    igate = 3 * torch.randn(batch, heads, seq, generator=g)
    fgate = 3 * torch.randn(batch, heads, seq, generator=g) + 2
    state = (
        torch.randn(batch, heads, qk, v, generator=g),
        torch.randn(batch, heads, qk, generator=g),
        torch.randn(batch, heads, 1, generator=g),
    )
    return q, k, value, igate, fgate, *(state if initial else (None, None, None))


@pytest.mark.parametrize("initial", [False, True])
@pytest.mark.parametrize("seq", [1, 3, 2 * CHUNK + 3])
def test_mlstm_kernel_equals_transformers_backend(seq: int, initial: bool) -> None:
    backend = modeling.xLSTMBackend(_config())
    operands = _operands(seq, initial)
    want_h, want_state = backend(*operands)
    got_h, got_state = backend_forward(backend, *operands)
    if seq < CHUNK:  # the step kernel, one token or a loop of them: the same operations
        torch.testing.assert_close(got_h, want_h, atol=0, rtol=0)
        for got, want in zip(got_state, want_state, strict=True):
            torch.testing.assert_close(got, want, atol=0, rtol=0)
    else:  # two chunks in the chunkwise form, then 3 steps: the same sums in another order
        torch.testing.assert_close(got_h, want_h, atol=1e-5, rtol=1e-5)
        for got, want in zip(got_state, want_state, strict=True):
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_mlstm_kernel_refuses_what_transformers_cannot_run() -> None:
    backend = modeling.xLSTMBackend(_config())
    q, k, v, i, f, c, n, m = _operands(2, True)
    with pytest.raises(ExportError, match="initial states given in part"):
        backend_forward(backend, q, k, v, i, f, c, None, m)
    with pytest.raises(ExportError, match="mode 'decode'"):
        backend_forward(backend, q, k, v, i, f, mode="decode")


def test_xlstm_cache_dict_is_read_and_written_as_recurrent_states() -> None:
    """``rnn_state``, a dict by layer of ``(C, n, m)`` tuples in a class outside transformers'
    ``Cache``, found by what it holds; the config types no state layer (attention layers)."""
    from irkit.llm import cache_layout
    from irkit.llm._states import fill_cache, read_states

    _require_state_layers()
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(_config()).eval()
    specs = cache_layout(model).states
    names = [f"past.{n}.recurrent{s}" for n in range(2) for s in ("", ".1", ".2")]
    assert [spec.past_name for spec in specs] == names
    assert [spec.shape for spec in specs[:3]] == [(2, 32, 32), (2, 32), (2, 1)]
    tensors = [torch.randn(3, *spec.shape) for spec in specs]
    cache = fill_cache(model.config, specs, tensors)
    assert isinstance(cache, modeling.xLSTMCache) and sorted(cache.rnn_state) == [0, 1]
    assert torch.equal(cache.rnn_state[1][2], tensors[5])
    assert torch.equal(cache.seqlen_offset, torch.zeros(1, dtype=torch.long))  # a fresh counter
    for got, want in zip(read_states(cache, specs), tensors, strict=True):
        assert torch.equal(got, want)


def test_xlstm_exports_with_its_states_and_runs_like_eager(tmp_path) -> None:
    _require_state_layers()
    torch.manual_seed(0)  # (one layer: the layers' states are the test above's; CI time)
    model = transformers.AutoModelForCausalLM.from_config(_config(num_hidden_layers=1)).eval()
    exported = export_causal_lm(model)
    states = ["past.0.recurrent", "past.0.recurrent.1", "past.0.recurrent.2"]
    assert exported.input_names == ["input_ids", "attention_mask", *states]
    lowered = irkit.lower(exported.program, **exported.lower_kwargs())
    irkit.optimize(lowered, target="onnx")
    irkit.save(lowered, tmp_path / "xlstm.onnx")
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(tmp_path / "xlstm.onnx"), options)
    # decode steps from random states; prefills from zeros and longer than two chunks from
    # random states (transformers' chunkwise form there)
    for batch, seq, past in [(1, 1, 4), (2, 1, 9), (2, 3, 0), (1, 2 * CHUNK + 3, 5)]:
        feeds = causal_lm_feeds(model, batch=batch, seq=seq, past=past, layout=exported.cache)
        if past == 0:
            feeds = {k: np.zeros_like(v) if k.startswith("past.") else v for k, v in feeds.items()}
        for want, got in zip(run_eager(model, feeds), session.run(None, feeds), strict=True):
            np.testing.assert_allclose(got, want, atol=2e-5, rtol=1e-4)
    ids = torch.tensor([[1, 1, 5, 17, 42, 9, 11], [3, 8, 6, 77, 4, 5, 6]])
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1], [1] * 7])  # left-padded, as generate pads
    want = model.generate(
        input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=12,
        eos_token_id=None, pad_token_id=1,
    )  # fmt: skip
    got = generate_greedy(session, ids.numpy(), mask.numpy(), max_new_tokens=12)
    np.testing.assert_array_equal(got, want.numpy())
    assert len(set(want[1, 7:].tolist())) >= 4  # varied ids, not one token repeated


def test_irkit_export_refuses_xlstm_before_tracing(tmp_path, monkeypatch) -> None:
    """genai 0.18 has no layer type for xLSTM's recurrent-only states: ``irkit export`` says so
    at once (exit 2, the kind and the model named), found by probing the cache of its own class
    (``xLSTMCache``, the forward's annotation), before any trace."""
    from irkit.cli import main
    from irkit.llm import _export

    _require_state_layers()
    folder = tmp_path / "xlstm"
    transformers.AutoModelForCausalLM.from_config(_config(num_hidden_layers=1)).save_pretrained(
        folder
    )

    def no_trace(*args: object, **kwargs: object) -> None:
        raise AssertionError("traced before refusing")

    monkeypatch.setattr(_export, "_trace_and_lower", no_trace)
    with pytest.raises(irkit.errors.LoweringOptionsError, match="'xlstm' model caches recurrent"):
        _export.export(folder, tmp_path / "out")
    assert main(["export", str(folder), "-o", str(tmp_path / "out"), "-q"]) == 2
    assert not (tmp_path / "out").exists()
