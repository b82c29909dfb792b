"""Saving, loading and checking ONNX models (no torch needed)."""

from __future__ import annotations

import contextlib
import logging
import os
import pathlib
import shlex
import zipfile
from collections.abc import Callable, Iterator, Mapping

import onnx
import onnx_ir as ir

from irkit import _runtime
from irkit._lint import lint
from irkit._optional_outputs import drop_unused_optional_outputs
from irkit._runtime import runtime_problems, unknown_to_onnx
from irkit.errors import CheckError, IrkitError, ModelLoadError, SaveError
from irkit.weights import (
    Rename,
    WeightlessTensor,
    from_marker,
    parse_size,
    resolve_weights,
    weightless_initializers,
    write_external,
)

__all__ = ["save", "load", "check", "check_external_data", "EXTERNAL_DATA_THRESHOLD_BYTES"]

EXTERNAL_DATA_THRESHOLD_BYTES = 1_500_000_000
"""Above this total initializer size :func:`save` writes weights to ``<file>.data``.

Protobuf cannot serialize messages of 2 GiB or more, so a margin below that is kept.
"""

_INLINE_LIMIT_BYTES = 256  # smaller tensors stay in the .onnx file (as onnx_ir.save does)

logger = logging.getLogger(__name__)


def save(
    model: ir.Model,
    path: str | os.PathLike[str],
    *,
    external_data: bool | str | None = None,
    weights: object = None,
    rename: Rename | None = None,
    override: bool = False,
    max_shard_size: int | str | None = None,
    alignment: int | None = None,
    progress: Callable[[str, int], None] | None = None,
) -> pathlib.Path:
    """Serialize ``model`` to ``path``, streaming weights from a checkpoint if given.

    The model is not modified, and the output is deterministic: the same model (and weights)
    gives byte-identical files. Optional node outputs nothing reads (a ``LayerNormalization``'s
    statistics, a last ``SkipSimplifiedLayerNormalization``'s sum) are left out of the file, so
    the runtime does not compute them (``irkit._optional_outputs``).

    A model lowered from a program on the ``meta`` device has weightless initializers (dtype and
    shape, no data). ``weights`` fills them: a state_dict, a ``.safetensors`` file, or a folder
    written by ``save_pretrained`` (shards and ``model.safetensors.index.json``). Initializers
    are matched by name (the parameter's fully qualified name), through ``rename`` if given.
    Each tensor is copied from the checkpoint into the external data file on its own, file to
    file: memory use does not grow with the model. External data files are fsynced: when
    ``save`` returns, the weights are on disk. Without ``weights``, a weightless model is saved
    as a graph whose initializers have no data; :func:`load` says so when reading it.

    Args:
        model: The model to save.
        path: Destination ``.onnx`` file. Parent directories must exist.
        external_data: ``None`` (default) stores weights in a side file ``<name>.data`` only when
            they exceed :data:`EXTERNAL_DATA_THRESHOLD_BYTES`; ``True`` always does; ``False``
            never does; a string names the side file (relative to ``path``'s directory).
        weights: Where the weights of weightless initializers are (see above).
        rename: Initializer name → checkpoint key: a mapping (names not in it are kept) or a
            function (returning ``None`` skips the name).
        override: Also take the checkpoint's tensor for initializers that have data already
            (by default they keep their own).
        max_shard_size: Split external data into files of at most this many bytes (an int, or
            text like ``"5GB"``), named ``<name>-00001-of-0000N.data``. A larger tensor gets
            a file of its own.
        alignment: Align the offset of each tensor larger than this many bytes (at least 4096)
            in the data files to a multiple of it, so that runtimes can memory-map them.
        progress: Called with each external tensor's name and byte count once it is written
            (a progress display).

    Returns:
        The path written.

    Raises:
        SaveError: The destination directory does not exist, the model is too large for a
            single file and ``external_data=False`` was given, or an option is invalid.
        WeightsError: ``weights`` lacks a weightless initializer's tensor, or holds one with
            another shape or dtype (the message lists them, with the file), or is unreadable.

    Example:
        >>> import irkit, onnx_ir as ir
        >>> m = ir.from_onnx_text('<ir_version: 10, opset_import: ["" : 21]> g (float[2] x) => (float[2] y) { y = Relu(x) }')
        >>> p = irkit.save(m, __import__("tempfile").mkdtemp() + "/relu.onnx")
        >>> irkit.load(p).graph.node(0).op_type
        'Relu'
    """
    path = pathlib.Path(path)
    if not path.parent.is_dir():
        raise SaveError(
            f"Cannot save to {str(path)!r}: directory {str(path.parent)!r} does not exist. "
            "Create it first."
        )
    shard_bytes = None if max_shard_size is None else parse_size(max_shard_size)
    if alignment is not None and (not isinstance(alignment, int) or alignment <= 0):
        raise SaveError(f"alignment={alignment!r}: give a positive number of bytes, e.g. 4096.")
    if (
        weights is not None
        and rename is not None
        and not (callable(rename) or isinstance(rename, Mapping))
    ):
        raise SaveError(f"rename must be a mapping or a function, got {type(rename).__name__}.")
    filled = {} if weights is None else resolve_weights(model, weights, rename, override)
    tensors: dict[ir.Value, ir.TensorProtocol] = {}
    unfilled: list[ir.Value] = []
    for graph in model.graphs():
        for value in graph.initializers.values():
            tensor = filled.get(value, value.const_value)
            if isinstance(tensor, WeightlessTensor):
                unfilled.append(value)  # serialized as dims and dtype only
            if tensor is not None:
                tensors[value] = tensor
    if unfilled:
        logger.warning(
            "irkit.save: %d initializer(s) have no data (first: %r): %s is saved without them; "
            "pass weights=... to irkit.save to write them.",
            len(unfilled),
            unfilled[0].name,
            str(path),
        )
    without = set(unfilled)
    size = sum(t.nbytes for v, t in tensors.items() if v not in without)
    if external_data is None:
        external_data = size > EXTERNAL_DATA_THRESHOLD_BYTES or shard_bytes is not None
    if external_data is False and size > EXTERNAL_DATA_THRESHOLD_BYTES:
        raise SaveError(
            f"Model weights take {size / 2**30:.2f} GiB, too large for one protobuf file "
            f"({str(path)!r}). Pass external_data=True (or None) to irkit.save."
        )
    if external_data is not False:
        data_name = external_data if isinstance(external_data, str) else f"{path.name}.data"
        _externalize(tensors, unfilled, path.parent, data_name, shard_bytes, alignment, progress)
    with _swapped(tensors):
        try:
            proto = ir.serde.serialize_model(model)
        except ir.serde.SerdeError as exc:  # a tensor computed while serialized failed
            cause = _irkit_cause(exc)
            if cause is None:
                raise
            raise cause from exc
    drop_unused_optional_outputs(proto)  # (the runtime would compute them: irkit._optional_outputs)
    path.write_bytes(proto.SerializeToString())
    return path


def _irkit_cause(exc: BaseException) -> IrkitError | None:
    """The irkit error behind ``exc`` (onnx-ir wraps what a tensor raises while serialized)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, IrkitError):
            return seen
        seen = seen.__cause__
    return None


def _externalize(
    tensors: dict[ir.Value, ir.TensorProtocol],
    unfilled: list[ir.Value],
    directory: pathlib.Path,
    data_name: str,
    shard_bytes: int | None,
    alignment: int | None,
    progress: Callable[[str, int], None] | None = None,
) -> None:
    """Write the large tensors to external data; ``tensors`` then maps to the written copies
    (small external tensors are read into memory: they are stored inline)."""
    skip = set(unfilled)
    large = [v for v, t in tensors.items() if v not in skip and t.nbytes > _INLINE_LIMIT_BYTES]
    external = set(large)
    for value, tensor in tensors.items():
        if value not in external and isinstance(tensor, ir.ExternalTensor):
            tensors[value] = ir.Tensor(tensor.numpy(), dtype=tensor.dtype, name=tensor.name)
    written = write_external(  # (an empty data file when nothing is large, as onnx_ir.save does)
        [tensors[v] for v in large],
        directory,
        data_name,
        max_shard_size=shard_bytes,
        alignment=alignment,
        align_threshold=max(4096, alignment or 0),  # smaller tensors are packed
        progress=progress,
    )
    for value, tensor in zip(large, written, strict=True):
        tensors[value] = tensor


@contextlib.contextmanager
def _swapped(tensors: Mapping[ir.Value, ir.TensorProtocol]) -> Iterator[None]:
    """Within the block, each initializer holds the tensor to serialize; restored on exit."""
    before = {value: value.const_value for value in tensors}
    try:
        for value, tensor in tensors.items():
            value.const_value = tensor
        yield
    finally:
        for value, old in before.items():
            value.const_value = old


def load(path: str | os.PathLike[str], *, load_external_data: bool = True) -> ir.Model:
    """Load an ONNX file into an ``onnx_ir.Model``.

    Args:
        path: The ``.onnx`` file.
        load_external_data: If False, weights stored in side files are referenced lazily and
            not checked (what ``irkit view`` wants), and a model saved without weights loads
            with weightless initializers (to save with ``weights=`` later; with True, that is a
            :class:`~irkit.errors.ModelLoadError`).

    Returns:
        The model; external weights are memory-mapped on first use.

    Raises:
        ModelLoadError: The file is missing, is not an ONNX model, is truncated, or (with
            ``load_external_data=True``) references an external data file that is missing or
            shorter than the weights it should hold.
    """
    path = pathlib.Path(path)
    if not path.exists():
        raise ModelLoadError(f"{str(path)!r}: no such file")
    if path.is_dir():
        raise ModelLoadError(f"{str(path)!r}: is a directory, not an ONNX file")
    try:
        model = _with_weightless(_read(path), path, load_external_data)
    except ModelLoadError:
        raise
    except Exception as exc:  # protobuf raises DecodeError, onnx raises various
        _refuse_program(path)
        raise ModelLoadError(
            f"{str(path)!r}: not a valid ONNX model ({type(exc).__name__}: {exc}). "
            "Is the file truncated or of another format?"
        ) from exc
    if model.ir_version in (0, None) or (len(model.graph) == 0 and not model.graph.outputs):
        _refuse_program(path)
        raise ModelLoadError(  # (protobuf parses an empty or cut file as an empty model)
            f"{str(path)!r}: not an ONNX model (no ir_version or no graph). "
            "Is the file empty, truncated or of another format?"
        )
    if load_external_data:
        check_external_data(model, path)
    return model


def _read(path: pathlib.Path) -> ir.Model:
    """``onnx_ir.load`` of ``path``, with the types and shapes of function inputs kept.

    onnx-ir (1.1) deserializes a function's inputs from their names alone, dropping the
    ``value_info`` entries it wrote for them: each is applied here to the input it names, where
    the input has no type and no shape (the library's own, where a version reads them, wins).
    """
    proto = onnx.load(path, load_external_data=False)  # weights are memory-mapped on use
    model = ir.serde.deserialize_model(proto)
    ir.external_data.set_base_dir(model.graph, path.parent)
    for function_proto in proto.functions:
        function = model.functions[
            (function_proto.domain, function_proto.name, function_proto.overload)
        ]
        infos = {info.name: info for info in function_proto.value_info}
        for value in function.inputs:
            info = infos.get(value.name or "")
            if info is not None and value.type is None and value.shape is None:
                ir.serde.deserialize_value_info_proto(info, value)
    return model


def _refuse_program(path: pathlib.Path) -> None:
    """A file that is not ONNX but a zip archive (what torch.export.save writes): say so."""
    if zipfile.is_zipfile(path):
        onnx_name = shlex.quote(str(path.with_suffix(".onnx")))
        raise ModelLoadError(
            f"{str(path)!r}: a zip archive (a .pt2 written by torch.export.save?), not an ONNX "
            f"model. Lower it to ONNX first: irkit lower {shlex.quote(str(path))} -o {onnx_name}"
        )


def check_external_data(
    model: ir.Model, path: str | os.PathLike[str], *, fix: str = "Copy it next to the model."
) -> None:
    """Check that every external weight file of ``model`` exists and is long enough.

    Args:
        model: A model loaded from ``path``.
        path: The ``.onnx`` file (named in the message).
        fix: The how-to-fix sentence for a missing file (``irkit view`` adds its option).

    Raises:
        ModelLoadError: An external data file is missing or shorter than a weight needs.
    """
    for value in model.graph.initializers.values():
        tensor = value.const_value
        if not isinstance(tensor, ir.ExternalTensor):
            continue
        location = pathlib.Path(tensor.base_dir) / tensor.location
        if not location.is_file():
            raise ModelLoadError(
                f"{str(path)!r}: external data file {str(location)!r} for initializer "
                f"{value.name!r} is missing. {fix}"
            )
        end = (tensor.offset or 0) + (tensor.length or 0)
        size = location.stat().st_size
        if size < end:
            raise ModelLoadError(
                f"{str(path)!r}: external data file {str(location)!r} is truncated "
                f"({size} bytes, initializer {value.name!r} needs {end})."
            )


def check(model: ir.Model, *, full_check: bool = True, runtime: bool = True) -> ir.Model:
    """Check ``model``: irkit's own invariants (:func:`irkit.lint`), then ``onnx.checker``, then
    what the installed onnxruntime would refuse.

    Args:
        model: The model to check; it is not modified.
        full_check: Also run strict shape inference, as ``onnx.checker.check_model`` does. A
            model with ops onnx has no schema for (onnxruntime's contrib ops, e.g. after
            ``irkit.optimize(model, "ort")``) is instead loaded by onnxruntime (CPU,
            optimizations off), whose inference knows them (with ``runtime``; without it, or
            without onnxruntime, that model's strict check is skipped, with a warning).
        runtime: Also report, when onnxruntime is installed, what its CPU provider cannot run:
            an opset import newer than it loads (``opset 99``), a node whose op version has no
            kernel (and no function body it could expand). Without onnxruntime nothing is
            reported.

    Returns:
        ``model`` itself, so it can sit between stages.

    Raises:
        CheckError: Lint, the checker, shape inference or onnxruntime's limits rejected the
            model (``problems`` lists onnxruntime's, one line each), or the model cannot be
            serialized.

    Example:
        >>> import irkit, onnx_ir as ir
        >>> m = ir.from_onnx_text('''<ir_version: 10, opset_import: ["" : 21, "pkg" : 1]>
        ...   g (float[2] x) => (float[2] y) { y = pkg.Missing(x) }''')
        >>> m.graph.node(0).metadata_props["irkit.call"] = '["m",0,"pkg.mod.Missing"]'
        >>> irkit.check(m)
        Traceback (most recent call last):
        ...
        irkit.errors.CheckError: irkit.lint found 1 problem:
          - node ... calls function pkg::Missing (overload ''), which the model does not define. ...
    """
    lint(model, allow_unused_functions=True)
    weightless = weightless_initializers(model)
    if weightless:
        logger.warning(
            "irkit.check: %d initializer(s) have no data (first: %r); the graph is checked with "
            "them as inputs. Save with irkit.save(model, path, weights=...) to add the data.",
            len(weightless),
            weightless[0].name,
        )
    try:
        proto = ir.serde.serialize_model(model)
        _weightless_as_inputs(proto, {v.name for v in weightless if v.graph is model.graph})
    except Exception as exc:  # onnx-ir raises SerdeError (and others) on malformed models
        raise CheckError(
            f"the model cannot be serialized ({type(exc).__name__}: {exc}); it is malformed."
        ) from exc
    if proto.ByteSize() > EXTERNAL_DATA_THRESHOLD_BYTES:
        raise CheckError(
            "Model too large to check in memory; save it with irkit.save and run "
            "onnx.checker.check_model on the path."
        )
    # onnx's strict inference cannot type onnxruntime's contrib ops (their outputs come out
    # null inside function bodies): for such a model onnxruntime's own inference is the strict one
    contrib = unknown_to_onnx(model) if full_check else []
    try:
        onnx.checker.check_model(proto, full_check=full_check and not contrib)
    except onnx.checker.ValidationError as exc:
        raise CheckError(f"onnx.checker rejected the model: {exc}") from exc
    except onnx.shape_inference.InferenceError as exc:
        raise CheckError(f"ONNX shape inference rejected the model: {exc}") from exc
    problems = runtime_problems(model) if runtime else []
    if contrib and runtime and not problems:
        refused = _runtime.session_problem(proto)
        if refused is not None:
            raise CheckError(
                f"onnxruntime's type and shape inference rejected the model (it uses "
                f"{', '.join(contrib[:5])}, which onnx's checker has no schema for): {refused}"
            )
    if contrib and (not runtime or _runtime.ort_version() is None):
        logger.warning(
            "irkit.check: the model uses %s, which onnx's shape inference cannot type, and "
            "onnxruntime is not asked (runtime=False) or not installed: the strict shape check "
            "was skipped.",
            ", ".join(contrib[:5]),
        )
    if problems:
        lines = [f"onnxruntime cannot run the model ({len(problems)} problem(s)):"]
        raise CheckError("\n".join([*lines, *(f"  - {p}" for p in problems)]), problems)
    return model


def _weightless_as_inputs(proto: onnx.ModelProto, names: set[str | None]) -> None:
    """Turn the main graph's data-less initializers into typed inputs (the checker wants data)."""
    if not names:
        return
    graph = proto.graph
    kept = [t for t in graph.initializer if t.name not in names]
    dropped = [t for t in graph.initializer if t.name in names]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    declared = {i.name for i in graph.input}
    for tensor in dropped:
        if tensor.name not in declared:
            graph.input.append(
                onnx.helper.make_tensor_value_info(tensor.name, tensor.data_type, tensor.dims)
            )


def _with_weightless(model: ir.Model, path: pathlib.Path, load_external_data: bool) -> ir.Model:
    """Initializers saved without data become weightless again (or an error, if data is wanted)."""
    weightless = []
    for graph in model.graphs():
        for value in graph.initializers.values():
            marker = from_marker(value.const_value)
            if marker is not None:
                weightless.append(value)
                value.const_value = marker
    if weightless and load_external_data:
        raise ModelLoadError(
            f"{str(path)!r} was saved without weights: {len(weightless)} initializer(s) have no "
            f"data (first: {weightless[0].name!r}). Fix: load the graph with "
            "irkit.load(path, load_external_data=False) and write the weights with "
            "irkit.save(model, path, weights=<state_dict | .safetensors | folder>)."
        )
    return model
