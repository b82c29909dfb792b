"""What the subcommands share: exit statuses, error reporting, paths and model summaries."""

from __future__ import annotations

import argparse
import pathlib
import sys
from collections.abc import Sequence

import onnx_ir as ir

from irkit._irutil import nested_subgraphs
from irkit.errors import (
    CheckError,
    IrkitError,
    LoweringOptionsError,
    ModelLoadError,
    SaveError,
    UnknownRuleError,
)

__all__ = [
    "EXIT_OK",
    "EXIT_PROBLEMS",
    "EXIT_USAGE",
    "CommandLineError",
    "report_error",
    "input_file",
    "output_file",
    "add_external_data",
    "external_data",
    "side_file",
    "refuse_overwriting_weights",
    "count_nodes",
    "describe_values",
]

EXIT_OK = 0
EXIT_PROBLEMS = 1
EXIT_USAGE = 2

# Errors about what the user typed or the files they named: exit 2, one line.
_USAGE_ERRORS = (ModelLoadError, SaveError, UnknownRuleError, LoweringOptionsError)


class CommandLineError(IrkitError):
    """A command-line argument cannot be used (a file that is missing or would be overwritten,
    a rule set that cannot be imported, options that do not go together)."""


def _one_line(text: str) -> str:
    return " ".join(text.split())


def report_error(prog: str, exc: BaseException, file: str | None = None) -> int | None:
    """Print ``exc`` for a user and return the exit status; ``None`` if it is a bug.

    Usage errors and unreadable files give one line (status 2); a model with problems gives a
    header line and one line per problem (status 1).
    """
    if isinstance(exc, (CommandLineError, OSError, *_USAGE_ERRORS)):
        message = _one_line(str(exc)) or type(exc).__name__
        if isinstance(exc, OSError) and exc.filename is not None and exc.strerror:
            message = f"{str(exc.filename)!r}: {exc.strerror}"
        sys.stderr.write(f"{prog}: error: {message}\n")
        return EXIT_USAGE
    if not isinstance(exc, IrkitError):
        return None
    if isinstance(exc, CheckError) and exc.problems:
        lines = [_one_line(p) for p in exc.problems]
        header = f"{len(lines)} problem(s)"
    else:
        header, *lines = str(exc).splitlines() or [type(exc).__name__]
    prefix = f"{file!r}: " if file and file not in header else ""
    sys.stderr.write(f"{prog}: error: {prefix}{header}\n")
    for line in lines:
        if line.strip():
            sys.stderr.write(f"  {line.strip()}\n")
    return EXIT_PROBLEMS


def input_file(path: str, what: str) -> pathlib.Path:
    """``path`` as an existing regular file, or a one-line error saying what is wrong."""
    p = pathlib.Path(path)
    if not p.exists():
        raise CommandLineError(f"{path!r}: no such file")
    if p.is_dir():
        raise CommandLineError(f"{path!r}: is a directory, not {what}")
    return p


def output_file(path: str, *inputs: pathlib.Path) -> pathlib.Path:
    """``path`` as a writable destination that is none of ``inputs`` (inputs are never modified)."""
    p = pathlib.Path(path)
    if not p.parent.is_dir():
        raise CommandLineError(
            f"{path!r}: directory {str(p.parent)!r} does not exist. Create it first."
        )
    if p.is_dir():
        raise CommandLineError(f"{path!r}: is a directory; give the output file's name")
    for source in inputs:
        if p.resolve() == source.resolve():
            raise CommandLineError(
                f"{path!r}: is the input file; irkit never overwrites its input. "
                "Choose another output name."
            )
    return p


def add_external_data(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--external-data",
        nargs="?",
        const=True,
        default=None,
        metavar="NAME",
        help="store the weights in a side file (NAME, relative to the output's directory; "
        "default <output>.data). Without this option weights go to a side file only when they "
        "exceed 1.5 GB",
    )
    p.add_argument(
        "--no-external-data",
        dest="external_data",
        action="store_false",
        help="always store the weights inside the .onnx file (fails above 2 GB)",
    )


def external_data(args: argparse.Namespace) -> bool | str | None:
    """The ``external_data=`` argument of :func:`irkit.save` the options ask for."""
    value: bool | str | None = args.external_data
    return value


def side_file(
    args: argparse.Namespace, destination: pathlib.Path, model: ir.Model
) -> pathlib.Path | None:
    """The weights file :func:`irkit.save` writes next to ``destination`` (``None``: none)."""
    from irkit._io import EXTERNAL_DATA_THRESHOLD_BYTES

    value = external_data(args)
    if value is None:
        size = sum(v.const_value.nbytes for v in model.graph.initializers.values() if v.const_value)
        value = size > EXTERNAL_DATA_THRESHOLD_BYTES
    if value is False:
        return None
    return destination.parent / (value if isinstance(value, str) else f"{destination.name}.data")


def refuse_overwriting_weights(side: pathlib.Path | None, model: ir.Model) -> None:
    """Refuse a weights file that is one the input model reads its weights from."""
    if side is None:
        return
    for value in model.graph.initializers.values():
        tensor = value.const_value
        if isinstance(tensor, ir.ExternalTensor):
            used = pathlib.Path(tensor.base_dir) / tensor.location
            if used.resolve() == side.resolve():
                raise CommandLineError(
                    f"--external-data: {str(side)!r} holds the input model's weights; irkit "
                    "never overwrites its input. Choose another name."
                )


def count_nodes(model: ir.Model) -> tuple[int, int]:
    """``(main graph nodes, nodes of all function bodies)``, subgraphs of If/Loop/Scan included
    (their sum is :func:`irkit.rewriting.count_nodes`)."""

    def nodes(graph: ir.Graph | ir.Function) -> int:
        return len(graph) + sum(len(sub) for sub in nested_subgraphs(graph))

    return nodes(model.graph), sum(nodes(f) for f in model.functions.values())


def _value_type(value: ir.Value) -> str:
    dtype = value.dtype.short_name() if value.dtype is not None else "?"
    if value.shape is None:
        return f"{dtype}[?]"
    dims = ",".join(str(d) if d is not None else "?" for d in value.shape)
    return f"{dtype}[{dims}]"


def describe_values(values: Sequence[ir.Value], limit: int = 8) -> list[str]:
    """One ``name  type[shape]`` line per value, at most ``limit`` (then ``… N more``)."""
    lines = [f"{v.name}  {_value_type(v)}" for v in list(values)[:limit]]
    if len(values) > limit:
        lines.append(f"… {len(values) - limit} more")
    return lines
