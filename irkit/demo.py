"""The bundled demo: lower a small Llama (random weights) and print a one-screen summary.

Run with ``python -m irkit.demo [--out demo.onnx] [--layers N]``. Needs the ``demo`` extra
(transformers; onnxruntime for the numbers check). Nothing is downloaded: the model is built
from a tiny config with random weights.
"""

from __future__ import annotations

import argparse
import collections
import pathlib
import sys
import time

import torch

import irkit


def build_model(layers: int) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=layers, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=256, max_position_embeddings=128, use_cache=False,
    )
    model = LlamaForCausalLM(config).eval()
    return model, (torch.randint(0, 256, (2, 16)),)


def _check_numbers(model_path: pathlib.Path, module: torch.nn.Module, args: tuple) -> str:
    try:
        import numpy as np
        import onnxruntime as ort
    except ImportError:
        return "numbers: skipped (pip install onnxruntime to compare with PyTorch)"
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(model_path), opts, providers=["CPUExecutionProvider"])
    (logits,) = session.run(None, {session.get_inputs()[0].name: args[0].numpy()})
    with torch.no_grad():
        expected = module(*args).logits.numpy()
    return f"numbers: onnxruntime vs eager PyTorch, max abs diff {np.max(np.abs(logits - expected)):.2e}"


def summary(model, seconds: float, fx_nodes: int, path: pathlib.Path) -> str:
    """A one-screen text summary of a lowered model."""
    from irkit import metadata

    lines = [f"irkit {irkit.__version__}: {fx_nodes} FX nodes -> {len(model.graph)} ONNX nodes "
             f"in {seconds:.2f}s, saved to {path} ({path.stat().st_size / 1e6:.1f} MB)"]
    for value in model.graph.inputs:
        lines.append(f"  input  {value.name}: {value.dtype.name.lower()}{list(value.shape)}")
    for value in model.graph.outputs:
        lines.append(f"  output {value.name}: {value.dtype.name.lower()}{list(value.shape)}")
    modules = collections.Counter()
    for node in model.graph:
        scope = metadata.node_scope(node.metadata_props)
        if scope:
            modules[scope[0].class_name] += 1
    lines.append("  nodes per top-level module class: "
                 + ", ".join(f"{cls} {n}" for cls, n in modules.most_common()))
    ops = collections.Counter(node.op_type for node in model.graph)
    lines.append("  ops: " + ", ".join(f"{op} {n}" for op, n in ops.most_common(12)))
    params = sum(v.const_value.size for v in model.graph.initializers.values())
    lines.append(f"  {len(model.graph.initializers)} initializers, {params:,} parameters")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="demo.onnx", help="where to save the model")
    parser.add_argument("--layers", type=int, default=4, help="decoder layers")
    args = parser.parse_args(argv)

    module, inputs = build_model(args.layers)
    with torch.no_grad():
        ep = torch.export.export(module, inputs)
    start = time.perf_counter()
    model = irkit.lower(ep)
    seconds = time.perf_counter() - start
    path = irkit.save(model, args.out)
    print(summary(model, seconds, len(ep.graph.nodes), pathlib.Path(path)))
    print("  " + _check_numbers(pathlib.Path(path), module, inputs))
    print(f"next: python tools/viz.py {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
