"""The offline default as a new user meets it: a fresh clone of HEAD, `make setup` (a virtual
environment with the pinned install, no pip cache, as on a fresh machine), then `make repro`
(`dvc repro`: every stage, as the clone has no DVC cache), each timed. Then the clone's dvc.lock
is set against HEAD's: the outputs whose content changed, and of those the results, that is
every output but the ones that hold wall times and rates by design (TIMED: the stage records, the
training curves, the results page's training and stage tables).

    python bench/fresh_clone.py [--keep DIR]

Figures: `setup_s`, `repro_s`, `total_s`; `stages_ran` (DVC's `Running stage` lines) and each
recorded stage's `wall_s` (`stage_wall_s`, from the clone's reports/stages/); `changed_outputs`
(every output whose md5 differs from HEAD's dvc.lock) and `results_changed` (how many of them are
not TIMED). Targets: the whole in 15 minutes or less; no result changed. Runs HEAD (commit your
changes first); `--keep DIR` leaves the clone there, and the logs of `make setup` and `make repro`
beside it (DIR-setup.log, DIR-repro.log). Figures go to reports/bench/fresh_clone.json.
"""
from __future__ import annotations

import argparse
import fnmatch
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import yaml
from commit_name import commit_name
from common import ROOT, stages_ran, write_result

from storyrewrite.io import InputError, read_json, run_cli
from storyrewrite.models.device import resolve_device

# Outputs that hold wall times or rates by design: a rerun of the same code on the same data
# changes them, never the results. Patterns of dvc.lock's `outs` paths (fnmatch).
TIMED = ("reports/stages/*", "reports/train/*/plots/metrics", "reports/results.md")
TARGET_S = 15 * 60  # the whole, set-up included, on a 2-core machine (docs/benchmarks.md)


def lock_outputs(text: str) -> dict[str, str | None]:
    """{path: md5} of every stage's `outs` in a dvc.lock's text (a directory's md5 ends in `.dir`)."""
    lock = yaml.safe_load(text) or {}
    return {out["path"]: out.get("md5") for stage in (lock.get("stages") or {}).values() for out in stage.get("outs", [])}


def changed(before: dict[str, str | None], after: dict[str, str | None]) -> tuple[list[str], list[str]]:
    """(every output whose md5 differs, one lock having it and the other not included; those of
    them that are results: not TIMED), each sorted."""
    paths = sorted(path for path in before.keys() | after.keys() if before.get(path) != after.get(path))
    return paths, [path for path in paths if not any(fnmatch.fnmatch(path, pattern) for pattern in TIMED)]


def timed(command: list[str], cwd: Path, env: dict[str, str], log: Path) -> float:
    """Seconds `command` took in `cwd`, its output in `log`. A failure ends the bench, naming the
    command and the end of its output."""
    started = time.perf_counter()
    with log.open("w") as out:
        result = subprocess.run(command, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
    seconds = time.perf_counter() - started
    if result.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-20:])
        raise SystemExit(f"error: {' '.join(command)} exited {result.returncode} in {cwd} after {seconds:.0f} s:\n{tail}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keep", type=Path, help="clone here (a folder that does not exist yet) and leave it")
    args = parser.parse_args()
    if args.keep is not None and args.keep.exists():
        raise InputError(f"--keep {args.keep}: exists; name a folder that does not exist yet")
    commit = commit_name(ROOT)
    if commit.endswith("+changes"):
        raise InputError("the tracked files differ from HEAD, and a clone measures HEAD: commit your changes first")
    # The environment as a user's shell has it: no virtual environment active, no pip cache.
    env = {key: value for key, value in os.environ.items() if key not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["PATH"] = os.pathsep.join(part for part in env["PATH"].split(os.pathsep)
                                  if not (Path(part) / "activate").is_file())  # an activated venv's bin/
    env["PIP_NO_CACHE_DIR"] = "1"
    parent = None if args.keep else Path(tempfile.mkdtemp(prefix="fresh-clone-"))
    clone = args.keep or parent / "storyrewrite"
    try:
        subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
        print(f"clone of {commit} at {clone}", flush=True)
        setup_s = timed(["make", "setup"], clone, env, clone.parent / f"{clone.name}-setup.log")
        print(f"make setup  {setup_s:7.1f} s", flush=True)
        log = clone.parent / f"{clone.name}-repro.log"
        repro_s = timed(["make", "repro"], clone, env, log)
        ran = stages_ran(log.read_text(errors="replace"))
        print(f"make repro  {repro_s:7.1f} s   {len(ran)} stages", flush=True)
        before = lock_outputs(subprocess.run(["git", "show", "HEAD:dvc.lock"], cwd=clone, check=True, capture_output=True,
                                             text=True).stdout)
        outputs, results = changed(before, lock_outputs((clone / "dvc.lock").read_text()))
        stage_wall_s = {path.stem: read_json(path).get("wall_s") for path in sorted((clone / "reports" / "stages").glob("*.json"))}
    finally:
        if parent is not None:
            shutil.rmtree(parent, ignore_errors=True)
    total_s = setup_s + repro_s
    print(f"total       {total_s:7.1f} s   (target <= {TARGET_S} s)\n"
          f"changed outputs: {len(outputs)}, of them results: {len(results)}{': ' + ' '.join(results) if results else ''}")
    figures = {"setup_s": round(setup_s, 1), "repro_s": round(repro_s, 1), "total_s": round(total_s, 1),
               "stages_ran": len(ran), "stage_wall_s": stage_wall_s, "changed_outputs": outputs,
               "results_changed": len(results)}
    write_result("fresh_clone", resolve_device("auto"), figures,
                 {"timed_outputs": list(TIMED), "pip_cache": False},
                 targets={"total_s": {"max": TARGET_S}, "results_changed": {"max": 0}})


if __name__ == "__main__":
    run_cli(main)
