"""The diffusion zoo (tests/diffusion_zoo.py): lower, optimize, run in onnxruntime at two sizes.

Each model is exported once (dynamic batch), lowered with module functions, and checked in
onnxruntime against eager PyTorch at the export size and a second batch size — after
``irkit.lower`` and again after ``irkit.optimize`` (default target), which must fuse the
attention without reading SD3's joint K/V concatenation as a KV cache.
"""

from __future__ import annotations

import pytest

import irkit
from tests import diffusion_zoo, helpers

pytest.importorskip("diffusers")
pytestmark = pytest.mark.slow


def _check(name: str, model) -> None:
    zm = diffusion_zoo.load(name)
    session = helpers.ort_session(model)
    names = [i.name for i in session.get_inputs()]
    for size, inputs in enumerate(zm.sizes()):
        feeds = zm.feeds(inputs)
        assert len(feeds) == len(names), f"model inputs {names}, {len(feeds)} tensors to feed"
        outputs = session.run(None, {n: t.numpy() for n, t in zip(names, feeds, strict=True)})
        helpers.assert_close(outputs, diffusion_zoo.expected_outputs(name, size), helpers.FP32_ATOL)


@pytest.mark.parametrize("name", list(diffusion_zoo.DIFFUSION_ZOO))
def test_diffusion_zoo_lowers_and_optimizes_to_eager_numbers(name):
    model = irkit.lower(diffusion_zoo.export(name))
    assert model.functions, "module calls were not outlined"
    _check(name, model)
    report = irkit.RewriteReport()
    irkit.optimize(model, report=report)
    assert report.fired.get("AttentionKVCache", 0) == 0  # no cache in these models
    assert report.fired.get("Attention", 0) >= 1  # the attention is fused...
    _check(name, model)  # ...and onnxruntime runs it (no past inputs without presents)


def test_optimize_keeps_sd3_runnable_and_its_numbers():
    """SD3's joint attention over image and text tokens: ``irkit.optimize`` for both targets
    keeps the numbers of the lowered model (:func:`tests.helpers.assert_optimize_keeps_numbers`,
    issue 32's bug class; here to reuse this file's export)."""
    zm = diffusion_zoo.load("sd3")
    model = irkit.lower(
        diffusion_zoo.export("sd3"),
        input_names=zm.input_names,
        output_names=zm.output_names,
        **zm.lower_options,
    )
    helpers.assert_optimize_keeps_numbers(model, [t.numpy() for t in zm.feeds(zm.inputs)])
