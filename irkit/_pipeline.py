"""Where the stages meet the rule library: targets and their default rule sets.

The rewrite engine (:mod:`irkit.rewriting`) knows no rules; the rule library
(:mod:`irkit.rules`) is written against the engine. This module is the one layer above both: it
binds each optimization target to its default rules, so dependencies point one way
(``_pipeline → rules → rewriting``); the layering contract in ``pyproject.toml``
(``[tool.importlinter]``) forbids the reverse edge.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import types
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import onnx_ir as ir

from irkit import metadata
from irkit import rules as library
from irkit._shapes import infer_shapes, unknown_shape_fraction
from irkit.errors import RewriteError
from irkit.hierarchy import (
    FunctionsOption,
    HierarchyGuard,
    adopt_unscoped,
    keeps_weight_transposes,
    open_module_calls,
    outline,
)
from irkit.rewriting import BaseRule, RewriteReport, RuleSet, cse, optimize_with

__all__ = ["Target", "TARGETS", "lower", "optimize"]


logger = logging.getLogger(__name__)

ExportedProgram = Any
"""``torch.export.ExportedProgram`` (torch is imported only by :mod:`irkit.lowering`)."""


def lower(
    exported_program: ExportedProgram,
    *,
    opset: int | None = None,
    functions: FunctionsOption = True,
    max_depth: int | None = None,
    custom_lowerings: Mapping[Any, Callable[..., Any]] | None = None,
    decompose_custom_ops: bool = False,
    input_names: Sequence[str] | None = None,
    output_names: Sequence[str] | None = None,
    dim_names: Mapping[str, str] | None = None,
    verbose: bool = False,
) -> ir.Model:
    """Lower an ``ExportedProgram`` into an ``onnx_ir.Model``, node by node.

    Each ``call_function`` node is lowered by (first match wins) ``custom_lowerings``, irkit's
    own lowerings for the few ops torchlib lacks, or onnxscript's torchlib. Nodes without any
    lowering are decomposed individually, trying every decomposition torch has (its table and
    Python references, ``CompositeImplicitAutograd`` kernels, primitives' aten
    implementations), recursively; nodes that still have none are reported together in one
    :class:`~irkit.errors.UnsupportedOpError` before anything is emitted. Context regions
    (``torch.no_grad()``, ``torch.autocast``) are lowered inline. Wherever torch promotes dtypes
    implicitly, the ONNX graph casts explicitly. The ExportedProgram is not modified.

    Module calls then become ONNX local functions (``functions=``), identical bodies shared:
    this is the lowering stage (:func:`irkit.lowering.lower`, which yields a flat model)
    followed by :func:`irkit.outline`.
    Every ONNX node carries its module scope, FX node name, target and source location as
    metadata (keys in :mod:`irkit.metadata`).

    Args:
        exported_program: The result of ``torch.export.export``.
        opset: Default-domain opset of the model (default 23, or the newest opset at which
            onnxruntime runs every emitted op, e.g. 21 for random ops). Values below torchlib's
            18 are reached by converting the model with onnxscript's converter.
        functions: Which module calls become ONNX local functions (see :func:`irkit.outline`):
            ``True`` (default, every call), ``False`` (a flat graph), module classes or class
            names, an :class:`irkit.ModuleSelector` (classes and path globs), or a predicate
            ``(module_path, qualified_class) -> bool``. Identical bodies share one function.
        max_depth: Only outline module calls at most this deep (top-level modules are 1).
        custom_lowerings: ``{OpOverload: fn}``; ``fn`` receives the node's arguments
            (``ir.Value`` for tensors), builds ONNX with onnxscript's op builder
            (``from onnxscript import opset18 as op``) and returns the output value(s). Wins
            over every other lowering; works for ``torch.library`` custom ops.
        decompose_custom_ops: Lower a ``torch.library.custom_op`` that has no lowering by tracing
            its Python implementation into aten ops (off by default: a custom op usually stands
            for a kernel the runtime should provide, so its absence is reported instead).
        input_names: Names for the tensor user inputs (default: the names in the program
            signature). Python constants the program was specialized on (``use_cache=True``)
            are not inputs of the ONNX model.
        output_names: Names for the flattened user outputs (default: the FX output names).
        dim_names: Names for symbolic dims, torch's symbol → name (``{"s77": "batch"}``; the
            symbols are the keys of ``exported_program.range_constraints``). Without it a dim
            is named after its ``torch.export.Dim`` where the program remembers it (a program
            in memory does; one read by ``torch.export.load`` does not) and is ``s77``
            otherwise; derived sizes follow (``2*batch``).
        verbose: Show progress (a bar on a terminal, log lines otherwise).

    Returns:
        A new ``onnx_ir.Model``; initializers wrap the program's tensors without copying.

    Raises:
        UnsupportedOpError: Some ops have no lowering (lists all of them).
        LoweringError: Lowering one node failed (names the node, module and source line).
        LoweringOptionsError: Not an ``ExportedProgram``, an unusable opset, name list or
            ``dim_names``.
        OutlineError: Unusable ``functions``/``max_depth`` options.

    Example:
        >>> import torch, irkit
        >>> ep = torch.export.export(torch.nn.Linear(4, 2), (torch.randn(3, 4),))
        >>> model = irkit.lower(ep)
        >>> [n.op_type for n in model.graph]
        ['Gemm']
        >>> class Net(torch.nn.Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.fc = torch.nn.Linear(4, 4)
        ...     def forward(self, x):
        ...         return self.fc(x).relu()
        >>> model = irkit.lower(torch.export.export(Net(), (torch.randn(3, 4),)))
        >>> [(n.domain, n.op_type) for n in model.graph]
        [('torch.nn.modules', 'Linear'), ('', 'Relu')]
    """
    from irkit import lowering  # imports torch: only when lowering

    model: ir.Model = lowering.lower(
        exported_program,
        opset=opset,
        custom_lowerings=custom_lowerings,
        decompose_custom_ops=decompose_custom_ops,
        input_names=input_names,
        output_names=output_names,
        dim_names=dim_names,
        verbose=verbose,
    )
    if functions is not False:
        start = time.perf_counter()
        outline(model, functions, max_depth=max_depth)
        logger.info(
            "irkit.lower: outlined %d function(s) in %.2fs",
            len(model.functions),
            time.perf_counter() - start,
        )
    return model


@dataclasses.dataclass(frozen=True)
class Target:
    """What the optimized model will run on.

    Attributes:
        name: The name users pass (``"onnx"``).
        rules: Returns the default rule set for this target.
        across_calls: Rewrite across module boundaries: the module calls are opened (inlined)
            for the rewrite and outlined again after it (see ``docs/fusion_across_modules.md``).
    """

    name: str
    rules: Callable[[], RuleSet]
    across_calls: bool = False


def _ort_rules() -> RuleSet:
    from irkit.rules import ort  # (the contrib-op library is loaded only for this target)

    return ort.default_rules()


TARGETS: Mapping[str, Target] = types.MappingProxyType(
    {
        "onnx": Target("onnx", library.onnx_target_rules),
        "ort": Target("ort", _ort_rules, across_calls=True),
    }
)
"""Known targets (read-only). ``"onnx"``: standard ONNX ops only (fusions such as ``Gelu``).
``"ort"``: the ``"onnx"`` fusions, then onnxruntime's ``com.microsoft`` contrib ops
(:mod:`irkit.rules.ort`), fused across module boundaries with the hierarchy kept."""


def optimize(
    model: ir.Model,
    target: str = "onnx",
    *,
    rules: RuleSet | BaseRule | Iterable[BaseRule | RuleSet] | None = None,
    opset: int | None = None,
    fold_constants: bool = True,
    explain: str | None = None,
    report: RewriteReport | None = None,
    infer_shapes: bool | None = None,
) -> ir.Model:
    """Optimize ``model`` **in place**: fold constants, apply rules to a fixed point, clean up.

    Steps: ONNX shape inference when the model lacks shapes (see ``infer_shapes``), constant
    folding (``onnxscript.optimizer`` ``FoldConstantsPass``, which never inlines),
    :func:`irkit.rewrite` with the target's default rules (or ``rules``), unused-node removal,
    common-subexpression elimination (main graph and every function body), lifting the main
    graph's ``Constant`` nodes to initializers (IR version 4 and newer: before, an initializer
    must also be a graph input), initializer deduplication, unused-function removal, unique
    value names (subgraphs included). Local functions are kept: the hierarchy survives.

    Args:
        model: The model; modified in place.
        target: ``"onnx"`` (standard ONNX ops only) or ``"ort"`` (onnxruntime ≥ 1.20: the
            ``"onnx"`` fusions, then ``com.microsoft`` contrib ops). For ``"ort"`` the module
            calls are inlined for the rewrite, so rules see across module boundaries, and
            outlined again afterwards: the same modules become functions (a flat model stays
            flat), each fused node belonging to the deepest module that contains all the
            nodes it replaced.
        rules: Rules to use instead of the target's defaults.
        opset: The highest ONNX opset the target runtime supports: fusions into newer ops (e.g.
            ``Gelu`` at 20, ``RMSNormalization`` at 23) do not fire above it. The model's own
            opset is never changed.
        fold_constants: Run constant folding first.
        explain: Record near misses of this rule (see :meth:`RewriteReport.explain`).
        report: If given, filled with the :class:`RewriteReport` of the rewrite, with the time
            of each pass in ``passes``.
        infer_shapes: Give the main graph's values the shapes ONNX shape inference derives
            before rewriting (filling only what is unknown; rules whose preconditions are shapes
            fire only with them). ``None`` (default): for models irkit did not lower (files from
            other exporters) in which at least :data:`INFER_SHAPES_ABOVE` of the main graph's
            node outputs have no shape. (A lowered model has the shapes torch computed; the
            values inside torchlib's expansions that lack one gain no fusion from inference.)

    Returns:
        ``model`` itself, so stages compose: ``irkit.save(irkit.optimize(m), path)``.

    Raises:
        RewriteError: Unknown ``target``, or a rule failed.

    Example:
        >>> import onnx_ir as ir, irkit
        >>> m = ir.from_onnx_text(\'\'\'
        ...   <ir_version: 10, opset_import: ["" : 20]>
        ...   g (float[2, 3] x) => (float[2, 3] y) { t = Identity(x)  y = Relu(t) }\'\'\')
        >>> [n.op_type for n in irkit.optimize(m).graph]
        ['Relu']
    """
    if target not in TARGETS:
        raise RewriteError(f"unknown optimize target {target!r}; known targets: {sorted(TARGETS)}")
    chosen = TARGETS[target]
    rule_set = chosen.rules() if rules is None else rules
    inferred = _infer_shapes(model, infer_shapes)
    if not chosen.across_calls:
        optimize_with(
            model,
            rule_set,
            opset=opset,
            fold_constants=fold_constants,
            explain=explain,
            report=report,
        )
        if report is not None and inferred is not None:
            report.passes["infer_shapes"] = inferred
        return model
    start = time.perf_counter()
    opened = open_module_calls(model)
    optimize_with(
        model,
        rule_set,
        opset=opset,
        fold_constants=fold_constants,
        explain=explain,
        report=report,
        guards=[HierarchyGuard()],  # (calls of one module stay alike: they are outlined again)
        should_fold=keeps_weight_transposes,
        common_subexpressions=False,  # (it would merge nodes of different calls; run after)
    )
    t0 = time.perf_counter()
    if opened:
        adopt_unscoped(model)  # (what a pass made without metadata goes where it is read)
        outline(model, lambda path, cls: (path, cls) in opened)
    t1 = time.perf_counter()
    cse(model)
    if report is not None:
        report.passes.update(outline=t1 - t0, cse=time.perf_counter() - t1)
        if inferred is not None:
            report.passes["infer_shapes"] = inferred
    logger.info(
        "irkit.optimize(target=%r): %d module calls opened and re-outlined in %.2fs",
        target,
        len(opened),
        time.perf_counter() - start,
    )
    return model


INFER_SHAPES_ABOVE = 0.1
"""Share of shapeless node outputs above which :func:`optimize` runs shape inference itself."""


def _infer_shapes(model: ir.Model, wanted: bool | None) -> float | None:
    """Run shape inference if wanted (or, with None, if the model lacks shapes); its seconds."""
    if wanted is False:
        return None
    if wanted is None:
        if model.producer_name == metadata.MODEL_PRODUCER:
            return None
        unknown = unknown_shape_fraction(model)
        if unknown < INFER_SHAPES_ABOVE:
            return None
        logger.info("irkit.optimize: %.0f%% of the values have no shape: inferring", 100 * unknown)
    start = time.perf_counter()
    infer_shapes(model)
    return time.perf_counter() - start
