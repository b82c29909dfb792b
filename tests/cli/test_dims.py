"""``irkit lower --dim``: the ``torch.export.Dim`` names a saved program lost, given back.

``torch.export.save`` (torch 2.13) keeps no Dim names: the loaded program's dims are torch's
symbols (``s77``). In memory the program remembers them and ``irkit.lower`` uses them; from a
file, ``--dim INPUT:AXIS=NAME`` or ``--dim SYMBOL=NAME`` names them. In-process (torch is loaded
by the fixture already): one tiny export, lowered a few times.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import onnxruntime as ort
import pytest
import torch

import irkit
from irkit.cli import main


class _Cat(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x.relu() + 1, torch.cat([x, y], 0)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """(in-memory program, its .pt2 file, the program read back)."""
    batch, seq = torch.export.Dim("batch"), torch.export.Dim("seq", max=1000)
    ep = torch.export.export(
        _Cat(),
        (torch.randn(2, 3), torch.randn(4, 3)),
        dynamic_shapes={"x": {0: batch}, "y": {0: seq}},
    )
    path = tmp_path_factory.mktemp("dims") / "cat.pt2"
    torch.export.save(ep, path)
    return ep, path, torch.export.load(path)


def _dims(model: ir.Model) -> dict[str, list[int | str | None]]:
    values = [*model.graph.inputs, *model.graph.outputs]
    return {v.name: [d if isinstance(d, int) else d.value for d in v.shape] for v in values}


def _symbol(program: torch.export.ExportedProgram, node: str) -> str:
    val = next(n for n in program.graph.nodes if n.name == node).meta["val"]
    return str(val.shape[0])


def test_in_memory_program_keeps_the_dim_names(saved):
    ep, _, _ = saved
    assert _dims(irkit.lower(ep)) == {
        "x": ["batch", 3],
        "y": ["seq", 3],
        "add": ["batch", 3],
        "cat": ["batch + seq", 3],
    }


def test_irkit_lower_dim_names_the_dims_of_a_saved_program(saved, tmp_path, capsys):
    _, path, loaded = saved
    x_symbol = _symbol(loaded, "x")
    assert main(["lower", str(path), "-o", str(tmp_path / "plain.onnx")]) == 0
    summary = capsys.readouterr().out
    plain = _dims(irkit.load(tmp_path / "plain.onnx"))["x"][0]
    assert plain in ("batch", x_symbol)  # torch 2.13 saves no names: torch's symbol
    if plain == x_symbol:  # the summary says how to name them
        y_symbol = _symbol(loaded, "y")
        assert (
            f"\n  dims        {x_symbol}, {y_symbol}: torch's names (torch.export.save keeps no "
            f"Dim names); name them: --dim x:0=NAME (or --dim {x_symbol}=NAME)\n"
        ) in summary

    out = tmp_path / "named.onnx"
    args = ["lower", str(path), "-o", str(out), "--dim", "x:0=batch", "--dim"]
    assert main([*args, f"{_symbol(loaded, 'y')}=seq"]) == 0
    summary = capsys.readouterr().out
    assert "  inputs      x  f32[batch,3]\n              y  f32[seq,3]\n" in summary
    assert "  dims  " not in summary
    assert _dims(irkit.load(out)) == {
        "x": ["batch", 3],
        "y": ["seq", 3],
        "add": ["batch", 3],
        "cat": ["batch + seq", 3],
    }
    x, y = np.ones((5, 3), np.float32), np.zeros((2, 3), np.float32)
    add, cat = ort.InferenceSession(str(out)).run(None, {"x": x, "y": y})
    np.testing.assert_array_equal(add, x + 1)
    np.testing.assert_array_equal(cat, np.concatenate([x, y]))


@pytest.mark.parametrize(
    "spec, message",
    [
        ("x:1=a", "--dim 'x:1=a': x:1 is static (size 3); dynamic dims: x:0 (s"),
        ("q:0=a", "--dim 'q:0=a': no tensor input 'q'; inputs: x, y"),
        ("x:5=a", "--dim 'x:5=a': 'x' has 2 axes; its dynamic dims: x:0 (s"),
        ("x:0", "--dim 'x:0': expected INPUT:AXIS=NAME or SYMBOL=NAME"),
        ("nope=a", "the program has no symbolic dim 'nope'; its symbols: s"),
        ("x:0=1b", "= '1b': a dim name is an identifier (like 'batch')"),
        ("x:0=seq", "would both be named 'seq', but the program does not know them equal"),
    ],
)
def test_unusable_dim_option_is_one_line(saved, tmp_path, capsys, spec, message):
    _, path, _ = saved
    out = tmp_path / "o.onnx"
    status = main(["lower", str(path), "-o", str(out), "--dim", spec, "--dim", "y:0=seq"])
    stdout, err = capsys.readouterr()
    assert (status, stdout) == (2, "")
    assert err.startswith("irkit lower: error: ") and err.count("\n") == 1, err
    assert message in err, err
    assert not out.exists()


def test_dim_names_win_over_the_remembered_names_and_stay_distinct(saved):
    ep, _, _ = saved
    x, y = _symbol(ep, "x"), _symbol(ep, "y")
    assert _dims(irkit.lower(ep, dim_names={x: "n"}))["cat"] == ["n + seq", 3]
    pair = " and ".join(repr(s) for s in sorted([x, y]))
    with pytest.raises(irkit.LoweringOptionsError, match=f"{pair} would both be named 'batch'"):
        irkit.lower(ep, dim_names={y: "batch"})  # x is 'batch' already (its Dim's name)
    assert _dims(irkit.lower(ep, dim_names={x: "seq", y: "batch"}))["cat"] == ["batch + seq", 3]
