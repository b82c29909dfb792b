"""What a rewrite did: per-rule statistics, near misses, and a printable summary."""

from __future__ import annotations

import collections
import dataclasses

__all__ = ["RuleStats", "NearMiss", "RewriteReport"]


@dataclasses.dataclass
class RuleStats:
    """Statistics of one rule over one :func:`irkit.rewrite` call.

    Attributes:
        name: The rule's name.
        tried: Match attempts (anchor nodes of the right op type).
        fired: Rewrites applied.
        failures: Failure reason → count.
        seconds: Time spent matching, checking and building replacements.
        where: Module path (or ``domain::function``) → rewrites applied there.
    """

    name: str
    tried: int = 0
    fired: int = 0
    failures: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    seconds: float = 0.0
    where: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)


@dataclasses.dataclass(frozen=True)
class NearMiss:
    """One failed attempt of the explained rule.

    Attributes:
        node: Name of the anchor node.
        where: Module path / function of the anchor.
        reason: The failure, with the offending value or node.
        depth: Pattern nodes matched before failing (higher = nearer).
    """

    node: str
    where: str
    reason: str
    depth: int


@dataclasses.dataclass
class RewriteReport:
    """What :func:`irkit.rewrite` / :func:`irkit.optimize` did.

    The stages return the model (so they compose); pass ``report=RewriteReport()`` to get this:

    >>> import onnx_ir as ir, irkit
    >>> m = ir.from_onnx_text('''
    ...   <ir_version: 10, opset_import: ["" : 18]>
    ...   g (float[2] x) => (float[2] y) { t = Identity(x)  y = Relu(t) }''')
    >>> report = RewriteReport()
    >>> irkit.optimize(m, report=report) is m, report.fired
    (True, {'IdentityElimination': 1})

    Attributes:
        rules: Rule name → :class:`RuleStats`, in rule-set order.
        nodes_before: Node count (graph + function bodies) before.
        nodes_after: Node count after.
        seconds: Wall time.
        graphs: Graphs/functions visited.
        near_misses: Failures of the rule named by ``explain=``, nearest first.
        passes: Extra passes run by :func:`irkit.optimize` → seconds.
    """

    rules: dict[str, RuleStats] = dataclasses.field(default_factory=dict)
    nodes_before: int = 0
    nodes_after: int = 0
    seconds: float = 0.0
    graphs: int = 0
    near_misses: list[NearMiss] = dataclasses.field(default_factory=list)
    passes: dict[str, float] = dataclasses.field(default_factory=dict)

    @property
    def fired(self) -> dict[str, int]:
        """Rule name → rewrites applied (rules that fired at least once)."""
        return {n: s.fired for n, s in self.rules.items() if s.fired}

    @property
    def total_fired(self) -> int:
        return sum(s.fired for s in self.rules.values())

    def fill_from(self, other: RewriteReport) -> None:
        """Make this report a copy of ``other`` (how ``report=`` out-parameters are filled)."""
        for field in dataclasses.fields(self):
            setattr(self, field.name, getattr(other, field.name))

    def merge(self, other: RewriteReport) -> None:
        """Accumulate another report (used when rewriting runs in several rounds)."""
        for name, s in other.rules.items():
            mine = self.rules.setdefault(name, RuleStats(name))
            mine.tried += s.tried
            mine.fired += s.fired
            mine.failures.update(s.failures)
            mine.seconds += s.seconds
            mine.where.update(s.where)
        self.near_misses.extend(other.near_misses)
        self.graphs = max(self.graphs, other.graphs)

    def explain(self, limit: int = 20) -> str:
        """The near misses recorded for the explained rule, nearest first."""
        if not self.near_misses:
            return "no near misses recorded (pass explain='RuleName' to irkit.rewrite)"
        lines = []
        for m in sorted(self.near_misses, key=lambda m: -m.depth)[:limit]:
            lines.append(f"  depth {m.depth}  {m.node} in {m.where or '<root>'}: {m.reason}")
        return "\n".join([f"{len(self.near_misses)} near misses:", *lines])

    def __str__(self) -> str:
        lines = [
            f"rewrite: {self.nodes_before} → {self.nodes_after} nodes, "
            f"{self.total_fired} rewrites, {self.seconds * 1000:.1f} ms, {self.graphs} graph(s)"
        ]
        for s in self.rules.values():
            if not s.tried:
                continue
            lines.append(
                f"  {s.name:<28} fired {s.fired:>5} / tried {s.tried:<6} {s.seconds * 1000:8.1f} ms"
            )
            for reason, n in s.failures.most_common(3):
                lines.append(f"      ✗ {n:>5}  {reason}")
            if s.where:
                top = ", ".join(f"{w or '<root>'}×{n}" for w, n in s.where.most_common(3))
                lines.append(f"      where: {top}")
        for name, sec in self.passes.items():
            lines.append(f"  pass {name:<23} {sec * 1000:8.1f} ms")
        return "\n".join(lines)
