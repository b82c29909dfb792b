"""The architecture zoo (tests/arch_zoo.py): lower, run in onnxruntime at two sizes, compare.

Every model is exported once, the way users export (no outer ``torch.no_grad()``, dynamic batch and
sequence dims), and lowered three ways: with module functions, flat (``functions=False``), and
with functions after ``irkit.optimize``. Each ONNX model runs in onnxruntime (graph optimizations
off) at the export size and at a second size, ≤1e-4 from eager PyTorch; every lowering must leave
the program's input shapes unchanged (irkit never mutates its input).

Cases that fail today because of an irkit gap are listed in :data:`XFAIL` below — the one place
to look — as strict expected failures: when a fix lands, the case passes, the strict xfail
fails, and the entry must be deleted.
"""

from __future__ import annotations

import pytest
import torch

import irkit
from tests import arch_zoo, helpers

VARIANTS = ("functions", "flat", "optimized")

# Known irkit gaps: {model: reason} for every variant, or {(model, variant): reason}, each the root
# cause (exception, FX node / op, first line). None today: docs/conformance_zoo.md has the history
# (the MoE grouped_mm custom op, context regions, dtype promotion, hardtanh, Python-constant inputs
# and pytree output names that failed on earlier commits).
XFAIL: dict[str | tuple[str, str], str] = {}


def _shapes(ep: torch.export.ExportedProgram) -> list[str]:
    """The placeholders' shapes as text: symbolic dims print as their current value."""
    return [
        str(getattr(n.meta.get("val"), "shape", None))
        for n in ep.graph.nodes
        if n.op == "placeholder"
    ]


def _cases() -> list:
    cases = []
    for name in arch_zoo.ARCH_ZOO:
        for variant in VARIANTS:
            reason = XFAIL.get((name, variant)) or XFAIL.get(name)
            marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
            cases.append(pytest.param(name, variant, id=f"{name}-{variant}", marks=marks))
    return cases


def _lower(name: str, variant: str):
    zm = arch_zoo.load(name)
    ep = arch_zoo.export(name)
    before = _shapes(ep)
    model = irkit.lower(
        ep,
        functions=variant != "flat",
        input_names=zm.input_names,
        output_names=zm.output_names,
        **zm.lower_options,
    )
    assert _shapes(ep) == before, "irkit.lower changed the ExportedProgram's input shapes"
    if variant == "optimized":
        irkit.optimize(model)
    return model


@pytest.mark.parametrize(("name", "variant"), _cases())
def test_arch_zoo_matches_eager_at_two_sizes(name, variant):
    zm = arch_zoo.load(name)
    model = _lower(name, variant)
    if variant == "flat":
        assert not model.functions
    else:
        assert model.functions, "module calls were not outlined"
    session = helpers.ort_session(model)
    names = [i.name for i in session.get_inputs()]
    for size, inputs in enumerate(zm.sizes()):
        feeds = zm.feeds(inputs)
        assert len(feeds) == len(names), f"model inputs {names}, {len(feeds)} tensors to feed"
        outputs = session.run(None, {n: t.numpy() for n, t in zip(names, feeds, strict=True)})
        helpers.assert_close(outputs, arch_zoo.expected_outputs(name, size), helpers.FP32_ATOL)


def test_kv_cache_inputs_and_outputs_are_named_with_a_dynamic_past_length():
    zm = arch_zoo.load("llama_kv")
    model = _lower("llama_kv", "functions")
    assert [v.name for v in model.graph.inputs] == zm.input_names
    assert [v.name for v in model.graph.outputs] == zm.output_names
    shapes = {v.name: [str(d) for d in v.shape] for v in model.graph.inputs}
    assert shapes["input_ids"] == ["batch", "seq"]
    assert shapes["past_key_values.1.value"] == ["batch", "2", "past", "16"]
    present = [str(d) for d in model.graph.outputs[-1].shape]
    assert (model.graph.outputs[-1].name, present) == (
        "present.1.value",
        ["batch", "2", "past + seq", "16"],
    )


def test_kv_cache_lowers_with_default_names():
    # Output names come from the output TreeSpec (a DynamicCache inside CausalLMOutputWithPast);
    # the specialized use_cache=True is no graph input.
    ep = arch_zoo.export("llama_kv")
    model = irkit.lower(ep)
    tensors = [name for name in ep.graph_signature.user_inputs if isinstance(name, str)]
    assert [v.name for v in model.graph.inputs] == tensors  # use_cache's True is not one
    names = [v.name for v in model.graph.outputs]
    assert names[0] == "logits" and len(names) == 5 == len(set(names))
    # The output field is `cache` since transformers 5.2x, `past_key_values` before.
    assert all(name.startswith(("cache_", "past_key_values_")) for name in names[1:]), names


def test_zoo_exports_as_users_do_so_rotary_models_keep_their_grad_region():
    # transformers (before 5.24) decorates the rotary embedding's forward with
    # @torch.no_grad(); without an outer no_grad, torch.export keeps that region as a
    # higher-order op. Whether the installed release does is read from the method itself.
    import inspect

    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    decorated = "@torch.no_grad()" in inspect.getsource(LlamaRotaryEmbedding.forward)
    region = torch.ops.higher_order.wrap_with_set_grad_enabled
    targets = {n.target for n in arch_zoo.export("llama").graph.nodes}
    assert (region in targets) == decorated
    no_grad = {n.target for n in arch_zoo.export("llama", no_grad=True).graph.nodes}
    assert region not in no_grad


# One entry per attention form and mask layout (issue 32's bug class: a rewrite that makes a
# runnable model fail or compute something else): encoders with extended masks, ALBERT's shared
# layers, DeBERTa's disentangled attention, encoder-decoders (cross attention, T5's position
# bias), vision, a decoder, MoE. Here, not in tests/rewriting/test_optimize_keeps_runnable.py,
# so that the programs this file exported above are reused (one process per file).
KEEPS_NUMBERS = ("distilbert", "albert", "deberta_v2", "t5", "bart", "whisper", "vit", "qwen3")


@pytest.mark.parametrize("name", KEEPS_NUMBERS)
def test_optimize_keeps_the_model_runnable_and_its_numbers(name):
    zm = arch_zoo.load(name)
    model = _lower(name, "functions")
    helpers.assert_optimize_keeps_numbers(model, [t.numpy() for t in zm.feeds(zm.inputs)])
