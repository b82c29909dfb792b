"""Skips by capability: what a test needs from the installed packages, checked by looking.

The oldest lane (``bash .ci/setup --oldest``) runs the suite with every requirement at its
floor (transformers 5.24, onnx-ir 0.1.16, numpy 1.26 …), and the suite also runs beside older
transformers installed by hand (irkit reads transformers by capability down to 4.54). A test
that needs something an installed package lacks (a model family, an API, a text form) skips
where it is absent, saying what is missing; never by comparing version numbers
(docs/development.md). Each ``require_*`` helper calls :func:`pytest.skip` where the capability
is absent and returns otherwise."""

from __future__ import annotations

import importlib
import inspect
import re
from collections.abc import Callable
from typing import Any

import pytest


def _transformers() -> object:
    return pytest.importorskip("transformers")


def _version() -> str:
    return str(getattr(_transformers(), "__version__", "?"))


def require_model_types(*model_types: str) -> None:
    """Skips where transformers has no config class for one of ``model_types``.

    Args:
        model_types: Model types (``"qwen3_next"``), as ``AutoConfig.for_model`` takes them.
    """
    auto = pytest.importorskip("transformers.models.auto.configuration_auto")
    missing = [t for t in model_types if t not in auto.CONFIG_MAPPING_NAMES]
    if missing:
        pytest.skip(f"transformers {_version()} has no {', '.join(missing)}")


def has_typed_cache_layers() -> bool:
    """Whether transformers types cache layers by kind (``linear_attention`` …:
    ``cache_utils.DYNAMIC_LAYER_TYPE_MAPPING``, transformers 5), what irkit reads to find which
    layers hold recurrent states (``irkit/llm/_states.py``)."""
    _transformers()
    cache_utils = importlib.import_module("transformers.cache_utils")
    return hasattr(cache_utils, "DYNAMIC_LAYER_TYPE_MAPPING")


def require_typed_cache_layers() -> None:
    """Skips where transformers types no cache layers by kind (:func:`has_typed_cache_layers`):
    irkit then finds no recurrent state of a hybrid model, and its configs spell layer kinds per
    model (``mamba``, ``attention``)."""
    if not has_typed_cache_layers():
        pytest.skip(f"transformers {_version()} types no cache layers by kind")


def require_config_dtype() -> None:
    """Skips where a transformers config has no ``dtype`` field (before 4.56: ``torch_dtype``),
    so that ``from_config``/``_from_config`` pass a ``dtype`` argument on to the model's
    ``__init__`` (a ``TypeError``): what ``irkit export``'s meta-device build
    (``irkit.llm._meta.meta_causal_lm``) passes. The ``llm`` extra asks for
    ``transformers>=4.56``."""
    if not hasattr(_transformers().PretrainedConfig(), "dtype"):
        pytest.skip(f"transformers {_version()}'s configs have no dtype (irkit export's build)")


def cache_argument(forward: Callable[..., Any]) -> str:
    """The name a transformers ``forward`` takes the cache by: ``cache`` (transformers 5.24's
    rename) where it has that parameter, else ``past_key_values``. A ``forward`` with
    ``**kwargs`` ignores a cache passed by the other name: the step then runs without one.

    Args:
        forward: A model's or a module's ``forward`` (bound or not).
    """
    return "cache" if "cache" in inspect.signature(forward).parameters else "past_key_values"


def require_state_kind_comparison(model_type: str) -> None:
    """Skips where ``model_type``'s modeling module compares ``layer_types[…]`` with no kind of
    state layer (a kind transformers' typed cache layers hold in a
    ``LinearAttentionCacheLayerMixin``): what ``bench/tiny_config.py`` derives a ``layer_types``
    the config leaves ``None`` from. (LFM2-MoE compares with ``!= "conv"``; before, with
    ``== "full_attention"`` alone: no state kind is named, and its defaults do not build.)

    Args:
        model_type: A model type (``"lfm2_moe"``) whose config has ``layer_types``.
    """
    require_model_types(model_type)
    require_typed_cache_layers()
    auto = importlib.import_module("transformers.models.auto.configuration_auto")
    cache_utils = importlib.import_module("transformers.cache_utils")
    mapping = cache_utils.DYNAMIC_LAYER_TYPE_MAPPING
    state = getattr(cache_utils, "LinearAttentionCacheLayerMixin", None)
    config = auto.CONFIG_MAPPING[model_type]
    modeling = importlib.import_module(config.__module__.replace(".configuration_", ".modeling_"))
    compared = re.findall(
        r"layer_types\[[^\]]*\]\s*[!=]=\s*[\"'](\w+)[\"']", inspect.getsource(modeling)
    )
    if state is None or not any(
        kind in mapping and issubclass(mapping[kind], state) for kind in compared
    ):
        pytest.skip(
            f"transformers {_version()}'s {model_type} compares layer_types with no state kind "
            f"({', '.join(map(repr, compared)) or 'none'})"
        )


def require_round_trip_float_text() -> None:
    """Skips where onnx-ir's text form (``onnx_ir.to_onnx_text``) prints a float constant
    rounded (onnx-ir 0.1.16: ``2.82843`` for float32 ``2.828427``): the golden texts hold the
    digits that read back as the same float32 (onnx-ir 1.1)."""
    ir = pytest.importorskip("onnx_ir")
    model = ir.from_onnx_text(
        '<ir_version: 10, opset_import: ["" : 20]>\n'
        "g (float[1] x) => (float[1] y) "
        "{ c = Constant <value: tensor = float[1] {2.828427}> () y = Mul(x, c) }"
    )
    if "2.828427" not in ir.to_onnx_text(model):
        pytest.skip(
            f"onnx-ir {getattr(ir, '__version__', '?')} prints float constants rounded "
            "(the golden texts hold round-trip digits)"
        )
