"""``irkit export --kv-buffer shared``: one KV buffer of ``max_length`` in onnxruntime-genai.

Each architecture (tiny config of :data:`tests.llm_zoo.ZOO`, random weights, the local
byte-level BPE tokenizer) is exported with ``--kv-buffer shared`` (opset 24, ``TensorScatter``
into the buffer, ``past_present_share_buffer: true``) and run in genai's ``Generator`` (CPU,
greedy): batch 1, then a batch of 2 that genai right-pads; the new ids must equal transformers
``generate`` on the same prompts left-padded. Prompt plus new tokens run past the zoo's sliding
window (gemma2).
"""

from __future__ import annotations

import json
import pathlib
from collections import Counter

import pytest

from irkit.cli import main
from tests.llm import genai_support as gs
from tests.llm_zoo import EXTRA, SLIDING_WINDOW, ZOO

og = pytest.importorskip("onnxruntime_genai")
transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

pytestmark = pytest.mark.slow

VOCAB = 320
SPECIALS = ("<pad>", "<s>", "</s>")  # the zoo's ids: pad 0, bos 1, eos 2
EOS = 2
NEW_TOKENS = 16
MAX_LENGTH = 64
PROMPTS = ["hello world the quick", "the lazy dog jumps over the brown fox"]
ARCHS = {arch.name: arch for arch in (*ZOO, *EXTRA)}
SHARED = ("llama", "qwen2", "gemma2", "gpt2")


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory):
    """arch → (HF folder, shared-buffer folder, the transformers model), each exported once."""
    root = tmp_path_factory.mktemp("genai-shared")
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
            out = root / f"{name}-shared"
            argv = ["export", str(folder), "-o", str(out), "-q", "--kv-buffer", "shared"]
            assert main([*argv, "--max-length", str(MAX_LENGTH)]) == 0
            done[name] = (folder, out, model)
        return done[name]

    return get


def _before_eos(ids: list[int]) -> list[int]:
    return ids[: ids.index(EOS)] if EOS in ids else ids


@pytest.mark.parametrize("name", SHARED)
def test_shared_buffer_generator_equals_generate(exported, name):
    folder, out, model = exported(name)
    config = json.loads((out / "genai_config.json").read_text())
    assert config["search"]["past_present_share_buffer"] is True
    import onnx

    proto = onnx.load(str(out / "model.onnx"), load_external_data=False)
    assert {o.domain: o.version for o in proto.opset_import}[""] == 24
    ops = Counter(n.op_type for f in proto.functions for n in f.node)
    ops.update(n.op_type for n in proto.graph.node)
    layers = config["model"]["decoder"]["num_hidden_layers"]
    assert ops["TensorScatter"] >= 2  # key and value (a layer function is shared by the layers)
    assert ops["TensorScatter"] <= 2 * layers
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    shortest = min(len(tokenizer(p)["input_ids"]) for p in PROMPTS)
    assert shortest + NEW_TOKENS > SLIDING_WINDOW
    lengths = []
    for prompts in (PROMPTS[:1], PROMPTS):
        got = [_before_eos(ids) for ids in gs.genai_ids(out, prompts, NEW_TOKENS)]
        want = [_before_eos(ids) for ids in gs.reference_ids(folder, prompts, NEW_TOKENS, model)]
        assert got == want, (name, prompts)
        lengths += [len(ids) for ids in want]
    assert max(lengths) >= 8  # the comparison is not only an early eos
