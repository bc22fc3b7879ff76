"""The package's layering: no import cycle between its packages, and the statistics and
report code free of torch (they run where no model does)."""
from __future__ import annotations

import subprocess
import sys

from storyrewrite.closure import PACKAGE_DIR, imported_modules


def _unit(name: str) -> str:
    """The package a module belongs to: storyrewrite.<first part> (io, params, … stand alone)."""
    return ".".join(name.split(".")[:2])


def package_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in PACKAGE_DIR.rglob("*.py"):
        relative = path.relative_to(PACKAGE_DIR.parent).with_suffix("")
        source = _unit(".".join(relative.parts))
        targets = {_unit(name) for name in imported_modules(path) if name.startswith("storyrewrite.")}
        graph.setdefault(source, set()).update(targets - {source})
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, str] = {}

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return path[path.index(nxt):] + [nxt] if nxt in path else path + [nxt]
            if nxt not in state and (cycle := visit(nxt, path + [nxt])):
                return cycle
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node, [node])):
            return cycle
    return None


def test_no_import_cycle_between_packages():
    graph = package_graph()
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))
    # The intended direction: objectives use the scorer, the scorer uses the models, never back.
    assert "storyrewrite.metrics" in graph["storyrewrite.objectives"]
    assert "storyrewrite.objectives" not in graph["storyrewrite.metrics"]


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_significance_and_report_import_without_torch():
    code = ("import sys, storyrewrite.significance, storyrewrite.significance.compare, storyrewrite.report.build, "
            "storyrewrite.report.collect, storyrewrite.report.gather, storyrewrite.report.tables, storyrewrite.report.examples, "
            "storyrewrite.records; "
            "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
