"""The fast external-data writer (``irkit.weights._writer``) writes exactly the bytes onnx-ir's writer
does — offsets, alignment holes, shards, file ends — on every path it can take: kernel copy,
``pread``/``pwrite`` (no ``copy_file_range``, or one that fails), with and without rolling
write-behind (``sync_file_range`` missing or refused), without ``posix_fadvise``. Chunk and
window sizes are shrunk so that small tensors cross many chunk and window boundaries."""

from __future__ import annotations

import inspect
import os
import pathlib

import numpy as np
import onnx_ir as ir
import pytest
from safetensors.numpy import save_file

import irkit
from irkit.weights import _writer, open_weights, write_external
from irkit.weights._stream import _shards, shard_names

RNG = np.random.default_rng(0)
# Odd sizes: offsets fall off every alignment; the large ones span several chunks and windows.
ARRAYS = {
    "a": RNG.standard_normal((37, 129)).astype(np.float32),  # 19092 bytes
    "b": RNG.standard_normal((3,)).astype(np.float32),  # small: packed, never aligned
    "c": RNG.standard_normal((91, 203)).astype(np.float16),  # 36946 bytes
    "d": RNG.integers(-9, 9, (4001,)).astype(np.int64),  # 32008 bytes
    "e": RNG.standard_normal((0, 5)).astype(np.float32),  # empty, last: the file ends before it
}
IN_MEMORY = RNG.standard_normal((61, 77)).astype(np.float32)  # 18788 bytes, not from a file


@pytest.fixture
def checkpoint(tmp_path) -> pathlib.Path:
    path = tmp_path / "ckpt.safetensors"
    save_file(ARRAYS, str(path))
    return path


def _tensors(checkpoint: pathlib.Path) -> list[ir.TensorProtocol]:
    """Checkpoint tensors (FileTensor), one in memory, one onnx-ir ExternalTensor."""
    source = open_weights(checkpoint)
    files = {k: source.get(k) for k in ARRAYS}
    assert all(t is not None and type(t).__name__ == "FileTensor" for t in files.values())
    external = ir.ExternalTensor(
        checkpoint.name,
        files["c"].offset,  # type: ignore[union-attr]
        ARRAYS["c"].nbytes,
        ir.DataType.FLOAT16,
        shape=ir.Shape(ARRAYS["c"].shape),
        name="c_ext",
        base_dir=str(checkpoint.parent),
    )
    return [files["a"], files["b"], ir.Tensor(IN_MEMORY, name="m"), external, files["c"],
            files["d"], files["e"]]  # fmt: skip


def _onnx_ir_files(tensors, directory, max_shard, alignment, threshold) -> dict[str, bytes]:
    """What the previous write_external wrote: onnx-ir's writer, one call per shard."""
    writer = inspect.signature(ir.external_data.convert_tensors_to_external).parameters
    if "alignment" not in writer:  # (onnx-ir before 1.1: the reference writer cannot align)
        pytest.skip("the installed onnx-ir's convert_tensors_to_external takes no alignment")
    groups = _shards(tensors, max_shard, alignment, threshold)
    out = {}
    for group, name in zip(groups, shard_names("model.onnx.data", len(groups)), strict=True):
        written = ir.external_data.convert_tensors_to_external(
            [tensors[i] for i in group],
            str(directory),
            name,
            alignment=alignment,
            align_threshold=threshold,
        )
        for tensor in written:  # onnx-ir's own ExternalTensors: valid and readable
            assert tensor.numpy().size == tensor.size
        out[name] = (directory / name).read_bytes()
    return out


def _written(tensors, directory, max_shard, alignment, threshold):
    directory.mkdir()
    result = write_external(
        tensors,
        directory,
        "model.onnx.data",
        max_shard_size=max_shard,
        alignment=alignment,
        align_threshold=threshold,
    )
    files = {p.name: p.read_bytes() for p in sorted(directory.iterdir())}
    return result, files


LAYOUTS = [  # (max_shard_size, alignment, align_threshold)
    (None, None, 4096),
    (None, 4096, 4096),
    (None, 65536, 1024),
    (60000, None, 4096),
    (60000, 4096, 4096),
]


@pytest.fixture
def small_steps(monkeypatch):
    """Chunks of 5000 bytes, write-behind every 8192 bytes (real sync_file_range where it is)."""
    monkeypatch.setattr(_writer, "CHUNK", 5000)
    monkeypatch.setattr(_writer, "WINDOW", 8192)


@pytest.mark.parametrize("layout", LAYOUTS, ids=[str(x) for x in LAYOUTS])
def test_same_bytes_and_offsets_as_onnx_ir_writer(checkpoint, tmp_path, small_steps, layout):
    tensors = _tensors(checkpoint)
    expected = _onnx_ir_files(tensors, _mkdir(tmp_path / "onnx_ir"), *layout)
    result, files = _written(tensors, tmp_path / "irkit", *layout)
    assert files == expected
    assert len(files) == (4 if layout[0] else 1)
    for tensor, original in zip(result, tensors, strict=True):
        assert tensor.name == original.name and tensor.shape == original.shape
        np.testing.assert_array_equal(tensor.numpy(), np.asarray(original.numpy()))
        if layout[1] is not None and original.nbytes > layout[2]:
            assert tensor.offset % max(4096, layout[1]) == 0


def _mkdir(path: pathlib.Path) -> pathlib.Path:
    path.mkdir()
    return path


def _fallback(monkeypatch, how: str) -> list[str]:
    calls: list[str] = []
    if how == "no kernel calls":
        monkeypatch.delattr(os, "copy_file_range", raising=False)
        monkeypatch.delattr(os, "posix_fadvise", raising=False)
        for name in ("preadv", "pread", "pwrite"):  # (Windows: lseek + read/write)
            monkeypatch.delattr(os, name, raising=False)
        monkeypatch.setattr(_writer, "SYNC_FILE_RANGE", None)
    elif how == "calls refused":

        def copy_file_range(*args, **kwargs):
            calls.append("copy_file_range")
            raise OSError(18, "Invalid cross-device link")

        def sync_file_range(fd, offset, length, flags):
            calls.append("sync_file_range")
            return -1

        monkeypatch.setattr(os, "copy_file_range", copy_file_range)
        monkeypatch.setattr(_writer, "SYNC_FILE_RANGE", sync_file_range)
    return calls


@pytest.mark.parametrize("how", ["no kernel calls", "calls refused"])
@pytest.mark.parametrize("layout", [LAYOUTS[0], LAYOUTS[4]], ids=["dense", "sharded-aligned"])
def test_fallback_paths_give_the_same_bytes(
    checkpoint, tmp_path, small_steps, monkeypatch, how, layout
):
    tensors = _tensors(checkpoint)
    expected = _onnx_ir_files(tensors, _mkdir(tmp_path / "onnx_ir"), *layout)
    calls = _fallback(monkeypatch, how)
    _, files = _written(tensors, tmp_path / "irkit", *layout)
    assert files == expected
    if how == "calls refused":  # tried (once per file: then the next simpler way)
        assert "copy_file_range" in calls  # (onnx-ir's ExternalTensor.tofile tries it too)
        assert calls.count("sync_file_range") == len(files)


def test_write_behind_covers_the_file_in_order(checkpoint, tmp_path, small_steps, monkeypatch):
    """Each window's writeback is started, then the one before is waited for and dropped."""
    if _writer.SYNC_FILE_RANGE is None:
        pytest.skip("no sync_file_range on this platform")
    real = _writer.SYNC_FILE_RANGE
    calls: list[tuple[int, int, int]] = []

    def recording(fd, offset, length, flags):
        calls.append((offset, length, flags))
        return real(fd, offset, length, flags)

    monkeypatch.setattr(_writer, "SYNC_FILE_RANGE", recording)
    result, files = _written(_tensors(checkpoint), tmp_path / "out", None, 4096, 4096)
    size = len(files["model.onnx.data"])
    started = [(o, n) for o, n, f in calls if f == 2]
    waited = [(o, n) for o, n, f in calls if f == 7]
    assert started == [(i * 8192, 8192) for i in range(size // 8192)]
    assert waited == [(0, 8192 * i) if i == 1 else (8192 * (i - 1), 8192)
                      for i in range(1, size // 8192)]  # fmt: skip
    assert [(o, n, f) for o, n, f in calls if f not in (2, 7)] == []


def test_replaces_a_destination_its_own_tensors_are_read_from(checkpoint, tmp_path):
    """Saving a loaded model over its own data file: read before replaced, as onnx-ir does."""
    model = ir.Model(ir.Graph([], [], nodes=[], name="g"), ir_version=10)
    for tensor in _tensors(checkpoint):
        value = ir.Value(name=tensor.name, const_value=tensor)
        value.shape, value.type = ir.Shape(tensor.shape), ir.TensorType(tensor.dtype)
        model.graph.register_initializer(value)
        model.graph.outputs.append(value)
    path = tmp_path / "model.onnx"
    irkit.save(model, path, external_data=True, alignment=4096)
    first = (tmp_path / "model.onnx.data").read_bytes()
    loaded = irkit.load(path)
    irkit.save(loaded, path, external_data=True, alignment=4096)
    assert (tmp_path / "model.onnx.data").read_bytes() == first
    again = irkit.load(path)
    for name, array in [*ARRAYS.items(), ("m", IN_MEMORY), ("c_ext", ARRAYS["c"])]:
        np.testing.assert_array_equal(again.graph.initializers[name].const_value.numpy(), array)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "ckpt.safetensors", "model.onnx", "model.onnx.data"]  # fmt: skip


def test_truncated_checkpoint_leaves_the_destination_as_it_was(checkpoint, tmp_path):
    tensors = [t for t in _tensors(checkpoint) if not isinstance(t, ir.ExternalTensor)]
    out = _mkdir(tmp_path / "out")
    (out / "model.onnx.data").write_bytes(b"old")
    with open(checkpoint, "r+b") as f:  # cut into the last tensor, "c" (float16 goes last)
        f.truncate(os.path.getsize(checkpoint) - 1000)
    with pytest.raises(irkit.WeightsError, match=r"truncated: tensor 'c' needs bytes"):
        write_external(tensors, out, "model.onnx.data", max_shard_size=None, alignment=None,
                       align_threshold=4096)  # fmt: skip
    assert [p.name for p in out.iterdir()] == ["model.onnx.data"]
    assert (out / "model.onnx.data").read_bytes() == b"old"


def _lazy(name: str, value: np.ndarray, log: list[str]) -> ir.LazyTensor:
    def compute() -> ir.TensorProtocol:
        log.append(name)
        if name == "boom":
            raise ValueError("boom is not computable")
        return ir.Tensor(value, name=name)

    return ir.LazyTensor(compute, ir.DataType.FLOAT, ir.Shape(value.shape), name=name)


def test_computed_tensors_are_evaluated_ahead_in_order(tmp_path, monkeypatch):
    """Lazy tensors (converted, derived, packed weights) are computed one ahead on a worker
    while the one before is written: each once, in file order (a ``PackCache`` sees the same
    sequence), the same bytes; a tensor over ``AHEAD_BYTES`` (or next to one) in its turn."""
    monkeypatch.setattr(_writer, "AHEAD_BYTES", 1000)
    values = [
        RNG.standard_normal(shape).astype(np.float32) for shape in [(7, 9), (300,), (5,), (11, 3)]
    ]
    log: list[str] = []
    tensors = [_lazy(f"t{i}", v, log) for i, v in enumerate(values)]
    offsets, end = [], 0
    for v in values:
        offsets.append(end)
        end += v.nbytes
    path = tmp_path / "out.bin"
    _writer.write_data_file(tensors, offsets, path)
    assert log == ["t0", "t1", "t2", "t3"]
    assert path.read_bytes() == b"".join(v.tobytes() for v in values)


def test_a_failing_computed_tensor_fails_the_write(tmp_path):
    """The worker's exception is raised by the writer; nothing is left at the destination."""
    log: list[str] = []
    values = [np.ones(4, np.float32)] * 3
    tensors = [_lazy(name, v, log) for name, v in zip(("a", "boom", "c"), values, strict=True)]
    path = tmp_path / "out.bin"
    with pytest.raises(ValueError, match="boom is not computable"):
        _writer.write_data_file(tensors, [0, 16, 32], path)
    assert not path.exists() and list(tmp_path.iterdir()) == []
