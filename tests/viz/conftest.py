"""Fixtures for the viz tests: hand-built hierarchical models saved to disk, a CLI runner."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys

import pytest

import irkit
from tests.viz import models

ROOT = pathlib.Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden" / "viz"
ARTIFACTS = ROOT / "tests" / "artifacts"


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory) -> pathlib.Path:
    d = tmp_path_factory.mktemp("viz_models")
    irkit.save(models.stack(3), d / "toy.onnx")
    irkit.save(models.fuse_mlp_gemm(models.stack(3)), d / "toy_fused.onnx")
    return d


@pytest.fixture(scope="session")
def toy(model_dir) -> pathlib.Path:
    return model_dir / "toy.onnx"


@pytest.fixture(scope="session")
def toy_fused(model_dir) -> pathlib.Path:
    return model_dir / "toy_fused.onnx"


def _require_program(path: str | None, what: str) -> str:
    """Skip when a system program is missing on a developer machine; fail under CI."""
    if path is None:
        if os.environ.get("CI"):
            pytest.fail(f"{what} is missing under CI: .ci/setup must install it")
        pytest.skip(f"{what} not installed (run .ci/setup)")
    return path


@pytest.fixture(scope="session")
def graphviz_dot() -> str:
    return _require_program(shutil.which("dot"), "Graphviz `dot`")


@pytest.fixture(scope="session")
def chromium() -> str:
    from tests.viz.cdp import find_chromium

    return _require_program(find_chromium(), "chromium")


def run_cli(*args: str | os.PathLike[str], env: dict[str, str] | None = None, cwd=None):
    """Run ``tools/viz.py`` as a subprocess with this worktree first on PYTHONPATH."""
    full_env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR")}
    full_env["PYTHONPATH"] = str(ROOT)
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, str(ROOT / "tools" / "viz.py"), *map(str, args)],
        capture_output=True,
        text=True,
        env=full_env,
        cwd=cwd,
        timeout=120,
    )


def check_golden(name: str, text: str) -> None:
    """Compare ``text`` with ``tests/golden/viz/<name>``; IRKIT_REGEN_GOLDEN=1 rewrites it."""
    path = GOLDEN / name
    if os.environ.get("IRKIT_REGEN_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    assert path.exists(), f"missing golden {path}; run with IRKIT_REGEN_GOLDEN=1"
    assert text == path.read_text(encoding="utf-8")
