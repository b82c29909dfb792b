"""The bundled demo: lower a small Llama (random weights) and print a one-screen summary.

Run with ``python -m irkit.demo [--out demo.onnx] [--layers N]``. Needs the ``demo`` extra
(transformers; onnxruntime for the numbers check). Nothing is downloaded: the model is built
from a tiny config with random weights.
"""

from __future__ import annotations

import argparse
import pathlib
import shlex
import sys
import time

import torch

import irkit
from irkit.rewriting import count_nodes


def build_model(layers: int) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=256,
        max_position_embeddings=128,
        use_cache=False,
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


def summary(model, path: pathlib.Path) -> str:
    """The viewer's call tree of ``model`` (what ``irkit view`` prints), two levels deep."""
    from irkit import viz

    return viz.render_text(viz.summarize(model, name=path.name), viz.TextOptions(depth=2))


def view_command(path: pathlib.Path) -> str:
    """The suggested next command: the one-file HTML page of the saved model, next to it.

    With the default ``--out`` both files (``demo.onnx``, ``demo.html``) are ones git ignores.
    """
    html = path.with_suffix(".html")
    return f"irkit view {shlex.quote(str(path))} -o {shlex.quote(str(html))}"


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
    lowered = time.perf_counter() - start
    flat_nodes = count_nodes(model)
    report = irkit.RewriteReport()
    irkit.optimize(model, report=report)
    path = pathlib.Path(irkit.save(model, args.out))
    fired = ", ".join(f"{rule} ×{n}" for rule, n in report.fired.items()) or "none"
    print(f"irkit {irkit.__version__}: Llama, {args.layers} layers, random weights")
    print(
        f"  lower     {len(ep.graph.nodes)} FX nodes -> {len(model.functions)} functions + main "
        f"graph, {flat_nodes} stored ONNX nodes, {lowered:.2f}s"
    )
    print(
        f"  optimize  -> {report.nodes_after} nodes in {report.seconds:.2f}s; rules fired: {fired}"
    )
    print(f"  saved     {path} ({path.stat().st_size / 1e6:.1f} MB)")
    print("  " + _check_numbers(path, module, inputs))
    print()
    print(summary(model, path), end="")
    print(f"\nnext: {view_command(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
