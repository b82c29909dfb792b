"""The conventions run: lint, formatting and types are part of the test suite (and so of CI).

Why here and not only in ``.ci/run``: ``python -m pytest`` is the README's one test command, so
a contributor running it locally sees exactly what CI sees, failures are reported next to the
other tests, and the fast lane can skip the slow type check. The tools come from the ``test``
extra (``pip install -e ".[test]"``); a missing tool fails the test instead of skipping it.

What each check covers is configured in ``pyproject.toml`` (``[tool.ruff]``,
``[tool.ruff.format] exclude``, ``[tool.mypy]``, the layering contract ``[tool.importlinter]``),
not here.
"""

from __future__ import annotations

import ast
import pathlib
import shutil
import subprocess
import sys
import zipfile

import networkx as nx
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _run(*args: str, cwd: pathlib.Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=cwd, capture_output=True, text=True, timeout=600
    )


def test_ruff_check_is_clean():
    """pycodestyle/pyflakes/isort/bugbear/pyupgrade/simplify, unused noqa, the layering bans."""
    result = _run("ruff", "check", "--no-cache", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_layering_contract_holds():
    """``[tool.importlinter]``: the layers (direct and indirect imports, module- and
    function-level), independent rule families, private modules behind facades, torch only in
    lowering. A broken contract fails with import-linter's report (which import, which line)."""
    lint_imports = "from importlinter.cli import lint_imports_command as main; main()"
    result = subprocess.run(
        [sys.executable, "-c", lint_imports, "--no-cache"],  # (``lint-imports --no-cache``)
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout, result.stdout


KNOWN_CYCLE_EDGES: set[tuple[str, str]] = set()
"""Import edges that close a cycle, tolerated until removed: none (keep it so)."""


def _module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_graph() -> nx.DiGraph:
    """irkit's modules and who imports whom: every ``import`` statement, at module level, in a
    function or under ``TYPE_CHECKING``; ``from p import m`` names the submodule ``m``."""
    paths = {_module_name(p): p for p in (ROOT / "irkit").rglob("*.py")}
    graph = nx.DiGraph()
    for module, path in paths.items():
        graph.add_node(module)
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                targets = [
                    f"{base}.{a.name}" if f"{base}.{a.name}" in paths else base for a in node.names
                ]
            else:
                continue
            for target in targets:
                while target and target not in paths:  # a name inside a module: the module
                    target = target.rpartition(".")[0]
                if target and target != module:
                    graph.add_edge(module, target)
    return graph


def test_import_graph_has_no_cycle():
    """No import cycle among irkit's modules, lazy and type-only imports included (the graph is
    read with ``ast``); ``KNOWN_CYCLE_EDGES`` (empty) is where a tolerated edge would be named."""
    graph = _import_graph()
    assert len(graph) > 80 and graph.has_edge("irkit._pipeline", "irkit.lowering")  # (lazy)
    stale = sorted(edge for edge in KNOWN_CYCLE_EDGES if not graph.has_edge(*edge))
    assert not stale, f"these imports are gone: remove them from KNOWN_CYCLE_EDGES: {stale}"
    graph.remove_edges_from(KNOWN_CYCLE_EDGES)
    cycles = [sorted(c) for c in nx.strongly_connected_components(graph) if len(c) > 1]
    shown = [" -> ".join([*c, c[0]]) for c in nx.simple_cycles(graph, length_bound=6)][:10]
    assert not cycles, f"import cycles among {cycles}, e.g.:\n" + "\n".join(shown)


KNOWN_ASSERTS: dict[str, int] = {}
"""``assert`` statements left in library code per module or package (its ``.py`` file, or every
file under its folder), tolerated until replaced: only shrink it."""


def _asserts() -> dict[str, int]:
    """Path of each irkit file with ``assert`` statements (relative, without ``.py``) → count."""
    counts: dict[str, int] = {}
    for path in sorted((ROOT / "irkit").rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        if n := sum(isinstance(node, ast.Assert) for node in ast.walk(tree)):
            counts[path.relative_to(ROOT).with_suffix("").as_posix()] = n
    return counts


def test_library_code_has_no_assert():
    """No ``assert`` in irkit/: ``python -O`` strips them, and a failed one is a bare
    ``AssertionError``; an invariant is an explicit check raising irkit's own error
    (irkit/errors.py) that says what broke. ``KNOWN_ASSERTS`` lists the ones left."""
    counts = _asserts()
    per_key = dict.fromkeys(KNOWN_ASSERTS, 0)
    new: dict[str, int] = {}
    for path, n in counts.items():
        key = next((k for k in KNOWN_ASSERTS if path == k or path.startswith(k + "/")), None)
        if key is None:
            new[path] = n
        else:
            per_key[key] += n
    new.update({k: n for k, n in per_key.items() if n > KNOWN_ASSERTS[k]})
    assert not new, f"assert statements in library code (raise irkit's own error instead): {new}"
    stale = {k: n for k, n in per_key.items() if n < KNOWN_ASSERTS[k]}
    assert not stale, f"fewer asserts than KNOWN_ASSERTS says: lower or drop these: {stale}"


def test_the_version_has_one_home():
    """``irkit/_version.py`` (below every stage: lowering stamps it as ``producer_version``)
    is the version; ``pyproject.toml`` must say the same."""
    import tomllib

    from irkit._version import __version__

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["version"] == __version__


def test_ruff_format_check_is_clean():
    result = _run("ruff", "format", "--check", "--no-cache", ".")
    assert result.returncode == 0, result.stdout + result.stderr


# irkit's annotations lean on its dependencies' type stubs: numpy's generics without parameters
# (their TypeVar defaults, numpy >= 2.3's stubs), ``onnx.__version__`` exported. Older stubs (the
# oldest lane's numpy 1.26 and onnx 1.18: 73 errors, 61 of them ``type-arg``) cannot check it.
_STUB_PROBE = """
import numpy as np
import onnx


def probe(dtype: np.dtype, array: np.ndarray) -> str:
    return onnx.__version__
"""


def _skip_unless_the_stubs_type_irkit(tmp_path: pathlib.Path) -> None:
    """Skips where mypy, strict, rejects :data:`_STUB_PROBE` (the idioms above) with the
    installed numpy and onnx; a missing mypy still fails (the probe reports no ``error:``)."""
    (tmp_path / "probe.py").write_text(_STUB_PROBE)
    (tmp_path / "mypy.ini").write_text("[mypy]\n")
    result = _run(
        "mypy", "--strict", "--config-file", "mypy.ini", "--cache-dir", "cache", "probe.py",
        cwd=tmp_path,
    )  # fmt: skip
    errors = [line for line in result.stdout.splitlines() if ": error:" in line]
    if result.returncode != 0 and errors:
        pytest.skip("the installed numpy/onnx stubs cannot type irkit: " + "; ".join(errors))


@pytest.mark.slow
def test_mypy_strict_on_the_torch_free_packages(tmp_path):
    _skip_unless_the_stubs_type_irkit(tmp_path)
    result = _run("mypy", "--cache-dir", str(ROOT / ".mypy_cache"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("Success: no issues found")


@pytest.mark.slow
def test_a_normal_install_ships_the_rule_library_and_the_type_marker(tmp_path):
    """A non-editable wheel: ``irkit.rules`` and ``py.typed`` are in it, no top-level package."""
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "irkit", source / "irkit", ignore=shutil.ignore_patterns("__pycache__"))
    result = _run(
        "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", "dist", ".", cwd=source
    )
    assert result.returncode == 0, result.stdout + result.stderr
    (wheel,) = (source / "dist").glob("irkit-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {"irkit/py.typed", "irkit/rules/__init__.py", "irkit/rules/layer_norm.py"} <= set(names)
    top = {n.split("/")[0] for n in names}
    assert {n for n in top if not n.endswith(".dist-info")} == {"irkit"}
