"""Reading provenance off FX nodes: module scope, source location, and the metadata stamp."""

from __future__ import annotations

import functools
import math
import operator
import re
from collections.abc import Mapping
from typing import Any

import torch

from irkit import metadata

__all__ = [
    "node_location",
    "node_scope",
    "module_path",
    "op_name",
    "resolve_op",
    "python_spelling",
    "target_name",
    "MetadataStamper",
]

_FRAME = re.compile(r'File "([^"]+)", line (\d+)')


@functools.lru_cache(maxsize=4096)
def _innermost_location(stack_trace: str) -> str:
    matches = _FRAME.findall(stack_trace)
    if not matches:
        return ""
    file, line = matches[-1]
    return f"{file}:{line}"


def node_location(node: torch.fx.Node) -> str:
    """``file:line`` of the innermost frame of the node's ``stack_trace`` (``""`` if unknown)."""
    trace = node.meta.get("stack_trace")
    return _innermost_location(trace) if trace else ""


def _qualified(cls: Any) -> str:
    if isinstance(cls, str):
        return cls
    return f"{cls.__module__}.{cls.__qualname__}"


_NO_MODULE = "_empty_nn_module_stack_from_metadata_hook"
"""The placeholder entry torch.export's node-metadata hook gives nodes its passes insert outside
any module call (``torch._export.passes._node_metadata_hook``; e.g. the ``sym_size`` nodes of
deferred runtime asserts): the root, not a module called ``_empty_nn_module_stack…``."""


def node_scope(node: torch.fx.Node) -> tuple[metadata.Frame, ...]:
    """The node's module call chain from ``nn_module_stack``, root module excluded."""
    stack: Mapping[str, tuple[str, Any]] | None = node.meta.get("nn_module_stack")
    if not stack:
        return ()
    frames = []
    for key, (path, cls) in stack.items():
        if not path or key == _NO_MODULE:
            continue  # the root module itself
        _, at, index = key.rpartition("@")
        frames.append(
            metadata.Frame(path, int(index) if at and index.isdigit() else 0, _qualified(cls))
        )
    return tuple(frames)


def module_path(node: torch.fx.Node) -> str:
    """The innermost module call of ``node`` (``"layers.0.attn@1"``), ``""`` for the root."""
    scope = node_scope(node)
    return scope[-1].call_id if scope else ""


def op_name(target: Any) -> str:
    """How errors name an op: its schema name, ``aten::add.Tensor`` (one spelling everywhere)."""
    if isinstance(target, torch._ops.OpOverload):
        return f"{target._schema.name}.{target._overloadname}"
    return getattr(target, "__name__", str(target))


def python_spelling(target: Any) -> str:
    """How a user writes the op in Python, for a fix hint: ``torch.ops.aten.add.Tensor``."""
    if isinstance(target, torch._ops.OpOverload):
        return f"torch.ops.{target}"
    return target_name(target)


def target_name(target: Any) -> str:
    """The ``irkit.fx_target`` metadata value: ``aten.add.Tensor``."""
    if isinstance(target, torch._ops.OpOverload):
        return str(target)
    return (
        f"{getattr(target, '__module__', '') or ''}.{getattr(target, '__name__', target)}".lstrip(
            "."
        )
    )


class MetadataStamper:
    """Computes (and caches) the metadata every ONNX node of one FX node gets."""

    def __init__(self) -> None:
        self._scopes: dict[Any, str] = {}

    def props(self, node: torch.fx.Node) -> dict[str, str]:
        stack = node.meta.get("nn_module_stack")
        key = tuple(stack.items()) if stack else ()
        scope = self._scopes.get(key)
        if scope is None:
            scope = self._scopes[key] = metadata.encode_scope(node_scope(node))
        props = {
            metadata.SCOPE: scope,
            metadata.FX_NODE: node.name,
            metadata.FX_TARGET: target_name(node.target),
        }
        location = node_location(node)
        if location:
            props[metadata.SOURCE] = location
        return props


def resolve_op(qualified_name: str) -> Any:
    """The inverse of :func:`op_name`: ``"aten::add.Tensor"`` → ``torch.ops.aten.add.Tensor``
    (``default`` when no overload is named); ``_operator::mul`` → ``operator.mul``; None if
    nothing is registered under that name."""
    namespace, _, rest = qualified_name.partition("::")
    name, _, overload = rest.partition(".")
    if namespace == "_operator":
        return getattr(operator, name, None)
    if namespace == "math":
        return getattr(math, name, None)
    try:
        packet = getattr(getattr(torch.ops, namespace), name)
        return getattr(packet, overload or "default")
    except (AttributeError, RuntimeError):
        return None
