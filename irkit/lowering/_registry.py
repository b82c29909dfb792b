"""Which lowering serves an FX node: custom table > irkit's own > torchlib > decomposition.

Dispatch is on the node's target *object* (``torch.ops.aten.add.Tensor``), never its name.
"""

from __future__ import annotations

import dataclasses
import functools
import operator
from collections.abc import Callable, Mapping
from typing import Any

import torch
from onnxscript.function_libs.torch_lib import registration

from irkit.lowering._complex import complex_choice, has_complex_input
from irkit.lowering._control_flow import is_control_flow
from irkit.lowering._own import own_lowerings
from irkit.lowering._plan_types import Choice, Via
from irkit.lowering._regions import region_op
from irkit.lowering._source import resolve_op

__all__ = ["Via", "Choice", "LoweringTable", "torchlib_table", "decompositions"]


@dataclasses.dataclass(frozen=True)
class _TorchlibEntry:
    real: Callable[..., Any] | None
    complex: Callable[..., Any] | None


@functools.cache
def _torchlib_scan() -> tuple[Mapping[Any, _TorchlibEntry], tuple[tuple[str, _TorchlibEntry], ...]]:
    """torchlib's registry: the entries by target, and those whose op is not registered (yet)."""
    # Importing the ops module registers every torchlib function in the default registry.
    from onnxscript.function_libs.torch_lib import ops  # noqa: F401

    entries: dict[Any, _TorchlibEntry] = {}
    pending: list[tuple[str, _TorchlibEntry]] = []
    for qualified_name, overloaded in registration.default_registry.items():
        real = overloaded.overloads[0] if overloaded.overloads else None
        cplx = overloaded.complex[0] if overloaded.complex else None
        target = resolve_op(qualified_name)
        if target is None:
            pending.append((qualified_name, _TorchlibEntry(real, cplx)))
        else:
            entries[target] = _TorchlibEntry(real, cplx)
    return entries, tuple(pending)


def _torchlib_entries() -> Mapping[Any, _TorchlibEntry]:
    """Target → torchlib entry, including library ops registered since the first call (a
    process that lowered a model before importing torchvision still finds ``torchvision::*``)."""
    entries, pending = _torchlib_scan()
    late = {t: e for name, e in pending if (t := resolve_op(name)) is not None}
    return {**entries, **late} if late else entries


def torchlib_table() -> Mapping[Any, Callable[..., Any]]:
    """Target → torchlib's real-valued lowering (what irkit's own lowerings delegate to)."""
    return {t: e.real for t, e in _torchlib_entries().items() if e.real is not None}


def _functional_counterpart(target: torch._ops.OpOverload) -> torch._ops.OpOverload | None:
    """``aten.add_.Tensor`` → ``aten.add.Tensor``; ``bernoulli_.float`` → ``bernoulli.p``.

    The functional overload is the one of ``name[:-1]`` whose arguments after ``self`` have the
    same names and types (overload names do not always correspond).
    """
    schema = target._schema
    namespace, _, name = schema.name.partition("::")
    if not (schema.is_mutable and name.endswith("_") and not name.endswith("__")):
        return None
    wanted = _signature_key(schema)
    # ``add_`` → ``add``; ``normal_`` → ``normal_functional`` (torch's name where ``normal``
    # means something else).
    for base in (name[:-1], f"{name[:-1]}_functional"):
        packet = getattr(getattr(torch.ops, namespace, None), base, None)
        if not isinstance(packet, torch._ops.OpOverloadPacket):
            continue
        by_name = getattr(packet, schema.overload_name or "default", None)
        if by_name is not None and _signature_key(by_name._schema) == wanted:
            return by_name
        overloads = [getattr(packet, o) for o in packet.overloads()]
        found = next((o for o in overloads if _signature_key(o._schema) == wanted), None)
        if found is not None:
            return found
    return None


def _signature_key(schema: Any) -> tuple[tuple[str, str], ...]:
    return tuple((a.name, str(a.type)) for a in schema.arguments[1:] if not a.kwarg_only) + tuple(
        sorted((a.name, str(a.type)) for a in schema.arguments[1:] if a.kwarg_only)
    )


def decompositions(target: Any) -> tuple[Callable[..., Any], ...]:
    """Every decomposition torch has for ``target``, in the order the planner tries them.

    The op's ``CompositeImplicitAutograd`` kernel (aten-level), torch's decomposition table
    (``torch._decomp``, including the Python references), and a primitive's aten implementation
    (``prims.*``, which the references decompose into).
    """
    from torch._decomp import decomposition_table

    if not isinstance(target, torch._ops.OpOverload):
        return ()
    found: list[Callable[..., Any]] = []
    # Composite kernels first: they decompose into aten ops, which torchlib covers best; the
    # table's Python references often decompose into primitives (``fft_fft`` → ``prims.fft_r2c``
    # and a complex scaling, where the aten kernel keeps ``_fft_r2c(normalization=…)``).
    if target.has_kernel_for_dispatch_key(torch._C.DispatchKey.CompositeImplicitAutograd):
        found.append(target.decompose)
    fn = decomposition_table.get(target)
    if fn is not None:
        found.append(fn)
    impl_aten = getattr(target, "impl_aten", None)  # torch._prims primitives
    if callable(impl_aten):
        found.append(impl_aten)
    return tuple(found)


class LoweringTable:
    """Answers "how is this FX node lowered?" for one :func:`irkit.lower` call."""

    def __init__(
        self,
        custom: Mapping[Any, Callable[..., Any]] | None,
        *,
        decompose_custom_ops: bool = False,
    ):
        self._custom = _expand_packets(custom or {})
        self._decompose_custom_ops = decompose_custom_ops
        entries = _torchlib_entries()
        self._torchlib = entries
        self._own = own_lowerings()

    def choose(self, node: torch.fx.Node, target: Any = None) -> Choice | None:
        """The lowering of ``node`` (or of ``target`` applied to its arguments), or None.

        None means no lowering at all, not even a decomposition.
        """
        target = node.target if target is None else target
        if target is operator.getitem:
            # A tuple element, or (when the producer returned an ONNX sequence) SequenceAt.
            entry = self._torchlib.get(operator.getitem)
            return Choice(Via.GETITEM, entry.real if entry else None)
        fn = self._custom.get(target)
        if fn is not None:
            return Choice(Via.CUSTOM, fn)
        if region_op(target) is not None:
            return Choice(Via.REGION)
        if is_control_flow(target):
            return Choice(Via.CONTROL_FLOW)
        own = self._own.get(target)
        entry = self._torchlib.get(target)
        complex_input = has_complex_input(node)
        if complex_input:  # torchlib's real representation: an own lowering must say it knows it
            parts = complex_choice(node, target, entry is not None and entry.complex is not None)
            if parts is not None:
                return parts
        if (
            own is not None
            and own.fn is not None
            and (own.complex or not complex_input)
            and (own.applies is None or own.applies(node))
        ):
            return Choice(Via.IRKIT, own.fn, identity=own.identity)
        gap = own.torchlib_gap if own is not None else None
        if entry is not None and (gap is None or not gap(node)):
            fn = entry.complex if complex_input else entry.real
            if fn is not None:
                return Choice(Via.TORCHLIB, fn)
        if isinstance(target, torch._ops.OpOverload):
            functional = _functional_counterpart(target)
            if functional is not None:
                return Choice(Via.INPLACE, functional=functional)
            candidates = decompositions(target)
            if self._decompose_custom_ops:
                candidates += custom_op_implementation(target)
            if candidates:
                return Choice(Via.DECOMPOSE, candidates[0], candidates=candidates)
        return None


def custom_op_implementation(target: torch._ops.OpOverload) -> tuple[Callable[..., Any], ...]:
    """The Python implementation of a ``torch.library.custom_op``, to trace like a decomposition."""
    from torch._library.custom_ops import _maybe_get_opdef

    opdef = _maybe_get_opdef(target)
    fn = getattr(opdef, "_init_fn", None)
    return (fn,) if callable(fn) else ()


def _expand_packets(custom: Mapping[Any, Callable[..., Any]]) -> dict[Any, Callable[..., Any]]:
    """Allow ``torch.ops.ns.op`` (a packet) as a key: it means every overload of it."""
    table: dict[Any, Callable[..., Any]] = {}
    for key, fn in custom.items():
        if isinstance(key, torch._ops.OpOverloadPacket):
            for overload in key.overloads():
                table[getattr(key, overload)] = fn
        else:
            table[key] = fn
    return table
