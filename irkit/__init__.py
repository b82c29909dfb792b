"""irkit: torch.export → clean, fast, hierarchical ONNX on onnx-ir.

The public surface is exactly ``__all__``. Stages are functions over an ``onnx_ir.Model``; each
works in place and returns the model, so they compose:

>>> import irkit                                   # doctest: +SKIP
>>> model = irkit.lower(torch.export.export(m, args), functions=False)  # doctest: +SKIP
>>> irkit.save(irkit.optimize(irkit.outline(model)), "model.onnx")    # doctest: +SKIP

Without torch, on any ONNX model:

>>> import onnx_ir as ir
>>> m = ir.from_onnx_text('''<ir_version: 10, opset_import: ["" : 21]>
...   g (float[2] x) => (float[2] y) { t = Identity(x)  y = Relu(t) }''')
>>> [n.op_type for n in check(lint(optimize(m))).graph]
['Relu']

Only :func:`lower` needs torch, and it imports it on first call: rewriting, outlining and viz
work on any ONNX file without torch. Dependencies point one way: ``irkit._pipeline`` (``lower``
= ``irkit.lowering`` then ``irkit.hierarchy``'s outlining; ``optimize`` = targets) →
``irkit.rules`` (the rule library) → ``irkit.rewriting`` (the engine) → ``irkit.weights``
(tensors without data, checkpoints, the streamed save); ``irkit.lowering``, ``irkit.hierarchy``
and ``irkit.rewriting`` never import each other. The layering contract in ``pyproject.toml``
(``[tool.importlinter]``, checked by ``tests/test_conventions.py``) states the whole plan.
"""

from __future__ import annotations

from irkit import errors, metadata
from irkit._io import check, load, save
from irkit._lint import lint
from irkit._pipeline import lower, optimize
from irkit._version import __version__ as __version__  # (the one home of the version)
from irkit.errors import (
    CheckError,
    ExportError,
    FixedPointError,
    IrkitError,
    LoweringError,
    LoweringOptionsError,
    MetadataError,
    ModelLoadError,
    OpCallError,
    OutlineError,
    QuantizationError,
    RewriteError,
    RuleDefinitionError,
    SaveError,
    UnknownRuleError,
    UnsupportedOpError,
    VizError,
    WeightsError,
)
from irkit.hierarchy import (
    CallSignatures,
    FunctionsOption,
    ModuleSelector,
    OutlineWarning,
    function_tree,
    inline,
    outline,
)
from irkit.rewriting import (
    Const,
    ModuleRule,
    NodeRule,
    RewriteReport,
    Rule,
    RuleSet,
    attr,
    either,
    fail,
    node_rule,
    op,
    optional,
    rewrite,
    var,
)
from irkit.rules.quantize import QuantizeReport, quantize

__all__ = [
    "lower",
    "outline",
    "inline",
    "function_tree",
    "ModuleSelector",
    "FunctionsOption",
    "CallSignatures",
    "OutlineWarning",
    "save",
    "load",
    "check",
    "lint",
    "rewrite",
    "optimize",
    "quantize",
    "QuantizeReport",
    "Rule",
    "RuleSet",
    "NodeRule",
    "node_rule",
    "ModuleRule",
    "RewriteReport",
    "Const",
    "op",
    "var",
    "attr",
    "either",
    "optional",
    "fail",
    "errors",
    "metadata",
    "IrkitError",
    "UnsupportedOpError",
    "LoweringError",
    "LoweringOptionsError",
    "OpCallError",
    "OutlineError",
    "RuleDefinitionError",
    "RewriteError",
    "FixedPointError",
    "ModelLoadError",
    "SaveError",
    "CheckError",
    "MetadataError",
    "UnknownRuleError",
    "VizError",
    "WeightsError",
    "ExportError",
    "QuantizationError",
]
