"""One external data file, written at the disk's speed: the engine behind ``write_external``.

:func:`write_data_file` writes tensors at given offsets into a temporary file next to the
destination, fsyncs it and atomically replaces the destination (as onnx-ir's writer does, with
the same bytes: padding before an aligned offset is a hole that reads back as zeros). What it
adds is how the bytes travel:

- **Checkpoint tensors are copied file to file** in bounded chunks (``os.copy_file_range``: the
  kernel copies, no user-space buffer; ``pread``/``pwrite`` through one reused buffer where the
  kernel cannot), with the source read ahead one chunk (``POSIX_FADV_WILLNEED``), the next
  tensor's first chunk included.
- **Rolling write-behind** (Linux ``sync_file_range``): every time a window of output is
  complete, its writeback is started, the window before it is waited for and dropped from the
  page cache (``POSIX_FADV_DONTNEED``). The output never piles up gigabytes of dirty pages (the
  kernel then throttles the writer and the final fsync stalls for the whole backlog), and it
  does not evict a checkpoint that is in the page cache. The final ``fsync`` is what makes the
  file durable; write-behind only spreads the work.

Where a call is missing (no ``copy_file_range``, no ``sync_file_range``, no ``posix_fadvise``)
or refused by the file system, the next simpler way is taken; the bytes are the same. Memory:
at most one chunk (16 MiB) or, for tensors held in memory, that tensor.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import ctypes
import ctypes.util
import logging
import os
import pathlib
import shutil
import sys
import tempfile
from collections.abc import Callable, Sequence
from typing import Any, BinaryIO

import onnx_ir as ir

from irkit.weights._checkpoints import FileTensor

__all__ = ["write_data_file", "WriteProgress", "CHUNK", "WINDOW"]

logger = logging.getLogger(__name__)

CHUNK = 16 << 20
"""Bytes per copy step (kernel copy or pread/pwrite)."""
WINDOW = 64 << 20
"""Bytes of output per write-behind step."""

_O_BINARY = getattr(os, "O_BINARY", 0)  # (Windows: no newline translation)
_WAIT_BEFORE, _WRITE, _WAIT_AFTER = 1, 2, 4  # SYNC_FILE_RANGE_* (linux/fs.h)

SyncFileRange = Callable[[int, int, int, int], int]
WriteProgress = Callable[[str, int], None]
"""Called with a tensor's name and byte count once it is written (a progress display)."""


def _load_sync_file_range() -> SyncFileRange | None:
    """libc's ``sync_file_range`` (Linux only; Python's ``os`` does not expose it), or None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        function = libc.sync_file_range
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    function.restype = ctypes.c_int
    return function


SYNC_FILE_RANGE: SyncFileRange | None = _load_sync_file_range()
"""Looked up once at import (a constant; tests replace it to take the fallback path)."""


class _WriteBehind:
    """Starts writeback of each completed window of ``fd`` and retires the one before it."""

    def __init__(self, fd: int, window: int, sync_file_range: SyncFileRange | None) -> None:
        self._fd, self._window = fd, window
        self._sync = sync_file_range
        self._started = 0  # writeback started for [0, started)
        self._retired = 0  # on disk and dropped from the page cache: [0, retired)

    def advance(self, end: int) -> None:
        """The file holds its final bytes up to ``end`` (and is not written below it again)."""
        while (sync := self._sync) is not None and end - self._started >= self._window:
            start = self._started
            if not self._call(sync, start, self._window, _WRITE):
                return
            if self._retired < start:
                length = start - self._retired
                flags = _WAIT_BEFORE | _WRITE | _WAIT_AFTER
                if not self._call(sync, self._retired, length, flags):
                    return
                if hasattr(os, "posix_fadvise"):
                    os.posix_fadvise(self._fd, self._retired, length, os.POSIX_FADV_DONTNEED)
                self._retired = start
            self._started = start + self._window

    def _call(self, sync: SyncFileRange, offset: int, length: int, flags: int) -> bool:
        if sync(self._fd, offset, length, flags) == 0:
            return True
        error = ctypes.get_errno()
        logger.debug("sync_file_range: %s; write-behind off", os.strerror(error))
        self._sync = None  # (e.g. a file system that refuses it: fsync at the end still holds)
        return False


class _Copier:
    """Copies byte ranges of checkpoint files into the output: kernel copy, else pread/pwrite."""

    def __init__(self, dst: int, behind: _WriteBehind) -> None:
        self._dst, self._behind = dst, behind
        self._kernel = hasattr(os, "copy_file_range")
        self._buffer: memoryview | None = None

    def copy(self, tensor: FileTensor, dst_off: int, ahead: FileTensor | None) -> None:
        with open(tensor.path, "rb") as file:
            src = file.fileno()
            _advise(src, tensor.offset, tensor.length, "POSIX_FADV_SEQUENTIAL")
            done = 0
            while done < tensor.length:
                count = min(tensor.length - done, CHUNK)
                after = done + count
                if after < tensor.length:
                    next_count = min(CHUNK, tensor.length - after)
                    _advise(src, tensor.offset + after, next_count, "POSIX_FADV_WILLNEED")
                elif ahead is not None:
                    _prefetch(ahead)
                copied = self._step(src, tensor.offset + done, dst_off + done, count)
                if copied == 0:
                    raise tensor.truncated()
                done += copied
                self._behind.advance(dst_off + done)

    def _step(self, src: int, src_off: int, dst_off: int, count: int) -> int:
        if self._kernel:
            try:
                return os.copy_file_range(src, self._dst, count, src_off, dst_off)
            except OSError as exc:  # cross-device on old kernels, unsupported file systems
                logger.debug("copy_file_range: %s; copying through a buffer", exc)
                self._kernel = False
        if self._buffer is None:
            self._buffer = memoryview(bytearray(CHUNK))
        view = self._buffer[:count]
        got = _pread(src, view, src_off)
        written = 0
        while written < got:
            written += _pwrite(self._dst, view[written:got], dst_off + written)
        return got


def _pread(fd: int, view: memoryview, offset: int) -> int:
    """Read into ``view`` from ``offset``; the bytes read (Windows has no ``pread``)."""
    if hasattr(os, "preadv"):
        return os.preadv(fd, [view], offset)
    if hasattr(os, "pread"):
        data = os.pread(fd, len(view), offset)
    else:
        os.lseek(fd, offset, os.SEEK_SET)
        data = os.read(fd, len(view))
    view[: len(data)] = data
    return len(data)


def _pwrite(fd: int, data: memoryview, offset: int) -> int:
    if hasattr(os, "pwrite"):
        return os.pwrite(fd, data, offset)
    os.lseek(fd, offset, os.SEEK_SET)  # (the output's file object always seeks before it writes)
    return os.write(fd, data)


def _advise(fd: int, offset: int, length: int, advice: str) -> None:
    if hasattr(os, "posix_fadvise") and length > 0:
        os.posix_fadvise(fd, offset, length, getattr(os, advice))


def _prefetch(tensor: FileTensor) -> None:
    with contextlib.suppress(OSError), open(tensor.path, "rb") as file:
        _advise(file.fileno(), tensor.offset, min(CHUNK, tensor.length), "POSIX_FADV_WILLNEED")


def write_data_file(
    tensors: Sequence[ir.TensorProtocol],
    offsets: Sequence[int],
    path: pathlib.Path,
    *,
    progress: WriteProgress | None = None,
) -> None:
    """Write each tensor's bytes at its offset into ``path``, durably and atomically.

    The file is written under a temporary name in the same directory, fsynced, then renamed over
    ``path`` (and the directory fsynced): a reader sees the old file or the complete new one.
    External tensors that point at ``path`` itself are read before it is replaced, then
    invalidated (as onnx-ir's writer does). The file ends where the last tensor ends.
    ``progress``, if given, is called with each tensor's name and byte count once it is written.

    Raises:
        OSError: Reading or writing failed (the destination is left as it was).
        WeightsError: A checkpoint file is shorter than its header says.
    """
    destination = pathlib.Path(os.path.realpath(path)) if path.is_symlink() else path
    overwritten = [
        t for t in tensors if isinstance(t, ir.ExternalTensor) and _same_file(t.path, destination)
    ]
    temporary_dir = tempfile.mkdtemp(dir=destination.parent, prefix=f".{destination.name}.")
    temporary = os.path.join(temporary_dir, destination.name)
    try:
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_BINARY, 0o666)
        try:
            _write_all(fd, tensors, offsets, progress)
            os.fsync(fd)
        finally:
            os.close(fd)
        for tensor in overwritten:
            tensor.release()
        if destination.exists():
            shutil.copymode(destination, temporary)
        os.replace(temporary, destination)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(temporary)
        with contextlib.suppress(OSError):
            os.rmdir(temporary_dir)
    _fsync_directory(destination.parent)
    for tensor in overwritten:
        tensor.invalidate()
        logger.warning(
            "External tensor %s referred to the overwritten destination and has been "
            "invalidated. Load the newly saved model to obtain a valid tensor.",
            tensor,
        )


def _write_all(
    fd: int,
    tensors: Sequence[ir.TensorProtocol],
    offsets: Sequence[int],
    progress: WriteProgress | None,
) -> None:
    behind = _WriteBehind(fd, WINDOW, SYNC_FILE_RANGE)
    copier = _Copier(fd, behind)
    ahead: list[FileTensor | None] = [None] * len(tensors)  # the next checkpoint tensor
    for i in range(len(tensors) - 2, -1, -1):
        following = tensors[i + 1]
        ahead[i] = following if isinstance(following, FileTensor) else ahead[i + 1]
    with os.fdopen(fd, "wb", closefd=False) as file, _Computed(tensors) as computed:
        for i, (tensor, offset, next_one) in enumerate(zip(tensors, offsets, ahead, strict=True)):
            if isinstance(tensor, FileTensor):
                copier.copy(tensor, offset, next_one)
            else:
                file.seek(offset)
                _write_in_memory(computed.take(i), file)
                file.flush()
                behind.advance(offset + tensor.nbytes)
            if progress is not None:
                progress(str(tensor.name), tensor.nbytes)


AHEAD_BYTES = 256 << 20
"""The largest computed tensor evaluated ahead (so at most two such are in memory at once)."""


class _Computed:
    """The computed tensors (``ir.LazyTensor``: converted, derived, packed weights) evaluated one
    ahead on a worker thread, in file order, while the writer writes the one before: computing
    (numpy, reading checkpoints: the GIL released) overlaps the disk's writeback waits.

    One worker evaluates them one after another in their order, as the writer alone did (a
    :class:`~irkit.weights._derived.PackCache` sees the same sequence). A tensor over
    :data:`AHEAD_BYTES`, or next to one, is evaluated in its turn (memory stays one large tensor
    beside the pipeline). :meth:`take` re-raises the worker's exception.
    """

    def __init__(self, tensors: Sequence[ir.TensorProtocol]) -> None:
        self._tensors = tensors
        self._lazy = [i for i, t in enumerate(tensors) if isinstance(t, ir.LazyTensor)]
        self._next = {a: b for a, b in zip(self._lazy, self._lazy[1:], strict=False)}
        self._pending: dict[int, concurrent.futures.Future[ir.TensorProtocol]] = {}
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None

    def __enter__(self) -> _Computed:
        if len(self._lazy) > 1:
            self._pool = concurrent.futures.ThreadPoolExecutor(1, "irkit-save")
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)

    def _small(self, i: int) -> bool:
        return self._tensors[i].nbytes <= AHEAD_BYTES

    def take(self, i: int) -> ir.TensorProtocol:
        """Tensor ``i``, evaluated (an ``ir.LazyTensor``'s value; any other tensor as is); the
        next computed tensor starts on the worker."""
        tensor = self._tensors[i]
        if not isinstance(tensor, ir.LazyTensor):
            return tensor
        future = self._pending.pop(i, None)
        following = self._next.get(i)
        if self._pool is None or future is None and not self._small(i):
            value = tensor.raw()  # (in its turn, nothing ahead)
        else:
            if future is None:
                future = self._pool.submit(tensor.raw)
            if following is not None and self._small(i) and self._small(following):
                self._pending[following] = self._pool.submit(self._tensors[following].raw)
            value = future.result()
        return value


def _write_in_memory(tensor: ir.TensorProtocol, file: BinaryIO) -> None:
    tofile: Any = getattr(tensor, "tofile", None)
    if tofile is not None:
        tofile(file)
    else:
        file.write(tensor.tobytes())


def _same_file(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _fsync_directory(directory: pathlib.Path) -> None:
    """Make the rename durable too (POSIX; Windows cannot open a directory)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)
