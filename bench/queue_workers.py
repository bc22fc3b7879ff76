"""Parallel experiments on one machine: two experiments queued (two `train.lr` values of the
default profile) and run by DVC's queue with one worker, then again with two, in one run of this
script. Each round runs in a fresh clone of the repository's HEAD that uses this repository's DVC
cache, so that DVC's run cache holds what `dvc repro` built here: a queued experiment should
restore every stage whose deps and params it shares (the models, the NLL model, the LLM and copy
baselines) and run only `train` and what follows it.

    python bench/queue_workers.py [--lrs 2e-5 3e-5] [--jobs 1 2]

Every round trains learning rates that no experiment has run before (the given ones, each scaled
by its own random factor between 1.0001 and 1.001): otherwise the second round would restore the
first round's experiments from the run cache. A change that small leaves the step's cost alone
but changes the trained weights (a few parts per million would not: fp32 weights come out the
same). It need not change the greedy predictions, though, and a stage after `train` whose inputs
are an earlier run's is restored from the run cache: so the second round once ran `score` and
`significance` for neither experiment, where the first ran both, and seemed faster for it. The
experiments are therefore queued with DVC's `--force-downstream` (every stage after a changed one
runs), and the rounds are compared only if they ran the same stages: else the script names them
and exits 1, writing nothing. Prints, per round, the wall time from `dvc queue start` to the last
experiment's end, and which stages each experiment ran. Target: two workers no slower than one.
Figures go to reports/bench/queue_workers.json. Needs `dvc repro` first (the run cache) and runs
HEAD (commit your changes first); it stops where HEAD's dvc.lock is not the one `dvc repro` made
here (commit it).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import torch
from common import ROOT, clone_with_cache, dvc, stages_ran, write_result

from storyrewrite.io import run_cli


def round_of(jobs: int, lrs: list[str], workdir: Path) -> dict:
    repo = clone_with_cache(workdir / f"j{jobs}")
    names = [f"lr-{number}-j{jobs}" for number in range(len(lrs))]
    for name, lr in zip(names, lrs, strict=True):
        dvc(repo, "exp", "run", "--queue", "--force-downstream", "-n", name, "-S", f"train.lr={lr}")
    started = time.perf_counter()
    dvc(repo, "queue", "start", "-j", str(jobs), output=False)
    while True:
        finished = set(dvc(repo, "exp", "list", "--name-only").split())
        if set(names) <= finished:
            break
        try:
            status = dvc(repo, "queue", "status")
        except SystemExit:  # DVC's status sometimes fails reading a worker's state mid-write: ask again
            status = "Running"
        if not re.search(r"\b(Queued|Running)\b", status):
            break
        time.sleep(2)
    wall = time.perf_counter() - started
    failed = sorted(set(names) - finished)
    ran = {}
    for name in names:
        log = dvc(repo, "queue", "logs", name)
        ran[name] = sorted(set(stages_ran(log)))
    dvc(repo, "queue", "stop", "--kill", output=False)
    return {"jobs": jobs, "wall_s": round(wall, 1), "ran": ran, "failed": failed}


def work(round_: dict) -> tuple:
    """What a round ran: its experiments' lists of stages, sorted (the experiments' names differ
    from round to round; their work should not)."""
    return tuple(sorted(tuple(stages) for stages in round_["ran"].values()))


def check_cache_holds_head() -> None:
    """The clones run HEAD's dvc.lock: its stages restore from this cache only if `dvc repro` here
    made that very dvc.lock. Where HEAD's came from another machine (another CPU rounds the NLL
    model's weights otherwise), every queued experiment would rerun `train_nll` as well, both
    rounds would time that larger workload, and the record would say it was the documented one."""
    lock_changed = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", "dvc.lock"], cwd=ROOT).returncode != 0
    if lock_changed:
        raise SystemExit("error: dvc.lock differs from HEAD's: the clones would not find their stages in this "
                         "cache. Commit dvc.lock (it is what `dvc repro` made here), or `git checkout dvc.lock` "
                         "and `dvc repro` again")
    if changed := json.loads(dvc(ROOT, "status", "--json")):  # {} where every stage is up to date
        raise SystemExit(f"error: `dvc status` lists changed stages ({', '.join(changed)}): the cache does not hold "
                         "every output HEAD's dvc.lock names. Run `dvc repro` and commit dvc.lock first")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lrs", nargs=2, default=["2e-5", "3e-5"], help="the two train.lr values queued")
    parser.add_argument("--jobs", type=int, nargs="+", default=[1, 2], help="queue workers of each round")
    args = parser.parse_args()
    if not (ROOT / ".dvc" / "cache" / "runs").is_dir():
        raise SystemExit("error: no run cache in .dvc/cache: run `dvc repro` first")
    check_cache_holds_head()
    workdir = Path(tempfile.mkdtemp(prefix="queue-bench-"))
    rounds, rng = [], random.Random()
    try:
        for jobs in args.jobs:
            lrs = [f"{float(lr) * rng.uniform(1.0001, 1.001):.6e}" for lr in args.lrs]
            rounds.append(round_of(jobs, lrs, workdir))
            r = rounds[-1]
            print(f"-j {jobs}: {r['wall_s']:.0f} s for {len(args.lrs)} experiments"
                  + (f"; FAILED: {', '.join(r['failed'])}" if r["failed"] else ""))
            for name, stages in r["ran"].items():
                print(f"  {name} ran: {', '.join(stages) or 'nothing'}")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if len({work(r) for r in rounds}) > 1:
        raise SystemExit("error: the rounds ran different stages, so their times do not compare ("
                         + "; ".join(f"-j {r['jobs']}: {' | '.join(', '.join(s) for s in work(r))}" for r in rounds)
                         + "); nothing written")
    by_jobs = {r["jobs"]: r["wall_s"] for r in rounds}
    if 1 in by_jobs and 2 in by_jobs:
        print(f"-j 2 / -j 1 wall time: {by_jobs[2] / by_jobs[1]:.2f} (target <= 1)")
    figures = {"rounds": rounds, **({"two_workers_over_one": round(by_jobs[2] / by_jobs[1], 3)} if 1 in by_jobs and 2 in by_jobs else {})}
    write_result("queue_workers", torch.device("cpu"), figures, {"lrs": args.lrs, "cores": os.cpu_count()},
                 {"two_workers_over_one": {"max": 1.0}})


if __name__ == "__main__":
    run_cli(main)
