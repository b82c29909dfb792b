"""Weights where they already are: a state_dict, a safetensors file, a folder of shards.

:func:`open_weights` turns what the user passes as ``irkit.save(..., weights=...)`` into a
:class:`WeightSource`: a lookup from checkpoint key to a tensor that knows its dtype and shape
and can write its bytes to a file **without loading the checkpoint**. Safetensors files are read
through their header (8-byte length, JSON, then raw little-endian data; the format is fixed by
its specification), and a tensor is copied from the checkpoint file into the destination by the
kernel (``os.copy_file_range``) or in bounded chunks: the memory used does not grow with the
tensor or the model. (``safetensors.safe_open`` memory-maps the whole shard; every page touched
counts towards the process's resident memory until the map is closed. A tensor read as values,
:meth:`FileTensor.numpy`, maps its own bytes only, unmapped when the array goes.)

This module imports no torch (a state_dict's torch tensors are adapted through onnx-ir).
"""

from __future__ import annotations

import json
import mmap
import os
import pathlib
import struct
from collections.abc import Mapping
from typing import Any, BinaryIO, cast

import numpy as np
import onnx_ir as ir

from irkit.errors import WeightsError

__all__ = ["WeightSource", "FileTensor", "open_weights", "SAFETENSORS_DTYPES"]

SAFETENSORS_DTYPES: Mapping[str, ir.DataType] = {
    "F64": ir.DataType.DOUBLE,
    "F32": ir.DataType.FLOAT,
    "F16": ir.DataType.FLOAT16,
    "BF16": ir.DataType.BFLOAT16,
    "I64": ir.DataType.INT64,
    "I32": ir.DataType.INT32,
    "I16": ir.DataType.INT16,
    "I8": ir.DataType.INT8,
    "U64": ir.DataType.UINT64,
    "U32": ir.DataType.UINT32,
    "U16": ir.DataType.UINT16,
    "U8": ir.DataType.UINT8,
    "BOOL": ir.DataType.BOOL,
    "F8_E4M3": ir.DataType.FLOAT8E4M3FN,
    "F8_E5M2": ir.DataType.FLOAT8E5M2,
}

_INDEX = "model.safetensors.index.json"
_CHUNK = 16 << 20  # bytes per read/write when the kernel cannot copy file to file


class FileTensor:
    """A tensor stored in a file at ``offset`` (``TensorProtocol``): read only when written.

    ``tofile`` copies the bytes file-to-file; ``numpy``/``tobytes`` read them (small tensors:
    the fallback when weights are stored inline).
    """

    __slots__ = (
        "path",
        "offset",
        "length",
        "_dtype",
        "_dims",
        "_shape",
        "name",
        "doc_string",
        "_props",
    )

    def __init__(
        self,
        path: pathlib.Path,
        offset: int,
        length: int,
        dtype: ir.DataType,
        shape: tuple[int, ...],
        name: str | None = None,
    ) -> None:
        self.path, self.offset, self.length = path, offset, length
        self._dtype = dtype
        self._dims = shape
        self._shape = ir.Shape(shape)
        self._shape.freeze()
        self.name = name
        self.doc_string: str | None = None
        self._props: dict[str, str] = {}

    def truncated(self) -> WeightsError:
        """The error for a checkpoint file that ends before this tensor's bytes do."""
        return WeightsError(
            f"{str(self.path)!r} is truncated: tensor {self.name!r} needs bytes "
            f"{self.offset}..{self.offset + self.length}.",
            [self.name or ""],
        )

    def renamed(self, name: str) -> FileTensor:
        """The same bytes under the initializer's name."""
        return FileTensor(self.path, self.offset, self.length, self._dtype, self._dims, name)

    @property
    def dtype(self) -> ir.DataType:
        return self._dtype

    @property
    def shape(self) -> ir.Shape:
        return self._shape

    @property
    def raw(self) -> pathlib.Path:
        return self.path

    @property
    def metadata_props(self) -> dict[str, str]:
        return self._props

    @property
    def meta(self) -> dict[str, Any]:
        return {}

    @property
    def size(self) -> int:
        return int(np.prod(self._shape.numpy(), dtype=np.int64))

    @property
    def nbytes(self) -> int:
        return self.length

    def tobytes(self) -> bytes:
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read(self.length)
        if len(data) != self.length:
            raise self.truncated()
        return data

    def numpy(self) -> np.ndarray:
        """The values, read-only: the tensor's pages of the file mapped (no copy: a streamed
        save packs or converts straight from the page cache; unmapped with the array), else
        read.

        Raises:
            WeightsError: The file ends before the tensor does.
        """
        array = np.frombuffer(self._mapped(), dtype=self._dtype.numpy())
        return array.reshape(self._shape.numpy())

    def _mapped(self) -> memoryview | bytes:
        if self.length == 0:
            return b""
        with open(self.path, "rb") as f:
            if os.fstat(f.fileno()).st_size < self.offset + self.length:
                raise self.truncated()
            start = self.offset - self.offset % mmap.ALLOCATIONGRANULARITY
            try:
                mapped = mmap.mmap(
                    f.fileno(), self.offset + self.length - start, offset=start,
                    access=mmap.ACCESS_READ,
                )  # fmt: skip
            except (OSError, ValueError):  # (a file system that cannot map)
                return self.tobytes()
        if hasattr(mapped, "madvise"):  # (read ahead what is not in the page cache yet)
            mapped.madvise(mmap.MADV_WILLNEED)
        return memoryview(mapped)[self.offset - start :]

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        array = self.numpy()
        return array if dtype is None else array.astype(dtype)

    def __dlpack__(self, *, stream: Any = None) -> Any:
        return self.numpy().__dlpack__(stream=stream)

    def __dlpack_device__(self) -> Any:
        return self.numpy().__dlpack_device__()

    def tofile(self, file: BinaryIO) -> None:
        """Append the bytes at ``file``'s position, file to file (no full copy in memory)."""
        file.flush()
        dst = file.fileno()
        start = file.tell()
        with open(self.path, "rb") as src:
            if hasattr(os, "posix_fadvise"):  # a larger read-ahead window
                os.posix_fadvise(src.fileno(), self.offset, self.length, os.POSIX_FADV_SEQUENTIAL)
            _copy_range(src.fileno(), self.offset, dst, start, self.length, self)
        file.seek(start + self.length)

    def __repr__(self) -> str:
        return f"FileTensor<{self._dtype.name},{self._shape}>({str(self.path)!r}@{self.offset})"


def _copy_range(src: int, src_off: int, dst: int, dst_off: int, n: int, who: FileTensor) -> None:
    done = 0
    use_kernel = hasattr(os, "copy_file_range")
    while done < n:
        count = min(n - done, 1 << 30)
        copied = 0
        if use_kernel:
            try:
                copied = os.copy_file_range(src, dst, count, src_off + done, dst_off + done)
            except OSError:  # cross-device on old kernels, unsupported file systems
                use_kernel = False
        if not use_kernel:
            data = os.pread(src, min(count, _CHUNK), src_off + done)
            copied = os.pwrite(dst, data, dst_off + done) if data else 0
        if copied == 0:
            raise who.truncated()
        done += copied


class WeightSource:
    """Checkpoint key → tensor, plus where each came from (for error messages).

    Attributes:
        description: What was given, for messages (a path or ``"the state_dict"``).
    """

    def __init__(self, description: str) -> None:
        self.description = description
        self._tensors: dict[str, ir.TensorProtocol] = {}
        self._where: dict[str, str] = {}

    def add(self, key: str, tensor: ir.TensorProtocol, where: str) -> None:
        self._tensors[key] = tensor
        self._where[key] = where

    def get(self, key: str) -> ir.TensorProtocol | None:
        """The tensor stored under ``key``, or None."""
        return self._tensors.get(key)

    def where(self, key: str) -> str:
        """The file (or ``"the state_dict"``) that holds ``key``."""
        return self._where.get(key, self.description)

    def names(self) -> list[str]:
        """The checkpoint keys."""
        return list(self._tensors)

    def items(self) -> list[tuple[str, ir.TensorProtocol]]:
        """``(key, tensor)`` for each checkpoint key."""
        return list(self._tensors.items())

    def __len__(self) -> int:
        return len(self._tensors)


def open_weights(weights: object) -> WeightSource:
    """A :class:`WeightSource` over ``weights``: a mapping name → tensor (torch, numpy or onnx-ir),
    a ``.safetensors`` file, a folder written by ``save_pretrained`` (with or without
    ``model.safetensors.index.json``), or a list of these (the first holding a key wins; e.g.
    a folder and the non-persistent buffers ``save_pretrained`` leaves out). Only headers are
    read here.

    Raises:
        WeightsError: The path does not exist, holds no safetensors file, or a file is not
            valid safetensors.
    """
    if isinstance(weights, Mapping):
        return _from_mapping(weights)
    if isinstance(weights, (list, tuple)):
        return _merged([open_weights(w) for w in weights])
    if not isinstance(weights, (str, os.PathLike)):
        raise WeightsError(
            f"weights must be a state_dict (a mapping of names to tensors), a .safetensors file "
            f"or a folder of them, got {type(weights).__name__}."
        )
    path = pathlib.Path(weights)
    if path.is_file():
        source = WeightSource(str(path))
        _read_safetensors_header(path, source)
        return source
    if path.is_dir():
        return _from_folder(path)
    raise WeightsError(
        f"weights: {str(path)!r} does not exist. Give a .safetensors file or folder."
    )


def _merged(sources: list[WeightSource]) -> WeightSource:
    merged = WeightSource(" + ".join(s.description for s in sources))
    for source in reversed(sources):
        for key, tensor in source.items():
            merged.add(key, tensor, source.where(key))
    return merged


def _from_mapping(weights: Mapping[Any, Any]) -> WeightSource:
    source = WeightSource("the state_dict")
    for key, value in weights.items():
        source.add(str(key), _adapt(value, str(key)), "the state_dict")
    return source


def _adapt(value: Any, key: str) -> ir.TensorProtocol:
    if type(value).__module__.startswith("torch"):
        fake = any(c.__module__ == "torch._subclasses.fake_tensor" for c in type(value).__mro__)
        if getattr(getattr(value, "device", None), "type", "cpu") == "meta" or fake:
            raise WeightsError(
                f"weights[{key!r}] is a meta or fake tensor: it holds no data either.", [key]
            )
        return ir.tensor_adapters.TorchTensor(value.detach().cpu().contiguous(), name=key)
    if isinstance(value, np.ndarray):
        return ir.Tensor(np.ascontiguousarray(value), name=key)
    if isinstance(value, ir.TensorProtocol):
        return value
    raise WeightsError(
        f"weights[{key!r}] is a {type(value).__name__}; expected a torch tensor, a numpy array or "
        "an onnx_ir tensor.",
        [key],
    )


def _from_folder(folder: pathlib.Path) -> WeightSource:
    source = WeightSource(str(folder))
    index = folder / _INDEX
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (ValueError, KeyError, TypeError) as exc:
            raise WeightsError(f"{str(index)!r} is not a safetensors index ({exc}).") from exc
        files = sorted(set(weight_map.values()))
    else:
        files = sorted(p.name for p in folder.glob("*.safetensors"))
    if not files:
        raise WeightsError(
            f"weights: folder {str(folder)!r} holds no *.safetensors file (nor {_INDEX}). "
            "Save the checkpoint with save_pretrained(..., safe_serialization=True)."
        )
    for name in files:
        file = folder / name
        if not file.is_file():
            raise WeightsError(
                f"{str(index)!r} lists {name!r}, which is missing in {str(folder)!r}."
            )
        _read_safetensors_header(file, source)
    return source


def _read_safetensors_header(path: pathlib.Path, source: WeightSource) -> None:
    try:
        with open(path, "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(length))
        base = 8 + length
        size = path.stat().st_size
        for key, info in header.items():
            if key == "__metadata__":
                continue
            dtype = SAFETENSORS_DTYPES.get(info["dtype"])
            if dtype is None:
                raise WeightsError(
                    f"{str(path)!r}: tensor {key!r} has dtype {info['dtype']}, which irkit cannot "
                    "write to ONNX.",
                    [key],
                )
            begin, end = info["data_offsets"]
            if base + end > size:
                raise WeightsError(f"{str(path)!r} is truncated (tensor {key!r}).", [key])
            shape = tuple(int(d) for d in info["shape"])
            tensor = FileTensor(path, base + begin, end - begin, dtype, shape, key)
            source.add(key, cast(ir.TensorProtocol, tensor), str(path))  # (read-only properties)
    except (OSError, ValueError, KeyError, TypeError, struct.error) as exc:
        if isinstance(exc, WeightsError):
            raise
        raise WeightsError(
            f"{str(path)!r} is not a safetensors file ({type(exc).__name__}: {exc})."
        ) from exc
