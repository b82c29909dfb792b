"""Bad input: one line naming the file and the problem, exit status 2, no traceback."""

from __future__ import annotations

import logging

import pytest

import irkit
from tests.viz import models
from tests.viz.conftest import run_cli


def _assert_one_line_error(result, expected: str) -> None:
    assert result.returncode == 2, result
    assert result.stdout == ""
    assert result.stderr == f"irkit-viz: error: {expected}\n"
    assert "Traceback" not in result.stderr


def test_missing_file(tmp_path):
    result = run_cli("nope.onnx", cwd=tmp_path)
    _assert_one_line_error(result, "'nope.onnx': no such file")


def test_directory(tmp_path):
    result = run_cli(".", cwd=tmp_path)
    _assert_one_line_error(result, "'.': is a directory, not an ONNX file")


@pytest.mark.parametrize("content", [b"hello, this is not an ONNX file\n", b"\x00\x01\x02"])
def test_not_onnx(tmp_path, content):
    (tmp_path / "x.onnx").write_bytes(content)
    result = run_cli("x.onnx", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.startswith("irkit-viz: error: 'x.onnx': not a valid ONNX model (")
    assert result.stderr.endswith("Is the file truncated or of another format?\n")
    assert result.stderr.count("\n") == 1


def test_empty_file(tmp_path):
    (tmp_path / "empty.onnx").write_bytes(b"")
    result = run_cli("empty.onnx", cwd=tmp_path)
    _assert_one_line_error(
        result,
        "'empty.onnx': not an ONNX model (no ir_version or no graph). "
        "Is the file empty, truncated or of another format?",
    )


@pytest.mark.parametrize("keep", [0.25, 0.5, 0.9])
def test_truncated(tmp_path, toy, keep):
    data = toy.read_bytes()
    (tmp_path / "cut.onnx").write_bytes(data[: int(len(data) * keep)])
    result = run_cli("cut.onnx", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.startswith("irkit-viz: error: 'cut.onnx': not a")
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


@pytest.fixture
def external_model(tmp_path):
    irkit.save(models.stack(2), tmp_path / "ext.onnx", external_data=True)
    assert (tmp_path / "ext.onnx.data").exists()
    return tmp_path / "ext.onnx"


def test_external_data_is_not_needed_when_present(external_model):
    result = run_cli(external_model.name, cwd=external_model.parent)
    assert result.returncode == 0, result.stderr
    assert "layers.0 … layers.1  Block ×2" in result.stdout


def test_missing_external_data(external_model):
    (external_model.parent / "ext.onnx.data").unlink()
    result = run_cli("ext.onnx", cwd=external_model.parent)
    _assert_one_line_error(
        result,
        "'ext.onnx': external data file 'ext.onnx.data' for initializer 'layers.0.mlp.w1' is "
        "missing. Copy it next to the model, or pass --allow-missing-data.",
    )
    ok = run_cli("ext.onnx", "--allow-missing-data", cwd=external_model.parent)
    assert ok.returncode == 0 and "Block ×2" in ok.stdout


def test_truncated_external_data(external_model):
    data = external_model.parent / "ext.onnx.data"
    data.write_bytes(data.read_bytes()[:100])
    result = run_cli("ext.onnx", cwd=external_model.parent)
    assert result.returncode == 2
    assert result.stderr.startswith(
        "irkit-viz: error: 'ext.onnx': external data file 'ext.onnx.data' is truncated (100 bytes"
    )


def test_unknown_function(toy):
    result = run_cli(toy.name, "--function", "Nope", cwd=toy.parent)
    _assert_one_line_error(
        result,
        "'toy.onnx' has no function or module 'Nope'. Functions: main, "
        "tests.viz.toy::Attention, tests.viz.toy::Block, tests.viz.toy::MLP",
    )


def test_debug_shows_traceback(tmp_path):
    result = run_cli("nope.onnx", "--debug", cwd=tmp_path)
    assert result.returncode != 0
    assert "Traceback" in result.stderr and "ModelLoadError" in result.stderr


def test_layout_dot_without_dot_says_how_to_install(toy, tmp_path):
    # An empty PATH hides Graphviz's `dot` (the interpreter is started by absolute path).
    result = run_cli(toy, "--format", "svg", "--layout", "dot", env={"PATH": str(tmp_path)})
    _assert_one_line_error(
        result,
        "Graphviz's `dot` program was not found on PATH. Install Graphviz's layout program `dot` "
        "(Debian/Ubuntu: apt-get install graphviz; macOS: brew install graphviz) and the Python "
        "binding (pip install 'irkit[graphviz]'), or leave out --layout dot: the built-in layout "
        "needs nothing else.",
    )


def test_layout_dot_only_for_pictures(toy):
    _assert_one_line_error(
        run_cli(toy, "--layout", "dot"),
        "--layout dot does not apply with --format text; it lays out svg / html",
    )


def test_writes_output_file(toy, tmp_path):
    result = run_cli(toy, "-o", tmp_path / "out.json")
    assert result.returncode == 0 and result.stdout == ""
    assert (tmp_path / "out.json").read_text().startswith('{\n "schema": "irkit.viz/2"')


def test_format_from_suffix(toy, tmp_path):
    assert run_cli(toy, "-o", tmp_path / "m.svg").returncode == 0
    assert (tmp_path / "m.svg").read_text().startswith("<?xml")


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ["--format", "json", "--depth", "2"],
            "--depth does not apply with --format json; it shapes --format text / html",
        ),
        (
            ["--format", "json", "--function", "Block"],
            "--function does not apply with --format json; it shapes --format text / onnx-text / "
            "dot / svg / html",
        ),
        (
            ["--format", "html", "--stats"],
            "--stats does not apply with --format html; it shapes --format text",
        ),
        (
            ["--format", "dot", "--expand", "layers.1"],
            "--expand does not apply with --format dot; it shapes --format text / html",
        ),
        (
            ["--diff", "OTHER", "--depth", "1"],
            "--depth does not apply with --diff; it shapes --format text / html",
        ),
    ],
)
def test_view_options_are_refused_where_they_do_not_apply(toy, tmp_path, flags, message):
    result = run_cli(str(toy), *flags, cwd=tmp_path)
    _assert_one_line_error(result, message)


def test_irkit_load_makes_the_same_external_data_checks(external_model):
    """The CLI's loading is ``irkit.load``'s: a short side file is refused there too."""
    data = external_model.parent / "ext.onnx.data"
    data.write_bytes(data.read_bytes()[:100])
    with pytest.raises(irkit.ModelLoadError, match=r"ext.onnx.data' is truncated \(100 bytes"):
        irkit.load(external_model)
    assert len(irkit.load(external_model, load_external_data=False).graph) > 0


def test_errors_under_irkit_view_name_that_command(tmp_path, monkeypatch, capsys):
    from irkit.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["view", "nope.onnx"]) == 2
    out, err = capsys.readouterr()
    assert (out, err) == ("", "irkit view: error: 'nope.onnx': no such file\n")
    assert main(["view", "nope.onnx", "--format", "nope"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1, err
    assert err.startswith("irkit view: error: argument --format/-f: invalid choice: 'nope'"), err
    assert err.endswith(" (see 'irkit view --help')\n"), err


@pytest.mark.parametrize("fmt", ["text", "json", "html"])
def test_a_broken_model_is_shown_and_what_is_broken_is_said(tmp_path, fmt, caplog):
    from irkit import metadata
    from irkit.viz import cli

    model = irkit.inline(models.stack(2))
    model.graph.node(0).metadata_props[metadata.SCOPE] = "[[1, 2]"
    model.graph.node(1).metadata_props[metadata.REWRITE_SOURCES] = "not a list"
    path = irkit.save(model, tmp_path / "broken.onnx")
    out = tmp_path / f"out.{fmt}"
    with caplog.at_level(logging.WARNING, logger="irkit.viz.cli"):
        assert cli.main([str(path), "--format", fmt, "-o", str(out)]) == 0
    assert "layers.1" in out.read_text()  # the rest of the hierarchy is shown
    (record,) = [r for r in caplog.records if r.name == "irkit.viz.cli"]
    message = record.getMessage()
    assert "broken.onnx' is broken (irkit.lint): node 'attn/MatMul_0' (MatMul)" in message
    assert "malformed irkit.scope metadata '[[1, 2]'" in message
    assert message.endswith("(and 1 more problem)")


def test_tools_viz_py_from_a_checkout_is_irkit_view(toy, tmp_path, capsys):
    """``python tools/viz.py`` as a user runs it from a checkout (no PYTHONPATH, another
    directory) prints what ``irkit view`` prints, from this checkout's irkit."""
    import os
    import subprocess
    import sys

    from tests.viz.conftest import ROOT

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "NO_COLOR")}

    def tools_viz(*args: str) -> subprocess.CompletedProcess[str]:
        script = str(ROOT / "tools" / "viz.py")
        run = subprocess.run  # (one process each: the script is the entry point under test)
        return run(
            [sys.executable, script, *args],
            capture_output=True,
            text=True,
            env=env,
            cwd=tmp_path,
            timeout=120,
        )

    result = tools_viz(str(toy), "--depth", "1", "--color", "never")
    assert (result.returncode, result.stderr) == (0, "")
    from irkit.cli import main

    status = main(["view", str(toy), "--depth", "1", "--color", "never"])
    out, err = capsys.readouterr()
    assert (status, err) == (0, "")
    assert result.stdout == out and out.startswith("toy.onnx  ")
    # This checkout's irkit, not another installed one: --depth 0 is refused here.
    refused = tools_viz(str(toy), "--depth", "0")
    assert refused.returncode == 2
    assert refused.stderr.startswith("irkit-viz: error: argument --depth: must be 1 or more")
