"""dvc.yaml against what DVC needs of it. Code deps against what each stage really runs: the
import closure of its script inside the package (storyrewrite.closure). A missing dep would let
`dvc repro` report "up to date" over a stale result; an extra one reruns a stage for code it never
runs. Outputs against DVC's run cache: one `outs` entry with `cache: false` and DVC never saves
the stage there, so every experiment of a profile would run it again (train_nll, the LLM
baselines) instead of restoring it. Deps against outputs: a dep inside another stage's output
folder fails `dvc exp run` where it restores that stage on a machine that never built the
commit's outputs (dvc.yaml, "Run cache")."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import yaml

from storyrewrite.closure import closure

from helpers import ROOT

SCRIPT = re.compile(r"python (stages/\w+\.py)")
# Stages allowed outs kept in git (`cache: false`), so never restored from the run cache.
IN_GIT = {"report": "the results table of the commit; the last stage, and cheap"}


def stage_deps(dvc: dict) -> dict[str, tuple[str, list[str]]]:
    """stage name -> (its script, its deps), `foreach` stages once (their code deps do not vary)."""
    found = {}
    for name, stage in dvc["stages"].items():
        body = stage.get("do", stage)
        match = SCRIPT.search(body["cmd"])
        assert match, f"stage `{name}`: no `python stages/<name>.py` in its cmd"
        found[name] = (match.group(1), list(body.get("deps", [])))
    return found


def code_dep_problems(dvc: dict, root: Path = ROOT) -> list[str]:
    problems = []
    for name, (script, deps) in stage_deps(dvc).items():
        if script not in deps:
            problems.append(f"stage `{name}`: its script {script} is not in its deps")
        needed = {path.relative_to(root).as_posix() for path in closure(root / script)}
        listed = {dep for dep in deps if dep.startswith("src/")}
        problems += [f"stage `{name}`: dvc.yaml deps miss {path} (imported by {script})" for path in sorted(needed - listed)]
        problems += [f"stage `{name}`: dvc.yaml lists {path}, which {script} never imports" for path in sorted(listed - needed)]
    return problems


def _dvc() -> dict:
    return yaml.safe_load((ROOT / "dvc.yaml").read_text(encoding="utf-8"))


def test_every_stage_lists_exactly_the_package_code_it_runs():
    assert code_dep_problems(_dvc()) == []


def test_a_removed_dep_is_named_with_its_stage():
    dvc = _dvc()
    deps = dvc["stages"]["score"]["do"]["deps"]
    deps.remove("src/storyrewrite/models/encoding.py")
    assert code_dep_problems(dvc) == [
        "stage `score`: dvc.yaml deps miss src/storyrewrite/models/encoding.py (imported by stages/score.py)"
    ]


def test_the_closure_follows_imports_inside_functions_and_package_inits():
    files = {p.relative_to(ROOT).as_posix() for p in closure(ROOT / "stages" / "llm.py")}
    # LocalBackend imports the model store inside its constructor; that code runs too.
    assert "src/storyrewrite/models/store.py" in files
    assert {"src/storyrewrite/__init__.py", "src/storyrewrite/llm/__init__.py"} <= files
    assert not any(name.startswith("src/storyrewrite/training/") for name in files)


def test_the_closure_command_rewrites_stale_deps_and_names_a_missing_file(tmp_path):
    """`python -m storyrewrite.closure --update FILE` puts back a dep taken out of a copy of
    dvc.yaml (everything else kept as it was); a missing file, or a stage script that does not
    exist, is one line naming it, and the file is left as it was."""
    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "storyrewrite.closure", *args], cwd=ROOT, capture_output=True,
                              text=True, timeout=60)

    original = (ROOT / "dvc.yaml").read_text()
    copy = tmp_path / "dvc.yaml"
    copy.write_text(original.replace("\n      - src/storyrewrite/models/encoding.py\n", "\n", 1))  # a whole line
    result = run("--update", str(copy))
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["train_nll: code deps updated"]  # the first stage that lists it at that indent
    assert copy.read_text() == original

    bad = original.replace("- stages/score.py\n", "- stages/scores.py\n", 1)
    copy.write_text(bad)
    line = bad.splitlines().index("        - stages/scores.py") + 1
    result = run("--update", str(copy))
    assert (result.returncode, result.stderr) == (2, f"error: {copy}:{line}: stages/scores.py: no such file\n")
    assert copy.read_text() == bad
    result = run("stages/scores.py")
    assert (result.returncode, result.stderr) == (2, "error: stages/scores.py: no such file\n")
    assert run().returncode == 2 and run("--help").returncode == 0


def objective_problems(dvc: dict, objectives: dict | None = None) -> list[str]:
    """What the train stage would miss of each registered objective: the registry imports an
    objective's module by name, which the import closure cannot follow, so stages/train.py
    imports every one (or an edit to the new loss would leave `dvc repro` "up to date"), and the
    objective's params section must be among the stage's params (or changing it would not rerun)."""
    from storyrewrite.objectives.registry import OBJECTIVES

    body = dvc["stages"]["train"]
    script = SCRIPT.search(body["cmd"]).group(1)
    needed = {path.relative_to(ROOT).as_posix() for path in closure(ROOT / script)}
    problems = []
    for name, objective in (OBJECTIVES if objectives is None else objectives).items():
        path = "src/" + objective.module_name.replace(".", "/") + ".py"
        if path not in needed:
            problems.append(f"objective `{name}`: {script} does not import {objective.module_name}, so the train stage's "
                            f"deps miss {path} (add `import {objective.module_name}  # noqa: F401` there, then "
                            "`python -m storyrewrite.closure --update dvc.yaml`)")
        if objective.settings and objective.settings not in body.get("params", []):
            problems.append(f"objective `{name}`: its params section `{objective.settings}` is not among the train "
                            "stage's params in dvc.yaml")
    return problems


def test_the_train_stage_runs_and_lists_every_registered_objective():
    assert objective_problems(_dvc()) == []


def test_no_training_stage_depends_on_the_metrics_code():
    """A new or changed metric rescores the systems (docs/extending.md); it never retrains them.
    Only the DTO scorer (lm_scorer) and what it imports are shared with scoring."""
    trains = {name: deps for name, (_, deps) in stage_deps(_dvc()).items() if name in ("train_nll", "train")}
    assert set(trains) == {"train_nll", "train"}
    shared = {name: [d for d in deps if d.startswith("src/storyrewrite/metrics/") and not d.endswith(("/__init__.py", "/lm_scorer.py"))]
              for name, deps in trains.items()}
    assert shared == {"train_nll": [], "train": []}


def test_a_new_metric_reruns_only_the_stages_that_score_test_and_report():
    """A new overlap metric edits three files (docs/extending.md, A metric): its functions' module,
    the registry and SystemMetrics' module. Only the stages that score, test and report list them,
    so the models, the predictions and the LLM replies stay as they are."""
    import inspect

    from storyrewrite.metrics import lexical, registry
    from storyrewrite.metrics.artifacts import SystemMetrics

    edited = {Path(inspect.getsourcefile(code)).relative_to(ROOT).as_posix() for code in (lexical, registry, SystemMetrics)}
    assert len(edited) == 3
    listing = {name: sorted(edited & set(deps)) for name, (_, deps) in stage_deps(_dvc()).items()}
    assert {name for name, files in listing.items() if files} == {
        "score", "score_llm", "score_sanity", "validity", "significance", "report"}, listing


def test_only_the_train_stage_depends_on_the_objective_registry():
    """A new objective (docs/extending.md) edits the registry, its own module, params.yaml and the
    train stage's entries: the NLL model and every stage before `train` or beside it keep their
    outputs. So no other stage lists the registry or another objective's module, and params.py,
    which every stage lists, holds no objective's settings."""
    from storyrewrite.objectives.registry import SETTINGS
    from storyrewrite.params import SECTIONS

    deps = stage_deps(_dvc())
    objective_code = {f"src/storyrewrite/objectives/{name}.py" for name in ("registry", "dto", "cpo", "rloo")}
    assert sorted(name for name, (_, listed) in deps.items() if objective_code & set(listed)) == ["train"]
    assert not set(SETTINGS) & set(SECTIONS)
    nll = deps["train_nll"][1]
    assert [d for d in nll if d.startswith("src/storyrewrite/objectives/")] == [
        "src/storyrewrite/objectives/__init__.py", "src/storyrewrite/objectives/base.py", "src/storyrewrite/objectives/nll.py"]


def test_an_objective_the_train_stage_misses_is_named_with_the_fix():
    """The objective is none a user adds: not docs/extending.md's `smoothed_nll`, which a tree that
    followed that page registers, imports and lists."""
    from storyrewrite.objectives.registry import Objective

    new = Objective("unlisted", "Unlisted", "an objective dvc.yaml does not know", "unlisted", settings="unlisted")
    assert objective_problems(_dvc(), {"unlisted": new}) == [
        "objective `unlisted`: stages/train.py does not import storyrewrite.objectives.unlisted, so the train "
        "stage's deps miss src/storyrewrite/objectives/unlisted.py (add `import storyrewrite.objectives.unlisted  "
        "# noqa: F401` there, then `python -m storyrewrite.closure --update dvc.yaml`)",
        "objective `unlisted`: its params section `unlisted` is not among the train stage's params in dvc.yaml",
    ]


def run_cache_problems(dvc: dict) -> list[str]:
    """The stages DVC would never save to its run cache (dvc/stage/__init__.py, Stage.run: any
    `outs` entry that is not cached turns it off; `metrics` and `plots` entries do not)."""
    problems = []
    for name, stage in dvc["stages"].items():
        for out in stage.get("do", stage).get("outs", []):
            path, options = next(iter(out.items())) if isinstance(out, dict) else (out, {})
            if options.get("cache", True) is False and name not in IN_GIT:
                problems.append(f"stage `{name}`: `outs` entry {path} has `cache: false`, so DVC never saves the "
                                "stage to its run cache (cache it, or declare it under `metrics` or `plots`)")
    return problems


def test_every_stage_but_the_report_can_be_restored_from_the_run_cache():
    assert run_cache_problems(_dvc()) == []


def test_an_output_kept_in_git_is_named_with_its_stage():
    dvc = _dvc()
    outs = dvc["stages"]["score"]["do"]["outs"]
    outs[outs.index("reports/stages/score-${item}.json")] = {"reports/stages/score-${item}.json": {"cache": False}}
    assert run_cache_problems(dvc) == [
        "stage `score`: `outs` entry reports/stages/score-${item}.json has `cache: false`, so DVC never saves the "
        "stage to its run cache (cache it, or declare it under `metrics` or `plots`)"
    ]


def nested_dep_problems(stages: list[tuple[str, list[str], list[str]]]) -> list[str]:
    """Deps that lie inside another stage's output folder, from (stage, deps, outs) with paths
    resolved (`foreach` items and `${task}` filled in)."""
    outs = {out: name for name, _, paths in stages for out in paths}
    problems = []
    for name, deps, _ in stages:
        for dep in deps:
            for out, producer in outs.items():
                if dep.startswith(out.rstrip("/") + "/"):
                    problems.append(f"stage `{name}`: dep {dep} lies inside {out}, an output of `{producer}`; "
                                    "depend on the whole output, or make that folder an output of its own")
    return problems


def test_no_dep_lies_inside_an_output_folder():
    from dvc.repo import Repo

    with Repo(str(ROOT)) as repo:
        stages = [(stage.addressing, [dep.def_path for dep in stage.deps], [out.def_path for out in stage.outs])
                  for stage in repo.index.stages]
    assert {"train_nll", "score@nll", "report"} <= {name for name, _, _ in stages}
    assert nested_dep_problems(stages) == []


def test_a_dep_inside_an_output_folder_is_named_with_both_stages():
    stages = [("prepare", ["data/raw"], ["data/prepared"]), ("train_nll", ["data/prepared/timetravel", "data/prepared2"], [])]
    assert nested_dep_problems(stages) == [
        "stage `train_nll`: dep data/prepared/timetravel lies inside data/prepared, an output of `prepare`; "
        "depend on the whole output, or make that folder an output of its own"
    ]


def test_relative_imports_and_renamed_files_count(tmp_path, monkeypatch):
    """A module's relative imports resolve against its own package (`.` is it, `..` its parent),
    and a file's name is part of the code digest (a module moved with its content unchanged is
    other code)."""
    from storyrewrite import closure as closure_module

    package = tmp_path / "storyrewrite"
    files = {"__init__.py": "", "a/__init__.py": "from .g import h\n", "a/b.py": "from . import c\nfrom ..d import e\n",
             "a/c.py": "", "a/g.py": "h = 1\n", "d.py": "e = 1\n", "f.py": ""}  # (a package's own `.` is itself)
    for name, text in files.items():
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_text(text)
    monkeypatch.setattr(closure_module, "PACKAGE_DIR", package)
    found = closure_module.closure(package / "a" / "b.py")
    expected = ["__init__.py", "a/__init__.py", "a/b.py", "a/c.py", "a/g.py", "d.py"]
    assert sorted(path.relative_to(package).as_posix() for path in found) == expected
    assert closure_module.digest({package / "a" / "c.py"}) != closure_module.digest({package / "f.py"})  # both empty
