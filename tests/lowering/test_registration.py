"""``@own`` registration: records made next to each own lowering, collected into one table."""

from __future__ import annotations

import sys
import types

import pytest
import torch
from onnxscript.function_libs.torch_lib import ops  # noqa: F401  (registers torchlib)
from onnxscript.function_libs.torch_lib.registration import default_registry

from irkit.errors import LoweringError
from irkit.lowering._own import own_lowerings
from irkit.lowering._registration import OwnLowering, collect, own, torchlib, torchlib_gap

aten = torch.ops.aten


def test_the_table_holds_decorated_factory_made_and_delegating_lowerings():
    table = own_lowerings()
    # @own stacked on one function: every overload it names.
    conv = {table[t].fn for t in (aten.conv1d.default, aten.conv2d.default, aten.conv3d.default)}
    assert len(conv) == 1 and next(iter(conv)).__name__ == "_conv_no_bias"
    assert table[aten.dropout.default].identity and table[aten.dropout.default].applies
    # A delegation is torchlib's own function, resolved when the table is built.
    expected = default_registry["aten::all"].overloads[0]
    assert table[aten._is_all_true.default].fn is expected
    # A factory's product, registered by assignment (pooling per spatial rank).
    assert table[aten.avg_pool2d.default].fn is not table[aten.avg_pool3d.default].fn
    # torchlib's gaps are records without a lowering of their own ...
    gap = table[aten.cross_entropy_loss.default]
    assert gap.fn is None and gap.torchlib_gap is not None
    # ... or with one for some nodes (a masked 4-D SDPA) and a gap for others (not 4-D).
    sdpa = table[aten.scaled_dot_product_attention.default]
    assert sdpa.fn is not None and sdpa.applies is not None and sdpa.torchlib_gap is not None
    assert all(record.target == target for target, record in table.items())


def _module(**names: object) -> types.ModuleType:
    module = types.ModuleType("fake_own")
    vars(module).update(names)
    return module


def test_a_library_op_is_present_only_while_registered():
    @own("irkit_test_absent::op")
    def lower(x):
        return x

    assert collect([_module(lower=lower)]) == {}


def test_two_records_for_one_target_are_a_bug_not_a_silent_overwrite():
    @own(aten.hypot.default)
    def first(x, y):
        return x

    @torchlib_gap(aten.hypot.default)
    def gap(node):
        return True

    with pytest.raises(LoweringError, match="two own lowerings of aten::hypot"):
        collect([_module(first=first, gap=gap)])


def test_a_torchlib_reference_resolves_lazily_and_names_a_missing_function():
    reference = torchlib("aten::irkit_no_such_op")  # nothing is looked up yet
    record = OwnLowering(aten.hypot.default, reference)
    with pytest.raises(LoweringError, match="aten::irkit_no_such_op"):
        collect([_module(record=record)])
    assert torchlib("aten::sort").resolve() is default_registry["aten::sort"].overloads[0]


def test_the_own_modules_export_no_tables():
    """The records are the registry: no module keeps a second, hand-kept table."""
    for name, module in list(sys.modules.items()):
        if name.startswith("irkit.lowering._own"):
            assert not [
                n for n in vars(module) if n.endswith("_lowerings") and n != "own_lowerings"
            ]
