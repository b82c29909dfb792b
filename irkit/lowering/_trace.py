"""Tracing one FX node's decomposition into a small FX graph, on the node's own fake inputs."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.utils._pytree as pytree

from irkit.errors import LoweringError
from irkit.lowering._source import node_location, op_name

__all__ = ["trace_decomposition", "ASSUMPTIONS"]

ASSUMPTIONS = "irkit.assumptions"
"""``GraphModule.meta`` key: the conditions on symbolic sizes a traced decomposition branched on
that the program does not guarantee (see :func:`trace_decomposition`)."""


def trace_decomposition(node: torch.fx.Node, fn: Callable[..., Any]) -> torch.fx.GraphModule:
    """Trace ``fn`` (a decomposition of ``node.target``) on the node's fake inputs.

    Guards are suppressed (the user's program must not be specialized), so a decomposition that
    branches on a symbolic size (``if x.size(0) < 16``) silently follows the example's branch.
    Each such condition the program's ranges do not already decide is recorded, as text with
    the inputs the sizes come from, under ``gm.meta[ASSUMPTIONS]``; :func:`irkit.lower` warns.

    Raises:
        LoweringError: The decomposition could not be traced.
    """
    from torch._guards import detect_fake_mode
    from torch.fx.experimental.proxy_tensor import make_fx

    # FX keeps arguments in immutable lists; a decomposition may edit its list arguments.
    args, kwargs = _mutable(node.args), _mutable(node.kwargs)
    flat, spec = pytree.tree_flatten((args, kwargs))
    is_node = [isinstance(a, torch.fx.Node) for a in flat]
    fakes = [a.meta["val"] for a, n in zip(flat, is_node, strict=False) if n]

    def call(*values: Any) -> Any:
        it = iter(values)
        full = [next(it) if n else a for a, n in zip(flat, is_node, strict=False)]
        args, kwargs = pytree.tree_unflatten(full, spec)
        result = fn(*args, **kwargs)
        if result is NotImplemented:
            raise NotImplementedError("the decomposition does not apply to these arguments")
        # A named result (torch.return_types.var_mean) is a plain tuple to the lowering.
        return tuple(result) if isinstance(result, tuple) else result

    # (a factory node reads sizes alone, ``eye(n)``: its result is the program's fake tensor)
    fake_mode = detect_fake_mode(fakes) or detect_fake_mode(
        [v for v in pytree.tree_leaves(node.meta.get("val")) if isinstance(v, torch.Tensor)]
    )
    # The fakes belong to the user's program: tracing must not add guards to (and so
    # specialize) its ShapeEnv — the ExportedProgram is never modified.
    shape_env = getattr(fake_mode, "shape_env", None)
    no_guards = shape_env.suppress_guards() if shape_env is not None else contextlib.nullcontext()
    try:
        if fake_mode is None:
            return make_fx(call, tracing_mode="fake")(*fakes)
        with fake_mode, no_guards, _suppressed_guards(shape_env) as assumed:
            gm = make_fx(call, tracing_mode="real")(*fakes)
        if assumed:
            gm.meta[ASSUMPTIONS] = tuple(dict.fromkeys(assumed))
        return gm
    except Exception as exc:
        raise LoweringError(
            f"could not trace the decomposition of {op_name(node.target)}: {exc}. "
            "Fix: pass a custom_lowerings entry for this op.",
            fx_node=node.name,
            target=op_name(node.target),
            source=node_location(node),
        ) from exc


def _mutable(arg: Any) -> Any:
    if isinstance(arg, dict):
        return {k: _mutable(v) for k, v in arg.items()}
    if isinstance(arg, list):  # FX's immutable_list too
        return [_mutable(a) for a in arg]
    if isinstance(arg, tuple):
        return tuple(_mutable(a) for a in arg)
    return arg


@contextlib.contextmanager
def _suppressed_guards(shape_env: Any) -> Iterator[list[str]]:
    """Collect the guards ``shape_env`` suppresses in the block (as readable text).

    torch.export's ShapeEnv reports each suppressed guard to its ``_log_guard`` method (prefix
    ``"eval [guard suppressed]"``) after static evaluation under the program's ranges failed to
    decide it; the method is wrapped on this instance for the block and restored after.
    """
    found: list[str] = []
    original = getattr(shape_env, "_log_guard", None)
    if original is None:  # (no ShapeEnv, or a torch without the hook: nothing is collected)
        yield found
        return

    def log_guard(prefix: str, guard: Any, *args: Any, **kwargs: Any) -> Any:
        if "suppressed" in prefix:
            found.append(_readable(shape_env, guard))
        return original(prefix, guard, *args, **kwargs)

    shape_env._log_guard = log_guard
    try:
        yield found
    finally:
        del shape_env._log_guard  # the class's method again


def _readable(shape_env: Any, guard: Any) -> str:
    """``s99 < 16 (s99 = pixel_values.size(0))``: the condition and where its symbols come from."""
    text = str(guard)
    sources = getattr(shape_env, "var_to_sources", {})
    names = []
    for symbol in sorted(getattr(guard, "free_symbols", ()), key=str):
        where = sources.get(symbol)
        if where:
            names.append(f"{symbol} = {_source_name(where[0])}")
    return f"{text} ({', '.join(names)})" if names else text


def _source_name(source: Any) -> str:
    name = getattr(source, "name", None)
    name = name() if callable(name) else name if isinstance(name, str) else str(source)
    # L['pixel_values'].size()[0] -> pixel_values.size(0)
    return re.sub(r"L\['([^']+)'\]\.size\(\)\[(\d+)\]", r"\1.size(\2)", name)
