"""irkit's exception classes.

Every error a user can cause is one of these (``tests/test_errors.py`` drives each public entry
point with bad input and asserts the class). Messages say *what* went wrong, *where* (FX node,
source line, module path, file) and *how to fix it*. Internal invariants are explicit checks
raising one of these too, not ``assert`` (``tests/test_conventions.py`` counts the ones left).
Raise a specific subclass, never the bare :class:`IrkitError`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

__all__ = [
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
    "WeightsError",
    "QuantizationError",
    "CheckError",
    "MetadataError",
    "UnknownRuleError",
    "VizError",
    "ExportError",
]


class IrkitError(Exception):
    """Base class of every error irkit raises on purpose."""


class UnsupportedOpError(IrkitError):
    """Some FX nodes have no lowering (no custom, irkit or torchlib lowering, no decomposition).

    Raised once, before anything is emitted, listing *every* unsupported op.

    Attributes:
        ops: One entry per unsupported op: ``(op name, count, first FX node, source location)``.
        reasons: Op name → why none of torch's decompositions of it could be lowered.
    """

    def __init__(
        self,
        ops: Sequence[tuple[str, int, str, str]],
        reasons: Mapping[str, str] | None = None,
    ):
        self.ops = list(ops)
        self.reasons = dict(reasons or {})
        lines = [
            f"{len(self.ops)} op(s) in the ExportedProgram have no lowering to ONNX:",
        ]
        for name, count, fx_node, source in self.ops:
            where = f" at {source}" if source else ""
            lines.append(f"  - {name}  ×{count}  (first: FX node {fx_node!r}{where})")
            if name in self.reasons:
                lines.append(f"      torch's decompositions did not help: {self.reasons[name]}")
        lines.append(
            "Fix: pass custom_lowerings={op_overload: function} to irkit.lower "
            "(see docs/lowering.md), or rewrite the model to avoid these ops."
        )
        super().__init__("\n".join(lines))


class LoweringError(IrkitError):
    """Lowering one FX node failed. The original exception is chained as ``__cause__``.

    Attributes:
        fx_node: Name of the FX node.
        target: The node's target as text.
        module_path: The innermost module call path (``""`` for the root).
        source: ``file:line`` of the user code, if known.
    """

    def __init__(
        self, message: str, *, fx_node: str, target: str, module_path: str = "", source: str = ""
    ):
        self.fx_node = fx_node
        self.target = target
        self.module_path = module_path
        self.source = source
        where = f"FX node {fx_node!r} ({target})"
        if module_path:
            where += f" in module {module_path!r}"
        if source:
            where += f" at {source}"
        super().__init__(f"{where}: {message}")


class LoweringOptionsError(IrkitError):
    """:func:`irkit.lower` was called with something it cannot use: not an ``ExportedProgram``,
    an opset out of range, or name lists of the wrong length."""


class OpCallError(IrkitError):
    """A lowering function (torchlib's or a custom one) called an ONNX op in a way irkit cannot
    record: an op without a schema (or an onnxscript function without a signature), a required
    input or attribute left out, or a ``Split`` whose number of outputs cannot be told. Lowering
    an FX node raises it as the ``__cause__`` of a :class:`LoweringError` naming the node."""


class OutlineError(IrkitError):
    """Outlining module calls into functions failed (bad options or unusable metadata)."""


class RuleDefinitionError(IrkitError):
    """A rewrite rule is malformed (detected when the rule is defined, not when it runs)."""


class RewriteError(IrkitError):
    """Applying rewrite rules failed: a replacement produced an invalid graph, or a rule's check
    or rewrite raised (then the message names the rule, node and graph, and the original
    exception is chained as ``__cause__``)."""


class UnknownRuleError(IrkitError, KeyError):
    """A rule set has no rule of that name (also a ``KeyError``, as ``rule_set[name]`` is a lookup)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class FixedPointError(RewriteError):
    """The rewrite worklist did not reach a fixed point within the iteration cap.

    Attributes:
        rules: Names of the rules that kept firing.
    """

    def __init__(self, message: str, rules: Sequence[str]):
        self.rules = list(rules)
        super().__init__(message)


class ModelLoadError(IrkitError):
    """A file could not be read as an ONNX model (missing, not ONNX, truncated, no external data)."""


class SaveError(IrkitError):
    """A model could not be written (missing directory, too large for one file)."""


class WeightsError(IrkitError, ValueError):
    """Weights are missing or do not fit the model: a weightless initializer's data was read
    (the model was lowered on the meta device), or a checkpoint given to ``irkit.save(...,
    weights=...)`` lacks a tensor, holds it with another shape or dtype, or cannot be read. Also a
    ``ValueError``, so code that tolerates unreadable tensors (previews, folding) skips it.

    Attributes:
        names: The initializers concerned (``[]`` when the message is about a file).
    """

    def __init__(self, message: str, names: Sequence[str] = ()):
        self.names = list(names)
        super().__init__(message)


class QuantizationError(IrkitError, ValueError):
    """Weight quantization cannot do what was asked: a bit width or block size
    ``com.microsoft.MatMulNBits`` does not support, a weight that is not a 2-D float matrix or
    holds non-finite values, or an option of :func:`irkit.quantize` that makes no sense (a
    ``bits_for`` entry with unsupported bits). Also a ``ValueError``."""


class CheckError(IrkitError):
    """:func:`irkit.check` rejected a model: the ONNX checker, shape inference or irkit's lint.

    Attributes:
        problems: One line per problem found (``[]`` when the message says it all).
    """

    def __init__(self, message: str, problems: Sequence[str] = ()):
        self.problems = list(problems)
        super().__init__(message)


class MetadataError(IrkitError):
    """An ``irkit.*`` metadata value is malformed (not what :mod:`irkit.metadata` writes)."""


class VizError(IrkitError):
    """The viewer cannot render what was asked: an option combination it does not support, a
    function or module the model does not have, or a missing layout tool (igraph, Graphviz)."""


class ExportError(IrkitError):
    """Exporting a model with ``torch.export`` failed inside an irkit helper (e.g.
    :func:`irkit.llm.export_causal_lm`), or the model does not have what the helper needs. The
    message names the transformers and torch versions and the tested range; the original
    exception is chained as ``__cause__``."""
