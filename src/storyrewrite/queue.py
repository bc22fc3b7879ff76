"""DVC's experiment queue as scripts/comparison.sh polls it, and what its experiments have done so far:

    python -m storyrewrite.queue             # each experiment task: revision, name, status
    python -m storyrewrite.queue --workers   # then a blank line and `Worker status: A active, I idle`
    python -m storyrewrite.queue --running   # the stages each running experiment has ended, its training's step, pace and time to go
    python -m storyrewrite.queue --trainings # the trainings' lines of --running alone
    python -m storyrewrite.queue --failed    # each failed experiment: the end of its log (DVC's), which says why
    python -m storyrewrite.queue --failed-logs --running-logs  # the paths of those experiments' logs

The lines are those of `dvc queue status` (the time column left out). Our own, as DVC's command
always asks the workers: a celery broadcast through kombu's file broker, whose workers can read a
message mid-write and then stop (celery/kombu#1551, treeverse/dvc#10428). Without `--workers` the
statuses come from the broker's queue and the result backend, as DVC's do, with no message to the
workers and no wait for their answers, read in the order a task moves so that none is missed
(task_states). Each worker's own monitor (dvc-task's TemporaryWorker)
still asks three questions every 10 s; a poll no longer adds one. `--running` and `--trainings`
read files only (the experiments' workspaces and DVC's record of each), asking neither DVC nor the
workers, nor does `--failed`. Not a stage's code: changing this module reruns no stage.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from storyrewrite.curves import read_curve
from storyrewrite.io import InputError
from storyrewrite.systems import CHECKPOINTS, TRAIN_STAGES, TRAINING_PLAN

# DVC's record of each queued experiment (dvc.repo.experiments.executor.base.ExecutorInfo, one
# JSON file per experiment, .dvc/tmp/exps/run/<rev>/<rev>.run): its name and its workspace.
EXECUTOR_INFO = ".dvc/tmp/exps/run/*/*.run"
# DVC's TaskStatus (dvc.repo.experiments.executor.base) of an experiment that has ended.
ENDED = {3: "succeeded", 4: "failed", 5: "canceled", 6: "succeeded"}  # SUCCESS, FAILED, CANCELED, FINISHED (collected)
STARTED = {1, 2}  # PREPARING, RUNNING: started, not ended
# A workspace run (`dvc exp run` without --queue or --temp) gets a record of its stash revision
# first, as a queued one does, which DVC leaves behind at PREPARING with the repository as its
# root (dvc.repo.experiments.queue.base.init_executor): read as a queued one's, it would stay
# "running" after the run. Such records (ExecutorInfo.location "workspace"; a queued experiment's
# is "tempdir") are not read: the queue's experiments are.
WORKSPACE = "workspace"
# The curve every training step adds a row to, and only a training step (training.monitor).
STEP_CURVE = "train_loss"
# The curves of a training's clock that `--running` shows beside its step (their means over the
# last RECENT_STEPS steps): DVCLive's summary leaves them out, their TSVs have them.
CLOCK_CURVES, RECENT_STEPS = ("sample_time_share", "sample_read_time_share", "cpu_wait_time_share", "tokens_per_s"), 10
# The curves shown there at their last value: a count so far, not a rate (RLOO's static cache).
COUNT_CURVES = ("decoding_graphs",)


# DVC's log of each queued experiment beside its record (dvc-task's ManagedProcess: the stdout and
# stderr of its `dvc exp run`), how much of its end is read, and how many of its last lines shown.
LOG_SUFFIX, LOG_TAIL_BYTES, FAILED_LINES = ".out", 64 * 1024, 20

STATES = ("Running", "Queued", "Failed", "Success")  # in the order `dvc queue status` lists them


def task_states(queue) -> dict[str, tuple[str | None, str]]:
    """{stash revision: (name, status)} of each experiment task of DVC's celery queue, in the order
    `dvc queue status` lists them. DVC's own listing (BaseStashQueue.status) reads the running
    tasks, then the queued ones: a task a worker takes between the two reads is in neither, and a
    poll that then sees nothing queued or running ends the comparison's wait while it runs (seen
    with one worker as it moved to the second of two). Read here in the order a task moves (queued,
    running, done), a task that moves between reads is listed twice, never missed, and keeps its
    later state. A done task is Failed without a result, Success with an experiment, else (as in
    DVC) not listed."""
    found: dict[str, tuple[str | None, str]] = {}
    for entry in queue.iter_queued():
        found[entry.stash_rev] = (entry.name, "Queued")
    for entry in queue.iter_active():
        found[entry.stash_rev] = (entry.name, "Running")
    for entry, result in queue.iter_done():
        if result is None:
            found[entry.stash_rev] = (entry.name, "Failed")
        elif result.exp_hash and result.ref_info:
            found[entry.stash_rev] = (entry.name or result.ref_info.name, "Success")
        else:
            found.pop(entry.stash_rev, None)
    return dict(sorted(found.items(), key=lambda item: STATES.index(item[1][1])))  # (a stable sort)


def dvc_root(folder: Path, where: str) -> str:
    """The root of the DVC repository that `folder` lies in (DVC's own lookup, up the parents); else
    one line naming the folder, and `where` to run the command instead."""
    from dvc.exceptions import NotDvcRepoError
    from dvc.repo import Repo

    try:
        return Repo.find_root(str(folder))
    except NotDvcRepoError:
        raise InputError(f"{folder}: not in a DVC repository (`dvc init` makes one); run this where {where}") from None


def status(repo: Path, ask_workers: bool = False) -> list[str]:
    """A line per experiment task of the DVC repository at `repo` (its revision, name and status:
    Queued, Running, Success or Failed), then, with `ask_workers`, a blank line and the workers'."""
    from dvc.repo import Repo

    with Repo(dvc_root(repo, "`dvc queue status` runs")) as dvc_repo:
        queue = dvc_repo.experiments.celery_queue
        lines = [f"{rev[:7]}  {name or '-'}  {state}" for rev, (name, state) in task_states(queue).items()]
        if ask_workers:
            answers = queue.worker_status()
            active = sum(1 for tasks in answers.values() if tasks)
            lines += ["", f"Worker status: {active} active, {len(answers) - active} idle"]
    return lines


def _read(path: Path) -> str | None:
    """The text of a file, None where it cannot be read (gone, or never there)."""
    try:
        return path.read_text()
    except OSError:
        return None


def executor_infos(repo: Path, since: float = 0.0) -> list[tuple[str, dict]]:
    """(experiment name, DVC's record of it) of each experiment queued in `repo` whose record was
    last written at `since` (seconds since the epoch) or later; a record read while it is written
    is skipped."""
    return [(name, info) for name, info, _ in _records(repo, since)]


def _records(repo: Path, since: float = 0.0) -> list[tuple[str, dict, Path]]:
    """executor_infos, with the path of each record."""
    found = []
    for infofile in sorted(repo.glob(EXECUTOR_INFO)):
        try:
            if infofile.stat().st_mtime < since:
                continue
            info = json.loads(infofile.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(info, dict) and info.get("location") != WORKSPACE:
            found.append((info.get("name") or infofile.stem, info, infofile))
    return found


def ended(repo: Path, since: float) -> dict[str, list[str]]:
    """The experiments that have ended since `since` (seconds since the epoch), by how, as DVC's
    record of each says: those a poll has not gathered yet too."""
    found: dict[str, list[str]] = defaultdict(list)
    for name, info in executor_infos(repo, since):  # (a record is rewritten when its experiment ends)
        if how := ENDED.get(info.get("status")):
            found[how].append(name)
    return {how: sorted(names) for how, names in sorted(found.items())}


def failed_logs(repo: Path, since: float = 0.0) -> dict[str, Path]:
    """{name: its log} of each experiment that failed since `since` (seconds since the epoch), as
    DVC's record of it says; the log may be gone."""
    return dict(sorted((name, infofile.with_suffix(LOG_SUFFIX)) for name, info, infofile in _records(repo, since)
                       if ENDED.get(info.get("status")) == "failed"))


def running_logs(repo: Path) -> dict[str, Path]:
    """{name: its log} of each experiment that has started and not ended, as DVC's record of it
    says: what its stages have printed so far (a compile's warnings, say), for a machine that may
    go before the experiment ends; the log may not be there yet."""
    return dict(sorted((name, infofile.with_suffix(LOG_SUFFIX)) for name, info, infofile in _records(repo)
                       if info.get("status") in STARTED))


def failures(repo: Path, since: float = 0.0, lines: int = FAILED_LINES) -> dict[str, tuple[Path, list[str]]]:
    """{name: (its log, the log's last `lines` lines)} of each experiment that failed since `since`
    (seconds since the epoch), as DVC's record of it says. The log is what `dvc queue logs NAME`
    prints: its `dvc exp run`'s output, the stages' included, so it ends with the failed stage's
    error and DVC's line naming the stage. It is read from disk, as the poll of a machine that
    brings back files needs (DVC's command asks the queue). A progress bar's line, redrawn with
    carriage returns, counts as its last drawing. An experiment with no log left is named with
    none."""
    found: dict[str, tuple[Path, list[str]]] = {}
    for name, log in failed_logs(repo, since).items():
        try:
            with log.open("rb") as file:
                file.seek(max(file.seek(0, 2) - LOG_TAIL_BYTES, 0))
                text = file.read().decode(errors="replace")
        except OSError:
            found[name] = (log, [])
            continue
        shown = [line.rsplit("\r", 1)[-1].rstrip() for line in text.split("\n")]
        while shown and not shown[-1]:
            shown.pop()
        found[name] = (log, shown[-lines:] if lines > 0 else [])
    return found


def failure_lines(repo: Path, since: float = 0.0, lines: int = FAILED_LINES) -> list[str]:
    """failures() as `--failed` prints them: a line naming each failed experiment and its log, then
    the log's last lines, indented."""
    shown = []
    for name, (log, tail) in failures(repo, since, lines).items():
        where = log.relative_to(repo) if log.is_relative_to(repo) else log
        shown.append(f"== {name} failed; the end of its log ({where}):" if tail else f"== {name} failed; no log at {where}")
        shown += [f"  {line}" for line in tail]
    return shown


@dataclass
class Training:
    """A training under way in an experiment's workspace."""

    summary: dict  # DVCLive's summary of its latest step (metrics.json: `step`, the losses)
    logged_step: int  # its latest training step logged (latest_step), and when
    logged_at: float
    plan: dict | None = None  # its plan (TrainingPlan: training_plan), where it wrote one


@dataclass
class Progress:
    """What an experiment still running has done in its temporary workspace."""

    workspace: Path
    stages: list[dict] = field(default_factory=list)  # the stage records it wrote itself, in the order they started
    trainings: dict[str, Training] = field(default_factory=dict)  # system -> its training under way


def progress(repo: Path) -> dict[str, Progress]:
    """The experiments whose temporary workspace is still there (running, or ending), by name:
    the stages each ran itself and ended (its stage records naming it: those restored from the
    run cache name the experiment that ran them), and the summary of each training under way
    (DVCLive's metrics.json, rewritten at every step) with its latest step logged (latest_step) and
    its plan (training_plan). A file read while it is written is skipped."""
    found: dict[str, Progress] = {}
    for name, info in executor_infos(repo):
        if not isinstance(info.get("root_dir"), str) or not (workspace := Path(info["root_dir"])).is_dir():
            continue
        ran = Progress(workspace)
        for path in sorted((workspace / "reports" / "stages").glob("*.json")):
            try:
                record = json.loads(_read(path) or "")
            except ValueError:
                continue
            if isinstance(record, dict) and record.get("experiment") == name:
                ran.stages.append({"stage": path.stem, **record})
        ran.stages.sort(key=lambda record: str(record.get("started_at") or ""))
        for path in sorted((workspace / "reports" / "train").glob("*/metrics.json")):
            text = _read(path)
            try:
                logged_at = path.stat().st_mtime
            except OSError:
                continue
            # The workspace starts as a copy of the commit, whose own training summaries
            # (git-tracked) stand until this experiment's training rewrites them; a training
            # with a stage record has ended (here, or restored from the run cache).
            stage = TRAIN_STAGES.get(path.parent.name, path.parent.name)
            if (text is None or text == _read(repo / path.relative_to(workspace))
                    or (workspace / "reports" / "stages" / f"{stage}.json").exists()):
                continue
            try:
                summary = json.loads(text)
            except ValueError:
                continue
            if isinstance(summary, dict) and "step" in summary:
                logged_step, logged_at = latest_step(path.parent, summary["step"], logged_at)
                ran.trainings[path.parent.name] = Training(summary, logged_step, logged_at, training_plan(workspace, path.parent.name))
        found[name] = ran
    return found


def latest_step(log_dir: Path, step: int, logged_at: float) -> tuple[int, float]:
    """(step, seconds since the epoch) of the latest training step a training logged in `log_dir`:
    the last row of its STEP_CURVE and when the file was last written. A validation rewrites the
    summary at the same step, later, but writes no row there, so a pace measured to this step
    stays steady through a validation (whose time the next step then carries). The summary's
    (`step`, `logged_at`) where the curve is not there, holds no complete row, or is malformed."""
    curve = log_dir / "plots" / "metrics" / f"{STEP_CURVE}.tsv"
    try:
        written = curve.stat().st_mtime  # (a row appended before the read pairs its step with the time of the one before: once, one step)
        rows = read_curve(curve)
    except (OSError, InputError):
        return step, logged_at
    return (rows[-1]["step"], written) if rows else (step, logged_at)


def training_plan(workspace: Path, system: str) -> dict | None:
    """What the training of `system` in `workspace` wrote as it started (TrainingPlan, beside its
    checkpoints): `steps` (its total, or None), `from_step` and `started_at` (seconds since the
    epoch); None where it wrote none (not started yet, or a commit before the plan) or the file
    does not hold them."""
    if system not in CHECKPOINTS:
        return None
    try:
        plan = json.loads(_read(workspace / CHECKPOINTS[system] / TRAINING_PLAN) or "")
    except ValueError:
        return None
    if not (isinstance(plan, dict) and isinstance(plan.get("from_step"), int) and isinstance(plan.get("started_at"), (int, float))
            and (plan.get("steps") is None or isinstance(plan["steps"], int))):
        return None
    return plan


def pace(plan: dict | None, step: int, logged_at: float, now: float) -> tuple[float | None, float | None]:
    """(seconds a step, seconds to go) at the time `now` of a training that logged its step `step`
    at `logged_at` (latest_step), by its plan: the time from its start to that step over the steps it
    has taken since (the first step's compile, the validations and checkpoint saves included, as
    they will be in the steps to come), and that pace over the steps left, less the time since that
    step (0 at the least). None for what the plan cannot tell: no step taken yet, or no total."""
    if plan is None or not isinstance(step, int) or step <= plan["from_step"] or logged_at <= plan["started_at"]:
        return None, None
    per_step = (logged_at - plan["started_at"]) / (step - plan["from_step"])
    if plan["steps"] is None:
        return per_step, None
    return per_step, max(max(plan["steps"] - step, 0) * per_step - max(now - logged_at, 0.0), 0.0)


def duration(seconds: float) -> str:
    """`seconds` as a person reads a time to go: 40 s, 26 min, 2.5 h."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 90 * 60 else f"{seconds / 3600:.1f} h"


def running(repo: Path) -> dict[str, dict]:
    """progress() as data: per experiment, the names of the stages it has ended (in the order
    they started), the step each training under way has reached and, where its plan says, the
    steps it takes."""
    found = {}
    for name, ran in progress(repo).items():
        found[name] = {"stages_ended": [record["stage"] for record in ran.stages],
                       "trained_to_step": {system: training.summary["step"] for system, training in ran.trainings.items()}}
        if steps := {system: training.plan["steps"] for system, training in ran.trainings.items()
                     if training.plan is not None and training.plan["steps"] is not None}:
            found[name]["planned_steps"] = steps
    return found


def _recent(tsv: Path, steps: int = RECENT_STEPS) -> float | None:
    """The mean of a DVCLive curve's last `steps` values (storyrewrite.curves: a last line still
    being written is left out; 1: its last value); None for a curve not there, empty or malformed."""
    try:
        values = [row["value"] for row in read_curve(tsv)[-steps:]]
    except (OSError, InputError):
        return None
    return sum(values) / len(values) if values else None


def training_line(name: str, workspace: Path, system: str, training: Training, now: float) -> str:
    """`NAME: SYSTEM trained to step N of M (S s a step so far: about T to go; train_loss ..., and
    the clock's curves)` for the training of `system` under way in the experiment `name` (`of M`,
    the pace and the time to go where its plan tells them: pace), measured at the time `now`.
    Before its first step has ended: `NAME: SYSTEM started at step N of M T ago, no step ended yet`."""
    curves = workspace / "reports" / "train" / system / "plots" / "metrics"
    shown = {"train_loss": training.summary.get("train_loss"), **{curve: _recent(curves / f"{curve}.tsv") for curve in CLOCK_CURVES},
             **{curve: _recent(curves / f"{curve}.tsv", 1) for curve in COUNT_CURVES}}
    shown = ", ".join(f"{key} {value:.1%}" if key.endswith("_share") else f"{key} {value:.4g}"  # (a share: 0.0 %, not 2e-06)
                      for key, value in shown.items() if isinstance(value, (int, float)))
    plan, step = training.plan, training.summary["step"]
    per_step, left = pace(plan, training.logged_step, training.logged_at, now)
    timing = ""
    if per_step is not None:
        timing = f"{per_step:.3g}" if per_step < 100 else f"{per_step:.0f}"
        timing += " s a step so far" + (f": about {duration(left)} to go" if left is not None else "")
    details = "; ".join(part for part in (timing, shown) if part)
    total = f" of {plan['steps']}" if plan and plan["steps"] is not None else ""
    if plan is not None and training.logged_step <= plan["from_step"]:
        # Its first step not ended: compiling, or validating the weights it started from (the
        # summary then holds that validation, at the starting step). How long it has been at it.
        return (f"{name}: {system} started at step {plan['from_step']}{total} {duration(max(now - plan['started_at'], 0.0))} ago, "
                "no step ended yet" + (f" ({details})" if details else ""))
    return f"{name}: {system} trained to step {step}{total}" + (f" ({details})" if details else "")


def progress_lines(repo: Path, now: float | None = None, stages: bool = True) -> list[str]:
    """progress() as lines, `NAME: STAGE on DEVICE in S s` for each stage ended (where `stages`)
    and a training_line for each training under way. `now`: the time to measure the pace at
    (default: the clock's)."""
    now = time.time() if now is None else now
    lines = []
    for name, ran in sorted(progress(repo).items()):
        if stages:
            lines += [f"{name}: {record['stage']} on {record.get('device', '?')} in {record.get('wall_s', '?')} s" for record in ran.stages]
        lines += [training_line(name, ran.workspace, system, training, now) for system, training in ran.trainings.items()]
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m storyrewrite.queue", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    asked = parser.add_mutually_exclusive_group()
    asked.add_argument("--workers", action="store_true", help="ask the workers too (a broadcast), as `dvc queue status` does")
    asked.add_argument("--running", action="store_true",
                       help="instead: what each experiment still running has done (nothing where none runs)")
    asked.add_argument("--trainings", action="store_true",
                       help="instead: the trainings under way alone, a line each, as --running shows them")
    parser.add_argument("--failed", action="store_true",
                        help="each failed experiment and the end of its log, which says why (after what the other "
                             "flags print; alone: instead of the statuses)")
    parser.add_argument("--lines", type=int, default=FAILED_LINES, help=f"--failed: lines of each log (default {FAILED_LINES})")
    parser.add_argument("--since", type=float, default=0.0,
                        help="--failed: only experiments that ended at this time or later (seconds since the epoch)")
    parser.add_argument("--failed-logs", action="store_true",
                        help="instead: the failed experiments' logs, a path a line (relative to the repository)")
    parser.add_argument("--running-logs", action="store_true",
                        help="instead: the logs of the experiments still running, a path a line (relative to the repository)")
    args = parser.parse_args(argv)
    if args.lines < 1:
        parser.error(f"--lines must be at least 1, got {args.lines}")
    # The repository's root, also from a folder inside it: at once where the polls run (its root),
    # else by DVC's lookup, up the parents (0.2 s of imports, which a poll need not pay).
    here = Path.cwd()
    repo = here if (here / ".dvc").is_dir() else Path(dvc_root(here, "`dvc queue status` runs"))
    if args.failed_logs or args.running_logs:
        found = [*(failed_logs(repo, args.since).values() if args.failed_logs else []),
                 *(running_logs(repo).values() if args.running_logs else [])]
        if logs := [str(log.relative_to(repo)) for log in found if log.exists()]:
            print(*logs, sep="\n")
        return
    if args.trainings:
        if lines := progress_lines(repo, stages=False):
            print(*lines, sep="\n")
    elif args.running:
        if lines := progress_lines(repo):
            print("== stages done in experiments still running", *lines, sep="\n")
        else:  # (stdout stays empty, as scripts read it; a person gets a line)
            print("no experiment of this repository's queue is running (`python -m storyrewrite.queue` lists them all)",
                  file=sys.stderr)
    elif args.workers or not args.failed:
        lines = status(repo, args.workers)
        if not lines or not lines[0]:  # no task, as `dvc queue status` says it (stdout: the workers' line alone)
            print("no experiment in this repository's queue (`dvc exp run --queue` queues one)", file=sys.stderr)
            lines = lines[1:]
        if lines:
            print(*lines, sep="\n")
    if args.failed:
        if lines := failure_lines(repo, args.since, args.lines):
            print(*lines, sep="\n")
        else:
            since = f" since {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(args.since))}" if args.since else ""
            print(f"no experiment of this repository's queue failed{since}", file=sys.stderr)


if __name__ == "__main__":
    from storyrewrite.io import run_cli

    run_cli(main)
