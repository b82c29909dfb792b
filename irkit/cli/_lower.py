"""``irkit lower``: a saved ``ExportedProgram`` (``.pt2``) to ONNX. The one command that needs torch."""

from __future__ import annotations

import argparse
import importlib
import logging
import pathlib
import sys
import time
import zipfile
from collections.abc import Callable
from typing import Any

from irkit.cli._common import (
    EXIT_OK,
    EXIT_PROBLEMS,
    CommandLineError,
    add_external_data,
    count_nodes,
    describe_values,
    external_data,
    input_file,
    output_file,
    report_error,
    side_file,
)
from irkit.errors import ModelLoadError, UnsupportedOpError

__all__ = ["COMMANDS"]

logger = logging.getLogger(__name__)

_EPILOG = """\
examples:
  irkit lower model.pt2                        # writes model.onnx next to it
  irkit lower model.pt2 -o model.onnx --optimize
  irkit lower model.pt2 -o flat.onnx --no-functions --opset 18
  irkit lower model.pt2 -o model.onnx --max-depth 2 --external-data
  irkit lower model.pt2 -o model.onnx --import my_ops --decompose-custom-ops
  irkit lower model.pt2 --dim input_ids:0=batch --dim input_ids:1=seq

MODEL is a file written by torch.export.save(exported_program, "model.pt2"). Programs that use
custom ops need the module registering them: --import it. torch.export.save does not keep the
names of torch.export.Dim: a loaded program's dims are s77, s17, …; --dim names them (the
summary lists the inputs' dims). The input file is never modified."""


def _arguments(p: argparse.ArgumentParser) -> None:
    from irkit._pipeline import TARGETS

    p.add_argument("model", metavar="MODEL", help="a .pt2 file written by torch.export.save")
    p.add_argument("-o", "--output", help="the ONNX file to write (default: MODEL with .onnx)")
    p.add_argument("--opset", type=int, help="default-domain ONNX opset (default: irkit's, 23)")
    p.add_argument(
        "--functions",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="module calls become ONNX local functions (default); --no-functions: a flat graph",
    )
    p.add_argument(
        "--max-depth",
        type=int,
        metavar="N",
        help="only outline module calls at most N deep (top-level modules are 1)",
    )
    p.add_argument("--optimize", action="store_true", help="run irkit.optimize before saving")
    p.add_argument(
        "--target",
        choices=sorted(TARGETS),
        help="optimize for this target (implies --optimize; default onnx)",
    )
    p.add_argument(
        "--decompose-custom-ops",
        action="store_true",
        help="lower torch.library custom ops without a lowering by tracing their Python code",
    )
    p.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        metavar="MODULE",
        help="import MODULE before loading (registers the custom ops the program uses); repeatable",
    )
    p.add_argument(
        "--dim",
        dest="dims",
        action="append",
        default=[],
        metavar="INPUT:AXIS=NAME",
        help="name a symbolic dim: INPUT:AXIS=NAME (axis AXIS of input INPUT) or SYMBOL=NAME "
        "(s77=batch); every size derived from it follows (2*batch); repeatable",
    )
    add_external_data(p)


def _dim_names(specs: list[str], program: Any) -> dict[str, str]:
    """``--dim`` options as ``irkit.lower``'s ``dim_names`` (torch symbol → name)."""
    import torch  # noqa: TID251 -- only `irkit lower` needs torch, imported when it runs

    shapes: dict[str, tuple[Any, ...]] = {}
    user = set(program.graph_signature.user_inputs)
    for node in program.graph.nodes:
        val = node.meta.get("val")
        if node.op == "placeholder" and node.name in user and isinstance(val, torch.Tensor):
            shapes[node.name] = tuple(val.shape)
    names: dict[str, str] = {}
    for spec in specs:
        key, eq, name = spec.partition("=")
        if not eq or not key or not name:
            raise CommandLineError(f"--dim {spec!r}: expected INPUT:AXIS=NAME or SYMBOL=NAME")
        symbol = _dim_symbol(key, spec, shapes) if ":" in key else key
        if names.get(symbol, name) != name:
            raise CommandLineError(f"--dim {spec!r}: {key} is {symbol!r}, named {names[symbol]!r}")
        names[symbol] = name
    return names


def _dim_symbol(key: str, spec: str, shapes: dict[str, tuple[Any, ...]]) -> str:
    """The torch symbol of ``INPUT:AXIS``, or a one-line error listing the dynamic dims."""
    dynamic = [
        f"{name}:{axis} ({size})"
        for name, shape in shapes.items()
        for axis, size in enumerate(shape)
        if not isinstance(size, int)
    ]
    listing = ", ".join(dynamic) or "none: every input dim is static"
    name, _, axis_text = key.rpartition(":")
    shape = shapes.get(name)
    if shape is None:
        raise CommandLineError(
            f"--dim {spec!r}: no tensor input {name!r}; inputs: {', '.join(shapes)}"
        )
    try:
        axis = int(axis_text)
        size = shape[axis]
    except (ValueError, IndexError):
        raise CommandLineError(
            f"--dim {spec!r}: {name!r} has {len(shape)} axes; its dynamic dims: {listing}"
        ) from None
    if isinstance(size, int):
        raise CommandLineError(
            f"--dim {spec!r}: {key} is static (size {size}); dynamic dims: {listing}"
        )
    expr = size.node.expr
    if not expr.is_Symbol:
        raise CommandLineError(
            f"--dim {spec!r}: {key} is {expr}, derived from other dims; name those: {listing}"
        )
    return str(expr)


def _load_program(path: pathlib.Path, imports: list[str]) -> Any:
    for name in imports:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise CommandLineError(
                f"--import {name!r}: cannot import it ({exc}). Is it on PYTHONPATH?"
            ) from exc
    if not zipfile.is_zipfile(path):  # what torch.export.save writes is a zip archive
        raise ModelLoadError(
            f"{str(path)!r}: not a torch.export program (not a zip archive). irkit lower reads "
            "a .pt2 file written by torch.export.save(exported_program, 'model.pt2')"
        )
    import torch  # noqa: TID251 -- only `irkit lower` needs torch, imported when it runs

    # On a bad file torch logs the real error (a warning with a traceback), then raises a
    # generic one: keep its records out of the terminal and use them for the one-line error.
    torch_log = logging.getLogger("torch.export")
    records = _Records()
    handlers, propagate = torch_log.handlers, torch_log.propagate
    if not logger.isEnabledFor(logging.DEBUG):  # -vv shows torch's logs as they are
        torch_log.handlers, torch_log.propagate = [], False
    torch_log.addHandler(records)
    try:
        return torch.export.load(path)
    except Exception as exc:  # zipfile, pickle, torch and custom-op errors alike
        cause: BaseException = exc
        logged = [r.exc_info[1] for r in records.records if r.exc_info and r.exc_info[1]]
        if logged:
            cause = logged[-1]
        while cause.__cause__ is not None:  # the innermost error says what is wrong
            cause = cause.__cause__
        first = " ".join(str(cause).split()).split(". ")[0].rstrip(".")[:200]
        message = f"{type(cause).__name__}: {first}"
        raise ModelLoadError(
            f"{str(path)!r}: cannot be loaded as a torch.export program "
            f"({message}). Is it a file written by torch.export.save? "
            "If it uses custom ops, --import the module that defines them."
        ) from exc
    finally:
        torch_log.handlers, torch_log.propagate = handlers, propagate


class _Records(logging.Handler):
    """Collects log records (torch's explanation of a failed load)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def _lower_program(args: argparse.Namespace, program: Any) -> Any:
    import irkit

    return irkit.lower(
        program,
        dim_names=_dim_names(args.dims, program) or None,
        opset=args.opset,
        functions=args.functions,
        max_depth=args.max_depth,
        decompose_custom_ops=args.decompose_custom_ops,
        verbose=not args.quiet and (args.verbose > 0 or sys.stderr.isatty()),
    )


def _lower(args: argparse.Namespace) -> int:
    import irkit

    source = input_file(args.model, "a .pt2 file")
    if source.suffix.lower() == ".onnx":
        raise CommandLineError(
            f"{args.model!r}: is an ONNX file; irkit lower reads a .pt2 written by "
            "torch.export.save (for ONNX files: irkit optimize, irkit check, irkit view)"
        )
    destination = output_file(args.output or str(source.with_suffix(".onnx")), source)
    if args.opset is not None and args.opset < 1:
        raise CommandLineError(f"--opset {args.opset}: must be a positive opset number")
    if args.max_depth is not None and args.max_depth < 1:
        raise CommandLineError(f"--max-depth {args.max_depth}: must be 1 or more")
    if args.max_depth is not None and not args.functions:
        raise CommandLineError("--max-depth applies to functions; drop --no-functions")
    times: dict[str, float] = {}
    t0 = time.perf_counter()
    program = _load_program(source, args.imports)
    times["load"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    try:
        model = _lower_program(args, program)
    except UnsupportedOpError as exc:
        custom = [op[0] for op in exc.ops if not op[0].startswith("aten::")]
        if args.decompose_custom_ops or not custom:
            raise
        status = report_error("irkit lower", exc, args.model)
        sys.stderr.write(
            "  or, on the command line: --decompose-custom-ops traces the Python "
            f"implementation of {', '.join(custom)}\n"
        )
        return status or EXIT_PROBLEMS
    times["lower"] = time.perf_counter() - t0
    fired: dict[str, int] = {}
    if args.optimize or args.target:
        t0 = time.perf_counter()
        report = irkit.RewriteReport()
        irkit.optimize(model, args.target or "onnx", report=report)
        fired = report.fired
        times["optimize"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    irkit.save(model, destination, external_data=external_data(args))
    times["save"] = time.perf_counter() - t0
    if not args.quiet:
        _summary(args, destination, model, fired, times, _unnamed_dims(model, program))
    return EXIT_OK


def _summary(
    args: argparse.Namespace,
    destination: pathlib.Path,
    model: Any,
    fired: dict[str, int] | None,
    times: dict[str, float],
    unnamed_dims: str | None = None,
) -> None:
    main_nodes, function_nodes = count_nodes(model)
    calls = sum(1 for n in model.graph if (n.domain, n.op_type, n.overload) in model.functions)
    size = destination.stat().st_size
    side = side_file(args, destination, model)
    if side is not None and side.exists():
        size += side.stat().st_size
    out = sys.stdout
    out.write(f"{args.model} → {destination}  ({size / 1e6:.1f} MB)\n")
    out.write(f"  opset       {model.opset_imports.get('', '?')}\n")
    out.write(
        f"  nodes       {main_nodes} in the main graph ({calls} call(s)), "
        f"{function_nodes} in {len(model.functions)} function(s)\n"
    )
    out.write(f"  weights     {len(model.graph.initializers)} initializers\n")
    for title, values in (("inputs", model.graph.inputs), ("outputs", model.graph.outputs)):
        for i, line in enumerate(describe_values(values)):
            out.write(f"  {title if i == 0 else '':<11} {line}\n")
    if unnamed_dims:
        out.write(f"  dims        {unnamed_dims}\n")
    if fired:
        rules = ", ".join(
            f"{k} ×{v}" for k, v in sorted(fired.items(), key=lambda kv: (-kv[1], kv[0]))
        )
        out.write(f"  optimized   {rules}\n")
    out.write("  time        " + ", ".join(f"{k} {v:.2f} s" for k, v in times.items()) + "\n")


def _unnamed_dims(model: Any, program: Any) -> str | None:
    """Which input dims still have torch's symbol names, and how to name them."""
    symbols = {str(s) for s in program.range_constraints}
    unnamed: dict[str, str] = {}
    for value in model.graph.inputs:
        for axis, dim in enumerate(value.shape or ()):
            name = getattr(dim, "value", None)
            if name in symbols:
                unnamed.setdefault(name, f"{value.name}:{axis}")
    if not unnamed:
        return None
    first, where = next(iter(unnamed.items()))
    return (
        f"{', '.join(unnamed)}: torch's names (torch.export.save keeps no Dim names); "
        f"name them: --dim {where}=NAME (or --dim {first}=NAME)"
    )


_Command = tuple[
    str, str, Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]
]

COMMANDS: dict[str, _Command] = {
    "lower": (
        "lower a saved torch.export program (.pt2) to ONNX, module calls as functions",
        _EPILOG,
        _arguments,
        _lower,
    ),
}
