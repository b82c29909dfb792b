"""Every metadata key irkit writes or reads, and the codecs for their values.

This module is the only place where irkit's metadata keys are spelled. Node metadata lives in
``ir.Node.metadata_props`` (a ``dict[str, str]`` that ONNX serializes as
``NodeProto.metadata_props``), so it survives :func:`irkit.save` / :func:`irkit.load` and can be
read by any tool, with or without irkit.

Scope encoding
--------------
A node's *scope* is the chain of ``nn.Module`` calls it was traced under, outermost first,
without the root module. Each level is a :class:`Frame`: the module path (``"layers.0.attn"``),
the call index (``0`` for the first call of that module instance, ``1`` for the second — torch
spells it ``layers.0.attn@1``) and the module's qualified class name
(``"transformers.models.llama.modeling_llama.LlamaAttention"``).

The value stored under :data:`SCOPE` is JSON: a list of ``[path, call_index, class]`` triples.
Use :func:`encode_scope` / :func:`decode_scope`; never parse it by hand.

Example:
    >>> frames = (Frame("layers.0", 0, "m.Block"), Frame("layers.0.attn", 1, "m.Attn"))
    >>> decode_scope(encode_scope(frames)) == frames
    True
    >>> frames[1].call_id
    'layers.0.attn@1'
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple

from irkit.errors import MetadataError

__all__ = [
    "function_domain",
    "PREFIX",
    "SCOPE",
    "FX_NODE",
    "FX_TARGET",
    "SOURCE",
    "CALL_MODULE",
    "OUTLINE_NOTE",
    "OUTLINE_ORIGIN",
    "INVOKE_SUBGRAPH",
    "REWRITE_RULE",
    "REWRITE_SOURCES",
    "MODEL_PRODUCER",
    "CALL_SIGNATURES",
    "WEIGHTLESS_KEY",
    "DERIVED_KEY",
    "CallSignatures",
    "Frame",
    "encode_scope",
    "encode_call",
    "decode_scope",
    "node_scope",
    "encode_list",
    "decode_list",
    "decode_call",
    "node_call",
    "encode_call_signatures",
    "decode_call_signatures",
]

PREFIX = "irkit."
"""Every key irkit writes starts with this prefix."""

# --- Written by irkit.lower on every ONNX node it emits ------------------------------------------
SCOPE = "irkit.scope"
"""The module call chain of the node (JSON, see :func:`encode_scope`). Absent or ``[]``: root."""

FX_NODE = "irkit.fx_node"
"""Name of the FX node the ONNX node was lowered from (``"linear_3"``)."""

FX_TARGET = "irkit.fx_target"
"""The FX node's target (``"aten.linear.default"``), for provenance and viz."""

SOURCE = "irkit.source"
"""User source location ``"file.py:LINE"`` (innermost frame of the FX node's ``stack_trace``)."""

# --- Written by irkit.outline -----------------------------------------------------------------
CALL_MODULE = "irkit.call"
"""On a function-call node: the :class:`Frame` of the module call it stands for (JSON triple)."""

OUTLINE_NOTE = "irkit.outline.note"
"""Why a module call was left inline or split (human readable)."""

OUTLINE_ORIGIN = "irkit.outline.origin"
"""On a local function: the scope (JSON, as :data:`SCOPE`) of the module call its body was built
from, ending with that call's own frame. Body nodes' scopes start with it; :func:`irkit.inline`
uses it to re-root them at each call site."""

# --- Written by irkit.lower on the local functions it makes (invoke_subgraph, custom ops) -----
INVOKE_SUBGRAPH = "irkit.invoke_subgraph"
"""On a local function: the ``invoke_subgraph`` identifier it was lowered from (the user marked
the block as repeated, e.g. with ``torch.compiler.nested_compile_region``); outlining and
optimization keep such functions and their calls."""

CUSTOM_OP = "irkit.custom_op"
"""On a local function: the ``torch.library.custom_op`` (``namespace::name``) whose Python
implementation is its body (lowered with ``decompose_custom_ops``); outlining and optimization
keep such functions and their calls, and a rule may replace a call by a runtime's own kernel."""

# --- Written by irkit.rewrite -----------------------------------------------------------------
REWRITE_RULE = "irkit.rewrite.rule"
"""On a replacement node: the name of the rule that created it."""

REWRITE_SOURCES = "irkit.rewrite.sources"
"""On a replacement node: JSON list of the matched nodes' source locations (union, sorted)."""

# --- Model level ------------------------------------------------------------------------------
MODEL_PRODUCER = "irkit"
"""``ModelProto.producer_name`` of models irkit creates."""

CALL_SIGNATURES = "irkit.call_signatures"
"""In ``model.metadata_props``, written by :func:`irkit.lower`: the input/output order of module
calls whose signature torch preserved (``preserve_module_call_signature``), as a JSON object
``{call id: [[input value names], [output value names]]}`` (see :func:`encode_call_signatures`).
:func:`irkit.outline` orders function inputs/outputs by it, so outlining needs nothing but the
model. Absent when no module call has a preserved signature."""

CallSignatures = Mapping[str, tuple[Sequence[str], Sequence[str]]]
"""Module call id (``"layers.0"``, ``"layers.0@1"``) → (input value names, output value names)
in the module's call-signature order."""

# --- On initializers (TensorProto metadata_props), written by irkit.lower / optimize ------------
WEIGHTLESS_KEY = "irkit.weightless"
"""``metadata_props`` key of a tensor without data (its ``TensorProto`` holds dims and dtype
only; see :class:`irkit.weights.WeightlessTensor`). :func:`irkit.load` recognizes it."""

DERIVED_KEY = "irkit.derived"
"""``metadata_props`` key of a derived weightless initializer: its recipe as JSON
(``{"version": 1, "recipe": {...}}``, see :class:`irkit.weights.DerivedTensor`), next to the
:data:`WEIGHTLESS_KEY` marker."""


class Frame(NamedTuple):
    """One level of a node's module scope: one *call* of one module instance.

    A named tuple: scopes (tuples of frames) key many dicts during outlining, and a tuple hashes
    and compares in C. Frames order by path, then call index, then class.

    Attributes:
        path: Module path from the root (``"layers.0.attn"``); ``""`` is the root module.
        call_index: Which call of that module instance (0 for the first).
        cls: Qualified class name of the module (``"torch.nn.modules.linear.Linear"``).
    """

    path: str
    call_index: int
    cls: str

    @property
    def call_id(self) -> str:
        """The call's identity as torch spells it: ``path`` or ``path@N`` for N > 0."""
        return self.path if self.call_index == 0 else f"{self.path}@{self.call_index}"

    @property
    def class_name(self) -> str:
        """The unqualified class name (``"Linear"``)."""
        return self.cls.rsplit(".", 1)[-1]

    @property
    def package(self) -> str:
        """The Python package of the class (``"transformers.models.llama"``).

        The class's module path without its last component (the defining file); classes defined
        at top level of a script (``__main__.Foo``) return the module itself.
        """
        module = self.cls.rsplit(".", 1)[0] if "." in self.cls else ""
        return module.rsplit(".", 1)[0] if "." in module else module

    def to_json(self) -> list[object]:
        return [self.path, self.call_index, self.cls]

    @classmethod
    def from_json(cls, data: Sequence[object]) -> Frame:
        path, call_index, klass = data
        if not isinstance(call_index, (int, str)):
            raise TypeError(f"call index {call_index!r} is not an int")
        return cls(str(path), int(call_index), str(klass))


_COMPACT_JSON = json.JSONEncoder(separators=(",", ":")).encode  # (json.dumps with separators
# builds a new encoder on every call)


def encode_scope(frames: Iterable[Frame]) -> str:
    """Encode a scope (outermost frame first) as the string stored under :data:`SCOPE`."""
    return _COMPACT_JSON([f.to_json() for f in frames])


def encode_call(frame: Frame) -> str:
    """Encode one call as the string stored under :data:`CALL_MODULE` on a call node."""
    return _COMPACT_JSON(frame.to_json())


def decode_scope(text: str | None) -> tuple[Frame, ...]:
    """Decode a :data:`SCOPE` value; ``None`` or ``""`` is the root scope ``()``.

    Raises:
        MetadataError: The text is not a scope written by :func:`encode_scope`.
    """
    if not text:
        return ()
    try:
        return tuple(Frame.from_json(item) for item in json.loads(text))
    except (ValueError, TypeError) as exc:
        raise MetadataError(f"malformed {SCOPE} metadata {text[:80]!r}: {exc}") from exc


def decode_call(text: str) -> Frame:
    """Decode a :data:`CALL_MODULE` value (the one place that parses it).

    Raises:
        MetadataError: The text is not a call written by :func:`encode_call`.

    Example:
        >>> decode_call(encode_call(Frame("layers.0", 1, "m.Block")))
        Frame(path='layers.0', call_index=1, cls='m.Block')
    """
    try:
        return Frame.from_json(json.loads(text))
    except (ValueError, TypeError) as exc:
        raise MetadataError(f"malformed {CALL_MODULE} metadata {text[:80]!r}: {exc}") from exc


def node_call(metadata_props: Mapping[str, str]) -> Frame | None:
    """The module call a function-call node stands for (its :data:`CALL_MODULE`), or ``None``."""
    text = metadata_props.get(CALL_MODULE)
    return decode_call(text) if text else None


def encode_call_signatures(signatures: CallSignatures) -> str:
    """Encode call signatures as the string stored under :data:`CALL_SIGNATURES`.

    Example:
        >>> text = encode_call_signatures({"pair": (["x"], ["add", "mul"])})
        >>> text, decode_call_signatures(text)
        ('{"pair":[["x"],["add","mul"]]}', {'pair': (['x'], ['add', 'mul'])})
    """
    return _COMPACT_JSON({k: [list(i), list(o)] for k, (i, o) in signatures.items()})


def decode_call_signatures(text: str | None) -> dict[str, tuple[list[str], list[str]]]:
    """Decode a :data:`CALL_SIGNATURES` value; ``None`` or ``""`` gives ``{}``.

    Raises:
        MetadataError: The text is not what :func:`encode_call_signatures` writes.
    """
    if not text:
        return {}
    try:
        data = json.loads(text)
        return {
            str(k): ([str(n) for n in ins], [str(n) for n in outs])
            for k, (ins, outs) in data.items()
        }
    except (ValueError, TypeError, AttributeError) as exc:
        raise MetadataError(f"malformed {CALL_SIGNATURES} metadata {text[:80]!r}: {exc}") from exc


def node_scope(metadata_props: Mapping[str, str]) -> tuple[Frame, ...]:
    """The scope of a node, read from its ``metadata_props``."""
    return decode_scope(metadata_props.get(SCOPE))


def encode_list(items: Iterable[str]) -> str:
    """Encode a list of strings (e.g. :data:`REWRITE_SOURCES`) as compact JSON."""
    return _COMPACT_JSON(list(items))


def decode_list(text: str | None) -> list[str]:
    """Decode a value written by :func:`encode_list`; ``None`` gives ``[]``."""
    if not text:
        return []
    try:
        return [str(x) for x in json.loads(text)]
    except (ValueError, TypeError) as exc:
        raise MetadataError(f"malformed list metadata {text[:80]!r}: {exc}") from exc


def function_domain(frame: Frame) -> str:
    """The ONNX domain of a module's function: the Python package of its class.

    Example:
        >>> function_domain(Frame("l", 0, "transformers.models.llama.modeling_llama.LlamaMLP"))
        'transformers.models.llama'
        >>> function_domain(Frame("l", 0, "__main__.Block"))
        'main'
    """
    package = frame.package.replace("__main__", "main").strip("_.")
    return package or "irkit.local"
