"""Complex tensors through the ops torchlib has no (or no correct) complex lowering for.

torchlib represents a complex tensor ``z`` of shape ``S`` as the real tensor
``view_as_real(z)`` of shape ``S + [2]`` (``[..., 0]`` the real part, ``[..., 1]`` the imaginary
part), and lowers a node with a complex input through its complex overload when it registers one
(``mul``, ``permute``, ``slice``, ``view``, ``cat`` …). For the others irkit **decomposes the
node over the real and imaginary parts**, by identities that hold for every op of a kind:

``f(z) = complex(f(re z), f(im z))``
    ``f`` moves, selects or copies elements without mixing them: every view (``unsqueeze``,
    ``expand``, ``select``, ``split`` …, by the op's alias annotation, when it keeps the complex
    dtype) and the data-movement ops of :data:`_MOVES` (``index``, ``gather``, ``repeat``,
    ``where`` …). Integer and bool arguments (dims, sizes, indices, masks) go to both calls; a
    floating argument (a fill value, a real tensor mixed in) would be wrong in the imaginary
    call, so such a node is not decomposed this way.
``z · r = complex(re z · r, im z · r)``, ``z / r = complex(re z / r, im z / r)``
    ``mul`` with one complex factor, ``div`` by a real (tensor or number): the real operand goes
    to both calls. (torchlib's complex ``mul`` would read the real operand's last dim as
    (re, im).)
``z ± α·r = complex(re z ± α·r, im z ± α·0)`` (and ``r ± α·z`` likewise)
    ``add``/``sub`` with one real operand: it is promoted to ``complex(r, 0)`` as torch promotes
    it, then both parts are computed.
``to(z, complex) = complex(to(re z), to(im z))``, ``to(z, real) = to(re z)``
    The casts (``to.*``, ``_to_copy``): the parts are cast to the result's part dtype; a cast to
    a real dtype keeps the real part, as torch does.

Each decomposition is a Python function traced like torch's own (``make_fx`` on the node's fake
inputs) and planned recursively: ``view_as_real(z)[..., 0]`` and ``complex(re, im)`` (written
``view_as_complex(stack([re, im], -1))``) lower through torchlib, the real-valued ops through whatever lowers them. Ops with complex inputs that
none of this covers (``exp``, ``matmul`` of two complex tensors …) keep torch's decompositions,
and an :class:`~irkit.errors.UnsupportedOpError` if those fail too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.utils._pytree as pytree

from irkit.lowering._plan_types import Choice, Via

__all__ = ["complex_choice", "has_complex_input"]

aten = torch.ops.aten

# Data-movement ops that are not views: each output element is one input element (or zero).
_MOVES = frozenset(
    {
        aten.clone.default,
        aten.index.Tensor,
        aten.index_select.default,
        aten.gather.default,
        aten.repeat.default,
        aten.repeat_interleave.self_int,
        aten.where.self,
        aten.flip.default,
        aten.roll.default,
        aten.cat.default,
        aten.stack.default,
        aten.tril.default,
        aten.triu.default,
        aten.zeros_like.default,
        aten.index_put.default,
        aten.scatter.src,
        aten.expand_copy.default,
        aten.permute_copy.default,
        aten.unsqueeze_copy.default,
        aten.squeeze_copy.dim,
        aten.select_copy.int,
        aten.slice_copy.Tensor,
        aten.view_copy.default,
        aten.transpose_copy.int,
        aten.lift_fresh_copy.default,
    }
)

# Real-linear in the complex operand, the real operand a coefficient: (op, complex positions).
_SCALED = {
    aten.mul.Tensor: (0, 1),
    aten.mul.Scalar: (0,),
    aten.div.Tensor: (0,),
    aten.div.Scalar: (0,),
}

# Real-linear in both operands: the real one is promoted to complex(r, 0).
_SHIFTED = frozenset({aten.add.Tensor, aten.add.Scalar, aten.sub.Tensor, aten.sub.Scalar})

_CASTS = frozenset(
    {
        aten.to.dtype,
        aten.to.dtype_layout,
        aten.to.device,
        aten.to.other,
        aten._to_copy.default,
    }
)

_CHANGES_DTYPE = frozenset({aten.view_as_real.default, aten.view.dtype, aten.real.default})


def has_complex_input(node: torch.fx.Node) -> bool:
    """Whether a tensor input of ``node`` is complex."""
    return any(_is_complex(_val(a)) for a in node.all_input_nodes)


def complex_choice(node: torch.fx.Node, target: Any, torchlib_complex: bool) -> Choice | None:
    """The decomposition over real and imaginary parts of a node with a complex input, or None.

    Args:
        node: The FX node (its inputs' and output's ``meta["val"]`` decide).
        target: The op the node applies (its own target, or an in-place op's counterpart).
        torchlib_complex: torchlib registers a complex lowering of ``target``; it is used for
            the ops whose identity is only "moves elements" (no arithmetic is mixed in).

    Returns:
        ``Choice(Via.DECOMPOSE, ...)`` (the op's composite kernel first, where it has one), or
        None: the node takes the usual way (torchlib's complex overload, torch's decompositions).
    """
    if not isinstance(target, torch._ops.OpOverload):
        return None
    if target in _CASTS:
        return _choice(_cast(node))
    if target in _SCALED:
        return _choice(_scaled(node, target, _SCALED[target]))
    if target in _SHIFTED:
        return _choice(_shifted(node, target))
    if torchlib_complex or not _moves_elements(node, target):
        return None
    composite = (
        (target.decompose,)
        if target.has_kernel_for_dispatch_key(torch._C.DispatchKey.CompositeImplicitAutograd)
        else ()
    )
    return Choice(
        Via.DECOMPOSE,
        composite[0] if composite else None,
        candidates=(*composite, _parts(target, _no_promotion)),
    )


def _choice(fn: Callable[..., Any] | None) -> Choice | None:
    return None if fn is None else Choice(Via.DECOMPOSE, fn, candidates=(fn,))


def _val(arg: Any) -> Any:
    return arg.meta.get("val") if isinstance(arg, torch.fx.Node) else arg


def _is_complex(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.dtype.is_complex


def _flat_values(node: torch.fx.Node) -> list[Any]:
    return [_val(a) for a in pytree.tree_leaves((node.args, node.kwargs))]


def _moves_elements(node: torch.fx.Node, target: torch._ops.OpOverload) -> bool:
    """A view that keeps the complex dtype, or one of :data:`_MOVES`, mixing in no real data."""
    if target in _CHANGES_DTYPE:
        return False
    out = [v for v in pytree.tree_leaves(node.meta.get("val")) if isinstance(v, torch.Tensor)]
    if not out or not all(_is_complex(v) for v in out):
        return False
    if not (target in _MOVES or target.is_view):
        return False
    for value in _flat_values(node):
        if isinstance(value, torch.Tensor) and value.dtype.is_floating_point:
            return False  # real data would land in the imaginary part too
        if isinstance(value, (float, complex, torch.SymFloat)):
            return False  # a fill value
    return True


# --- the decompositions -------------------------------------------------------------------------


def _part(value: Any, index: int) -> Any:
    """The real (0) or imaginary (1) part of a complex tensor; anything else as it is."""
    if _is_complex(value):
        return torch.view_as_real(value).select(-1, index)
    return value


def _no_promotion(value: Any, index: int) -> Any:
    return _part(value, index)


def _promoted(value: Any, index: int) -> Any:
    """Parts of an operand promoted to complex: a real ``r`` is ``complex(r, 0)``."""
    if _is_complex(value) or index == 0:
        return _part(value, index)
    if isinstance(value, torch.Tensor):
        return torch.zeros_like(value)
    return 0 if isinstance(value, (int, float)) else value


def _complex(re: torch.Tensor, im: torch.Tensor) -> torch.Tensor:
    """``complex(re, im)`` as ``view_as_complex(stack([re, im], -1))``: a ``Concat`` of the
    parts in torchlib's representation (``aten.complex``'s meta reads strides, and adds
    guards on symbolic sizes that a stacked, contiguous tensor does not need)."""
    return torch.view_as_complex(torch.stack([re, im], dim=-1))


def _combine(re: Any, im: Any) -> Any:
    if isinstance(re, (tuple, list)):
        return type(re)(_complex(r, i) for r, i in zip(re, im, strict=True))
    return _complex(re, im)


def _parts(
    target: torch._ops.OpOverload, part: Callable[[Any, int], Any], operands: tuple[int, ...] = ()
) -> Callable[..., Any]:
    """``f(z, …) = complex(f(part(z, 0), …), f(part(z, 1), …))``; ``operands``: the argument
    positions ``part`` applies to (default: every argument)."""

    def split(args: tuple[Any, ...], kwargs: dict[str, Any], index: int) -> Any:
        def one(position: int | str, value: Any) -> Any:
            if operands and position not in operands:
                return _part(value, index)
            return pytree.tree_map(lambda v: part(v, index), value)

        return (
            [one(i, a) for i, a in enumerate(args)],
            {k: one(k, v) for k, v in kwargs.items()},
        )

    def decomposition(*args: Any, **kwargs: Any) -> Any:
        re_args, re_kwargs = split(args, kwargs, 0)
        im_args, im_kwargs = split(args, kwargs, 1)
        return _combine(target(*re_args, **re_kwargs), target(*im_args, **im_kwargs))

    decomposition.__name__ = f"complex_parts_{target.__name__.replace('.', '_')}"
    return decomposition


def _scaled(
    node: torch.fx.Node, target: torch._ops.OpOverload, positions: tuple[int, ...]
) -> Callable[..., Any] | None:
    """``mul``/``div`` with exactly one complex operand, at one of ``positions``."""
    values = [_val(a) for a in node.args[:2]]
    complex_at = [i for i, v in enumerate(values) if _is_complex(v) or isinstance(v, complex)]
    if len(complex_at) != 1 or complex_at[0] not in positions:
        return None
    return _parts(target, _no_promotion)


def _shifted(node: torch.fx.Node, target: torch._ops.OpOverload) -> Callable[..., Any] | None:
    """``add``/``sub`` with exactly one complex operand (a complex ``alpha`` is left to torch)."""
    values = [_val(a) for a in node.args[:2]]
    if sum(_is_complex(v) or isinstance(v, complex) for v in values) != 1:
        return None
    if isinstance(_val(node.kwargs.get("alpha", 1)), complex):
        return None
    return _parts(target, _promoted, operands=(0, 1))


def _cast(node: torch.fx.Node) -> Callable[..., Any] | None:
    out = node.meta.get("val")
    if not isinstance(out, torch.Tensor) or not _is_complex(_val(node.args[0])):
        return None
    dtype = out.dtype

    def cast(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        re = torch.view_as_real(self).select(-1, 0)
        if not dtype.is_complex:
            return re.to(dtype)
        im = torch.view_as_real(self).select(-1, 1)
        part = dtype.to_real()
        return _complex(re.to(part), im.to(part))

    cast.__name__ = "complex_cast"
    return cast
