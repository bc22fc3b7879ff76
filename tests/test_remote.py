"""Experiments move between machines the DVC way: `dvc exp push` and `dvc push --run-cache` to a
DVC remote (a local folder here, as in docs/pipeline.md), then `dvc exp pull` and `dvc fetch
--run-cache` in a fresh clone. Real DVC and git, no network."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

# The comparison's shape: a shared stage every experiment needs (`prepare`), a stage whose output
# depends on the experiment's params (`train`), and its metrics. Each stage leaves a line in
# ran.log (ignored by git), so a test sees which stages ran rather than were restored.
PIPELINE = """stages:
  prepare:
    cmd: cat in.txt in.txt > prepared.txt && echo prepare >> ran.log
    deps: [in.txt]
    outs: [prepared.txt]
  train:
    cmd: >-
      python -c "import yaml; p = yaml.safe_load(open('params.yaml'));
      open('model.txt', 'w').write(p['objective'] * 3);
      open('metrics.json', 'w').write('{\\"score\\": %d}' % len(p['objective']))"
      && echo train >> ran.log
    deps: [prepared.txt]
    params: [objective]
    outs: [model.txt]
    metrics: [{metrics.json: {cache: false}}]
"""


def _run(cwd: Path, *args: str) -> str:
    result = subprocess.run(list(args), cwd=cwd, capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, f"{' '.join(args)}:\n{result.stdout}{result.stderr}"
    return result.stdout


def _dvc(cwd: Path, *args: str) -> str:
    return _run(cwd, sys.executable, "-m", "dvc", *args)


def _git(cwd: Path, *args: str) -> str:
    return _run(cwd, "git", "-c", "user.name=t", "-c", "user.email=t@t", *args)


@pytest.mark.slow
def test_an_experiment_and_its_run_cache_move_to_a_fresh_clone_through_a_local_remote(tmp_path):
    origin, storage, first, clone = tmp_path / "origin.git", tmp_path / "storage", tmp_path / "first", tmp_path / "clone"
    _run(tmp_path, "git", "init", "-q", "--bare", str(origin))
    first.mkdir()
    _git(first, "init", "-q")
    _dvc(first, "init", "-q")
    (first / "in.txt").write_text("story\n")
    (first / "params.yaml").write_text("objective: nll\n")
    (first / "dvc.yaml").write_text(PIPELINE)
    (first / ".gitignore").write_text("ran.log\n")
    _dvc(first, "remote", "add", "-d", "storage", str(storage))
    _git(first, "add", "-A")
    _git(first, "commit", "-qm", "pipeline")
    _git(first, "remote", "add", "origin", str(origin))
    _git(first, "push", "-q", "origin", "HEAD:main")

    # On the first machine: an experiment, then it and the run cache go to the remotes.
    _dvc(first, "exp", "run", "-n", "dto", "-S", "objective=score")
    _dvc(first, "exp", "push", "origin", "dto")
    _dvc(first, "push", "--run-cache")

    # A fresh clone of the code alone: it pulls the experiment, then the run cache.
    _run(tmp_path, "git", "clone", "-q", "-b", "main", str(origin), str(clone))
    _dvc(clone, "exp", "pull", "origin", "dto")
    _dvc(clone, "fetch", "--run-cache")  # (`pull` would also check out the workspace, whose dvc.lock is not committed)
    shown = json.loads(_dvc(clone, "exp", "show", "--json"))
    experiments = [exp for commit in shown for exp in commit.get("experiments") or []]
    runs = {run["name"]: run for exp in experiments for run in exp["revs"]}
    assert "dto" in runs, shown
    data = runs["dto"]["data"]
    assert data["params"]["params.yaml"]["data"]["objective"] == "score"
    assert data["metrics"]["metrics.json"]["data"]["score"] == len("score")
    assert not (clone / "dvc.lock").exists()  # nothing but the run cache says `prepare` ran

    # A new experiment there restores the shared stage from the run cache and runs only its own.
    _dvc(clone, "exp", "run", "-n", "delta", "-S", "objective=delta")
    assert (clone / "ran.log").read_text().split() == ["train"]
    # The pulled experiment's outputs too: `dvc exp apply` checks them out from the pulled cache.
    _dvc(clone, "exp", "apply", "dto")
    assert (clone / "model.txt").read_text() == "score" * 3
