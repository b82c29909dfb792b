"""Saving, loading and checking ONNX models (no torch needed)."""

from __future__ import annotations

import os
import pathlib

import onnx
import onnx_ir as ir

from irkit._lint import lint
from irkit.errors import CheckError, ModelLoadError, SaveError

__all__ = ["save", "load", "check", "check_external_data", "EXTERNAL_DATA_THRESHOLD_BYTES"]

EXTERNAL_DATA_THRESHOLD_BYTES = 1_500_000_000
"""Above this total initializer size :func:`save` writes weights to ``<file>.data``.

Protobuf cannot serialize messages of 2 GiB or more, so a margin below that is kept.
"""


def _initializer_bytes(model: ir.Model) -> int:
    total = 0
    for value in model.graph.initializers.values():
        tensor = value.const_value
        if tensor is not None:
            total += tensor.nbytes
    return total


def save(
    model: ir.Model,
    path: str | os.PathLike[str],
    *,
    external_data: bool | str | None = None,
) -> pathlib.Path:
    """Serialize ``model`` to ``path``. The model is not modified.

    The output is deterministic: the same model gives a byte-identical file.

    Args:
        model: The model to save.
        path: Destination ``.onnx`` file. Parent directories must exist.
        external_data: ``None`` (default) stores weights in a side file ``<name>.data`` only when
            they exceed :data:`EXTERNAL_DATA_THRESHOLD_BYTES`; ``True`` always does; ``False``
            never does; a string names the side file (relative to ``path``'s directory).

    Returns:
        The path written.

    Raises:
        SaveError: The destination directory does not exist, or the model is too large for a
            single file and ``external_data=False`` was given.

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
    size = _initializer_bytes(model)
    if external_data is None:
        external_data = size > EXTERNAL_DATA_THRESHOLD_BYTES
    if external_data is False and size > EXTERNAL_DATA_THRESHOLD_BYTES:
        raise SaveError(
            f"Model weights take {size / 2**30:.2f} GiB, too large for one protobuf file "
            f"({str(path)!r}). Pass external_data=True (or None) to irkit.save."
        )
    if external_data is False:
        ir.save(model, path)
    else:
        data_name = external_data if isinstance(external_data, str) else f"{path.name}.data"
        ir.save(model, path, external_data=data_name)
    return path


def load(path: str | os.PathLike[str], *, load_external_data: bool = True) -> ir.Model:
    """Load an ONNX file into an ``onnx_ir.Model``.

    Args:
        path: The ``.onnx`` file.
        load_external_data: If False, weights stored in side files are referenced lazily and
            not checked (what ``tools/viz.py`` wants).

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
        model = ir.load(path)
    except Exception as exc:  # protobuf raises DecodeError, onnx raises various
        raise ModelLoadError(
            f"{str(path)!r}: not a valid ONNX model ({type(exc).__name__}: {exc}). "
            "Is the file truncated or of another format?"
        ) from exc
    if model.ir_version in (0, None) or (len(model.graph) == 0 and not model.graph.outputs):
        raise ModelLoadError(  # (protobuf parses an empty or cut file as an empty model)
            f"{str(path)!r}: not an ONNX model (no ir_version or no graph). "
            "Is the file empty, truncated or of another format?"
        )
    if load_external_data:
        check_external_data(model, path)
    return model


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


def check(model: ir.Model, *, full_check: bool = True) -> ir.Model:
    """Check ``model``: irkit's own invariants (:func:`irkit.lint`), then ``onnx.checker``.

    Args:
        model: The model to check; it is not modified.
        full_check: Also run strict shape inference, as ``onnx.checker.check_model`` does.

    Returns:
        ``model`` itself, so it can sit between stages.

    Raises:
        CheckError: Lint, the checker or shape inference rejected the model (the message is
            theirs), or the model cannot be serialized.

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
    try:
        proto = ir.serde.serialize_model(model)
    except Exception as exc:  # onnx-ir raises SerdeError (and others) on malformed models
        raise CheckError(
            f"the model cannot be serialized ({type(exc).__name__}: {exc}); it is malformed."
        ) from exc
    if proto.ByteSize() > EXTERNAL_DATA_THRESHOLD_BYTES:
        raise CheckError(
            "Model too large to check in memory; save it with irkit.save and run "
            "onnx.checker.check_model on the path."
        )
    try:
        onnx.checker.check_model(proto, full_check=full_check)
    except onnx.checker.ValidationError as exc:
        raise CheckError(f"onnx.checker rejected the model: {exc}") from exc
    except onnx.shape_inference.InferenceError as exc:
        raise CheckError(f"ONNX shape inference rejected the model: {exc}") from exc
    return model
