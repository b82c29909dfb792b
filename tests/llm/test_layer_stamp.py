"""The proof that decoder layers are interchangeable (irkit.llm._stamp.layer_period) and the
layer cut for the trace (cut_layers)."""

from __future__ import annotations

import collections

import pytest

from irkit.llm._stamp import cut_layers, layer_period
from tests.llm_zoo import ZOO

pytestmark = pytest.mark.slow  # builds transformers models

_ARCHS = {arch.name: arch for arch in ZOO}


def _model(name: str, layers: int = 4, **overrides: object):
    import torch
    import transformers

    config = _ARCHS[name].config()
    config.num_hidden_layers = layers
    if getattr(config, "layer_types", None):
        config.layer_types = (list(config.layer_types) * layers)[:layers]
    for key, value in overrides.items():
        setattr(config, key, value)
    torch.manual_seed(0)
    return getattr(transformers, _ARCHS[name].model_class)(config).eval()


@pytest.mark.parametrize(
    ("name", "period"),
    [("llama", 1), ("mistral", 1), ("qwen3_moe", 1), ("gpt_neox", 1), ("gemma2", 2)],
)
def test_period(name: str, period: int) -> None:
    found = layer_period(_model(name))
    assert (found.period, found.layers, found.reason) == (period, 4, "")
    assert found.path.endswith("layers")
    assert found.index_attributes and all(a.endswith("layer_idx") for a in found.index_attributes)


def test_gpt2_reads_layer_index_refused() -> None:
    # GPT2Attention scales by 1/(layer_idx+1) under a flag: the layer index is read
    found = layer_period(_model("gpt2"))
    assert found.period is None
    assert "GPT2Attention.forward reads the layer index" in found.reason


def test_custom_forward_reading_layer_index_refused() -> None:
    from transformers.models.llama.modeling_llama import LlamaAttention

    class Scaled(LlamaAttention):
        def forward(self, hidden_states, *args, **kwargs):  # type: ignore[no-untyped-def]
            return super().forward(hidden_states / (self.layer_idx + 1), *args, **kwargs)

    model = _model("llama")
    for layer in model.model.layers:
        layer.self_attn.__class__ = Scaled
    found = layer_period(model)
    assert found.period is None
    assert "Scaled.forward reads the layer index" in found.reason
    assert "self.layer_idx" in found.reason


def test_non_periodic_layers_take_a_prefix() -> None:
    # qwen2: sliding window from layer max_window_layers on: full, sliding, sliding, sliding —
    # no period, but the first two layers hold an equal of every later one
    model = _model("qwen2", layer_types=["full_attention", *["sliding_attention"] * 3])
    found = layer_period(model)
    assert (found.period, found.sources, found.reason) == (2, (0, 1, 1, 1), "")
    assert [found.source(i) for i in range(4)] == [0, 1, 1, 1]


def test_dense_first_layers_take_a_prefix() -> None:
    # DeepSeek-V3: first_k_dense_replace dense layers (another MLP class), then MoE layers
    found = layer_period(_model("deepseek_v3", layers=6))
    assert (found.period, found.sources, found.reason) == (2, (0, 1, 1, 1, 1, 1), "")


def test_shared_parameters_refused() -> None:
    # Zamba2's hybrid layers share one transformer block: a stamp would rename its weights
    model = _model("llama")
    model.model.layers[2].mlp = model.model.layers[0].mlp
    found = layer_period(model)
    assert found.period is None
    assert found.reason == "model.layers.2.mlp.gate_proj.weight is a parameter of layer 0 too"


def test_different_attribute_refused() -> None:
    # the last layer's attention differs from every other: no period, and no prefix of at
    # most N / 2 layers holds an equal of it
    model = _model("llama")
    model.model.layers[3].self_attn.scaling = 0.5
    found = layer_period(model)
    assert found.period is None
    assert "self_attn.scaling differs between layer 3 and layer 0" in found.reason
    assert "no prefix of at most 2 layers holds an equal of every later one" in found.reason
    assert "(layer 3 equals none of the first 2)" in found.reason


def test_too_few_layers() -> None:
    found = layer_period(_model("gemma2", layers=3))
    assert found.period is None and "P=1" in found.reason  # P=2 needs 4 layers


def test_meta_buffers_need_values() -> None:
    import torch

    model = _model("llama")
    for layer in model.model.layers:
        layer.register_buffer("table", torch.ones(2, device="meta"))
    found = layer_period(model)
    assert found.period is None and "no value to compare" in found.reason
    values = {f"model.layers.{i}.table": torch.ones(2) for i in range(4)}
    assert layer_period(model, buffers=values).period == 1
    values["model.layers.2.table"] = torch.zeros(2)
    assert "buffers model.layers.2.table and model.layers.0.table differ" in (
        layer_period(model, buffers=values).reason
    )


def test_cut_layers_restores() -> None:
    model = _model("gemma2")
    found = layer_period(model)
    layers, types = model.model.layers, list(model.config.layer_types)
    with cut_layers(model, found) as cut:
        assert len(cut.model.layers) == 2 and cut.config.num_hidden_layers == 2
        assert cut.config.layer_types == types[:2]
    assert model.model.layers is layers and model.config.num_hidden_layers == 4
    assert model.config.layer_types == types
    with pytest.raises(RuntimeError), cut_layers(model, found):
        raise RuntimeError("trace failed")
    assert model.model.layers is layers and model.config.layer_types == types


def test_cut_layers_trace() -> None:
    from irkit.llm import export_causal_lm

    model = _model("llama")
    with cut_layers(model, layer_period(model)):
        exported = export_causal_lm(model)
    assert exported.num_layers == 1
    assert exported.input_names[-2:] == ["past_key_values.0.key", "past_key_values.0.value"]
    assert len(model.model.layers) == 4


def _histogram(model) -> collections.Counter:
    counts = collections.Counter((n.domain, n.op_type) for n in model.graph)
    for function in model.functions.values():
        counts.update((n.domain, n.op_type) for n in function)
    return counts


def _stamped_and_full(name: str, model=None):
    """The model (``_model(name)`` unless given), its export, and its lowering traced whole
    and stamped from its traced layers."""
    import onnx_ir as ir

    import irkit
    from irkit.llm import export_causal_lm
    from irkit.llm._stamp import stamp_layers

    model = _model(name) if model is None else model
    found = layer_period(model)
    exported = export_causal_lm(model)
    full = irkit.lower(exported.program, **exported.lower_kwargs())
    with cut_layers(model, found):
        cut = export_causal_lm(model)
    stamped = irkit.lower(cut.program, **cut.lower_kwargs())
    state = model.state_dict()
    stamp_layers(stamped, found, lambda n: ir.tensor(state[n].detach().numpy(), name=n))
    return model, exported, full, stamped


def _run(model, feeds) -> list:
    import onnx_ir as ir
    import onnxruntime as ort

    proto = ir.to_proto(model).SerializeToString()
    session = ort.InferenceSession(proto, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


# (gemma2, whose layers alternate sliding and full attention, is stamped and compared with its
# full trace, whole folders, in test_export_layer_reuse_same_folder)
@pytest.mark.parametrize("name", ["llama", "mistral", "gpt_neox", "qwen3_moe"])
def test_stamped_equals_full_trace(name: str) -> None:
    import numpy as np

    from irkit.llm import causal_lm_feeds

    model, exported, full, stamped = _stamped_and_full(name)
    for kind in ("inputs", "outputs"):
        expected = [v.name for v in getattr(full.graph, kind)]
        assert [v.name for v in getattr(stamped.graph, kind)] == expected
    assert sorted(stamped.graph.initializers) == sorted(full.graph.initializers)
    for key, value in full.graph.initializers.items():
        assert stamped.graph.initializers[key].shape == value.shape
    if name != "qwen3_moe":
        # (the full trace of the MoE model gives its first layer a second copy of the layer
        # functions, Qwen3MoeDecoderLayer_1 …: same computation, one function fewer stamped)
        assert _histogram(stamped) == _histogram(full)
        assert set(stamped.functions) == set(full.functions)
        for key, function in full.functions.items():
            assert len(stamped.functions[key].inputs) == len(function.inputs)
            assert len(stamped.functions[key].outputs) == len(function.outputs)
    for batch, seq, past in ((2, 3, 5), (1, 1, 7), (1, 6, 0)):
        feeds = causal_lm_feeds(model, batch=batch, seq=seq, past=past, layout=exported.cache)
        for a, b in zip(_run(full, feeds), _run(stamped, feeds), strict=True):
            np.testing.assert_array_equal(a, b)


def _assert_same_folders(full, stamped) -> None:
    """The same graph inputs and outputs, op histogram (graph and functions) and
    ``genai_config.json``."""
    import json

    import onnx

    protos = [onnx.load(d / "model.onnx") for d in (full, stamped)]
    for kind in ("input", "output"):
        names = [[v.name for v in getattr(p.graph, kind)] for p in protos]
        assert names[0] == names[1]
    counts = [
        collections.Counter(n.op_type for graph in (p.graph, *p.functions) for n in graph.node)
        for p in protos
    ]
    assert counts[0] == counts[1]
    configs = [json.loads((d / "genai_config.json").read_text()) for d in (full, stamped)]
    assert configs[0] == configs[1]


def test_a_failing_stamp_traces_every_layer(tmp_path, monkeypatch) -> None:
    """Anything the stamp did not foresee falls back to the full trace, with the reason."""
    import irkit.llm._stamp as stamp
    from irkit.llm import export

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("unforeseen graph")

    monkeypatch.setattr(stamp, "stamp_layers", broken)
    model = _model("llama")
    model.save_pretrained(tmp_path / "src")
    lines: list[str] = []
    export(tmp_path / "src", tmp_path / "out", log=lines.append)
    assert any(
        "layer reuse off (stamp_layers: RuntimeError: unforeseen graph); tracing every layer" in x
        for x in lines
    )
    assert (tmp_path / "out" / "model.onnx").exists()


@pytest.mark.parametrize(("name", "target"), [("llama", "onnx"), ("gemma2", "ort")])
def test_export_layer_reuse_same_folder(name: str, target: str, tmp_path) -> None:

    import numpy as np

    from irkit.cli import main
    from irkit.llm import export

    model = _model(name)
    model.save_pretrained(tmp_path / "src")
    lines: list[str] = []
    export(tmp_path / "src", tmp_path / "stamped", target=target, log=lines.append)
    assert any(f"traced {layer_period(model).period} of 4 decoder layers" in x for x in lines)
    assert (
        main(
            [
                "export",
                str(tmp_path / "src"),
                "-o",
                str(tmp_path / "full"),
                "--target",
                target,
                "--no-layer-reuse",
                "--quiet",
            ]
        )
        == 0
    )
    _assert_same_folders(tmp_path / "full", tmp_path / "stamped")
    feeds = {
        "input_ids": np.array([[5, 6, 7], [8, 9, 10]]),
        "attention_mask": np.ones((2, 3), np.int64),
    }
    results = []
    for d in ("full", "stamped"):
        import onnxruntime as ort

        session = ort.InferenceSession(
            str(tmp_path / d / "model.onnx"), providers=["CPUExecutionProvider"]
        )
        run = dict(feeds)
        for arg in session.get_inputs():
            if arg.name == "position_ids":
                run[arg.name] = np.tile(np.arange(3), (2, 1))
            elif arg.name.startswith("past_key_values."):
                run[arg.name] = np.zeros((2, arg.shape[1], 16, arg.shape[3]), np.float32)
        names = [o.name for o in session.get_outputs()]
        results.append(dict(zip(names, session.run(None, run), strict=True)))
    assert list(results[0]) == list(results[1])
    for name, a in results[0].items():
        b = results[1][name]
        if name.startswith("present."):  # the 3 positions written: the rest of a buffer
            a, b = a[:, :, :3], b[:, :, :3]  # bounded to its window is not written (garbage)
        np.testing.assert_array_equal(a, b)


def _state_model(kind: str):
    """Tiny hybrid models: Qwen3.5 (3 gated-delta-net layers, then attention: ``P = 4``),
    LFM2 (conv and attention layers at no period: the first 3 traced), Mamba2 (``P = 1``)."""
    import torch
    import transformers

    common = dict(
        vocab_size=300, hidden_size=64, bos_token_id=0, eos_token_id=1, pad_token_id=2,
        initializer_range=0.3,
    )  # fmt: skip
    attention = dict(intermediate_size=128, num_attention_heads=4, num_key_value_heads=2)
    if kind == "qwen3_5":
        config = transformers.Qwen3_5TextConfig(
            **common, **attention, num_hidden_layers=8, head_dim=16, linear_num_key_heads=2,
            linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
            layer_types=(["linear_attention"] * 3 + ["full_attention"]) * 2,
        )  # fmt: skip
    elif kind == "lfm2":  # (attention layers at no period, as in LFM2's checkpoints)
        config = transformers.Lfm2Config(
            **common, **attention, num_hidden_layers=7, block_ff_dim=128,
            layer_types=["conv", "conv", "full_attention", "conv", "full_attention", "conv", "conv"],
            block_auto_adjust_ff_dim=False,
        )  # fmt: skip
    else:
        config = transformers.Mamba2Config(
            **common, num_hidden_layers=3, num_heads=4, head_dim=32, state_size=16, n_groups=1,
            expand=2,
        )  # fmt: skip
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config).eval()


def test_index_attribute_on_some_layers_only() -> None:
    # Qwen3.5's linear_attn.layer_idx is on its linear-attention layers only, self_attn's on
    # its attention layers only: each is still the layer index where it is
    found = layer_period(_state_model("qwen3_5"))
    assert (found.period, found.layers, found.reason) == (4, 8, "")
    assert {"linear_attn.layer_idx", "self_attn.layer_idx"} <= set(found.index_attributes)


# (Qwen3.5, P = 4, is exported both ways, whole folders, in
# test_export_state_model_layer_reuse_in_genai)
@pytest.mark.parametrize(("kind", "period"), [("lfm2", 3), ("mamba2", 1)])
def test_stamped_state_model_equals_full_trace(kind: str, period: int) -> None:
    """Conv and recurrent states stamped too: their inputs' ``Pad``/``Identity`` in front of
    the layer call, and the held conv states' ``If``, which gets the stamped layers' outputs."""
    import numpy as np

    from irkit.llm import causal_lm_feeds

    model = _state_model(kind)
    assert layer_period(model).period == period
    model, exported, full, stamped = _stamped_and_full(kind, model)
    for kind_ in ("inputs", "outputs"):
        expected = [v.name for v in getattr(full.graph, kind_)]
        assert [v.name for v in getattr(stamped.graph, kind_)] == expected
    assert any(name.startswith("past.") for name in exported.input_names)
    assert sorted(stamped.graph.initializers) == sorted(full.graph.initializers)
    for batch, seq, past in ((2, 3, 5), (1, 1, 7), (2, 6, 0)):
        feeds = causal_lm_feeds(model, batch=batch, seq=seq, past=past, layout=exported.cache)
        if seq > 1:  # (a prefill from zero states; the second row right-padded)
            feeds = {k: np.zeros_like(v) if k.startswith("past.") else v for k, v in feeds.items()}
            if batch == 2:
                feeds["attention_mask"][1, -2:] = 0
        for a, b in zip(_run(full, feeds), _run(stamped, feeds), strict=True):
            np.testing.assert_array_equal(a, b)


def test_export_state_model_layer_reuse_in_genai(tmp_path) -> None:
    """``irkit export`` of a hybrid model with layer reuse: the folder of the full trace
    (inputs, outputs, op histogram, genai_config.json) and genai's ids equal ``generate``'s on
    a right-padded batch."""

    from irkit.llm import export
    from tests.llm import genai_support as gs

    model = _state_model("qwen3_5")
    folder = gs.save_folder(tmp_path / "hf", model, gs.tokenizer(vocab_size=300))
    lines: list[str] = []
    export(folder, tmp_path / "stamped", log=lines.append)
    assert any("traced 4 of 8 decoder layers" in x for x in lines)
    export(folder, tmp_path / "full", layer_reuse=False)
    _assert_same_folders(tmp_path / "full", tmp_path / "stamped")
    prompts = ["a b c d e f g h i j k l m n o p q r s t", "b c d e f g"]
    want = gs.reference_ids(folder, prompts, 24, model)
    assert gs.genai_ids(tmp_path / "stamped", prompts, 24) == want
