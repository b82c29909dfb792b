"""The causal-LM zoo through irkit and onnxruntime: greedy ids equal transformers ``generate``.

Each architecture of :data:`tests.llm_zoo.ZOO` is exported once with
:func:`irkit.llm.export_causal_lm`, lowered once, then optimized for each target as users do
(``irkit.optimize``, ``"onnx"`` and ``"ort"``). :func:`irkit.llm.generate_greedy` runs a
prefill and 16 decode steps in onnxruntime, feeding ``present.*`` back as ``past_key_values.*``;
the ids must equal ``model.generate(do_sample=False, max_new_tokens=16)`` for one prompt and
for a left-padded batch of two prompts of different lengths. Prompt plus new tokens exceed the
zoo's sliding window, so windowed layers are exercised.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

import irkit
from irkit.llm import export_causal_lm, generate_greedy
from tests.helpers import ort_session
from tests.llm_zoo import BY_NAME, SLIDING_WINDOW, VOCAB, ZOO

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

pytestmark = pytest.mark.slow

NEW_TOKENS = 16
PAD, EOS = 0, 2  # the zoo's special tokens


def _prompts() -> list[tuple[np.ndarray, np.ndarray]]:
    """Batch 1 (6 tokens) and batch 2 (6 tokens; 3 tokens left-padded to 6)."""
    ids = np.random.default_rng(0).integers(3, VOCAB, (2, 6), dtype=np.int64)
    mask = np.ones_like(ids)
    ids[1, :3], mask[1, :3] = PAD, 0
    assert ids.shape[1] + NEW_TOKENS > SLIDING_WINDOW
    return [(ids[:1], mask[:1]), (ids, mask)]


@functools.cache
def _lowered(name: str):
    lm = BY_NAME[name].model()
    exported = export_causal_lm(lm)
    return lm, irkit.lower(exported.program, **exported.lower_kwargs())


@functools.cache
def _expected(name: str) -> list[np.ndarray]:
    lm, _ = _lowered(name)
    with torch.no_grad():
        return [
            lm.generate(
                torch.from_numpy(ids),
                attention_mask=torch.from_numpy(mask),
                do_sample=False,
                max_new_tokens=NEW_TOKENS,
                eos_token_id=EOS,
                pad_token_id=PAD,
            ).numpy()
            for ids, mask in _prompts()
        ]


#: irkit's own loop on the standard target: a few architectures (tests/llm/test_genai_zoo_*.py
#: run every one of them through ``irkit export`` in onnxruntime-genai's Generator).
ONNX_TARGET = ("llama", "gemma3_text", "deepseek_v3", "bloom")


def cases(half: int) -> list[object]:
    """The (arch, target) cases of one half of the zoo: the halves are two files, which
    pytest-xdist (``--dist loadfile``) runs on different cores."""
    return [
        pytest.param(a.name, t, id=f"{a.name}-{t}")
        for a in ZOO[half::2]
        for t in ("onnx", "ort")
        if t == "ort" or a.name in ONNX_TARGET
    ]


def check_greedy_ids(arch: str, target: str) -> None:
    """irkit's greedy loop on the optimized model gives transformers ``generate``'s ids."""
    _, model = _lowered(arch)
    session = ort_session(irkit.optimize(model.clone(), target))
    for (ids, mask), expected in zip(_prompts(), _expected(arch), strict=True):
        got = generate_greedy(
            session, ids, mask, max_new_tokens=NEW_TOKENS, eos_token_id=EOS, pad_token_id=PAD
        )
        np.testing.assert_array_equal(got, expected, err_msg=f"{arch}, batch {len(ids)}")


@pytest.mark.parametrize(("arch", "target"), cases(0))
def test_greedy_ids_equal_generate(arch, target):
    check_greedy_ids(arch, target)


def test_zoo_is_the_issue_list():
    assert [a.name for a in ZOO] == [
        "llama",
        "mistral",
        "qwen2",
        "qwen3",
        "qwen3_moe",
        "phi",
        "phi3",
        "gemma",
        "gemma2",
        "gemma3_text",
        "gpt2",
        "gpt_neox",
        "gptj",
        "falcon",
        "olmo",
        "olmo2",
        "granite",
        "stablelm",
        "starcoder2",
        "cohere",
        "smollm3",
        "mixtral",
        "deepseek_v3",
        "bloom",
        "opt",
        "mpt",
        "codegen",
    ]
