"""Replaying an outlined call for a repeated, identical call, without outlining its children again.

Outlining a 64-layer stack bottom-up would build every layer's child calls (norms, linears,
attention …) and then find, at the layer level, that layers 1 … 63 are duplicates of layer 0 and
drop them. Replay short-cuts that: before a call's children are outlined, its whole subtree is
keyed *flat* — :func:`~irkit.hierarchy._dedupe.canonical_key` over every node it owns, each
labelled with its module scope relative to the call (child path, call index, class, and whether
that child is to be outlined). Two calls with equal flat keys outline to the same function: the
bottom-up algorithm is deterministic in exactly these inputs when the call's region is
contiguous (then every child region and its span lie inside it). So after the first call of a
class has been outlined normally, its result is recorded as a :class:`Template` — the function
and how the flat boundary maps onto its inputs and outputs — and a later call with the same flat
key becomes one call node of that function straight away.

A template is only recorded when the first call's outlining was clean (no split, nothing left
inline, so no note would be lost) and its function's inputs and outputs are exactly the flat
boundary; otherwise later calls simply take the normal path.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import onnx_ir as ir

from irkit.hierarchy._analysis import Scope

__all__ = ["Template", "Pending", "relative_labels", "make_template"]


@dataclasses.dataclass(frozen=True)
class Template:
    """An outlined call to replay: ``function`` gets flat input ``inputs[j]`` as its input ``j``
    and its output ``j`` stands for flat output ``outputs[j]``."""

    function: ir.Function
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]


@dataclasses.dataclass
class Pending:
    """A call keyed on the way down that missed; recorded as a template on the way up."""

    key: tuple[object, ...]
    inputs: list[ir.Value]  # the flat boundary, in the order the key numbers it
    output_names: list[str | None]
    notes: int  # how many outlining notes existed before its subtree was outlined


def relative_labels(
    scope: Scope, descendants: Sequence[Scope], outlined: Callable[[Scope], bool]
) -> dict[Scope, tuple[object, ...]]:
    """Each scope of ``scope``'s subtree → its frames below ``scope``, as a name-free label.

    A frame's label is ``(path relative to the call, call index, class, outlined?)``; paths that
    are not under the call's own path (a module shared between layers) are kept whole.

    Example:
        >>> from irkit.metadata import Frame as f
        >>> top = (f("layers.3", 0, "m.Block"),)
        >>> child = (*top, f("layers.3.mlp", 0, "m.MLP"))
        >>> relative_labels(top, [child], lambda s: True)[child]
        (('mlp', 0, 'm.MLP', True),)
    """
    path = scope[-1].path
    prefix = f"{path}." if path else ""
    labels: dict[Scope, tuple[object, ...]] = {scope: ()}
    for sub in sorted(descendants, key=len):  # parents first
        frame = sub[-1]
        rel = frame.path[len(prefix) :] if frame.path.startswith(prefix) else frame.path
        labels[sub] = (*labels[sub[:-1]], (rel, frame.call_index, frame.cls, outlined(sub)))
    return labels


def make_template(pending: Pending, call: ir.Node, function: ir.Function) -> Template | None:
    """The template of ``call`` (the first call's result), or ``None`` if it does not map exactly.

    Every flat input must be one of the call's inputs and every flat output one of its outputs
    (matched by value name: outlining keeps the names of the values a call node stands for).
    """
    position: dict[ir.Value | None, int] = {v: i for i, v in enumerate(pending.inputs)}
    inputs = [position.get(v) for v in call.inputs]
    names = pending.output_names
    if None in names or len(set(names)) != len(names):
        return None
    out_position = {name: i for i, name in enumerate(names)}
    outputs = [out_position.get(v.name) for v in call.outputs]
    if None in inputs or sorted(inputs) != list(range(len(position))):  # type: ignore[type-var]
        return None
    if None in outputs or sorted(outputs) != list(range(len(names))):  # type: ignore[type-var]
        return None
    return Template(function, tuple(inputs), tuple(outputs))  # type: ignore[arg-type]
