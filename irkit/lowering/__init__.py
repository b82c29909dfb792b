"""FX → onnx-ir lowering. The only part of irkit that imports torch (lazily, on first call)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import onnx_ir as ir
    import torch

    from irkit.hierarchy import FunctionsOption

__all__ = ["lower"]


def lower(
    exported_program: torch.export.ExportedProgram,
    *,
    opset: int | None = None,
    functions: FunctionsOption = True,
    max_depth: int | None = None,
    custom_lowerings: Mapping[Any, Callable[..., Any]] | None = None,
    decompose_custom_ops: bool = False,
    input_names: Sequence[str] | None = None,
    output_names: Sequence[str] | None = None,
    verbose: bool = False,
) -> ir.Model:
    """Lower an ``ExportedProgram`` into an ``onnx_ir.Model``, node by node.

    Each ``call_function`` node is lowered by (first match wins) ``custom_lowerings``, irkit's
    own lowerings for the few ops torchlib lacks, or onnxscript's torchlib. Nodes without any
    lowering are decomposed individually, trying every decomposition torch has (its table and
    Python references, ``CompositeImplicitAutograd`` kernels, primitives' aten
    implementations), recursively; nodes that still have none are reported together in one
    :class:`~irkit.errors.UnsupportedOpError` before anything is emitted. Context regions
    (``torch.no_grad()``, ``torch.autocast``) are lowered inline. Wherever torch promotes dtypes
    implicitly, the ONNX graph casts explicitly. The ExportedProgram is not modified.

    Module calls then become ONNX local functions (``functions=``), identical bodies shared.
    Every ONNX node carries its module scope, FX node name, target and source location as
    metadata (keys in :mod:`irkit.metadata`).

    Args:
        exported_program: The result of ``torch.export.export``.
        opset: Default-domain opset of the model (default 23, or the newest opset at which
            onnxruntime runs every emitted op, e.g. 21 for random ops). Values below torchlib's
            18 are reached by converting the model with onnxscript's converter.
        functions: Which module calls become ONNX local functions (see :func:`irkit.outline`):
            ``True`` (default, every call), ``False`` (a flat graph), module classes or class
            names, an :class:`irkit.ModuleSelector` (classes and path globs), or a predicate
            ``(module_path, qualified_class) -> bool``. Identical bodies share one function.
        max_depth: Only outline module calls at most this deep (top-level modules are 1).
        custom_lowerings: ``{OpOverload: fn}``; ``fn`` receives the ONNX builder ``op`` first,
            then the node's arguments (``ir.Value`` for tensors) and returns the output
            value(s). Wins over every other lowering; works for ``torch.library`` custom ops.
        decompose_custom_ops: Lower a ``torch.library.custom_op`` that has no lowering by tracing
            its Python implementation into aten ops (off by default: a custom op usually stands
            for a kernel the runtime should provide, so its absence is reported instead).
        input_names: Names for the tensor user inputs (default: the names in the program
            signature). Python constants the program was specialized on (``use_cache=True``)
            are not inputs of the ONNX model.
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
        >>> class Net(torch.nn.Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.fc = torch.nn.Linear(4, 4)
        ...     def forward(self, x):
        ...         return self.fc(x).relu()
        >>> model = irkit.lower(torch.export.export(Net(), (torch.randn(3, 4),)))
        >>> [(n.domain, n.op_type) for n in model.graph]
        [('torch.nn.modules', 'Linear'), ('', 'Relu')]
    """
    from irkit.lowering._lower import lower_program

    return lower_program(
        exported_program,
        opset=opset,
        functions=functions,
        max_depth=max_depth,
        custom_lowerings=custom_lowerings,
        decompose_custom_ops=decompose_custom_ops,
        input_names=input_names,
        output_names=output_names,
        verbose=verbose,
    )
