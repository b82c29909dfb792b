"""The gated RMS norm → onnxruntime's ``GatedRMSNorm``, and on a per-head norm over rows of one
head, the packed form (``GatedRMSNormPacked``): onnxruntime's numbers before and after."""

from __future__ import annotations

from tests.rewriting.util import infer_shapes
from tests.rules.ort.support import fire, no_fire, parse


def rows_text(out: str = "2, 3, 16") -> str:
    """``Qwen3_5RMSNormGated`` as exported: rows of one head (4), then back to ``out``."""
    target = ", ".join(out.split(", "))
    rank = len(out.split(", "))
    return (
        f"g (float[2, 3, 16] x, float[2, 3, 16] z, float[4] w) => (float[{out}] y) {{\n"
        "  rows = Constant<value=int64[2] {-1, 4}>()\n"
        f"  back = Constant<value=int64[{rank}] {{{target}}}>()\n"
        "  xr = Reshape(x, rows)  zr = Reshape(z, rows)\n"
        "  n = RMSNormalization<axis=-1, epsilon=1e-6, stash_type=1>(xr, w)\n"
        "  s = Sigmoid(zr)  silu = Mul(zr, s)  y0 = Mul(n, silu)\n"
        "  y = Reshape(y0, back)\n}"
    )


def test_gated_norm_over_rows_of_a_head_runs_packed():
    fire(infer_shapes(parse(rows_text())), "GatedRMSNormPacked", {"GatedRMSNorm": 1})


def test_gated_norm_reshaped_to_another_shape_keeps_its_rows():
    no_fire(
        infer_shapes(parse(rows_text("6, 16"))),
        "GatedRMSNormPacked",
        "x, g and the result have not the same known dims",
    )
