"""Dtype reconciliation: the dtypes ONNX ops need, made to agree with the dtypes torch computes.

torch promotes implicitly (``float32 * int64 → float32``, ``int64 / int → float32``, ``sin(int64)
→ float32``, autocast regions compute ``linear`` in bfloat16); ONNX ops require their inputs to
agree and many are float-only. For every lowered node, before its lowering runs,
:func:`input_casts` decides which tensor inputs must be cast and to what, from

1. torch's own elementwise promotion rules, read off the reference implementations
   (``torch._refs``: which arguments promote, and the promotion kind), applied to the node's
   FakeTensor values; else
2. an op with a ``dtype`` argument and no tensor options (``sum``, ``cumsum``, ``softmax``)
   computes in its result's dtype, so its input is cast to it (``sum`` of a bool mask); else
3. for pointwise ops, every input that differs from a floating result is cast to the result's
   dtype (``div.Tensor`` on integers is true division) — except bool masks next to non-bool
   data (``masked_fill``); else
4. for any other op with a floating result, floating inputs of another floating dtype are cast to
   the result's dtype (autocast regions, mixed-precision norms).

After the lowering, :func:`output_cast` tells when the ONNX value's dtype still differs from
torch's result dtype (``ALWAYS_BOOL`` comparisons of promoted inputs, torchlib functions that
return their input's dtype). No op is special-cased here; the rules come from torch.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Sequence
from typing import Any

import onnx_ir as ir
import torch
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND as Kind
from torch._prims_common import elementwise_dtypes
from torch._prims_common.wrappers import elementwise_type_promotion_wrapper

from irkit.errors import LoweringError
from irkit.lowering._trace import trace_decomposition
from irkit.lowering._types import DTYPES

__all__ = ["input_casts", "output_cast"]

_MAX_UNWRAP = 8


def _find_wrapper(fn: Any, depth: int = 0, seen: set[int] | None = None) -> Any:
    """The ``elementwise_type_promotion_wrapper`` a reference function was decorated with."""
    seen = set() if seen is None else seen
    if fn is None or depth > _MAX_UNWRAP or id(fn) in seen:
        return None
    seen.add(id(fn))
    cells = [c.cell_contents for c in (getattr(fn, "__closure__", None) or ()) if _filled(c)]
    for value in cells:
        if isinstance(value, elementwise_type_promotion_wrapper):
            return value
    for value in [*cells, getattr(fn, "__wrapped__", None)]:
        if callable(value) and not isinstance(value, type):
            found = _find_wrapper(value, depth + 1, seen)
            if found is not None:
                return found
    return None


def _filled(cell: Any) -> bool:
    try:
        cell.cell_contents  # noqa: B018 - an empty cell raises
    except ValueError:
        return False
    return True


@functools.cache
def _rule(target: torch._ops.OpOverload) -> tuple[tuple[int, ...], Kind] | None:
    """(schema positions of the promoting arguments, promotion kind) from torch's reference."""
    from torch._decomp import decomposition_table

    ref = decomposition_table.get(target)
    wrapper = _find_wrapper(ref)
    if wrapper is None:
        return None
    params = list(inspect.signature(ref).parameters)
    names = wrapper.type_promoting_arg_names
    positions = tuple(params.index(n) for n in names if n in params)
    if len(positions) != len(names) or max(positions, default=0) >= len(target._schema.arguments):
        return None
    return positions, wrapper.type_promotion_kind


def _arg(node: torch.fx.Node, position: int) -> tuple[str | int, Any]:
    """(where, FX argument) of schema position ``position``: an args index or a kwargs name."""
    if position < len(node.args):
        return position, node.args[position]
    name = node.target._schema.arguments[position].name
    return name, node.kwargs.get(name)


def _example(arg: Any) -> Any:
    """A value ``elementwise_dtypes`` understands: the FakeTensor, or a Python number."""
    if isinstance(arg, torch.fx.Node):
        val = arg.meta.get("val")
        if isinstance(val, torch.SymBool):
            return True
        if isinstance(val, torch.SymInt):
            return 1
        if isinstance(val, torch.SymFloat):
            return 1.0
        return val
    return arg


def _result(node: torch.fx.Node) -> torch.Tensor | None:
    val = node.meta.get("val")
    return val if isinstance(val, torch.Tensor) else None


def input_casts(
    node: torch.fx.Node, memo: dict[Any, bool]
) -> tuple[list[tuple[str | int, int | None]], torch.dtype | None]:
    """Which inputs of ``node`` must be cast, and to which torch dtype.

    Args:
        node: The FX node about to be lowered.
        memo: Per-lowering cache of what tracing composite kernels found (see
            ``_pointwise_alias``).

    Returns:
        ``(places, dtype)``: each place is ``(args index or kwargs name, list index or None)``;
        ``dtype`` is None when nothing is cast.
    """
    result = _result(node)
    target = node.target
    if result is None or result.dtype.is_complex or not isinstance(target, torch._ops.OpOverload):
        return [], None
    rule = _rule(target)
    if rule is not None:
        positions, kind = rule
        if kind is Kind.COMPLEX_TO_FLOAT:
            return [], None
        args = [_arg(node, p) for p in positions]
        if kind is Kind.ALWAYS_BOOL:
            examples = [_example(a) for _, a in _flat(args)]
            examples = [e for e in examples if isinstance(e, (torch.Tensor, bool, int, float))]
            if not any(isinstance(e, torch.Tensor) for e in examples):
                return [], None
            dtype = elementwise_dtypes(*examples, type_promotion_kind=Kind.DEFAULT)[1]
        else:
            dtype = result.dtype
        return [place for place, a in _flat(args) if _differs(a, dtype)], dtype
    places, dtype = _computes_in_dtype(node, result.dtype)
    if dtype is not None or not result.dtype.is_floating_point:
        return places, dtype
    pointwise = torch.Tag.pointwise in target.tags or (
        _promotes_non_float(node) and _pointwise_alias(target, node, memo)
    )
    places = []
    flat = _flat(list(enumerate(node.args)) + list(node.kwargs.items()))
    tensors = [a.meta.get("val") for _, a in flat if isinstance(a, torch.fx.Node)]
    tensors = [v for v in tensors if isinstance(v, torch.Tensor)]
    # A bool input is a mask (``masked_fill``) unless every tensor input is bool (``div``).
    all_bool = bool(tensors) and all(v.dtype == torch.bool for v in tensors)
    for place, a in flat:
        val = a.meta.get("val") if isinstance(a, torch.fx.Node) else None
        if pointwise and isinstance(val, (torch.SymInt, torch.SymFloat)):
            places.append(place)  # ``x / x.size(0)``: the emitter casts the ONNX scalar
            continue
        if not isinstance(val, torch.Tensor) or val.dtype == result.dtype or val.dtype.is_complex:
            continue
        if val.dtype.is_floating_point or (pointwise and (val.dtype != torch.bool or all_bool)):
            places.append(place)
    return places, result.dtype if places else None


def _computes_in_dtype(
    node: torch.fx.Node, dtype: torch.dtype
) -> tuple[list[tuple[str | int, int | None]], torch.dtype | None]:
    """An op with a ``dtype`` argument but no tensor options (``sum``, ``cumsum``, ``softmax``,
    ``mean``) casts its input to that dtype before computing; so does the lowering."""
    names = {a.name for a in node.target._schema.arguments}
    if "dtype" not in names or "layout" in names or not node.args:
        return [], None
    first = node.args[0]
    val = first.meta.get("val") if isinstance(first, torch.fx.Node) else None
    if not isinstance(val, torch.Tensor) or val.dtype == dtype or val.dtype.is_complex:
        return [], None
    return [(0, None)], dtype


def _promotes_non_float(node: torch.fx.Node) -> bool:
    """Whether a non-bool integer tensor or a symbolic number feeds ``node`` (only then can
    being pointwise change the casts, so only then is an op's kernel traced to find out)."""
    for _, a in _flat(list(enumerate(node.args)) + list(node.kwargs.items())):
        val = a.meta.get("val") if isinstance(a, torch.fx.Node) else None
        if isinstance(val, (torch.SymInt, torch.SymFloat)):
            return True
        dtype = val.dtype if isinstance(val, torch.Tensor) else None
        if dtype is not None and not (dtype.is_floating_point or dtype.is_complex):
            return bool(dtype != torch.bool)
    return False


def _pointwise_alias(
    target: torch._ops.OpOverload, node: torch.fx.Node, memo: dict[Any, bool]
) -> bool:
    """Whether ``target`` is a composite alias of one pointwise op (``divide`` is ``div``).

    Aliases carry no tags; their ``CompositeImplicitAutograd`` kernel, traced once per op (per
    lowering: ``memo``) on the node's fake inputs, shows the op they stand for.
    """
    known = memo.get(target)
    if known is not None:
        return known
    result = False
    if target.has_kernel_for_dispatch_key(torch._C.DispatchKey.CompositeImplicitAutograd):
        try:
            traced = trace_decomposition(node, target.decompose)
        except LoweringError:
            traced = None
        if traced is not None:
            ops = [n.target for n in traced.graph.nodes if n.op == "call_function"]
            result = (
                len(ops) == 1
                and isinstance(ops[0], torch._ops.OpOverload)
                and (torch.Tag.pointwise in ops[0].tags)
            )
    memo[target] = result
    return result


def _flat(args: Sequence[tuple[str | int, Any]]) -> list[tuple[tuple[str | int, int | None], Any]]:
    out: list[tuple[tuple[str | int, int | None], Any]] = []
    for where, a in args:
        if isinstance(a, (list, tuple)):
            out.extend(((where, i), item) for i, item in enumerate(a))
        else:
            out.append(((where, None), a))
    return out


def _differs(arg: Any, dtype: torch.dtype) -> bool:
    if not isinstance(arg, torch.fx.Node):
        return False
    val = arg.meta.get("val")
    if isinstance(val, torch.Tensor):
        return val.dtype != dtype and not val.dtype.is_complex
    # A symbolic scalar is an INT64/FLOAT/BOOL ONNX scalar; the emitter compares ONNX dtypes.
    return isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool))


def output_cast(value: Any, val: Any) -> ir.DataType | None:
    """The ONNX dtype ``value`` must be cast to so it has torch's result dtype, or None."""
    if not isinstance(value, ir.Value) or not isinstance(val, torch.Tensor):
        return None
    if val.dtype.is_complex or value.dtype is None:
        return None
    expected = DTYPES.get(val.dtype)
    return expected if expected is not None and expected != value.dtype else None
