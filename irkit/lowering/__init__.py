"""FX → onnx-ir lowering. The only part of irkit that imports torch (lazily, on first call)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import onnx_ir as ir
    import torch

__all__ = ["lower"]


def lower(
    exported_program: torch.export.ExportedProgram,
    *,
    opset: int | None = None,
    custom_lowerings: Mapping[Any, Callable[..., Any]] | None = None,
    decompose_custom_ops: bool = False,
    input_names: Sequence[str] | None = None,
    output_names: Sequence[str] | None = None,
    dim_names: Mapping[str, str] | None = None,
    verbose: bool = False,
) -> ir.Model:
    """The lowering stage: an ``ExportedProgram`` into a *flat* ``onnx_ir.Model``, node by node.

    :func:`irkit.lower` is this stage followed by :func:`irkit.outline` (module calls → local
    functions); this function knows nothing of outlining. The model carries everything outlining
    needs in its metadata (module scopes on every node, the module call signatures), so
    ``irkit.outline(irkit.lowering.lower(ep))`` equals ``irkit.lower(ep)``. Arguments, behaviour
    and errors are those of :func:`irkit.lower` without ``functions``/``max_depth``.

    Example:
        >>> import torch, irkit.lowering
        >>> ep = torch.export.export(torch.nn.Linear(4, 2), (torch.randn(3, 4),))
        >>> [n.op_type for n in irkit.lowering.lower(ep).graph]
        ['Gemm']
    """
    from irkit.lowering._lower import lower_program

    return lower_program(
        exported_program,
        opset=opset,
        custom_lowerings=custom_lowerings,
        decompose_custom_ops=decompose_custom_ops,
        input_names=input_names,
        output_names=output_names,
        dim_names=dim_names,
        verbose=verbose,
    )
