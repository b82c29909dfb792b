"""The other half of the causal-LM zoo in irkit's own loop (see :mod:`tests.llm.test_llm_zoo`)."""

from __future__ import annotations

import pytest

from tests.llm.test_llm_zoo import cases, check_greedy_ids

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(("arch", "target"), cases(1))
def test_greedy_ids_equal_generate(arch, target):
    check_greedy_ids(arch, target)
