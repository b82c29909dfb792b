"""``irkit export``: progress on a terminal (none in a pipe), and bad input.

Every bad input is one irkit error, exit 2 from the command, naming the file and the fix, and
leaves nothing behind (no ``OUT_DIR``, no temporary folder beside it; an existing ``OUT_DIR``
untouched). The tests that need a real export (the terminal, the full disk) use a tiny
random-weight llama folder and are slow.
"""

from __future__ import annotations

import errno
import io
import json
import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import onnx_ir as ir
import pytest

import irkit
from irkit.cli import main
from irkit.errors import ModelLoadError, SaveError
from irkit.llm import export
from irkit.llm._progress import Progress

ROOT = pathlib.Path(__file__).resolve().parents[2]


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _leftovers(parent: pathlib.Path, name: str) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith(f".{name}."))


# ---------------------------------------------------------------- progress (no model export)


def test_progress_on_a_terminal_shows_stage_tensors_mb_and_rate():
    stream, clock = _Terminal(), _Clock()
    progress = Progress(stream, clock=clock, interval=1.0)
    progress.stage("writing out/model.onnx")
    progress.start_writing(3, 3_000_000)
    for step in range(3):
        clock.now += 0.5
        progress.tensor_written(f"w{step}", 1_000_000)
    progress.finish_writing()
    progress.note("search.max_length 64: KV cache 0.1 MiB per sequence")
    lines = stream.getvalue().split("\n")
    assert lines[0] == "     0.0 s  writing out/model.onnx"
    # redrawn in place: the first tensor, the third (last), then the final figures
    redraws = lines[1].split("\r")[1:]
    assert [r.strip() for r in redraws] == [
        "tensors 1/3, 1/3 MB, 2 MB/s",
        "tensors 3/3, 3/3 MB, 2 MB/s",
        "tensors 3/3, 3/3 MB, 2 MB/s",
    ]
    assert lines[2] == "  search.max_length 64: KV cache 0.1 MiB per sequence"


@pytest.mark.parametrize("stream", [io.StringIO(), _Terminal()], ids=["pipe", "quiet-terminal"])
def test_progress_silent_in_a_pipe_and_when_quiet(stream):
    progress = Progress(stream, quiet=isinstance(stream, _Terminal))
    progress.stage("lowering")
    progress.start_writing(1, 10)
    progress.tensor_written("w", 10)
    progress.finish_writing()
    notes = "" if isinstance(stream, _Terminal) else "  a note\n"
    progress.note("a note")
    assert stream.getvalue() == notes


def test_save_calls_progress_after_each_external_tensor(tmp_path):
    model = ir.from_onnx_text(
        '<ir_version: 10, opset_import: ["" : 21]> g (float[1000] x) => (float[1000] y) '
        "{ t = Add(x, a)  y = Mul(t, b) }"
    )
    for name in ("a", "b"):
        value = next(v for n in model.graph for v in n.inputs if v is not None and v.name == name)
        value.const_value = ir.tensor(np.full(1000, 2.0, np.float32), name=name)
        model.graph.register_initializer(value)
    seen: list[tuple[str, int]] = []
    irkit.save(model, tmp_path / "m.onnx", external_data=True, progress=lambda *a: seen.append(a))
    assert seen == [("a", 4000), ("b", 4000)]


# ---------------------------------------------------------------- bad input (no model export)


def _config_only(tmp_path: pathlib.Path, **config) -> pathlib.Path:
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "model.safetensors").write_bytes(b"")
    return folder


@pytest.mark.slow  # imports transformers (seconds)
def test_an_architecture_transformers_cannot_build(tmp_path, capsys):
    folder = _config_only(tmp_path, model_type="vit", architectures=["ViTModel"])
    out = tmp_path / "out"
    assert main(["export", str(folder), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"{folder / 'config.json'}" in err
    assert "cannot build a causal LM" in err and "decoder-only language model" in err
    assert not out.exists() and _leftovers(tmp_path, "out") == []


@pytest.mark.slow  # imports transformers (seconds)
def test_remote_code_without_the_flag_exit_2(tmp_path, capsys):
    folder = _config_only(
        tmp_path, model_type="my_own_lm", auto_map={"AutoModelForCausalLM": "m.MyLM"}
    )
    out = tmp_path / "out"
    assert main(["export", str(folder), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"{folder / 'config.json'}" in err and "--trust-remote-code" in err
    assert not out.exists() and _leftovers(tmp_path, "out") == []


def test_output_is_a_file(tmp_path, capsys):
    folder = _config_only(tmp_path, model_type="llama")
    (tmp_path / "out").write_text("a file")
    assert main(["export", str(folder), "-o", str(tmp_path / "out")]) == 2
    assert "exists and is not a folder" in capsys.readouterr().err
    assert (tmp_path / "out").read_text() == "a file"


def test_weights_are_not_safetensors(tmp_path):
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "llama"}')
    with pytest.raises(ModelLoadError, match="no \\*.safetensors weights"):
        export(folder, tmp_path / "out")


# ---------------------------------------------------------------- with a tiny model export


def _tiny_folder(root: pathlib.Path) -> pathlib.Path:
    import torch
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    folder = root / "tiny-hf"
    config = transformers.LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=300,
        max_position_embeddings=64,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=2,
    )
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(300)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="t0", bos_token="t0", eos_token="t1", pad_token="t2"
    ).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> pathlib.Path:
    return _tiny_folder(tmp_path_factory.mktemp("tiny"))


@pytest.mark.slow
def test_a_terminal_shows_progress_a_pipe_none(tiny, tmp_path, capsys):
    """The command in a subprocess whose stderr is a pty; then in this process, stderr a pipe."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "irkit.cli", "export", str(tiny)]
    master, slave = os.openpty()
    with subprocess.Popen(
        [*command, "-o", str(tmp_path / "tty")], stderr=slave, stdout=subprocess.PIPE, env=env
    ) as proc:
        os.close(slave)
        chunks = []
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:  # EIO: the child closed the pty
                break
            if not chunk:
                break
            chunks.append(chunk)
        proc.wait()
    os.close(master)
    terminal = b"".join(chunks).decode()
    assert proc.returncode == 0, terminal
    assert "torch.export with the KV cache" in terminal
    assert "lowering and optimizing (target ort)" in terminal  # (the default target)
    assert f"writing {tmp_path / 'tty'}/model.onnx" in terminal
    # redrawn in place: tensors 1/N first, N/N last (embedding, lm_head, the layer's matmuls,
    # Q/K/V and gate/up packed into one each by the default target, and the norms)
    counts = re.findall(r"\r +tensors (\d+)/(\d+), [\d,]+/[\d,]+ MB, [\d,]+ MB/s", terminal)
    assert counts[0][0] == "1" and counts[-1][0] == counts[-1][1] and int(counts[-1][1]) >= 6

    # pytest's captured stderr is not a terminal, as a pipe is not
    capsys.readouterr()
    assert main(["export", str(tiny), "-o", str(tmp_path / "pipe")]) == 0
    piped = capsys.readouterr().err
    assert "tensors" not in piped and "torch.export" not in piped
    assert "search.max_length 64: KV cache 0.0 MiB per sequence" in piped
    # the same folder as on the terminal
    assert (tmp_path / "pipe" / "model.onnx.data").read_bytes() == (
        tmp_path / "tty" / "model.onnx.data"
    ).read_bytes()


@pytest.mark.slow
def test_a_full_disk_leaves_nothing_behind(tiny, tmp_path, capsys, monkeypatch):
    """ENOSPC while the weights are written: one SaveError naming the file and the fix, exit 2;
    the old OUT_DIR (``--overwrite``) is untouched and no temporary folder is left."""
    from irkit.weights import _writer

    def full(fd, tensors, offsets, progress):
        os.write(fd, b"\0" * 1000)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(_writer, "_write_all", full)
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert main(["export", str(tiny), "-o", str(out), "--overwrite", "-q"]) == 2
    err = capsys.readouterr().err
    assert f"{str(out)!r}: the disk is full while writing" in err
    assert "model.onnx.data" in err
    assert "free some space there or pass an OUT_DIR on another disk" in err
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt"]
    assert _leftovers(tmp_path, "out") == []
    with pytest.raises(SaveError, match="the disk is full"):
        export(tiny, tmp_path / "new")
    assert not (tmp_path / "new").exists() and _leftovers(tmp_path, "new") == []
