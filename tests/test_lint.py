"""The project's code passes `ruff check` under its rules (pyproject.toml, [tool.ruff]): pyflakes'
undefined and unused names and flake8-bugbear's, which matter most where the tests cannot go (the
code paths only a GPU takes)."""
import subprocess
import sys

from helpers import ROOT


def _ruff(*args: str, cwd=ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise", *args],
                          cwd=cwd, capture_output=True, text=True)


def test_the_code_passes_ruff():
    result = _ruff(".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_rules_find_an_undefined_name_and_a_loop_variable_bound_late(tmp_path):
    """The configuration is live: the same call finds what its rules are for."""
    probe = tmp_path / "probe.py"
    probe.write_text("def f(rows):\n    calls = [lambda: row for row in rows]\n    return calls, undefined_name\n")
    result = _ruff("--config", str(ROOT / "pyproject.toml"), str(probe), cwd=tmp_path)
    assert result.returncode == 1
    assert "F821 Undefined name `undefined_name`" in result.stdout and "B023" in result.stdout


def test_every_python_file_of_the_project_is_checked():
    """The excludes (the pipeline's output folders at the root) leave out no file of the code:
    a pattern without its leading ./ excludes every folder of that name (src/storyrewrite/models,
    tests/data, ...)."""
    result = _ruff("--show-files", ".")
    checked = {line.strip() for line in result.stdout.splitlines() if line.strip().endswith(".py")}
    code = {str(path) for folder in ("bench", "src", "stages", "tests") for path in (ROOT / folder).rglob("*.py")}
    assert code and not code - checked, sorted(code - checked)
