"""LeakyReLU from a select: ``Where(x > 0, x, x · a) = LeakyRelu(x, alpha=a)``.

The slope ``a`` must be one constant number, and the check reads it: a check that computes
something the rewrite needs returns it as a *finding* (``{"alpha": ...}``), which the rewrite
takes as a parameter by name. A slope that is a tensor or not a constant is a near miss with its
reason (``irkit.rewrite(..., explain="LeakyRelu")`` shows it).
"""

import onnx_ir as ir

from irkit import Rule, fail, op, var
from irkit.rewriting import Verdict, scalar

x, slope = var("x"), var("slope")


def slope_is_a_number(slope: ir.Value) -> Verdict:
    alpha = scalar(slope)
    if alpha is None:
        return fail("the slope is not a one-element constant", slope)
    return {"alpha": alpha}


leaky_relu = Rule(
    "LeakyRelu",
    op.Where(op.Greater(x, 0.0), x, x * slope),
    check=slope_is_a_number,
    rewrite=lambda op, x, alpha: op.LeakyRelu(x, alpha=alpha),
)
