"""``irkit export`` / ``irkit.llm.export``: a Hugging Face folder → a folder onnxruntime-genai runs.

Tiny random-weight folders (``save_pretrained``: model, a byte-level BPE tokenizer trained here,
a chat template) are exported once per architecture with the command line, then run in
onnxruntime-genai's ``Generator`` (CPU, greedy, batch 1 and a right-padded batch of 2); the ids
must equal transformers ``generate`` on the left-padded prompts. The bad-input tests need no
model export.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import shutil

import onnx
import pytest

from irkit.cli import main
from irkit.errors import LoweringOptionsError, ModelLoadError, SaveError
from irkit.llm import export
from irkit.llm._export import tokenizer_files
from irkit.llm._genai_config import GENAI_LLM_TYPES, Decoder, genai_model_type, token_ids
from tests.llm import genai_support as gs

og = pytest.importorskip("onnxruntime_genai")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

PROMPTS = ["hello world the quick", "the lazy dog jumps over the brown fox"]
NEW_TOKENS = 12


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
    # tied embeddings (lm_head.weight is not in the shards), grouped-query attention
    "llama": lambda: transformers.LlamaConfig(
        **_ATTENTION, **_COMMON, num_key_value_heads=2, tie_word_embeddings=True
    ),
    # packed qkv and gate_up projections
    "phi3": lambda: transformers.Phi3Config(**_ATTENTION, **_COMMON, num_key_value_heads=4),
    # learned positions, Conv1D; genai's own "gpt2" type wants other inputs: written as "decoder"
    "gpt2": lambda: transformers.GPT2Config(
        n_embd=64, n_layer=2, n_head=4, n_positions=128, **_COMMON
    ),
}


FROM_MODEL = {"phi3"}  # exported from the loaded model, for target "ort"


def _save_folder(root: pathlib.Path, arch: str) -> pathlib.Path:
    import torch

    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(CONFIGS[arch]())
    return gs.save_folder(root / f"{arch}-hf", model, gs.tokenizer())


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory):
    """arch → (HF folder, exported folder), each exported once, with the command line."""
    root = tmp_path_factory.mktemp("export")
    done: dict[str, tuple[pathlib.Path, pathlib.Path]] = {}

    def get(arch: str) -> tuple[pathlib.Path, pathlib.Path]:
        if arch not in done:
            folder = _save_folder(root, arch)
            out = root / f"{arch}-onnx"
            out.mkdir()
            (out / "stale.txt").write_text("replaced by --overwrite")
            if arch in FROM_MODEL:  # irkit.llm.export of a loaded model, its own weights
                loaded = transformers.AutoModelForCausalLM.from_pretrained(folder)
                export(loaded, out, max_length=64, overwrite=True, target="ort")
            else:  # the command line, weights streamed from the folder
                argv = ["export", str(folder), "-o", str(out), "-q", "--overwrite"]
                assert main([*argv, "--max-length", "64"]) == 0
            done[arch] = (folder, out)
        return done[arch]

    return get


def _genai_ids(out: pathlib.Path, prompts: list[str]) -> list[list[int]]:
    return gs.genai_ids(out, prompts, NEW_TOKENS)


def _reference_ids(folder: pathlib.Path, prompts: list[str]) -> list[list[int]]:
    return gs.reference_ids(folder, prompts, NEW_TOKENS)


def _until_eos(ids: list[int], eos: int = 1) -> list[int]:
    return gs.until_eos(ids, eos)


@pytest.mark.slow
@pytest.mark.parametrize("arch", sorted(CONFIGS))
def test_genai_generator_matches_transformers_generate(exported, arch):
    folder, out = exported(arch)
    for prompts in (PROMPTS[:1], PROMPTS):
        got = [_until_eos([int(t) for t in ids]) for ids in _genai_ids(out, prompts)]
        want = [_until_eos(ids) for ids in _reference_ids(folder, prompts)]
        assert got == want, (arch, prompts)
        assert len(set(want[0])) > 1  # the tiny model does not just repeat one token


@pytest.mark.slow
def test_folder_contents_and_config(exported):
    folder, out = exported("llama")
    names = {p.name for p in out.iterdir()}
    assert names == {
        "model.onnx",
        "model.onnx.data",
        "genai_config.json",
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
    }
    config = json.loads((out / "genai_config.json").read_text())
    model, search = config["model"], config["search"]
    assert model["type"] == "llama"
    assert model["context_length"] == 128 and search["max_length"] == 64
    assert (model["bos_token_id"], model["eos_token_id"], model["pad_token_id"]) == (0, [1], 2)
    decoder = model["decoder"]
    assert (decoder["num_hidden_layers"], decoder["num_attention_heads"]) == (2, 4)
    assert (decoder["num_key_value_heads"], decoder["head_size"], decoder["hidden_size"]) == (
        2,
        16,
        64,
    )
    assert decoder["inputs"]["past_key_names"] == "past_key_values.%d.key"
    assert decoder["outputs"]["present_value_names"] == "present.%d.value"
    assert search["past_present_share_buffer"] is True  # the default: GroupQueryAttention owns it
    # the tied lm_head resolved to the embedding: the weights are written once
    data = (out / "model.onnx.data").stat().st_size
    assert data < 1.2 * sum(p.stat().st_size for p in folder.glob("*.safetensors"))
    # the chat template works on the exported folder
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hello"}], tokenize=False, add_generation_prompt=True
    )
    assert text == "<s>user: hello\nassistant:"
    # genai's own tokenizer loads the folder's and encodes as transformers does
    og_tokenizer = og.Tokenizer(og.Model(str(out)))
    for prompt in [*PROMPTS, text]:
        assert list(og_tokenizer.encode(prompt)) == tokenizer(prompt)["input_ids"], prompt
    assert og_tokenizer.decode(og_tokenizer.encode(PROMPTS[1])) == PROMPTS[1]
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".")]  # no temporary left
    assert not (out / "stale.txt").exists()  # --overwrite replaced the folder


@pytest.mark.slow
def test_a_loaded_model_takes_its_folder_files(exported):
    folder, out = exported("phi3")  # exported from AutoModelForCausalLM.from_pretrained(folder)
    assert {p.name for p in tokenizer_files(out)} == {p.name for p in tokenizer_files(folder)}
    assert json.loads((out / "config.json").read_text())["model_type"] == "phi3"
    assert json.loads((out / "genai_config.json").read_text())["model"]["type"] == "phi3"
    # target "ort": onnxruntime's contrib ops, which genai's CPU session runs
    model = onnx.load(out / "model.onnx", load_external_data=False)
    nodes = [*model.graph.node, *(n for f in model.functions for n in f.node)]
    assert {n.op_type for n in nodes if n.domain == "com.microsoft"} >= {"FusedMatMul"}


@pytest.mark.slow
def test_gpt2_is_a_generic_decoder(exported):
    _, out = exported("gpt2")
    assert json.loads((out / "genai_config.json").read_text())["model"]["type"] == "decoder"


@pytest.mark.slow
def test_concatenated_kv_cache_on_request(exported, tmp_path):
    """``--kv-buffer concat``: opset 23, past + new concatenated, the flag false; genai runs it."""
    folder, _ = exported("llama")
    out = tmp_path / "concat"
    argv = ["export", str(folder), "-o", str(out), "-q", "--kv-buffer", "concat"]
    assert main([*argv, "--max-length", "64"]) == 0
    config = json.loads((out / "genai_config.json").read_text())
    assert config["search"]["past_present_share_buffer"] is False
    model = onnx.load(out / "model.onnx", load_external_data=False)
    assert {o.version for o in model.opset_import if o.domain in ("", "ai.onnx")} == {23}
    assert not [n for n in model.graph.node if n.op_type == "TensorScatter"]
    for prompts in (PROMPTS[:1], PROMPTS):
        want = [_until_eos(ids) for ids in _reference_ids(folder, prompts)]
        assert [_until_eos([int(t) for t in ids]) for ids in _genai_ids(out, prompts)] == want


@pytest.mark.slow
def test_every_listed_genai_type_runs_the_same(exported, tmp_path):
    """genai 0.18 accepts each type irkit writes, and runs an irkit folder the same under it."""
    _, out = exported("llama")

    def run(model_type: str) -> list[list[int]]:
        folder = tmp_path / model_type
        shutil.copytree(out, folder)
        path = folder / "genai_config.json"
        config = json.loads(path.read_text())
        config["model"]["type"] = model_type
        path.write_text(json.dumps(config))
        ids = _genai_ids(folder, PROMPTS[:1])
        shutil.rmtree(folder)
        return ids

    want = run("decoder")
    for model_type in sorted(GENAI_LLM_TYPES):
        assert run(model_type) == want, model_type


@pytest.mark.slow
def test_max_length_and_kv_bytes(exported):
    """The default max_length is min(max_position_embeddings, 4096); the KV bytes it implies."""
    folder, _ = exported("llama")
    from irkit.llm._export import _max_length

    assert [p.name for p in tokenizer_files(folder)] == [
        "chat_template.jinja",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    decoder = Decoder("model.onnx", 2, 4, 2, 16, 64, 300, 128, True)
    assert _max_length(decoder, None) == 128
    assert _max_length(dataclasses.replace(decoder, context_length=131072), None) == 4096
    assert decoder.kv_bytes(64) == 2 * 2 * 2 * 16 * 64 * 4  # k+v, layers, heads, dim, tokens
    with pytest.raises(LoweringOptionsError, match="max_length 129 must be in 2..128"):
        _max_length(decoder, 129)


# ---------------------------------------------------------------- bad input (no export)


def _config_only(tmp_path: pathlib.Path, **extra) -> pathlib.Path:
    folder = tmp_path / "hf"
    folder.mkdir()
    config = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], **_COMMON, **extra}
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_folder_without_config(tmp_path, capsys):
    (tmp_path / "hf").mkdir()
    assert main(["export", str(tmp_path / "hf"), "-o", str(tmp_path / "out")]) == 2
    assert "config.json': missing" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_folder_without_safetensors(tmp_path, capsys):
    folder = _config_only(tmp_path)
    (folder / "pytorch_model.bin").write_bytes(b"")
    assert main(["export", str(folder), "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "no *.safetensors weights" in err and "safe_serialization=True" in err


@pytest.mark.slow  # imports transformers' config table (seconds)
def test_remote_code_needs_the_flag(tmp_path):
    folder = _config_only(
        tmp_path, model_type="my_own_lm", auto_map={"AutoModelForCausalLM": "m.MyLM"}
    )
    (folder / "model.safetensors").write_bytes(b"")
    with pytest.raises(ModelLoadError, match="--trust-remote-code"):
        export(folder, tmp_path / "out")


@pytest.mark.slow
def test_unknown_model_type(tmp_path):
    folder = _config_only(tmp_path, model_type="no_such_lm")
    (folder / "model.safetensors").write_bytes(b"")
    with pytest.raises(ModelLoadError, match="does not know model_type 'no_such_lm'"):
        export(folder, tmp_path / "out")


def test_non_empty_output_without_overwrite(tmp_path, capsys):
    folder = _config_only(tmp_path)
    (folder / "model.safetensors").write_bytes(b"")
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert main(["export", str(folder), "-o", str(out)]) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert (out / "keep.txt").read_text() == "mine"
    with pytest.raises(SaveError, match="not empty"):
        export(folder, out)


def test_missing_extra_names_it(tmp_path, capsys, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "transformers" else real(name)
    )
    assert main(["export", str(tmp_path), "-o", str(tmp_path / "out")]) == 2
    assert "pip install 'irkit[llm]'" in capsys.readouterr().err


def test_token_ids():
    ids = token_ids({"eos_token_id": [5, 9], "pad_token_id": None}, {"eos_token_id": 9})
    assert (ids.bos, ids.eos, ids.pad) == (None, (9, 5), 9)
    ids = token_ids({"eos_token_id": 3}, {"pad_token_id": 4, "bos_token_id": 0})
    assert (ids.bos, ids.eos, ids.pad) == (0, (3,), 4)
    with pytest.raises(LoweringOptionsError, match="eos_token_id"):
        token_ids({}, None)
    assert genai_model_type("gpt2") == "decoder" and genai_model_type("phi3") == "phi3"
