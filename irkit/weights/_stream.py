"""The streamed save behind :func:`irkit.save`: which bytes each initializer gets, and where.

:func:`resolve_weights` matches the model's initializers with a checkpoint (by name, through
an optional rename hook) and checks dtype and shape before a byte is written.
:func:`write_external` writes tensors into one or more external data files, one tensor at a
time, with onnx-ir's layout (offsets, alignment) into files that atomically replace their
destination (:mod:`irkit.weights._writer`: kernel copies, rolling write-behind, ``fsync``), split into
shard files of at most N bytes with irkit's names.
"""

from __future__ import annotations

import difflib
import logging
import os
import pathlib
import re
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import onnx_ir as ir

from irkit.errors import SaveError, WeightsError
from irkit.weights._checkpoints import WeightSource, open_weights
from irkit.weights._derived import DerivedTensor, Leaf, PackCache, evaluate
from irkit.weights._weightless import WeightlessTensor
from irkit.weights._writer import WriteProgress, write_data_file

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

    A derived initializer (:class:`~irkit.weights.DerivedTensor`) gets a tensor whose bytes
    are computed from its leaves' checkpoint tensors when written (one derived tensor in memory
    at a time); the parts of one packed weight (data, scales, zero points: separate
    initializers) share one read and one quantization, the first part written keeping the
    others until they are written (:class:`~irkit.weights._derived.PackCache`). A checkpoint
    tensor of another float dtype than its initializer (or leaf) is converted while streaming
    (an fp16 tensor packed for a float32 model: by the packing, chunk by chunk).

    Raises:
        WeightsError: Some weightless initializers (or leaves of derived ones) are not in the
            checkpoint, or some checkpoint tensors have another shape or dtype than their
            initializer (all are listed).
    """
    source = open_weights(weights)
    found: dict[ir.Value, ir.TensorProtocol] = {}
    missing: list[str] = []
    mismatched: list[str] = []
    ignored = 0
    converted: list[str] = []
    packs = PackCache()  # (one quantization per packed weight for all its parts)

    def lookup(
        name: str, spec: ir.TensorProtocol | Leaf, aliases: Sequence[str], what: str
    ) -> ir.TensorProtocol | _Converted | None:
        keys = [_renamed(k, rename) for k in (name, *aliases)]
        hit = _first_stored(source, keys)
        if hit is None:
            close = difflib.get_close_matches(name, source.names(), n=1)
            hint = f" (closest key: {close[0]!r})" if close else ""
            missing.append(f"{what} {_spec(spec)}{hint}")
            return None
        key, stored = hit
        shape, dtype = _shape_dtype(spec)
        if _shape_dtype(stored)[0] != shape or not _convertible(stored.dtype, dtype):
            mismatched.append(
                f"{what}: the model expects {_spec(spec)}, {source.where(key)!r} holds "
                f"{key!r} as {_spec(stored)}"
            )
            return None
        if stored.dtype != dtype:
            converted.append(f"{key!r} {stored.dtype.name} → {dtype.name}")
            return _Converted(stored, dtype, name)
        return stored

    for graph in model.graphs():
        for value in graph.initializers.values():
            tensor = value.const_value
            if tensor is None:
                continue
            name = value.name or ""
            if isinstance(tensor, DerivedTensor):
                leaves = {}
                for leaf in tensor.recipe.leaves():
                    what = f"{leaf.name!r} (a leaf of derived initializer {name!r})"
                    if leaf not in leaves:
                        leaves[leaf] = lookup(leaf.name, leaf, leaf.aliases, what)
                present = {leaf: t for leaf, t in leaves.items() if t is not None}
                if len(present) == len(leaves):  # (else each missing leaf is listed)
                    found[value] = _derived_tensor(name, tensor, present, packs)
                    packs.expect(tensor.recipe)
                continue
            weightless = isinstance(tensor, WeightlessTensor)
            if not weightless:
                keys = [_renamed(name, rename)]
                key = next((k for k in keys if k is not None and source.get(k) is not None), None)
                if key is None:
                    continue
                if not override:
                    ignored += 1
                    continue
            aliases = tensor.aliases if isinstance(tensor, WeightlessTensor) else ()
            stored = lookup(name, tensor, aliases, repr(name))
            if isinstance(stored, _Converted):
                found[value] = stored.renamed(name)
            elif stored is not None:
                found[value] = stored.renamed(name) if hasattr(stored, "renamed") else stored
    if ignored:
        logger.info(
            "irkit.save: %d initializer(s) have data already; their checkpoint tensors are not "
            "used (pass override=True to use them).",
            ignored,
        )
    if missing or mismatched:
        raise WeightsError(
            _problems(missing, mismatched, source.description),
            [m.split("'")[1] for m in missing + mismatched],
        )
    if converted:
        logger.info(
            "irkit.save: %d checkpoint tensor(s) are converted to the model's dtype while "
            "streaming (first: %s)",
            len(converted),
            converted[0],
        )
    logger.info("irkit.save: %d initializer(s) from %s", len(found), source.description)
    return found


_FLOATS = frozenset(
    {ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16, ir.DataType.DOUBLE}
)


def _convertible(stored: ir.DataType, wanted: ir.DataType) -> bool:
    return stored == wanted or (stored in _FLOATS and wanted in _FLOATS)


def _shape_dtype(spec: ir.TensorProtocol | Leaf) -> tuple[tuple[int, ...], ir.DataType]:
    if isinstance(spec, Leaf):
        return spec.shape, spec.dtype
    return tuple(int(d) for d in spec.shape.numpy()), spec.dtype


_WIDENING = frozenset(
    {
        (ir.DataType.FLOAT16, ir.DataType.FLOAT),
        (ir.DataType.FLOAT16, ir.DataType.DOUBLE),
        (ir.DataType.BFLOAT16, ir.DataType.FLOAT),
        (ir.DataType.BFLOAT16, ir.DataType.DOUBLE),
        (ir.DataType.FLOAT, ir.DataType.DOUBLE),
    }
)
"""Conversions that are exact: no value changes, none becomes non-finite (nothing to check)."""

_DEFERRED = frozenset({(ir.DataType.FLOAT16, ir.DataType.FLOAT)})
"""Exact conversions the packing does itself, chunk by chunk (numpy casts float16 natively)."""


class _Converted:
    """A checkpoint tensor read and converted to another float dtype (on demand)."""

    def __init__(self, stored: ir.TensorProtocol, dtype: ir.DataType, name: str) -> None:
        self.stored, self.dtype, self.name = stored, dtype, name

    def numpy(self, *, exact_as_stored: bool = False) -> np.ndarray:
        """The converted values; with ``exact_as_stored``, the stored array itself when the
        packing converts it exactly on its own (float16 for a float32 model)."""
        data = self.stored.numpy()
        conversion = (self.stored.dtype, self.dtype)
        if exact_as_stored and conversion in _DEFERRED:
            return data
        if conversion in _WIDENING:
            return data.astype(self.dtype.numpy())
        with np.errstate(over="ignore"):  # (counted below)
            out = data.astype(self.dtype.numpy())
        created = int(np.count_nonzero(np.isfinite(data) & ~np.isfinite(out)))
        if created:
            raise WeightsError(
                f"{self.name!r}: converting the checkpoint's {self.stored.dtype.name} tensor to "
                f"the model's {self.dtype.name} creates {created} non-finite value(s) (values "
                f"outside {self.dtype.name}'s range). Fix: export the model in a wider dtype, "
                "or scale the weights.",
                [self.name],
            )
        return out

    def as_tensor(self) -> ir.TensorProtocol:
        """A tensor whose bytes are converted when written."""
        shape = ir.Shape(_shape_dtype(self.stored)[0])
        return ir.LazyTensor(
            lambda: ir.Tensor(self.numpy(), dtype=self.dtype), self.dtype, shape, name=self.name
        )

    def renamed(self, name: str) -> ir.TensorProtocol:
        """The converting tensor under the initializer's name."""
        return _Converted(self.stored, self.dtype, name).as_tensor()


def _first_stored(
    source: WeightSource, keys: Sequence[str | None]
) -> tuple[str, ir.TensorProtocol] | None:
    """The first of ``keys`` the checkpoint holds, with its tensor."""
    for key in keys:
        stored = None if key is None else source.get(key)
        if key is not None and stored is not None:
            return key, stored
    return None


def _derived_tensor(
    name: str,
    tensor: DerivedTensor,
    leaves: Mapping[Leaf, ir.TensorProtocol | _Converted],
    packs: PackCache,
) -> ir.TensorProtocol:
    """A tensor whose bytes are computed from the leaves' tensors when written (a packed part
    through ``packs``: the first part of a packed weight computes and keeps its siblings)."""

    def read(leaf: Leaf) -> np.ndarray:
        return leaves[leaf].numpy()

    def read_stored(leaf: Leaf) -> np.ndarray:  # (the packing converts float16 per chunk)
        stored = leaves[leaf]
        return stored.numpy(exact_as_stored=True) if isinstance(stored, _Converted) else read(leaf)

    def compute() -> ir.TensorProtocol:
        value = evaluate(tensor.recipe, read, packs, read_stored=read_stored)
        return ir.Tensor(value, dtype=tensor.dtype, name=name)

    return ir.LazyTensor(compute, tensor.dtype, ir.Shape(tuple(tensor.shape)), name=name)


def _renamed(name: str, rename: Rename | None) -> str | None:
    if rename is None:
        return name
    if isinstance(rename, Mapping):
        return rename.get(name, name)
    return rename(name)


def _spec(tensor: ir.TensorProtocol | Leaf) -> str:
    shape, dtype = _shape_dtype(tensor)
    return f"{dtype.name}{list(shape)}"


def _problems(missing: Sequence[str], mismatched: Sequence[str], where: str) -> str:
    lines = []
    if missing:
        lines.append(f"{len(missing)} weightless initializer(s) have no tensor in {where}:")
        lines += [f"  - {m}" for m in missing[:_MAX_LISTED]]
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
    progress: WriteProgress | None = None,
) -> list[ir.ExternalTensor]:
    """Write ``tensors`` (in order) into ``data_name`` next to the model, or into shards of at
    most ``max_shard_size`` bytes; one tensor in memory at a time. Returns the external tensors
    (same order) that point at the bytes written. Every file is fsynced and atomically replaces
    its destination (:func:`irkit.weights._writer.write_data_file`: kernel copies, rolling
    write-behind); the layout is onnx-ir's (``convert_tensors_to_external``): tensors packed in
    order, those larger than ``align_threshold`` at multiples of ``max(4096, alignment)``.
    ``progress`` is called after each tensor (its name and byte count).

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
            write_data_file(members, offsets, directory / name, progress=progress)
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
