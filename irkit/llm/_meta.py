"""Causal LMs whose weights are on the ``meta`` device: build one, run it for its shapes.

:func:`meta_causal_lm` builds a transformers model from its config with every parameter on
the ``meta`` device (no memory, no initialization) while the buffers its ``__init__`` computes
(rotary ``inv_freq``, …) are real; :func:`probe_mode` lets a model with ``meta`` weights run
eagerly for its output shapes (what :func:`irkit.llm.cache_layout` reads).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

__all__ = [
    "MetaModel",
    "checkpoint_names",
    "fake_weights",
    "meta_causal_lm",
    "probe_mode",
    "stacked_weights",
]


def _has_meta_tensors(model: Any) -> bool:
    return any(t.device.type == "meta" for t in (*model.parameters(), *model.buffers()))


def _module_state(model: Any) -> list[tuple[Any, dict[str, Any], list[Any]]]:
    """Each module with a copy of its attributes and of its parameter/buffer/child tables."""
    state = []
    for module in model.modules():
        attributes = dict(module.__dict__)
        tables = [
            (table, table.copy())
            for table in (
                module._parameters,
                module._buffers,
                module._modules,
                module._non_persistent_buffers_set,
            )
        ]
        state.append((module, attributes, tables))
    return state


def _restore_module_state(state: list[tuple[Any, dict[str, Any], list[Any]]]) -> None:
    for module, attributes, tables in state:
        module.__dict__.clear()
        module.__dict__.update(attributes)
        for table, saved in tables:
            table.clear()
            table.update(saved)


@contextlib.contextmanager
def fake_weights(model: Any) -> Iterator[Any]:
    """Inside, the model's ``meta`` tensors are weightless fake tensors on the CPU.

    A model whose parameters are on ``meta`` runs, and exports, as if it were on the CPU: each
    ``meta`` parameter and buffer is replaced by a ``FakeTensor`` of the same shape, dtype and
    strides on ``cpu`` (no storage: memory stays flat), all of one ``FakeTensorMode``. What
    ``forward`` creates from Python data then lands on the CPU with its values: the index
    tensors of list indexing, ``torch.tensor(factors, device=x.device)``, … — which
    ``torch.export`` lifts as constants of the program (on ``meta`` they would have no values).
    On exit the model is as it was: its parameters, buffers and every attribute ``forward``
    set or replaced (a lazily cached tensor, a re-registered buffer) are restored.

    For a model without ``meta`` tensors the model is left alone and ``None`` is yielded.

    Args:
        model: A ``torch.nn.Module``.

    Yields:
        The ``FakeTensorMode`` of the stand-ins (not entered: enter it to run the model on real
        inputs, see :func:`probe_mode`), or ``None``.
    """
    if not _has_meta_tensors(model):
        yield None
        return
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    mode = FakeTensorMode(allow_non_fake_inputs=True, shape_env=ShapeEnv())
    state = _module_state(model)
    stand_ins: dict[int, Any] = {}  # tied weights stay tied

    def stand_in(tensor: Any) -> Any:
        if id(tensor) not in stand_ins:
            with mode:
                fake = torch.empty_strided(
                    tuple(tensor.shape), tuple(tensor.stride()), dtype=tensor.dtype, device="cpu"
                )
            if isinstance(tensor, torch.nn.Parameter):
                fake = torch.nn.Parameter(fake, requires_grad=tensor.requires_grad)
            stand_ins[id(tensor)] = fake
        return stand_ins[id(tensor)]

    try:
        for module in model.modules():
            for table in (module._parameters, module._buffers):
                for name, tensor in list(table.items()):
                    if tensor is not None and tensor.device.type == "meta":
                        table[name] = stand_in(tensor)
        yield mode
    finally:
        _restore_module_state(state)


@contextlib.contextmanager
def probe_mode(model: Any) -> Iterator[None]:
    """A context in which ``model`` runs for shapes only when its weights are on ``meta``.

    The ``meta`` tensors are swapped for fake CPU tensors (:func:`fake_weights`) and their
    ``FakeTensorMode`` is entered, so the eager run on real inputs gives the output shapes
    (fake tensors) without data: transformers reads tensor values on the way
    (``padding_mask.all()`` in the causal-mask code), which fake tensors allow and ``meta`` ones
    do not. On exit the model is as it was (what ``forward`` cached on it is dropped). For a
    model with real weights this is a no-op context.

    Args:
        model: A ``torch.nn.Module``.

    Yields:
        Nothing.
    """
    with fake_weights(model) as mode:
        if mode is None:
            yield
        else:
            with mode:
                yield


@contextlib.contextmanager
def _parameters_on_meta() -> Iterator[None]:
    """Every parameter registered inside is moved to ``meta`` as it is registered.

    ``torch.nn.Linear`` & co. create their weights with ``torch.empty`` (untouched memory) and
    initialize them after registering them: on ``meta`` the initialization does nothing.
    Buffers are left alone, so the values ``__init__`` computes for them are real. The patch of
    ``torch.nn.Module.register_parameter`` lasts for the ``with`` block only.
    """
    import torch

    original = torch.nn.Module.register_parameter

    def register(module: Any, name: str, param: Any) -> None:
        original(module, name, param)
        if param is not None and param.device.type != "meta":
            module._parameters[name] = torch.nn.Parameter(
                param.to("meta"), requires_grad=param.requires_grad
            )

    torch.nn.Module.register_parameter = register
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = original


class MetaModel:
    """What :func:`meta_causal_lm` returns.

    Attributes:
        model: The transformers model in eval mode, parameters and buffers on ``meta``.
        buffers: The real values of its buffers by fully qualified name (the non-persistent
            ones, e.g. rotary ``inv_freq``, are in no checkpoint: pass them to
            :func:`irkit.save` after the checkpoint folder).
    """

    def __init__(self, model: Any, buffers: dict[str, Any]) -> None:
        self.model = model
        self.buffers = buffers


def meta_causal_lm(config: Any, *, dtype: Any, trust_remote_code: bool = False) -> MetaModel:
    """``AutoModelForCausalLM.from_config(config)`` with no weight in memory.

    Parameters are created on ``meta``; buffers are computed for real by the model's
    ``__init__`` (and transformers' weight init), kept in :attr:`MetaModel.buffers`, then moved
    to ``meta`` too, so the whole model exports as one weightless program.

    Args:
        config: A transformers ``PretrainedConfig``.
        dtype: The ``torch.dtype`` of the parameters (``torch.float32``, …).
        trust_remote_code: Passed to ``from_config``.

    Returns:
        The :class:`MetaModel`.
    """
    from transformers import AutoModelForCausalLM

    declared = _declared_causal_lm(config)
    with _parameters_on_meta():
        if declared is not None:
            model = declared._from_config(config, dtype=dtype)
        else:
            model = AutoModelForCausalLM.from_config(
                config, dtype=dtype, trust_remote_code=trust_remote_code
            )
    model.eval()
    if getattr(model, "_can_set_experts_implementation", lambda: False)():
        # grouped_mm's meta kernel takes bfloat16 only; batched_mm is the same sum of products
        model.set_experts_implementation("batched_mm")
    buffers = {}
    for name, buffer in list(model.named_buffers()):
        buffers[name] = buffer.detach().clone()
        owner, _, leaf = name.rpartition(".")
        model.get_submodule(owner)._buffers[leaf] = buffer.to("meta")
    return MetaModel(model, buffers)


def _declared_causal_lm(config: Any) -> Any:
    """The causal-LM class a text sub-config's ``architectures`` names, where
    ``AutoModelForCausalLM`` maps only the composite config (``MllamaForCausalLM`` saves a
    ``MllamaTextConfig``, ``Emu3ForCausalLM`` an ``Emu3TextConfig``), else None.

    The class must be one transformers maps as a causal LM and declare this config class.
    """
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    if getattr(config, "model_type", None) in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        return None  # the auto class maps it
    causal = set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values())
    for name in getattr(config, "architectures", None) or ():
        cls = getattr(transformers, name, None) if name in causal else None
        if cls is not None and getattr(cls, "config_class", None) is type(config):
            return cls
    return None


def checkpoint_names(model: Any, keys: Iterable[str]) -> dict[str, str]:
    """The model's names of checkpoint keys that transformers renames on load.

    ``save_pretrained`` writes some weights under their original checkpoint names (e.g.
    GPT-NeoX's ``embed_out.weight`` for the model's ``lm_head.weight``), and
    ``from_pretrained`` renames them with the model's registered ``WeightRenaming`` transforms
    (``transformers.conversion_mapping``). The same renamings are applied here to ``keys``, so
    :func:`irkit.save` can find each weight under the model's name (its ``rename=``). Converters
    that merge or split tensors are not renamings and are left out; a transformers without
    conversion mappings gives ``{}``.

    Args:
        model: The transformers model.
        keys: The checkpoint's tensor names.

    Returns:
        ``{model name: checkpoint key}`` for the keys whose name changes.
    """
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightRenaming, apply_renamings
    except ImportError:  # older transformers: checkpoint keys are the model's names
        return {}
    renamings = [t for t in get_model_conversion_mapping(model) if isinstance(t, WeightRenaming)]
    names = {}
    for key in keys:
        name = apply_renamings(key, renamings)
        if name != key:
            names[name] = key
    return names


def _stack_and_concat(operations: list[Any]) -> tuple[int, int | None] | None:
    """``(stack dim, concat dim or None)`` for [MergeModulelist(d)] or [.., Concatenate(d)]."""
    names = [type(op).__name__ for op in operations]
    dims = [op.dim for op in operations if isinstance(getattr(op, "dim", None), int)]
    if len(dims) != len(operations):
        return None
    if names == ["MergeModulelist"]:
        return dims[0], None
    if names == ["MergeModulelist", "Concatenate"]:
        return dims[0], dims[1]
    return None


def stacked_weights(model: Any, hf_model: Any, shapes: Mapping[str, tuple[int, ...]]) -> int:
    """Weights transformers stacks on load, as recipes over the checkpoint's tensors (in place).

    ``save_pretrained`` writes a mixture-of-experts layer's weights one tensor per expert
    (``mlp.experts.{e}.gate_proj.weight``, ...) while the model holds them stacked
    (``mlp.experts.gate_up_proj``: the experts stacked, gate and up concatenated); the model's
    ``WeightConverter`` transforms say how. Each converter made of ``MergeModulelist`` (stack)
    and ``Concatenate`` becomes a :class:`irkit.weights.DerivedTensor` on the weightless
    initializer of that name, which :func:`irkit.save` computes while streaming, one tensor at
    a time. Other converters are left alone (``irkit.save`` then names the missing weight).

    Args:
        model: The lowered ``onnx_ir.Model`` (weightless initializers).
        hf_model: The transformers model it was exported from.
        shapes: The checkpoint's tensor shapes by key.

    Returns:
        The number of initializers given a recipe.
    """
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightConverter, WeightRenaming, apply_renamings
    except ImportError:  # older transformers: no stacked experts
        return 0
    from irkit.weights import DerivedTensor, Leaf, concat, is_weightless, reshape

    transforms = get_model_conversion_mapping(hf_model)
    renamings = [t for t in transforms if isinstance(t, WeightRenaming)]
    converters = [t for t in transforms if isinstance(t, WeightConverter)]
    # target name -> (converter, {pattern index: {expert: checkpoint key}})
    groups: dict[str, tuple[Any, dict[int, dict[int, str]]]] = {}
    for key in shapes:
        renamed = apply_renamings(key, renamings)
        for converter in converters:
            target, pattern = converter.rename_source_key(renamed)
            if pattern is None:
                continue
            index = converter.source_patterns.index(pattern)
            original = converter._original_source_patterns[index]
            expert = re.search(re.escape(original).replace(r"\*", r"(\d+)"), renamed)
            if expert is None or expert.lastindex is None:  # (a pattern without an expert index)
                break
            parts = groups.setdefault(target, (converter, {}))[1]
            parts.setdefault(index, {})[int(expert.group(1))] = key
            break
    initializers = model.graph.initializers
    done = 0
    for target, (converter, parts) in groups.items():
        value = initializers.get(target)
        plan = _stack_and_concat(list(converter.operations))
        if value is None or plan is None or not is_weightless(value.const_value):
            continue
        stack_dim, concat_dim = plan
        dtype = value.const_value.dtype
        stacked = []
        for index in sorted(parts):
            experts = parts[index]
            leaves = []
            for e in sorted(experts):
                shape = tuple(shapes[experts[e]])
                leaf = DerivedTensor(Leaf(experts[e], dtype, shape))
                leaves.append(reshape(leaf, [*shape[:stack_dim], 1, *shape[stack_dim:]]))
            stacked.append(concat(leaves, stack_dim))
        tensor = stacked[0] if concat_dim is None else concat(stacked, concat_dim)
        if tuple(tensor.shape) != tuple(value.const_value.shape):
            continue
        value.const_value = DerivedTensor(tensor.recipe, name=target)  # type: ignore[attr-defined]
        done += 1
    return done + _split_weights(model, converters, renamings, shapes)


def _split_weights(
    model: Any, converters: list[Any], renamings: list[Any], shapes: Mapping[str, tuple[int, ...]]
) -> int:
    """Weights transformers splits on load (a fused ``query_key_value`` → ``q_proj``, ``k_proj``,
    ``v_proj``: a converter of one ``Split``, or of one ``Chunk`` into equal parts), as slices of
    the checkpoint's tensor; each part is as wide as the model's parameter, as ``Split`` itself
    sizes them."""
    from transformers.core_model_loading import apply_renamings

    from irkit.weights import DerivedTensor, Leaf, is_weightless, narrow

    initializers = model.graph.initializers
    done = 0
    for converter in converters:
        operations = list(converter.operations)
        kind = [type(op).__name__ for op in operations]
        if kind not in (["Split"], ["Chunk"]) or len(converter.source_patterns) != 1:
            continue
        if not isinstance(operations[0].dim, int):
            continue
        if getattr(operations[0], "num_shards_attribute", None) is not None:
            continue  # (chunks counted from the config: not a fixed list of targets)
        source, axis = converter.source_patterns[0], operations[0].dim
        for key, shape in shapes.items():
            renamed = apply_renamings(key, renamings)
            if re.search(source, renamed) is None:
                continue
            targets = [re.sub(source, target, renamed) for target in converter.target_patterns]
            values = [initializers.get(target) for target in targets]
            if any(v is None or not is_weightless(v.const_value) for v in values):
                continue
            sizes = [int(v.const_value.shape[axis]) for v in values]
            if sum(sizes) != shape[axis] or (kind == ["Chunk"] and len(set(sizes)) != 1):
                continue
            leaf = DerivedTensor(Leaf(key, values[0].const_value.dtype, tuple(shape)))
            start = 0
            for value, target, size in zip(values, targets, sizes, strict=True):
                part = narrow(leaf, axis, start, size)
                value.const_value = DerivedTensor(part.recipe, name=target)  # type: ignore[attr-defined]
                start += size
                done += 1
    return done
