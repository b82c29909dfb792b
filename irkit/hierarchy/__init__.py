"""Module hierarchy → ONNX local functions (and back).

:func:`outline` recovers the ``nn.Module`` call hierarchy from irkit's scope metadata, turns
each chosen module call into a local function (bottom-up, sharing structurally identical
bodies) and :func:`inline` reverses it. See ``docs/hierarchy.md``. :class:`HierarchyGuard` and
:func:`keeps_weight_transposes` keep a model whose module calls were opened
(:func:`open_module_calls`) fit to be outlined again while the rewrite engine optimizes it.
"""

from __future__ import annotations

from irkit.hierarchy._guard import HierarchyGuard, ScopeIndex, keeps_weight_transposes
from irkit.hierarchy._inline import adopt_unscoped, inline, open_module_calls, reroot_scope
from irkit.hierarchy._outline import CallSignatures, OutlineWarning, outline
from irkit.hierarchy._report import function_tree
from irkit.hierarchy._select import FunctionsOption, ModuleSelector

__all__ = [
    "outline",
    "inline",
    "open_module_calls",
    "adopt_unscoped",
    "reroot_scope",
    "function_tree",
    "ModuleSelector",
    "FunctionsOption",
    "CallSignatures",
    "OutlineWarning",
    "HierarchyGuard",
    "ScopeIndex",
    "keeps_weight_transposes",
]
