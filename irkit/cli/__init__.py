"""The ``irkit`` command: ``irkit lower``, ``irkit optimize``, ``irkit check``, ``irkit view``.

Every subcommand works on files and never modifies its input files. Exit status: 0 ok, 1 the
model has problems (``irkit check`` found some, lowering or a rewrite rule failed), 2 usage or
unreadable input. Errors are printed on one line naming the file (``irkit lower: error: …``), a
problem list one line per problem; no traceback for a user mistake (``-vv`` shows it).

Only ``irkit lower`` needs torch, and imports it when it runs: the others work without torch.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from typing import NoReturn

from irkit.cli._common import EXIT_PROBLEMS, EXIT_USAGE, CommandLineError, report_error
from irkit.cli._files import infer_shapes

__all__ = [
    "main",
    "build_parser",
    "infer_shapes",
    "CommandLineError",
    "EXIT_PROBLEMS",
    "EXIT_USAGE",
]

_DESCRIPTION = """\
irkit on files: lower a saved torch.export program to ONNX, optimize any ONNX file, check it,
and view it.

examples:
  irkit lower model.pt2 -o model.onnx --optimize
  irkit optimize exported.onnx -o optimized.onnx
  irkit check model.onnx
  irkit view model.onnx --format html -o model.html

'irkit COMMAND --help' describes each command. Exit status: 0 ok, 1 the model has problems,
2 usage error or unreadable input."""


class _Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose usage errors are one line (exit status 2)."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: error: {message} (see '{self.prog} --help')\n")
        sys.exit(EXIT_USAGE)


def _add_verbosity(p: argparse.ArgumentParser) -> None:
    group = p.add_mutually_exclusive_group()
    group.add_argument(
        "-q", "--quiet", action="store_true", help="print nothing but errors (no summary)"
    )
    group.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=0,
        help="more detail: -v adds per-rule statistics and info logs, -vv debug logs and "
        "tracebacks",
    )


def build_parser() -> argparse.ArgumentParser:
    """The ``irkit`` argument parser with its subcommands (``view`` is dispatched separately).

    Each subcommand's parser is also in the returned parser's ``subcommands`` attribute.
    """
    from irkit.cli import _export, _files, _lower, _quantize

    parser = _Parser(
        prog="irkit",
        description=_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    from irkit import __version__

    parser.add_argument("--version", action="version", version=f"irkit {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    subcommands: dict[str, argparse.ArgumentParser] = {}
    for module in (_lower, _files, _quantize, _export):
        for name, (summary, epilog, add_arguments, _) in module.COMMANDS.items():
            p = sub.add_parser(
                name,
                help=summary,
                description=summary,
                epilog=epilog,
                formatter_class=argparse.RawDescriptionHelpFormatter,
            )
            add_arguments(p)
            _add_verbosity(p)
            subcommands[name] = p
    sub.add_parser("view", help=_files.VIEW_SUMMARY, add_help=False)
    parser.set_defaults(subcommands=subcommands)
    return parser


def _configure_logging(args: argparse.Namespace) -> None:
    level = logging.WARNING
    if args.quiet:
        level = logging.ERROR
    elif args.verbose >= 2:
        level = logging.DEBUG
    elif args.verbose == 1:
        level = logging.INFO
    logging.basicConfig(level=level, format="irkit: %(levelname)s: %(message)s")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``irkit`` command line.

    Args:
        argv: The arguments after the program name (default: ``sys.argv[1:]``).

    Returns:
        The exit status: 0 ok, 1 the model has problems, 2 usage error or unreadable input.
    """
    from irkit.cli import _export, _files, _lower, _quantize

    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "view":
        return _files.view(argv[1:])
    parser = build_parser()
    try:
        args, extra = parser.parse_known_args(argv)
        if args.command is None and extra:
            parser.error(
                f"unrecognized arguments: {' '.join(extra)}; expected a COMMAND "
                "(lower, optimize, check, view)"
            )
        if args.command is None:
            parser.print_help(sys.stderr)
            return EXIT_USAGE
        if extra:
            args.subcommands[args.command].error(f"unrecognized arguments: {' '.join(extra)}")
    except SystemExit as exc:  # --help (0) or a usage error (2), already printed
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    _configure_logging(args)
    commands = {**_lower.COMMANDS, **_files.COMMANDS, **_quantize.COMMANDS, **_export.COMMANDS}
    run = commands[args.command][3]
    prog = f"irkit {args.command}"
    try:
        return run(args)
    except BrokenPipeError:  # `irkit check model.onnx | head`
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        sys.stderr.write(f"{prog}: interrupted\n")
        return 130
    except Exception as exc:
        if args.verbose >= 2:
            raise
        status = report_error(prog, exc, getattr(args, "model", None))
        if status is None:  # not a user mistake: a bug, show the traceback
            raise
        return status
