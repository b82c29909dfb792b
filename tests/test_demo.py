"""The README's first command runs the bundled demo: it must keep working."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_demo_lowers_optimizes_saves_and_matches_pytorch(tmp_path):
    out = tmp_path / "demo.onnx"
    proc = subprocess.run(
        [sys.executable, "-m", "irkit.demo", "--out", str(out), "--layers", "2"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    assert out.exists()
    diff = float(re.search(r"max abs diff ([0-9.e+-]+)", text).group(1))
    assert diff <= 1e-4
    assert "layers.0 … layers.1  LlamaDecoderLayer ×2" in text
    assert "RMSNormalization" in text
    assert len(text.splitlines()) <= 40  # one screen
    assert text.endswith(f"\nnext: irkit view {out} -o {out.with_suffix('.html')}\n")


def test_demo_suggests_irkit_view_writing_only_what_git_ignores():
    """The default run writes demo.onnx and suggests demo.html: neither may dirty a checkout."""
    from irkit import demo

    command = demo.view_command(pathlib.Path("demo.onnx"))
    assert command == "irkit view demo.onnx -o demo.html"
    written = ["demo.onnx", "demo.html"]
    ignored = subprocess.run(
        ["git", "check-ignore", *written], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert ignored.stdout.split() == written, ignored
