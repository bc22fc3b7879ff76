"""storyrewrite.report.lockfile: the workspace's dvc.lock takes a gathered experiment's entries
for the stages whose outputs were built elsewhere, and only those; then DVC restores them."""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from helpers import DictFS
from storyrewrite.io import InputError
from storyrewrite.report.gather import gather_run
from storyrewrite.report.lockfile import adopt, stale_stages


def _entry(cmd="run", deps="d1", params=1, outs="o1") -> dict:
    return {"cmd": cmd, "deps": [{"path": "in", "md5": deps}], "params": {"params.yaml": {"x": params}},
            "outs": [{"path": "out", "md5": outs}]}


def test_a_stage_is_stale_only_with_the_same_command_deps_and_params_other_outputs_and_none_of_them_cached():
    ours = {"stages": {"same": _entry(), "built_elsewhere": _entry(outs="theirs"), "other_params": _entry(params=2, outs="x"),
                       "other_deps": _entry(deps="d2", outs="x"), "other_cmd": _entry(cmd="other", outs="x"),
                       "cached_here": _entry(outs="x"), "not_in_theirs": _entry(outs="x")}}
    theirs = {"stages": {"same": _entry(), "built_elsewhere": _entry(), "other_params": _entry(), "other_deps": _entry(),
                         "other_cmd": _entry(), "cached_here": _entry()}}
    uncached = {"same", "built_elsewhere", "other_params", "other_deps", "other_cmd", "not_in_theirs"}
    assert stale_stages(ours, theirs, uncached) == ["built_elsewhere"]
    assert stale_stages({}, theirs, uncached) == [] and stale_stages(ours, {}, uncached) == []


def _dvc(repo: Path, *args: str) -> str:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run([sys.executable, "-m", "dvc", *args], cwd=repo, env=env, check=True, capture_output=True, text=True,
                          timeout=120).stdout


@pytest.fixture
def built_elsewhere(tmp_path):
    """A DVC repo of two stages, built here (what the experiment's lock records), then its
    dvc.lock as another machine would have committed it: `stamp`'s output (a record with a wall
    time, say) other bytes, in no cache here; `copy`'s the same."""
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    _dvc(repo, "init", "-q")
    (repo / "in.txt").write_text("story\n")
    (repo / "params.yaml").write_text("lr: 3e-05\nbatch: 2\n")
    (repo / "dvc.yaml").write_text(yaml.safe_dump({"stages": {
        "copy": {"cmd": "cp in.txt copy.txt", "deps": ["in.txt"], "outs": ["copy.txt"]},
        "stamp": {"cmd": "cat copy.txt > stamp.txt && echo here >> stamp.txt", "deps": ["copy.txt"], "params": ["lr", "batch"],
                  "outs": ["stamp.txt"]}}}, sort_keys=False))
    _dvc(repo, "repro", "-q")
    built_here = (repo / "dvc.lock").read_text()
    elsewhere = built_here.replace(_md5(repo, "stamp"), hashlib.md5(b"built elsewhere").hexdigest())
    assert elsewhere != built_here and "lr: 3e-05" in built_here  # a YAML 1.2 float, unquoted
    (repo / "dvc.lock").write_text(elsewhere)
    gather_run(DictFS({"params.yaml": (repo / "params.yaml").read_bytes(), "dvc.lock": built_here.encode()}),
               {"name": "first", "rev": "f" * 40, "base": "abcdef1234"}, repo / "runs" / "t")
    return repo, built_here, elsewhere


def _md5(repo: Path, stage: str) -> str:
    return yaml.safe_load((repo / "dvc.lock").read_text())["stages"][stage]["outs"][0]["md5"]


def test_the_lock_takes_the_experiments_entry_for_what_was_built_elsewhere_and_dvc_then_finds_it_up_to_date(built_elsewhere):
    repo, built_here, _ = built_elsewhere
    assert "stamp" in _dvc(repo, "status")  # its output is in no cache: DVC would run it again
    assert adopt(repo, repo / "runs" / "t" / "first.json") == ["stamp"]
    assert (repo / "dvc.lock").read_text() == built_here  # DVC's own layout, byte for byte
    assert "up to date" in _dvc(repo, "status")
    # Nothing left to take: a second call changes nothing.
    assert adopt(repo, repo / "runs" / "t" / "first.json") == [] and (repo / "dvc.lock").read_text() == built_here


def test_an_entry_with_other_params_stays_and_dvc_runs_that_stage_as_before(built_elsewhere):
    repo, _, elsewhere = built_elsewhere
    (repo / "params.yaml").write_text("lr: 1e-05\nbatch: 2\n")
    lock = elsewhere.replace("lr: 3e-05", "lr: 1e-05")  # the committing machine ran other params
    (repo / "dvc.lock").write_text(lock)
    assert adopt(repo, repo / "runs" / "t" / "first.json") == [] and (repo / "dvc.lock").read_text() == lock


def test_a_run_without_a_lock_is_an_error_and_a_repository_without_one_is_left_alone(built_elsewhere, tmp_path):
    repo, _, elsewhere = built_elsewhere
    gather_run(DictFS({"params.yaml": b"lr: 1\n"}), {"name": "bare", "rev": "e" * 40, "base": "abcdef1234"}, repo / "runs" / "u")
    with pytest.raises(InputError, match=r"bare.json: the gathered run has no dvc.lock"):
        adopt(repo, repo / "runs" / "u" / "bare.json")
    assert (repo / "dvc.lock").read_text() == elsewhere
    (repo / "dvc.lock").unlink()
    assert adopt(repo, repo / "runs" / "t" / "first.json") == [] and not (repo / "dvc.lock").exists()
    shutil.rmtree(repo / "runs")
    result = subprocess.run([sys.executable, "-m", "storyrewrite.report.lockfile", "adopt", "runs/t/first.json"], cwd=repo,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "error: runs/t/first.json: no such gathered run (python -m storyrewrite.report.gather --out runs/t --names first" in result.stderr
