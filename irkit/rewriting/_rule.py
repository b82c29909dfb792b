"""Rules and rule sets.

A :class:`Rule` is a pattern, an optional check and a rewrite, and reads like the identity it
implements::

    SiLU = Rule(
        "SiLU",
        lambda op, x: x * op.Sigmoid(x),               # x * sigmoid(x) = Swish(x)
        rewrite=lambda op, x: op.Swish(x),
    )

A check, if any, is a keyword argument, written before the rewrite: ``Rule(name, pattern,
check=..., rewrite=...)`` reads in the order of the identity's statement.

The pattern's parameters (besides ``op``) are its variables. ``check`` and ``rewrite`` take any
subset of the variables by name, plus ``op`` (the :class:`RewriteBuilder`, rewrite only),
``match`` (the :class:`~irkit.rewriting._match.Match`) and ``ctx`` (the :class:`RewriteContext`:
the model and the graph or function being rewritten, for a check that must look beyond the
match, e.g. across function boundaries); any other parameter name is a
:class:`~irkit.errors.RuleDefinitionError` when the rule is defined. A check returns ``True``,
``False`` or a :func:`~irkit.rewriting._match.fail` value carrying the reason.

Rules compose into :class:`RuleSet`\\ s with ``+``; a set prints one rule per line as
``name: pattern ⇒ replacement``.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, cast

import onnx_ir as ir

from irkit.errors import RuleDefinitionError, UnknownRuleError
from irkit.rewriting._builder import RewriteBuilder
from irkit.rewriting._match import Match, Matcher, MatchFailure
from irkit.rewriting._pattern import (
    Pattern,
    PatternBuilder,
    Var,
    anchor_ops,
    as_pattern,
    pattern_text,
)

__all__ = ["BaseRule", "Rule", "NodeRule", "RuleSet", "Rewrite", "RewriteContext", "node_rule"]

_SPECIAL = frozenset({"op", "match", "ctx"})
"""Parameter names a check or rewrite may take besides the pattern variables."""


@dataclasses.dataclass
class RewriteContext:
    """What a rule may know about where it runs (passed by the engine; never global).

    Attributes:
        model: The model being rewritten.
        graph: The graph, function or subgraph being rewritten.
        opset: Its default-domain (ONNX) opset version.
        max_opset: Rules producing ops newer than this must not fire (``optimize(opset=...)``).
    """

    model: ir.Model
    graph: ir.Graph | ir.Function
    opset: int
    max_opset: int | None = None


@dataclasses.dataclass
class Rewrite:
    """A rule's decision to rewrite: what matched and what replaces it."""

    match: Match
    nodes: list[ir.Node]
    outputs: list[ir.Value]


class BaseRule:
    """What the engine needs from a rule. Subclass it for rules that are not patterns.

    Attributes:
        name: Stable, unique name (used in reports, metadata and ``explain``).
        anchors: ``(domain, op_type)`` of the nodes the rule can fire on; ``None`` = every node.
        min_opset: The rule fires only in graphs whose ONNX opset is at least this.
    """

    name: str = ""
    anchors: frozenset[tuple[str, str]] | None = None
    min_opset: int | None = None
    max_opset: int | None = None

    def find(self, node: ir.Node, ctx: RewriteContext) -> Rewrite | MatchFailure:
        """Try the rule anchored at ``node``; never mutates the graph."""
        raise NotImplementedError

    def applies_to(self, node: ir.Node, ctx: RewriteContext) -> bool:
        """Cheap pre-filter for rules without anchors (not counted as an attempt)."""
        return True

    def opset_failure(self, ctx: RewriteContext) -> MatchFailure | None:
        """A failure if the graph's opset (or the target cap) excludes this rule."""
        if self.min_opset is not None:
            if ctx.opset < self.min_opset:
                return MatchFailure(f"needs opset >= {self.min_opset}, graph has {ctx.opset}")
            if ctx.max_opset is not None and ctx.max_opset < self.min_opset:
                return MatchFailure(f"needs opset >= {self.min_opset}, target caps {ctx.max_opset}")
        if self.max_opset is not None and ctx.opset > self.max_opset:
            return MatchFailure(f"valid up to opset {self.max_opset}, graph has {ctx.opset}")
        return None

    def __add__(self, other: BaseRule | RuleSet) -> RuleSet:
        return RuleSet(self.name, [self]) + other

    def __str__(self) -> str:
        return self.name


def _parameters(fn: Callable[..., Any], what: str, rule: str) -> tuple[list[str], bool]:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError) as exc:
        raise RuleDefinitionError(
            f"rule {rule!r}: cannot read the signature of its {what}"
        ) from exc
    names, var_kw = [], False
    for p in sig.parameters.values():
        if p.kind is p.VAR_KEYWORD:
            var_kw = True
        elif p.kind is p.VAR_POSITIONAL:
            raise RuleDefinitionError(f"rule {rule!r}: its {what} may not take *args")
        else:
            names.append(p.name)
    return names, var_kw


def _call(fn: Callable[..., Any], params: list[str], var_kw: bool, env: dict[str, Any]) -> Any:
    if var_kw:
        return fn(**env)
    return fn(**{p: env[p] for p in params})


def _check_failure(failure: MatchFailure, match: Match) -> MatchFailure:
    """A check's failure with its depth and the pattern variable its value is bound to."""
    variable = failure.variable
    if variable is None and failure.value is not None:
        bound = (k for k, v in match.bindings.items() if v is failure.value)
        variable = next(bound, None)
    return dataclasses.replace(failure, depth=len(match.nodes) + 1, variable=variable)


class Rule(BaseRule):
    """A declarative rewrite rule: ``pattern`` ⇒ ``rewrite`` when ``check`` passes.

    Args:
        name: Stable unique name.
        pattern: A pattern (``op.Mul(x, op.Sigmoid(x))``), a tuple of patterns (multi-output),
            or a function ``(op, x, ...) -> pattern`` whose parameters name the variables.
        rewrite: ``(op, <variables>..., <findings>..., match=..., ctx=...) -> ir.Value |
            tuple[...]`` building one replacement per pattern output with the
            :class:`RewriteBuilder` ``op``.
            It may return a :class:`MatchFailure` (or ``None``) to decline.
        check: Optional ``(<variables>..., match=..., ctx=...) -> bool | MatchFailure | dict``
            (``ctx``: the :class:`RewriteContext`, for what lies outside the match). A dict
            means "fire" and hands its entries (*findings*, such as an axis the check had to
            compute) to the rewrite, which takes them as parameters by name: nothing is
            computed twice and nothing is stored on the rule.
        min_opset: Fire only at ONNX opset ≥ this (e.g. 20 for a rule producing ``Gelu``).
        max_opset: Fire only at ONNX opset ≤ this.
        doc: One line shown in listings (defaults to the rewrite's docstring).

    Raises:
        RuleDefinitionError: A check/rewrite parameter is not a pattern variable (nor, for the
            rewrite of a rule with a check, a finding), or the pattern is malformed; when the
            rule runs, a check that does not return a finding its rewrite takes.

    Example:
        >>> r = Rule("SiLU", lambda op, x: op.Mul(x, op.Sigmoid(x)), rewrite=lambda op, x: op.Swish(x))
        >>> print(r)
        SiLU: Mul(x, Sigmoid(x)) ⇒ Swish(x)
        >>> from irkit.rewriting import fail, op, var
        >>> from irkit.rewriting._checks import scalar
        >>> div_to_mul = Rule(  # the check's findings go to the rewrite
        ...     "DivToMul", op.Div(var("x"), var("c")),
        ...     check=lambda c: {"inverse": 1 / s} if (s := scalar(c)) else fail("not a constant"),
        ...     rewrite=lambda op, x, inverse: op.Mul(x, op.const(inverse, "float32")))
        >>> div_to_mul.findings
        ('inverse',)
    """

    def __init__(
        self,
        name: str,
        pattern: Pattern | Sequence[Pattern] | Callable[..., Any],
        rewrite: Callable[..., Any],
        *,
        check: Callable[..., Any] | None = None,
        min_opset: int | None = None,
        max_opset: int | None = None,
        doc: str = "",
    ):
        if not name:
            raise RuleDefinitionError("a rule needs a non-empty name")
        self.name = name
        self.min_opset = min_opset
        self.max_opset = max_opset
        outputs = self._build_pattern(pattern)
        try:
            self._matcher = Matcher(outputs)
        except RuleDefinitionError as exc:
            raise RuleDefinitionError(f"rule {name!r}: {exc}") from exc
        self.outputs = outputs
        self.variables = tuple(dict.fromkeys(v for o in outputs for v in o.variables()))
        clash = sorted(_SPECIAL.intersection(self.variables))
        if clash:
            raise RuleDefinitionError(
                f"rule {name!r}: pattern variable {clash[0]!r} has the name of a special "
                f"check/rewrite parameter ({', '.join(sorted(_SPECIAL))}). Fix: rename it."
            )
        anchors = anchor_ops(outputs[0])
        self.anchors = None if anchors is None else frozenset(anchors)
        self._rewrite = rewrite
        self._rewrite_params = self._validate(
            rewrite, "rewrite", allow_op=True, allow_findings=check is not None
        )
        known = set(self.variables) | _SPECIAL
        self.findings = tuple(p for p in self._rewrite_params[0] if p not in known)
        """Rewrite parameters the check must supply (its returned dict's keys)."""
        self._check = check
        self._check_params = self._validate(check, "check", allow_op=False) if check else None
        self.doc = doc or (inspect.getdoc(rewrite) or "").split("\n")[0]

    def _build_pattern(self, pattern: Any) -> tuple[Pattern, ...]:
        if callable(pattern) and not isinstance(pattern, Pattern):
            params, var_kw = _parameters(pattern, "pattern", self.name)
            if var_kw:
                raise RuleDefinitionError(f"rule {self.name!r}: a pattern may not take **kwargs")
            args = {p: (PatternBuilder() if p == "op" else Var(p)) for p in params}
            pattern = pattern(**args)
        items = pattern if isinstance(pattern, (tuple, list)) else (pattern,)
        outputs: list[Pattern] = []
        for item in items:
            o = as_pattern(item)
            if not isinstance(o, Pattern):
                raise RuleDefinitionError(
                    f"rule {self.name!r}: the pattern must be built with op.X(...), got {o!r}"
                )
            outputs.append(o)
        if anchor_ops(outputs[0]) is None:
            raise RuleDefinitionError(
                f"rule {self.name!r}: the pattern's (first) output must be an op, got {outputs[0]}"
            )
        return tuple(outputs)

    def _validate(
        self, fn: Callable[..., Any], what: str, *, allow_op: bool, allow_findings: bool = False
    ) -> tuple[list[str], bool]:
        params, var_kw = _parameters(fn, what, self.name)
        allowed = set(self.variables) | (_SPECIAL if allow_op else _SPECIAL - {"op"})
        if allow_findings:
            return params, var_kw
        for p in params:
            if p not in allowed:
                raise RuleDefinitionError(
                    f"rule {self.name!r}: {what} parameter {p!r} is not a pattern variable "
                    f"(variables: {', '.join(self.variables) or 'none'}). Fix: rename it to one "
                    f"of the variables, or use it in the pattern."
                )
        return params, var_kw

    def find(self, node: ir.Node, ctx: RewriteContext) -> Rewrite | MatchFailure:
        failure = self.opset_failure(ctx)
        if failure is not None:
            return failure
        last: MatchFailure | None = None
        for result in self._matcher.solutions(node, ctx.opset):
            if isinstance(result, MatchFailure):
                return result if last is None else last
            env = dict(result.bindings)
            env["match"] = result
            env["ctx"] = ctx
            if self._check is not None and self._check_params is not None:
                verdict = _call(self._check, *self._check_params, env)
                if verdict is False or verdict is None:
                    verdict = MatchFailure(f"check returned {verdict}", None, node)
                if isinstance(verdict, MatchFailure):
                    # The first binding's failure is the one reported: it binds the variables in
                    # the order the pattern is written (later ones are commuted operands).
                    if last is None:
                        last = _check_failure(verdict, result)
                    continue
                if self.findings:
                    env.update(self._found(verdict))
            builder = RewriteBuilder()
            env["op"] = builder
            outputs = _call(self._rewrite, *self._rewrite_params, env)
            if outputs is None or isinstance(outputs, MatchFailure):
                if last is None:
                    last = (
                        outputs
                        if outputs is not None
                        else MatchFailure("rewrite declined", None, node)
                    )
                continue
            outs = list(outputs) if isinstance(outputs, (tuple, list)) else [outputs]
            if len(outs) != len(result.outputs):
                raise RuleDefinitionError(
                    f"rule {self.name!r}: rewrite returned {len(outs)} values for "
                    f"{len(result.outputs)} pattern outputs. Fix: return one value per output."
                )
            return Rewrite(result, builder.nodes, outs)
        return last if last is not None else MatchFailure("no match", None, node)

    def _found(self, verdict: object) -> Mapping[str, Any]:
        """The findings the rewrite takes, from the check's verdict (a dict)."""
        missing = (
            list(self.findings)
            if not isinstance(verdict, Mapping)
            else [f for f in self.findings if f not in verdict]
        )
        if missing:
            raise RuleDefinitionError(
                f"rule {self.name!r}: its rewrite takes {', '.join(map(repr, missing))}, which "
                f"is neither a pattern variable (variables: {', '.join(self.variables) or 'none'}) "
                f"nor a finding of its check (the check returned {verdict!r}). Fix: return "
                "{name: value} from the check, or rename the parameter."
            )
        return cast("Mapping[str, Any]", verdict)

    def replacement_text(self) -> str:
        """The replacement as text, computed by running the rewrite on symbolic values."""
        env: dict[str, Any] = {v: _Sym(v) for v in (*self.variables, *self.findings)}
        env["op"] = _SymBuilder()
        env["match"] = None
        env["ctx"] = None
        try:
            out = _call(self._rewrite, *self._rewrite_params, env)
        except Exception:
            return self.doc or f"{getattr(self._rewrite, '__name__', 'rewrite')}(...)"
        if isinstance(out, (tuple, list)):
            return "(" + ", ".join(str(o) for o in out) + ")"
        return str(out)

    def pattern_text(self) -> str:
        """The pattern as text; shared sub-patterns are named once (``where t1 = ...``)."""
        return pattern_text(self.outputs)

    def __str__(self) -> str:
        return f"{self.name}: {self.pattern_text()} ⇒ {self.replacement_text()}"

    def __repr__(self) -> str:
        return f"Rule({self.name!r})"


class _Sym:
    def __init__(self, text: str):
        self.text = text

    def __str__(self) -> str:
        return self.text

    __repr__ = __str__

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(name)  # symbolic values have no shape/type: fall back to doc


class _SymBuilder:
    def __init__(self, domain: str = ""):
        self._domain = domain

    def domain(self, domain: str) -> _SymBuilder:
        return _SymBuilder(domain)

    def const(self, value: Any, dtype: Any = None) -> _Sym:
        import numpy as np

        arr = np.asarray(value)
        return _Sym(repr(arr.item()) if arr.ndim == 0 else f"Const({arr.tolist()})")

    def __getattr__(self, op_type: str) -> Callable[..., Any]:
        if op_type.startswith("_"):
            raise AttributeError(op_type)
        qual = f"{self._domain}::{op_type}" if self._domain else op_type

        def call(*inputs: Any, _outputs: int = 1, **attrs: Any) -> Any:
            args = ["_" if i is None else str(i) for i in inputs]
            args += [f"{k}={v!r}" for k, v in attrs.items() if not k.startswith("_")]
            text = f"{qual}({', '.join(args)})"
            return (
                _Sym(text)
                if _outputs == 1
                else tuple(_Sym(f"{text}[{i}]") for i in range(_outputs))
            )

        return call


class NodeRule(BaseRule):
    """A rule written as a plain function over one node (for logic patterns cannot express).

    ``fn(op, node)`` inspects ``node`` and returns its replacement outputs (one per output of
    the node), or ``None`` / a :class:`MatchFailure` to decline. Only ``node`` is replaced;
    producers left unused are removed by dead-code elimination in :func:`irkit.optimize`.

    Example:
        >>> r = NodeRule("DropIdentity", ["Identity"], lambda op, node: node.inputs[0])
        >>> r.anchors
        frozenset({('', 'Identity')})
    """

    def __init__(
        self,
        name: str,
        ops: Iterable[str | tuple[str, str]] | None,
        fn: Callable[[RewriteBuilder, ir.Node], Any],
        *,
        min_opset: int | None = None,
        max_opset: int | None = None,
    ):
        self.name = name
        self.anchors = (
            None
            if ops is None
            else frozenset((o if isinstance(o, tuple) else ("", o)) for o in ops)
        )
        self.fn = fn
        self.min_opset = min_opset
        self.max_opset = max_opset

    def find(self, node: ir.Node, ctx: RewriteContext) -> Rewrite | MatchFailure:
        failure = self.opset_failure(ctx)
        if failure is not None:
            return failure
        builder = RewriteBuilder()
        out = self.fn(builder, node)
        if out is None or isinstance(out, MatchFailure):
            return out if out is not None else MatchFailure("declined", None, node)
        outs = list(out) if isinstance(out, (tuple, list)) else [out]
        match = Match([node], list(node.outputs[: len(outs)]), {}, ctx.opset)
        return Rewrite(match, builder.nodes, outs)

    def __repr__(self) -> str:
        return f"NodeRule({self.name!r})"


def node_rule(
    *ops: str | tuple[str, str], name: str | None = None, min_opset: int | None = None
) -> Callable[[Callable[[RewriteBuilder, ir.Node], Any]], NodeRule]:
    """Decorator: wrap a plain function ``fn(op, node)`` as a :class:`NodeRule`.

    Example:
        >>> @node_rule("Identity")
        ... def drop_identity(op, node):
        ...     return node.inputs[0]
        >>> drop_identity.name
        'drop_identity'
    """

    def wrap(fn: Callable[[RewriteBuilder, ir.Node], Any]) -> NodeRule:
        return NodeRule(name or fn.__name__, ops or None, fn, min_opset=min_opset)

    return wrap


class RuleSet:
    """A named, ordered collection of rules. Earlier rules win when several match one node.

    Example:
        >>> a = NodeRule("A", ["Identity"], lambda op, n: None)
        >>> b = NodeRule("B", ["Cast"], lambda op, n: None)
        >>> s = RuleSet("ab", [a]) + b
        >>> s.names()
        ['A', 'B']
    """

    def __init__(self, name: str, rules: Iterable[BaseRule | RuleSet] = ()):
        self.name = name
        flat: list[BaseRule] = []
        for r in rules:
            flat.extend(r.rules if isinstance(r, RuleSet) else [r])
        seen: set[str] = set()
        for r in flat:
            if not isinstance(r, BaseRule):
                raise RuleDefinitionError(
                    f"rule set {name!r}: {r!r} is not a rule; wrap functions with node_rule()"
                )
            if r.name in seen:
                raise RuleDefinitionError(f"rule set {name!r}: two rules are named {r.name!r}")
            seen.add(r.name)
        self.rules: tuple[BaseRule, ...] = tuple(flat)

    def __add__(self, other: BaseRule | RuleSet) -> RuleSet:
        other_name = other.name
        return RuleSet(f"{self.name}+{other_name}", [*self.rules, other])

    def __iter__(self) -> Iterator[BaseRule]:
        return iter(self.rules)

    def __len__(self) -> int:
        return len(self.rules)

    def __getitem__(self, name: str) -> BaseRule:
        for r in self.rules:
            if r.name == name:
                return r
        raise UnknownRuleError(f"no rule {name!r} in {self.name!r}; rules: {self.names()}")

    def names(self) -> list[str]:
        """Rule names in order."""
        return [r.name for r in self.rules]

    def without(self, *names: str) -> RuleSet:
        """This set minus the named rules."""
        return RuleSet(self.name, [r for r in self.rules if r.name not in names])

    def __str__(self) -> str:
        return "\n".join(
            [f"RuleSet {self.name!r} ({len(self)} rules)"] + [f"  {r}" for r in self.rules]
        )

    def __repr__(self) -> str:
        return f"RuleSet({self.name!r}, {self.names()})"
