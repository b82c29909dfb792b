"""What each site gets (bits, or excluded: ``exclude=``/``bits_for=`` by module path), shared
bodies copied apart where their calls want different settings, and the report's notes."""

from __future__ import annotations

import dataclasses
import fnmatch
from collections.abc import Mapping, Sequence

import onnx_ir as ir

from irkit.rules._calls import (
    Calls,
    Instance,
    Owner,
    Specializer,
    chain_path,
    chains,
    node_path,
    owner_name,
    owners,
)
from irkit.rules.quantize._options import Embeddings, Settings
from irkit.rules.quantize._packer import Packer
from irkit.rules.quantize._report import QuantizeReport, SkippedNode
from irkit.rules.quantize._sites import (
    DYNAMIC_OP,
    IN_SUBGRAPH,
    MS,
    QUANTIZED_OP,
    Chosen,
    Site,
    candidates,
    constant_leaves,
    find_site,
)


def _matches(pattern: str, path: str, name: str) -> bool:
    """``pattern`` names this module (or one above it), or the node by name."""
    return (
        fnmatch.fnmatchcase(path, pattern)
        or fnmatch.fnmatchcase(path, pattern + ".*")
        or fnmatch.fnmatchcase(name, pattern)
    )


@dataclasses.dataclass(frozen=True)
class Choice:
    """What the options ask for one module: its bits, or ``None`` (excluded)."""

    default: int
    exclude: tuple[str, ...]
    bits_for: Mapping[str, int]

    def setting(self, path: str, name: str) -> int | None:
        if any(_matches(p, path, name) for p in self.exclude):
            return None
        return next((b for p, b in self.bits_for.items() if _matches(p, path, name)), self.default)


def _settings_of(owner: Owner, node: ir.Node, calls: Calls, choice: Choice) -> list[Instance]:
    """``(chain, module path, setting)`` for each instance of a node."""
    base = node_path(node)
    out = []
    for chain in chains(owner, calls):
        path = chain_path(owner, base, chain)
        out.append((chain, path, choice.setting(path, node.name or "")))
    return out


def _choose_bits(instances: Sequence[Instance]) -> int | str:
    """The bits for a site, or why it is left alone (excluded, or its instances disagree)."""
    settings = {s for _, _, s in instances}
    if len(settings) > 1:
        shown = ", ".join(
            f"{p}: {'excluded' if b is None else f'{b} bits'}" for _, p, b in instances
        )
        return (
            f"a shared function body whose calls want different settings ({shown}) and that no "
            "level of calls parts: give them one setting, or outline them apart"
        )
    (bits,) = settings
    return "excluded by exclude=" if bits is None else bits


def specialize(model: ir.Model, choice: Choice, settings: Settings) -> list[str]:
    """Copy shared bodies until every quantizable node's calls want one setting (or no level of
    calls can part them)."""
    specializer = Specializer(model)
    for _ in range(_MAX_SPECIALIZE_ROUNDS):
        if not _specialize_one(model, choice, settings, specializer):
            break
    calls = Calls.of(model)
    for ident in specializer.key_of_copy:  # a copy whose calls all moved on to later copies
        if ident in model.functions and not calls.by_function.get(ident):
            del model.functions[ident]
    return specializer.notes


_MAX_SPECIALIZE_ROUNDS = 1000


def _specialize_one(
    model: ir.Model, choice: Choice, settings: Settings, specializer: Specializer
) -> bool:
    """Part the instances of the first node that needs it, one level; whether one was found."""
    calls = Calls.of(model)
    for owner, node, top in candidates(model, settings.embeddings is not Embeddings.NONE):
        if not top or not isinstance(owner, ir.Function):
            continue
        instances = _settings_of(owner, node, calls, choice)
        if len({s for _, _, s in instances}) < 2:
            continue
        quantizable = isinstance(find_site(owner, node, calls, settings), Site)
        if quantizable and specializer.specialize(owner, instances):
            return True
    return False


def collect(
    model: ir.Model, calls: Calls, choice: Choice, packer: Packer, result: QuantizeReport
) -> list[Chosen]:
    """The sites to quantize (each weight packed already); the others go to the report."""
    sites: list[Chosen] = []
    settings = packer.settings
    found = list(candidates(model, settings.embeddings is not Embeddings.NONE))
    tied = (
        _multiplied_tables(found, calls, settings)
        if settings.embeddings is Embeddings.TIED
        else None
    )
    for owner, node, top in found:
        instances = _settings_of(owner, node, calls, choice)
        shown = tuple(p for _, p, _ in instances if p)
        site = find_site(owner, node, calls, settings) if top else IN_SUBGRAPH
        if tied is not None and isinstance(site, Site) and node.op_type == "Gather":
            leaves = constant_leaves(site.owner, site.weight, calls)
            if isinstance(leaves, str) or not any(id(t) in tied for t in leaves):
                site = "a table no quantized product multiplies by (embeddings='tied')"
        chosen = site if isinstance(site, str) else _choose_bits(instances)
        if not isinstance(site, str) and not isinstance(chosen, str):
            problem = packer.prepare(site, chosen)  # (every weight packed before any change)
            if problem is None:
                sites.append((site, chosen, shown))
                continue
            chosen = problem
        reason = site if isinstance(site, str) else str(chosen)
        where = owner_name(owner)
        result.skipped.append(SkippedNode(node.name or "", node.op_type, where, shown, reason))
    return sites


def note_quantized(model: ir.Model, sites: Sequence[Chosen], result: QuantizeReport) -> None:
    for op in (QUANTIZED_OP, DYNAMIC_OP):
        already = sum(
            1 for owner in owners(model) for n in owner if n.domain == MS and n.op_type == op
        )
        if already:
            result.notes.append(f"the model already holds {already} {op} node(s)")
    if not sites:
        result.notes.append("nothing was quantized")


def _multiplied_tables(
    found: Sequence[tuple[Owner, ir.Node, bool]], calls: Calls, settings: Settings
) -> set[int]:
    """The ids of the constant tensors the product sites among ``found`` multiply by through a
    transposition (a tied lm_head's ``MatMul(x, Transpose(E))``): the tables ``Embeddings.TIED``
    quantizes where they are gathered too."""
    tables: set[int] = set()
    for owner, node, top in found:
        if not top or node.op_type == "Gather":
            continue
        site = find_site(owner, node, calls, settings)
        if not isinstance(site, Site) or not site.transposed:
            continue
        leaves = constant_leaves(site.owner, site.weight, calls)
        if not isinstance(leaves, str):
            tables.update(id(t) for t in leaves)
    return tables


def note_tied(sites: Sequence[Chosen], calls: Calls, result: QuantizeReport) -> None:
    """Say, for each table both gathered and multiplied by (a tied embedding / lm_head),
    whether one packed initializer serves both ops (same bits) or each gets its own."""
    uses: dict[int, tuple[str, set[tuple[str, int]]]] = {}
    for site, bits, _ in sites:
        leaves = constant_leaves(site.owner, site.weight, calls)
        if isinstance(leaves, str) or not site.transposed:
            continue
        kind = "GatherBlockQuantized" if site.node.op_type == "Gather" else QUANTIZED_OP
        for tensor in leaves:
            name = tensor.name or site.weight.name or "?"
            uses.setdefault(id(tensor), (name, set()))[1].add((kind, bits))
    for name, kinds in uses.values():
        if len({k for k, _ in kinds}) < 2:
            continue
        shown = ", ".join(f"{k} at {b} bits" for k, b in sorted(kinds))
        if len({b for _, b in kinds}) == 1:
            result.notes.append(f"tied {name!r}: one packed initializer for {shown}")
        else:
            result.notes.append(
                f"tied {name!r}: packed once per bit width ({shown}): give both one setting "
                "to share one initializer"
            )
