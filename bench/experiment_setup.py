"""What DVC costs an experiment besides its own stages, and where that time goes. The experiment
changes nothing, so DVC restores every stage from the run cache (what `dvc repro` built here) and
runs only what it cannot restore. It runs with `dvc exp run --temp` in a fresh clone of HEAD that
uses this repository's DVC cache, with dvc.lock removed, as scripts/comparison.sh queues its runs.
Each of the comparison's experiments pays this on top of its own stages.

Once with each of two link types (`cache.type`): `copy`, DVC's choice where the file system has no
reflinks (ext4), and `hardlink,copy`, which writes no copy of the restored models, alternating,
`--repeats` times. Then once more with copies under cProfile: the shares of the wall time spent
parsing and rewriting dvc.lock after each stage (`_dump_lockfile`) and checking out outputs.

    python bench/experiment_setup.py [--repeats 2]

Prints and records each link type's median wall time and their ratio, which stages each run ran
(both link types must have run the same ones, else nothing is written), and the profile's shares.
No target: the figures say what a faster set-up would have to cut. Figures go to
reports/bench/experiment_setup.json. Needs `dvc repro` first (the run cache) and runs HEAD
(commit your changes first).
"""
from __future__ import annotations

import argparse
import os
import pstats
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch
from common import ROOT, clone_with_cache, dvc, stages_ran, write_result

from storyrewrite.io import run_cli

LINKS = {"copy": "copy", "hardlink": "hardlink,copy"}
# Where DVC's time goes, by (file ending, function): its rewrite of dvc.lock after each stage, and
# the checkout of each restored stage's outputs into the experiment's workspace.
PROFILED = {"lock_dump": ("dvc/dvcfile.py", "_dump_lockfile"), "checkout": ("dvc/output.py", "checkout")}


def run_once(repo: Path, link: str, name: str, profile: Path | None = None) -> tuple[float, list[str]]:
    """One experiment with the link type `link`: its wall time and the stages it ran."""
    dvc(repo, "config", "--local", "cache.type", link)
    interpreter = ("-m", "cProfile", "-o", str(profile)) if profile else ()
    started = time.perf_counter()
    out = dvc(repo, "exp", "run", "--temp", "-n", name, interpreter=interpreter)
    return time.perf_counter() - started, sorted(set(stages_ran(out)))


def shares(profile: Path, wall: float) -> dict[str, float]:
    """Each PROFILED function's cumulative time over the profiled run's wall time."""
    stats = pstats.Stats(str(profile)).stats  # {(file, line, function): (calls, primitive, tottime, cumtime, callers)}
    found = {}
    for key, (suffix, function) in PROFILED.items():
        found[f"{key}_share"] = round(sum(entry[3] for (file, _, name), entry in stats.items()
                                          if name == function and file.endswith(suffix)) / wall, 3)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=2, help="experiments per link type (alternating)")
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}")
    if not (ROOT / ".dvc" / "cache" / "runs").is_dir():
        raise SystemExit("error: no run cache in .dvc/cache: run `dvc repro` first")
    # In the repository's folder: the clone's workspace and the cache on one file system, as in use.
    workdir = Path(tempfile.mkdtemp(prefix="experiment-setup-", dir=ROOT / ".cache"))
    walls: dict[str, list[float]] = {link: [] for link in LINKS}
    ran: dict[str, set[tuple[str, ...]]] = {link: set() for link in LINKS}
    try:
        repo = clone_with_cache(workdir / "repo")
        (repo / "dvc.lock").unlink(missing_ok=True)
        for repeat in range(args.repeats):
            for link, value in LINKS.items():
                wall, stages = run_once(repo, value, f"setup-{link}-{repeat}")
                walls[link].append(wall)
                ran[link].add(tuple(stages))
                print(f"{link}: {wall:.1f} s, ran {', '.join(stages) or 'nothing'}")
        profile = workdir / "dvc.prof"
        wall, _ = run_once(repo, LINKS["copy"], "setup-profiled", profile)
        profiled = {"wall_s": round(wall, 1), **shares(profile, wall)}
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if len(ran["copy"] | ran["hardlink"]) > 1:
        raise SystemExit(f"error: the link types ran different stages, so their times do not compare ({ran}); nothing written")
    medians = {link: round(statistics.median(values), 1) for link, values in walls.items()}
    ratio = round(medians["hardlink"] / medians["copy"], 3)
    print(f"median wall time of an experiment restored whole: copies {medians['copy']} s, hardlinks {medians['hardlink']} s "
          f"({ratio:.2f}x)")
    print(f"under cProfile ({profiled['wall_s']} s): dvc.lock parsed and rewritten after each stage "
          f"{profiled['lock_dump_share']:.0%}, outputs checked out {profiled['checkout_share']:.0%}")
    figures = {"wall_s": medians, "hardlink_over_copy": ratio, "stages_run": sorted(next(iter(ran["copy"]))),
               "profiled": profiled}
    write_result("experiment_setup", torch.device("cpu"), figures, {"repeats": args.repeats, "cores": os.cpu_count()})


if __name__ == "__main__":
    run_cli(main)
