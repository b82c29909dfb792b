"""``irkit.optimize(target="ort")`` on the zoo's encoders: fusions across module boundaries
(packed QKV with biases, BiasGelu across ``dense``/``act``, SkipLayerNormalization), one
function per layer class, numbers within 1e-4 of eager PyTorch."""

from __future__ import annotations

import collections

import pytest

import irkit
from irkit.rules import ort
from tests import arch_zoo
from tests.helpers import assert_close, run_ort

pytestmark = pytest.mark.slow

CASES = {  # (layer functions, fusions): BERT's norms follow its residual adds inside the layer;
    # ViT's pre-norm layers also fuse at each seam (a layer's last add, the next one's first
    # norm or the final one), so the first layer, which keeps its first norm, has its own body
    "bert": (["BertLayer"], {"PackedMatMul": 2, "SkipLayerNormalization": 4, "BiasGelu": 2}),
    "vit": (["ViTLayer", "ViTLayer_1"], {"PackedMatMul": 2, "SkipLayerNormalization": 4}),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_encoder_ort(name):
    layer_functions, fired = CASES[name]
    zm = arch_zoo.load(name)
    model = irkit.lower(arch_zoo.export(name))
    report = irkit.RewriteReport()
    irkit.optimize(model, target="ort", rules=ort.default_rules(skip_norm=True), report=report)
    assert {k: report.fired.get(k, 0) for k in fired} == fired
    layers = [f for f in model.functions.values() if f.name.startswith(layer_functions[0])]
    assert [f.name for f in layers] == layer_functions
    calls = collections.Counter(n.op_type for f in model.functions.values() for n in f)
    assert sum(calls[f] for f in layer_functions) == arch_zoo.LAYERS
    for size in (0, 1):
        actual = run_ort(model, [t.numpy() for t in zm.feeds(zm.sizes()[size])])
        assert_close(actual, arch_zoo.expected_outputs(name, size), atol=1e-4)
