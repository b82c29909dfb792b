"""State-space / linear-attention / hybrid causal LMs: exported with their conv and recurrent
states, run in onnxruntime against eager PyTorch and in onnxruntime-genai's Generator against
transformers ``generate`` (one tiny model per cache kind and mixer: Qwen3.5 — gated delta rule,
conv and recurrent states, keys/values on its attention layer; LFM2 — conv state only)."""

from __future__ import annotations

import collections
import json
import pathlib

import numpy as np
import pytest

from tests.llm import genai_support as gs

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnxruntime_genai")

pytestmark = pytest.mark.slow

import irkit  # noqa: E402
from irkit.cli import main  # noqa: E402
from irkit.llm import causal_lm_feeds, export_causal_lm, generate_greedy, run_eager  # noqa: E402

VOCAB = 300
EOS = 1
# initializer_range 0.3: tiny random models then produce varied ids (not one token repeated)
_COMMON = dict(
    vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, bos_token_id=0, eos_token_id=EOS,
    pad_token_id=2, initializer_range=0.3,
)  # fmt: skip


def _qwen35() -> object:
    return transformers.Qwen3_5TextConfig(
        **_COMMON, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
        linear_key_head_dim=16, linear_value_head_dim=16,
        layer_types=["linear_attention", "full_attention"],
    )  # fmt: skip


def _lfm2() -> object:
    return transformers.Lfm2Config(
        **_COMMON, layer_types=["conv", "full_attention"], block_ff_dim=128,
        block_auto_adjust_ff_dim=False,
    )  # fmt: skip


def _model(config: object) -> object:
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config).eval()


@pytest.fixture(scope="module", params=["onnx", "ort"])
def qwen35_folder(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[pathlib.Path, object]:
    """A Qwen3.5 folder exported for each target: standard ops (the gated delta rule a ``Scan``
    in the kernel's function) and ``ort`` (onnxruntime's ``LinearAttention``)."""
    root = tmp_path_factory.mktemp(f"qwen35_{request.param}")
    model = _model(_qwen35())
    folder = gs.save_folder(root / "hf", model, gs.tokenizer(vocab_size=VOCAB))
    out = str(root / "out")
    assert main(["export", str(folder), "-o", out, "-q", "--target", request.param]) == 0
    return root, model


def test_qwen35_vision_language_checkpoint_exports_its_text_decoder(
    tmp_path: pathlib.Path,
) -> None:
    """Qwen3.5 is released as ``Qwen3_5ForConditionalGeneration`` (a text decoder beside a
    vision tower, weights under ``model.language_model.*`` and ``model.visual.*``): ``irkit
    export`` of such a folder writes the text decoder, which genai runs as transformers
    ``generate`` does on text (batch 1 and a right-padded batch 2)."""
    text = _qwen35().to_dict()
    vision = dict(
        depth=1, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=4,
        out_hidden_size=64, num_position_embeddings=16,
    )  # fmt: skip
    config = transformers.Qwen3_5Config(text_config=text, vision_config=vision)
    torch.manual_seed(0)
    vlm = transformers.Qwen3_5ForConditionalGeneration(config).eval()
    folder = gs.save_folder(tmp_path / "hf", vlm, gs.tokenizer(vocab_size=VOCAB))
    out = tmp_path / "out"
    assert main(["export", str(folder), "-o", str(out), "-q", "--target", "ort"]) == 0
    prompts = ["hello world the quick", "the lazy dog jumps over the brown fox and hello world"]
    for batch in (prompts[:1], prompts):
        got = [gs.until_eos(ids, EOS) for ids in gs.genai_ids(out, batch, 16)]
        want = [gs.until_eos(ids, EOS) for ids in gs.reference_ids(folder, batch, 16, vlm)]
        assert got == want
        assert max(len(set(ids)) for ids in want) >= 6  # varied ids, not one token repeated


def _op_counts(path: pathlib.Path) -> collections.Counter:
    import onnx

    proto = onnx.load(str(path), load_external_data=False)
    graphs = [proto.graph, *proto.functions]
    return collections.Counter(f"{n.domain}::{n.op_type}" for g in graphs for n in g.node)


def _check_against_eager(path: pathlib.Path, model: object, layout: object) -> None:
    session = ort.InferenceSession(str(path))
    # decode, prefill, decode on a batch, and a prefill longer than the chunked fallback's chunk
    for batch, seq, past in [(1, 1, 4), (2, 7, 0), (2, 1, 9), (1, 70, 3)]:
        feeds = causal_lm_feeds(model, batch=batch, seq=seq, past=past, layout=layout)
        for want, got in zip(run_eager(model, feeds), session.run(None, feeds), strict=True):
            np.testing.assert_allclose(got, want, atol=5e-5, rtol=1e-4)


def test_qwen35_names_and_genai_config(qwen35_folder) -> None:
    root, _ = qwen35_folder
    counts = _op_counts(root / "out" / "model.onnx")
    # text positions make the interleaved M-RoPE's select/slice scatters writes of what is there
    assert counts["::ScatterND"] == counts["::ScatterElements"] == 0  # (irkit.rules.uniform)
    if "qwen35_ort" in root.name:  # the recurrence is onnxruntime's kernel, no Scan is left
        assert counts["com.microsoft::LinearAttention"] == 1
        assert counts["::Scan"] == 0
        # the conv over (state, x) and the decay gate are onnxruntime's kernels too
        assert counts["com.microsoft::CausalConvWithState"] == 1 and counts["::Conv"] == 0
        assert counts["com.microsoft::LinearAttentionGate"] == 1
    else:  # standard ops: one call of the kernel's function, a Scan in its body
        assert counts["irkit_kernels::gated_delta"] == 1
        assert counts["::Scan"] == 1 and counts["com.microsoft::LinearAttention"] == 0
    _assert_conv_state_is_chosen_once(root / "out" / "model.onnx", "qwen35_ort" in root.name)
    session = ort.InferenceSession(str(root / "out" / "model.onnx"))
    names = {arg.name: arg.shape for arg in session.get_inputs()}
    # layer 0 (gated delta net): conv state (batch, 2·16·2 + 4·16, K - 1), recurrent state
    assert names["past.0.conv"][1:] == [128, 3]
    assert names["past.0.recurrent"][1:] == [4, 16, 16]
    assert "past_key_values.1.key" in names and "past_key_values.0.key" not in names
    decoder = json.loads((root / "out" / "genai_config.json").read_text())["model"]["decoder"]
    assert decoder["layer_types"] == ["linear_attention", "full_attention"]
    assert decoder["conv_cache_size"] == 3
    assert decoder["inputs"]["past_conv_names"] == "past.%d.conv"
    assert decoder["outputs"]["present_recurrent_names"] == "present.%d.recurrent"
    # (this tiny config's partial rotary stays outside GroupQueryAttention: position_ids is read
    # on both targets, an input of the model and of genai's config alike)
    assert "position_ids" in names and decoder["inputs"]["position_ids"] == "position_ids"


def _assert_conv_state_is_chosen_once(path: pathlib.Path, contrib: bool) -> None:
    """The new conv state is one ``If`` in the main graph: where every row's last token is real
    (each decode step), the layer's own last ``K − 1`` columns (``CausalConvWithState``'s second
    output under ``ort``) and no gather; else each row's columns gathered at its last real
    token."""
    import onnx

    proto = onnx.load(str(path), load_external_data=False)
    (choice,) = [n for n in proto.graph.node if n.op_type == "If"]
    assert list(choice.output) == ["present.0.conv"]
    branches = {a.name: a.g for a in choice.attribute}
    assert [n.op_type for n in branches["then_branch"].node] == ["Identity"]
    assert "GatherElements" in {n.op_type for n in branches["else_branch"].node}
    everywhere = [n for g in (proto.graph, *proto.functions) for n in g.node]
    gathers = {n.name for n in everywhere if n.op_type == "GatherElements"}
    assert all(name.startswith("last_token_logits_") for name in gathers)  # (the logits' only)
    if contrib:  # (the op's new state leaves its function: no Concat of the state and x left)
        (conv,) = [n for n in everywhere if n.op_type == "CausalConvWithState"]
        assert len(conv.output) == 2 and conv.output[1]
        assert not [n for n in everywhere if n.op_type == "Concat" and conv.input[3] in n.input]


def test_qwen35_genai_generator_equals_generate(qwen35_folder) -> None:
    root, model = qwen35_folder
    prompts = ["hello world the quick", "the lazy dog jumps over the brown fox and hello world"]
    for batch in (prompts[:1], prompts):  # genai right-pads the shorter prompt of the batch
        got = [gs.until_eos(ids, EOS) for ids in gs.genai_ids(root / "out", batch, 24)]
        want = [gs.until_eos(ids, EOS) for ids in gs.reference_ids(root / "hf", batch, 24, model)]
        assert got == want
        assert max(len(set(ids)) for ids in want) >= 8  # varied ids, not one token repeated


def test_lfm2_conv_state_in_onnxruntime(tmp_path: pathlib.Path) -> None:
    model = _model(_lfm2())
    exported = export_causal_lm(model)
    assert exported.input_names[3:] == [
        "past_key_values.1.key", "past_key_values.1.value", "past.0.conv",
    ]  # fmt: skip
    lowered = irkit.lower(exported.program, **exported.lower_kwargs())
    irkit.optimize(lowered, target="onnx")
    irkit.save(lowered, tmp_path / "lfm2.onnx")
    _check_against_eager(tmp_path / "lfm2.onnx", model, exported.cache)
    session = ort.InferenceSession(str(tmp_path / "lfm2.onnx"))
    ids = torch.tensor([[2, 2, 5, 17, 42, 9, 11], [3, 8, 1, 77, 4, 5, 6]])
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1], [1] * 7])  # left-padded, as generate pads
    want = model.generate(
        input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=12,
        eos_token_id=None, pad_token_id=2,
    )  # fmt: skip
    got = generate_greedy(session, ids.numpy(), mask.numpy(), max_new_tokens=12)
    np.testing.assert_array_equal(got, want.numpy())


_MAMBA2_LAYOUT = dict(
    mamba_n_heads=8, mamba_d_head=16, mamba_n_groups=1, mamba_d_state=16, mamba_chunk_size=16,
)  # fmt: skip


@pytest.mark.parametrize(
    ("config_class", "options"),
    [
        # (Mamba1, selective_scan_fn, runs end to end in genai below)
        # Mamba2 (mamba_chunk_scan_combined) beside an attention layer, MoE MLPs
        (
            "GraniteMoeHybridConfig",
            dict(
                layer_types=["mamba", "attention"],
                num_local_experts=4,
                num_experts_per_tok=2,
                shared_intermediate_size=64,
                **_MAMBA2_LAYOUT,
            ),  # fmt: skip
        ),
    ],
)
def test_state_space_mixers_in_onnxruntime(
    config_class: str, options: dict, tmp_path: pathlib.Path
) -> None:
    common = {k: v for k, v in _COMMON.items() if k != "vocab_size"}
    model = _model(getattr(transformers, config_class)(**common, vocab_size=256, **options))
    exported = export_causal_lm(model)
    assert {"conv", "recurrent"} <= set(exported.cache.kinds)
    lowered = irkit.lower(exported.program, **exported.lower_kwargs())
    irkit.optimize(lowered, target="onnx")
    irkit.save(lowered, tmp_path / "model.onnx")
    session = ort.InferenceSession(str(tmp_path / "model.onnx"))
    # decode steps from random states; prefills (longer than a Mamba2 chunk) from zero states
    # (transformers' Mamba1 mixers start every multi-token step from zeros)
    for batch, seq, past in [(1, 1, 4), (2, 1, 9), (2, 7, 0), (1, 40, 0)]:
        feeds = causal_lm_feeds(model, batch=batch, seq=seq, past=past, layout=exported.cache)
        if seq > 1:
            feeds = {k: np.zeros_like(v) if k.startswith("past.") else v for k, v in feeds.items()}
        for want, got in zip(run_eager(model, feeds), session.run(None, feeds), strict=True):
            np.testing.assert_allclose(got, want, atol=2e-4, rtol=1e-3)
    ids = torch.tensor([[0, 0, 5, 17, 42, 9, 11], [3, 8, 1, 77, 4, 5, 6]])
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1], [1] * 7])
    want = model.generate(
        input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=12,
        eos_token_id=None, pad_token_id=0,
    )  # fmt: skip
    got = generate_greedy(session, ids.numpy(), mask.numpy(), max_new_tokens=12)
    np.testing.assert_array_equal(got, want.numpy())
    assert len(set(want[1, 7:].tolist())) >= 4


def test_mamba_folder_without_attention_in_genai(tmp_path: pathlib.Path) -> None:
    """A cache of states only (no key/value input at all): no KV buffer to share, every layer
    ``linear_attention`` in genai_config.json, genai's ids equal ``generate``'s."""
    common = {k: v for k, v in _COMMON.items() if k != "vocab_size"}
    model = _model(transformers.MambaConfig(**common, vocab_size=VOCAB, state_size=16, expand=2))
    folder = gs.save_folder(tmp_path / "hf", model, gs.tokenizer(vocab_size=VOCAB))
    assert main(["export", str(folder), "-o", str(tmp_path / "out"), "-q"]) == 0
    config = json.loads((tmp_path / "out" / "genai_config.json").read_text())
    decoder = config["model"]["decoder"]
    assert decoder["layer_types"] == ["linear_attention"] * 2
    assert "past_key_names" not in decoder["inputs"]
    assert config["search"]["past_present_share_buffer"] is False
    prompts = ["hello world the quick", "the lazy dog jumps over the brown fox and hello world"]
    for batch in (prompts[:1], prompts):
        got = [gs.until_eos(ids, EOS) for ids in gs.genai_ids(tmp_path / "out", batch, 24)]
        want = [gs.until_eos(ids, EOS) for ids in gs.reference_ids(folder, batch, 24, model)]
        assert got == want


@pytest.mark.parametrize(
    ("model_type", "names"),
    [
        ("inkling2_text", ["past_key_values.1.key", "past.0.conv", "past.1.conv.3"]),
        # (inkling2_loop_text, whose loop passes append cache layers, takes 110 s: in the sweep)
        ("deepseek_v32", ["past_key_values.1.key", "past.1.indexer_key"]),
    ],
)
def test_more_states_than_a_layer_and_kind(model_type: str, names: list, tmp_path) -> None:
    """Inkling2 keeps four convolution states per layer (transformers' ``state_idx``) beside
    its keys and values: ``past.N.conv``, ``past.N.conv.1``, … (its windows' ``flip`` makes
    torch guard ``sequence < 4``, a layout decision the export relaxes; the 6-token prompt
    is past it); Inkling2-Loop also appends cache layers for its later
    loop passes itself (ten cache layers for six decoder layers); DeepSeek-V3.2's sparse
    attention indexer caches its own keys (``past.N.indexer_key``, growing like the keys). Each
    exports and runs in onnxruntime equal to ``generate`` (left-padded batch of two); genai,
    which maps keys/values and one state of a kind per layer, is refused with one error."""
    from bench.tiny_config import tiny_model
    from irkit.errors import LoweringOptionsError
    from irkit.llm._export import _genai_layer_types

    model = tiny_model(model_type)
    exported = export_causal_lm(model)
    assert set(names) <= set(exported.input_names)
    assert {
        n.replace("past_key_values.", "present.").replace("past.", "present.") for n in names
    } <= set(exported.output_names)
    lowered = irkit.lower(exported.program, **exported.lower_kwargs())
    irkit.optimize(lowered, target="onnx")
    irkit.save(lowered, tmp_path / "model.onnx")
    session = ort.InferenceSession(str(tmp_path / "model.onnx"))
    ids = torch.tensor([[7, 7, 5, 17, 42, 9], [3, 8, 11, 77, 4, 5]])
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1] * 6])
    want = model.generate(
        input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=8,
        eos_token_id=None, pad_token_id=7,
    )  # fmt: skip
    got = generate_greedy(session, ids.numpy(), mask.numpy(), max_new_tokens=8, pad_token_id=7)
    np.testing.assert_array_equal(got, want.numpy())
    with pytest.raises(LoweringOptionsError, match=r"caches .*(conv #2|indexer_key)"):
        _genai_layer_types(model_type, exported.cache, model.config)


@pytest.mark.parametrize("model_type", ["qwen3_next", "olmo_hybrid"])
def test_recurrent_state_update_traces_without_an_in_place_write(model_type: str) -> None:
    """transformers' ``LinearAttentionLayer`` copies a new recurrent state into the cache tensor
    in place; the export assigns it instead, so the program writes none of its inputs and
    ``irkit.lower`` needs no second, functionalizing trace (a tiny Qwen3-Next's lowering: 3.9 s
    with it, 0.8 s without). Exactness: the sweep (``--only qwen3_next,olmo_hybrid`` exact on
    both targets) and the mixers' tests above."""
    from bench.tiny_config import tiny_model
    from irkit.lowering._plan import make_plan, needs_functionalization
    from irkit.lowering._registry import LoweringTable

    exported = export_causal_lm(tiny_model(model_type))
    assert "recurrent" in exported.cache.kinds
    program = exported.program
    writes = [n for n in program.graph.nodes if n.target is torch.ops.aten.copy_.default]
    plan = make_plan(program.graph, LoweringTable(None, decompose_custom_ops=True))
    assert needs_functionalization(program.graph, plan) == [], writes
