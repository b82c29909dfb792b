"""Part 1 of the causal-LM zoo through ``irkit export`` and onnxruntime-genai's ``Generator``.

What is checked and why is in :mod:`tests.llm.genai_zoo`; the zoo is split into three files so
that pytest-xdist (``--dist loadfile``) runs the parts on different cores.
"""

from __future__ import annotations

import pytest

from tests.llm import genai_zoo as zoo

pytestmark = pytest.mark.slow

NAMES = zoo.part(1)


@pytest.fixture(scope="module", params=zoo.TARGETS[:1])  # (target onnx: part 0, zoo.TARGETS)
def target(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def exported(target: str, tmp_path_factory: pytest.TempPathFactory):
    return zoo.make_exported(tmp_path_factory, target)


@pytest.mark.parametrize("name", NAMES)
def test_genai_generator_equals_generate(exported, target, name):
    zoo.check_generator(exported, name, target)


@pytest.mark.parametrize("name", NAMES)
def test_tokenizer_and_chat_template(exported, name):
    zoo.check_tokenizer(exported, name)
