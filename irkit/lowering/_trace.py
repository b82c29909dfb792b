"""Tracing one FX node's decomposition into a small FX graph, on the node's own fake inputs."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
import torch.utils._pytree as pytree

from irkit.errors import LoweringError
from irkit.lowering._source import node_location, op_name

__all__ = ["trace_decomposition"]


def trace_decomposition(node: torch.fx.Node, fn: Callable[..., Any]) -> torch.fx.GraphModule:
    """Trace ``fn`` (a decomposition of ``node.target``) on the node's fake inputs.

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

    fake_mode = detect_fake_mode(fakes)
    # The fakes belong to the user's program: tracing must not add guards to (and so
    # specialize) its ShapeEnv — the ExportedProgram is never modified.
    shape_env = getattr(fake_mode, "shape_env", None)
    no_guards = shape_env.suppress_guards() if shape_env is not None else contextlib.nullcontext()
    try:
        if fake_mode is None:
            return make_fx(call, tracing_mode="fake")(*fakes)
        with fake_mode, no_guards:
            return make_fx(call, tracing_mode="real")(*fakes)
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
