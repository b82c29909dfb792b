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
    input_names: Sequence[str] | None = None,
    output_names: Sequence[str] | None = None,
    verbose: bool = False,
) -> ir.Model:
    """Lower an ``ExportedProgram`` into an ``onnx_ir.Model``, node by node.

    Each ``call_function`` node is lowered by (first match wins) ``custom_lowerings``, irkit's
    own lowerings for the few ops torchlib lacks, or onnxscript's torchlib. Nodes without any
    lowering are decomposed individually with torch's default decomposition table; nodes that
    still have none are reported together in one :class:`~irkit.errors.UnsupportedOpError`
    before anything is emitted. The ExportedProgram is not modified.

    Every ONNX node carries its module scope, FX node name, target and source location as
    metadata (keys in :mod:`irkit.metadata`).

    Args:
        exported_program: The result of ``torch.export.export``.
        opset: Default-domain opset of the model (default :data:`DEFAULT_OPSET`). Values below
            torchlib's 18 are reached by converting the model with onnxscript's converter.
        custom_lowerings: ``{OpOverload: fn}``; ``fn`` receives the ONNX builder ``op`` first,
            then the node's arguments (``ir.Value`` for tensors) and returns the output
            value(s). Wins over every other lowering; works for ``torch.library`` custom ops.
        input_names: Names for the user inputs (default: the names in the program signature).
        output_names: Names for the flattened user outputs (default: the FX output names).
        verbose: Show progress (a bar on a terminal, log lines otherwise).

    Returns:
        A new ``onnx_ir.Model``; initializers wrap the program's tensors without copying.

    Raises:
        UnsupportedOpError: Some ops have no lowering (lists all of them).
        LoweringError: Lowering one node failed (names the node, module and source line).

    Example:
        >>> import torch, irkit
        >>> ep = torch.export.export(torch.nn.Linear(4, 2), (torch.randn(3, 4),))
        >>> model = irkit.lower(ep)
        >>> [n.op_type for n in model.graph]
        ['Gemm']
    """
    from irkit.lowering._lower import lower_program

    return lower_program(
        exported_program,
        opset=opset,
        custom_lowerings=custom_lowerings,
        input_names=input_names,
        output_names=output_names,
        verbose=verbose,
    )
