"""``irkit quantize`` on files: the round trip, the printed report, usage errors."""

from __future__ import annotations

import numpy as np

import irkit
from irkit.cli import main
from tests.helpers import op_histogram, run_ort
from tests.quantize import support


def test_cli_round_trip(tmp_path, capsys):
    model, inits = support.shared_blocks()
    source, out = tmp_path / "in.onnx", tmp_path / "out.onnx"
    irkit.save(model, source)
    before = source.read_bytes()
    argv = [str(source), "-o", str(out), "--bits", "8", "--block-size", "64", "--asymmetric"]
    assert main(["quantize", *argv, "--accuracy-level", "0"]) == 0
    assert source.read_bytes() == before
    printed = capsys.readouterr().out
    assert "quantize: 1 node(s) → MatMulNBits, 0 skipped, 2 function(s) changed" in printed
    quantized = irkit.load(out)
    lin = quantized.functions[("local", "Lin", "")]
    assert op_histogram(lin) == {"com.microsoft::MatMulNBits": 1}
    (node,) = lin
    assert node.attributes["bits"].value == 8 and node.attributes["block_size"].value == 64
    assert [v.name for v in lin.inputs] == ["x", "w_Q8", "w_scales", "w_zero_points"]
    x = np.ones((2, 3, 64), np.float32)
    expected = support.shared_blocks_reference(x, inits, bits=8, block_size=64, symmetric=False)
    (y,) = run_ort(out, [x])
    np.testing.assert_allclose(y, expected, atol=1e-3, rtol=1e-4)


def test_cli_exclude_reports_the_skipped_matmul(tmp_path, capsys):
    model, _ = support.shared_blocks()
    source, out = tmp_path / "in.onnx", tmp_path / "out.onnx"
    irkit.save(model, source)
    assert main(["quantize", str(source), "-o", str(out), "--exclude", "block*"]) == 0
    printed = capsys.readouterr().out
    assert "✗ MatMul mm in local::Lin [block0.fc1, block1.fc1, block0.fc2, …]: excluded" in printed


def test_cli_usage_errors(tmp_path, capsys):
    model, _ = support.shared_blocks()
    source = tmp_path / "in.onnx"
    irkit.save(model, source)
    assert main(["quantize", str(source), "-o", str(tmp_path / "o.onnx"), "--bits", "3"]) == 2
    assert "--bits: invalid choice: 3" in capsys.readouterr().err
    assert (
        main(["quantize", str(source), "-o", str(tmp_path / "o.onnx"), "--block-size", "48"]) == 2
    )
    assert main(["quantize", str(source), "-o", str(source)]) == 2
    assert "never overwrites its input" in capsys.readouterr().err


def test_cli_embeddings_and_kquant(tmp_path, capsys):
    from onnx import TensorProto, helper

    (emb,) = support.weights((40, 64))
    nodes = [
        helper.make_node("Gather", ["emb", "ids"], ["h"], name="embed"),
        helper.make_node("Transpose", ["emb"], ["et"], perm=[1, 0]),
        helper.make_node("MatMul", ["h", "et"], ["y"], name="lm"),
    ]
    model = support.model(nodes, {"ids": (TensorProto.INT64, [2, 3])}, ["y"], {"emb": emb})
    source, out = tmp_path / "in.onnx", tmp_path / "out.onnx"
    irkit.save(model, source)
    argv = [str(source), "-o", str(out), "--embeddings", "--method", "kquant"]
    assert main(["quantize", *argv, "--accuracy-level", "0"]) == 0
    printed = capsys.readouterr().out
    assert "1 node(s) → MatMulNBits, 1 Gather → GatherBlockQuantized, 0 skipped" in printed
    assert "tied 'emb': one packed initializer" in printed
    from irkit.weights.packing import Method, dequantize, quantize_blockwise

    table = dequantize(quantize_blockwise(emb.T.copy(), method=Method.KQUANT)).T
    ids = np.array([[0, 5, 39], [1, 2, 3]], np.int64)
    (y,) = run_ort(out, [ids])
    np.testing.assert_allclose(y, table[ids] @ table.T, atol=1e-4)
    assert main(["quantize", str(source), "-o", str(out), "--method", "gptq"]) == 2
    # --tied-embeddings: the same tied table, one packed initializer (a lone table stays float)
    assert main(["quantize", str(source), "-o", str(out), "--tied-embeddings"]) == 0
    assert "1 Gather → GatherBlockQuantized" in capsys.readouterr().out
    both = ["quantize", str(source), "-o", str(out), "--embeddings", "--tied-embeddings"]
    assert main(both) == 2


def test_cli_dynamic_activations(tmp_path, capsys):
    model, _ = support.shared_blocks()
    source, out = tmp_path / "in.onnx", tmp_path / "out.onnx"
    irkit.save(model, source)
    assert main(["quantize", str(source), "-o", str(out), "--activations", "dynamic"]) == 0
    printed = capsys.readouterr().out
    assert "quantize: 1 node(s) → DynamicQuantizeMatMul, 0 skipped, 2 function(s) changed" in (
        printed
    )
    lin = irkit.load(out).functions[("local", "Lin", "")]
    assert op_histogram(lin) == {"com.microsoft::DynamicQuantizeMatMul": 1}
    assert [v.name for v in lin.inputs] == ["x", "w_Q8", "w_scales"]
    expected, _ = support.shared_blocks()
    irkit.quantize(expected, bits=8, activations="dynamic")
    x = np.ones((2, 3, 64), np.float32)
    np.testing.assert_array_equal(run_ort(out, [x])[0], run_ort(expected, [x])[0])
    bad = ["quantize", str(source), "-o", str(tmp_path / "o.onnx"), "--activations", "dynamic"]
    assert main([*bad, "--bits", "4"]) != 0
    assert "bits=4: its weights are int8, pass bits=8" in capsys.readouterr().err
