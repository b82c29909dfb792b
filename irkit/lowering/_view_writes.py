"""In-place writes into views of a fresh intermediate, made functional where they are.

``freqs = freq[0]; freqs[..., 1:9:3] = freq[1, ..., 1:9:3]`` (Qwen3.5's M-RoPE) writes through
a view into ``freq``, a tensor the program computed: renaming the write's result (what
:func:`irkit.lower` does for a write into a fresh tensor) would miss ``freq`` and every other
view of it. torch's functionalization retraces the whole program for it (23 s of a 0.8B
model's 27 s lowering). The write has a local functional form instead: the written view's new
value, scattered back up its chain of views into a new ``freq``::

    copy_(slice(select(freq, 0, 0), -1, 1, 9, 3), src)
      ⇒ new = select_scatter(freq, slice_scatter(select(freq, 0, 0), copy(view, src), -1, 1, 9, 3), 0, 0)

and every later read of ``freq``, of a view of it taken before the write, or of the write's
result reads ``new`` (the view taken again from ``new``). Reads before the write keep the old
value. :func:`functionalize_view_writes` does this on a copy of the program's graph where every
view in the chain can be undone (``slice``, ``select``, ``diagonal`` scattered back;
``transpose``, ``t``, ``permute``, ``unsqueeze`` inverted; ``alias``) and the
base is a tensor the program computes (not an input, weight or buffer: those writes must reach
the caller, which torch's functionalization handles); otherwise it returns ``None``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch.fx.node import map_arg

__all__ = ["functionalize_view_writes"]

_aten = torch.ops.aten

#: A view op → how its parent's new value is made from the view's (``(op, args)`` from the
#: parent, the view's new value and the view's arguments after its input): a part of the
#: parent is scattered back into it, a whole-tensor view (a transpose, an unsqueeze) undone.
_SCATTERS: dict[Any, Callable[..., tuple[Any, tuple[Any, ...]]]] = {
    _aten.slice.Tensor: lambda parent, value, *args: (
        _aten.slice_scatter.default,
        (parent, value, *args),
    ),
    _aten.select.int: lambda parent, value, *args: (
        _aten.select_scatter.default,
        (parent, value, *args),
    ),
    _aten.diagonal.default: lambda parent, value, *args: (
        _aten.diagonal_scatter.default,
        (parent, value, *args),
    ),
    _aten.transpose.int: lambda parent, value, d0, d1: (_aten.transpose.int, (value, d0, d1)),
    _aten.t.default: lambda parent, value: (_aten.t.default, (value,)),
    _aten.permute.default: lambda parent, value, dims: (
        _aten.permute.default,
        (value, sorted(range(len(dims)), key=lambda d: dims[d])),
    ),
    _aten.unsqueeze.default: lambda parent, value, dim: (_aten.squeeze.dim, (value, dim)),
    _aten.alias.default: lambda parent, value: (None, (value,)),
}

#: Meta keys a new node takes from the node it stands for (where it came from, which module).
_PROVENANCE = ("stack_trace", "nn_module_stack", "source_fn_stack", "torch_fn", "from_node")


def _is_view(node: Any) -> bool:
    return (
        isinstance(node, torch.fx.Node)
        and node.op == "call_function"
        and isinstance(node.target, torch._ops.OpOverload)
        and bool(getattr(node.target, "is_view", False))
    )


def _view_chain(written: torch.fx.Node) -> tuple[list[torch.fx.Node], torch.fx.Node] | None:
    """The views from ``written`` down to its base (a computed, non-view tensor), or ``None``
    where a view has no scatter inverse or the base is not a tensor the program computes."""
    chain = []
    node = written
    while _is_view(node):
        if node.target not in _SCATTERS or node.kwargs:  # (its arguments by position only)
            return None
        chain.append(node)
        node = node.args[0]
    if not isinstance(node, torch.fx.Node) or node.op != "call_function":
        return None  # an input, weight or buffer: the write must reach the caller
    return chain, node


def _copied_graph(graph: torch.fx.Graph) -> tuple[torch.fx.Graph, dict[torch.fx.Node, Any]]:
    """A copy of ``graph`` with the same node names (the program's signature names them)."""
    copy = torch.fx.Graph()
    copied: dict[torch.fx.Node, Any] = {}
    result = copy.graph_copy(graph, copied, return_output_node=True)
    if result is None:  # (a graph without an output node)
        return copy, copied
    value, output = result
    copied[output] = copy.output(value, type_expr=output.type)
    copied[output].meta = dict(output.meta)
    return copy, copied


class _Rewriter:
    """Makes one graph's view writes functional, in graph order (see the module docstring)."""

    def __init__(self, graph: torch.fx.Graph, fake_mode: Any):
        self.graph = graph
        self.fake_mode = fake_mode

    def _node(
        self,
        target: Any,
        args: tuple[Any, ...],
        like: torch.fx.Node,
        module_of: torch.fx.Node,
        kwargs: dict[str, Any] | None = None,
    ) -> torch.fx.Node:
        node = self.graph.call_function(target, args, dict(kwargs or {}))
        values = map_arg(args, lambda n: n.meta["val"])
        keywords = map_arg(dict(kwargs or {}), lambda n: n.meta["val"])
        with self.fake_mode:
            node.meta["val"] = target(*values, **keywords)
        for key in _PROVENANCE:
            if key in like.meta:
                node.meta[key] = like.meta[key]
        if "nn_module_stack" in module_of.meta:
            node.meta["nn_module_stack"] = module_of.meta["nn_module_stack"]
        return node

    def write(self, node: torch.fx.Node, functional: Any) -> bool:
        found = _view_chain(node.args[0])
        if found is None:
            return False
        chain, base = found
        order = {n: i for i, n in enumerate(self.graph.nodes)}
        with self.graph.inserting_before(node.next):  # (in order, after the write)
            value = self._node(functional, tuple(node.args), node, node, dict(node.kwargs))
            for view in chain:  # the written view's new value, scattered into its parent
                target, args = _SCATTERS[view.target](view.args[0], value, *view.args[1:])
                if target is not None:
                    value = self._node(target, args, node, node)
            new_base = value
        # stale: the base and its views taken before the write (the write's result is the view)
        stale: dict[torch.fx.Node, torch.fx.Node | None] = {base: new_base, node: None}
        pending = [base]
        while pending:
            for user in pending.pop().users:
                if _is_view(user) and order.get(user, len(order)) < order[node]:
                    stale.setdefault(user, None)
                    pending.append(user)
        self._refresh_later_reads(node, new_base, stale, chain)
        node.replace_all_uses_with(node.args[0])  # (none left: the reads were refreshed)
        self.graph.erase_node(node)
        return True

    def _refresh_later_reads(
        self,
        node: torch.fx.Node,
        new_base: torch.fx.Node,
        stale: dict[torch.fx.Node, torch.fx.Node | None],
        chain: list[torch.fx.Node],
    ) -> None:
        """Every read after ``new_base`` of a stale value reads its value taken from
        ``new_base`` (views taken again right before their first later reader)."""
        written = chain[0] if chain else None

        def fresh(value: torch.fx.Node, reader: torch.fx.Node) -> torch.fx.Node:
            if value is node:  # the write's result: the written view, taken again
                return new_base if written is None else fresh(written, reader)
            known = stale[value]
            if known is None:
                with self.graph.inserting_before(reader):
                    parent = fresh(value.args[0], reader)
                    known = self._node(
                        value.target, (parent, *value.args[1:]), value, reader, dict(value.kwargs)
                    )
                known.meta.update(
                    {k: v for k, v in value.meta.items() if k not in known.meta and k != "val"}
                )
                stale[value] = known
            return known

        later = False
        for reader in list(self.graph.nodes):
            if reader is new_base:
                later = True
                continue
            if not later or reader in stale.values():
                continue
            reads = [a for a in reader.all_input_nodes if a in stale]
            for value in reads:
                reader.replace_input_with(value, fresh(value, reader))


def _renamed_outputs(signature: Any, graph: torch.fx.Graph) -> Any:
    """``signature`` with each output named after the node the rewritten ``graph`` returns there
    (an output that read a written tensor now reads its new value)."""
    from torch.export.graph_signature import ExportGraphSignature, TensorArgument

    output = next(n for n in reversed(graph.nodes) if n.op == "output")
    returned = output.args[0] if isinstance(output.args[0], list | tuple) else [output.args[0]]
    specs = list(signature.output_specs)
    if len(returned) != len(specs):
        return signature
    renamed = [
        dataclasses.replace(spec, arg=TensorArgument(name=node.name))
        if isinstance(spec.arg, TensorArgument)
        and isinstance(node, torch.fx.Node)
        and node.name != spec.arg.name
        else spec
        for spec, node in zip(specs, returned, strict=True)
    ]
    return ExportGraphSignature(input_specs=list(signature.input_specs), output_specs=renamed)


def functionalize_view_writes(
    program: torch.export.ExportedProgram, writes: Mapping[torch.fx.Node, Any]
) -> torch.export.ExportedProgram | None:
    """A new program whose in-place ``writes`` (node → its functional op) are functional.

    Args:
        program: The exported program; not modified.
        writes: Its in-place nodes that write into a view of a tensor it computes (or into a
            tensor that a view shares), each with its functional counterpart (``copy_`` →
            ``copy``).

    Returns:
        The new program (same inputs, outputs and node names), or ``None`` where a write is not
        of that form (a view without a scatter inverse, a write into an input): then torch's
        functionalization is what remains.
    """
    from torch._guards import detect_fake_mode

    fake_mode = detect_fake_mode(
        [n.meta.get("val") for n in program.graph.nodes if n.op == "placeholder"]
    )
    if fake_mode is None:
        return None
    graph, copied = _copied_graph(program.graph)
    if any(copied[n].name != n.name for n in program.graph.nodes):
        return None
    rewriter = _Rewriter(graph, fake_mode)
    for node in program.graph.nodes:  # (graph order: a later write reads the earlier's result)
        if node in writes and not rewriter.write(copied[node], writes[node]):
            return None
    graph.lint()
    return torch.export.ExportedProgram(
        root=program.graph_module,
        graph=graph,
        graph_signature=_renamed_outputs(program.graph_signature, graph),
        state_dict=program.state_dict,
        range_constraints=program.range_constraints,
        module_call_graph=program.module_call_graph,
        example_inputs=None,
        constants=program.constants,
        verifiers=[program.verifier],
    )
