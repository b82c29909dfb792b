"""What :func:`irkit.quantize` did: every MatMul-like node, quantized or left alone with why."""

from __future__ import annotations

import dataclasses

__all__ = ["QuantizedNode", "SkippedNode", "QuantizeReport"]


@dataclasses.dataclass(frozen=True)
class QuantizedNode:
    """One node replaced by ``MatMulNBits``.

    Attributes:
        node: The replaced node's name.
        op_type: ``MatMul``, ``FusedMatMul`` or ``Gemm``.
        where: ``"<main>"`` or the ``domain::function`` whose body held it.
        modules: The module paths it computes for (one per call of a shared body).
        k: Inner dimension.
        n: Output dimension.
        bits: Bits per weight.
    """

    node: str
    op_type: str
    where: str
    modules: tuple[str, ...]
    k: int
    n: int
    bits: int


@dataclasses.dataclass(frozen=True)
class SkippedNode:
    """A MatMul-like node left as it was, and why.

    Attributes:
        node: The node's name.
        op_type: Its op type.
        where: ``"<main>"`` or ``domain::function``.
        modules: Its module paths (empty when the model has no scope metadata).
        reason: Why it was not quantized.
    """

    node: str
    op_type: str
    where: str
    modules: tuple[str, ...]
    reason: str


@dataclasses.dataclass
class QuantizeReport:
    """What :func:`quantize` did: every MatMul-like node, quantized or not (with why).

    Attributes:
        quantized: The nodes now quantized (a shared function body counts once).
        skipped: The ``MatMul``/``FusedMatMul``/``Gemm`` nodes left alone, each with its reason.
        notes: Model-level remarks (already quantized, weights kept for other uses, …).
        functions: Local functions whose signature changed.
        bytes_before: Bytes of the main graph's initializers before.
        bytes_after: Bytes after.
        seconds: Wall time.
        into: The op the products became: ``MatMulNBits`` (weight-only) or
            ``DynamicQuantizeMatMul`` (``activations="dynamic"``).
    """

    quantized: list[QuantizedNode] = dataclasses.field(default_factory=list)
    skipped: list[SkippedNode] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)
    functions: list[str] = dataclasses.field(default_factory=list)
    bytes_before: int = 0
    bytes_after: int = 0
    seconds: float = 0.0
    into: str = "MatMulNBits"

    def fill_from(self, other: QuantizeReport) -> None:
        """Make this report a copy of ``other`` (how ``report=`` out-parameters are filled)."""
        for field in dataclasses.fields(self):
            setattr(self, field.name, getattr(other, field.name))

    def __str__(self) -> str:
        mib = 1 << 20
        gathers = sum(1 for q in self.quantized if q.op_type == "Gather")
        also = f", {gathers} Gather → GatherBlockQuantized" if gathers else ""
        lines = [
            f"quantize: {len(self.quantized) - gathers} node(s) → {self.into}{also}, "
            f"{len(self.skipped)} "
            f"skipped, {len(self.functions)} function(s) changed, weights "
            f"{self.bytes_before / mib:.2f} → {self.bytes_after / mib:.2f} MiB, "
            f"{self.seconds * 1000:.0f} ms"
        ]
        lines += [f"  note: {n}" for n in self.notes]
        for s in self.skipped:
            mods = f" [{', '.join(s.modules[:3])}{', …' if len(s.modules) > 3 else ''}]"
            lines.append(
                f"  ✗ {s.op_type} {s.node} in {s.where}{mods if s.modules else ''}: {s.reason}"
            )
        return "\n".join(lines)
