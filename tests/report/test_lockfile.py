"""storyrewrite.report.lockfile: the workspace's dvc.lock forgets the stages whose outputs were
built elsewhere, and only those; then DVC restores them from its run cache, not running them."""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from storyrewrite.report.lockfile import forget


def _dvc(repo: Path, *args: str) -> str:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run([sys.executable, "-m", "dvc", *args], cwd=repo, env=env, check=True, capture_output=True, text=True,
                          timeout=120).stdout


@pytest.fixture
def built_elsewhere(tmp_path):
    """A DVC repo of two stages, built here (DVC's run cache holds both), then its dvc.lock as
    another machine would have committed it: `stamp`'s output other bytes, in no cache here;
    `copy`'s the same."""
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    _dvc(repo, "init", "-q")
    (repo / "in.txt").write_text("story\n")
    (repo / "params.yaml").write_text("lr: 3e-05\nbatch: 2\n")
    (repo / "dvc.yaml").write_text(yaml.safe_dump({"stages": {
        "copy": {"cmd": "cp in.txt copy.txt", "deps": ["in.txt"], "outs": ["copy.txt"]},
        "stamp": {"cmd": "cat copy.txt > stamp.txt && echo stamped >> stamp.txt && echo ran >> ran.log", "deps": ["copy.txt"], "params": ["lr", "batch"],
                  "outs": ["stamp.txt"]}}}, sort_keys=False))
    _dvc(repo, "repro", "-q")
    built_here = (repo / "dvc.lock").read_text()
    elsewhere = built_here.replace(_md5(repo, "stamp"), hashlib.md5(b"built elsewhere").hexdigest())
    assert elsewhere != built_here and "lr: 3e-05" in built_here  # a YAML 1.2 float, unquoted
    (repo / "dvc.lock").write_text(elsewhere)
    (repo / "stamp.txt").unlink()
    return repo, built_here, elsewhere


def _md5(repo: Path, stage: str) -> str:
    return yaml.safe_load((repo / "dvc.lock").read_text())["stages"][stage]["outs"][0]["md5"]


def test_the_lock_forgets_what_was_built_elsewhere_and_dvc_restores_it_from_the_run_cache(built_elsewhere):
    repo, built_here, elsewhere = built_elsewhere
    assert forget(repo) == ["stamp"]
    lock = (repo / "dvc.lock").read_text()
    assert "stamp" not in yaml.safe_load(lock)["stages"] and "lr: 3e-05" not in lock
    assert lock.split("  stamp:")[0] == elsewhere.split("  stamp:")[0]  # DVC's layout of `copy`, byte for byte
    assert forget(repo) == [] and (repo / "dvc.lock").read_text() == lock  # nothing left to drop
    # DVC now restores `stamp` from the run cache: the command does not run a second time.
    _dvc(repo, "repro")
    assert (repo / "ran.log").read_text() == "ran\n" and (repo / "stamp.txt").read_text() == "story\nstamped\n"
    assert (repo / "dvc.lock").read_text() == built_here


def test_without_forgetting_dvc_runs_the_stage_again(built_elsewhere):
    """What `forget` is for: DVC counts the stage as unchanged and never asks its run cache."""
    repo, _, _ = built_elsewhere
    _dvc(repo, "repro")
    assert (repo / "ran.log").read_text() == "ran\nran\n"


def test_a_lock_whose_outputs_are_cached_and_a_repository_without_one_are_left_alone(built_elsewhere):
    repo, built_here, _ = built_elsewhere
    (repo / "dvc.lock").write_text(built_here)
    assert forget(repo) == [] and (repo / "dvc.lock").read_text() == built_here
    (repo / "dvc.lock").unlink()
    assert forget(repo) == [] and not (repo / "dvc.lock").exists()
    result = subprocess.run([sys.executable, "-m", "storyrewrite.report.lockfile", "forget"], cwd=repo, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0 and result.stdout == ""
