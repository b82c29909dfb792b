"""The call structure of a model's local functions, for passes that change function signatures.

Who calls each function (:class:`Calls`), the chains of calls that reach a body and the module
path a body node stands for along each (:func:`chains`, :func:`chain_path`), and copies of shared
bodies for calls that must part (:class:`Specializer`). Used by :mod:`irkit.rules.quantize`.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Sequence

import onnx_ir as ir

from irkit import metadata

__all__ = [
    "Owner",
    "Calls",
    "Chain",
    "Instance",
    "Specializer",
    "owners",
    "owner_name",
    "chains",
    "chain_path",
    "node_path",
]

Owner = ir.Graph | ir.Function
"""Where a node lives: the main graph or a local function's body."""


# --- the model's call structure ------------------------------------------------------------------


@dataclasses.dataclass
class Calls:
    """Which nodes call each local function, and from where."""

    by_function: dict[ir.OperatorIdentifier, list[tuple[Owner, ir.Node]]]

    @classmethod
    def of(cls, model: ir.Model) -> Calls:
        by_function: dict[ir.OperatorIdentifier, list[tuple[Owner, ir.Node]]] = {
            key: [] for key in model.functions
        }
        for owner in owners(model):
            for node in ir.traversal.RecursiveGraphIterator(owner):  # (If/Loop bodies too)
                key = (node.domain, node.op_type, node.overload)
                if key in by_function:
                    by_function[key].append((owner, node))
        return cls(by_function)

    def of_function(self, function: ir.Function) -> list[tuple[Owner, ir.Node]]:
        return self.by_function.get(function.identifier(), [])


def owners(model: ir.Model) -> list[Owner]:
    return [model.graph, *model.functions.values()]


def owner_name(owner: Owner) -> str:
    if isinstance(owner, ir.Function):
        return f"{owner.domain}::{owner.name}"
    return "<main>"


# --- module paths (for exclude= and bits_for=) ---------------------------------------------------


def _origin_path(function: ir.Function) -> str | None:
    origin = metadata.decode_scope(function.metadata_props.get(metadata.OUTLINE_ORIGIN))
    return origin[-1].path if origin else None


Chain = tuple[tuple[Owner, ir.Node], ...]
"""The calls leading from the main graph to a body, outermost first: ``(caller, call node)``."""

Instance = tuple[Chain, str, int | None]
"""One instance of a body node: its chain of calls, module path and wanted setting (bits, or
``None`` for float)."""


def chains(owner: Owner, calls: Calls, depth: int = 0) -> list[Chain]:
    """Every chain of calls that reaches ``owner`` (``[()]`` for the main graph)."""
    if not isinstance(owner, ir.Function) or depth > 64:
        return [()]
    found: list[Chain] = []
    for caller, call in calls.of_function(owner):
        found += [(*chain, (caller, call)) for chain in chains(caller, calls, depth + 1)]
    return found or [()]


def chain_path(owner: Owner, path: str, chain: Chain) -> str:
    """The module path a body path stands for when the body is reached through ``chain``."""
    for caller, call in reversed(chain):
        frame = metadata.node_call(call.metadata_props)
        if frame is not None and isinstance(owner, ir.Function):
            origin = _origin_path(owner)
            if origin is not None and (path == origin or path.startswith(origin + ".")):
                path = frame.path + path[len(origin) :]
            else:
                path = frame.path
        owner = caller
    return path


def node_path(node: ir.Node) -> str:
    scope = metadata.node_scope(node.metadata_props)
    return scope[-1].path if scope else ""


# --- giving instances that want different settings their own copies of a shared body ---------


_Key = frozenset[int | None]
"""The settings wanted through one call node (``None``: float)."""


class Specializer:
    """Copies shared function bodies so that calls wanting different settings part ways.

    For a node whose instances disagree, the innermost level of calls (1: the calls of the body
    itself) at which the call nodes lead to different sets of settings is found; the calls whose
    set is not the most common one are pointed at copies of the functions down to the body (one
    copy per function and set, reused by every node). Repeated until each body's instances
    agree (see :func:`_specialize`).
    """

    def __init__(self, model: ir.Model):
        self.model = model
        self.copies: dict[tuple[ir.OperatorIdentifier, _Key], ir.Function] = {}
        self.key_of_copy: dict[ir.OperatorIdentifier, _Key] = {}
        self.notes: list[str] = []

    def specialize(self, target: ir.Function, instances: Sequence[Instance]) -> bool:
        """Part ``target``'s instances one level; whether anything changed."""
        found = _parting_level(instances)
        if found is None:
            return False
        depth, keys = found
        counts = collections.Counter(keys[id(chain[-depth][1])] for chain, _, _ in instances)
        keep = max(counts, key=lambda k: (counts[k], sorted(str(x) for x in k)))
        done: set[int] = set()
        for chain, _, _ in instances:
            _, call = chain[-depth]
            key = keys[id(call)]
            if key == keep or id(call) in done:
                continue
            done.add(id(call))
            callee = self.model.functions[(call.domain, call.op_type, call.overload)]
            copy = self._copy_down(callee, key, target)
            call.op_type, call.overload = copy.name, copy.overload
        return bool(done)

    def _copy_down(self, function: ir.Function, key: _Key, target: ir.Function) -> ir.Function:
        """A copy of ``function`` for ``key`` whose calls leading to ``target`` go to copies."""
        ident = function.identifier()
        if self.key_of_copy.get(ident) == key:
            copy = function  # already a copy made for these settings
        elif (ident, key) in self.copies:
            copy = self.copies[(ident, key)]
        else:
            copy = self._new_copy(function, key)
        if function is target or copy is target:
            return copy
        for node in ir.traversal.RecursiveGraphIterator(copy):
            callee = self.model.functions.get((node.domain, node.op_type, node.overload))
            if callee is not None and _reaches(self.model, callee, target):
                inner = self._copy_down(callee, key, target)
                node.op_type, node.overload = inner.name, inner.overload
        return copy

    def _new_copy(self, function: ir.Function, key: _Key) -> ir.Function:
        copy = function.clone()
        suffix = _describe(key)
        name, i = f"{function.name}_{suffix}", 1
        while (function.domain, name, function.overload) in self.model.functions:
            name, i = f"{function.name}_{suffix}_{i}", i + 1
        copy.name = name
        copy.metadata_props.update(function.metadata_props)
        for domain, version in function.opset_imports.items():
            copy.opset_imports[domain] = version
        self.model.functions[copy.identifier()] = copy
        self.copies[(function.identifier(), key)] = copy
        self.key_of_copy[copy.identifier()] = key
        self.notes.append(
            f"{function.domain}::{function.name} copied as {name} for the calls that want "
            f"{_describe(key, long=True)}"
        )
        return copy


def _describe(key: _Key, long: bool = False) -> str:
    if len(key) > 1:
        return "several settings" if long else "mixed"
    (setting,) = key
    if setting is None:
        return "float"
    return f"{setting} bits" if long else f"q{setting}"


def _parting_level(
    instances: Sequence[Instance],
) -> tuple[int, dict[int, _Key]] | None:
    """The innermost call level (1: the body's own calls) whose call nodes lead to different
    sets of settings, with each call node's set; ``None`` if no level parts them."""
    shortest = min((len(c) for c, _, _ in instances), default=0)
    for depth in range(1, shortest + 1):
        wanted: dict[int, set[int | None]] = collections.defaultdict(set)
        for chain, _, setting in instances:
            wanted[id(chain[-depth][1])].add(setting)
        keys = {call: frozenset(s) for call, s in wanted.items()}
        if len(set(keys.values())) > 1:
            return depth, keys
    return None


def _reaches(model: ir.Model, function: ir.Function, target: ir.Function, depth: int = 0) -> bool:
    """Whether ``function`` is ``target`` or calls it, directly or not."""
    if function is target:
        return True
    if depth > 64:
        return False
    for node in ir.traversal.RecursiveGraphIterator(function):
        callee = model.functions.get((node.domain, node.op_type, node.overload))
        if callee is not None and _reaches(model, callee, target, depth + 1):
            return True
    return False
