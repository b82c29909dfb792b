def test_float_attributes_compare_at_float32_precision():
    """A pattern literal like ``1 / 6`` matches the float32 value ONNX stores for it."""
    import onnx_ir as ir

    from irkit import Rule, RuleSet, op, var
    from tests.rewriting import util

    model = ir.from_onnx_text(
        '<ir_version: 10, opset_import: ["" : 21]> g (float[2] x) => (float[2] y) '
        "{ h = HardSigmoid <alpha: float = 0.16666667, beta: float = 0.5> (x)\n y = Mul(x, h) }"
    )
    x = var("x")
    rule = Rule(
        "HardSwish",
        op.Mul(x, op.HardSigmoid(x, alpha=1 / 6, beta=0.5)),
        lambda op, x: op.HardSwish(x),
    )
    report = util.rewrite(model, RuleSet("mine", [rule]))
    assert report.fired == {"HardSwish": 1}
    assert [n.op_type for n in model.graph] == ["HardSwish"]
