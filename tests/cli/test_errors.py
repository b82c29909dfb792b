"""Bad input: exit status 2, nothing on stdout, exactly one line on stderr naming the problem.

The cases the issue names run the real command in a subprocess; the rest call
:func:`irkit.cli.main` in-process (the same code path below the entry point, a second each
less), and need no torch.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

import irkit
from irkit.cli import main
from tests.cli.conftest import ROOT, run


def _assert_usage_error(status: int, out: str, err: str, prog: str, *fragments: str) -> None:
    assert status == 2, err
    assert out == ""
    assert err.count("\n") == 1 and err.endswith("\n"), err
    assert err.startswith(f"{prog}: error: "), err
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in err, (fragment, err)


@pytest.mark.slow
def test_lower_missing_file(tmp_path):
    r = run("lower", "missing.pt2", cwd=tmp_path)
    _assert_usage_error(
        r.returncode, r.stdout, r.stderr, "irkit lower", "'missing.pt2': no such file"
    )


@pytest.mark.parametrize("name", ["model.pt2", "notes.txt"])
def test_lower_not_a_pt2_says_what_it_expects(tmp_path, capsys, name):
    (tmp_path / name).write_text("not a zip archive\n")
    status = main(["lower", str(tmp_path / name)])
    out, err = capsys.readouterr()
    _assert_usage_error(
        status,
        out,
        err,
        "irkit lower",
        f"{name}': not a torch.export program (not a zip archive). irkit lower reads a .pt2 file "
        "written by torch.export.save(exported_program, 'model.pt2')",
    )
    assert "ONNX" not in err
    assert list(tmp_path.iterdir()) == [tmp_path / name]


def test_lower_a_zip_that_is_no_program(tmp_path, capsys):
    """In-process (torch is loaded already): torch's own traceback warning stays off stderr."""
    import zipfile

    with zipfile.ZipFile(tmp_path / "model.pt2", "w") as z:
        z.writestr("notes.txt", "hello")
    status = main(["lower", str(tmp_path / "model.pt2")])
    out, err = capsys.readouterr()
    _assert_usage_error(
        status,
        out,
        err,
        "irkit lower",
        "model.pt2': cannot be loaded as a torch.export program (",
        "Is it a file written by torch.export.save?",
    )
    assert not (tmp_path / "model.onnx").exists()


@pytest.mark.parametrize("command", ["check", "optimize"])
def test_onnx_commands_point_a_pt2_to_irkit_lower(tmp_path, capsys, command):
    import zipfile

    path = tmp_path / "model.pt2"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("model/archive_format", "pt2")
    status = main(
        [command, str(path), "-o", str(tmp_path / "o.onnx")][: 2 + 2 * (command != "check")]
    )
    out, err = capsys.readouterr()
    _assert_usage_error(
        status,
        out,
        err,
        f"irkit {command}",
        "model.pt2': a zip archive (a .pt2 written by torch.export.save?), not an ONNX model. "
        f"Lower it to ONNX first: irkit lower {path} -o {tmp_path / 'model.onnx'}",
    )


def test_lower_unsupported_opset_writes_nothing(tmp_path, capsys):
    """In-process: an opset outside the supported range is a usage error before lowering (it
    used to print a traceback, exit 0 and write a file onnxruntime refuses)."""
    import torch

    from irkit.lowering._lower import supported_opsets

    ep = torch.export.export(torch.nn.Linear(4, 2), (torch.randn(3, 4),))
    torch.export.save(ep, tmp_path / "m.pt2")
    newest = supported_opsets()[0][-1]
    status = main(["lower", str(tmp_path / "m.pt2"), "--opset", "99"])
    out, err = capsys.readouterr()
    _assert_usage_error(
        status,
        out,
        err,
        "irkit lower",
        f"opset 99 is not supported: irkit lowers to opsets 7 to {newest}",
    )
    assert not (tmp_path / "m.onnx").exists()


@pytest.mark.slow
def test_optimize_truncated_onnx(tmp_path, files):
    data = (files.dir / "stock.onnx").read_bytes()
    (tmp_path / "cut.onnx").write_bytes(data[: len(data) // 3])
    r = run("optimize", "cut.onnx", "-o", "out.onnx", cwd=tmp_path)
    _assert_usage_error(
        r.returncode, r.stdout, r.stderr, "irkit optimize", "'cut.onnx': not a valid ONNX model"
    )
    assert not (tmp_path / "out.onnx").exists()


@pytest.mark.slow
def test_optimize_unknown_rule(files, tmp_path):
    r = run(
        "optimize",
        str(files.dir / "stock.onnx"),
        "-o",
        "out.onnx",
        "--explain",
        "Nope",
        cwd=tmp_path,
    )
    _assert_usage_error(
        r.returncode,
        r.stdout,
        r.stderr,
        "irkit optimize",
        "--explain 'Nope': no such rule in 'onnx'; rules: IdentityElimination,",
    )
    assert not (tmp_path / "out.onnx").exists()


@pytest.fixture
def relu(tmp_path):
    import onnx_ir as ir

    model = ir.from_onnx_text(
        '<ir_version: 10, opset_import: ["" : 21]> g (float[2] x) => (float[2] y) '
        "{ t = Identity(x)  y = Relu(t) }"
    )
    irkit.save(model, tmp_path / "relu.onnx")
    return tmp_path / "relu.onnx"


@pytest.mark.parametrize(
    "args, prog, fragments",
    [
        (["check", "{d}/missing.onnx"], "irkit check", ["missing.onnx': no such file"]),
        (["check", "{d}"], "irkit check", ["is a directory, not an ONNX file"]),
        (["check", "{d}/empty.onnx"], "irkit check", ["empty.onnx': not an ONNX model"]),
        (["check", "{d}/text.onnx"], "irkit check", ["text.onnx': not a valid ONNX model"]),
        (["optimize", "{m}"], "irkit optimize", ["required: -o/--output", "irkit optimize --help"]),
        (["optimize", "{m}", "-o", "{m}"], "irkit optimize", ["is the input file"]),
        (["optimize", "{m}", "-o", "{d}/no/dir/x.onnx"], "irkit optimize", ["does not exist"]),
        (
            ["optimize", "{m}", "-o", "{d}/o.onnx", "--rules", "nope"],
            "irkit optimize",
            ["expected MODULE:NAME"],
        ),
        (
            ["optimize", "{m}", "-o", "{d}/o.onnx", "--rules", "no_such_module_x:R"],
            "irkit optimize",
            ["cannot import module 'no_such_module_x'"],
        ),
        (
            ["optimize", "{m}", "-o", "{d}/o.onnx", "--rules", "irkit.rules:nope"],
            "irkit optimize",
            ["module 'irkit.rules' has no 'nope'"],
        ),
        (
            ["optimize", "{m}", "-o", "{d}/o.onnx", "--rules", "irkit:__version__"],
            "irkit optimize",
            ["is a str, not a rule"],
        ),
        (
            ["optimize", "{m}", "-o", "{d}/o.onnx", "--target", "gpu"],
            "irkit optimize",
            ["invalid choice: 'gpu'"],
        ),
        (
            ["optimize", "{m}", "-o", "{d}/o.onnx", "--bogus"],
            "irkit optimize",
            ["unrecognized arguments: --bogus"],
        ),
        (["lower", "{m}"], "irkit lower", ["is an ONNX file; irkit lower reads a .pt2"]),
        (["lower", "{d}/missing.pt2"], "irkit lower", ["missing.pt2': no such file"]),
        (["lower", "{d}/x.pt2", "-o", "{d}/no/x.onnx"], "irkit lower", ["does not exist"]),
        (
            ["lower", "{d}/x.pt2", "--no-functions", "--max-depth", "2"],
            "irkit lower",
            ["--max-depth applies to functions"],
        ),
        (["frobnicate"], "irkit", ["invalid choice: 'frobnicate'"]),
        (
            ["--bogus"],
            "irkit",
            ["unrecognized arguments: --bogus; expected a COMMAND", "(see 'irkit --help')"],
        ),
    ],
)
def test_usage_errors_in_process(args, prog, fragments, relu, capsys):
    d = relu.parent
    (d / "empty.onnx").write_bytes(b"")
    (d / "text.onnx").write_text("hello, not ONNX\n")
    (d / "x.pt2").write_bytes(b"")
    before = relu.read_bytes()
    status = main([a.format(d=d, m=relu) for a in args])
    out, err = capsys.readouterr()
    _assert_usage_error(status, out, err, prog, *fragments)
    assert relu.read_bytes() == before
    assert not (d / "o.onnx").exists()


def test_check_ok_and_optimize_in_process(relu, capsys):
    assert main(["check", str(relu)]) == 0
    assert capsys.readouterr().out == (
        f"{relu}: ok — 2 nodes in the main graph, 0 function(s) with 0 nodes, opset 21\n"
    )
    out_path = relu.parent / "out.onnx"
    assert (
        main(["optimize", str(relu), "-o", str(out_path), "--explain", "IdentityElimination"]) == 0
    )
    text = capsys.readouterr().out
    assert "  nodes       2 → 1 in the main graph\n" in text
    assert "    IdentityElimination              ×1\n" in text
    assert "\n  explain     IdentityElimination: " in text
    assert [n.op_type for n in irkit.load(out_path).graph] == ["Relu"]
    assert main(["optimize", str(relu), "-o", str(out_path), "-q"]) == 0
    assert capsys.readouterr() == ("", "")


def test_version_and_no_command(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"irkit {irkit.__version__}\n"
    assert main([]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("usage: irkit [-h] [--version] COMMAND ...")


def test_help_of_every_subcommand_has_examples(capsys):
    for command in ("lower", "optimize", "check", "view"):
        assert main([command, "--help"]) == 0
        out = capsys.readouterr().out
        assert out.startswith(f"usage: irkit {command} ")
        assert f"examples:\n  irkit {command} " in out


@pytest.mark.slow
def test_torch_is_not_needed_but_by_lower(relu):
    """``irkit check`` runs with torch made unimportable; importing the CLI does not load it."""
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from irkit.cli import main\n"
        f"sys.exit(main(['check', {str(relu)!r}]))\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert ": ok — 2 nodes" in r.stdout


def test_optimize_never_overwrites_the_input_weights(tmp_path, capsys):
    import numpy as np
    import onnx_ir as ir

    model = ir.from_onnx_text(
        '<ir_version: 10, opset_import: ["" : 21]> g (float[4096] x) => (float[4096] y) '
        "{ t = Identity(x)  y = Add(t, w) }"
    )
    w = ir.Value(name="w", const_value=ir.tensor(np.arange(4096, dtype=np.float32), name="w"))
    model.graph.register_initializer(w)
    model.graph.node(1).replace_input_with(1, w)
    irkit.save(model, tmp_path / "ext.onnx", external_data=True)
    data = (tmp_path / "ext.onnx.data").read_bytes()
    assert len(data) == 4 * 4096
    status = main(
        [
            "optimize",
            str(tmp_path / "ext.onnx"),
            "-o",
            str(tmp_path / "out.onnx"),
            "--external-data",
            "ext.onnx.data",
        ]
    )
    out, err = capsys.readouterr()
    _assert_usage_error(status, out, err, "irkit optimize", "holds the input model's weights")
    assert not (tmp_path / "out.onnx").exists()
    status = main(
        [
            "optimize",
            str(tmp_path / "ext.onnx"),
            "-o",
            str(tmp_path / "out.onnx"),
            "--external-data",
            "-q",
        ]
    )
    assert (status, *capsys.readouterr()) == (0, "", "")
    assert (tmp_path / "ext.onnx.data").read_bytes() == data
    assert (tmp_path / "out.onnx.data").read_bytes() == data
    assert [n.op_type for n in irkit.load(tmp_path / "out.onnx").graph] == ["Add"]
