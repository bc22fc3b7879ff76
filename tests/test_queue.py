"""storyrewrite.queue, the comparison's poll of DVC's queue, against DVC's own `dvc queue status`
on a real queue and a real worker; what the experiments still running have done."""
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from helpers import ROOT

from storyrewrite import queue
from storyrewrite.systems import CHECKPOINTS, TRAIN_STAGES, TRAINING_PLAN

# This Python's scripts (dvc) first on PATH, for the commands the tests run.
ENV = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}


def _runner(cwd: Path):
    """run(*command): its stdout, run in `cwd` with ENV; a non-zero exit fails the test."""
    def run(*args: str) -> str:
        result = subprocess.run(list(args), cwd=cwd, env=ENV, capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        return result.stdout
    return run


def _start_worker(repo: Path) -> None:
    """One DVC queue worker for `repo` (no pipes: the worker it spawns would hold them open until it ends)."""
    subprocess.run(["dvc", "queue", "start", "-j", "1"], cwd=repo, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   timeout=120, check=True)


def _pipeline(repo: Path, dvc_yaml: str, files: dict[str, str] | None = None) -> None:
    """A git repository with DVC in `repo`, committed: `objective: nll` in params.yaml, `dvc_yaml`
    as dvc.yaml and `files` ({path: text}) beside them."""
    run = _runner(repo)
    run("git", "init", "-q")
    run("dvc", "init", "-q")
    for path, text in {"params.yaml": "objective: nll\n", "dvc.yaml": dvc_yaml, **(files or {})}.items():
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text(text)
    run("git", "add", "-A")
    run("git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "pipeline")


@pytest.mark.slow
def test_the_queue_is_dvc_queue_status_without_asking_the_workers(tmp_path):
    """`python -m storyrewrite.queue` against DVC's own `dvc queue status` on a real queue:
    two experiments queued, then run by one worker. The same revisions, names and statuses, and with
    --workers the same worker line."""
    run = _runner(tmp_path)

    def ours(*flags: str) -> list[list[str]]:
        return [line.split() for line in run(sys.executable, "-m", "storyrewrite.queue", *flags).splitlines()]

    def dvcs() -> list[list[str]]:  # Task, Name, Created (a time of two words), Status; a blank line; the workers
        lines = run("dvc", "queue", "status").splitlines()[1:]
        return [fields if not fields or fields[0] == "Worker" else [*fields[:2], fields[-1]] for fields in map(str.split, lines)]

    outside = subprocess.run([sys.executable, "-m", "storyrewrite.queue"], cwd=tmp_path, env=ENV, capture_output=True, text=True)
    assert outside.returncode == 2 and outside.stderr == (f"error: {tmp_path}: not in a DVC repository (`dvc init` makes one); "
                                                          "run this where `dvc queue status` runs\n")
    _pipeline(tmp_path, "stages:\n  train:\n    cmd: python -c \"open('m.txt', 'w').write(open('params.yaml').read())\"\n"
                        "    params: [objective]\n    outs: [m.txt]\n")
    empty = subprocess.run([sys.executable, "-m", "storyrewrite.queue"], cwd=tmp_path, env=ENV, capture_output=True, text=True)
    assert (empty.stdout, empty.stderr) == ("", "no experiment in this repository's queue (`dvc exp run --queue` queues one)\n")
    for name, objective in (("exp-a", "score"), ("exp-b", "delta")):
        run("dvc", "exp", "run", "--queue", "-n", name, "-S", f"objective={objective}")
    queued = ours()
    assert [fields[1:] for fields in queued] == [["exp-a", "Queued"], ["exp-b", "Queued"]]
    (tmp_path / "reports").mkdir()  # from a folder inside the repository: its queue all the same
    inside = subprocess.run([sys.executable, "-m", "storyrewrite.queue"], cwd=tmp_path / "reports", env=ENV, capture_output=True,
                            text=True, check=True)
    assert [line.split() for line in inside.stdout.splitlines()] == queued
    assert ours("--workers") == dvcs() == [*queued, [], ["Worker", "status:", "0", "active,", "0", "idle"]]
    _start_worker(tmp_path)
    try:
        for _ in range(240):
            state = ours()
            if not any(fields[-1] in ("Queued", "Running") for fields in state):
                break
            time.sleep(0.5)
        assert sorted(fields[1:] for fields in state) == [["exp-a", "Success"], ["exp-b", "Success"]]
        assert sorted(state) == sorted(dvcs()[:-2])
        none_failed = subprocess.run([sys.executable, "-m", "storyrewrite.queue", "--failed"], cwd=tmp_path, env=ENV,
                                     capture_output=True, text=True)
        assert (none_failed.stdout, none_failed.stderr) == ("", "no experiment of this repository's queue failed\n")
    finally:
        run("dvc", "queue", "stop")


def test_a_task_a_worker_takes_between_two_reads_is_listed_once_in_its_later_state():
    """A worker takes exp-b from the queue after the poll's first read, and exp-a ends after its
    second. DVC's own listing (BaseStashQueue.status: running, then queued, then done) misses exp-b,
    which would end the comparison's wait while it runs; task_states lists each task once, in its
    later state. The queue below is DVC's celery queue as its reads see it: each read one snapshot."""
    from types import SimpleNamespace

    from dvc.repo.experiments.queue.base import BaseStashQueue, QueueDoneResult
    from dvc.repo.experiments.queue.celery import LocalCeleryQueue

    class MovingQueue:
        iter_failed, iter_success, status = LocalCeleryQueue.iter_failed, LocalCeleryQueue.iter_success, BaseStashQueue.status
        scm = SimpleNamespace(resolve_commit=lambda rev: SimpleNamespace(commit_time=0))

        def __init__(self):
            self.tasks = {"exp-a": "running", "exp-b": "queued", "exp-c": "queued"}
            self.moves = [("exp-b", "running"), ("exp-a", "success")]  # one after each read

        def _read(self, states):
            found = [(SimpleNamespace(stash_rev=f"{name}-rev", name=name), state) for name, state in self.tasks.items() if state in states]
            if self.moves:
                name, state = self.moves.pop(0)
                self.tasks[name] = state
            return found

        def iter_queued(self):
            return (entry for entry, _ in self._read({"queued"}))

        def iter_active(self):
            return (entry for entry, _ in self._read({"running"}))

        def iter_done(self):
            return (QueueDoneResult(entry, SimpleNamespace(exp_hash="h", ref_info=SimpleNamespace(name=entry.name)) if state == "success" else None)
                    for entry, state in self._read({"success", "failed"}))

    dvcs = [(task["name"], task["status"]) for task in MovingQueue().status()]
    assert sorted(dvcs) == [("exp-a", "Running"), ("exp-a", "Success"), ("exp-c", "Queued")]  # exp-b: missed
    assert list(queue.task_states(MovingQueue()).values()) == [("exp-b", "Running"), ("exp-c", "Queued"), ("exp-a", "Success")]


STAGE = '''import json, os, sys, time
from datetime import datetime, timezone
name, gate = sys.argv[1], sys.argv[2]
def record(stage, experiment):
    os.makedirs("reports/stages", exist_ok=True)
    with open(f"reports/stages/{stage}.json", "w") as f:
        json.dump({"stage": stage, "experiment": experiment, "device": "cpu", "wall_s": 1.0,
                   "started_at": datetime.now(timezone.utc).isoformat()}, f)
if name == "first":
    record("first", os.environ["DVC_EXP_NAME"])
    # As the NLL model restored from the run cache: another experiment trained it (to step 4).
    record("train_nll", "gpu.shared-nll")
    with open("reports/train/nll/metrics.json", "w") as f:
        json.dump({"step": 4, "train_loss": 2.0}, f)
else:
    os.makedirs("reports/train/finetuned/plots/metrics", exist_ok=True)
    with open("reports/train/finetuned/plots/metrics/sample_time_share.tsv", "w") as f:
        f.write("step\\tsample_time_share\\n1\\t0.2\\n2\\t0.4\\n3\\t0.6\\n")
    with open("reports/train/finetuned/plots/metrics/train_loss.tsv", "w") as f:  # (the step curve: the pace's step and time)
        f.write("step\\ttrain_loss\\n1\\t2.5\\n2\\t2.0\\n3\\t1.5\\n")
    with open("reports/train/finetuned/metrics.json", "w") as f:
        json.dump({"step": 3, "train_loss": 1.5}, f)
    # What the training wrote as it started, 60 s before its step 3 (TrainingPlan): 20 s a step.
    os.makedirs("models/.checkpoints/finetuned", exist_ok=True)
    with open("models/.checkpoints/finetuned/plan.json", "w") as f:
        json.dump({"steps": 10, "from_step": 0, "started_at": time.time() - 60}, f)
    print("waiting for the gate", file=sys.stderr, flush=True)
    end = time.time() + 90
    while not os.path.exists(gate) and time.time() < end:
        time.sleep(0.1)
    open("model.txt", "w").write("trained")
'''


@pytest.mark.slow
def test_the_experiments_still_running_are_named_with_their_stages_and_steps(tmp_path):
    """On a real DVC queue and worker: while an experiment's training waits, `running` finds its
    workspace through DVC's record of the experiment, with the stage it ran itself (not one
    another experiment ran) and the step of its training under way (not the summary the commit
    holds, nor that of a training restored from the run cache), and `--running` prints them with
    the stage's device and time and the mean of the training's clock curve; once it has ended,
    nothing runs (and nothing is printed) and DVC's record says it succeeded."""
    repo, gate = tmp_path / "repo", tmp_path / "gate"
    repo.mkdir()
    run = _runner(repo)

    # A training summary the commit holds (as the pipeline's, in git): copied into the workspace, not written there.
    _pipeline(repo, f"stages:\n  first:\n    cmd: python stage.py first {gate}\n    deps: [stage.py]\n    outs: [reports/stages]\n"
              f"  train:\n    cmd: python stage.py train {gate}\n    deps: [stage.py, reports/stages]\n    params: [objective]\n"
              "    outs: [reports/train/finetuned, model.txt]\n",
              {"stage.py": STAGE, "reports/train/nll/metrics.json": '{"step": 30, "train_loss": 2.5}'})
    assert queue.running(repo) == {}
    queued_at = time.time()
    run("dvc", "exp", "run", "--queue", "-n", "exp-a", "-S", "objective=score")
    _start_worker(repo)
    try:
        found, end = {}, time.time() + 90
        while not found.get("exp-a", {}).get("trained_to_step") and time.time() < end:
            time.sleep(0.2)
            found = queue.running(repo)
        assert found == {"exp-a": {"stages_ended": ["first"], "trained_to_step": {"finetuned": 3}, "planned_steps": {"finetuned": 10}}}
        shown = run(sys.executable, "-m", "storyrewrite.queue", "--running")
        assert shown.startswith("== stages done in experiments still running\nexp-a: first on cpu in 1.0 s\n"), shown
        # 20 s a step (a little more by the time it is read), 7 steps to go: about 140 s, 2 min.
        pace = re.fullmatch(r"exp-a: finetuned trained to step 3 of 10 \((\d+\.?\d*) s a step so far: about (\d+) min to go; "
                            r"train_loss 1\.5, sample_time_share 40\.0%\)\n", shown.split("\n", 2)[2])
        assert pace and 20 <= float(pace[1]) < 30 and abs(int(pace[2]) - 7 * float(pace[1]) / 60) <= 0.5, shown
        # The trainings' lines alone, as scripts/comparison.sh prints them: the stage's line left out.
        trainings = run(sys.executable, "-m", "storyrewrite.queue", "--trainings")
        assert trainings.startswith("exp-a: finetuned trained to step 3 of 10 (") and trainings.count("\n") == 1, trainings
        (repo / "reports").mkdir(exist_ok=True)  # from a folder inside the repository: the same trainings
        inside = subprocess.run([sys.executable, "-m", "storyrewrite.queue", "--trainings"], cwd=repo / "reports", env=ENV,
                                capture_output=True, text=True, check=True).stdout
        assert inside.split(" (")[0] == trainings.split(" (")[0] and inside.count("\n") == 1, inside
        # Its log so far (DVC's, beside its record), which a machine's poll brings back: what the
        # stage printed while it waits; no failed experiment's.
        (log,) = queue.running_logs(repo).values()
        assert "waiting for the gate" in log.read_text()
        assert run(sys.executable, "-m", "storyrewrite.queue", "--failed-logs", "--running-logs") == f"{log.relative_to(repo)}\n"
        assert run(sys.executable, "-m", "storyrewrite.queue", "--failed-logs") == ""
        gate.touch()
        assert queue.ended(repo, queued_at) == {}
        while (queue.running(repo) or not queue.ended(repo, queued_at)) and time.time() < end:
            time.sleep(0.2)
        assert queue.running(repo) == {} and run(sys.executable, "-m", "storyrewrite.queue", "--running") == ""
        assert run(sys.executable, "-m", "storyrewrite.queue", "--trainings") == ""
        assert queue.running_logs(repo) == {} and run(sys.executable, "-m", "storyrewrite.queue", "--running-logs") == ""
        assert queue.ended(repo, queued_at) == {"succeeded": ["exp-a"]}
        assert queue.ended(repo, time.time() + 60) == {}  # none since then
    finally:
        gate.touch()
        run("dvc", "queue", "stop")


@pytest.mark.slow
def test_an_experiment_run_in_the_workspace_is_not_taken_for_one_still_running(tmp_path):
    """On real DVC: `dvc exp run` in the workspace leaves a record of its stash revision behind at
    PREPARING, the repository as its root. Once the run has ended, nothing runs, no log is listed,
    `--running` prints nothing, and no queued experiment has ended."""
    repo = tmp_path / "repo"
    repo.mkdir()
    run = _runner(repo)
    _pipeline(repo, "stages:\n  train:\n    cmd: python -c \"open('model.txt', 'w').write('x')\"\n    params: [objective]\n"
              "    outs: [model.txt]\n")
    started = time.time()
    run("dvc", "exp", "run", "-n", "exp-w", "-S", "objective=score")
    left = [json.loads(path.read_text()) for path in repo.glob(queue.EXECUTOR_INFO)]
    assert [(info["name"], info["location"], info["status"]) for info in left] == [("exp-w", "workspace", 1)]  # (DVC's leftover)
    assert queue.running(repo) == {} and queue.running_logs(repo) == {} and queue.ended(repo, started) == {}
    shown = subprocess.run([sys.executable, "-m", "storyrewrite.queue", "--running"], cwd=repo, env=ENV, capture_output=True,
                           text=True, timeout=120)
    assert shown.returncode == 0 and shown.stdout == "" and shown.stderr == (  # (a person is told; a script reads nothing)
        "no experiment of this repository's queue is running (`python -m storyrewrite.queue` lists them all)\n")


def _training_under_way(tmp_path, summary: dict, plan: dict | None, logged_at: float = 1180.0,
                        step_curve: tuple[str, float] | None = None) -> Path:
    """A repository whose one queued experiment, exp-a, trains `finetuned` in its own workspace:
    DVC's record of it, DVCLive's summary of the training so far (last written at `logged_at`),
    the plan the training wrote as it started (TrainingPlan), and `step_curve` (its train_loss
    curve's text, last written at the time given), where the pipeline puts them."""
    repo, workspace = tmp_path / "repo", tmp_path / "workspace"
    info = repo / ".dvc" / "tmp" / "exps" / "run" / "abc" / "abc.run"
    info.parent.mkdir(parents=True)
    info.write_text(json.dumps({"name": "exp-a", "root_dir": str(workspace), "status": 1}))
    (workspace / "reports" / "train" / "finetuned").mkdir(parents=True)
    (workspace / "reports" / "train" / "finetuned" / "metrics.json").write_text(json.dumps(summary))
    os.utime(workspace / "reports" / "train" / "finetuned" / "metrics.json", (logged_at, logged_at))
    if step_curve is not None:
        curve = workspace / "reports" / "train" / "finetuned" / "plots" / "metrics" / "train_loss.tsv"
        curve.parent.mkdir(parents=True)
        curve.write_text(step_curve[0])
        os.utime(curve, (step_curve[1], step_curve[1]))
    if plan is not None:
        path = workspace / CHECKPOINTS["finetuned"] / TRAINING_PLAN
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps(plan))
    return repo


def test_a_time_to_go_reads_in_seconds_minutes_or_hours():
    assert [queue.duration(s) for s in (40, 89, 90, 75 * 60, 90 * 60, 2.5 * 3600)] == [
        "40 s", "89 s", "2 min", "75 min", "1.5 h", "2.5 h"]


def test_a_training_under_way_says_its_step_of_its_total_its_pace_and_its_time_to_go(tmp_path):
    # Resumed at step 20 at time 1000, it logged step 50 at 1180: 30 steps, 6 s each; 250 to go, 1,500 s from then.
    repo = _training_under_way(tmp_path, {"step": 50, "train_loss": 1.25}, {"steps": 300, "from_step": 20, "started_at": 1000.0})
    assert queue.progress_lines(repo, now=1180.0) == [
        "exp-a: finetuned trained to step 50 of 300 (6 s a step so far: about 25 min to go; train_loss 1.25)"]
    assert queue.running(repo) == {"exp-a": {"stages_ended": [], "trained_to_step": {"finetuned": 50}, "planned_steps": {"finetuned": 300}}}
    # Read 5 minutes on (step 51 not logged yet): the same pace, 5 minutes less to go.
    assert queue.progress_lines(repo, now=1480.0)[0].endswith("(6 s a step so far: about 20 min to go; train_loss 1.25)")
    # Hours, and seconds: 250 steps of 150 s; 1 step of 45 s, read 40 s after the last.
    slow = _training_under_way(tmp_path / "slow", {"step": 50}, {"steps": 300, "from_step": 20, "started_at": 1000.0},
                               logged_at=1000.0 + 30 * 150)
    assert queue.progress_lines(slow, now=1000.0 + 30 * 150) == ["exp-a: finetuned trained to step 50 of 300 (150 s a step so far: about 10.4 h to go)"]
    done = _training_under_way(tmp_path / "end", {"step": 299}, {"steps": 300, "from_step": 0, "started_at": 0.0}, logged_at=299 * 45.0)
    assert queue.progress_lines(done, now=299 * 45.0 + 40) == ["exp-a: finetuned trained to step 299 of 300 (45 s a step so far: about 5 s to go)"]
    # Later than its pace says (a validation, say): 0 to go, not less.
    assert queue.progress_lines(done, now=299 * 45.0 + 90) == ["exp-a: finetuned trained to step 299 of 300 (45 s a step so far: about 0 s to go)"]


def test_a_training_line_shows_the_clock_curves_mean_and_a_count_curves_last_value(tmp_path):
    """RLOO's `decoding_graphs` (graphs compiled while sampling so far) at its last value, 2; the
    clock's curves at the mean of their last RECENT_STEPS values (12 rows: the last 10, 37.5 %)."""
    repo = _training_under_way(tmp_path, {"step": 12, "train_loss": 1.25}, {"steps": 300, "from_step": 0, "started_at": 1000.0},
                               logged_at=1120.0)
    curves = tmp_path / "workspace" / "reports" / "train" / "finetuned" / "plots" / "metrics"
    curves.mkdir(parents=True, exist_ok=True)
    (curves / "sample_time_share.tsv").write_text("step\tsample_time_share\n" + "".join(f"{s}\t{s / 20}\n" for s in range(1, 13)))
    (curves / "decoding_graphs.tsv").write_text("step\tdecoding_graphs\n1\t1\n2\t1\n3\t2\n")
    (line,) = queue.progress_lines(repo, now=1120.0)
    assert line.endswith("; train_loss 1.25, sample_time_share 37.5%, decoding_graphs 2)"), line


def test_a_validation_under_way_does_not_slow_the_pace_the_next_step_carries_it(tmp_path):
    # Started at time 1000 from step 0; step 100 logged at 1600 (6 s a step); its validation then
    # ran 300 s and rewrote the summary at the same step (logged at 1900). Read at 1900, the pace is
    # still 6 s (the summary's time would make it 9 s) and the time to go 1,200 s less 300 s.
    rows = "step\ttrain_loss\n" + "".join(f"{step}\t1.5\n" for step in range(1, 101))
    repo = _training_under_way(tmp_path, {"step": 100, "train_loss": 1.5, "val_loss": 1.4},
                               {"steps": 300, "from_step": 0, "started_at": 1000.0}, logged_at=1900.0, step_curve=(rows, 1600.0))
    assert queue.progress_lines(repo, now=1900.0) == [
        "exp-a: finetuned trained to step 100 of 300 (6 s a step so far: about 15 min to go; train_loss 1.5)"]
    # Step 101 logged at 1906: the validation's 300 s now in its pace, 906 s / 101 steps.
    repo = _training_under_way(tmp_path / "next", {"step": 101, "train_loss": 1.5, "val_loss": 1.4},
                               {"steps": 300, "from_step": 0, "started_at": 1000.0}, logged_at=1906.0,
                               step_curve=(rows + "101\t1.5\n", 1906.0))
    assert queue.progress_lines(repo, now=1906.0)[0].startswith("exp-a: finetuned trained to step 101 of 300 (8.97 s a step so far: about 30 min")
    # A curve with no complete row yet (a line cut short), or a malformed one: the summary's step and time.
    for text in ("step\ttrain_loss\n1\t1.", "step\tloss\n1\t1.5\n"):
        repo = _training_under_way(tmp_path / str(len(text)), {"step": 100}, {"steps": 300, "from_step": 0, "started_at": 1000.0},
                                   logged_at=1900.0, step_curve=(text, 1600.0))
        assert queue.progress_lines(repo, now=1900.0) == ["exp-a: finetuned trained to step 100 of 300 (9 s a step so far: about 30 min to go)"]


@pytest.mark.parametrize("summary, plan, shown", [
    ({"step": 50}, {"steps": None, "from_step": 0, "started_at": 1000.0}, "step 50 (3.6 s a step so far)"),  # no total: 180 s / 50
    ({"step": 50}, None, "step 50"),  # no plan: a training of a commit before it, or one not started
    ({"step": 50}, {"steps": "300", "from_step": 0}, "step 50"),  # a plan that does not hold one
])
def test_a_training_says_what_its_plan_tells_and_nothing_more(tmp_path, summary, plan, shown):
    repo = _training_under_way(tmp_path, summary, plan)
    assert queue.progress_lines(repo, now=1180.0) == [f"exp-a: finetuned trained to {shown}"]


def test_a_training_before_its_first_step_says_how_long_it_has_been_at_it(tmp_path):
    # Resumed from step 20 at time 1000; read at 1180, the summary is still the one at step 20
    # (the validation of its starting weights, say): no pace, and 3 min since it started.
    repo = _training_under_way(tmp_path, {"step": 20, "val_loss": 1.5}, {"steps": 300, "from_step": 20, "started_at": 1000.0})
    assert queue.progress_lines(repo, now=1180.0) == ["exp-a: finetuned started at step 20 of 300 3 min ago, no step ended yet"]
    # A fresh start, read 40 s on, with the step-0 summary's train_loss.
    repo = _training_under_way(tmp_path / "fresh", {"step": 0, "train_loss": 2.5}, {"steps": 4, "from_step": 0, "started_at": 1140.0})
    assert queue.progress_lines(repo, now=1180.0) == ["exp-a: finetuned started at step 0 of 4 40 s ago, no step ended yet (train_loss 2.5)"]
    # The first step logged: the pace, as ever.
    repo = _training_under_way(tmp_path / "one", {"step": 1}, {"steps": 4, "from_step": 0, "started_at": 1140.0}, logged_at=1170.0)
    assert queue.progress_lines(repo, now=1180.0) == ["exp-a: finetuned trained to step 1 of 4 (30 s a step so far: about 80 s to go)"]


def test_the_plans_are_read_where_dvc_yaml_has_each_training_keep_its_checkpoints():
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    for system, stage in TRAIN_STAGES.items():
        assert f"--checkpoints {CHECKPOINTS[system]} " in stages[stage]["cmd"] + " ", stage


def test_a_failed_experiment_is_named_with_the_end_of_its_log_which_says_why(tmp_path):
    """On a real DVC queue and worker: a stage stops with a one-line error. `failures` and `--failed`
    name the experiment with the end of DVC's log of it, read from disk: the stage's error and
    DVC's line naming the stage, as `dvc queue logs` prints them; `--failed-logs` gives the log's
    path (what a machine's poll brings back). One that succeeded, or ended before `--since`, is
    not named."""
    run = _runner(tmp_path)

    _pipeline(tmp_path, "stages:\n  train:\n    cmd: python stage.py\n    deps: [stage.py]\n    params: [objective]\n    outs: [m.txt]\n",
              {"stage.py": "import sys, yaml\nobjective = yaml.safe_load(open('params.yaml'))['objective']\n"
                           "if objective == 'bad':\n    print('progress 10%\\rprogress 50%', file=sys.stderr)\n"
                           "    sys.exit('error: params.yaml, line 1: `objective` = bad is not valid; valid values: nll, score')\n"
                           "open('m.txt', 'w').write(objective)\n"})
    queued_at = time.time()
    for name, objective in (("exp-bad", "bad"), ("exp-good", "score")):
        run("dvc", "exp", "run", "--queue", "-n", name, "-S", f"objective={objective}")
    _start_worker(tmp_path)
    try:
        end = time.time() + 120
        while sum(map(len, queue.ended(tmp_path, queued_at).values())) < 2 and time.time() < end:
            time.sleep(0.2)
        assert queue.ended(tmp_path, queued_at) == {"failed": ["exp-bad"], "succeeded": ["exp-good"]}
        (log, tail), = queue.failures(tmp_path, queued_at).values()
        assert list(queue.failures(tmp_path, queued_at)) == ["exp-bad"] and log.suffix == ".out" and len(tail) <= queue.FAILED_LINES
        assert tail[-1].startswith("ERROR: failed to reproduce 'train'"), tail
        error = tail.index("error: params.yaml, line 1: `objective` = bad is not valid; valid values: nll, score")
        assert "progress 50%" in tail[:error] and not any("progress 10%" in line for line in tail)  # (a redrawn line: its last drawing)
        shown = run(sys.executable, "-m", "storyrewrite.queue", "--failed", "--lines", "3").splitlines()
        assert shown == [f"== exp-bad failed; the end of its log ({log.relative_to(tmp_path)}):", *(f"  {line}" for line in tail[-3:])]
        assert run(sys.executable, "-m", "storyrewrite.queue", "--failed-logs") == f"{log.relative_to(tmp_path)}\n"
        (tmp_path / "reports").mkdir()  # from a folder inside the repository: the same, its paths the repository's
        assert subprocess.run([sys.executable, "-m", "storyrewrite.queue", "--failed", "--lines", "3"], cwd=tmp_path / "reports",
                              env=ENV, capture_output=True, text=True, check=True).stdout.splitlines() == shown
        statuses = run(sys.executable, "-m", "storyrewrite.queue", "--workers", "--failed", "--lines", "3").splitlines()
        assert statuses[-4:] == shown and any(line.endswith("  exp-bad  Failed") for line in statuses[:-4])  # (the statuses first)
        assert run(sys.executable, "-m", "storyrewrite.queue", "--failed", "--since", str(time.time() + 60)) == ""
        log.unlink()  # (gone: `dvc queue remove`, say): named, without lines
        assert run(sys.executable, "-m", "storyrewrite.queue", "--failed") == f"== exp-bad failed; no log at {log.relative_to(tmp_path)}\n"
        assert run(sys.executable, "-m", "storyrewrite.queue", "--failed-logs") == ""
    finally:
        run("dvc", "queue", "stop")
