"""What every bench script starts from: the default profile's params, its materialised models
and its prepared splits (taken from the pipeline's outputs when `dvc repro` has made them, else
built once into .cache/bench/ and reused by every later process), and timing that is honest on a
GPU (synchronised) as on a CPU."""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import torch
from commit_name import commit_name
from torch.autograd import DeviceType

from storyrewrite import closure
from storyrewrite.data import prepare as prepare_module
from storyrewrite.data.prepare import prepare
from storyrewrite.data.sources import download
from storyrewrite.io import InputError, atomic_dir
from storyrewrite.models import materialise as materialise_module
from storyrewrite.models.materialise import materialise
from storyrewrite.models.catalogue import EVAL_ROLES
from storyrewrite.objectives.registry import SETTINGS, get_objective
from storyrewrite.params import Params, load_yaml, overlay, with_overrides
from storyrewrite.records import cpu_facts, cpu_features, peak_rss_gb

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / ".cache" / "bench"


COMMIT = commit_name(ROOT)  # taken when the bench starts: the code it imports


def workspace_env(repo: Path) -> dict[str, str]:
    """The environment for commands run in `repo` (a clone, or this tree): its own code first on
    PYTHONPATH, before the entries already there (an offline machine's installed packages), and this
    interpreter's folder first on PATH (its `python` and `dvc`)."""
    paths = [str(repo / "src"), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
            "PYTHONPATH": os.pathsep.join(paths)}


def dvc(repo: Path, *args: str, output: bool = True, interpreter: tuple[str, ...] = ()) -> str:
    """`dvc ARGS` in `repo` (this interpreter's DVC, the repository's own code first:
    workspace_env); its output (`output=False`: none, for a command that leaves daemons behind
    holding its output open, as `dvc queue start` does). `interpreter`: options of the Python that
    runs it (e.g. `-m cProfile -o FILE`). A failure ends the bench, naming the command."""
    pipes = {"capture_output": True} if output else {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    result = subprocess.run([sys.executable, *interpreter, "-m", "dvc", *args], cwd=repo, env=workspace_env(repo), text=True,
                            **pipes)
    if result.returncode != 0:
        detail = f":\n{result.stdout[-2000:]}{result.stderr[-2000:]}" if output else ""
        raise SystemExit(f"error: dvc {' '.join(args)} failed in {repo}{detail}")
    return result.stdout if output else ""


def stages_ran(output: str) -> list[str]:
    """The stages DVC ran, in order, from the output of `dvc repro`, `dvc exp run` or `dvc queue
    logs` (its `Running stage 'NAME':` lines; a stage restored from the run cache is not one)."""
    return re.findall(r"^Running stage '([^']+)'", output, flags=re.MULTILINE)


def clone_with_cache(into: Path) -> Path:
    """A fresh clone of this repository's HEAD at `into` that uses this repository's DVC cache (and
    so its run cache: what `dvc repro` built here)."""
    subprocess.run(["git", "clone", "-q", str(ROOT), str(into)], check=True)
    dvc(into, "cache", "dir", "--local", str(ROOT / ".dvc" / "cache"))
    return into


def models_dir(params: Params, workspace: Params, stage_dir: Path, kind: str, roles: tuple[str, ...]) -> Path:
    """A models stage's directory (models/pretrained, models/evaluators) where `dvc repro` made it
    with these params' models and seed (the stages' params: a tiny model's weights are drawn from
    the seed), else `roles` materialised once into .cache/bench/<kind>-..."""
    if (params.models, params.seed) == (workspace.models, workspace.seed) and (stage_dir / "index.json").exists():
        return stage_dir
    return cached(kind, [params.models.model_dump(), params.seed], materialise_module.__file__,
                  lambda out: materialise(params.models, out, params.seed, roles))


def evaluators_dir(params: Params) -> Path:
    """The eval_models stage's directory for these params (models_dir)."""
    return models_dir(params, Params.load(ROOT / "params.yaml"), ROOT / "models" / "evaluators", "evaluators", EVAL_ROLES)


def record_key(where: dict, facts: dict) -> str:
    """A run's key in reports/bench/<script>.json, one record per key: the GPU's name, or for a
    CPU its name and features ("cpu: AMD EPYC (2 cores), AVX2, no bf16 instructions"), so that
    machines of one CPU name but other vector units (a cloud's "AMD EPYC" is several
    generations) each keep their figures. `where`: records.describe_device; `facts`: cpu_facts()
    for a CPU."""
    if where["device"] != "cpu":
        return where["device_name"]
    return f"cpu: {where['device_name']}, {cpu_features(facts)}"


def rekeyed(runs: dict) -> dict:
    """A results file's records under record_key: a CPU record keyed by its name alone but holding
    its features takes the key with them (records written before the key named them)."""
    return {record_key(run, run) if run["device"] == "cpu" and "cpu_capability" in run else key: run
            for key, run in runs.items()}


def record_name(value: str) -> str:
    """An argparse type: the name of a figures file in reports/bench/ (`--name`), or a part of one
    (`--variant`), checked before anything is measured: a path would put the record elsewhere."""
    if not re.fullmatch(r"[A-Za-z0-9._-]*", value):
        raise argparse.ArgumentTypeError(f"{value!r} is not a name for a file in reports/bench/: letters, digits, '.', '_' "
                                         "and '-' only")
    return value


def write_result(script: str, device: torch.device, figures: dict, settings: dict,
                 targets: dict[str, dict[str, float]] | None = None, quiet: bool = False) -> Path:
    """reports/bench/<script>.json: this run's figures with where they were measured (machine,
    device, versions, commit), kept per device (record_key): a run replaces the previous one of
    its device.
    `script`: the script's name, with a variant (e.g. "-bf16-mixed") where its options measure
    something else; the record names the script that ran and its command line as given.
    `targets`: a figure's dotted path in `figures` -> {"max": x} or {"min": x} (docs/benchmarks.md
    marks each figure against its target). `quiet`: no line saying where the figures went (a
    record rewritten as a run goes on)."""
    import sys
    from datetime import datetime, timezone

    from storyrewrite.io import read_json, write_json_atomic
    from storyrewrite.records import cpu_name, describe_device

    path = ROOT / "reports" / "bench" / f"{script}.json"
    runs = rekeyed(read_json(path)) if path.exists() else {}
    where = describe_device(device)
    facts = {}
    if where["device"] == "cpu":
        # What a CPU figure depends on beyond the model name: the vector instructions torch's
        # kernels use, and whether bf16 runs in hardware or in emulation (bf16-mixed on a CPU).
        facts = cpu_facts()
        runs.pop(f"cpu: {where['device_name']}", None)  # this CPU name's record from before features were recorded
    key = record_key(where, facts)
    ran = f"bench/{Path(sys.argv[0]).name}"  # the script that ran, not the result's name: a variant's command runs as shown
    runs[key] = {
        "script": ran, "command": " ".join(["python", ran, *sys.argv[1:]]),
        **where, "machine": cpu_name(), "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
        "cuda": torch.version.cuda, "python": platform.python_version(), "commit": COMMIT,
        **facts,
        "measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds"), "settings": settings, "figures": figures,
        "targets": targets or {},
    }
    write_json_atomic(path, runs)
    if not quiet:
        print(f"figures written to {path.relative_to(ROOT)}")
    return path


def inputs(profiles: list[Path] = (), overrides: dict | None = None, sets: list[str] = ()) -> tuple[Params, Path, Path]:
    """(params.yaml with the profiles, then `overrides`, overlaid, then `sets` applied as `dvc exp
    run -S` applies them (`--set`, through `params.with_overrides`: DVC's own parsing, and a key
    params.yaml lacks refused with the valid ones); the models stage's directory; prepared tables).

    The pipeline's outputs (`dvc repro`) are used where their settings are these params' (the
    models and the seed: models_dir; the data); anything else comes from .cache/bench/ (see `cached`)."""
    raw_params = load_yaml(ROOT / "params.yaml")
    for source, layer in [*((str(profile), load_yaml(profile)) for profile in profiles), ("overrides", overrides or {})]:
        raw_params = overlay(raw_params, layer, source=source)
    if sets:
        experiments = with_overrides(raw_params, list(sets))
        if len(experiments) != 1:
            raise InputError(f"--set {' '.join(sets)}: a sweep ({len(experiments)} experiments); a bench measures one value a key")
        raw_params = experiments[0][1]
    params, workspace = Params(raw_params, settings=SETTINGS), Params.load(ROOT / "params.yaml", settings=SETTINGS)
    pretrained = models_dir(params, workspace, ROOT / "models" / "pretrained", "models", ("generator", "scorer"))
    prepared = ROOT / "data" / "prepared"
    same_data = (params.data, params.download, params.seed) == (workspace.data, workspace.download, workspace.seed)
    if not same_data or not (prepared / params.task / "train.jsonl").exists():
        def build(out: Path) -> None:  # the bundled files checked and copied (or downloaded), then prepared
            download(params.download, out / "raw", ROOT / "data" / "bundled", out / "sums.json")
            prepare(out / "raw", out / "prepared", params.data, params.seed)

        key = [params.data.model_dump(), params.download.model_dump(), params.seed]
        prepared = cached("data", key, prepare_module.__file__, build) / "prepared"
    return params, pretrained, prepared


def train_run(profiles: list[Path], objective: str, overrides: dict | None = None, sets: list[str] = (), **changes):
    """The train stage's `Run` of `objective`, as the stage builds it from these params (see
    `inputs`), its training section changed by `changes` (e.g. max_steps, precision)."""
    import dataclasses

    # Imported here: the benches that train nothing must not pull in Lightning.
    from storyrewrite.models.store import resolve_model_dir
    from storyrewrite.training.run import Run

    params, pretrained, prepared = inputs(profiles, overrides, sets)
    run = Run.from_params(params, "train", get_objective(objective, params.task), resolve_model_dir(pretrained), prepared, resolve_model_dir(pretrained, "scorer"))
    return dataclasses.replace(run, config=run.config.model_copy(update=changes))


def cached(kind: str, settings: object, code: str, build: Callable[[Path], object]) -> Path:
    """.cache/bench/<kind>-<digest>/, filled by `build` the first time: the digest covers the
    settings and the package code that `code` (a module file) runs, so a changed setting or
    changed code builds anew. Built in a staging directory and renamed when complete, so a bench
    killed while building leaves nothing that a later one would take (the models of a GGUF
    spec take half a minute to de-quantise, once instead of once per process)."""
    blob = json.dumps({"settings": settings, "code": closure.digest(closure.closure(code))}, sort_keys=True, default=str)
    out = CACHE / f"{kind}-{hashlib.sha256(blob.encode()).hexdigest()[:16]}"
    if not out.exists():
        with atomic_dir(out) as staging:
            build(staging)
    return out


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def clock(device: torch.device) -> float:
    """Wall time after everything queued on the device has run."""
    synchronize(device)
    return time.perf_counter()


def alternating(work: dict, rounds: int, device: torch.device) -> dict:
    """{key: seconds of each of `rounds` runs of work[key]()}: the callables run one after the
    other in each round, each first in turn (round r starts at the r-th), after a first round that
    is not timed (it warms up: optimiser state, the allocator's blocks). Interleaved in one
    process, so that the drift of the host's speed, which moves a launch-bound GPU step by more
    than the differences measured, falls on every callable alike; `paired_ratio` then sets the
    runs of one round against each other."""
    keys = list(work)
    seconds: dict = {key: [] for key in keys}
    for round_ in range(rounds + 1):
        first = round_ % len(keys)
        for key in keys[first:] + keys[:first]:
            started = clock(device)
            work[key]()
            if round_:
                seconds[key].append(clock(device) - started)
    return seconds


def paired_ratio(numerator: list[float], denominator: list[float]) -> tuple[float, list[float]]:
    """(median, [first quartile, third quartile]) over the rounds of `alternating` of one
    callable's seconds over another's in the same round."""
    pairs = [a / b for a, b in zip(numerator, denominator, strict=True)]
    ratio = statistics.median(pairs)
    return ratio, (statistics.quantiles(pairs, n=4)[::2] if len(pairs) > 1 else [ratio, ratio])


def device_seconds(events, device_type) -> float:
    """The seconds of work a profiler recorded on one kind of device (CUDA: its kernels, copies
    and fills), summed from its raw events. Not `key_averages()`, which parses every event into
    Python objects first: seconds for a CPU step's 60,000 (7 s for two NLL steps on the 2-core
    CPU, 0.3 s this way), and a GPU step has its kernels' events too."""
    return sum(event.duration_ns() for event in events if event.device_type() == device_type) / 1e9


def count_syncs(work) -> int:
    """The times `work()` makes the host wait for a CUDA device (a tensor read back, a blocking
    copy, an operator whose output size depends on values), by torch's own sync debug mode,
    which warns at each."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            work()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(warning.message) for warning in caught)


# The least share of a training step's wall time the GPU should run work for: the target of every
# bench that measures it (bench/objective_step_time.py's eager steps, bench/compiled_steps.py's).
GPU_BUSY_TARGET = 0.6


def gpu_busy(work, device: torch.device, steps: int):
    """(the share of the wall time of `steps` calls of `work()` during which the GPU ran work, by
    torch's profiler; the profiler, for its tables and trace)."""
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as profiler:
        started = clock(device)
        for _ in range(steps):
            work()
        wall = clock(device) - started
    return device_seconds(profiler.profiler.kineto_results.events(), DeviceType.CUDA) / wall, profiler


def peak_memory_gb(device: torch.device) -> float:
    """Peak GPU memory allocated by torch on CUDA, else the process's peak RSS."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 1024**3
    return peak_rss_gb()


def nan_fill() -> bool:
    """Whether torch fills every new tensor with NaN now (deterministic algorithms with
    `fill_uninitialized_memory` on; the train stage runs without: training.run.without_nan_fill),
    for the records of benches that train."""
    return torch.are_deterministic_algorithms_enabled() and torch.utils.deterministic.fill_uninitialized_memory


def describe(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}"
    features = cpu_features(cpu_facts())
    return f"CPU {platform.machine()} ({features}), {torch.get_num_threads()} torch threads, torch {torch.__version__}"
