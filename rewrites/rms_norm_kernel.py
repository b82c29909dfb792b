"""A custom kernel for a module: every call of an ``RMSNorm`` module becomes one
``com.example.FastRMSNorm`` node, the kernel a runtime of your own provides.

After :func:`irkit.outline` each module call is a node calling a local function; a
``ModuleRule`` selects calls by module (class or path globs, as ``outline(functions=...)``) and
replaces each. Here a function builds the replacement: it reads the epsilon from the called
function's body (the constant added to the mean square), so each kernel gets its module's own
value, and declines a body it does not recognize.
"""

from typing import Any

from irkit import ModuleRule
from irkit.rewriting import ModuleCall, RewriteBuilder, scalar


def fast_rms_norm(op: RewriteBuilder, call: ModuleCall) -> Any:
    added = [scalar(v) for node in call.function if node.op_type == "Add" for v in node.inputs]
    epsilons = [value for value in added if value is not None]
    if len(epsilons) != 1 or len(call.inputs) != 2:
        return None  # (declined: not the RMSNorm this kernel implements)
    x, weight = call.inputs
    return op.domain("com.example").FastRMSNorm(x, weight, epsilon=epsilons[0])


rms_norm_kernel = ModuleRule("FastRMSNorm", cls="*RMSNorm", replace_with=fast_rms_norm)
