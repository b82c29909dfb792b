"""The streamed save behind :func:`irkit.save`: which bytes each initializer gets, and where.

:func:`resolve_weights` matches the model's initializers with a checkpoint (by name, through
an optional rename hook) and checks dtype and shape before a byte is written.
:func:`write_external` writes tensors into one or more external data files, one tensor at a
time, with onnx-ir's layout (offsets, alignment) into files that atomically replace their
destination (:mod:`irkit._writer`: kernel copies, rolling write-behind, ``fsync``), split into
shard files of at most N bytes with irkit's names.
"""

from __future__ import annotations

import difflib
import logging
import os
import pathlib
import re
from collections.abc import Callable, Mapping, Sequence

import onnx_ir as ir

from irkit._checkpoints import open_weights
from irkit._weights import WeightlessTensor
from irkit._writer import write_data_file
from irkit.errors import SaveError, WeightsError

__all__ = ["Rename", "resolve_weights", "write_external", "parse_size"]

logger = logging.getLogger(__name__)

Rename = Callable[[str], "str | None"] | Mapping[str, str]
"""Initializer name → checkpoint key (a function, or a mapping for the names that differ)."""

_MAX_LISTED = 10


def resolve_weights(
    model: ir.Model, weights: object, rename: Rename | None, override: bool
) -> dict[ir.Value, ir.TensorProtocol]:
    """The checkpoint tensor of each initializer that takes one: every weightless initializer,
    and with ``override`` every initializer the checkpoint holds.

    Raises:
        WeightsError: Some weightless initializers are not in the checkpoint, or some checkpoint
            tensors have another shape or dtype than their initializer (all are listed).
    """
    source = open_weights(weights)
    found: dict[ir.Value, ir.TensorProtocol] = {}
    missing: list[ir.Value] = []
    mismatched: list[str] = []
    ignored = 0
    for graph in model.graphs():
        for value in graph.initializers.values():
            tensor = value.const_value
            if tensor is None:
                continue
            weightless = isinstance(tensor, WeightlessTensor)
            name = value.name or ""
            keys = [_renamed(name, rename)]
            if isinstance(tensor, WeightlessTensor):
                keys += [_renamed(a, rename) for a in tensor.aliases]
            key = next((k for k in keys if k is not None and source.get(k) is not None), None)
            if key is None:
                if weightless:
                    missing.append(value)
                continue
            if not weightless and not override:
                ignored += 1
                continue
            stored = source.get(key)
            assert stored is not None
            if stored.dtype != tensor.dtype or tuple(stored.shape) != tuple(tensor.shape):
                mismatched.append(
                    f"{name!r}: the model expects {_spec(tensor)}, {source.where(key)!r} holds "
                    f"{key!r} as {_spec(stored)}"
                )
                continue
            found[value] = stored.renamed(name) if hasattr(stored, "renamed") else stored
    if ignored:
        logger.info(
            "irkit.save: %d initializer(s) have data already; their checkpoint tensors are not "
            "used (pass override=True to use them).",
            ignored,
        )
    if missing or mismatched:
        raise WeightsError(
            _problems(missing, mismatched, source.description, source.names()),
            [v.name or "" for v in missing] + [m.split("'")[1] for m in mismatched],
        )
    logger.info("irkit.save: %d initializer(s) from %s", len(found), source.description)
    return found


def _renamed(name: str, rename: Rename | None) -> str | None:
    if rename is None:
        return name
    if isinstance(rename, Mapping):
        return rename.get(name, name)
    return rename(name)


def _spec(tensor: ir.TensorProtocol) -> str:
    return f"{tensor.dtype.name}{list(tensor.shape.numpy())}"


def _problems(
    missing: Sequence[ir.Value], mismatched: Sequence[str], where: str, keys: Sequence[str]
) -> str:
    lines = []
    if missing:
        lines.append(f"{len(missing)} weightless initializer(s) have no tensor in {where}:")
        for value in missing[:_MAX_LISTED]:
            assert value.const_value is not None
            close = difflib.get_close_matches(value.name or "", keys, n=1)
            hint = f" (closest key: {close[0]!r})" if close else ""
            lines.append(f"  - {value.name!r} {_spec(value.const_value)}{hint}")
        if len(missing) > _MAX_LISTED:
            lines.append(f"  - … and {len(missing) - _MAX_LISTED} more")
    if mismatched:
        lines.append(f"{len(mismatched)} tensor(s) do not fit their initializer:")
        lines += [f"  - {m}" for m in mismatched[:_MAX_LISTED]]
        if len(mismatched) > _MAX_LISTED:
            lines.append(f"  - … and {len(mismatched) - _MAX_LISTED} more")
    lines.append(
        "Fix: pass the checkpoint of this model, or rename=... (a mapping or function from "
        "initializer name to checkpoint key) to irkit.save."
    )
    return "\n".join(lines)


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMG]i?B|B)?\s*$", re.IGNORECASE)
_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20, "gib": 2**30}


def parse_size(size: int | str) -> int:
    """Bytes of ``size``: an int, or text like ``"5GB"``, ``"512MiB"`` (as transformers takes).

    Raises:
        SaveError: Not a positive size.
    """
    if isinstance(size, int) and size > 0:
        return size
    match = _SIZE.match(size) if isinstance(size, str) else None
    if match is None or float(match.group(1)) <= 0:
        raise SaveError(f"max_shard_size={size!r} is not a size; give bytes or text like '5GB'.")
    return int(float(match.group(1)) * _UNITS[(match.group(2) or "B").lower()])


def _aligned(offset: int, nbytes: int, alignment: int | None, threshold: int) -> int:
    if alignment is None or nbytes <= threshold:
        return offset
    step = max(4096, alignment)  # what onnx-ir's writer applies
    return -(-offset // step) * step


def _shards(
    tensors: Sequence[ir.TensorProtocol],
    max_bytes: int | None,
    alignment: int | None,
    threshold: int,
) -> list[list[int]]:
    groups: list[list[int]] = [[]]
    end = 0
    for i, tensor in enumerate(tensors):
        start = _aligned(end, tensor.nbytes, alignment, threshold)
        if max_bytes is not None and groups[-1] and start + tensor.nbytes > max_bytes:
            groups.append([])
            start = 0
        groups[-1].append(i)
        end = start + tensor.nbytes
    return groups


def shard_names(data_name: str, count: int) -> list[str]:
    """``model.onnx.data`` → ``model.onnx-00001-of-00003.data`` … (just the name if one)."""
    if count == 1:
        return [data_name]
    stem, dot, suffix = data_name.rpartition(".")
    if not dot:
        stem, suffix = data_name, "data"
    return [f"{stem}-{i + 1:05d}-of-{count:05d}.{suffix}" for i in range(count)]


def write_external(
    tensors: Sequence[ir.TensorProtocol],
    directory: pathlib.Path,
    data_name: str,
    *,
    max_shard_size: int | None,
    alignment: int | None,
    align_threshold: int,
) -> list[ir.ExternalTensor]:
    """Write ``tensors`` (in order) into ``data_name`` next to the model, or into shards of at
    most ``max_shard_size`` bytes; one tensor in memory at a time. Returns the external tensors
    (same order) that point at the bytes written. Every file is fsynced and atomically replaces
    its destination (:func:`irkit._writer.write_data_file`: kernel copies, rolling
    write-behind); the layout is onnx-ir's (``convert_tensors_to_external``): tensors packed in
    order, those larger than ``align_threshold`` at multiples of ``max(4096, alignment)``.

    Raises:
        SaveError: The data name is absolute or leaves the model's directory, or writing failed.
    """
    if pathlib.PurePath(data_name).is_absolute() or ".." in pathlib.PurePath(data_name).parts:
        raise SaveError(
            f"external_data={data_name!r}: the location must be relative to the model's "
            "directory (ONNX resolves it from there), without '..'."
        )
    groups = _shards(tensors, max_shard_size, alignment, align_threshold)
    names = shard_names(data_name, len(groups))
    result: list[ir.ExternalTensor | None] = [None] * len(tensors)
    total = sum(t.nbytes for t in tensors)
    written = 0
    for group, name in zip(groups, names, strict=True):
        members = [tensors[i] for i in group]
        offsets = _offsets(members, alignment, align_threshold)
        try:
            write_data_file(members, offsets, directory / name)
        except OSError as exc:
            raise SaveError(f"writing {str(directory / name)!r} failed: {exc}") from exc
        for i, tensor, offset in zip(group, members, offsets, strict=True):
            result[i] = ir.ExternalTensor(
                os.path.normpath(name),
                offset,
                tensor.nbytes,
                tensor.dtype,
                shape=tensor.shape,  # type: ignore[arg-type]  # (as onnx-ir's writer passes them)
                name=tensor.name,  # type: ignore[arg-type]
                base_dir=os.path.normpath(directory),
            )
        written += sum(t.nbytes for t in members)
        logger.info(
            "irkit.save: %s: %d tensors, %.2f GB (%.0f%% of %.2f GB)",
            name,
            len(members),
            sum(t.nbytes for t in members) / 1e9,
            100 * written / max(total, 1),
            total / 1e9,
        )
    return [t for t in result if t is not None]


def _offsets(
    tensors: Sequence[ir.TensorProtocol], alignment: int | None, threshold: int
) -> list[int]:
    offsets, end = [], 0
    for tensor in tensors:
        offsets.append(_aligned(end, tensor.nbytes, alignment, threshold))
        end = offsets[-1] + tensor.nbytes
    return offsets
