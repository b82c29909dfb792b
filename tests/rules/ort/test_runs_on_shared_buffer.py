"""``runs_on_shared_buffer``: genai's ``past_present_share_buffer`` only where nothing but
``GroupQueryAttention`` reads the cache (a Softmax elsewhere is no attention)."""

from __future__ import annotations

import pytest

from irkit.rules.ort.attention import group_query_attentions, runs_on_shared_buffer
from tests.rewriting import util

_HEAD = '<ir_version: 10, opset_import: ["" : 23, "com.microsoft" : 1]>'
_GRAPH = """{head}
g (float[1,1,64] q, float[1,2,8,16] pk, float[1,2,8,16] pv, int32[1] seqlens, int32 total,
   float[1,4] router) => (float[1,1,32] y, float[1,2,8,16] prk, float[1,2,8,16] prv, {extra_out}) {{
    y, prk, prv = com.microsoft.GroupQueryAttention<num_heads=2, kv_num_heads=2>(q, , , pk, pv,
        seqlens, total)
    {extra}
}}"""
_NAMES = {
    "pk": "past_key_values.0.key",
    "pv": "past_key_values.0.value",
    "prk": "present.0.key",
    "prv": "present.0.value",
}


def _model(extra: str, extra_out: str):
    model = util.model(_GRAPH.format(head=_HEAD, extra=extra, extra_out=extra_out))
    for value in [*model.graph.inputs, *model.graph.outputs]:
        value.name = _NAMES.get(str(value.name), value.name)
    return model


@pytest.mark.parametrize(
    ("extra", "extra_out", "shared"),
    [
        ("p = Softmax(router)", "float[1,4] p", True),  # a MoE router: no attention
        ("b = Shape<start=0, end=1>(pk)", "int64[1] b", True),  # the batch, not the capacity
        ("b = Shape<start=2, end=3>(pk)", "int64[1] b", False),  # the capacity as a length
        ("c = Concat<axis=2>(pk, pk)", "float[1,2,16,16] c", False),  # an unfused cache read
    ],
    ids=["router-softmax", "batch-shape", "length-shape", "concat"],
)
def test_shared_only_where_group_query_attention_owns_the_cache(extra, extra_out, shared):
    model = _model(extra, extra_out)
    assert group_query_attentions(model) == 1
    assert runs_on_shared_buffer(model, 1) is shared
    assert runs_on_shared_buffer(model, 2) is False  # one per cached layer


def test_a_cache_of_states_only_shares_nothing():
    """No cached attention layer (Mamba: states only): no KV buffer, the flag false."""
    model = util.model(f"{_HEAD}\ng (float[2] x) => (float[2] y) {{ y = Relu(x) }}")
    assert runs_on_shared_buffer(model, 0) is False
