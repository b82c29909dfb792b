"""Causal language models: export with the KV cache, run, deploy.

The implementation lives in private modules (``_causal_lm``: :func:`export_causal_lm`,
:func:`generate_greedy`, the cache layout; ``_export``: :func:`export`, a model folder to an
onnxruntime-genai folder; ``_genai_config``; ``_meta``; ``_multimodal``: a vision-language
model's vision, embedding and decoder programs and their genai config); this package re-exports
the public names. The stages (``irkit.lowering``, ``irkit.rewriting``, …) never import it. See
``docs/llm.md`` and ``docs/vlm.md``.
"""

from __future__ import annotations

from irkit.llm._causal_lm import (
    TESTED_TRANSFORMERS,
    CacheLayout,
    CausalLMExport,
    cache_layout,
    causal_lm_feeds,
    export_causal_lm,
    generate_greedy,
    run_eager,
    torch_inputs,
)
from irkit.llm._export import ExportedFolder, export
from irkit.llm._multimodal import (
    GENAI_VLM_FILES,
    PartExport,
    export_embedding,
    export_vision,
    export_vlm_decoder,
    vlm_genai_config,
    vlm_processor_config,
)
from irkit.llm._progress import Progress

__all__ = [
    "TESTED_TRANSFORMERS",
    "CacheLayout",
    "CausalLMExport",
    "cache_layout",
    "export_causal_lm",
    "causal_lm_feeds",
    "generate_greedy",
    "torch_inputs",
    "run_eager",
    "export",
    "ExportedFolder",
    "Progress",
    "PartExport",
    "export_vision",
    "export_embedding",
    "export_vlm_decoder",
    "vlm_genai_config",
    "vlm_processor_config",
    "GENAI_VLM_FILES",
]
