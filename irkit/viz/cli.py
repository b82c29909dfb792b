"""``irkit view`` / ``irkit-viz`` / ``python tools/viz.py`` (checkout): show any ONNX file.

Errors a user can cause (missing or broken file, missing external data, ``--layout dot``
without Graphviz) print one line ``irkit-viz: error: …`` (``irkit view: error: …`` when run as
``irkit view``: :func:`main`'s ``prog``) and exit with status 2; ``--debug`` shows the traceback.
"""

from __future__ import annotations

import argparse
import logging
import os
import pathlib
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, NoReturn, TextIO

if TYPE_CHECKING:
    import onnx_ir as ir

__all__ = ["main", "build_parser", "load_model"]

logger = logging.getLogger(__name__)

FORMATS = ("text", "onnx-text", "dot", "svg", "html", "json")
# The output suffixes each format may be written to (-o); the first format listing a suffix is
# the one it implies. Any other suffix is refused: a picture irkit does not draw (.png) would
# otherwise receive text.
FORMAT_SUFFIXES = {
    "text": (".txt", ".text"),
    "onnx-text": (".onnxtxt", ".onnxtext", ".txt"),
    "dot": (".dot", ".gv"),
    "svg": (".svg",),
    "html": (".html", ".htm"),
    "json": (".json",),
}


PROG = "irkit-viz"


class _Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose usage errors are one line and a hint (exit status 2)."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: error: {message} (see '{self.prog} --help')\n")
        sys.exit(2)


def _depth(text: str) -> int:
    try:
        depth = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if depth < 1:
        raise argparse.ArgumentTypeError(
            f"must be 1 or more (1: the main graph's calls only), got {depth}"
        )
    return depth


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    """The argument parser; ``prog`` names the command in usage and error lines."""
    p = _Parser(
        prog=prog,
        description="Show an ONNX model: call hierarchy, op histogram, inputs/outputs; "
        "DOT/SVG pictures, a one-file interactive HTML page, JSON, and diffs.",
    )
    p.add_argument("model", help="the .onnx file (from irkit or elsewhere)")
    p.add_argument(
        "--format",
        "-f",
        choices=FORMATS,
        help="output format (default: from -o's suffix, else text)",
    )
    p.add_argument(
        "-o",
        "--output",
        help="write to this file instead of standard output; its suffix, if any, is one of the "
        "format's: .txt/.text, .onnxtxt, .dot/.gv, .svg, .html/.htm, .json",
    )
    p.add_argument(
        "--depth",
        type=_depth,
        metavar="N",
        help="deepest call level in the tree, N >= 1 (1: the main graph's calls only; "
        "default: all)",
    )
    p.add_argument(
        "--function",
        metavar="NAME",
        help="show one body: a function name, domain::name, a module path, or 'main'",
    )
    p.add_argument(
        "--expand",
        action="append",
        default=[],
        metavar="GLOB",
        help="list grouped calls whose module path matches GLOB one by one (repeatable)",
    )
    p.add_argument(
        "--stats",
        action="store_true",
        help="add estimated FLOPs and op counts per module, and a function table",
    )
    p.add_argument(
        "--layout",
        choices=("builtin", "dot"),
        default="builtin",
        help="how SVG and HTML are laid out: builtin (igraph for SVG, dagre inside the HTML "
        "page; nothing to install) or dot (Graphviz's dot program, if you have it)",
    )
    p.add_argument("--diff", metavar="OTHER", help="compare with OTHER.onnx, module by module")
    p.add_argument(
        "--color",
        choices=("auto", "always", "never"),
        default="auto",
        help="ANSI colour (auto: only on a terminal and when NO_COLOR is unset)",
    )
    p.add_argument(
        "--allow-missing-data",
        action="store_true",
        help="show a model even if its external weight files are missing",
    )
    p.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    return p


def load_model(path: str, *, allow_missing_data: bool = False) -> ir.Model:
    """:func:`irkit.load` without reading external weights, but checking that they are present;
    what :func:`irkit.lint` finds broken is logged as a warning (the model is still shown).

    Raises:
        ModelLoadError: Missing, not ONNX, truncated, or external data missing/short.
    """
    from irkit._io import check_external_data, load
    from irkit._lint import lint
    from irkit.errors import CheckError

    model = load(path, load_external_data=False)
    if not allow_missing_data:
        fix = "Copy it next to the model, or pass --allow-missing-data."
        check_external_data(model, path, fix=fix)
    try:
        lint(model, allow_unused_functions=True)
    except CheckError as exc:  # show a broken model anyway, and say what is broken
        problems = exc.problems or [str(exc)]
        first, more = problems[0], len(problems) - 1
        others = f" (and {more} more problem{'s' if more > 1 else ''})" if more else ""
        logger.warning("%r is broken (irkit.lint): %s%s", path, first, others)
    return model


def _use_color(choice: str, stream: TextIO) -> bool:
    if choice != "auto":
        return choice == "always"
    return "NO_COLOR" not in os.environ and hasattr(stream, "isatty") and stream.isatty()


# Which formats each view option shapes; anything else is refused rather than silently ignored.
_OPTION_FORMATS = {
    "depth": ("text", "html"),
    "expand": ("text", "html"),
    "stats": ("text",),
    "function": ("text", "onnx-text", "dot", "svg", "html"),
}


def _check_options(args: argparse.Namespace, fmt: str) -> None:
    from irkit.errors import VizError

    if args.layout == "dot" and fmt not in ("svg", "html"):
        raise VizError(f"--layout dot does not apply with --format {fmt}; it lays out svg / html")
    for option, formats in _OPTION_FORMATS.items():
        if getattr(args, option) and (fmt not in formats or args.diff):
            where = "with --diff" if args.diff else f"with --format {fmt}"
            raise VizError(
                f"--{option} does not apply {where}; it shapes --format {' / '.join(formats)}"
            )


def output_format(given: str | None, output: str | None) -> str:
    """The format to write: ``given`` (``--format``), else the one ``output``'s suffix names,
    else text.

    Raises:
        VizError: ``output`` has a suffix no format is written to, or one of another format.
    """
    from irkit.errors import VizError

    suffix = pathlib.PurePath(output or "").suffix.lower()
    if not suffix:
        return given or "text"
    implied = [fmt for fmt, suffixes in FORMAT_SUFFIXES.items() if suffix in suffixes]
    if given is not None and given not in implied:
        suffixes = "/".join(FORMAT_SUFFIXES[given])
        raise VizError(
            f"-o {output!r}: --format {given} is written to a {suffixes} file (or one without "
            "a suffix); rename the output"
        )
    if not implied:
        known = ", ".join(f"{f} ({'/'.join(s)})" for f, s in FORMAT_SUFFIXES.items())
        raise VizError(
            f"-o {output!r}: no format is written to a {suffix} file; the formats: {known}"
        )
    return given or implied[0]


def _render(args: argparse.Namespace, fmt: str, color: bool) -> str:
    from irkit.errors import VizError
    from irkit.viz import _dot, _json, _summary, _text

    _check_options(args, fmt)
    model = load_model(args.model, allow_missing_data=args.allow_missing_data)
    name = pathlib.Path(args.model).name
    if args.diff:
        return _render_diff(args, fmt, color, model, name)
    if fmt == "onnx-text":
        return _onnx_text(model, args.function)
    summary = _summary.summarize(model, name=name)
    body = None
    if args.function:
        body = summary.find_body(args.function)
        if body is None:
            names = ", ".join(sorted(b.key for b in summary.bodies.values()))
            raise VizError(
                f"{args.model!r} has no function or module {args.function!r}. Functions: {names}"
            )
    if fmt == "text":
        if body is not None:
            return _text.render_function_text(summary, body, color)
        options = _text.TextOptions(
            depth=args.depth, expand=tuple(args.expand), stats=args.stats, color=color
        )
        return _text.render_text(summary, options)
    if fmt == "json":
        return _json.render_json(summary)
    if fmt == "dot" or (fmt == "svg" and args.layout == "dot"):
        dot = _dot.body_dot(summary, body or summary.root.body).source
        return dot if fmt == "dot" else _dot.layout_svg([dot])[0]
    if fmt == "svg":
        from irkit.viz import _graph, _svg

        return _svg.layout_graph_svg(_graph.body_graph(summary, body or summary.root.body))
    from irkit.viz import _html

    page = _html.HtmlOptions(depth=args.depth, expand=tuple(args.expand), function=args.function)
    return _html.render_html(summary, options=page, layout=args.layout)


def _onnx_text(model: ir.Model, function: str | None) -> str:
    import onnx_ir as ir

    from irkit.errors import VizError

    if function is None:
        return ir.to_onnx_text(model, exclude_initializers=True) + "\n"
    import onnx.printer

    for f in model.functions.values():
        if function in (f.name, f"{f.domain}::{f.name}"):
            return onnx.printer.to_text(ir.to_proto(f)) + "\n"
    raise VizError(f"no function {function!r} (onnx-text takes a function name)")


def _render_diff(
    args: argparse.Namespace, fmt: str, color: bool, model: ir.Model, name: str
) -> str:
    from irkit.errors import VizError
    from irkit.viz import _diff, _summary

    other = load_model(args.diff, allow_missing_data=args.allow_missing_data)
    a = _summary.summarize(model, name=name)
    b = _summary.summarize(other, name=pathlib.Path(args.diff).name)
    if a.name == b.name:
        a.name, b.name = args.model, args.diff
    diff = _diff.diff_summaries(a, b)
    if fmt == "text":
        return _diff.render_diff_text(diff, color)
    if fmt == "json":
        return _diff.render_diff_json(diff)
    if fmt == "html":
        from irkit.viz import _html

        return _html.render_diff_html(diff, layout=args.layout)
    raise VizError(f"--diff supports --format text, json or html, not {fmt!r}")


def main(argv: Sequence[str] | None = None, *, prog: str = PROG) -> int:
    """Run the command line; returns the exit status (0 ok, 2 user error).

    Args:
        argv: The arguments (default: ``sys.argv[1:]``).
        prog: The command's name in usage, log and error lines (``"irkit view"`` under
            ``irkit``).
    """
    try:
        args = build_parser(prog).parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2), already printed
        return exc.code if isinstance(exc.code, int) else 2
    logging.basicConfig(
        level=logging.DEBUG if args.debug else logging.WARNING,
        format=f"{prog}: %(levelname)s: %(message)s",
    )
    stream = sys.stdout
    color = _use_color(args.color, stream) and args.output is None
    try:
        from irkit.errors import IrkitError

        try:
            text = _render(args, output_format(args.format, args.output), color)
        except IrkitError as exc:
            if args.debug:
                raise
            message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            print(f"{prog}: error: {message}", file=sys.stderr)
            return 2
        if args.output:
            pathlib.Path(args.output).write_text(text, encoding="utf-8")
        else:
            stream.write(text)
            stream.flush()
    except BrokenPipeError:  # `irkit-viz model.onnx | head`
        sys.stderr.close()
        return 0
    except OSError as exc:
        if args.debug:
            raise
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
