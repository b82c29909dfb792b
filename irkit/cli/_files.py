"""``irkit optimize``, ``irkit check`` and ``irkit view``: any ONNX file, no torch needed."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import onnx_ir as ir

from irkit._shapes import infer_shapes
from irkit.cli._common import (
    EXIT_OK,
    CommandLineError,
    add_external_data,
    count_nodes,
    external_data,
    input_file,
    output_file,
    refuse_overwriting_weights,
    side_file,
)
from irkit.errors import ModelLoadError

if TYPE_CHECKING:
    from irkit.rewriting import RuleSet

__all__ = ["COMMANDS", "VIEW_SUMMARY", "view", "load_onnx", "load_rules", "infer_shapes"]

logger = logging.getLogger(__name__)

VIEW_SUMMARY = "show an ONNX file: call tree, op histogram, HTML/SVG/DOT/JSON, diffs"

_OPTIMIZE_EPILOG = """\
examples:
  irkit optimize exported.onnx -o optimized.onnx
  irkit optimize model.onnx -o fast.onnx --max-opset 21      # no fusions into newer ops
  irkit optimize model.onnx -o out.onnx --rules my_rules:RULES
  irkit optimize model.onnx -o out.onnx --explain LayerNormalization   # why it did not fire

Runs ONNX shape inference first (exporters leave most intermediate values without a shape, and
many rules need one; --no-shape-inference skips it), then irkit.optimize. Prints the rules that
fired and the node counts before and after (main graph + functions). Local functions are kept.
The input file is never modified."""

_CHECK_EPILOG = """\
examples:
  irkit check model.onnx
  irkit check model.onnx -q && echo valid

Runs irkit.check: irkit's own invariants (irkit.lint), then onnx.checker with full shape
inference, then what the installed onnxruntime (CPU) cannot run: an opset newer than it loads,
an op version it has no kernel for. Exit status 1 with one line per problem if the model has any."""

_VIEW_EPILOG = """\
examples:
  irkit view model.onnx                         # the call tree, op histogram, inputs/outputs
  irkit view model.onnx --format html -o model.html
  irkit view model.onnx --diff optimized.onnx   # what changed, per module

The same as irkit-viz and, in a checkout, python tools/viz.py (docs/viz.md)."""


def load_onnx(path: str) -> ir.Model:
    """Load an ONNX file (external weights checked); one-line errors for unreadable files."""
    import irkit

    source = input_file(path, "an ONNX file")
    model = irkit.load(source)
    if model.ir_version in (0, None) or (len(model.graph) == 0 and not model.graph.outputs):
        raise ModelLoadError(
            f"{path!r}: not an ONNX model (no ir_version or no graph). "
            "Is the file empty, truncated or of another format?"
        )
    return model


def load_rules(spec: str) -> RuleSet:
    """Import ``module:attr`` and return the rules it names (a zero-argument factory is called).

    Raises:
        CommandLineError: The spec is malformed, the module or attribute does not exist, or the
            object is not a rule, a rule set or a list of them.
    """
    from irkit.rewriting import BaseRule, RuleSet

    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise CommandLineError(
            f"--rules {spec!r}: expected MODULE:NAME, e.g. irkit.rules:default_rules"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise CommandLineError(
            f"--rules {spec!r}: cannot import module {module_name!r} ({exc}). Is it on PYTHONPATH?"
        ) from exc
    if not hasattr(module, attr):
        raise CommandLineError(f"--rules {spec!r}: module {module_name!r} has no {attr!r}")
    rules = getattr(module, attr)
    if callable(rules) and not isinstance(rules, BaseRule | RuleSet):
        rules = rules()
    items = [rules] if isinstance(rules, BaseRule | RuleSet) else rules
    if not isinstance(items, list | tuple) or not all(
        isinstance(r, BaseRule | RuleSet) for r in items
    ):
        raise CommandLineError(
            f"--rules {spec!r}: is a {type(rules).__name__}, not a rule, a RuleSet or a list "
            "of them"
        )
    return RuleSet(spec, list(items)) if not isinstance(rules, RuleSet) else rules


def _optimize_arguments(p: argparse.ArgumentParser) -> None:
    from irkit._pipeline import TARGETS

    p.add_argument(
        "model", metavar="MODEL", help="the ONNX file to optimize (from irkit or any exporter)"
    )
    p.add_argument("-o", "--output", required=True, help="where to write the optimized model")
    p.add_argument(
        "--target",
        choices=sorted(TARGETS),
        default="onnx",
        help="what the model will run on; picks the default rules (default: onnx)",
    )
    p.add_argument(
        "--rules",
        metavar="MODULE:NAME",
        help="use these rules instead of the target's: a RuleSet, a rule, a list of them or a "
        "function returning one, imported from MODULE",
    )
    p.add_argument(
        "--explain",
        metavar="RULE",
        help="print where RULE almost matched and why it did not (near misses)",
    )
    p.add_argument(
        "--max-opset",
        type=int,
        metavar="N",
        help="the newest ONNX opset the runtime supports: no fusion into newer ops",
    )
    p.add_argument("--no-fold", action="store_true", help="skip constant folding")
    p.add_argument(
        "--no-shape-inference",
        action="store_true",
        help="skip ONNX shape inference before optimizing (fewer rules can fire)",
    )
    add_external_data(p)


def _optimize(args: argparse.Namespace) -> int:
    import irkit

    source = input_file(args.model, "an ONNX file")
    destination = output_file(args.output, source)
    rules = load_rules(args.rules) if args.rules else None
    if args.explain is not None:
        from irkit._pipeline import TARGETS

        rule_set = rules if rules is not None else TARGETS[args.target].rules()
        if args.explain not in rule_set.names():
            raise CommandLineError(
                f"--explain {args.explain!r}: no such rule in {rule_set.name!r}; rules: "
                f"{', '.join(rule_set.names())}"
            )
    start = time.perf_counter()
    model = load_onnx(args.model)
    loaded = time.perf_counter()
    refuse_overwriting_weights(side_file(args, destination, model), model)
    main_before, functions_before = count_nodes(model)
    report = irkit.RewriteReport()
    if not args.no_shape_inference:
        infer_shapes(model)
    inferred = time.perf_counter()
    irkit.optimize(
        model,
        args.target,
        rules=rules,
        opset=args.max_opset,
        fold_constants=not args.no_fold,
        explain=args.explain,
        report=report,
        infer_shapes=False,  # (done above, timed on its own; or refused with the flag)
    )
    optimized = time.perf_counter()
    main_after, functions_after = count_nodes(model)
    irkit.save(model, destination, external_data=external_data(args))
    saved = time.perf_counter()
    if args.quiet:
        return EXIT_OK
    out = sys.stdout
    out.write(f"{args.model} → {args.output}\n")
    functions = ""
    if functions_before or functions_after:
        functions = (
            f", {functions_before} → {functions_after} in {len(model.functions)} function(s)"
        )
    out.write(f"  nodes       {main_before} → {main_after} in the main graph{functions}\n")
    fired = sorted(report.fired.items(), key=lambda kv: (-kv[1], kv[0]))
    if fired:
        out.write(f"  rules fired {report.total_fired} time(s):\n")
        for name, n in fired:
            out.write(f"    {name:<32} ×{n}\n")
    else:
        out.write("  rules fired 0 times\n")
    inference = "" if args.no_shape_inference else f"shape inference {inferred - loaded:.2f} s, "
    out.write(
        f"  time        {optimized - loaded:.2f} s optimize ({inference}"
        f"load {loaded - start:.2f} s, save {saved - optimized:.2f} s)\n"
    )
    if args.explain is not None:
        first, *rest = report.explain().splitlines()
        out.write(f"  explain     {args.explain}: {first}\n")
        for line in rest:
            out.write(f"    {line.strip()}\n")
    if args.verbose:
        out.write(str(report) + "\n")
    return EXIT_OK


def _check_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", metavar="MODEL", help="the ONNX file to check")
    p.add_argument(
        "--no-shape-inference",
        action="store_true",
        help="skip onnx.checker's strict shape inference (faster on huge models)",
    )
    p.add_argument(
        "--no-runtime-check",
        action="store_true",
        help="do not report what the installed onnxruntime cannot run (opsets, op versions)",
    )


def _check(args: argparse.Namespace) -> int:
    import irkit

    model = load_onnx(args.model)
    irkit.check(model, full_check=not args.no_shape_inference, runtime=not args.no_runtime_check)
    if not args.quiet:
        main_nodes, function_nodes = count_nodes(model)
        sys.stdout.write(
            f"{args.model}: ok — {main_nodes} nodes in the main graph, "
            f"{len(model.functions)} function(s) with {function_nodes} nodes, "
            f"opset {model.opset_imports.get('', '?')}\n"
        )
    return EXIT_OK


def view(argv: Sequence[str]) -> int:
    """``irkit view …``: :func:`irkit.viz.cli.main` with the same arguments."""
    from irkit.viz import cli

    if any(a in ("-h", "--help") for a in argv):
        parser = cli.build_parser("irkit view")
        parser.epilog = _VIEW_EPILOG
        parser.formatter_class = argparse.RawDescriptionHelpFormatter
        parser.print_help()
        return EXIT_OK
    status: int = cli.main(list(argv), prog="irkit view")
    return status


_Command = tuple[
    str, str, Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]
]

COMMANDS: dict[str, _Command] = {
    "optimize": (
        "optimize any ONNX file: fold constants, fuse, clean up (functions are kept)",
        _OPTIMIZE_EPILOG,
        _optimize_arguments,
        _optimize,
    ),
    "check": (
        "check an ONNX file: irkit's invariants, onnx.checker and shape inference",
        _CHECK_EPILOG,
        _check_arguments,
        _check,
    ),
}
