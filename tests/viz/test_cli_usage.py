"""``irkit view`` usage: one-line usage errors, ``--depth``, ``-o``'s suffix, a ``.pt2`` given.

In-process (``irkit.cli.main``): no subprocess, a toy model; the fast lane runs them.
"""

from __future__ import annotations

import pytest


def _in_process(capsys, *args: str) -> tuple[int, str, str]:
    from irkit.cli import main

    status = main(["view", *args])
    out, err = capsys.readouterr()
    return status, out, err


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ["--depth", "0"],
            "argument --depth: must be 1 or more (1: the main graph's calls only), "
            "got 0 (see 'irkit view --help')",
        ),
        (
            ["--depth", "-1"],
            "argument --depth: must be 1 or more (1: the main graph's calls "
            "only), got -1 (see 'irkit view --help')",
        ),
        (
            ["--depth", "two"],
            "argument --depth: expected a whole number, got 'two' (see 'irkit view --help')",
        ),
        (["--bogus"], "unrecognized arguments: --bogus (see 'irkit view --help')"),
        (
            ["-o", "{d}/m.png"],
            "-o '{d}/m.png': no format is written to a .png file; the formats: "
            "text (.txt/.text), onnx-text (.onnxtxt/.onnxtext/.txt), dot (.dot/.gv), svg (.svg), "
            "html (.html/.htm), json (.json)",
        ),
        (
            ["-o", "{d}/m.svg", "--format", "html"],
            "-o '{d}/m.svg': --format html is written to a "
            ".html/.htm file (or one without a suffix); rename the output",
        ),
    ],
)
def test_usage_errors_are_one_line_and_write_nothing(toy, tmp_path, capsys, flags, message):
    status, out, err = _in_process(capsys, str(toy), *[f.format(d=tmp_path) for f in flags])
    assert (status, out) == (2, "")
    assert err == f"irkit view: error: {message.format(d=tmp_path)}\n"
    assert list(tmp_path.iterdir()) == []


def test_usage_error_without_a_model_is_one_line(capsys):
    assert _in_process(capsys) == (
        2,
        "",
        "irkit view: error: the following arguments are required: model "
        "(see 'irkit view --help')\n",
    )


@pytest.mark.parametrize(
    ("name", "start"),
    [
        ("m.TXT", "toy.onnx  "),
        ("m.txt", "toy.onnx  "),
        ("m", "toy.onnx  "),
        ("m.onnxtxt", "<\n   ir_version: "),
        ("m.gv", "digraph "),
        ("m.json", '{\n "schema": "irkit.viz/2"'),
    ],
)
def test_output_suffix_names_the_format(toy, tmp_path, capsys, name, start):
    assert _in_process(capsys, str(toy), "-o", str(tmp_path / name)) == (0, "", "")
    assert (tmp_path / name).read_text().startswith(start)


def test_depth_1_shows_the_top_calls_only(toy, capsys):
    status, full, _ = _in_process(capsys, str(toy))
    status1, top, _ = _in_process(capsys, str(toy), "--depth", "1")
    assert (status, status1) == (0, 0)
    assert "layers.0" in top and len(top.splitlines()) < len(full.splitlines())


def test_a_pt2_program_points_to_irkit_lower(tmp_path, capsys):
    """A zip archive (what torch.export.save writes) is named as such, with the command."""
    import zipfile

    with zipfile.ZipFile(tmp_path / "model.pt2", "w") as z:
        z.writestr("model/archive_format", "pt2")
    path = tmp_path / "model.pt2"
    assert _in_process(capsys, str(path)) == (
        2,
        "",
        f"irkit view: error: {str(path)!r}: a zip archive (a .pt2 written by torch.export.save?), "
        f"not an ONNX model. Lower it to ONNX first: irkit lower {path} -o "
        f"{tmp_path / 'model.onnx'}\n",
    )


def test_an_onnx_output_is_refused_so_the_input_is_never_overwritten(toy, tmp_path, capsys):
    before = toy.read_bytes()
    status, out, err = _in_process(capsys, str(toy), "-o", str(toy))
    assert (status, out) == (2, "")
    assert err.startswith(f"irkit view: error: -o {str(toy)!r}: no format is written to a .onnx")
    assert toy.read_bytes() == before
