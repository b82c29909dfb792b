"""Cache kinds of a model that carries its own state list, stacked over layers (RWKV).

transformers' RWKV takes no ``Cache``: its ``forward`` takes ``state``, a list of five tensors
of shape ``(batch, hidden, layers)``, and returns it updated (``RwkvCausalLMOutput.state``).
Each position of the list is one :class:`~irkit.llm._states.StateKind` here, carried per layer
like the typed cache kinds (``N`` the layer, the last axis of the list's tensors):

=========  ======================  =======================  ============  ===============
position   input                   output                   shape         what
=========  ======================  =======================  ============  ===============
0          ``past.N.ffn_shift``    ``present.N.ffn_shift``  (batch, C)    the feed-forward's last input (token shift)
1          ``past.N.att_shift``    ``present.N.att_shift``  (batch, C)    the time mix's last input (token shift)
2          ``past.N.wkv_num``      ``present.N.wkv_num``    (batch, C)    the WKV numerator, float32
3          ``past.N.wkv_den``      ``present.N.wkv_den``    (batch, C)    the WKV denominator, float32
4          ``past.N.wkv_max``      ``present.N.wkv_max``    (batch, C)    the WKV exponent, float32
=========  ======================  =======================  ============  ===============

Every state is an input from the first call on, zeros before the first token (what
``generate_greedy`` feeds). transformers starts a fresh state at zeros too, but for the WKV
exponent at ``-1e30``: a zero numerator and denominator are the same empty sum at any exponent,
and the exponent only decides the rounding, so where the denominator is 0 (no token seen: after
any token it is at least ``exp(0)``) the exported model reads the exponent as ``-1e30`` and
computes exactly what transformers computes. onnxruntime-genai 0.18 has no such kinds: ``irkit
export`` refuses the model before tracing.

The model reads no attention mask (transformers' RWKV ignores it): pads are tokens to it, in
transformers and in the exported model alike.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any, ClassVar

from irkit.errors import ExportError
from irkit.llm._states import StateKind, StateSpec

__all__ = [
    "STACKED_KINDS",
    "STATE_ARGUMENT",
    "stacked_states",
    "stacked_list",
    "read_stacked",
    "flat_stacked_model",
]

STATE_ARGUMENT = "state"
"""The forward parameter, and output field, of the state list."""


class _Slot:
    """One layer's view of a state list (what a :class:`_Stacked` kind reads)."""

    def __init__(self, tensors: Sequence[Any], layer: int) -> None:
        self.tensors, self.layer = tensors, layer


class _Stacked(StateKind):
    """A position of the state list, one ``(batch, …)`` slice per layer (the last axis)."""

    position: ClassVar[int]
    genai_input = ""  # (onnxruntime-genai 0.18 has no such input: refused)
    genai_output = ""

    def read(self, layer: Any, index: int = 0) -> Any:
        if not isinstance(layer, _Slot):
            return None
        return layer.tensors[self.position][..., layer.layer]

    def count(self, layer: Any) -> int:
        return int(isinstance(layer, _Slot))

    def to_model(self, tensor: Any, stacked: Sequence[Any]) -> Any:
        """The stacked tensor as the model reads it (``stacked``: every position's)."""
        return tensor


class _FfnShift(_Stacked):
    name, position = "ffn_shift", 0
    past_format, present_format = "past.%d.ffn_shift", "present.%d.ffn_shift"


class _AttShift(_Stacked):
    name, position = "att_shift", 1
    past_format, present_format = "past.%d.att_shift", "present.%d.att_shift"


class _WkvNum(_Stacked):
    name, position = "wkv_num", 2
    past_format, present_format = "past.%d.wkv_num", "present.%d.wkv_num"


class _WkvDen(_Stacked):
    name, position = "wkv_den", 3
    past_format, present_format = "past.%d.wkv_den", "present.%d.wkv_den"


class _WkvMax(_Stacked):
    name, position = "wkv_max", 4
    past_format, present_format = "past.%d.wkv_max", "present.%d.wkv_max"
    #: The exponent transformers gives a fresh state (``RwkvModel.forward``: zeros − 1e30).
    start = -1e30

    def to_model(self, tensor: Any, stacked: Sequence[Any]) -> Any:
        import torch

        empty = stacked[_WkvDen.position] == 0  # no token seen (module docstring)
        return torch.where(empty, torch.full_like(tensor, self.start), tensor)


#: The kinds, by their position in the state list (the ONNX order: one kind after another).
STACKED_KINDS: tuple[_Stacked, ...] = (_FfnShift(), _AttShift(), _WkvNum(), _WkvDen(), _WkvMax())


def _takes_state_list(model: Any) -> bool:
    params = inspect.signature(model.forward).parameters
    return STATE_ARGUMENT in params and "input_ids" in params


def stacked_states(model: Any) -> tuple[StateSpec, ...]:
    """The state list of ``model`` as specs per kind and layer, or ``()`` for a model without one.

    The model runs once on a two-token prompt (``use_cache=True``, no state: it makes its own)
    and the returned ``state`` is read.

    Args:
        model: A transformers causal LM.

    Returns:
        The specs in the ONNX order (every layer's ``ffn_shift``, then ``att_shift``, …).

    Raises:
        ExportError: The model takes a ``state`` but returns no list of the five
            ``(batch, hidden, layers)`` tensors of the layout above.
    """
    if not _takes_state_list(model):
        return ()
    import torch

    from irkit.llm._meta import probe_mode

    with torch.no_grad(), probe_mode(model):
        device = next(iter(model.parameters())).device
        ids = torch.ones((1, 2), dtype=torch.long, device=device)
        output = model(input_ids=ids, use_cache=True)
    state = output.get(STATE_ARGUMENT) if hasattr(output, "get") else None
    state = state if isinstance(state, (list, tuple)) else []
    shapes = [tuple(getattr(t, "shape", ())) for t in state]
    layers = {shape[-1] for shape in shapes if len(shape) == 3}
    if len(shapes) != len(STACKED_KINDS) or len(layers) != 1 or any(len(s) != 3 for s in shapes):
        raise ExportError(
            f"export_causal_lm: {type(model).__name__} takes a {STATE_ARGUMENT!r} and returns "
            f"{STATE_ARGUMENT!r} of shapes {shapes}; irkit reads a state list "
            f"of {len(STACKED_KINDS)} (batch, hidden, layers) tensors (RWKV's: "
            f"{', '.join(k.name for k in STACKED_KINDS)}; irkit/llm/_stacked_states.py). "
            "Remedy: none for this model in irkit yet; run it in PyTorch"
        )
    return tuple(
        StateSpec(kind, layer, tuple(int(n) for n in tensor.shape[1:-1]), tensor.dtype)
        for kind, tensor in zip(STACKED_KINDS, state, strict=True)
        for layer in range(int(tensor.shape[-1]))
    )


def stacked_list(specs: Sequence[StateSpec], tensors: Sequence[Any]) -> list[Any]:
    """The model's state list from the per-layer tensors (ONNX layout) of ``specs``.

    Args:
        specs: What each tensor is (from :func:`stacked_states`).
        tensors: The tensors, in the order of ``specs``.

    Returns:
        The list, each position ``(batch, …, layers)``, as the model reads it (new tensors:
        the model writes into them).
    """
    import torch

    by_kind: dict[int, list[tuple[int, Any]]] = {}
    for spec, tensor in zip(specs, tensors, strict=True):
        by_kind.setdefault(spec.kind.position, []).append((spec.layer, tensor))  # type: ignore[attr-defined]
    stacked = [
        torch.stack([t for _, t in sorted(by_kind[kind.position], key=lambda p: p[0])], dim=-1)
        for kind in STACKED_KINDS
    ]
    return [kind.to_model(stacked[kind.position], stacked) for kind in STACKED_KINDS]


def read_stacked(state: Sequence[Any], specs: Sequence[StateSpec]) -> list[Any]:
    """The per-layer tensors of ``specs`` from the state list the model returned.

    Args:
        state: The returned list.
        specs: The specs.

    Returns:
        The tensors, in the order of ``specs``.
    """
    return [spec.kind.read(_Slot(state, spec.layer)) for spec in specs]


def flat_stacked_model(model: Any, specs: Sequence[StateSpec]) -> Any:
    """The model with a forward over flat tensors: ``(input_ids, attention_mask, position_ids,
    states) → (logits, *present states)``, for ``torch.export``.

    As :func:`irkit.llm._states.flat_model` for a typed cache: a shallow copy of ``model`` whose
    class overrides ``forward`` to build the state list (:func:`stacked_list`), run the model's
    own ``forward`` and return the logits and the returned list's tensors of ``specs``.
    ``model`` itself is not changed.

    Args:
        model: The transformers causal LM.
        specs: The state tensors, in the order of ``states``.

    Returns:
        The flat model.
    """
    import copy

    base = type(model)
    params = inspect.signature(model.forward).parameters

    def forward(
        self: Any,
        input_ids: Any,
        attention_mask: Any = None,
        position_ids: Any = None,
        states: Sequence[Any] = (),
    ) -> tuple[Any, ...]:
        kwargs: dict[str, Any] = {
            "input_ids": input_ids,
            STATE_ARGUMENT: stacked_list(specs, states),
        }
        if attention_mask is not None and "attention_mask" in params:
            kwargs["attention_mask"] = attention_mask  # (as the model takes it: RWKV ignores it)
        if position_ids is not None and "position_ids" in params:
            kwargs["position_ids"] = position_ids
        if "use_cache" in params:
            kwargs["use_cache"] = True
        output = base.forward(self, **kwargs)
        return (output.logits, *read_stacked(output[STATE_ARGUMENT], specs))

    namespace = {
        "forward": forward,
        "__module__": base.__module__,
        "__qualname__": base.__qualname__,
    }
    flat = copy.copy(model)
    flat.__class__ = type(base.__name__, (base,), namespace)
    return flat
