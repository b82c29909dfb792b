"""Suite-wide test configuration: the fast lane.

Property tests (hypothesis) are derandomized: every run draws the same examples.
``python -m pytest -m "not slow"`` is the fast lane (torch-free stages, small exports; under a
minute); ``python -m pytest`` (what CI runs) runs everything. Tests in the files under
directories owned by other work streams are marked here by module instead of by decorator;
move the mark into those files (``@pytest.mark.slow``) when convenient and shorten this list.
"""

from __future__ import annotations

import os
import sys

import pytest
from hypothesis import settings

# torch.export's fake-tensor dispatch cache off in the suite and the commands it starts: with
# dynamic shapes a cache hit rebuilds the op's output from symbolic sizes, which costs more than
# the meta function it memoizes (a 2-layer Llama of the arch zoo exports in ~35% less time). It
# only memoizes, so the programs are the ones users get: export_causal_lm turns it off itself,
# tests/llm/test_export_causal_lm.py compares both programs, and the arch zoo's t5, wav2vec2,
# qwen2_moe and swin gave the same graph, signature and ranges on and off (2026-11-28).
os.environ.setdefault("TORCH_FAKE_TENSOR_DISPATCH_CACHE", "0")
if "torch._dynamo.config" in sys.modules:  # imported before this file: the flag was read
    sys.modules["torch._dynamo.config"].fake_tensor_cache_enabled = (
        os.environ["TORCH_FAKE_TENSOR_DISPATCH_CACHE"] == "1"
    )

# Under pytest-xdist the workers share the cores: torch's intra-op pool sized for every core in
# each worker would oversubscribe them (workers × cores threads), so each gets its share.
if os.environ.get("PYTEST_XDIST_WORKER"):
    import torch

    _WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // _WORKERS))

# Property tests draw the same examples on every run (CI must not pass or fail by luck);
# HYPOTHESIS_PROFILE=explore draws new ones, to look for failures locally.
settings.register_profile("deterministic", derandomize=True)
settings.register_profile("explore", derandomize=False, max_examples=200)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "deterministic"))

# Each test in these modules takes seconds: transformers models through torch.export, the CLI
# in a subprocess per test, or a real Chromium.
SLOW_MODULES = frozenset(
    {
        "tests/lowering/test_more_models.py",
        "tests/lowering/test_zoo.py",
        "tests/lowering/test_golden_and_metadata.py",
        "tests/viz/test_browser.py",
        "tests/viz/test_cli_errors.py",
        "tests/viz/test_lowered.py",
        "tests/viz/test_outlined.py",
        "tests/viz/test_svg_diff.py",
        "tests/viz/test_text.py",
        # The fast lane stays under a minute of wall time on 2 cores: these run in CI only.
        "tests/conformance/test_opinfo.py",
        "tests/lowering/test_arch_zoo.py",
        "tests/lowering/test_control_flow.py",
        "tests/viz/test_no_graphviz.py",
        "tests/scale/test_memory.py",
    }
)


# Files of a few long tests (seconds per test, measured with a per-test duration log: a 7B-shaped
# export in a child process, whole-CLI runs, Qwen3.5/RWKV exports): handed out first. xdist hands
# out whole files (``--dist loadfile``) in this order (``--no-loadscope-reorder``); its own order,
# most tests first, left these last, one worker running a 30 s test alone at the end.
RUN_FIRST = (
    "tests/llm/test_export_rss.py",
    "tests/llm/test_export_without_cache.py",
    "tests/llm/test_state_models.py",
    "tests/llm/test_stacked_states.py",
    "tests/test_automodel_sweep.py",
    "tests/viz/test_browser.py",
    "tests/cli/test_lower.py",
    "tests/llm/test_export_split_weights.py",
    "tests/viz/test_no_graphviz.py",
    "tests/lowering/test_base_models.py",
    "tests/cli/test_session.py",
    "tests/test_demo.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = config.rootpath
    for item in items:
        if item.path.relative_to(root).as_posix() in SLOW_MODULES:
            item.add_marker(pytest.mark.slow)


class _LongFilesFirst:
    """Orders the run's items: the files of ``RUN_FIRST``, then the others, most tests first.

    Runs last among the collection hooks, after ``-m``/``-k`` deselected: the counts are the
    run's own (the fast lane's files are not the whole suite's)."""

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(
        self, config: pytest.Config, items: list[pytest.Item]
    ) -> None:
        root = config.rootpath
        files: dict[str, int] = {}
        for item in items:
            path = item.path.relative_to(root).as_posix()
            files[path] = files.get(path, 0) + 1

        def order(item: pytest.Item) -> tuple[int, int]:
            path = item.path.relative_to(root).as_posix()
            if path in RUN_FIRST:
                return (0, RUN_FIRST.index(path))
            return (1, -files[path])  # then xdist's own order: most tests first

        items.sort(key=order)  # (stable: a file's tests keep their order)


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(_LongFilesFirst(), "irkit-long-files-first")
