"""Fixtures for the ``irkit`` command-line tests: real files on disk and a subprocess runner.

The files are made once per session: a ``.pt2`` written by ``torch.export.save`` from a small
pre-LN transformer (tests/zoo.py), the stock exporter's unoptimized output of the same program
(``torch.onnx.export(..., dynamo=True, optimize=False)``), a program calling a custom op, and
an ONNX file that irkit.check rejects.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import pathlib
import subprocess
import sys

import onnx_ir as ir
import pytest
import torch

import irkit
from tests import zoo
from tests.cli import custom_ops

ROOT = pathlib.Path(__file__).resolve().parents[2]


@dataclasses.dataclass
class Files:
    dir: pathlib.Path
    x: torch.Tensor
    expected: list  # eager outputs (numpy)
    custom_x: torch.Tensor
    custom_expected: list

    def digests(self) -> dict[str, str]:
        """SHA-256 of every input file (the commands must never modify them)."""
        return {name: hashlib.sha256((self.dir / name).read_bytes()).hexdigest() for name in INPUTS}


INPUTS = ("stack2.pt2", "stock.onnx", "custom.pt2", "broken.onnx")

# A node carries irkit.call metadata for a function the model does not define: irkit.lint's
# problem (the doctest of irkit.check uses the same model).
_BROKEN = """<ir_version: 10, opset_import: ["" : 21, "pkg" : 1]>
g (float[2] x) => (float[2] y) { t = pkg.Missing(x)  y = pkg.Gone(t) }"""


@pytest.fixture(scope="session")
def files(tmp_path_factory) -> Files:
    from tests import helpers

    d = tmp_path_factory.mktemp("cli")
    zm = zoo.prenorm_stack(2)
    ep = torch.export.export(zm.module, zm.args)
    torch.export.save(ep, d / "stack2.pt2")
    stock = torch.onnx.export(ep, dynamo=True, optimize=False, verbose=False)
    stock.save(d / "stock.onnx")
    torch.manual_seed(0)
    module = custom_ops.UsesCustomOp().eval()
    custom_x = torch.randn(3, 8)
    torch.export.save(torch.export.export(module, (custom_x,)), d / "custom.pt2")
    broken = ir.from_onnx_text(_BROKEN)
    for node, fn in zip(broken.graph, ("pkg.mod.Missing", "pkg.mod.Gone"), strict=True):
        node.metadata_props["irkit.call"] = f'["m.{fn[8:].lower()}",0,"{fn}"]'
    irkit.save(broken, d / "broken.onnx")
    return Files(
        d,
        zm.args[0],
        helpers.flatten_outputs(zm.eager()),
        custom_x,
        helpers.flatten_outputs(module(custom_x)),
    )


def run(*args: str, cwd: pathlib.Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``irkit ARGS`` from this worktree, in a subprocess (``python -m irkit.cli``)."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "COLUMNS": "100",
        "NO_COLOR": "1",
    }
    return subprocess.run(
        [sys.executable, "-m", "irkit.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
