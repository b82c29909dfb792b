"""Benchmark: ``irkit optimize`` vs onnxslim on the stock exporter's unoptimized output.

The models are what a user of ``torch.onnx.export`` gets (``dynamo=True, optimize=False``) from
tests/zoo.py: pre-LN stacks of 4/16 layers, GPT-2, Llama (tiny configs, random weights). Each
optimizer runs on a fresh in-memory copy in its native form (``onnx_ir.Model`` for
``irkit.optimize`` — what ``irkit optimize`` runs —, ``onnx.ModelProto`` for ``onnxslim.slim``);
conversions are not timed. Prints per model: nodes before, best time and nodes after for each,
the time ratio onnxslim/irkit (higher is better for irkit), and the largest difference of each
output from the unoptimized model's in onnxruntime.

onnxslim is not an irkit dependency: install it in the benchmark's environment, e.g.
``python -m venv --system-site-packages .venv && .venv/bin/pip install onnxslim``.

Usage:  python bench/bench_onnxslim.py [--quick] [--repeat N]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import math
import pathlib
import sys
import time
import warnings

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import onnx_ir as ir  # noqa: E402
import torch  # noqa: E402

import irkit  # noqa: E402
from irkit.rewriting import count_nodes  # noqa: E402
from tests import helpers, zoo  # noqa: E402


def _zoo_model(name: str) -> zoo.ZooModel:
    if name.startswith("stack"):
        return zoo.prenorm_stack(int(name[5:]))
    return zoo.load(name)


def _stock(zm: zoo.ZooModel) -> bytes:
    ep = torch.export.export(zm.module, zm.args, zm.kwargs)
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = torch.onnx.export(ep, dynamo=True, optimize=False, verbose=False).model
    return ir.serde.serialize_model(model).SerializeToString()


def _irkit(data: bytes) -> tuple[float, bytes]:
    model = ir.serde.deserialize_model(onnx.load_from_string(data))
    t0 = time.perf_counter()
    irkit.optimize(model)
    seconds = time.perf_counter() - t0
    return seconds, ir.serde.serialize_model(model).SerializeToString()


def _onnxslim(data: bytes) -> tuple[float, bytes]:
    import onnxslim

    proto = onnx.load_from_string(data)
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        slim = onnxslim.slim(proto)
    seconds = time.perf_counter() - t0
    return seconds, slim.SerializeToString()


def _best(fn, data: bytes, repeat: int) -> tuple[float, bytes]:
    best, out = math.inf, b""
    for _ in range(repeat):
        seconds, out = fn(data)
        best = min(best, seconds)
    return best, out


def _nodes(data: bytes) -> int:
    return count_nodes(ir.serde.deserialize_model(onnx.load_from_string(data)))


def _max_diff(data: bytes, reference: list[np.ndarray], zm: zoo.ZooModel) -> float:
    inputs = [*zm.args, *zm.kwargs.values()]
    out = helpers.run_ort(ir.serde.deserialize_model(onnx.load_from_string(data)), inputs)
    return max(
        float(np.max(np.abs(a.astype(np.float64) - r.astype(np.float64))))
        for a, r in zip(out, reference, strict=True)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="stack4 and gpt2 only, one repeat")
    parser.add_argument("--repeat", type=int, default=3, help="repeats per optimizer (best of)")
    args = parser.parse_args()
    try:
        import onnxslim
    except ImportError:
        sys.exit("onnxslim is not installed here (pip install onnxslim in a benchmark venv)")
    logging.disable(logging.WARNING)
    repeat = 1 if args.quick else args.repeat
    names = ["stack4", "gpt2"] if args.quick else ["stack4", "stack16", "gpt2", "llama"]
    print(f"onnxslim {onnxslim.__version__}, irkit {irkit.__version__}, torch {torch.__version__}")
    warm = _stock(_zoo_model("stack4"))  # imports and registries outside the measurement
    _irkit(warm)
    _onnxslim(warm)
    header = (
        f"{'model':<8} {'nodes':>6} | {'irkit s':>8} {'nodes':>6} {'max diff':>9} | "
        f"{'slim s':>8} {'nodes':>6} {'max diff':>9} | {'slim/irkit':>10}"
    )
    print(header)
    print("-" * len(header))
    for name in names:
        zm = _zoo_model(name)
        stock = _stock(zm)
        inputs = [*zm.args, *zm.kwargs.values()]
        reference = helpers.run_ort(ir.serde.deserialize_model(onnx.load_from_string(stock)), inputs)
        t_irkit, out_irkit = _best(_irkit, stock, repeat)
        t_slim, out_slim = _best(_onnxslim, stock, repeat)
        print(
            f"{name:<8} {_nodes(stock):>6} | {t_irkit:>8.3f} {_nodes(out_irkit):>6} "
            f"{_max_diff(out_irkit, reference, zm):>9.1e} | {t_slim:>8.3f} {_nodes(out_slim):>6} "
            f"{_max_diff(out_slim, reference, zm):>9.1e} | {t_slim / t_irkit:>9.1f}×",
            flush=True,
        )


if __name__ == "__main__":
    main()
