"""What a stage process pays before its work: the interpreter and its imports, which the stage
records hold as `startup_s` (9-14 s a stage on the GPU machine of the last full-data run, against
a few seconds on a 2-core CPU). Each stage named runs `python stages/NAME.py --help` (its imports,
its argument parser, nothing else) `--repeats` times, one after the other, then `--side-by-side N`
copies of each at once, as N queue workers start stages together. A run under Python's
`-X importtime` gives the packages whose imports took the most time.

    python bench/stage_startup.py [--stages train generate score significance] [--repeats 3] [--side-by-side 8]

Figures, per stage: `alone_s` (the median start-to-exit wall time), `side_by_side_s` (the median
process's, N at once) and its ratio to alone, `imports_s` (the imports' own clock) and
`top_packages` (seconds of import by top-level package, the five largest). Target: none; the
figures say whether a stage's start is its imports or the machine (disk, cores) under load.
Figures go to reports/bench/stage_startup.json.
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from collections import Counter

import torch
from common import ROOT, workspace_env, write_result

from storyrewrite.io import run_cli

TOP_PACKAGES = 5


def import_times(report: str) -> tuple[float, dict[str, float]]:
    """(seconds of all imports, {top-level package: seconds}) from `python -X importtime`'s
    report (`import time: self [us] | cumulative | name`, a nested import indented under the one
    that made it): the imports' total is the sum of the outermost ones' cumulative times, a
    package's the sum of its modules' own times."""
    total, packages = 0, Counter()
    for line in report.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        own, cumulative, name = line.removeprefix("import time:").split("|")
        if not name.startswith("  "):  # the name follows one space: an outermost import
            total += int(cumulative)
        packages[name.strip().split(".")[0]] += int(own)
    return total / 1e6, {package: round(us / 1e6, 3) for package, us in packages.most_common(TOP_PACKAGES)}


def start(stage: str, *flags: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, *flags, f"stages/{stage}.py", "--help"], cwd=ROOT, env=workspace_env(ROOT),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def finished(process: subprocess.Popen) -> str:
    """The process's stderr once it has exited; a failure ends the bench naming it."""
    _, stderr = process.communicate()
    if process.returncode != 0:
        raise SystemExit(f"error: {' '.join(process.args)} exited {process.returncode}: {stderr.strip()[-500:]}")
    return stderr


def timed(processes: list[subprocess.Popen], started: float) -> list[float]:
    """Each process's seconds from `started` to its exit."""
    seconds = []
    for process in processes:
        finished(process)
        seconds.append(time.perf_counter() - started)
    return seconds


def arguments() -> argparse.ArgumentParser:
    """The command line (scripts/gpu_bench.sh's calls are parsed by it in the tests)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stages", nargs="+", default=["train", "generate", "score", "significance"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--side-by-side", type=int, default=8, help="processes of each stage at once")
    return parser


def main() -> None:
    args = arguments().parse_args()
    if missing := [stage for stage in args.stages if not (ROOT / "stages" / f"{stage}.py").is_file()]:
        valid = " ".join(sorted(path.stem for path in (ROOT / "stages").glob("*.py")))
        raise SystemExit(f"error: --stages: no stage {' '.join(missing)}; valid: {valid}")
    if args.repeats < 1 or args.side_by_side < 1:
        raise SystemExit("error: --repeats and --side-by-side must be at least 1")
    figures = {}
    for stage in args.stages:
        imports_s, packages = import_times(finished(start(stage, "-X", "importtime")))
        alone = []
        for _ in range(args.repeats):
            started = time.perf_counter()
            alone += timed([start(stage)], started)
        started = time.perf_counter()
        together = timed([start(stage) for _ in range(args.side_by_side)], started)
        alone_s, together_s = statistics.median(alone), statistics.median(together)
        figures[stage] = {"alone_s": round(alone_s, 2), "side_by_side_s": round(together_s, 2),
                          "side_by_side_ratio": round(together_s / alone_s, 2), "imports_s": round(imports_s, 2),
                          "top_packages": packages}
        print(f"{stage:<14} alone {alone_s:6.2f} s   {args.side_by_side} at once {together_s:6.2f} s "
              f"({together_s / alone_s:.2f}x)   imports {imports_s:5.2f} s: "
              + ", ".join(f"{package} {seconds:.2f}" for package, seconds in packages.items()), flush=True)
    write_result("stage_startup", torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu"), figures,
                 {"stages": args.stages, "repeats": args.repeats, "side_by_side": args.side_by_side})


if __name__ == "__main__":
    run_cli(main)
