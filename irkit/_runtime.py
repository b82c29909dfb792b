"""What the installed onnxruntime runs on CPU: the opsets it loads, the op versions it has kernels
for. onnxruntime is optional: without it every answer is "unknown" (``None``, no problems).

A file irkit writes must load in onnxruntime (``CONVENTIONS``); :func:`irkit.lower` takes its
opset range from here and :func:`irkit.check` reports what onnxruntime would refuse.

>>> import onnx_ir as ir
>>> m = ir.from_onnx_text('<ir_version: 10, opset_import: ["" : 99]> g (float[2] x) => (float[2] y) { y = Relu(x) }')
>>> print(runtime_problems(m)[0])  # doctest: +ELLIPSIS
the model imports opset 99 of the default domain; onnxruntime ... loads opsets up to ...
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping

import onnx
import onnx_ir as ir

from irkit._irutil import node_subgraphs

__all__ = ["ort_version", "kernel_defs", "newest_opset", "runtime_problems", "KernelDef"]

_PROVIDER = "CPUExecutionProvider"
_PROBE_LIMIT = 1000  # (an opset onnxruntime loads above this: it does not check the domain)

_NO_KERNEL_NEEDED = frozenset({("", "Constant")})  # (onnxruntime makes them initializers)

KernelDef = tuple[str, str, int, int, Mapping[str, tuple[str, ...]]]
"""``(domain, op, since, until, {type parameter: ("tensor(float)", …)})`` of one CPU kernel."""


@functools.cache
def ort_version() -> str | None:
    """The installed onnxruntime's version, or ``None`` without it."""
    try:
        import onnxruntime
    except ImportError:
        return None
    return str(onnxruntime.__version__)


@functools.cache
def kernel_defs() -> tuple[KernelDef, ...]:
    """onnxruntime's CPU kernels (``()`` without onnxruntime)."""
    if ort_version() is None:
        return ()
    from onnxruntime.capi import _pybind_state

    return tuple(
        (k.domain, k.op_name, *k.version_range, dict(k.type_constraints))
        for k in _pybind_state.get_all_opkernel_def()
        if k.provider == _PROVIDER
    )


@functools.cache
def _kernel_ranges() -> Mapping[tuple[str, str], tuple[tuple[int, int], ...]]:
    ranges: dict[tuple[str, str], set[tuple[int, int]]] = {}
    for domain, op, since, until, _ in kernel_defs():
        ranges.setdefault((domain, op), set()).add((since, until))
    return {key: tuple(sorted(found)) for key, found in ranges.items()}


@functools.cache
def _kernel_domains() -> frozenset[str]:
    return frozenset({""} | {domain for domain, _ in _kernel_ranges()})


@functools.cache
def _loads(domain: str, opset: int) -> bool:
    """Whether onnxruntime loads a one-node model importing ``opset`` of ``domain``."""
    import onnxruntime

    helper = onnx.helper
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "probe",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])],
    )
    imports = [helper.make_opsetid("", opset if domain == "" else 13)]
    if domain:
        imports.append(helper.make_opsetid(domain, opset))
    model = helper.make_model(graph, opset_imports=imports, ir_version=8)
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 4
    try:
        onnxruntime.InferenceSession(model.SerializeToString(), options, providers=[_PROVIDER])
    except Exception:  # (onnxruntime raises its own Fail/InvalidGraph classes)
        return False
    return True


def unknown_to_onnx(model: ir.Model) -> list[str]:
    """The ops of ``model`` (functions included) that onnx has no schema for and that are not
    the model's own functions, as ``domain::op`` (sorted): onnxruntime's contrib ops, typically.
    ``onnx.checker``'s strict shape inference cannot type their outputs."""
    functions = set(model.functions)
    unknown: set[str] = set()
    for node, _ in _nodes(model):
        if (node.domain, node.op_type, node.overload) in functions:
            continue
        domain = "" if node.domain == "ai.onnx" else node.domain
        if not onnx.defs.has(node.op_type, domain):
            unknown.add(f"{domain}::{node.op_type}")
    return sorted(unknown)


def session_problem(proto: onnx.ModelProto) -> str | None:
    """Why onnxruntime (CPU, graph optimizations off) refuses to load ``proto``, or None: its
    own type and shape inference, which knows its contrib ops. None without onnxruntime."""
    if ort_version() is None:
        return None
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.log_severity_level = 4
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        onnxruntime.InferenceSession(proto.SerializeToString(), options, providers=[_PROVIDER])
    except Exception as exc:  # (onnxruntime raises its own Fail/InvalidGraph classes)
        return f"{type(exc).__name__}: {exc}"
    return None


@functools.cache
def newest_opset(domain: str = "") -> int | None:
    """The newest opset of ``domain`` onnxruntime loads (``""``: the default domain).

    Found by loading one-node models (well under a millisecond each), starting at the newest
    opset onnx or onnxruntime's CPU kernels know of: onnxruntime refuses a model importing a
    newer one ("Current official support for domain ai.onnx is till opset 28").

    Returns:
        The opset, or ``None`` without onnxruntime or for a domain it has no kernels for.
    """
    if ort_version() is None or domain not in _kernel_domains():
        return None
    known = onnx.defs.C.schema_version_map().get(domain, (1, 1))[1]
    kernels = max(
        (since for (d, _), spans in _kernel_ranges().items() if d == domain for since, _ in spans),
        default=1,
    )
    opset = max(known, kernels, 1)
    if _loads(domain, opset):
        while opset < _PROBE_LIMIT and _loads(domain, opset + 1):
            opset += 1
        return None if opset >= _PROBE_LIMIT else opset
    while opset > 1 and not _loads(domain, opset):
        opset -= 1
    return opset


def _domain_name(domain: str) -> str:
    return "the default domain" if domain in ("", "ai.onnx") else f"domain {domain!r}"


def runtime_problems(model: ir.Model) -> list[str]:
    """What the installed onnxruntime (CPU) would refuse in ``model``, one line each.

    - an opset import newer than onnxruntime loads (model and functions);
    - a node of an ONNX domain whose op version (the schema at the graph's opset) has no CPU
      kernel and no function body onnxruntime could expand instead.

    ``[]`` without onnxruntime. The model is not modified.
    """
    version = ort_version()
    if version is None:
        return []
    problems: list[str] = []
    imports: list[tuple[str, Mapping[str, int]]] = [("the model", model.opset_imports)]
    imports += [
        (f"function {f.domain}::{f.name}", f.opset_imports) for f in model.functions.values()
    ]
    for where, opsets in imports:
        for domain, opset in sorted(opsets.items()):
            newest = newest_opset("" if domain == "ai.onnx" else domain)
            if newest is not None and opset > newest:
                problems.append(
                    f"{where} imports opset {opset} of {_domain_name(domain)}; onnxruntime "
                    f"{version} loads opsets up to {newest} of it (it refuses the file)."
                )
    functions = set(model.functions)
    seen: set[tuple[str, str, int]] = set()
    for node, node_opsets in _nodes(model):
        node_domain = "" if node.domain == "ai.onnx" else node.domain
        imported = node_opsets.get(node_domain)
        if imported is None and node_domain == "":
            imported = node_opsets.get("ai.onnx")
        if (node.domain, node.op_type, node.overload) in functions or imported is None:
            continue
        if (node_domain, node.op_type, imported) in seen:
            continue
        seen.add((node_domain, node.op_type, imported))
        problem = _kernel_problem(node_domain, node.op_type, imported, version)
        if problem is not None:
            problems.append(problem)
    return problems


def _nodes(model: ir.Model) -> Iterator[tuple[ir.Node, Mapping[str, int]]]:
    """Every node (subgraphs included) with the opset imports that apply to it."""
    owners: list[tuple[ir.Graph | ir.Function, Mapping[str, int]]] = [
        (model.graph, model.opset_imports)
    ]
    owners += [(f, {**model.opset_imports, **f.opset_imports}) for f in model.functions.values()]
    for owner, opsets in owners:
        stack: list[ir.Graph | ir.Function] = [owner]
        while stack:
            graph = stack.pop()
            for node in graph:
                yield node, opsets
                stack.extend(node_subgraphs(node))


def _kernel_problem(domain: str, op: str, opset: int, version: str) -> str | None:
    if domain not in onnx.defs.C.schema_version_map() or domain not in _kernel_domains():
        return None  # (a custom or contrib domain: onnx has no schema to tell the version)
    try:
        schema = onnx.defs.get_schema(op, opset, domain)
    except onnx.defs.SchemaError:
        return None  # (not an ONNX op at this opset: irkit.lint and the checker report it)
    if (domain, op) in _NO_KERNEL_NEEDED:
        return None
    since = schema.since_version
    spans = _kernel_ranges().get((domain, op), ())
    if any(start <= since <= end for start, end in spans):
        return None
    if getattr(schema, "has_function", False) or getattr(
        schema, "has_context_dependent_function", False
    ):
        return None  # (onnxruntime expands the op's function body)
    name = f"{domain}.{op}" if domain else op
    if not spans:
        return f"onnxruntime {version} has no CPU kernel for {name} (at any version)."
    listed = ", ".join(f"{a}" if b == a else f"{a}-{b if b < 2**30 else ''}" for a, b in spans)
    return (
        f"onnxruntime {version} has no CPU kernel for {name} version {since} (opset {opset}); "
        f"its kernels implement versions {listed}."
    )
