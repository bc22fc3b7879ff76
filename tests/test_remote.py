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


@pytest.mark.slow
def test_experiments_from_an_offline_machine_come_back_as_a_bundle_that_dvc_metrics_diff_reads(tmp_path):
    """offline/unpack.sh as after a GPU comparison: the machine ran two experiments in a git
    repository made of a copy of the project's tree (offline/job.sh) and bundled their refs as its
    poll does. Here the results land in runs/NAME.<n>; the experiments are fetched, and
    `dvc metrics diff` compares them; the bundle kept beside the runs holds only what the
    project's commit lacks, and a fresh clone of the project fetches the experiments from it."""
    import tarfile

    unpack = Path(__file__).resolve().parents[1] / "offline" / "unpack.sh"
    project, device, clone = tmp_path / "project", tmp_path / "device", tmp_path / "clone"
    project.mkdir()
    _git(project, "init", "-q")
    _dvc(project, "init", "-q")
    (project / "in.txt").write_text("".join(f"story {i} of the bundled data\n" for i in range(20000)))  # ~0.5 MB
    (project / "params.yaml").write_text("objective: nll\n")
    (project / "dvc.yaml").write_text(PIPELINE)
    (project / ".gitignore").write_text("ran.log\n/bench-out/\n")
    _git(project, "add", "-A")
    _git(project, "commit", "-qm", "pipeline")

    # The machine: a copy of the tree, committed afresh (no .git travels), two experiments, the poll's bundle.
    device.mkdir()
    _run(tmp_path, "bash", "-c", f"git -C {project} archive HEAD | tar x -C {device}")
    _git(device, "init", "-q")
    _git(device, "add", "-A")
    _git(device, "commit", "-qm", "device copy of the project")
    for name, objective in (("gpu-dto", "score"), ("gpu-cpo", "cpo_grid")):
        _dvc(device, "exp", "run", "-n", name, "-S", f"objective={objective}")
    refs = _git(device, "for-each-ref", "--format=%(refname)", "refs/exps/*/*/*").split()  # as offline/job.sh poll
    _git(device, "bundle", "create", "-q", str(tmp_path / "exps.bundle"), *refs)
    (device / "runs" / "gpu").mkdir(parents=True)
    head = _git(project, "rev-parse", "HEAD").strip()
    (device / "runs" / "gpu" / "gpu-dto.json").write_text(json.dumps({"name": "gpu-dto", "source_commit": head[:7]}))
    (device / ".dvc" / "tmp" / "exps" / "tmpab12" / "reports" / "stages").mkdir(parents=True)
    (device / ".dvc" / "tmp" / "exps" / "tmpab12" / "reports" / "stages" / "train.json").write_text("{}")
    (device / "reports" / "bench").mkdir(parents=True)
    (device / "reports" / "bench" / "comparison.json").write_text('{"NVIDIA X100": {}}')  # the bench's record
    with tarfile.open(tmp_path / "results.tar.gz", "w:gz") as archive:
        for path in ("runs/gpu", ".dvc/tmp/exps/tmpab12", "reports/bench"):
            archive.add(device / path, arcname=path)

    _git(tmp_path, "clone", "-q", str(project), str(clone))
    usage = subprocess.run(["bash", str(unpack), "gpu"], cwd=clone, capture_output=True, text=True)
    assert usage.returncode == 2 and "usage: bash offline/unpack.sh NAME RESULTS.tar.gz [EXPS.bundle]" in usage.stderr
    wrong = subprocess.run(["bash", str(unpack), "smoke", str(tmp_path / "results.tar.gz")], cwd=clone, capture_output=True, text=True)
    assert wrong.returncode == 2 and "holds no runs/smoke" in wrong.stderr and not (clone / "runs").exists()
    shown = _run(clone, "bash", str(unpack), "gpu", str(tmp_path / "results.tar.gz"), str(tmp_path / "exps.bundle"))
    assert shown.strip() == "runs/gpu.1: 1 run(s), 2 experiment(s) fetched (dvc metrics diff A B)"
    assert (clone / "runs" / "gpu.1" / "gpu-dto.json").exists()
    assert (clone / "bench-out" / "gpu.1" / "tmpab12" / "reports" / "stages" / "train.json").exists()
    assert (clone / "reports" / "bench" / "comparison.json").read_text() == '{"NVIDIA X100": {}}'  # where the benches keep theirs
    diff = _dvc(clone, "metrics", "diff", "gpu-dto", "gpu-cpo")
    assert "metrics.json" in diff and f"{len('score')}" in diff and f"{len('cpo_grid')}" in diff, diff

    # Filed under the project's commit, whose tree the machine's copy had: listed with it.
    listed = json.loads(_dvc(clone, "exp", "show", "--json"))
    assert listed[1]["rev"] == head and {r["name"] for e in listed[1]["experiments"] for r in e["revs"]} == {"gpu-dto", "gpu-cpo"}
    # Kept beside the runs without the project's own objects.
    kept = clone / "runs" / "gpu.1" / "exps.bundle"
    assert kept.stat().st_size < (tmp_path / "exps.bundle").stat().st_size / 4
    _git(clone, "add", "runs")
    _git(clone, "commit", "-qm", "GPU runs")
    fresh = tmp_path / "fresh"
    _git(tmp_path, "clone", "-q", str(clone), str(fresh))
    _git(fresh, "fetch", "-q", "runs/gpu.1/exps.bundle", "refs/exps/*:refs/exps/*")
    assert _dvc(fresh, "metrics", "diff", "gpu-dto", "gpu-cpo") == diff
    # The same results again: nothing unpacked, no second folder of the same runs.
    again = _run(clone, "bash", str(unpack), "gpu", str(tmp_path / "results.tar.gz"), str(tmp_path / "exps.bundle"))
    assert again.strip() == "runs/gpu.1 already holds these runs: nothing unpacked" and not (clone / "runs" / "gpu.2").exists()
    (tmp_path / "bad.bundle").write_text("not a bundle\n")  # a damaged copy: named, nothing unpacked
    bad = subprocess.run(["bash", str(unpack), "gpu", str(tmp_path / "results.tar.gz"), str(tmp_path / "bad.bundle")], cwd=clone,
                         capture_output=True, text=True)
    assert bad.returncode == 1 and f"error: {tmp_path / 'bad.bundle'}: " in bad.stderr and not (clone / "runs" / "gpu.2").exists()
    # A later poll's results (one more run) take the next number; unpacked first without the bundle.
    (device / "runs" / "gpu" / "gpu-cpo.json").write_text(json.dumps({"name": "gpu-cpo", "source_commit": head[:7]}))
    with tarfile.open(tmp_path / "later.tar.gz", "w:gz") as archive:
        archive.add(device / "runs" / "gpu", arcname="runs/gpu")
    later = _run(clone, "bash", str(unpack), "gpu", str(tmp_path / "later.tar.gz"))
    assert later.strip() == "runs/gpu.2: 2 run(s), 0 experiment(s) fetched (dvc metrics diff A B)"
    # Then with it: an experiment of that name here with another commit is never overwritten...
    bundled = [tmp_path / "later.tar.gz", tmp_path / "exps.bundle"]
    dto = next(ref for ref in _git(clone, "for-each-ref", "--format=%(refname)", "refs/exps").split() if ref.endswith("/gpu-dto"))
    kept_dto = _git(clone, "rev-parse", dto).strip()
    _git(clone, "update-ref", dto, _git(clone, "rev-parse", dto.replace("gpu-dto", "gpu-cpo")).strip())
    clash = subprocess.run(["bash", str(unpack), "gpu", *map(str, bundled)], cwd=clone, capture_output=True, text=True)
    assert clash.returncode == 1 and f"error: {dto} exists with another commit" in clash.stderr
    assert not (clone / "runs" / "gpu.2" / "exps.bundle").exists() and not (clone / "runs" / "gpu.3").exists()
    # ...and where each is already, the same bundle files it there again, into the folder of its runs.
    _git(clone, "update-ref", dto, kept_dto)
    fetched = _run(clone, "bash", str(unpack), "gpu", *map(str, bundled))
    assert fetched.strip() == "runs/gpu.2: the same runs, unpacked before; 2 experiment(s) fetched (dvc metrics diff A B)"
    assert (clone / "runs" / "gpu.2" / "exps.bundle").exists() and not (clone / "runs" / "gpu.3").exists()
    assert _run(clone, "bash", str(unpack), "gpu", *map(str, bundled)).strip() == "runs/gpu.2 already holds these runs: nothing unpacked"
