"""``irkit.lower``: plan, emit, assemble the model."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import onnx
import onnx_ir as ir
import torch
from onnx_ir.passes.common import InlinePass
from onnxscript import values as osv
from onnxscript.function_libs.torch_lib import _constants as torchlib_constants

from irkit import metadata
from irkit._runtime import newest_opset, ort_version
from irkit._version import __version__
from irkit.errors import LoweringError, LoweringOptionsError
from irkit.lowering._control_flow import convert_keeping_functions, uses_predispatch_vmap
from irkit.lowering._emit import Emitter
from irkit.lowering._legalize import legalize_kernel_types
from irkit.lowering._plan import Plan, assumptions, describe, make_plan, needs_functionalization
from irkit.lowering._recorder import Recorder
from irkit.lowering._registry import LoweringTable
from irkit.lowering._retrace import run_decompositions
from irkit.lowering._signatures import store_call_signatures
from irkit.lowering._source import node_location, op_name, python_spelling
from irkit.lowering._view_writes import functionalize_view_writes

__all__ = [
    "lower_program",
    "check_opset",
    "supported_opsets",
    "DEFAULT_OPSET",
    "TORCHLIB_OPSET",
    "IR_VERSION",
]

logger = logging.getLogger(__name__)

TORCHLIB_OPSET = 18
"""The default-domain opset torchlib's functions are written against."""

DEFAULT_OPSET = 23
"""Default opset of lowered models: recent, run by onnxruntime, and what the fusions target."""

IR_VERSION = 10
"""ONNX IR version of lowered models (10 is the first with node ``metadata_props``)."""

_MIN_OPSET = 7


def lower_program(
    exported_program: torch.export.ExportedProgram,
    *,
    opset: int | None,
    custom_lowerings: Mapping[Any, Callable[..., Any]] | None,
    decompose_custom_ops: bool = False,
    input_names: Sequence[str] | None,
    output_names: Sequence[str] | None,
    verbose: bool,
    dim_names: Mapping[str, str] | None = None,
) -> ir.Model:
    """See :func:`irkit.lower`."""
    if not isinstance(exported_program, torch.export.ExportedProgram):
        raise LoweringOptionsError(
            f"irkit.lower expects a torch.export.ExportedProgram, got "
            f"{type(exported_program).__name__}. Fix: call torch.export.export(model, args) first."
        )
    opset_arg = opset
    if opset is not None:
        check_opset(opset)
    start = time.perf_counter()
    table = LoweringTable(custom_lowerings, decompose_custom_ops=decompose_custom_ops)
    ep = exported_program
    if uses_predispatch_vmap(ep.graph):  # (associative_scan, torch.vmap): a new program
        logger.info("irkit.lower: the program holds vmap nodes; running its decompositions.")
        ep = run_decompositions(ep)
    plan = make_plan(ep.graph, table)
    inplace = needs_functionalization(ep.graph, plan)
    if inplace:
        local = functionalize_view_writes(ep, {n: plan.choices[n].functional for n in inplace})
        local_plan = make_plan(local.graph, table) if local is not None else None
        if (
            local is not None
            and local_plan is not None
            and not needs_functionalization(local.graph, local_plan)
        ):
            logger.info(
                "irkit.lower: %d in-place write(s) into views of computed tensors (first: %s) "
                "made functional where they are.",
                len(inplace),
                inplace[0].name,
            )
            ep, plan, inplace = local, local_plan, []
    if inplace:
        logger.info(
            "irkit.lower: %d in-place op(s) mutate inputs or aliased tensors (first: %s); "
            "functionalizing the program.",
            len(inplace),
            inplace[0].name,
        )
        t0 = time.perf_counter()
        ep = run_decompositions(ep)  # returns a new program; the input is not modified
        logger.info("irkit.lower: functionalization took %.2fs", time.perf_counter() - t0)
        plan = make_plan(ep.graph, table)
    logger.info("irkit.lower: plan %s", describe(plan))
    _warn_assumptions(plan)

    recorder = Recorder(osv.Opset("", TORCHLIB_OPSET))
    with _progress(len(ep.graph.nodes), verbose) as tick:
        emitter = Emitter(
            ep,
            recorder,
            input_names=input_names,
            output_names=output_names,
            dim_names=dim_names,
            progress=tick,
        )
        graph = emitter.run(plan)
    model = _assemble(graph, recorder)
    opset = _runnable_opset(model, requested=opset_arg)
    if opset != TORCHLIB_OPSET:
        convert_keeping_functions(model, lambda m: _convert_opset(m, opset))
    legalize_kernel_types(model)
    store_call_signatures(model, emitter.call_signatures())
    logger.info(
        "irkit.lower: %d FX nodes -> %d ONNX nodes in %.2fs",
        len(ep.graph.nodes),
        len(model.graph),
        time.perf_counter() - start,
    )
    return model


def supported_opsets() -> tuple[range, str]:
    """The default-domain opsets :func:`irkit.lower` writes, and where the newest comes from.

    The oldest is 7 (below torchlib's 18 the model is converted down, with onnx's converter as
    the fallback of onnxscript's); the newest is the newest opset the installed onnx knows (its
    converter and checker go no further) and, when onnxruntime is installed, that it loads.
    """
    known = onnx.defs.onnx_opset_version()
    newest, why = known, f"the newest onnx {onnx.__version__} knows"
    loads = newest_opset("")
    if loads is not None and loads <= known:
        newest = loads
        why = (
            f"{why} and onnxruntime {ort_version()} loads"
            if loads == known
            else (f"the newest onnxruntime {ort_version()} loads")
        )
    return range(_MIN_OPSET, newest + 1), why


def check_opset(opset: object) -> None:
    """Raise if ``opset`` is not a default-domain opset :func:`irkit.lower` can write.

    Raises:
        LoweringOptionsError: Not an int, or outside :func:`supported_opsets`.
    """
    supported, why = supported_opsets()
    span = f"{supported[0]} to {supported[-1]} ({supported[-1]}: {why})"
    if not isinstance(opset, int) or isinstance(opset, bool):
        raise LoweringOptionsError(f"opset={opset!r}: give an int; irkit lowers to opsets {span}.")
    if opset not in supported:
        raise LoweringOptionsError(
            f"opset {opset} is not supported: irkit lowers to opsets {span}. Fix: pass an "
            f"opset in that range, or leave it unset (default {DEFAULT_OPSET})."
        )


def _assemble(graph: ir.Graph, recorder: Recorder) -> ir.Model:
    graph.opset_imports[""] = TORCHLIB_OPSET
    model = ir.Model(
        graph,
        ir_version=IR_VERSION,
        producer_name=metadata.MODEL_PRODUCER,
        producer_version=__version__,
    )
    if recorder.functions:
        # The few torchlib functions written as onnxscript scripts were emitted as calls;
        # inline exactly those (the call node's metadata is copied onto the inlined nodes).
        domain = torchlib_constants.DOMAIN
        for identifier, function in recorder.functions.items():
            model.functions[identifier] = function
        graph.opset_imports[domain] = 1
        InlinePass(criteria=lambda f: f.domain == domain)(model)
        for identifier in [i for i in model.functions if i[0] == domain]:
            del model.functions[identifier]
        graph.opset_imports.pop(domain, None)
    return model


# Ops whose newer versions onnxruntime's CPU provider has no kernel for: (domain, op) → the
# first default-domain opset it cannot run them at. A model containing one gets a lower default
# opset, so that every file irkit writes loads in onnxruntime.
_ORT_UNSUPPORTED_FROM: Mapping[tuple[str, str], int] = {
    ("", "RandomNormal"): 22,
    ("", "RandomNormalLike"): 22,
    ("", "RandomUniform"): 22,
    ("", "RandomUniformLike"): 22,
    ("", "Multinomial"): 22,
    ("", "Bernoulli"): 22,
    ("", "RoiAlign"): 22,  # torchvision::roi_align
}


def _runnable_opset(model: ir.Model, requested: int | None) -> int:
    """The model's opset: the requested one, or the default lowered to what onnxruntime runs.

    Raises:
        LoweringError: ``requested`` is an opset at which onnxruntime cannot run an emitted op.
    """
    limit, culprit = DEFAULT_OPSET, None
    for node in ir.traversal.RecursiveGraphIterator(model.graph):
        first_bad = _ORT_UNSUPPORTED_FROM.get((node.domain, node.op_type))
        if first_bad is not None and first_bad - 1 < limit:
            limit, culprit = first_bad - 1, node
    if requested is None:
        if culprit is not None:
            logger.info(
                "irkit.lower: opset %d (not %d): onnxruntime has no kernel for %s at newer opsets",
                limit,
                DEFAULT_OPSET,
                culprit.op_type,
            )
        return limit
    if culprit is not None and requested > limit:
        props = culprit.metadata_props
        raise LoweringError(
            f"onnxruntime has no kernel for {culprit.op_type} at opset {requested} (its newest "
            f"runnable opset is {limit}). Fix: pass opset={limit}, or leave opset unset.",
            fx_node=props.get(metadata.FX_NODE, ""),
            target=props.get(metadata.FX_TARGET, culprit.op_type),
            source=props.get(metadata.SOURCE, ""),
        )
    return requested


def _convert_opset(model: ir.Model, opset: int) -> None:
    from onnxscript.version_converter import convert_version

    try:
        convert_version(model, opset, fallback=True)
    except Exception as exc:
        raise LoweringOptionsError(
            f"could not convert the model from opset {TORCHLIB_OPSET} to opset {opset}: {exc}. "
            f"Fix: use opset >= {TORCHLIB_OPSET}."
        ) from exc
    model.graph.opset_imports[""] = opset


class _progress:
    """A tqdm bar on a terminal, periodic log lines otherwise; nothing unless ``verbose``."""

    def __init__(self, total: int, verbose: bool):
        self.total, self.verbose, self.done, self._bar, self._next_log = (
            total,
            verbose,
            0,
            None,
            0.25,
        )

    def __enter__(self) -> Callable[[int], None] | None:
        if not self.verbose:
            return None
        if sys.stderr.isatty():
            try:
                from tqdm import tqdm

                self._bar = tqdm(total=self.total, desc="irkit.lower", unit="node", leave=False)
            except ImportError:
                pass
        return self._tick

    def _tick(self, n: int) -> None:
        self.done += n
        if self._bar is not None:
            self._bar.update(n)
        elif self.done >= self._next_log * self.total:
            # Explicitly requested progress output (verbose=True) on a non-terminal.
            sys.stderr.write(f"irkit.lower: {self.done}/{self.total} FX nodes lowered\n")
            self._next_log += 0.25

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.close()


def _warn_assumptions(plan: Plan) -> None:
    """One warning per (op, condition) a decomposition silently assumed (see ``_trace``)."""
    seen: dict[tuple[str, str], list[torch.fx.Node]] = {}
    for node, target, condition in assumptions(plan):
        seen.setdefault((op_name(target), condition), []).append(node)
    for (op, condition), nodes in seen.items():
        first = nodes[0]
        where = node_location(first)
        logger.warning(
            "irkit.lower: torch's decomposition of %s branches on %s, which the program's "
            "dynamic dims do not decide; the ONNX graph follows the branch the example inputs "
            "took (%d node(s), first: FX node %r%s). Check the outputs at sizes on the other "
            "side, or pass custom_lowerings={%s: fn} to lower the op yourself.",
            op,
            condition,
            len(nodes),
            first.name,
            f" at {where}" if where else "",
            python_spelling(target),
        )
