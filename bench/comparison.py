"""The whole comparison as a benchmark: `core`, then `cpo`, from a fresh workspace of this tree
(its own DVC cache: nothing restored from an earlier run), on the profiles given.

    python bench/comparison.py --profile params/gpu.yaml [--jobs auto] [--parts core cpo]
    python bench/comparison.py --here --name gpu --profile params/gpu.yaml --parts all  # reports/gpu/ too

Each part is `scripts/comparison.sh -j JOBS NAME PART PROFILE...` in that workspace (`--here`:
in this repository, which keeps runs/NAME and reports/NAME); `cpo` follows `core` there, as a
researcher would run them, and collects both. A part after one that succeeded skips the shared
phase (COMPARISON_SHARED=0): its experiments restore those stages from the run cache. `--parts
all` queues both at once: the CPO grid fills the workers while core's longest runs go on, and
core's own wall time is read from the stage records (core_in_all). The GPU's load and
memory are sampled through the whole run (nvidia-smi, every 0.5 s), and the host CPUs' busy
share (psutil) beside them (`--timeline FILE`: every sample, as CSV). Afterwards every gathered experiment's stage
records (device, wall time; the shared stages' too, restored with their first run's record) are
read back.

Figures: each part's wall time and the whole run's, the GPU's mean busy share and peak memory
over the run, the seconds it sat idle in stretches of 10 s or more and the longest five of them
(`gpu_idle_windows`, from when), the stages' wall times summed by stage, and each experiment's, when each experiment's
last stage ended (seconds from the start: the last one holds the run back), and the time between
stages: in their processes before the work (imports) and outside them (exit, DVC), what
torch.compile did in each stage (graphs, breaks, graphs not replayed as CUDA graphs), and where
each fine-tuning's steps spent their time (`step_time`: the means of its wall-time curves), and
the scoring stages' time by part (`scoring_s`: loading the models, each metric), and each
part's edges (`part_edges_s`: from its start to its first stage's process, from its last stage's
end to its own end; the GPU idles through both), and each part's steps as the script printed them
(`steps_s`: its `== ` lines, each with the seconds from the part's start at which it came).
Targets on one H100/H200-class GPU: core <= 6 min, all <= 12 min (none on a CPU). Figures go to
reports/bench/comparison[-VARIANT].json; the exit status is 1 if an experiment failed.

While the parts run, the record is written every `--interim-every` seconds (default 60) with
`complete: false`: the time so far (`elapsed_s`), the load, the experiments gathered by then
(offline/job.sh's polls gather them as they finish), those DVC's records say have ended (`ended`)
and those still running, each with the stages it has ended and the step of its training under
way, of its total (`running`). A run cut short (a machine taken back) so leaves a record of
where its time went; the run's end replaces it. An interim record is held to a target only once
its time so far exceeds it (the whole run can but take longer). A comparison that resumes one
gathered before (runs/NAME or runs/NAME.<n> hold runs at its start: the parts run only the rest)
names those runs (`settings.gathered_before`) and is held to no target: its wall times are not the
whole comparison's. Nor is one that queues only some runs (`--max-runs N`: comparison.sh's `-n N`,
`settings.max_runs`). `--mps` runs the parts with COMPARISON_MPS=1 (NVIDIA's Multi-Process Service
for the workers' stages, where its check passes); `settings.mps` says, part by part, whether it ran.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from datetime import datetime, timezone
from itertools import pairwise
from pathlib import Path

import psutil
import torch
from common import ROOT, record_name, workspace_env, write_result

from storyrewrite.io import run_cli, write_text_atomic
from storyrewrite.queue import ended, running
from storyrewrite.report.collect import check_name

TARGETS_S = {"core": 360, "all": 720}  # on one H100/H200-class GPU


# A GPU counts as idle below this utilisation (nvidia-smi's share of the last sample period with a
# kernel running), and an idle stretch as a window from this long: the wait between stages or
# experiments that the run's record names (seconds from its start, as experiment_end_s).
IDLE_BELOW_PCT, IDLE_WINDOW_S, IDLE_WINDOWS_KEPT = 5.0, 10.0, 5
TIMELINE_EVERY = 20  # samples between two rewrites of the --timeline file


STEP_CHARS = 120  # a step's line in the record, cut there (a queued sweep's names every override)


def run_part(command: list[str], cwd: Path, env: dict, steps: list, interval: float = 0.2) -> int:
    """Runs a part's scripts/comparison.sh, its output passed on as it comes, and appends to `steps`
    each line it prints of a step (`== ...`): {at_s: when it came, in seconds from the part's start
    (at most `interval` late), step: the line without `== `, cut at STEP_CHARS}. Returns the
    script's exit status.

    The output goes through a file, not a pipe: the DVC queue workers and NVIDIA's MPS daemon that
    the script starts outlive it, and one that kept a pipe's end open would hold a reader of the
    pipe until it ended."""
    begun = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="comparison-part-") as folder:
        path = Path(folder) / "out.txt"
        with path.open("w", encoding="utf-8") as out:
            process = subprocess.Popen(command, cwd=cwd, env=env, stdout=out)
        with path.open(encoding="utf-8") as read:  # (an offset of its own: the script's writes go on at theirs)
            pending = ""

            def take() -> None:
                nonlocal pending
                pending += read.read()
                *lines, pending = pending.split("\n")
                for line in lines:
                    print(line, flush=True)
                    if line.startswith("== "):
                        step = line.removeprefix("== ")
                        step = step if len(step) <= STEP_CHARS else step[:STEP_CHARS - 1] + "…"
                        steps.append({"at_s": round(time.perf_counter() - begun, 1), "step": step})

            try:
                while process.poll() is None:
                    take()
                    time.sleep(interval)
            except KeyboardInterrupt:  # (Ctrl-C reached the script too: it ends once DVC has put dvc.lock back)
                process.wait(timeout=120)
                raise
            take()
            if pending:
                pending += "\n"
                take()
    return process.returncode


class Sampler:
    """The host CPUs' busy share (psutil's, which counts neither iowait nor guest time busy) and,
    where nvidia-smi is there, the GPU's utilisation and memory, sampled every `interval` seconds
    until `stop()`. Both on a GPU: a GPU left idle by experiments side by side may wait for the
    host's cores."""

    def __init__(self, interval: float = 0.5, timeline: Path | None = None):
        self.interval, self.gpu, self.timeline = interval, shutil.which("nvidia-smi") is not None, timeline
        # (seconds from the start, CPU busy %, GPU busy %, GPU memory GB)
        self.samples: list[tuple[float, float | None, float | None, float | None]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "Sampler":
        self._started, self._started_at = time.perf_counter(), time.time()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        if self.timeline:
            self.write_timeline(self.timeline)

    def _gpu(self) -> tuple[float | None, float | None]:
        result = subprocess.run(["nvidia-smi", "--query-gpu=utilization.gpu,memory.used", "--format=csv,noheader,nounits"],
                                capture_output=True, text=True)
        fields = result.stdout.splitlines()[0].split(",") if result.returncode == 0 and result.stdout.strip() else []
        return (float(fields[0]), float(fields[1]) * 2**20 / 1e9) if len(fields) == 2 else (None, None)

    def _run(self) -> None:
        psutil.cpu_percent()  # the start of the first sample's period: each call answers since the one before
        while not self._stop.wait(self.interval):
            self.samples.append((round(time.perf_counter() - self._started, 2), psutil.cpu_percent(),
                                 *(self._gpu() if self.gpu else (None, None))))
            if self.timeline and len(self.samples) % TIMELINE_EVERY == 0:  # a run cut short keeps its timeline
                self.write_timeline(self.timeline)

    def figures(self) -> dict:
        figures: dict = {"samples": len(self.samples)}
        for index, name in enumerate(("cpu_busy_pct_mean", "gpu_busy_pct_mean"), start=1):
            values = [sample[index] for sample in self.samples if sample[index] is not None]
            if values:
                figures[name] = round(sum(values) / len(values), 1)
        memory = [sample[3] for sample in self.samples if sample[3] is not None]
        if not memory:
            return figures
        windows = idle_windows([(sample[0], sample[2]) for sample in self.samples], self.interval)
        longest = sorted(sorted(windows, key=lambda w: -w["s"])[:IDLE_WINDOWS_KEPT], key=lambda w: w["from_s"])
        return figures | {"gpu_memory_gb_peak": round(max(memory), 2), "gpu_idle_s": round(sum(w["s"] for w in windows), 1),
                          "gpu_idle_windows": longest}

    def write_timeline(self, path: Path) -> None:
        """The samples so far as CSV, one row each (an empty field: not sampled there), written
        atomically (the sampler rewrites its `timeline` every TIMELINE_EVERY samples and at its end)."""
        rows = ["utc,seconds,cpu_busy_pct,gpu_busy_pct,gpu_memory_gb"]  # utc: to set beside the stage records' times
        rows += [",".join([datetime.fromtimestamp(self._started_at + sample[0], timezone.utc).isoformat(timespec="milliseconds"),
                           *("" if value is None else f"{value:.2f}" for value in sample)]) for sample in self.samples]
        write_text_atomic(path, "\n".join(rows) + "\n")


def idle_windows(samples: list[tuple[float, float | None]], interval: float) -> list[dict]:
    """The stretches of at least IDLE_WINDOW_S during which the GPU stayed below IDLE_BELOW_PCT:
    {"from_s", "s"} each, from (seconds, GPU busy %) samples taken every `interval` seconds (a
    sample speaks for the period before it; a sample without a reading ends a stretch)."""
    windows, start, last = [], None, None
    for seconds, busy in [*samples, (None, None)]:
        if busy is not None and busy < IDLE_BELOW_PCT:
            start = seconds - interval if start is None else start
            last = seconds
            continue
        if start is not None and last - start >= IDLE_WINDOW_S:
            windows.append({"from_s": round(start, 1), "s": round(last - start, 1)})
        start = None
    return windows


def workspace(into: Path) -> Path:
    """A fresh repository of this tree: a clone of HEAD, or, where this tree is no git checkout
    (a copy sent to a GPU machine), its files committed into a new one."""
    repo = into / "repo"
    if (ROOT / ".git").exists():
        subprocess.run(["git", "clone", "-q", str(ROOT), str(repo)], check=True)
        return repo
    skip = {".git", ".venv", ".device", ".cache", "bench-out", "runs"}
    shutil.copytree(ROOT, repo, ignore=lambda folder, names: [n for n in names if Path(folder) == ROOT and n in skip])
    env = {**os.environ, "GIT_AUTHOR_NAME": "bench", "GIT_AUTHOR_EMAIL": "bench@localhost", "GIT_COMMITTER_NAME": "bench",
           "GIT_COMMITTER_EMAIL": "bench@localhost"}
    for command in (["git", "init", "-q"], ["git", "add", "-A"], ["git", "commit", "-qm", "bench copy"]):
        subprocess.run(command, cwd=repo, check=True, env=env)
    return repo


def stage_walls(repo: Path, name: str, spans: dict[str, tuple[float, float]] | None = None) -> tuple[dict, dict, set]:
    """The gathered experiments' stage records: figures (`stage_wall_s`, seconds summed by stage,
    each stage run once however many experiments restored it; `experiment_wall_s`, each
    experiment's own, restored ones included; `between_stages`; `compiled`; `step_time`;
    `scoring_s`; `validating_s`; `part_edges_s` of the parts that ended, `spans`), when each
    experiment's last stage ended (experiment_ends), and the names of the experiments of `core`
    (every objective but CPO's)."""
    by_stage: dict[str, float] = defaultdict(float)
    by_experiment: dict[str, float] = {}
    records_of: dict[str, list[dict]] = {}
    ran: dict[tuple, dict] = {}  # a stage restored from the run cache brings its first run's record: counted once
    runs = gathered_runs([repo / "runs" / name], repo)
    for run in runs:
        records = records_of[run.name] = run.records
        by_experiment[run.name] = round(sum(r["wall_s"] for r in records), 1)
        for record in records:
            key = (record["stage"], record.get("started_at"), record["wall_s"])
            if key not in ran:
                ran[key] = record
                by_stage[record["stage"]] += record["wall_s"]
    core = {run.name for run in runs if run.params.get("objective") != "cpo"}
    figures = {"stage_wall_s": {stage: round(seconds, 1) for stage, seconds in sorted(by_stage.items())},
               "experiment_wall_s": by_experiment, "between_stages": between_stages(ran.values()), "compiled": compiled(ran.values()),
               "step_time": step_time(runs), "scoring_s": scoring_seconds(ran.values()),
               "validating_s": validating_seconds(records_of), "part_edges_s": part_edges(ran.values(), spans or {})}
    return figures, experiment_ends(records_of), core


def gathered_runs(folders: list[Path], repo: Path) -> list:
    """The runs gathered into those of `folders` that hold any (storyrewrite.report.collect's
    Run), one per params as the collector takes them: none where none holds a run yet."""
    if str(repo / "src") not in sys.path:
        sys.path.insert(0, str(repo / "src"))
    from storyrewrite.report.collect import load_runs

    return load_runs([folder for folder in folders if any(folder.glob("*.json"))])


def gathered_before(repo: Path, name: str) -> list[str]:
    """The runs of the comparison NAME gathered before it starts, in the folders scripts/comparison.sh
    reads (runs/NAME, and runs/NAME.<anything> from other machines): the parts leave out the runs of
    theirs that these stand for, so the run that follows is not the whole comparison."""
    folders = [repo / "runs" / name, *sorted((repo / "runs").glob(f"{name}.*"))]
    return sorted(run.name for run in gathered_runs([f for f in folders if f.is_dir()], repo))


def run_figures(walls: dict, ends: dict[str, float], started_at: float, load: dict) -> dict:
    """The figures an interim record and the whole run's share: the load, the gathered
    experiments' stage figures (stage_walls) and when each ended, in seconds from `started_at`."""
    return {"load": load, "experiments": len(walls["experiment_wall_s"]), **walls,
            "experiment_end_s": {name: round(end - started_at, 1) for name, end in sorted(ends.items(), key=lambda item: item[1])}}


def targets_for(parts: dict[str, float], gpu: bool, resumed: bool, elapsed: float | None = None,
                part_now: tuple[str, float] | None = None) -> dict[str, dict[str, float]]:
    """The wall-time targets a record is held to (TARGETS_S, on a GPU only). A whole run's:
    `wall_s.core` and `wall_s.core_in_all` (core alone takes no longer than beside cpo) against
    core's, `wall_s.total` against all's where both parts ran. A resumed comparison's: none.
    An interim record (`elapsed`: its time so far; `part_now`: the part running and when it
    began, in seconds from the start): only what it already misses, `elapsed_s` against the
    target of all or of core, whichever the parts run and the time exceeds."""
    if not gpu or resumed:
        return {}
    if elapsed is None:
        targets = {f"wall_s.{part}": {"max": TARGETS_S["core"]} for part in ("core", "core_in_all") if part in parts}
        if {"core", "cpo"} <= set(parts) or "all" in parts:
            targets["wall_s.total"] = {"max": TARGETS_S["all"]}
        return targets
    running_part = part_now[0] if part_now else None
    if running_part == "all" or (running_part == "cpo" and "core" in parts):
        bound = TARGETS_S["all"]
    elif running_part == "core" and not parts:
        bound = TARGETS_S["core"]
    else:
        return {}
    return {"elapsed_s": {"max": bound}} if elapsed > bound else {}


class Interim:
    """Calls `write` every `every` seconds from a thread of its own, from entering the block to
    leaving it (`every` 0: never). A write that fails is reported and the next one tried."""

    def __init__(self, every: float, write: Callable[[], None]):
        self.every, self.write, self.written = every, write, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "Interim":
        if self.every > 0:
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            try:
                self.write()
                self.written += 1
            except Exception as err:  # noqa: BLE001  (an interim record is a convenience: the run goes on)
                print(f"warning: interim record not written: {type(err).__name__}: {err}", file=sys.stderr, flush=True)


def mps_said(state: Path) -> str | None:
    """What a part's comparison.sh wrote of MPS as it started it (COMPARISON_MPS_STATE): `on, ...`
    or `off: why`; None before it has (or where it never does: one worker, nothing queued). The
    interim records read it while the part runs, and the part's end removes it: a read may lose."""
    try:
        return state.read_text().strip() or None
    except OSError:
        return None


def scoring_seconds(records: Iterable[dict]) -> dict[str, float]:
    """Where the scoring stages' time went (score, validity: their records' `seconds`, loading
    the models and each metric), summed over the stages that ran, largest first."""
    found: dict[str, float] = defaultdict(float)
    for record in records:
        for part, seconds in (record.get("seconds") or {}).items():
            found[part] += seconds
    return {part: round(seconds, 1) for part, seconds in sorted(found.items(), key=lambda item: -item[1])}


def validating_seconds(records_of: dict[str, list[dict]]) -> dict[str, dict[str, float]]:
    """Each experiment's training stages that ran validation: their `train_s` and the `validate_s`
    of it (the stage records of storyrewrite.training.stage), keyed by stage; experiments whose
    records have neither are left out."""
    found = {name: {r["stage"]: {"train_s": r["train_s"], "validate_s": r["validate_s"]} for r in records
                    if r.get("validate_s") is not None and r.get("train_s") is not None}
             for name, records in records_of.items()}
    return {name: stages for name, stages in sorted(found.items()) if stages}


# The fine-tuning's wall-time curves (docs/training.md): where its steps' time went.
CLOCK_CURVES = ("cpu_time_share", "cpu_wait_time_share", "sample_time_share", "sample_read_time_share")


def step_time(runs: Iterable) -> dict[str, dict[str, float]]:
    """Each experiment's fine-tuning: the mean over its steps of each wall-time share it logged
    (CLOCK_CURVES), as its run holds the curves; experiments with none are left out."""
    found: dict[str, dict[str, float]] = {}
    for run in runs:
        curves = run.curves("finetuned")
        shares = {name: round(sum(row["value"] for row in rows) / len(rows), 3)
                  for name in CLOCK_CURVES if (rows := curves.get(name))}
        if shares:
            found[run.name] = shares
    return found


def compiled(records: Iterable[dict]) -> dict:
    """What torch.compile did in the stages that ran (records.compile_counts), summed by stage
    (a training stage's by objective too), with the first reason a graph was not replayed as
    CUDA graphs; stages that compiled nothing are left out."""
    found: dict[str, dict] = {}
    for record in records:
        if record.get("compiled_graphs"):
            stage = record["stage"] + (f" ({record['objective']})" if record.get("objective") else "")
            into = found.setdefault(stage, {"runs": 0, "compiled_graphs": 0, "graph_breaks": 0, "cudagraph_skips": 0})
            into["runs"] += 1
            for key in ("compiled_graphs", "graph_breaks", "cudagraph_skips"):
                into[key] += record.get(key) or 0
            if record.get("cudagraph_skip_reason"):
                into.setdefault("cudagraph_skip_reason", record["cudagraph_skip_reason"])
    return dict(sorted(found.items()))


def experiment_ends(records_of: dict[str, list[dict]]) -> dict[str, float]:
    """When each experiment's last recorded stage ended, in seconds since the epoch: the latest
    start plus wall time of its records (a restored stage's record is its first run's, which
    ended earlier). What follows the work (exit, DVC's lock, gathering) is not in it."""
    ends = {name: [datetime.fromisoformat(r["started_at"]).timestamp() + r["wall_s"] for r in records if r.get("started_at")]
            for name, records in records_of.items()}
    return {name: max(times) for name, times in ends.items() if times}


def between_stages(records: Iterable[dict]) -> dict:
    """Where the time between stages went, over `records` (each a stage that ran): `startup_s`,
    in the stages' processes before their work (interpreter, imports, arguments:
    records.process_age_s), and `between_s`, from a recorded stage's end to the next one's process
    start in the same experiment: the first process's exit and DVC's work between them (hashing,
    caching, the lock file, stages restored or without a record)."""
    records = list(records)
    by_run: dict[str, list[dict]] = defaultdict(list)  # by the experiment (a shared group's too) that ran the stage
    for record in records:
        if record.get("experiment") and record.get("started_at") and record.get("startup_s") is not None:
            by_run[record["experiment"]].append(record)
    between = 0.0
    for ran in by_run.values():
        ran.sort(key=lambda r: r["started_at"])
        for before, after in pairwise(ran):
            ended = datetime.fromisoformat(before["started_at"]).timestamp() + before["wall_s"]
            between += datetime.fromisoformat(after["started_at"]).timestamp() - after["startup_s"] - ended
    return {"startup_s": round(sum(r.get("startup_s") or 0.0 for r in records), 1), "between_s": round(between, 1)}


def part_edges(records: Iterable[dict], spans: dict[str, tuple[float, float]]) -> dict[str, dict[str, float]]:
    """Where each part's wall time went before its first stage and after its last, the GPU idle
    throughout. `spans`: each part's start and end, in seconds since the epoch; `records`: the
    stages that ran (a stage belongs to the part in which it started). `to_first_stage_s`: from
    the part's start to the process start of its first stage (planning and queueing the runs,
    starting the queue's workers, DVC setting up the first experiment and restoring the stages
    before it). `after_last_stage_s`: from the end of its last stage to the part's end (the
    process's exit, DVC ending the experiments, the queue's polls, stopping the workers,
    gathering, collecting). A part that started no stage is left out."""
    found = {}
    for part, (begun, finished) in spans.items():
        starts, ends = [], []
        for record in records:
            if record.get("started_at") is None:
                continue
            start = datetime.fromisoformat(record["started_at"]).timestamp()
            if begun <= start <= finished:
                starts.append(start - (record.get("startup_s") or 0.0))
                ends.append(start + record["wall_s"])
        if starts:
            found[part] = {"to_first_stage_s": round(min(starts) - begun, 1), "after_last_stage_s": round(finished - max(ends), 1)}
    return found


def core_in_all(ends: dict[str, float], core: set[str], begun: float) -> float | None:
    """Seconds from `begun` (the start of the part `all`) to the end of its last core experiment
    (experiment_ends), None where none ended. Core's experiments are queued first and the CPO runs
    beside them only share the machine: core alone takes no longer."""
    return round(max(ends[name] for name in core & ends.keys()) - begun, 1) if core & ends.keys() else None


def arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", type=Path, nargs="*", default=[], help="params overlays, in order (params/gpu.yaml)")
    parser.add_argument("--jobs", default="auto", help="queue workers: a number or auto (default)")
    parser.add_argument("--parts", nargs="+", default=["core", "cpo"], choices=["core", "cpo", "all", "seeds"],
                        help="the comparison's parts, run one after the other (default: core cpo)")
    parser.add_argument("--name", default="timed", help="the comparison's name: runs/NAME, reports/NAME (default timed)")
    parser.add_argument("--mps", action="store_true", help="share the GPU through NVIDIA's MPS (COMPARISON_MPS=1)")
    parser.add_argument("--max-runs", type=int, help="queue at most this many runs a part (comparison.sh -n): the "
                        "record is held to no target")
    parser.add_argument("--here", action="store_true", help="run in this repository, not in a fresh workspace")
    parser.add_argument("--variant", default="", type=record_name, help="a suffix for the figures file (comparison-VARIANT.json)")
    parser.add_argument("--keep", type=Path, help="the fresh workspace's folder, kept (default: a temporary one, removed)")
    parser.add_argument("--interim-every", type=float, default=60.0,
                        help="seconds between two interim records while the parts run (complete: false; 0: none)")
    parser.add_argument("--timeline", type=Path, help="keep the load's samples here as CSV (UTC, seconds from the start, "
                                                      "CPU busy %%, GPU busy %%, GPU memory GB), rewritten every 10 s")
    return parser


def main() -> None:
    args = arguments().parse_args()
    for profile in args.profile:
        if not (ROOT / profile).is_file():
            raise SystemExit(f"error: --profile {profile}: no such file")
    check_name(args.name, ROOT)  # (the collect's rule for runs/NAME and reports/NAME)
    if args.interim_every < 0:
        raise SystemExit(f"error: --interim-every {args.interim_every:g}: seconds >= 0 (0: no interim record)")
    if args.max_runs is not None and args.max_runs < 1:
        raise SystemExit(f"error: --max-runs {args.max_runs}: a whole number >= 1 (leave it out: every run)")
    if args.here and not (ROOT / ".git").exists():
        raise SystemExit("error: --here needs this tree to be a git repository (DVC's experiments are commits)")
    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    result_name = f"comparison{'-' + args.variant if args.variant else ''}"
    with tempfile.TemporaryDirectory(prefix="comparison-bench-") as temporary:
        into = args.keep or Path(temporary)
        into.mkdir(parents=True, exist_ok=True)
        repo = ROOT if args.here else workspace(into)
        env = workspace_env(repo)
        before = gathered_before(repo, args.name)
        if before:
            print(f"== resuming: {len(before)} run(s) gathered before ({', '.join(before)}); the record is held to no "
                  "target", flush=True)
        settings = {"profiles": [str(p) for p in args.profile], "jobs": args.jobs, "parts": args.parts,
                    **({"gathered_before": before} if before else {}), **({"mps": {}} if args.mps else {}),
                    **({"max_runs": args.max_runs} if args.max_runs else {})}
        partial = bool(before) or bool(args.max_runs)  # (held to no target: not the whole comparison's time)
        limit = ["-n", str(args.max_runs)] if args.max_runs else []
        mps_state = Path(temporary) / "mps-state"
        if args.mps:
            env.update(COMPARISON_MPS="1", COMPARISON_MPS_STATE=str(mps_state))
        parts, failed, begun_at, now, steps = {}, [], {}, {}, {}
        started, started_at = time.perf_counter(), time.time()

        def spans() -> dict[str, tuple[float, float]]:
            """Each part that ended: its start and end, in seconds since the epoch."""
            return {part: (begun_at[part], begun_at[part] + parts[part]) for part in list(parts) if part in begun_at}

        def interim() -> None:
            """The record so far (complete: false), for a run cut short."""
            elapsed = round(time.perf_counter() - started, 1)
            walls, ends, _ = stage_walls(repo, args.name, spans())
            current = dict(now)  # (one read: the parts' loop changes it)
            part_now = (current["part"], round(current["begun"] - started, 1)) if current else None
            if args.mps and part_now and (state := mps_said(mps_state)) is not None:
                settings["mps"][part_now[0]] = state
            figures = {"complete": False, "elapsed_s": elapsed, "wall_s": dict(parts),
                       **({"part_running": {"part": part_now[0], "from_s": part_now[1]}} if part_now else {}),
                       **run_figures(walls, ends, started_at, sampler.figures()),
                       "running": running(repo), "ended": ended(repo, started_at), "failed_parts": list(failed),
                       "steps_s": {part: list(lines) for part, lines in list(steps.items())}}
            write_result(result_name, device, figures, settings,
                         targets_for(parts, device.type == "cuda", partial, elapsed, part_now), quiet=True)

        with Sampler(timeline=args.timeline) as sampler, Interim(args.interim_every, interim):
            for part in args.parts:
                begun, begun_at[part] = time.perf_counter(), time.time()
                now.update(part=part, begun=begun)
                command = ["bash", "scripts/comparison.sh", "-j", str(args.jobs), *limit, args.name, part, *map(str, args.profile)]
                print(f"== {part}: {' '.join(command[1:])}", flush=True)
                returncode = run_part(command, repo, env, steps.setdefault(part, []))
                parts[part] = round(time.perf_counter() - begun, 1)
                now.clear()
                if args.mps:  # (nothing written: one worker, or nothing queued)
                    settings["mps"][part] = mps_said(mps_state) or "not started"
                    mps_state.unlink(missing_ok=True)
                if returncode != 0:
                    failed.append(part)
                else:  # its shared stages are in the run cache: the next part's experiments restore them
                    env["COMPARISON_SHARED"] = "0"
        total = round(time.perf_counter() - started, 1)
        walls, ends, core = stage_walls(repo, args.name, spans())
    if "all" in parts and (within := core_in_all(ends, core, begun_at["all"])) is not None:
        parts["core_in_all"] = within
    by_stage, overheads = walls["stage_wall_s"], walls["between_stages"]
    figures = {"complete": True, "wall_s": {**parts, "total": total}, **run_figures(walls, ends, started_at, sampler.figures()),
               "failed_parts": failed, "steps_s": steps}
    write_result(result_name, device, figures, settings, targets_for(parts, device.type == "cuda", partial))
    print(f"{'part':<12} {'wall s':>8}")
    for part, seconds in [*parts.items(), ("total", total)]:
        target = TARGETS_S.get({"total": "all", "core_in_all": "core"}.get(part, part))
        ratio = f"  {seconds / target:.2f}x of the target {target} s" if device.type == "cuda" and target and not partial else ""
        print(f"{part:<12} {seconds:>8.1f}{ratio}")
    for part, edges in walls["part_edges_s"].items():
        print(f"{part}: {edges['to_first_stage_s']:.1f} s to its first stage, {edges['after_last_stage_s']:.1f} s after its last")
    if ends:
        last = max(ends, key=ends.get)
        print(f"last to end: {last} ({'core' if last in core else 'cpo'}), {ends[last] - started_at:.1f} s after the start")
    print(f"load: {figures['load']}; {figures['experiments']} experiments gathered")
    for stage, seconds in sorted(by_stage.items(), key=lambda item: -item[1])[:8]:
        print(f"  {stage:<28} {seconds:>8.1f} s (each run once)")
    print(f"between stages: {overheads['startup_s']:.1f} s in the stages' processes before their work (imports, arguments), "
          f"{overheads['between_s']:.1f} s outside them (exit, DVC), summed over the stages that ran")
    if figures["scoring_s"]:
        print("scoring stages, by part: " + ", ".join(f"{part} {seconds:.1f} s" for part, seconds in figures["scoring_s"].items()))
    for stage, facts in figures["compiled"].items():
        print(f"compiled in {stage}: {facts}")
    for name, shares in figures["step_time"].items():
        print(f"steps of {name}: " + ", ".join(f"{curve.removesuffix('_time_share')} {share:.0%}" for curve, share in shares.items()))
    if failed:
        raise SystemExit(f"error: part(s) failed: {', '.join(failed)}")


if __name__ == "__main__":
    run_cli(main)
