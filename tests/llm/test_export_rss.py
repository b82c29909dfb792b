"""``irkit export``'s peak RSS on a 7B-shaped slice, projected to the whole 7B (issue 23 item 5).

``bench/bench_export_7b.py --layers 1 --vocab 8000`` writes one Llama-2-7B layer (hidden 4096,
intermediate 11008) as fp16 shards, and runs ``irkit export`` (fp32 output: each tensor converted
while streamed) in a child process that reports its own ``VmHWM``. The peak is the imports and
the traced graph plus one tensor being converted (6 bytes per element of the largest); the whole
7B (32 layers, vocab 32000: largest tensor 32000 × 4096) is projected as

    peak(7B) ≈ peak(slice) − 6 × largest(slice) + 6 × largest(7B)

The goal (under 2 GB) is irkit's export memory: the imports are not irkit's, and they differ by
torch build: ``import torch, transformers, onnxruntime, irkit.llm`` holds about 0.31 GB with the
CPU torch 2.13.0 the goal was set with, 0.67 GB with the CUDA build of torch 2.15.0 (its CUDA
libraries loaded on a CPU-only machine too). So the child reports its resident set after those
imports (``imports_rss_bytes``, before any export work) and the test bounds irkit's own part,
the projected peak less that baseline, at 2 GB less the CPU build's 0.31 GB: 1.69 GB. The
measured slice's whole peak, imports included, stays under 2 GB (an absolute bound, whatever
torch is installed). bench/bench_export_7b.py measures the whole 7B. The exported folder must
load in genai's ``og.Model`` and generate.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
GB = 10**9
#: What ``import torch, transformers, onnxruntime, irkit.llm`` holds with the CPU torch 2.13.0
#: the 2 GB goal was set with (docs/large_models.md); irkit's own part gets the rest.
CPU_IMPORTS = 310 * 10**6


@pytest.mark.slow
def test_7b_slice_export_peak_rss_and_projection(tmp_path):
    if shutil.disk_usage(tmp_path).free < 4 * GB:
        pytest.skip(f"{tmp_path}: less than 4 GB free for the 2.8 GB slice and its export")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "bench_export_7b.py"),
            "--layers",
            "1",
            "--vocab",
            "8000",
            "--precision",
            "fp32",
            "--workdir",
            str(tmp_path),
            "--json",
        ],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    figures = json.loads(proc.stdout.strip().splitlines()[-1])
    params = 2 * 8000 * 4096 + 4096 + (4 * 4096 * 4096 + 3 * 11008 * 4096 + 2 * 4096)
    assert figures["parameters"] == params
    assert figures["checkpoint_bytes"] == 2 * params  # fp16 shards
    assert figures["output_bytes"] >= 4 * params  # fp32 model.onnx.data
    peak, projected = figures["peak_rss_bytes"], figures["projected_7b_peak_rss_bytes"]
    # the slice's largest tensor is an MLP weight (11008 × 4096), the 7B's the embedding
    assert projected == peak - 6 * 11008 * 4096 + 6 * 32000 * 4096
    imports = figures["imports_rss_bytes"]  # the child's resident set after its imports
    assert 0 < imports < peak, figures
    assert peak < 2 * GB, figures  # the slice, imports included: absolute
    assert projected - imports < 2 * GB - CPU_IMPORTS, figures  # irkit's own part of the 7B
    genai = figures["genai"]["irkit"]  # the folder loads in og.Model and generates 8 tokens
    assert genai["ok"] and len(genai["ids"]) == 8, genai
    assert not (tmp_path / "hf").exists() and not (tmp_path / "onnx").exists()
