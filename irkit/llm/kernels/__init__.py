"""Export kernels: transformers' hub-kernel contracts re-implemented so ``torch.export`` keeps them.

transformers 5.x calls the recurrences of state-space and linear-attention mixers through
*hub-kernel contract functions*: module-level functions of each ``modeling_*.py`` decorated
``@use_kernel_func_from_hub_with_fallback("<contract>", "<package>")``, one contract shared by
every architecture that uses the kernel (``"chunk_gated_delta_rule"`` serves Qwen3-Next,
Qwen3.5, OLMo-hybrid, …). Their PyTorch fallbacks loop in Python over tokens or chunks, which
``torch.export`` unrolls for the example length, so no one program could serve a prefill of any
length and a one-token decode.

:func:`export_kernels` swaps, while a model is exported, every contract function of the
model's modeling modules that irkit has an export kernel for: a function with the contract's
signature and semantics whose recurrence over the sequence is a ``torch`` ``scan`` (one step per
token, the state as the carry), which ``torch.export`` keeps as a higher-order op and
``irkit.lower`` writes as an ONNX ``Scan``. One kernel serves every model of the contract; a new
family is one module with a ``KERNELS`` table. See ``docs/llm.md`` ("State-space and
linear-attention models").

A recurrence no contract covers (RecurrentGemma's RG-LRU: a method looping over the tokens;
RWKV's ``rwkv_linear_attention``: a module-level function; xLSTM's ``xLSTMBackend.forward``,
whose chunk and step loops a partial built with the module calls) is
swapped by the *qualified name* of the function or method it replaces, ``"Class.method"`` or
``"function"`` as ``__qualname__`` spells it inside one of the model's modeling modules: a family
module's ``METHODS`` table (:data:`METHODS`). The same ``with`` swaps both, and puts both back.

A mixer whose recurrence is inline (no function to swap: MiniMax's lightning attention) gets
its ``forward`` swapped instead, keyed by what the module is: a family's ``MODULE_KERNELS``
pairs (predicate on the module, export forward).

A module kernel may change what the model caches (MLA's absorbed form caches ``[latent | k_pe]``
as one key head, not the latent and ``k_pe``): a family lists such forwards in ``CACHE_LAYOUT``
(:data:`CACHE_LAYOUT`), and :func:`layout_kernels` swaps only those, for the eager runs that
must see the cache the exported program has (:func:`irkit.llm.cache_layout`,
:func:`irkit.llm.run_eager`).
"""

from __future__ import annotations

import contextlib
import sys
import types
from collections.abc import Callable, Iterator, Mapping
from types import ModuleType
from typing import Any

from irkit.llm.kernels import (
    compressed,
    experts,
    gated_delta,
    kda,
    lightning,
    mamba,
    mamba2,
    mla,
    mlstm,
    ranges,
    rglru,
    wkv,
)
from irkit.llm.kernels._mask import enter_state, layer_state, leave_state, padding_mask, step_mask

__all__ = [
    "CACHE_LAYOUT",
    "KERNELS",
    "METHODS",
    "MODULE_KERNELS",
    "contract_name",
    "contract_functions",
    "export_kernels",
    "layout_kernels",
    "enter_state",
    "layer_state",
    "leave_state",
    "padding_mask",
    "step_mask",
]

_FAMILIES: tuple[ModuleType, ...] = (
    gated_delta, mamba, mamba2, kda, lightning, mla, mlstm, rglru, wkv, experts, ranges,
    compressed,
)  # fmt: skip

#: Export kernel by hub-kernel contract name, over every family module.
KERNELS: Mapping[str, Callable[..., Any]] = {
    name: kernel for family in _FAMILIES for name, kernel in getattr(family, "KERNELS", {}).items()
}

#: Export kernel by the qualified name of the module-level function or method it replaces
#: (``"Class.method"`` or ``"function"``, as ``__qualname__`` spells it in a modeling module).
METHODS: Mapping[str, Callable[..., Any]] = {
    name: kernel for family in _FAMILIES for name, kernel in getattr(family, "METHODS", {}).items()
}

#: Export ``forward`` of a module that calls no contract (its recurrence is inline), by what the
#: module is: ``(predicate on the module, forward)`` pairs, over every family module.
MODULE_KERNELS: tuple[tuple[Callable[[Any], bool], Callable[..., Any]], ...] = tuple(
    pair for family in _FAMILIES for pair in getattr(family, "MODULE_KERNELS", ())
)

#: The forwards of :data:`MODULE_KERNELS` that change what the model's cache holds.
CACHE_LAYOUT: frozenset[Callable[..., Any]] = frozenset(
    forward for family in _FAMILIES for forward in getattr(family, "CACHE_LAYOUT", ())
)


def contract_name(function: Any) -> str | None:
    """The hub-kernel contract a transformers function is decorated with, else ``None``.

    ``use_kernel_func_from_hub_with_fallback(func_name, package)`` wraps the PyTorch fallback
    (``functools.wraps``: ``__wrapped__`` is the fallback) in a closure over ``func_name``, the
    contract; that closure variable is read here.

    Args:
        function: Any object (a module global of a modeling module).

    Returns:
        The contract name, or ``None`` for anything that is not such a wrapper.
    """
    if not callable(function) or not hasattr(function, "__wrapped__"):
        return None
    code = getattr(function, "__code__", None)
    closure = getattr(function, "__closure__", None)
    if code is None or not closure or "func_name" not in code.co_freevars:
        return None
    value = closure[code.co_freevars.index("func_name")].cell_contents
    return value if isinstance(value, str) else None


def _modeling_modules(model: Any) -> list[ModuleType]:
    seen: dict[str, ModuleType] = {}
    for module in model.modules():
        name = type(module).__module__
        found = sys.modules.get(name)
        if found is not None and name.startswith("transformers.models."):
            seen.setdefault(name, found)
    return list(seen.values())


def contract_functions(model: Any) -> list[tuple[ModuleType, str, str]]:
    """The contract functions the model's modeling modules define.

    Args:
        model: A transformers model (an ``nn.Module``).

    Returns:
        ``(module, global name, contract name)`` for each decorated function found.
    """
    found = []
    for module in _modeling_modules(model):
        for attribute, value in vars(module).items():
            contract = contract_name(value)
            if contract is not None:
                found.append((module, attribute, contract))
    return found


def _method_targets(model: Any) -> list[tuple[Any, str, str]]:
    """``(owner, attribute, qualified name)`` of each :data:`METHODS` entry the model's modeling
    modules define (the owner a class or the module, defining the attribute itself)."""
    found = []
    for module in _modeling_modules(model):
        for qualified in METHODS:
            *path, attribute = qualified.split(".")
            owner: Any = module
            for part in path:
                owner = vars(owner).get(part) if hasattr(owner, "__dict__") else None
            if owner is not None and attribute in getattr(owner, "__dict__", {}):
                found.append((owner, attribute, qualified))
    return found


@contextlib.contextmanager
def export_kernels(model: Any) -> Iterator[list[str]]:
    """Inside the ``with``, the model's contract functions (and the functions and methods of
    :data:`METHODS`) are irkit's export kernels.

    Only the modeling modules of ``model``'s own module classes are touched, and every global or
    class attribute is put back on exit (also on error). Contracts without an export kernel are
    left as they are. Each submodule that a predicate of :data:`MODULE_KERNELS` accepts gets that
    export ``forward`` as an instance attribute, removed on exit.

    Args:
        model: A transformers model.

    Yields:
        The sorted contract names, qualified names and module forwards that were swapped.
    """
    swapped: list[tuple[ModuleType, str, Any]] = []
    names = set()
    forwards: list[tuple[Any, Any]] = []  # (module, its own instance `forward` or None)
    try:
        for module, attribute, contract in contract_functions(model):
            kernel = KERNELS.get(contract)
            if kernel is None:
                continue
            swapped.append((module, attribute, getattr(module, attribute)))
            setattr(module, attribute, kernel)
            names.add(contract)
        for holder, attribute, qualified in _method_targets(model):
            swapped.append((holder, attribute, vars(holder)[attribute]))
            setattr(holder, attribute, METHODS[qualified])
            names.add(qualified)
        names.update(_swap_forwards(model, MODULE_KERNELS, forwards))
        yield sorted(names)
    finally:
        for module, attribute, original in reversed(swapped):
            setattr(module, attribute, original)
        _put_back(forwards)


@contextlib.contextmanager
def layout_kernels(model: Any) -> Iterator[list[str]]:
    """Inside the ``with``, only the module kernels that change what the cache holds
    (:data:`CACHE_LAYOUT`) are swapped in, as :func:`export_kernels` swaps them.

    An eager run in it keeps the cache the exported program has (MLA: ``[latent | k_pe]`` as
    one key head); every other module, contract and method is transformers' own.

    Args:
        model: A transformers model.

    Yields:
        The sorted names of the forwards swapped (empty for most models).
    """
    forwards: list[tuple[Any, Any]] = []
    pairs = tuple((is_it, f) for is_it, f in MODULE_KERNELS if f in CACHE_LAYOUT)
    try:
        yield sorted(_swap_forwards(model, pairs, forwards))
    finally:
        _put_back(forwards)


def _swap_forwards(
    model: Any,
    pairs: tuple[tuple[Callable[[Any], bool], Callable[..., Any]], ...],
    forwards: list[tuple[Any, Any]],
) -> set[str]:
    """Set the forward of the first pair whose predicate accepts each submodule (appending
    ``(submodule, its own instance forward or None)`` to ``forwards``); the names swapped."""
    names = set()
    for submodule in model.modules():
        forward = next((f for is_it, f in pairs if is_it(submodule)), None)
        if forward is not None:
            forwards.append((submodule, vars(submodule).get("forward")))
            submodule.forward = types.MethodType(forward, submodule)
            names.add(forward.__name__)
    return names


def _put_back(forwards: list[tuple[Any, Any]]) -> None:
    for submodule, own in reversed(forwards):
        del submodule.forward
        if own is not None:
            submodule.forward = own
