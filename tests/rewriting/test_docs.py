"""The code in docs/rules.md runs as written (one namespace, blocks in order)."""

from __future__ import annotations

import pathlib
import re

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "rules.md"


def test_rules_md_examples_run(capsys):
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    assert len(blocks) >= 6
    namespace: dict[str, object] = {}
    for i, code in enumerate(blocks):
        exec(compile(code, f"docs/rules.md[block {i}]", "exec"), namespace)
    out = capsys.readouterr().out
    assert "SiLU: Mul(x, Sigmoid(x)) ⇒ Swish(x)" in out
    assert "HardSwish: Mul(x, HardSigmoid(x, alpha=?alpha, beta=?beta)) ⇒ HardSwish(x)" in out
