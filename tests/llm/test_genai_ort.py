"""``irkit export --target ort``: ``GroupQueryAttention`` on onnxruntime-genai's shared KV buffer.

Tiny random-weight folders (as in ``tests/llm/test_export.py``: model, a byte-level BPE tokenizer
trained here) are exported with ``target="ort"``; the folder's ``genai_config.json`` says
``past_present_share_buffer: true`` and genai's ``Generator`` (CPU, greedy) runs batch 1 and a
right-padded batch of 2; the ids must equal transformers ``generate`` on the left-padded prompts.
The prompts + generation run past the models' sliding windows.
"""

from __future__ import annotations

import collections
import json
import pathlib

import onnx
import pytest

from irkit.llm import export
from irkit.rules import ort

og = pytest.importorskip("onnxruntime_genai")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

PROMPTS = ["hello world the quick", "the lazy dog jumps over the brown fox hello world"]
NEW_TOKENS = 16
MAX_LENGTH = 64
_TEXT = ["hello world, the quick brown fox jumps over the lazy dog"] * 20 + ["user assistant"] * 5


def _tokenizer() -> transformers.PreTrainedTokenizerFast:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<s>", "</s>", "<pad>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_TEXT, trainer)
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )


_COMMON = dict(
    vocab_size=300, bos_token_id=0, eos_token_id=1, pad_token_id=2, initializer_range=0.2
)
_ATTENTION = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    max_position_embeddings=128,
)
CONFIGS = {
    "llama": lambda: transformers.LlamaConfig(**_ATTENTION, **_COMMON, num_key_value_heads=2),
    # packed qkv and gate_up projections
    "phi3": lambda: transformers.Phi3Config(**_ATTENTION, **_COMMON, num_key_value_heads=4),
    # a parallel block: q/k/v and fc1 read one norm; the packing rule takes all four, the
    # attention's part is cut out again so that GroupQueryAttention reads it whole
    # (heads of 32: the partial rotary's 16 channels are what onnxruntime's kernel rotates)
    "phi": lambda: transformers.PhiConfig(
        **{**_ATTENTION, "num_attention_heads": 2}, **_COMMON, num_key_value_heads=1
    ),
    # the q/k/v bias Add
    "qwen2": lambda: transformers.Qwen2Config(**_ATTENTION, **_COMMON, num_key_value_heads=2),
    # a sliding window on every layer, shorter than prompt + generation: local_window_size
    "mistral": lambda: transformers.MistralConfig(
        **_ATTENTION, **_COMMON, num_key_value_heads=2, sliding_window=6
    ),
    # learned positions, no rotary; 4 query and 4 key/value heads
    "gpt2": lambda: transformers.GPT2Config(
        n_embd=64, n_layer=2, n_head=4, n_positions=128, **_COMMON
    ),
    # ALiBi, eager attention: GroupQueryAttention with attention_bias = slope_h * j
    "mpt": lambda: transformers.MptConfig(
        d_model=64, n_heads=4, n_layers=2, expansion_ratio=2, max_seq_len=128, **_COMMON
    ),
    # ALiBi through baddbmm in a (batch * heads, S, T) layout, the bias from attention_mask
    "bloom": lambda: transformers.BloomConfig(hidden_size=64, n_layer=2, n_head=4, **_COMMON),
    # local (sliding, rope base 10k) and global (rope base 1M) layers, query_pre_attn_scalar
    "gemma3": lambda: transformers.Gemma3TextConfig(
        **_ATTENTION,
        **{**_COMMON, "initializer_range": 0.05},  # (0.2: the tiny model repeats one token)
        num_key_value_heads=2,
        head_dim=16,
        sliding_window=6,
        layer_types=["sliding_attention", "full_attention"],
    ),
}


def _llama_rope(**rope) -> transformers.LlamaConfig:
    return transformers.LlamaConfig(
        **_ATTENTION,
        **_COMMON,
        num_key_value_heads=2,
        rope_parameters={"rope_theta": 10000.0, **rope},
    )


ROPE_CONFIGS = {
    "linear": lambda: _llama_rope(rope_type="linear", factor=2.0),
    "llama3": lambda: _llama_rope(
        rope_type="llama3",
        factor=8.0,
        low_freq_factor=1.0,
        high_freq_factor=4.0,
        original_max_position_embeddings=16,
    ),
    "yarn": lambda: _llama_rope(rope_type="yarn", factor=4.0, original_max_position_embeddings=32),
}
CONFIGS.update(ROPE_CONFIGS)
# both factor sets, long factors up to 16: the prompts + generation run past
# original_max_position_embeddings. transformers' Phi3 ``generate`` drops its KV cache when the
# sequence crosses that length and recomputes every key with the long factors
# (``Phi3ForCausalLM.prepare_inputs_for_generation``); genai keeps the cache, keys rotated with
# the factors of their step, as does transformers' own forward with a kept cache: the reference
# here (:func:`_kept_cache_ids`; ``generate`` gives other ids two tokens past the switch).
CONFIGS["longrope"] = lambda: transformers.Phi3Config(
    **_ATTENTION,
    **_COMMON,
    num_key_value_heads=4,
    original_max_position_embeddings=16,
    rope_parameters={
        "rope_type": "longrope",
        "rope_theta": 10000.0,
        "short_factor": [1.0, 1.1, 1.2, 1.5, 2.0, 2.5, 3.0, 4.0],
        "long_factor": [1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 16.0],
        "original_max_position_embeddings": 16,
    },
)


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory):
    """arch → (HF folder, exported folder), each exported once with ``target="ort"``."""
    import torch

    root = tmp_path_factory.mktemp("genai_ort")
    done: dict[str, tuple[pathlib.Path, pathlib.Path]] = {}

    def get(arch: str) -> tuple[pathlib.Path, pathlib.Path]:
        if arch not in done:
            folder = root / f"{arch}-hf"
            torch.manual_seed(0)
            model = transformers.AutoModelForCausalLM.from_config(CONFIGS[arch]())
            model.save_pretrained(folder)
            _tokenizer().save_pretrained(folder)
            out = root / f"{arch}-ort"
            export(folder, out, target="ort", max_length=MAX_LENGTH)
            done[arch] = (folder, out)
        return done[arch]

    return get


def _genai_ids(out: pathlib.Path, prompts: list[str]) -> list[list[int]]:
    model = og.Model(str(out))
    tokenizer = og.Tokenizer(model)
    params = og.GeneratorParams(model)
    longest = max(len(tokenizer.encode(p)) for p in prompts)
    params.set_search_options(
        max_length=longest + NEW_TOKENS, do_sample=False, batch_size=len(prompts)
    )
    generator = og.Generator(model, params)
    generator.append_tokens(tokenizer.encode_batch(prompts))
    while not generator.is_done():
        generator.generate_next_token()
    # genai right-pads: prompt, pads up to the longest prompt, then the new tokens
    return [[int(t) for t in generator.get_sequence(i)][longest:] for i in range(len(prompts))]


def _reference_ids(folder: pathlib.Path, prompts: list[str]) -> list[list[int]]:
    import torch

    model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    tokenizer.padding_side = "left"
    batch = tokenizer(prompts, return_tensors="pt", padding=True)
    with torch.no_grad():
        ids = model.generate(**batch, max_new_tokens=NEW_TOKENS, do_sample=False)
    return ids[:, batch["input_ids"].shape[1] :].tolist()


def _kept_cache_ids(folder: pathlib.Path, prompts: list[str]) -> list[list[int]]:
    """Greedy ids from transformers' forward, one token a step, the KV cache always kept
    (left-padded prompts, positions from the mask), as genai runs the model."""
    import torch

    model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    tokenizer.padding_side = "left"
    batch = tokenizer(prompts, return_tensors="pt", padding=True)
    ids, mask = batch["input_ids"], batch["attention_mask"]
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    new: list[torch.Tensor] = []
    past = None
    with torch.no_grad():
        for _ in range(NEW_TOKENS):
            out = model(
                ids,
                attention_mask=mask,
                position_ids=positions,
                past_key_values=past,
                use_cache=True,
            )
            past, ids = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
            new.append(ids)
            mask = torch.cat([mask, torch.ones_like(ids)], dim=1)
            positions = positions[:, -1:] + 1
    return torch.cat(new, dim=1).tolist()


def _until_eos(ids: list[int], eos: int = 1) -> list[int]:
    return ids[: ids.index(eos) + 1] if eos in ids else ids


def _nodes(model: onnx.ModelProto, op_type: str) -> list[onnx.NodeProto]:
    nodes = [*model.graph.node, *(n for f in model.functions for n in f.node)]
    return [n for n in nodes if n.op_type == op_type]


def _ops(out: pathlib.Path) -> collections.Counter[tuple[str, str]]:
    model = onnx.load(out / "model.onnx", load_external_data=False)
    nodes = [*model.graph.node, *(n for f in model.functions for n in f.node)]
    return collections.Counter((n.domain, n.op_type) for n in nodes)


@pytest.mark.slow
@pytest.mark.parametrize("arch", sorted(CONFIGS))
def test_shared_buffer_generator_matches_transformers(exported, arch):
    folder, out = exported(arch)
    config = json.loads((out / "genai_config.json").read_text())
    assert config["search"]["past_present_share_buffer"] is True
    ops = _ops(out)
    assert ops[("com.microsoft", "GroupQueryAttention")] >= 1
    assert ops[("", "Attention")] == 0
    # the rotations moved into the op, with cos/sin caches of max_length rows
    assert ops[("", "RotaryEmbedding")] == ops[("com.microsoft", "RotaryEmbedding")] == 0
    model = onnx.load(out / "model.onnx", load_external_data=False)
    for node in _nodes(model, "GroupQueryAttention"):
        attributes = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        assert attributes.get("do_rotary") == (None if arch in ("gpt2", "mpt", "bloom") else 1), (
            attributes
        )
        # the op reads the packed [Q | K | V] projection (PackedQKVAttention[Slices]); not
        # where a per-head norm (gemma3's q/k norms) or the eager ALiBi form sits in between
        packed = list(node.input[1:3]) == ["", ""]
        assert packed == (arch not in ("gemma3", "mpt", "bloom")), list(node.input)
    # genai builds position_ids each step only for a graph that reads them: learned positions
    # (gpt2); the op's own rotation and ALiBi by slot read none, and the folder has no such input
    reads_positions = arch == "gpt2"
    assert ("position_ids" in {i.name for i in model.graph.input}) == reads_positions
    assert ("position_ids" in config["model"]["decoder"]["inputs"]) == reads_positions
    if arch == "phi":  # q/k/v packed into the op, fc1 its own product: no Split's copy
        assert ops[("", "Split")] == 0, ops
        # and the attention's module call stays one function: the op and its q/k/v product in
        # it, fc1's product in the layer (a cut node in the layer's scope split it in two)
        (attention,) = [f for f in model.functions if f.name.startswith("PhiAttention")]
        histogram = [n.op_type for n in attention.node]
        assert histogram == ["MatMul", "Add", "GroupQueryAttention", "Linear"], histogram
    if arch == "llama":  # packed q/k/v straight into the op: no Split, no reshapes around it
        (attention,) = [f for f in model.functions if f.name == "LlamaAttention"]
        histogram = collections.Counter(n.op_type for n in attention.node)
        assert histogram == {
            "MatMul": 1,  # the packed q/k/v projection
            "GroupQueryAttention": 1,
            "Linear": 1,  # o_proj
        }, histogram
        assert all(n.input[1] == n.input[2] == "" for n in _nodes(model, "GroupQueryAttention"))
    for prompts in (PROMPTS[:1], PROMPTS):
        got = [_until_eos(ids) for ids in _genai_ids(out, prompts)]
        reference = _kept_cache_ids if arch == "longrope" else _reference_ids
        want = [_until_eos(ids) for ids in reference(folder, prompts)]
        assert got == want, (arch, prompts)
        assert len(set(want[0])) > 1  # the tiny model does not just repeat one token


@pytest.mark.slow
def test_fp16_model_on_the_shared_buffer(exported, tmp_path):
    """A float16 model (q/k/v bias, dynamic batch, past): GroupQueryAttention in float16, run by
    genai on onnxruntime's CPU kernels, greedy ids equal to the float32 model's generate."""
    import torch

    folder, _ = exported("qwen2")
    half = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float16)
    out = tmp_path / "qwen2-fp16"
    written = export(half, out, target="ort", max_length=MAX_LENGTH, precision="fp16")
    assert written.genai_config["search"]["past_present_share_buffer"] is True
    model = onnx.load(out / "model.onnx", load_external_data=False)
    assert {i.type.tensor_type.elem_type for i in model.graph.input if "past" in i.name} == {
        onnx.TensorProto.FLOAT16
    }
    assert _ops(out)[("com.microsoft", "GroupQueryAttention")] >= 1
    assert _ops(out)[("", "RotaryEmbedding")] == 0  # float16 caches inside the op
    for node in _nodes(model, "GroupQueryAttention"):
        attributes = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        assert attributes["do_rotary"] == 1, attributes
    for prompts in (PROMPTS[:1], PROMPTS):
        got = [_until_eos(ids) for ids in _genai_ids(out, prompts)]
        want = [_until_eos(ids) for ids in _reference_ids(folder, prompts)]
        assert got == want, prompts


@pytest.mark.slow
@pytest.mark.parametrize(("arch", "windows"), [("mistral", {6}), ("gemma3", {6, None})])
def test_sliding_windows_and_own_rope_caches(exported, arch, windows):
    """Sliding layers get local_window_size = sliding_window, global layers none; gemma3's local
    layers rotate with their own base: two different cos caches."""
    _, out = exported(arch)
    model = onnx.load(out / "model.onnx")
    found = set()
    caches = set()
    values = {i.name: i for i in model.graph.initializer}
    for node in _nodes(model, "GroupQueryAttention"):
        attributes = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        found.add(attributes.get("local_window_size"))
        caches.add(onnx.numpy_helper.to_array(values[node.input[7]]).tobytes())
    assert found == windows
    assert len(caches) == len(windows)


@pytest.mark.slow
@pytest.mark.parametrize(("arch", "layers"), [("mistral", [0, 1]), ("gemma3", [0])])
def test_windowed_layers_get_buffers_of_their_window(exported, arch, layers):
    """genai's bounded cache: the windowed layers listed under ``decoder.sliding_window``, their
    GroupQueryAttention ``sliding_window_cache=1`` reading ``Max(seqlens_k, Min(S, C) - 1)``
    (computed once, in the main graph), their buffers' sequence axis named apart; a global layer
    keeps the max_length buffer."""
    _, out = exported(arch)
    config = json.loads((out / "genai_config.json").read_text())
    assert config["model"]["decoder"]["sliding_window"] == {
        "window_size": 6,
        "slide_key_value_cache": False,
        "slide_inputs": False,
        "layers": layers,
        "cache_slack": 0,
    }
    model = onnx.load(out / "model.onnx", load_external_data=False)
    main = {o: n for n in model.graph.node for o in n.output}
    producers = {o: n for n in _nodes(model, "Max") for o in n.output}
    for value, node in list(main.items()):  # a function reads hoist/K/F/v as hoisted.v
        if value.startswith("hoist/"):
            main["hoisted." + value.split("/", 3)[3]] = node
    marks = []
    for node in _nodes(model, "GroupQueryAttention"):
        attributes = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        windowed = attributes.get("local_window_size", -1) > 0
        assert attributes.get("sliding_window_cache", 0) == int(windowed), attributes
        assert node.input[5].endswith("/windowed_seqlens_k") == windowed, node.input[5]
        if windowed:  # (hoisted where the function runs more than once: the main graph's)
            taken = main.get(node.input[5]) or producers[node.input[5]]
            assert taken.op_type == "Max" and taken.input[1] == "windowed_cache/floor"
        marks.append(windowed)
    assert any(marks)
    assert main["windowed_cache/floor"].op_type == "Cast"
    dims = {
        v.name: v.type.tensor_type.shape.dim[2].dim_param
        for v in [*model.graph.input, *model.graph.output]
        if v.name.startswith(("past_key_values.", "present."))
    }
    for name, dim in dims.items():
        layer = int(name.split(".")[-2])
        assert ("past_window_sequence" in dim) == (layer in layers), (name, dim)


@pytest.fixture(scope="module")
def mistral_unbounded(exported, tmp_path_factory):
    """The mistral folder exported with every layer on the max_length buffer
    (``--kv-buffer shared``)."""
    from irkit.cli import main

    folder, _ = exported("mistral")
    out = tmp_path_factory.mktemp("unbounded") / "mistral"
    argv = ["export", str(folder), "-o", str(out), "-q", "--kv-buffer", "shared"]
    assert main([*argv, "--max-length", str(MAX_LENGTH)]) == 0
    config = json.loads((out / "genai_config.json").read_text())
    assert config["search"]["past_present_share_buffer"] is True
    assert "sliding_window" not in config["model"]["decoder"]
    model = onnx.load(out / "model.onnx", load_external_data=False)
    for node in _nodes(model, "GroupQueryAttention"):
        assert "sliding_window_cache" not in {a.name for a in node.attribute}
    return out


LONG = "the quick brown fox jumps over the lazy dog hello world " * 2


@pytest.mark.slow
def test_windowed_buffers_past_their_capacity(exported, mistral_unbounded):
    """A prompt longer than the bounded buffer (window 6 + genai's CPU slack 16), and a padded
    batch within it: the same ids as on the max_length buffer (which equals transformers
    above). A padded batch whose prompt is longer than the buffer is refused by onnxruntime,
    never answered wrong."""
    _, out = exported("mistral")
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    assert len(tokenizer(LONG)["input_ids"]) > 6 + 16
    for prompts in ([LONG], ["hi", "the lazy dog jumps over the brown fox hello world quick"]):
        assert _genai_ids(out, prompts) == _genai_ids(mistral_unbounded, prompts), prompts
    with pytest.raises(Exception, match="too small for sequence_length"):
        _genai_ids(out, ["hi", LONG])
    assert len(_genai_ids(mistral_unbounded, ["hi", LONG])) == 2


# The zoo's ALiBi, MLA, softcap and longrope architectures under --target ort (GroupQueryAttention
# on the shared buffer, genai's ids equal transformers'): tests/llm/test_genai_zoo_0.py, with
# genai_zoo.check_ort_attention on the same folders.


ALIBI_PROMPTS = [
    PROMPTS,
    ["hi", "the lazy dog jumps over the brown fox and more"],
    ["the quick brown fox", "x"],
    ["hello", "hello world the quick brown", "a"],
]


@pytest.mark.slow
@pytest.mark.parametrize("shared", [True, False], ids=["shared", "concat"])
@pytest.mark.parametrize("target", ["onnx", "ort"])
def test_alibi_right_padded_batches(exported, tmp_path, target, shared):
    """mpt (ALiBi by a constant table sliced per step) in genai's right-padded batches of prompts
    of several lengths. The cache keeps a shorter prompt's pads in their slots (the shared buffer
    on target onnx, the concatenated cache on both targets), so the bias must count token
    positions, not slots (by slot the shorter rows diverged); on the shared buffer of target ort
    GroupQueryAttention keeps each row's keys together."""
    folder, out = exported("mpt")  # (target ort, shared buffer)
    if (target, shared) != ("ort", True):
        out = tmp_path / f"mpt-{target}-{shared}"
        export(folder, out, target=target, max_length=MAX_LENGTH, share_buffer=shared)
    config = json.loads((out / "genai_config.json").read_text())
    assert config["search"]["past_present_share_buffer"] is shared
    ops = _ops(out)
    if (target, shared) == ("ort", True):
        assert ops[("com.microsoft", "GroupQueryAttention")] >= 1
    else:  # the positions once, in the main graph
        assert ops[("", "CumSum")] == 1
        assert ops[("", "TensorScatter")] >= (2 if shared else 0)
    for prompts in ALIBI_PROMPTS:
        got = [_until_eos(ids) for ids in _genai_ids(out, prompts)]
        want = [_until_eos(ids) for ids in _reference_ids(folder, prompts)]
        assert got == want, (target, shared, prompts)


@pytest.mark.slow
def test_mla_absorbed_cache_is_group_query_attention():
    """deepseek_v3's MLA is exported in absorbed form (:mod:`irkit.llm.kernels.mla`): the cache
    holds one key head ``[latent | k_pe]`` and one value head (the latent, zero-padded to the
    same width), appended right before the attention, so the ``Attention`` has a past and
    presents and ``GroupQueryAttention`` owns the shared buffer, one per layer, with no
    standard ``Attention`` left. (transformers 5.24's own forward caches the latent and
    ``k_pe`` and decompresses the whole cache each step: ``Attention has 1 outputs, pattern
    uses 3``.)"""
    import irkit
    from irkit.llm import export_causal_lm
    from irkit.llm._causal_lm import cache_layout, pad_value_cache
    from tests.llm_zoo import BY_NAME

    lm = BY_NAME["deepseek_v3"].model()
    config = lm.config
    layout = cache_layout(lm)
    head = (1, config.kv_lora_rank + config.qk_rope_head_dim)
    assert layout.keys == layout.values == (head,) * config.num_hidden_layers
    exported = export_causal_lm(lm)
    model = irkit.lower(exported.program, **exported.lower_kwargs())
    pad_value_cache(model, exported.cache)
    report = irkit.RewriteReport()
    irkit.optimize(
        model,
        target="ort",
        rules=ort.default_rules(gqa_shared_buffer=MAX_LENGTH),
        explain="GroupQueryAttentionKVCache",
        report=report,
    )
    assert "no near misses" in report.explain(limit=100)
    assert ort.attention.group_query_attentions(model) == config.num_hidden_layers
    assert ort.attention.runs_on_shared_buffer(model, config.num_hidden_layers)
    ops = {n.op_type for n in model.graph} | {
        n.op_type for f in model.functions.values() for n in f
    }
    assert "Attention" not in ops
