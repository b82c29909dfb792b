"""Which decoder layers are interchangeable: the proof behind "trace one layer, stamp it N times".

torch.export's cost grows with the decoder-layer count (~0.5-0.7 s per layer of symbolic-shape
work). When layer ``i`` and layer ``i mod P`` are provably the same computation on different
weights and cache slots, tracing the first ``P`` layers suffices; the others are copies
("stamps") of a representative's call. :func:`layer_period` gives the smallest such ``P``, or
the reason there is none; :func:`cut_layers` is the context manager that presents a model with
its first ``P`` layers to the trace and restores it after.

The proof is generic (no model names): for the real ``N``-layer model, layers ``i`` and
``i mod P`` must have

- the same module class tree and the same parameter and buffer names, shapes and dtypes;
- equal buffer values (a ``meta`` buffer's values are taken from ``buffers`` when given, else
  the layers must hold no buffers: values that cannot be compared refuse);
- equal non-tensor attributes in the whole subtree, except the layer index (an ``int``
  attribute whose value is ``i`` in layer ``i`` for every layer, e.g. ``layer_idx``);

every list-valued config attribute of length ``N`` (``layer_types``, …) must be ``P``-periodic;
and no ``forward`` in the layer subtree may read the layer index other than to pass it on to a
method of one of its own arguments (``past_key_values.update(k, v, self.layer_idx)``): a
``forward`` whose source cannot be read refuses. ``P <= 4`` and ``2 * P <= N``.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import functools
import inspect
import textwrap
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

__all__ = [
    "MAX_PERIOD",
    "LayerPeriod",
    "cut_layers",
    "decoder_layers",
    "layer_period",
    "stamp_layers",
]

#: The largest period tried: hybrids repeat their attention layer every 4 (Qwen3.5, Qwen3-Next),
#: 8 (Jamba, MiniMax) or 10 (Granite-4.0-H) layers; a trace of P of N layers costs ~P/N of all.
MAX_PERIOD = 16
_INTERNAL = frozenset({"_parameters", "_buffers", "_modules", "training"})


@dataclasses.dataclass(frozen=True)
class LayerPeriod:
    """What :func:`layer_period` found.

    Attributes:
        period: ``P``, how many first layers are traced: the smallest with layer ``i`` ≡ layer
            ``i mod P``, else the shortest prefix holding an equal of every later layer; or
            ``None`` (full trace).
        layers: ``N``, the number of decoder layers (0 where no layer list was found).
        path: Module path of the decoder-layer list (e.g. ``model.layers``).
        index_attributes: Relative attribute paths holding the layer index (``self_attn.layer_idx``).
        reason: Why there is no period (empty when there is one).
        sources: Per layer, the traced layer it is stamped from, where not ``i mod P`` (the
            prefix case); empty for a period.
    """

    period: int | None
    layers: int
    path: str
    index_attributes: tuple[str, ...]
    reason: str = ""
    sources: tuple[int, ...] = ()

    def source(self, layer: int) -> int:
        """The traced layer that layer ``layer`` is a stamp of."""
        if self.period is None:
            raise ValueError("no layer period")
        return self.sources[layer] if self.sources else layer % self.period


def _text_config(model: Any) -> Any:
    config = model.config
    getter = getattr(config, "get_text_config", None)
    return getter() if callable(getter) else config


def decoder_layers(model: Any) -> tuple[str, Any] | None:
    """The module path and ``ModuleList`` of ``model``'s decoder layers, or ``None``.

    The list is the one ``torch.nn.ModuleList`` whose length is the text config's
    ``num_hidden_layers`` (none or several: ``None``).
    """
    import torch

    config = _text_config(model)
    count = getattr(config, "num_hidden_layers", None)
    if not isinstance(count, int) or count < 1:
        return None
    found = [
        (name, module)
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.ModuleList) and len(module) == count
    ]
    return found[0] if len(found) == 1 else None


def _attributes(module: Any) -> dict[str, Any]:
    """The non-tensor, non-module attributes of every module of a layer, by relative path."""
    out: dict[str, Any] = {}
    for prefix, sub in module.named_modules():
        for key, value in vars(sub).items():
            if key in _INTERNAL or (key.startswith("_") and "hook" in key):
                continue
            out[f"{prefix}.{key}" if prefix else key] = value
    return out


def _tensors(module: Any) -> dict[str, tuple[str, Any]]:
    out: dict[str, tuple[str, Any]] = {}
    for name, tensor in module.named_parameters(remove_duplicate=False):
        out[name] = ("parameter", tensor)
    for name, tensor in module.named_buffers(remove_duplicate=False):
        out[name] = ("buffer", tensor)
    return out


def _classes(module: Any) -> list[tuple[str, type]]:
    return [(name, type(sub)) for name, sub in module.named_modules()]


def _equal(a: Any, b: Any) -> bool | None:
    """``a == b`` as a bool, ``None`` where it cannot be decided (tensors, odd ``__eq__``)."""
    import torch

    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return None
    if a is b:
        return True
    if isinstance(a, functools.partial) and isinstance(b, functools.partial):
        same = [
            _equal(x, y) for x, y in ((a.func, b.func), (a.args, b.args), (a.keywords, b.keywords))
        ]
        return None if None in same else all(same)
    try:
        result = a == b
    except Exception:
        return None
    return result if isinstance(result, bool) else None


def _index_attributes(attributes: list[dict[str, Any]]) -> set[str]:
    """The attributes that hold the layer index: an ``int`` equal to ``i`` in every layer ``i``
    that has it, held by two layers at least (a hybrid's ``linear_attn.layer_idx`` is on its
    linear-attention layers only; layers ``i`` and ``i mod P`` still hold the same keys, which
    :func:`_same_layer` checks)."""
    keys = {key for attrs in attributes for key in attrs}
    found = set()
    for key in keys:
        holders = [(i, attrs[key]) for i, attrs in enumerate(attributes) if key in attrs]
        if len(holders) >= 2 and all(type(v) is int and v == i for i, v in holders):
            found.add(key)
    return found


def _buffer_value(name: str, tensor: Any, buffers: Mapping[str, Any]) -> Any:
    if getattr(tensor, "is_meta", False):
        return buffers.get(name)
    return tensor


def _same_layer(
    i: int,
    r: int,
    layers: Any,
    prefix: str,
    attributes: list[dict[str, Any]],
    index: set[str],
    buffers: Mapping[str, Any],
) -> str:
    """Why layer ``i`` is not layer ``r`` (empty if it is)."""
    import torch

    if _classes(layers[i]) != _classes(layers[r]):
        return f"layer {i} and layer {r} have different module classes"
    ti, tr = _tensors(layers[i]), _tensors(layers[r])
    if list(ti) != list(tr):
        return f"layer {i} and layer {r} have different parameter/buffer names"
    for name, (kind, a) in ti.items():
        kind_r, b = tr[name]
        if kind != kind_r or a.shape != b.shape or a.dtype != b.dtype:
            return f"{prefix}.{i}.{name} and {prefix}.{r}.{name} differ in kind, shape or dtype"
        if kind == "buffer":
            va = _buffer_value(f"{prefix}.{i}.{name}", a, buffers)
            vb = _buffer_value(f"{prefix}.{r}.{name}", b, buffers)
            if va is None or vb is None:
                return f"buffer {prefix}.{i}.{name} has no value to compare (meta)"
            if not torch.equal(va.detach().cpu(), vb.detach().cpu()):
                return f"buffers {prefix}.{i}.{name} and {prefix}.{r}.{name} differ"
    ai, ar = attributes[i], attributes[r]
    if set(ai) != set(ar):
        return f"layer {i} and layer {r} have different attributes"
    for key, value in ai.items():
        if key in index:
            continue
        same = _equal(value, ar[key])
        if same is None:
            return f"attribute {key} of layer {i} cannot be compared ({type(value).__name__})"
        if not same:
            return f"attribute {key} differs between layer {i} and layer {r}"
    return ""


def _config_lists(config: Any, count: int) -> dict[str, list[Any]]:
    return {
        key: list(value)
        for key, value in vars(config).items()
        if isinstance(value, list | tuple) and len(value) == count
    }


def _periodic(values: list[Any], period: int) -> bool:
    return all(_equal(v, values[i % period]) for i, v in enumerate(values))


class _IndexReads(ast.NodeVisitor):
    """Finds reads of ``….<index attribute>`` other than arguments of a call on a parameter."""

    def __init__(self, names: set[str], params: set[str]) -> None:
        self.names = names
        self.params = params
        self.passed: set[int] = set()
        self.bad: list[str] = []

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if (
            isinstance(func, ast.Attribute)
            and isinstance(func.value, ast.Name)
            and func.value.id in self.params
        ):
            for arg in [*node.args, *(k.value for k in node.keywords)]:
                if self._is_index(arg):
                    self.passed.add(id(arg))
        self.generic_visit(node)

    def _is_index(self, node: ast.AST) -> bool:
        # any ``<expr>.layer_idx`` (``self.self_attn.layer_idx`` too): refusing more is safe
        return isinstance(node, ast.Attribute) and node.attr in self.names

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if self._is_index(node) and id(node) not in self.passed:
            self.bad.append(f"self.{node.attr} (line {node.lineno})")
        self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, str) and node.value in self.names:
            self.bad.append(f"{node.value!r} (line {node.lineno})")


def _forward_reads(cls: type, names: set[str]) -> str:
    """Why ``cls.forward`` may read the layer index (empty if it only passes it to a cache)."""
    forward = getattr(cls, "forward", None)
    try:
        source = textwrap.dedent(inspect.getsource(forward))  # type: ignore[arg-type]
        tree = ast.parse(source)
    except (OSError, TypeError, SyntaxError):
        return f"the source of {cls.__qualname__}.forward cannot be read"
    function = tree.body[0] if tree.body else None
    if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
        return f"{cls.__qualname__}.forward is not a plain function"
    args = function.args
    params = {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]} - {"self"}
    visitor = _IndexReads(names, params)
    visitor.visit(tree)
    if visitor.bad:
        return (
            f"{cls.__qualname__}.forward reads the layer index other than to pass it to a "
            f"cache call: {', '.join(visitor.bad)}"
        )
    return ""


def layer_period(model: Any, buffers: Mapping[str, Any] | None = None) -> LayerPeriod:
    """The smallest ``P`` such that decoder layer ``i`` is layer ``i mod P`` on other weights.

    Args:
        model: A transformers causal LM (on ``meta`` or not); it is only read.
        buffers: Real values of ``meta`` buffers by full name (``irkit.llm._meta``'s buffers).

    Returns:
        A :class:`LayerPeriod`; ``period`` is ``None`` with a ``reason`` where the layers are
        not provably periodic (the caller traces every layer).
    """
    found = decoder_layers(model)
    if found is None:
        return LayerPeriod(None, 0, "", (), "no single ModuleList of num_hidden_layers layers")
    path, layers = found
    count = len(layers)
    buffers = buffers or {}
    attributes = [_attributes(layer) for layer in layers]
    index = _index_attributes(attributes) if count > 1 else set()
    names = {key.rsplit(".", 1)[-1] for key in index}
    classes = {cls for layer in layers for _, cls in _classes(layer)}
    for cls in sorted(classes, key=lambda c: c.__qualname__):
        why = _forward_reads(cls, names)
        if why:
            return LayerPeriod(None, count, path, tuple(sorted(index)), why)
    owner: dict[int, int] = {}
    for i, layer in enumerate(layers):  # (a stamp renames its weights by layer: none shared)
        for name, tensor in layer.named_parameters(remove_duplicate=False):
            if owner.setdefault(id(tensor), i) != i:
                why = f"{path}.{i}.{name} is a parameter of layer {owner[id(tensor)]} too"
                return LayerPeriod(None, count, path, tuple(sorted(index)), why)
    lists = _config_lists(_text_config(model), count)
    reasons = []
    for period in range(1, MAX_PERIOD + 1):
        if 2 * period > count:
            break
        why = next(
            (
                f"config.{k} is not {period}-periodic"
                for k, v in lists.items()
                if not _periodic(v, period)
            ),
            "",
        )
        if not why:
            for i in range(period, count):
                why = _same_layer(i, i % period, layers, path, attributes, index, buffers)
                if why:
                    break
        if not why:
            return LayerPeriod(period, count, path, tuple(sorted(index)))
        reasons.append(f"P={period}: {why}")
    if not reasons:
        reasons.append(f"{count} layer(s): too few to trace fewer")
        return LayerPeriod(None, count, path, tuple(sorted(index)), "; ".join(reasons))
    prefix = _prefix_sources(layers, path, attributes, index, buffers, lists)
    if isinstance(prefix, tuple):
        traced = next(i for i, source in enumerate(prefix) if source != i)
        return LayerPeriod(traced, count, path, tuple(sorted(index)), "", prefix)
    reasons.append(prefix)
    return LayerPeriod(None, count, path, tuple(sorted(index)), "; ".join(reasons))


def _prefix_sources(
    layers: Any,
    path: str,
    attributes: list[dict[str, Any]],
    index: set[str],
    buffers: Mapping[str, Any],
    lists: dict[str, list[Any]],
) -> tuple[int, ...] | str:
    """Without a period: the shortest prefix of ``Q <= N / 2`` layers holding an equal of every
    later layer (LFM2's attention layers at irregular places: conv, conv, attention, then any
    mix of the two), as each layer's source (``i`` itself inside the prefix, the last equal
    layer of the prefix after it); else why not. Equal: :func:`_same_layer`, and the same
    value in every per-layer config list."""
    count = len(layers)
    classes = [_classes(layer) for layer in layers]
    memo: dict[tuple[int, int], bool] = {}

    def equal(i: int, j: int) -> bool:
        if (i, j) not in memo:
            memo[i, j] = (
                classes[i] == classes[j]
                and all(_equal(v[i], v[j]) is True for v in lists.values())
                and not _same_layer(i, j, layers, path, attributes, index, buffers)
            )
        return memo[i, j]

    last = ""
    for prefix in range(1, count // 2 + 1):
        sources = list(range(prefix))
        for i in range(prefix, count):
            j = next((j for j in range(prefix - 1, -1, -1) if equal(i, j)), None)
            if j is None:
                last = f"layer {i} equals none of the first {prefix}"
                break
            sources.append(j)
        else:
            return tuple(sources)
    return f"no prefix of at most {count // 2} layers holds an equal of every later one ({last})"


@contextlib.contextmanager
def cut_layers(model: Any, found: LayerPeriod) -> Iterator[Any]:
    """Present ``model`` with its first ``found.period`` decoder layers; restore it on exit.

    The layer list, ``num_hidden_layers`` and the per-layer config lists (length ``N``) of the
    text config are cut for the ``with`` block and put back after, whatever happens in it.

    Args:
        model: The model :func:`layer_period` proved periodic.
        found: Its :class:`LayerPeriod` (``period`` not ``None``).

    Yields:
        ``model``, cut.
    """
    import torch

    from irkit.errors import LoweringOptionsError

    if found.period is None:
        raise LoweringOptionsError(f"cut_layers: no layer period ({found.reason})")
    parent_path, _, attr = found.path.rpartition(".")
    parent = model.get_submodule(parent_path) if parent_path else model
    full = getattr(parent, attr)
    config = _text_config(model)
    lists = _config_lists(config, found.layers)
    saved = {"num_hidden_layers": config.num_hidden_layers, **lists}
    try:
        parent._modules[attr] = torch.nn.ModuleList(list(full)[: found.period])
        config.num_hidden_layers = found.period
        for key, values in lists.items():
            setattr(config, key, type(values)(values[: found.period]))
        yield model
    finally:
        parent._modules[attr] = full
        for key, value in saved.items():
            setattr(config, key, value)


def _layer_of(name: str, prefix: str, period: int) -> int | None:
    for r in range(period):
        if name.startswith(f"{prefix}.{r}."):
            return r
    return None


def _renamed(name: str, prefix: str, r: int, i: int) -> str:
    return f"{prefix}.{i}." + name[len(f"{prefix}.{r}.") :]


def _formal_name(name: str, part: str, r: int, i: int) -> str:
    """``layers.{r}.x`` → ``layers.{i}.x`` in a function's input name, else ``name.{i}``."""
    old = f"{part}.{r}."
    at = name.find(old)
    if at == 0 or (at > 0 and name[at - 1] == "."):
        return name[:at] + f"{part}.{i}." + name[at + len(old) :]
    return f"{name}.{i}"


def _stamped_weight(rep: Any, name: str, weight: Callable[[str], Any] | None) -> Any:
    """The tensor of stamped initializer ``name``: weightless like its representative's (the
    weights stream by name at save), else ``weight(name)``."""
    from irkit.weights import WeightlessTensor

    if isinstance(rep, WeightlessTensor):
        return WeightlessTensor(rep.dtype, [int(d) for d in rep.shape.numpy()], name=name)
    return weight(name) if weight is not None else None


#: Graph inputs and outputs that are not per layer.
_STEP_INPUTS = frozenset({"input_ids", "attention_mask", "position_ids"})


def _insert_by_format(values: Any, new: Sequence[Any]) -> None:
    """Insert ``new`` cache values into a graph's inputs or outputs, each after the last one
    of its format (kind) there: the order a full trace gives (kind by kind, layer by layer)."""
    from irkit.llm._stamp_graph import cache_name

    for value in sorted(new, key=lambda v: cache_name(v.name)[1:]):  # type: ignore[index]
        fmt = cache_name(value.name)[0]  # type: ignore[index]
        at = max(
            (p for p, v in enumerate(values) if (cache_name(v.name) or ("",))[0] == fmt),
            default=len(values) - 1,  # (a kind no traced layer has: last; the layout check refuses)
        )
        values.insert(at + 1, value)


def stamp_layers(
    model: Any,
    found: LayerPeriod,
    weight: Callable[[str], Any] | None = None,
) -> Any:
    """Stamp the traced first ``P`` decoder layers of a lowered model out to all ``N`` (in place).

    ``model`` is :func:`irkit.lower`'s model of a program :func:`export_causal_lm` traced
    under :func:`cut_layers`: its main graph calls one function (the layer list's parent, e.g.
    ``LlamaModel``) whose body calls the layer functions ``{path}.0`` … ``{path}.{P-1}``. For
    each layer ``i`` from ``P`` on, the call of layer ``r = i mod P`` is cloned (the same
    function) with its own weights (``{path}.{r}.*`` → ``{path}.{i}.*`` initializers, same
    shapes and dtypes), its own cache inputs (``past_key_values.{i}.key``, ``past.{i}.conv``,
    … with the main-graph nodes layer ``r``'s pass through before the call, a ``Pad`` or an
    ``Identity``) and its own outputs, chained on the hidden state; the layer-invariant values
    (mask, rotary cos/sin, sizes) are shared. A layer output other than its hidden state and
    its ``present…`` outputs is read by the main graph's control flow only: the ``If`` that
    chooses every conv layer's held state gets layer ``i``'s outputs too
    (:func:`irkit.llm._stamp_graph.stamp_control_flow`).

    Args:
        model: The lowered ``onnx_ir.Model`` (before optimize).
        found: The model's :class:`LayerPeriod`.
        weight: Gives the tensor of a stamped initializer by name, where the representative's
            has data (a loaded model's weights); a weightless representative (meta) gives
            weightless stamps, streamed by name at save.

    Returns:
        ``model``.

    Raises:
        ExportError: The graph is not of the expected form (the caller traces every layer).
    """
    import onnx_ir as ir

    from irkit.errors import ExportError
    from irkit.llm._stamp_graph import (
        cache_name,
        clone_chain,
        copy_node,
        source_chain,
        stamp_control_flow,
    )

    def refuse(why: str) -> ExportError:
        return ExportError(f"stamp_layers: {why}; trace every layer (layer_reuse=False)")

    period, count = found.period, found.layers
    if period is None:
        raise refuse(f"no layer period ({found.reason})")
    graph = model.graph
    for value in graph.inputs:  # (a cache kind without a name format here: not stamped)
        named = cache_name(value.name)
        if value.name not in _STEP_INPUTS and (named is None or named[1] >= period):
            raise refuse(f"graph input {value.name!r} is not a cache input of a traced layer")
    # the function that calls the layers, and its one call in the main graph
    names = [f"{found.path}.{r}" for r in range(period)]
    owner = None
    for key, function in model.functions.items():
        calls = {node.name: node for node in function if node.name in names}
        if calls:
            owner = key, function, calls
            break
    if owner is None or len(owner[2]) != period:
        raise refuse(f"no function calls the layers {names}")
    key, function, calls = owner
    layer_calls = [calls[n] for n in names]
    callers = [n for n in graph if (n.domain, n.op_type, n.overload) == key]
    if len(callers) != 1:
        raise refuse(f"{key[1]} is called {len(callers)} times in the main graph")
    (caller,) = callers
    last_part = found.path.rsplit(".", 1)[-1]
    # per-layer function inputs: weights of {path}.{r}., or a cache input of layer r (through
    # a chain of main-graph nodes: an Identity copy, the Pad of a conv state)
    per_input: dict[int, tuple[int, Any, Any, list[Any]]] = {}  # position -> r, main, source, chain
    for position, actual in enumerate(caller.inputs):
        if actual is None:
            continue
        r = _layer_of(actual.name or "", found.path, period)
        if r is not None and actual.is_initializer():
            per_input[position] = (r, actual, None, [])
            continue
        source, chain = source_chain(actual)
        named = cache_name(source.name) if source.is_graph_input() else None
        if named is not None:
            per_input[position] = (named[1], actual, source, chain)
    # per-layer function outputs: a present… graph output, or a layer call's value the main
    # graph's control flow reads (the held conv states' If)
    owners = _subgraph_owners(graph)
    per_output: dict[int, tuple[int, bool]] = {}  # position -> r, whether a present output
    flows: dict[int, Any] = {}
    for position, actual in enumerate(caller.outputs):
        named = cache_name(actual.name)
        if named is not None and actual in graph.outputs:
            per_output[position] = (named[1], True)
            continue
        producer = function.outputs[position].producer()
        if producer is None or producer not in layer_calls:
            continue
        readers = [owners.get(id(use.node.graph)) for use in actual.uses()]
        if not readers or actual in graph.outputs or any(n is None for n in readers):
            raise refuse(f"layer output {actual.name!r} is read by the main graph")
        flows.update((id(n), n) for n in readers)
        per_output[position] = (layer_calls.index(producer), False)
    for value in graph.outputs:
        named = cache_name(value.name)
        if value.name != "logits" and (named is None or named[1] >= period):
            raise refuse(f"graph output {value.name!r} is not a cache output of a traced layer")
    formal_in = {id(function.inputs[p]): p for p in per_input}
    formal_out = {id(function.outputs[p]): p for p in per_output}
    # the hidden state: the last layer's one output read after the layers, then backwards the
    # one output of each layer of its type that the next layer reads; any other output of a
    # layer (a layer-invariant value torch computed once, inside the first) is read by layers
    others = [[o for o in call.outputs if id(o) not in formal_out] for call in layer_calls]
    tail = [o for o in others[-1] if any(u.node not in layer_calls for u in o.uses())]
    if len(tail) != 1:
        raise refuse(f"{names[-1]} has {len(tail)} outputs read after the layers")
    hidden_out = [tail[0]]
    for r in range(period - 2, -1, -1):
        found_out = [
            o
            for o in others[r]
            if (o.dtype, o.shape) == (tail[0].dtype, tail[0].shape)
            and any(u.node is layer_calls[r + 1] for u in o.uses())
        ]
        if len(found_out) != 1:
            raise refuse(f"cannot tell the hidden-state output of {names[r]}")
        hidden_out.insert(0, found_out[0])
    for r, outs in enumerate(others):
        for o in outs:
            if o is not hidden_out[r] and any(u.node not in layer_calls for u in o.uses()):
                raise refuse(f"{names[r]}'s output {o.name!r} is read outside the layers")
    hidden_in = []
    for r, call in enumerate(layer_calls):
        out = hidden_out[r]
        match = [
            p
            for p, v in enumerate(call.inputs)
            if v is not None
            and id(v) not in formal_in
            and v.dtype == out.dtype
            and v.shape == out.shape
            and (r == 0 or v is hidden_out[r - 1])
        ]
        if len(match) != 1:
            raise refuse(f"cannot tell the hidden-state input of {call.name}")
        hidden_in.append(match[0])
    for r, call in enumerate(layer_calls):
        for v in call.inputs:
            if v is not None and id(v) in formal_in and per_input[formal_in[id(v)]][0] != r:
                raise refuse(f"{call.name} reads another layer's weights or cache")
    # uses of the last traced layer's hidden state (outside the layers) move to the last stamp
    last = hidden_out[-1]
    tail_uses = [(n, idx) for n, idx in last.uses() if n not in layer_calls]

    new_formal_in: list[Any] = []
    new_actual_in: list[Any] = []
    new_formal_out: list[Any] = []
    new_actual_out: list[Any] = []
    new_inputs: list[Any] = []
    new_presents: list[Any] = []
    main_nodes: list[Any] = []
    body: list[Any] = []
    # per stamped layer: layer r's main-graph values (ids) → layer i's, for the control flow
    substitutions: dict[int, tuple[int, dict[int, Any]]] = {}
    flowing: list[tuple[dict[int, Any], Any, Any]] = []  # (subst, layer r's value, layer i's)
    previous = last
    for i in range(period, count):
        r = found.source(i)
        rep = layer_calls[r]
        subst: dict[int, Any] = {}
        substitutions[i] = (r, subst)
        mapping: dict[int, Any] = {}
        for v in rep.inputs:
            if v is None or id(v) not in formal_in:
                continue
            position = formal_in[id(v)]
            _, actual, source, chain = per_input[position]
            formal = ir.Value(
                name=_formal_name(v.name or "", last_part, r, i),
                shape=v.shape,
                type=v.type,
            )
            if source is None:  # a weight
                name = _renamed(actual.name, found.path, r, i)
                if name in graph.initializers:
                    raise refuse(f"initializer {name!r} exists already")
                value = ir.Value(name=name, shape=actual.shape, type=actual.type)
                value.const_value = _stamped_weight(actual.const_value, name, weight)
                if value.const_value is None:
                    raise refuse(f"no tensor for {name!r}")
                graph.register_initializer(value)
            else:
                fmt, _, suffix = cache_name(source.name)  # type: ignore[misc]
                past = next((x for x in new_inputs if x.name == fmt % i + suffix), None)
                if past is None:
                    past = ir.Value(name=fmt % i + suffix, shape=source.shape, type=source.type)
                    new_inputs.append(past)
                subst[id(source)] = past
                nodes, value = clone_chain(chain, past, i)
                for old, new in zip(chain, nodes, strict=True):
                    subst[id(old.outputs[0])] = new.outputs[0]
                main_nodes.extend(nodes)
            mapping[id(v)] = formal
            new_formal_in.append(formal)
            new_actual_in.append(value)
        inputs = [mapping.get(id(v), v) if v is not None else None for v in rep.inputs]
        inputs[hidden_in[r]] = previous
        clone = copy_node(
            rep,
            inputs,
            len(rep.outputs),
            f"{found.path}.{i}",
            **{
                k: v.replace(f'"{found.path}.{r}"', f'"{found.path}.{i}"')
                for k, v in rep.metadata_props.items()
            },
        )
        for out, rep_out in zip(clone.outputs, rep.outputs, strict=True):
            out.shape, out.type = rep_out.shape, rep_out.type
            if id(rep_out) in formal_out:
                position = formal_out[id(rep_out)]
                old_actual = caller.outputs[position]
                if per_output[position][1]:
                    fmt, _, suffix = cache_name(old_actual.name)  # type: ignore[misc]
                    out.name = fmt % i + suffix
                    actual = ir.Value(name=out.name, shape=out.shape, type=out.type)
                    new_presents.append(actual)
                else:
                    out.name = f"{rep_out.name}.{i}"
                    actual = ir.Value(name=f"{old_actual.name}.{i}", shape=out.shape, type=out.type)
                    flowing.append((subst, old_actual, actual))
                new_formal_out.append(out)
                new_actual_out.append(actual)
            else:
                out.name = f"{rep_out.name}.{i}"
                if rep_out is hidden_out[r]:
                    previous = out
        body.append(clone)
    for node, idx in tail_uses:
        node.replace_input_with(idx, previous)
    function.insert_after(layer_calls[-1], body)
    # the function's signature and its call: the new layers' inputs and outputs after the last
    # traced layer's (the order a full trace gives)
    in_at = max(formal_in.values(), default=-1) + 1
    out_at = max(formal_out.values(), default=-1) + 1
    function.inputs[in_at:in_at] = new_formal_in
    function.outputs[out_at:out_at] = new_formal_out
    call_inputs = list(caller.inputs)
    call_inputs[in_at:in_at] = new_actual_in
    new_call = copy_node(caller, call_inputs, len(caller.outputs) + len(new_actual_out))
    old_outputs = list(caller.outputs)
    outputs = old_outputs[:out_at] + new_actual_out + old_outputs[out_at:]
    for new, old in zip(new_call.outputs, outputs, strict=True):
        new.name, new.shape, new.type = old.name, old.shape, old.type
    graph.insert_after(caller, [*main_nodes, new_call])
    by_id = {id(old): new for old, new in zip(outputs, new_call.outputs, strict=True)}
    for old in old_outputs:
        old.replace_all_uses_with(by_id[id(old)], replace_graph_outputs=True)
    graph.remove(caller, safe=True)
    for subst, old, new in flowing:  # layer r's flowing value (now the new call's) → layer i's
        subst[id(by_id[id(old)])] = by_id[id(new)]
    presents = [by_id[id(v)] for v in new_presents]
    for node in flows.values():
        presents += stamp_control_flow(graph, node, substitutions, refuse)
    # graph inputs and outputs: kind by kind, layer by layer (a full trace's order)
    _insert_by_format(graph.inputs, new_inputs)
    _insert_by_format(graph.outputs, presents)
    graph.sort()
    return model


def _subgraph_owners(graph: Any) -> dict[int, Any]:
    """The id of every subgraph (nested too) under ``graph``'s nodes → its main-graph node."""
    owners: dict[int, Any] = {}
    for node in graph:
        stack = [a.as_graph() for a in node.attributes.values() if a.type.name == "GRAPH"]
        while stack:
            sub = stack.pop()
            owners[id(sub)] = node
            for inner in sub:
                stack.extend(
                    a.as_graph() for a in inner.attributes.values() if a.type.name == "GRAPH"
                )
    return owners
