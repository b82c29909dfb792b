"""What every rule-family test uses: fire (golden + onnxruntime numbers) and no_fire (reason)."""

from __future__ import annotations

import onnx_ir as ir

from irkit import rules as library
from irkit.rewriting import RewriteReport
from tests.rewriting import util

H = '<ir_version: 10, opset_import: ["" : {opset}]>'


def parse(body: str, opset: int = 18) -> ir.Model:
    """A model from a graph body in ONNX text, at ``opset``."""
    return util.model(H.format(opset=opset) + body)


def fire(m, rule_name: str, expect_ops: dict[str, int], golden: str | None = None) -> RewriteReport:
    """Apply the default rules; the named rule fires, numbers agree, the graph stays valid."""
    before = util.clone(m)
    report = util.rewrite(m, library.default_rules())
    assert report.rules[rule_name].fired >= 1, str(report)
    assert util.ops(m) == expect_ops
    util.assert_valid(m)
    util.assert_same_numbers(before, m)
    if golden:
        util.assert_golden(m, golden)
    return report


def no_fire(m, rule_name: str, reason: str) -> RewriteReport:
    report = util.rewrite(m, library.default_rules())
    stats = report.rules[rule_name]
    assert stats.fired == 0 and stats.tried >= 1
    assert reason in stats.failures, dict(stats.failures)
    return report
