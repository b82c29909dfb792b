"""A rewrite never turns a model onnxruntime runs into one it refuses, nor changes its numbers.

Bug class (issue 32): ``irkit.optimize`` fused BERT's ``(B, 1, 1, L)`` mask into an
``Attention`` onnxruntime refuses ("inconsistent q_sequence_length"; layoutlm, lxmert,
markuplm), and timesfm's padded patches (rows whose every key is masked with ``finfo.min``)
came out 0 instead of the graph's average. Each model below runs in onnxruntime
(optimizations off) as lowered, then after ``irkit.optimize`` for both targets: a model that
ran before must run after, with the same outputs (fp32, tight tolerance) — compared with the
unoptimized model, not with eager PyTorch, so that only what the rewrite changed counts
(:func:`tests.helpers.assert_optimize_keeps_numbers`).

Every zoo is represented, one entry per attention form and mask layout: :mod:`tests.zoo`,
:mod:`tests.arch_zoo_wide`, :mod:`tests.llm_zoo` by the entries of :data:`NAMES` (encoders'
extended masks, eager and SDPA decoders with left padding, softcap, ALiBi), plus the issue's
five models from ``bench/tiny_config.py`` (:data:`ISSUE`), exported as the issue did
(``AutoModel``, ``strict=False`` under ``no_grad``, static shapes). :mod:`tests.arch_zoo`
(encoders with extended masks, ALBERT's shared layers, DeBERTa's disentangled attention,
encoder-decoders with cross attention and T5's position bias, vision, a decoder, MoE) and
:mod:`tests.diffusion_zoo` (SD3's joint attention) run the same check in their own test files,
on the programs those files export anyway (``--dist loadfile`` keeps a file's exports in one
process). On the commit that added this test every entry of the zoo, arch and diffusion zoos,
7 wide-zoo encoders and 6 LLMs passed too (54 cases, 7.5 minutes on 2 cores; the wide zoo's
longformer does not export); the suite keeps the subset.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx_ir as ir
import pytest
import torch

import irkit
from tests import arch_zoo_wide, helpers, llm_zoo, zoo

#: The models of issue 32 (``bench/tiny_config.py``).
ISSUE = ("layoutlm", "lxmert", "markuplm", "big_bird", "timesfm")

Case = tuple[ir.Model, list[np.ndarray]]


def _arch_case(module: Any, name: str) -> Case:
    zm = module.load(name)
    model = irkit.lower(
        module.export(name),
        input_names=zm.input_names,
        output_names=zm.output_names,
        **zm.lower_options,
    )
    return model, [t.numpy() for t in zm.feeds(zm.inputs)]


def _zoo_case(name: str) -> Case:
    zm = zoo.load(name)
    return irkit.lower(zoo.export(name)), [a.numpy() for a in zm.args]


def _llm_case(name: str) -> Case:
    lm = llm_zoo.BY_NAME[name].model()
    ids = torch.randint(3, llm_zoo.VOCAB, (2, 7), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[1, :3] = 0  # left padding: the padded queries see no key
    inputs = {"input_ids": ids, "attention_mask": mask, "use_cache": False}
    with torch.no_grad():
        program = torch.export.export(lm, (), inputs, strict=False)
    return irkit.lower(program), [ids.numpy(), mask.numpy()]


def _issue_inputs(name: str, cfg: Any) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    if name == "timesfm":
        padding = torch.zeros(2, 128, dtype=torch.long)
        padding[0, :40] = 1  # a whole patch padded: its queries see no key
        return {
            "past_values": torch.randn(2, 128, generator=g),
            "past_values_padding": padding,
            "freq": torch.zeros(2, 1, dtype=torch.long),
        }
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[1, -2:] = 0
    inputs = {"input_ids": torch.randint(3, 100, (2, 8), generator=g), "attention_mask": mask}
    if name == "layoutlm":
        corner = torch.randint(0, 500, (2, 8, 2), generator=g)
        inputs["bbox"] = torch.cat([corner, corner + 10], -1)
    if name == "lxmert":
        inputs["visual_feats"] = torch.randn(2, 3, cfg.visual_feat_dim, generator=g)
        inputs["visual_pos"] = torch.rand(2, 3, cfg.visual_pos_dim, generator=g)
    return inputs


def _issue_case(name: str) -> Case:
    import transformers

    from bench.tiny_config import tiny_config

    cfg = tiny_config(name)
    torch.manual_seed(0)
    module = transformers.AutoModel.from_config(cfg).eval()
    inputs = _issue_inputs(name, cfg)
    with torch.no_grad():
        program = torch.export.export(module, (), inputs, strict=False)
    return irkit.lower(program), [t.numpy() for t in inputs.values()]


CASES: dict[str, Callable[[str], Case]] = {
    "zoo": _zoo_case,
    "wide": functools.partial(_arch_case, arch_zoo_wide),
    "llm": _llm_case,
    "issue": _issue_case,
}
NAMES: dict[str, tuple[str, ...]] = {
    "zoo": ("bert", "llama"),
    "wide": ("layoutlm", "electra"),
    # left-padded batches: the padded queries see no key (eager, SDPA, softcap, ALiBi)
    "llm": ("llama", "mistral", "gemma2", "phi3", "bloom", "gpt2"),
    "issue": ISSUE,
}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("zoo_name", "name"),
    [pytest.param(z, n, id=f"{z}-{n}") for z, names in NAMES.items() for n in names],
)
def test_optimize_keeps_the_model_runnable_and_its_numbers(zoo_name, name):
    model, feeds = CASES[zoo_name](name)
    try:
        helpers.run_ort(model, feeds)
    except Exception as exc:  # not runnable as lowered: nothing a rewrite could break
        pytest.skip(f"onnxruntime does not run the lowered model: {str(exc)[:200]}")
    helpers.assert_optimize_keeps_numbers(model, feeds)
