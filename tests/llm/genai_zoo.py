"""The causal-LM zoo through ``irkit export`` and genai's ``Generator`` (``test_genai_zoo_*.py``).

Each architecture of :data:`tests.llm_zoo.ZOO` (tiny config, random weights, vocabulary widened
to :data:`VOCAB` for the local tokenizer) is saved with ``save_pretrained`` beside a byte-level
BPE tokenizer and a chat template, exported once per target with ``irkit export`` (target ort,
the default: ``GroupQueryAttention`` on the shared buffer; and target onnx: ``TensorScatter`` and
``Attention``; fp32, the weights streamed from the folder), and run in genai's ``Generator`` (CPU, greedy): batch 1, then
a batch of 2 that genai right-pads; the new ids must equal transformers ``generate`` on the same
prompts left-padded. Prompt plus new tokens run past the zoo's sliding window (8 tokens) and past
the longrope phi3's ``original_max_position_embeddings``. genai's own tokenizer must encode the
folder's prompts as transformers does, and ``apply_chat_template`` must work on the folder.

Mixture-of-experts folders (qwen3_moe, mixtral, deepseek_v3) hold one tensor per expert: the
stacked expert weights are streamed as recipes over them. deepseek_v3's MLA is exported in
absorbed form: one key and one value head of ``kv_lora_rank + qk_rope_head_dim``. Constants that ``forward`` builds
(falcon's list indices, longrope's factors) are real although the model is built on ``meta``
(``irkit.llm._meta.fake_weights``).
"""

from __future__ import annotations

import collections
import json
import pathlib
from typing import Any

import pytest

from irkit.cli import main
from tests.llm import genai_support as gs
from tests.llm_zoo import EXTRA, SLIDING_WINDOW, ZOO

og = pytest.importorskip("onnxruntime_genai")
transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")


VOCAB = 320  # 256 bytes + the specials + merges; the zoo's 256 is too small for a byte-level BPE
SPECIALS = ("<pad>", "<s>", "</s>")  # the zoo's ids: pad 0, bos 1, eos 2
EOS = 2
NEW_TOKENS = 16
MAX_LENGTH = 64
PROMPTS = ["hello world the quick", "the lazy dog jumps over the brown fox"]
ARCHS = {arch.name: arch for arch in (*ZOO, *EXTRA)}


def make_exported(tmp_path_factory: pytest.TempPathFactory, target: str | None = None):
    """arch → (HF folder, exported folder, the transformers model), each exported once with
    ``irkit export`` (``--target target``; ``None``: the command's default)."""
    root = tmp_path_factory.mktemp(f"genai-zoo-{target or 'default'}")
    tokenizer = gs.tokenizer(vocab_size=VOCAB, specials=SPECIALS)
    done: dict[str, tuple[pathlib.Path, pathlib.Path, object]] = {}

    def get(name: str) -> tuple[pathlib.Path, pathlib.Path, object]:
        if name not in done:
            import torch

            arch = ARCHS[name]
            config = arch.config()
            config.vocab_size = VOCAB
            torch.manual_seed(0)
            model = getattr(transformers, arch.model_class)(config).eval()
            folder = gs.save_folder(root / f"{name}-hf", model, tokenizer)
            out = root / f"{name}-onnx"
            argv = ["export", str(folder), "-o", str(out), "-q"]
            if target is not None:
                argv += ["--target", target]
            assert main([*argv, "--max-length", str(MAX_LENGTH)]) == 0
            done[name] = (folder, out, model)
        return done[name]

    return get


def _before_eos(ids: list[int]) -> list[int]:
    return ids[: ids.index(EOS)] if EOS in ids else ids


#: Targets each folder is exported for: ``irkit export``'s default (``ort``) and ``onnx``.
TARGETS = ("ort", "onnx")
"""Part 0 (ALiBi, MLA, softcap, longrope, MoE, llama) runs on both; parts 1 and 2 on the default
``ort`` only, to keep the suite's time (every part on both targets: 114 cases, ~4 min more)."""
#: Under target ``ort``, architectures whose attention ``GroupQueryAttention`` does not take (they
#: share the buffer as target ``onnx`` does, ``TensorScatter``): none now — deepseek_v3's MLA is
#: exported in absorbed form (``irkit.llm.kernels.mla``), a cache the op owns.
STANDARD_UNDER_ORT: frozenset[str] = frozenset()


def check_shared_buffer(out: pathlib.Path, target: str = "onnx", name: str = "") -> None:
    """The export shares the KV buffer (the flag true): under target ``ort`` one
    ``GroupQueryAttention`` per cached layer owns it and no other attention is left; under
    target ``onnx`` (and for :data:`STANDARD_UNDER_ORT`) opset 24, ``TensorScatter`` into the
    buffer (key and value of each cached layer, a layer function counted once)."""
    import onnx
    import onnx_ir as ir

    from irkit.rules import ort

    config = json.loads((out / "genai_config.json").read_text())
    assert config["search"]["past_present_share_buffer"] is True
    proto = onnx.load(str(out / "model.onnx"), load_external_data=False)
    ops = collections.Counter(n.op_type for f in proto.functions for n in f.node)
    ops.update(n.op_type for n in proto.graph.node)
    layers = config["model"]["decoder"]["num_hidden_layers"]
    if target == "ort" and name not in STANDARD_UNDER_ORT:
        assert ort.attention.runs_on_shared_buffer(ir.load(out / "model.onnx"), layers)
        assert ops["Attention"] == ops["TensorScatter"] == 0
        return
    assert {o.domain: o.version for o in proto.opset_import}[""] == 24
    assert 2 <= ops["TensorScatter"] <= 2 * layers
    assert ops["GroupQueryAttention"] == 0


#: Under target ``ort``, what the folder's ``GroupQueryAttention`` takes over beyond the shared
#: buffer (:func:`check_ort_attention`), by architecture: the rotation folded into the op
#: (``do_rotary``)? Not for deepseek_v3 (MLA: the rotation turns only the k_pe part of the head)
#: nor bloom and mpt (ALiBi: ``attention_bias``).
ORT_ATTENTION: dict[str, bool] = {
    "gemma2": True,  # eager attention, softcap, a sliding window on alternate layers
    "phi3_longrope": True,  # both factor sets: the short and the long caches, switched
    "deepseek_v3": False,
    "bloom": False,
    "mpt": False,
}


def _attributes(node: Any) -> dict[str, Any]:
    import onnx

    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def check_ort_attention(out: pathlib.Path, name: str, model: Any) -> None:
    """Under target ``ort``, architecture ``name``'s attention is all ``GroupQueryAttention``:
    the rotation inside the op where :data:`ORT_ATTENTION` says so (no ``RotaryEmbedding``
    left), gemma2's softcap on every layer and its window on the sliding ones, the longrope
    phi3's cos/sin caches chosen by a ``Where`` on the total length."""
    import onnx

    proto = onnx.load(str(out / "model.onnx"), load_external_data=False)
    nodes = [*proto.graph.node, *(n for f in proto.functions for n in f.node)]
    gqa = [n for n in nodes if n.op_type == "GroupQueryAttention"]
    assert gqa, name
    assert not [n for n in nodes if n.op_type in ("Attention", "Softmax")], name
    if ORT_ATTENTION[name]:
        assert not [n for n in nodes if n.op_type == "RotaryEmbedding"], name
        assert {_attributes(n).get("do_rotary") for n in gqa} == {1}, name
    if name == "gemma2":
        assert {_attributes(n).get("softcap") for n in gqa} == {model.config.attn_logit_softcapping}
        windows = {_attributes(n).get("local_window_size") for n in gqa}
        assert windows == {model.config.sliding_window, None}, windows
    if name == "phi3_longrope":
        producers = {o: n for n in nodes for o in n.output}
        for value, node in list(producers.items()):  # computed once (irkit.rules.hoist)
            if value.startswith("hoist/"):
                producers["hoisted." + value.split("/", 3)[3]] = node
        for node in gqa:  # cos, sin: the short or the long caches
            assert [producers[node.input[i]].op_type for i in (7, 8)] == ["Where"] * 2


def check_generator(exported, name: str, target: str = "onnx") -> None:
    folder, out, model = exported(name)
    check_shared_buffer(out, target, name)
    if target == "ort" and name in ORT_ATTENTION:
        check_ort_attention(out, name, model)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    shortest = min(len(tokenizer(p)["input_ids"]) for p in PROMPTS)
    assert shortest + NEW_TOKENS > SLIDING_WINDOW  # windowed layers see a full window
    lengths = []
    for prompts in (PROMPTS[:1], PROMPTS):
        got = [_before_eos(ids) for ids in gs.genai_ids(out, prompts, NEW_TOKENS)]
        want = [_before_eos(ids) for ids in gs.reference_ids(folder, prompts, NEW_TOKENS, model)]
        assert got == want, (name, target, prompts)
        lengths += [len(ids) for ids in want]
    assert max(lengths) >= 8  # the comparison is not only an early eos


def check_tokenizer(exported, name: str) -> None:
    _, out, _ = exported(name)
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hello"}], tokenize=False, add_generation_prompt=True
    )
    assert text == "<s>user: hello\nassistant:"
    og_tokenizer = og.Tokenizer(og.Model(str(out)))
    for prompt in [*PROMPTS, text]:
        assert list(og_tokenizer.encode(prompt)) == tokenizer(prompt)["input_ids"], prompt


def part(index: int, parts: int = 3) -> list[str]:
    """The architectures of part ``index`` (of ``parts``): files run in parallel under xdist."""
    return sorted(ARCHS)[index::parts]


def check_longrope(exported) -> None:
    """The longrope phi3's prompt takes the short factors, its last tokens the long ones."""
    folder, _, model = exported("phi3_longrope")
    original = model.config.original_max_position_embeddings
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    assert (
        len(tokenizer(PROMPTS[1])["input_ids"])
        < original
        < len(tokenizer(PROMPTS[1])["input_ids"]) + NEW_TOKENS
    )  # the prompt takes the short factors, the last tokens the long ones
