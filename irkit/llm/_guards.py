"""Relaxations of ``torch.export`` for a guard on the dynamic dims it cannot prove.

``torch.export`` stops where the model's code makes it guard a dynamic dim with a condition it
cannot show over the whole range and has no narrower range to suggest (ZAYA: ``sequence - 1 !=
1`` from the contiguity check of a ``cat`` then ``view``; Aria: ``sequence·min(64, 64·sequence)
== 64·sequence``, true for every length). ``export_causal_lm`` then retries under each of
:data:`RELAXATIONS` in turn (``_export_narrowing`` in ``irkit/llm/_causal_lm.py``), and keeps a
program exported with the second only where :func:`backed_assertions` finds no runtime
assertion on an input's dims. See ``docs/llm.md`` ("Models without a cache").
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["RELAXATIONS", "backed_assertions", "even_chunks", "holding_ranges"]


@contextlib.contextmanager
def even_chunks() -> Iterator[None]:
    """Inside the ``with``, ``Tensor.chunk(n, dim)`` of a dynamic dim that is provably a multiple
    of ``n`` splits into ``n`` parts of ``size // n`` (``split_with_sizes``); any other ``chunk``
    is torch's own.

    torch's ``chunk`` is ``split(x, ceil(size / n))``, whose part count ``(size + ceil(size / n) -
    1) // ceil(size / n)`` is a Python int: on a dynamic ``size = n·s`` it guards ``(4·s - 1) //
    s == 3`` (ProphetNet's ``chunk(1 + ngram)`` of its ``(1 + ngram)·sequence`` streams), true
    for every ``s ≥ 1`` but beyond torch's solver, which then fixes ``sequence`` to the example's
    length. Where ``size`` is ``n`` times a whole number the two are the same parts, so the
    export's program is the model's for every length.
    """
    import torch
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    chunk = torch.Tensor.chunk

    def even(self: Any, chunks: int, dim: int = 0) -> Any:
        size = self.shape[dim]
        if (
            isinstance(size, torch.SymInt)
            and isinstance(chunks, int)
            and chunks > 0
            and statically_known_true(size % chunks == 0)
        ):
            return torch.split(self, [size // chunks] * chunks, dim)
        return chunk(self, chunks, dim)

    torch.Tensor.chunk = even
    try:
        yield
    finally:
        torch.Tensor.chunk = chunk


@contextlib.contextmanager
def _layout_checks_oblivious() -> Iterator[None]:
    """Inside the ``with``, torch's contiguity check of sizes and strides
    (``torch._prims_common.check_contiguous_sizes_strides``) decides what it cannot prove
    without adding a guard (``backed_size_oblivious`` for that call only).

    torch asks, for every traced tensor's metadata, whether its strides are contiguous, and
    guards on the dynamic sizes where it cannot tell: ``torch.cat([state, v[:, :-1]])`` makes it
    guard ``sequence - 1 != 1`` (ZAYA); likewise where it orders a new tensor's strides
    (:data:`_LAYOUT_CHECKS`). Such a guard is about memory layout only: an ONNX
    tensor has no strides, so no answer of this check changes a value the program computes,
    and the guard only narrows the range the export serves.
    """
    import torch._prims_common as prims
    from torch.fx.experimental import _config

    checks = {name: getattr(prims, name) for name in _LAYOUT_CHECKS}

    def oblivious(check: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            with _config.patch(backed_size_oblivious=True):
                return check(*args, **kwargs)

        return call

    for name, check in checks.items():
        setattr(prims, name, oblivious(check))
    try:
        yield
    finally:
        for name, check in checks.items():
            setattr(prims, name, check)


#: The layout decisions of ``torch._prims_common`` that :func:`_layout_checks_oblivious` makes
#: without guards: whether strides are contiguous (ZAYA), and the order of a new tensor's
#: strides (``empty_like``'s logical-to-physical permutation, which compares the sizes of dims
#: with equal strides: the ``flip`` of an ``unfold(-1, 4, 1)`` over a dynamic sequence guards
#: ``sequence < 4`` — Inkling2's dynamic short convolution).
_LAYOUT_CHECKS = (
    "check_contiguous_sizes_strides",
    "compute_elementwise_output_logical_to_physical_perm",
)


@contextlib.contextmanager
def _sizes_oblivious() -> Iterator[None]:
    """Inside the ``with``, torch decides every size question it cannot prove on the dynamic
    dims as for sizes it knows nothing about (``backed_size_oblivious``): the general case,
    with a runtime assertion where the general case is not the same program.

    Aria's ``view`` back from ``(batch·sequence, hidden)`` and the ``reshape`` of its
    ``matmul`` make torch guard ``sequence·min(64, 64·sequence) == 64·sequence`` (true for
    every length, which its solver cannot show): a view-or-copy decision. A program exported
    so is kept only without a runtime assertion on an input's dims
    (:func:`backed_assertions`), i.e. where the general case assumed nothing.
    """
    from torch.fx.experimental import _config

    with _config.patch(backed_size_oblivious=True):
        yield


#: What ``irkit.llm._causal_lm._export_narrowing`` relaxes, in turn, for a guard torch cannot prove.
RELAXATIONS: tuple[Callable[[], contextlib.AbstractContextManager[None]], ...] = (
    _layout_checks_oblivious,
    _sizes_oblivious,
)


def backed_assertions(program: Any) -> list[str]:
    """The runtime assertions of ``program`` on the sizes of its inputs (backed symbols:
    ``s0``, not the ``u0`` of a data-dependent value), as text."""
    import torch

    checks = (torch.ops.aten._assert_scalar.default, torch.ops.aten.sym_constrain_range.default)
    found = []
    for node in program.graph.nodes:
        if node.op != "call_function" or node.target not in checks or not node.args:
            continue
        value = getattr(node.args[0], "meta", {}).get("val")
        expr = getattr(getattr(value, "node", None), "expr", None)
        symbols = getattr(expr, "free_symbols", ())
        if any(str(symbol).startswith("s") for symbol in symbols):
            found.append(str(expr))
    return found


#: The most values of one size :func:`holding_ranges` evaluates an assertion at.
ENUMERABLE = 1 << 13


def holding_ranges(
    program: Any, example: dict[str, int], same: dict[str, str] | None = None
) -> dict[str, tuple[int, int]] | None:
    """Where the runtime assertions of ``program`` on its input sizes hold, found by trying
    every size.

    ``torch.export`` with ``prefer_deferred_runtime_asserts_over_guards`` leaves a guard it
    cannot prove in the program as an assertion (XLNet's relative positions: ``(2·s - 1) mod s
    != 0``, true for every ``s ≥ 2``). An assertion on one size is a statement about at most
    :data:`ENUMERABLE` integers (the size's range), so it is checked at each: for each size an
    assertion reads, the widest interval of its range around the example's size (``example``:
    symbol name → the traced size) on which every assertion on it holds.

    Args:
        program: The exported program.
        example: The traced value of each size symbol (``s53`` → 7).
        same: Symbols that are one size (two inputs' dims of one ``Dim``, which the deferred
            export keeps apart with an assertion ``Eq(s70, s53)``), each → the one it is read
            as.

    Returns:
        Symbol name → ``(low, high)``, the sizes on which the program holds (every asserted
        symbol); None where an assertion reads several sizes, a range is wider than
        :data:`ENUMERABLE`, or the example's own size fails one.
    """
    import sympy
    import torch

    checks = (torch.ops.aten._assert_scalar.default,)
    by_symbol: dict[Any, list[Any]] = {}
    named = {str(k): k for k in program.range_constraints}
    one = {
        named[k]: named[v] for k, v in (same or {}).items() if k in named and v in named and k != v
    }
    for node in program.graph.nodes:
        if node.op != "call_function" or node.target not in checks or not node.args:
            continue
        value = getattr(node.args[0], "meta", {}).get("val")
        expr = getattr(getattr(value, "node", None), "expr", None)
        if expr is None:
            continue
        expr = expr.xreplace(one)
        if expr is sympy.true:
            continue
        every = list(getattr(expr, "free_symbols", ()))
        symbols = [s for s in every if str(s).startswith("s")]
        if not symbols:
            continue
        if len(every) != 1:
            return None
        by_symbol.setdefault(symbols[0], []).append(expr)
    ranges = {str(k): v for k, v in program.range_constraints.items()}
    found: dict[str, tuple[int, int]] = {}
    for symbol, exprs in by_symbol.items():
        bounds, at = ranges.get(str(symbol)), example.get(str(symbol))
        if bounds is None or at is None:
            return None
        low, high = int(bounds.lower), int(bounds.upper)
        if high - low + 1 > ENUMERABLE:
            return None

        def holds(n: int, exprs: list[Any] = exprs, symbol: Any = symbol) -> bool:
            return all(bool(e.xreplace({symbol: sympy.Integer(n)})) for e in exprs)

        if not holds(at):
            return None
        first = last = at
        while first > low and holds(first - 1):
            first -= 1
        while last < high and holds(last + 1):
            last += 1
        found[str(symbol)] = (first, last)
    return found
