"""Module-level rules: replace every call of a module by a custom op (kernel substitution).

After outlining, each module call is a node whose ``(domain, op_type, overload)`` names an entry
of ``model.functions`` (domain = the module's Python package, name = its class) and which carries
:data:`irkit.metadata.CALL_MODULE` (the :class:`~irkit.metadata.Frame` of the call). A
:class:`ModuleRule` selects such calls by module — in the selector language of
``irkit.outline(functions=...)`` (``modules=``: a :class:`~irkit.ModuleSelector`, classes, a
predicate; ``cls=`` / ``path=`` are sugar for one class glob / one path glob) — or by the called
function's name, and replaces each by one node of another op — a fused kernel, a contrib op, or
another function:

>>> rule = ModuleRule(
...     "RMSNormKernel", cls="LlamaRMSNorm",
...     replace_with=("com.microsoft", "SimplifiedLayerNormalization"),
...     attributes={"epsilon": 1e-6},
... )
>>> rule.name
'RMSNormKernel'

The replaced function body stays in ``model.functions`` until dead-code removal
(:func:`irkit.optimize` drops unused functions).
"""

from __future__ import annotations

import dataclasses
import fnmatch
from collections.abc import Callable
from typing import Any

import onnx_ir as ir

from irkit import metadata
from irkit._select import FunctionsOption, ModuleSelector, is_glob, make_predicate
from irkit.errors import RuleDefinitionError
from irkit.rewriting._builder import RewriteBuilder
from irkit.rewriting._match import Match, MatchFailure
from irkit.rewriting._rule import BaseRule, Rewrite, RewriteContext

__all__ = ["ModuleCall", "ModuleRule"]


@dataclasses.dataclass(frozen=True)
class ModuleCall:
    """One matched module call, given to a callable ``replace_with`` / ``attributes``.

    Attributes:
        node: The call node.
        function: The called local function.
        frame: The module call (path, call index, class), or ``None`` without metadata.
    """

    node: ir.Node
    function: ir.Function
    frame: metadata.Frame | None

    @property
    def inputs(self) -> list[ir.Value | None]:
        return list(self.node.inputs)


_Selector = tuple[Callable[[metadata.Frame], bool], Callable[[metadata.Frame], str]]
"""A predicate over a call's frame, and the failure reason when it says no."""


class ModuleRule(BaseRule):
    """Replace every call of matching modules by one node of another op.

    Args:
        name: Stable rule name.
        cls: A class, or a glob over the module class, qualified
            (``transformers.*.LlamaRMSNorm``) or not (``LlamaRMSNorm``); sugar for
            ``modules=ModuleSelector(classes=[cls])``.
        path: Glob over the module path (``layers.*.attn``); sugar for
            ``modules=ModuleSelector(paths=[path])``.
        modules: Which module calls, in the selector language of ``irkit.outline``'s
            ``functions=`` (a :class:`~irkit.ModuleSelector`, a list of classes or class names,
            a predicate ``(path, qualified_class) -> bool``, ``True`` for all).
        function: ``(domain, name)`` globs over the called function.
        replace_with: ``(domain, op_type)`` of the new op, or ``fn(op, call) -> outputs``
            building the replacement with a :class:`RewriteBuilder`.
        attributes: Attributes of the new op: a dict, or ``fn(call) -> dict``.
        min_opset: Fire only at ONNX opset ≥ this.

    A call is replaced when every selector given (``cls``, ``path``, ``modules``, ``function``)
    selects it.

    Raises:
        RuleDefinitionError: No selector given, a selector is malformed, or ``replace_with`` is
            malformed.
    """

    def __init__(
        self,
        name: str,
        *,
        cls: type | str | None = None,
        path: str | None = None,
        modules: FunctionsOption | None = None,
        function: tuple[str, str] | None = None,
        replace_with: tuple[str, str] | Callable[[RewriteBuilder, ModuleCall], Any],
        attributes: dict[str, Any] | Callable[[ModuleCall], dict[str, Any]] | None = None,
        min_opset: int | None = None,
    ):
        if cls is None and path is None and modules is None and function is None:
            raise RuleDefinitionError(
                f"module rule {name!r} selects nothing: give cls=, path=, modules= or function="
            )
        if not callable(replace_with) and not (
            isinstance(replace_with, tuple) and len(replace_with) == 2
        ):
            raise RuleDefinitionError(
                f"module rule {name!r}: replace_with must be (domain, op_type) or a function, "
                f"got {replace_with!r}"
            )
        self.name = name
        self.cls = cls
        self.path = path
        self.modules = modules
        self.function = function
        self._selectors = _module_selectors(name, cls, path, modules)
        self.replace_with = replace_with
        self.attributes = attributes
        self.min_opset = min_opset
        if function is not None and not any(is_glob(p) for p in function):
            self.anchors = frozenset({(function[0], function[1])})

    def applies_to(self, node: ir.Node, ctx: RewriteContext) -> bool:
        """Only calls of local functions are candidates."""
        return node.domain != "" and node.op_identifier() in ctx.model.functions

    def _select(self, node: ir.Node, ctx: RewriteContext) -> ModuleCall | MatchFailure:
        if node.domain == "":
            return MatchFailure("not a function call")
        fn = ctx.model.functions.get(node.op_identifier())
        if fn is None:
            return MatchFailure("not a call of a local function", None, node)
        if self.function is not None and not (
            fnmatch.fnmatchcase(fn.domain, self.function[0])
            and fnmatch.fnmatchcase(fn.name, self.function[1])
        ):
            return MatchFailure(f"function {fn.domain}::{fn.name} not selected", None, node)
        frame = metadata.node_call(node.metadata_props)
        if not self._selectors:
            return ModuleCall(node, fn, frame)
        if frame is None:
            return MatchFailure("call node has no irkit.call metadata", None, node)
        for selected, reason in self._selectors:
            if not selected(frame):
                return MatchFailure(reason(frame), None, node)
        return ModuleCall(node, fn, frame)

    def find(self, node: ir.Node, ctx: RewriteContext) -> Rewrite | MatchFailure:
        failure = self.opset_failure(ctx)
        if failure is not None:
            return failure
        call = self._select(node, ctx)
        if isinstance(call, MatchFailure):
            return call
        builder = RewriteBuilder()
        if callable(self.replace_with):
            out = self.replace_with(builder, call)
            if out is None or isinstance(out, MatchFailure):
                return out if out is not None else MatchFailure("replacement declined", None, node)
            outs = list(out) if isinstance(out, (tuple, list)) else [out]
        else:
            attrs = self.attributes(call) if callable(self.attributes) else (self.attributes or {})
            domain, op_type = self.replace_with
            new = builder.node(domain, op_type, call.inputs, attrs, num_outputs=len(node.outputs))
            outs = list(new.outputs)
        if len(outs) != len(node.outputs):
            raise RuleDefinitionError(
                f"module rule {self.name!r}: replacement has {len(outs)} outputs, the call of "
                f"{call.function.name} has {len(node.outputs)}"
            )
        if metadata.CALL_MODULE in node.metadata_props:
            for n in builder.nodes:
                n.metadata_props[metadata.CALL_MODULE] = node.metadata_props[metadata.CALL_MODULE]
        return Rewrite(Match([node], list(node.outputs), {}, ctx.opset), builder.nodes, outs)

    def __str__(self) -> str:
        sel = [
            f"{k}={v!r}"
            for k, v in (
                ("cls", self.cls),
                ("path", self.path),
                ("modules", self.modules),
                ("function", self.function),
            )
            if v is not None
        ]
        target = (
            "::".join(self.replace_with)
            if isinstance(self.replace_with, tuple)
            else getattr(self.replace_with, "__name__", "rewrite")
        )
        return f"{self.name}: call({', '.join(sel)}) ⇒ {target}(...)"

    def __repr__(self) -> str:
        return f"ModuleRule({self.name!r})"


def _module_selectors(
    name: str, cls: type | str | None, path: str | None, modules: FunctionsOption | None
) -> list[_Selector]:
    """The module-call selectors of a rule, each with its failure reason (all must say yes)."""
    selectors: list[_Selector] = []

    def select(option: str, selection: FunctionsOption) -> Callable[[metadata.Frame], bool]:
        return make_predicate(
            selection, error=RuleDefinitionError, option=f"module rule {name!r}: {option}"
        )

    if cls is not None:
        if not isinstance(cls, (str, type)) or not cls:
            raise RuleDefinitionError(
                f"module rule {name!r}: cls={cls!r} is neither a class nor a class name (glob)"
            )
        selectors.append(
            (select("cls", ModuleSelector(classes=[cls])), lambda f: f"class {f.cls} not selected")
        )
    if path is not None:
        if not isinstance(path, str):
            raise RuleDefinitionError(f"module rule {name!r}: path={path!r} is not a string glob")
        selectors.append(
            (
                select("path", ModuleSelector(paths=[path])),
                lambda f: f"module path {f.path} not selected",
            )
        )
    if modules is not None:
        selectors.append(
            (
                select("modules", modules),
                lambda f: f"module call {f.call_id} ({f.cls}) not selected",
            )
        )
    return selectors
