"""The README and docs/: generated parts up to date, the README short, and its commands real."""
from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import ROOT
from storyrewrite import docs

README = (ROOT / "README.md").read_text(encoding="utf-8")
FENCE = re.compile(r"(<!-- runnable -->\n)?```bash\n(.*?)```", re.S)


@pytest.mark.parametrize("page", [p.relative_to(ROOT).as_posix() for p in docs.pages()])
def test_every_generated_block_is_up_to_date(page):
    text = (ROOT / page).read_text(encoding="utf-8")
    assert docs.render(text, page) == text, f"{page} is stale: run `make docs`"


def test_a_stale_or_unknown_block_is_found():
    stale = "<!-- generated: curves -->\nold table\n<!-- end generated -->\n"
    assert "`train_loss`" in docs.render(stale, "x.md")
    with pytest.raises(Exception, match=r"x\.md:1: unknown generated block 'nope'"):
        docs.render("<!-- generated: nope -->\n<!-- end generated -->", "x.md")


def test_the_readme_gpu_line_holds_the_gpu_figures_only(tmp_path, monkeypatch):
    """The README's GPU line: each GPU's figures beside their targets, no CPU figure, and a plain
    statement where no GPU measured them."""
    import json

    monkeypatch.setattr(docs, "ROOT", tmp_path)
    (tmp_path / "reports" / "bench").mkdir(parents=True)
    assert docs.gpu_speed().startswith("No GPU figure yet")
    entry = lambda device, ratio: {"device": device, "commit": "abc1234", "measured_at": "2026-01-02T03:04:05+00:00",  # noqa: E731
                                   "settings": {"batch_size": 8, "precision": "bf16-mixed"},
                                   "figures": {"score": {"ratio": ratio}, "score_delta": {"ratio": 1.7}, "nll": {"gpu_busy": 0.5}},
                                   "targets": {"score.ratio": {"max": 1.5}, "score_delta.ratio": {"max": 1.8},
                                               "nll.gpu_busy": {"min": 0.8}}}
    (tmp_path / "reports" / "bench" / "objective_step_time-bf16-mixed.json").write_text(json.dumps(
        {"cpu: Some CPU": entry("cpu", 9.0), "NVIDIA X100": entry("cuda:0", 1.4)}))
    line = docs.gpu_speed()
    assert line.startswith("On one NVIDIA X100 (commit abc1234, 2026-01-02): a DTO-Score training step (batch 8, bf16-mixed)")
    assert "1.4× an NLL step (target ≤ 1.5 ✓); DTO-Score+Delta 1.7× (target ≤ 1.8 ✓); GPU busy during NLL steps 50% (target ≥ 80% ✗)." in line
    assert "Some CPU" not in line and "9×" not in line  # nothing of the CPU entry


def test_a_comparison_record_cut_short_or_resumed_is_said_so_and_kept_out_of_the_readme(tmp_path, monkeypatch):
    """bench/comparison.py's records: the README states the wall times of a whole run only; the
    benchmarks page says which record is an interim one or a resumed comparison's."""
    import json

    monkeypatch.setattr(docs, "ROOT", tmp_path)
    (tmp_path / "reports" / "bench").mkdir(parents=True)

    def entry(command, figures, settings):
        return {"script": "bench/comparison.py", "command": command, "device": "cuda:0", "device_name": "NVIDIA X100",
                "torch_threads": 16, "torch": "2.13.0", "commit": "abc1234", "measured_at": "2026-01-02T03:04:05+00:00",
                "settings": {"parts": ["all"], **settings}, "figures": figures, "targets": {"wall_s.total": {"max": 720}}}
    whole = entry("whole", {"complete": True, "wall_s": {"all": 700.0, "total": 700.0}}, {})
    cut = entry("cut", {"complete": False, "elapsed_s": 540.5, "wall_s": {}}, {})
    resumed = entry("resumed", {"complete": True, "wall_s": {"all": 300.0, "total": 300.0}}, {"gathered_before": ["a", "b"]})
    path = tmp_path / "reports" / "bench" / "comparison.json"
    path.write_text(json.dumps({"NVIDIA X100": whole}))
    assert "the whole comparison in 700 s (target ≤ 720 ✓)" in docs.gpu_speed()
    for record in (cut, resumed):
        path.write_text(json.dumps({"NVIDIA X100": record}))
        assert docs.gpu_speed().startswith("No GPU figure yet")
    path.write_text(json.dumps({"NVIDIA X100": cut, "NVIDIA Y100": resumed, "NVIDIA Z100": whole}))
    page = docs.benchmarks()
    assert page.count("An interim record: written 540.5 s into a run that had not ended") == 1
    assert page.count("A resumed comparison: 2 run(s) gathered before were not run again; no target applies.") == 1
    assert page.index("`cut`") < page.index("An interim record") < page.index("`resumed`") < page.index("A resumed comparison")


def test_the_readme_gpu_results_follow_the_collected_tables(tmp_path, monkeypatch):
    """The README's sentences on reports/gpu/ (docs.gpu_results) against edits of the collected
    results.md: a column every trained system loses to the copy, and every planned run present."""
    monkeypatch.setattr(docs, "ROOT", tmp_path)
    assert docs.gpu_results().startswith("No full-data comparison yet: `bash scripts/comparison.sh -j auto gpu all")
    text = (ROOT / "reports" / "gpu" / "results.md").read_text(encoding="utf-8")
    trained = "NLL; NLL, continued; CPO (beta=0.1, lambda=2.0); DTO-Delta; DTO-Score; DTO-Score+Delta"
    edited = re.sub(r"^(\| CF-PMI \|.*\| )0 of 6 \|$", rf"\g<1>6 of 6 ({trained}) |", text, count=1, flags=re.M)
    edited = re.sub(r"^No run here trained .*\n", "", edited, flags=re.M)
    assert edited.count("6 of 6") == 1 and "No run here" not in edited
    (tmp_path / "reports" / "gpu").mkdir(parents=True)
    (tmp_path / "reports" / "gpu" / "results.md").write_text(edited, encoding="utf-8")
    said = docs.gpu_results()
    assert "every trained system on CF-PMI; no trained system on follows X_CE (%)" in said
    assert "It holds no run" not in said and said.endswith("the reference rewrites in 1.0 %.")
    assert "; DTO-Delta on none of them." in said  # (the systems better than NLL nowhere)


def test_the_readme_is_short_and_links_pages_that_exist():
    assert len(README.splitlines()) <= 150
    for target in re.findall(r"\]\(([^)#]+)\)", README):
        if not target.startswith("http"):
            assert (ROOT / target).exists(), target


def test_the_params_comments_name_pages_and_files_that_exist():
    # A comment in params.yaml or a profile that points the reader somewhere points to what is there.
    for path in [ROOT / "params.yaml", *sorted((ROOT / "params").glob("*.yaml"))]:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            comment = line.partition("#")[2]
            assert "README's" not in comment, f"{path.name}:{number}: name the page, not a README section"
            for target in re.findall(r"\b((?:docs|bench|scripts|reports)/[\w./*-]*\w)", comment):
                assert list(ROOT.glob(target)), f"{path.name}:{number}: {target} does not exist"


def test_a_generated_table_escapes_a_pipe_once():
    # `a | b` in a cell is written `a \| b`; escaped twice, a renderer other than GitHub's shows the backslash.
    for page in docs.pages():
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            assert "\\\\|" not in line, f"{page.relative_to(ROOT)}:{number}: a pipe escaped twice"


def _commands(block: str) -> list[str]:
    """The commands of a shell block: comments dropped, continued lines joined."""
    joined = block.replace("\\\n", " ")
    return [line.split("  #")[0].strip() for line in joined.splitlines() if line.strip() and not line.strip().startswith("#")]


def test_every_readme_command_names_what_exists():
    """Each shell command of the README parses, and the make targets, scripts, modules and
    params keys it names exist (the expensive ones are not run here)."""
    blocks = [m.group(2) for m in FENCE.finditer(README)]
    assert blocks
    targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M))
    for block in blocks:
        assert subprocess.run(["bash", "-n"], input=block, text=True).returncode == 0, block
        for command in _commands(block):
            words = command.split()
            if words[0] == "make":
                assert words[1] in targets, command
            for path in re.findall(r"(?:bash|python) ((?:scripts|bench)/[\w./-]+)", command) + re.findall(r"(params/\w+\.yaml)", command):
                assert (ROOT / path).exists(), command
            for module in re.findall(r"python -m ([\w.]+)", command):
                assert importlib.util.find_spec(module) is not None, command
            for key in re.findall(r"-S ([\w.]+)=", command):
                assert key.split(".")[0] in (ROOT / "params.yaml").read_text(), command


@pytest.mark.slow
def test_the_runnable_readme_commands_run_in_a_fresh_clone(tmp_path):
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    runnable = [m.group(2) for m in FENCE.finditer(README) if m.group(1)]
    assert runnable
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    for block in runnable:
        result = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=clone, env=env, capture_output=True, text=True,
                                timeout=300)
        assert result.returncode == 0, block + result.stderr[-2000:]


def sentences(markdown: str) -> list[str]:
    """The prose sentences of a page: paragraphs and list items split after . ! or ? before a
    capital, a code span or a link; code blocks, tables, headings and generated blocks left out,
    a code span or a link counted as one word."""
    text = re.sub(r"```.*?```|<!-- generated: [\w-]+ -->.*?<!-- end generated -->", "\n\n", markdown, flags=re.S)
    found, block = [], []

    def flush() -> None:
        paragraph = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", re.sub(r"`[^`]*`", "X", " ".join(block)))
        found.extend(s for s in re.split(r"(?<=[.!?])\s+(?=[A-Z`(\[\"*])", paragraph) if s.split())
        block.clear()
    for line in text.splitlines():
        stripped = line.strip()
        item = re.match(r"([-*]|\d+\.)\s+", stripped)
        if not stripped or stripped.startswith(("|", "#", "<!--")) or item:
            flush()
        if stripped and not stripped.startswith(("|", "#", "<!--")):
            block.append(stripped[item.end():] if item else stripped)
    flush()
    return found


def test_sentences_are_split_at_their_ends_and_nowhere_else():
    page = "# Title\n\nOne two three. Four `a b c` five.\n- an item\n  goes on. Next one\n\n| a | b |\n```bash\nx. Y\n```\n"
    assert [len(s.split()) for s in sentences(page)] == [3, 3, 4, 2]


@pytest.mark.parametrize("page", ["README.md", *sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md"))])
def test_every_page_is_written_in_short_sentences(page):
    """A reader takes a page in at a sitting: the median sentence at most 25 words, none over 60."""
    import statistics

    words = [len(s.split()) for s in sentences((ROOT / page).read_text(encoding="utf-8"))]
    long = [s for s in sentences((ROOT / page).read_text(encoding="utf-8")) if len(s.split()) > 60]
    assert statistics.median(words) <= 25 and not long, (statistics.median(words), [s[:80] for s in long])
