"""Unused optional outputs are left out of a saved file (irkit._optional_outputs): the runtime
then computes none of them, the numbers stay, outputs something reads stay."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir

import irkit
from irkit._optional_outputs import drop_unused_optional_outputs
from tests.helpers import run_ort

_SKIP = """<ir_version: 10, opset_import: ["" : 23, "com.microsoft" : 1, "pkg" : 1]>
g (float[2, 3, 8] a, float[2, 3, 8] b, float[8] w) => (float[2, 3, 8] y, float[2, 3, 8] z) {
    y, mean, inv, s = com.microsoft.SkipSimplifiedLayerNormalization<epsilon: float = 1e-5>(a, b, w)
    n, m2, i2, s2 = com.microsoft.SkipSimplifiedLayerNormalization<epsilon: float = 1e-5>(s, y, w)
    z = pkg.Block(n, s2)
}
<domain: "pkg", opset_import: ["" : 23]>
Block (x, r) => (out) {
    out, mu, sigma = LayerNormalization<axis: int = -1>(r, x)
}
"""


def test_saved_file_leaves_out_what_nothing_reads(tmp_path):
    model = ir.from_onnx_text(_SKIP)
    path = irkit.save(model, tmp_path / "skip.onnx")
    proto = onnx.load(path)
    outputs = [list(n.output) for n in proto.graph.node]
    # the first Skip's sum feeds the second; the second's sum feeds the call; statistics go
    assert outputs[:2] == [["y", "", "", "s"], ["n", "", "", "s2"]]
    (body,) = proto.functions
    assert list(body.node[0].output) == ["out"]  # (the function's output stays)
    assert [len(n.outputs) for n in model.graph] == [4, 4, 1]  # the model is not modified
    rng = np.random.default_rng(0)
    feeds = [rng.standard_normal(s).astype(np.float32) for s in ((2, 3, 8), (2, 3, 8), (8,))]
    for got, want in zip(run_ort(irkit.load(path), feeds), run_ort(model, feeds), strict=True):
        np.testing.assert_array_equal(got, want)


def test_an_output_read_in_a_subgraph_or_required_stays():
    proto = onnx.parser.parse_model("""<ir_version: 10, opset_import: ["" : 23]>
    g (float[2, 4] x, float[4] w, bool c, int64[1] n) => (float[2, 4] y, float[2] k) {
        y, mean, inv = LayerNormalization(x, w)
        k = If(c) <then_branch = t () => (float[2] o) { o = ReduceSum<keepdims: int = 0>(mean) },
                   else_branch = e () => (float[2] o) { o = ReduceMax<keepdims: int = 0>(mean) }>
        v, idx = TopK(x, n)
    }""")
    assert drop_unused_optional_outputs(proto) == 1  # inv only (TopK's outputs are required)
    assert list(proto.graph.node[0].output) == ["y", "mean"]
    assert list(proto.graph.node[2].output) == ["v", "idx"]
