"""viz names the calls inside a shared body the way irkit.inline and function_tree do."""

from __future__ import annotations

import onnx_ir as ir

import irkit
from irkit.viz import _summary
from tests.hierarchy import builders as B

ENC, LIN = "m.Enc", "m.Lin"


def _called_twice() -> ir.Model:
    """``enc`` called twice; each call calls its submodule ``enc.lin`` (``enc.lin@1`` the 2nd
    time), and a second module ``dec`` shares ``enc``'s body."""
    b = B.Builder()
    x = b.input("x", [2, 4])
    w = b.weight("w", [4, 4])
    for index in (0, 1):
        with b.module("enc", ENC, index), b.module("enc.lin", LIN, index):
            x = b.op("Relu", b.op("MatMul", x, w))
    with b.module("dec", ENC), b.module("dec.lin", LIN):
        x = b.op("Relu", b.op("MatMul", x, w))
    return b.model([x])


def _inlined_calls(model) -> list[str]:
    """The call ids irkit.inline gives the inner module calls (scopes after inlining)."""
    irkit.inline(model)
    seen: list[str] = []
    for node in model.graph:
        for frame in irkit.metadata.node_scope(node.metadata_props):
            if frame.call_id not in seen:
                seen.append(frame.call_id)
    return seen


def test_paths_of_a_shared_body_agree_with_inline():
    model = irkit.outline(_called_twice())
    assert len(model.functions) == 2  # Enc and Lin, each body shared by all calls
    paths = [call.path for call in _summary.summarize(model).root.walk()][1:]
    assert paths == ["enc", "enc.lin", "enc@1", "enc.lin@1", "dec", "dec.lin"]
    assert paths == _inlined_calls(irkit.outline(_called_twice()))
    tree = irkit.function_tree(irkit.outline(_called_twice()), sizes=False)
    assert [line.split("  ->  ")[0].strip() for line in tree.splitlines()[:6]] == paths
