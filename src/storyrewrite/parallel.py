"""Sharing the machine between stages that run at the same time (`dvc queue start -j N`): each
stage process takes its share of the CPU cores and, where there are several GPUs, a GPU of its
own.

- Workers: `STORYREWRITE_WORKERS` if set, else the number of DVC queue workers running on the
  machine (`dvc exp queue-worker` processes), at least 1.
- CPU threads: the cores this process may use, divided by the workers (at least 1), for torch's
  intra-op pool. Two processes with two threads each on two cores run several times slower than
  one after the other; with one thread each they share the machine.
- GPU memory: with several workers on one GPU, torch's caching allocator in each process holds
  at most what the other workers leave it (`share_gpu_memory`: their need from
  `STORYREWRITE_WORKER_GPU_GB`, else an equal share), in expandable segments (`share_machine`).
  A process's cache would otherwise keep what it freed, and another process find the GPU full.
- GPUs: with several workers and several GPUs, each process takes the first free one, holding an
  exclusive lock on `<repo>/.dvc/tmp/storyrewrite/gpu-<index>.lock` for its whole life (the
  system releases it when the process ends, a kill included). `device: auto` and the training
  sections' `accelerator`/`devices: auto` honour it; otherwise they mean what they always meant
  (the first GPU; Lightning: every GPU). Stages of a queued experiment run in DVC's temporary
  copy of the repository, under `<repo>/.dvc/tmp/exps/`: the lock files live in the outermost
  repository, which every worker shares.

- How many workers: `python -m storyrewrite.parallel workers --experiments N` prints the most
  that fit (`comparison.sh -j auto`): the cores over the threads each worker should keep, the
  host's available memory over a worker's peak resident memory (the largest `peak_rss_gb` of the
  stage records given), each GPU's free memory over a worker's GPU peak (their largest
  `peak_cuda_reserved_gb`, else `peak_cuda_gb`, plus a CUDA context), one worker a GPU where
  there are several, and never more than the experiments to run. The records count GiB, the
  free memory GB: the peaks are converted.

No torch import at module level: `run_stage` applies the share in every stage, torch or not.
"""
from __future__ import annotations

import argparse
import fcntl
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

from storyrewrite.errors import InputError

WORKERS_ENV = "STORYREWRITE_WORKERS"
RESERVE_ENV = "STORYREWRITE_WORKER_GPU_GB"  # each worker's GPU memory (share_gpu_memory), set by scripts/comparison.sh
_held: dict[int, int] = {}  # GPU index -> the file descriptor whose lock this process holds
# A queue worker's command line holds these arguments, as /proc holds a command line: each one
# NUL-terminated (psutil's reader joins the arguments so, and both readers ask the same).
QUEUE_WORKER = b"exp\0queue-worker\0"


def queue_worker_pids(proc: Path = Path("/proc"), cwd: Path | None = None) -> list[int]:
    """The pids of the DVC queue workers running on this machine (`dvc exp queue-worker`
    processes), of those whose working directory is `cwd` where given. Read from `proc` where
    it is a directory (Linux: no import); elsewhere (macOS, the BSDs) through psutil, the
    portable reader of other processes, which pays an import and a system call a process."""
    cwd = cwd.resolve() if cwd is not None else None
    if not proc.is_dir():
        return _queue_worker_pids_psutil(cwd)
    found = []
    for cmdline in proc.glob("[0-9]*/cmdline"):
        try:
            if QUEUE_WORKER in cmdline.read_bytes() and (cwd is None or (cmdline.parent / "cwd").readlink() == cwd):
                found.append(int(cmdline.parent.name))
        except OSError:
            continue  # a process that ended while we looked, or another user's (its cwd unreadable)
    return sorted(found)


def _queue_worker_pids_psutil(cwd: Path | None) -> list[int]:
    import psutil

    found = []
    for process in psutil.process_iter():
        try:
            command = "".join(f"{argument}\0" for argument in process.cmdline()).encode()
            if QUEUE_WORKER in command and (cwd is None or Path(process.cwd()) == cwd):
                found.append(process.pid)
        except (psutil.Error, OSError):
            continue  # a process that ended while we looked, or another user's
    return sorted(found)


def queue_workers(proc: Path = Path("/proc")) -> int:
    """How many DVC queue workers run on this machine (queue_worker_pids)."""
    return len(queue_worker_pids(proc))


def workers(environ=os.environ, proc: Path = Path("/proc")) -> int:
    """How many stages may run at once on this machine (see the module's doc)."""
    value = environ.get(WORKERS_ENV)
    if value is not None:
        if not value.strip().isdigit() or int(value) < 1:
            raise InputError(f"environment: {WORKERS_ENV} = {value!r} must be a whole number >= 1")
        return int(value)
    return max(1, queue_workers(proc))


def cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def thread_share(available: int, concurrent: int) -> int:
    return max(1, available // max(1, concurrent))


def repo_temp_dir(start: Path | None = None) -> Path:
    """`.dvc/tmp/storyrewrite` of the outermost DVC repository around `start` (the working
    directory): the one place every queue worker of a repository shares."""
    start = (start or Path.cwd()).resolve()
    repos = [directory for directory in (start, *start.parents) if (directory / ".dvc").is_dir()]
    root = repos[-1] if repos else start
    return root / ".dvc" / "tmp" / "storyrewrite"


def claim_gpu(count: int, directory: Path) -> int | None:
    """The index of a GPU this process now holds (the first of `count` whose lock is free, or
    the one it already holds), or None when every GPU is taken."""
    if _held:
        return next(iter(_held))
    directory.mkdir(parents=True, exist_ok=True)
    for index in range(count):
        fd = os.open(directory / f"gpu-{index}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        _held[index] = fd
        return index
    return None


def assigned_gpu(gpu_count: int, concurrent: int | None = None, directory: Path | None = None) -> int | None:
    """The GPU this process should use when several workers share several GPUs (None: no
    assignment, the usual meaning of `auto`). A worker that finds every GPU taken is told so."""
    concurrent = workers() if concurrent is None else concurrent
    if concurrent < 2 or gpu_count < 2:
        return None
    index = claim_gpu(gpu_count, directory or repo_temp_dir())
    if index is None:
        raise InputError(f"all {gpu_count} GPUs are held by other stages ({WORKERS_ENV} or DVC's queue says {concurrent} "
                         f"workers): start at most {gpu_count} queue workers (`dvc queue start -j {gpu_count}`)")
    return index


def share_machine(concurrent: int | None = None) -> int | None:
    """With several workers (`concurrent`, default `workers()`), give this process its share of
    the CPU cores (torch's intra-op threads, where torch is loaded, else the OpenMP pool it will
    start with; the tokenizers' pool); returns the thread count, None where one worker keeps
    torch's own choice."""
    concurrent = workers() if concurrent is None else concurrent
    if concurrent < 2:
        return None
    torch = sys.modules.get("torch")
    threads = thread_share(torch.get_num_threads() if torch is not None else cores(), concurrent)
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    if not any(name in os.environ for name in ALLOC_CONF_ENVS):
        # Read when CUDA starts in this process, which is later: stages import torch but touch no GPU first.
        os.environ[ALLOC_CONF_ENVS[0]] = EXPANDABLE
    if torch is not None:
        torch.set_num_threads(threads)
    else:
        os.environ["OMP_NUM_THREADS"] = str(threads)
    return threads


# torch's allocator settings (the second is the newer name). Expandable segments grow one mapping
# per stream instead of caching blocks of every size the batches ask for: what a process holds
# stays near what it uses, where batches of varying length fragment the cache (PyTorch's own
# advice in its out-of-memory message).
ALLOC_CONF_ENVS = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
EXPANDABLE = "expandable_segments:True"
_capped: dict[int, float] = {}  # GPU index -> the cap in GB this process set


def worker_gpu_reserve(environ=os.environ) -> float | None:
    """`STORYREWRITE_WORKER_GPU_GB`: the GPU memory each worker needs, in GB (scripts/comparison.sh:
    the largest peak of the stage records, `python -m storyrewrite.parallel gpu-reserve`); None
    where unset."""
    value = environ.get(RESERVE_ENV)
    if value is None:
        return None
    try:
        reserve = float(value)
    except ValueError:
        reserve = math.nan
    if not math.isfinite(reserve) or reserve <= 0:
        raise InputError(f"environment: {RESERVE_ENV} = {value!r} must be a number of GB > 0")
    return reserve


def share_gpu_memory(device, concurrent: int | None = None, environ=os.environ) -> float | None:
    """With several workers (`concurrent`, default `workers()`) on one GPU, caps torch's caching
    allocator in this process (`torch.cuda.set_per_process_memory_fraction`), and says so once:
    at GPU_HEADROOM of the GPU's memory less what each other worker needs, where
    `worker_gpu_reserve` says that, else at an equal share (GPU_HEADROOM / workers); never below
    the equal share. At the cap the allocator returns its cached blocks to the GPU before it fails:
    one process's cache cannot take what the others need, and a stage larger than the others
    (RLOO's training beside CPO's) may still take what they leave. A stage that needs more than
    its cap fails in itself, with torch's message and this line above it. Returns the cap in GB;
    None on a CPU, with one worker, or with several GPUs (each worker has one of its own,
    `assigned_gpu`)."""
    import torch

    if device.type != "cuda":
        return None
    concurrent = workers() if concurrent is None else concurrent
    if concurrent < 2 or torch.cuda.device_count() != 1:
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _capped:
        reserve = worker_gpu_reserve(environ)
        total_gb = torch.cuda.get_device_properties(index).total_memory / 1e9
        equal = GPU_HEADROOM / concurrent
        fraction = equal if reserve is None else max(equal, GPU_HEADROOM - (concurrent - 1) * reserve / total_gb)
        torch.cuda.set_per_process_memory_fraction(fraction, index)
        _capped[index] = fraction * total_gb
        why = (f"({GPU_HEADROOM} / {concurrent}), this process's share of one of {concurrent} concurrent workers"
               if fraction == equal else
               f"({GPU_HEADROOM} of it less {reserve:.2f} GB for each of {concurrent - 1} other concurrent workers)")
        print(f"GPU memory: at most {_capped[index]:.1f} of {total_gb:.1f} GB {why}", file=sys.stderr)
    return _capped[index]


DEFAULT_PEAK_GB = 8.0  # a worker's GPU memory where no stage record says (a 135M model's training: 5.7 GB)
GPU_HEADROOM = 0.9  # of each GPU's free memory: the rest for the CUDA contexts' own and fragmentation
# A CUDA context's own memory, beside torch's pool: 516 MiB a process on an H200 (CUDA 13.0,
# torch 2.11, MPS on), as torch's out-of-memory message there reported for a process that had
# allocated nothing yet. Added to a worker's peak, which the records count in torch's pool alone.
GPU_CONTEXT_GB = 0.54
# A worker's resident memory where no stage record says: RLOO's training of the 135M model on a
# CPU (the largest stage there, with its reference model and the scorer) peaks at 8.8 GiB, 9.4 GB.
DEFAULT_RSS_GB = 9.5
HOST_HEADROOM = 0.8  # of the host's available memory: the rest for DVC, the data loaders' workers and the page cache


def host_available_gb(meminfo: Path = Path("/proc/meminfo")) -> float | None:
    """The memory the host can give new processes without swapping (MemAvailable), in GB; None
    where /proc/meminfo holds no such line (Linux before 3.14). Without /proc/meminfo (macOS, the
    BSDs), psutil's estimate of the same."""
    if not meminfo.exists():
        import psutil

        return psutil.virtual_memory().available / 1e9
    try:
        line = next(line for line in meminfo.read_text().splitlines() if line.startswith("MemAvailable:"))
    except (OSError, StopIteration):
        return None
    return int(line.split()[1]) * 1024 / 1e9  # kB


def gpu_free_gb() -> list[float]:
    """Each visible GPU's free memory in GB, from nvidia-smi (NVML's own tool: no CUDA context
    is made, so this process takes none of it); [] without NVIDIA GPUs."""
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        result = subprocess.run(["nvidia-smi", "--query-gpu=memory.free", "--format=csv,noheader,nounits"],
                                capture_output=True, text=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError):
        return []
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    free = [int(line) * 2**20 / 1e9 for line in result.stdout.split() if line.strip().isdigit()]
    if visible is not None and visible.strip() != "":
        indices = [int(part) for part in visible.split(",") if part.strip().isdigit()]
        free = [free[i] for i in indices if i < len(free)]
    return free


GPU_PEAK_KEYS = ("peak_cuda_reserved_gb", "peak_cuda_gb")  # what torch's pool held, else what it handed out
# The stage records' memory peaks (storyrewrite.records: `*_gb` keys) are GiB, bytes / 2**30; the
# free memory they are held against (nvidia-smi's, the host's, torch's total) is counted here in GB.
RECORD_UNIT_GB = 2**30 / 1e9


def peak_gb(records: list[Path], key: str | tuple[str, ...] = GPU_PEAK_KEYS) -> tuple[float | None, int]:
    """The largest memory peak, in the records' GiB (`key`: GPU_PEAK_KEYS, the GPU's, each record's first key it
    holds; `peak_rss_gb`, the process's resident memory) of the stage records
    (storyrewrite.records) given, and how many records had one; (None, 0) where none did (for the
    GPU's: none ran on a GPU)."""
    keys = (key,) if isinstance(key, str) else key
    peaks = []
    for path in records:
        try:
            record = json.loads(Path(path).read_text(encoding="utf-8"))
            peak = next((record[name] for name in keys if record.get(name) is not None), None)
        except (OSError, ValueError, AttributeError):
            continue  # not a stage record, or one being written
        if isinstance(peak, (int, float)) and peak > 0:
            peaks.append(float(peak))
    return (max(peaks), len(peaks)) if peaks else (None, 0)


def choose_workers(cores: int, threads_per_worker: int, free_gb: list[float], worker_peak_gb: float,
                   experiments: int, host_gb: float | None = None, worker_rss_gb: float = DEFAULT_RSS_GB
                   ) -> tuple[int, list[str]]:
    """How many queue workers to start, and a line for each bound: the cores, the host's available
    memory (`host_gb`, None: unknown, no bound), the GPUs' memory (one GPU: as many workers as fit
    in its free memory; several: one worker each, as `assigned_gpu` gives each its own) and the
    experiments to run."""
    bounds = [(max(1, cores // threads_per_worker), f"{cores} cores at {threads_per_worker} threads a worker")]
    if host_gb is not None:
        fit = max(1, math.floor(host_gb * HOST_HEADROOM / worker_rss_gb))
        bounds.append((fit, f"host: {host_gb:.1f} GB available x {HOST_HEADROOM} / {worker_rss_gb:.2f} GB a worker"))
    if len(free_gb) == 1:
        fit = max(1, math.floor(free_gb[0] * GPU_HEADROOM / worker_peak_gb))
        bounds.append((fit, f"GPU 0: {free_gb[0]:.1f} GB free x {GPU_HEADROOM} / {worker_peak_gb:.2f} GB a worker"))
    elif free_gb:
        bounds.append((len(free_gb), f"{len(free_gb)} GPUs, one a worker"))
    bounds.append((max(1, experiments), f"{experiments} experiment(s) to run"))
    chosen = min(bound for bound, _ in bounds)
    return chosen, [f"{why}: {bound}" for bound, why in bounds]


def worker_memory(records: list[Path], key: str | tuple[str, ...], given: float | None, option: str, default: float, kind: str,
                  overhead: tuple[float, str] | None = None) -> tuple[float, str]:
    """A worker's memory in GB (`given` by `option`, else the records' largest `key` plus
    `overhead` (GB, what it is), else `default`) and where that figure comes from; `kind` names
    the records that count."""
    if given is not None:
        if given <= 0:
            raise InputError(f"{option} must be a number of GB > 0, got {given}")
        return given, option
    peak, counted = peak_gb(records, key)
    if peak is None:
        return default, f"no {kind} record: assumed"
    gb = peak * RECORD_UNIT_GB  # (the records' GiB, as GB: the unit of the free memory it is held against)
    source = f"the largest peak of {counted} {kind} record(s), {peak:.2f} GiB"
    if overhead is not None:
        return gb + overhead[0], f"{source}, + {overhead[0]:.2f} GB {overhead[1]}"
    return gb, source


def worker_gpu_gb(records: list[Path], given: float | None = None) -> tuple[float, str]:
    """A worker's GPU memory (`workers`, and `gpu-reserve` for RESERVE_ENV): `given` by --peak-gb,
    else the records' largest held peak plus a CUDA context, else DEFAULT_PEAK_GB; and its source."""
    return worker_memory(records, GPU_PEAK_KEYS, given, "--peak-gb", DEFAULT_PEAK_GB, "GPU stage",
                         overhead=(GPU_CONTEXT_GB, "of CUDA context"))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m storyrewrite.parallel",
                                     description="How many DVC queue workers this machine runs at once.")
    commands = parser.add_subparsers(dest="command", required=True)
    choose = commands.add_parser("workers", help="print the worker count (stdout) and why (stderr)")
    choose.add_argument("--experiments", type=int, required=True, help="experiments to run")
    choose.add_argument("--threads-per-worker", type=int, default=2, help="CPU threads each worker keeps (default 2)")
    choose.add_argument("--records", type=Path, nargs="*", default=[],
                        help="stage records (reports/stages/*.json) whose largest peak_cuda_reserved_gb (else peak_cuda_gb) "
                             "and peak_rss_gb are a worker's GPU and host memory")
    choose.add_argument("--peak-gb", type=float, help=f"a worker's GPU memory, in place of the records' (default: theirs, "
                        f"else {DEFAULT_PEAK_GB})")
    choose.add_argument("--rss-gb", type=float, help=f"a worker's host memory, in place of the records' (default: theirs, "
                        f"else {DEFAULT_RSS_GB})")
    reserve = commands.add_parser("gpu-reserve", help=f"print a worker's GPU memory in GB, as `workers` counts it "
                                  f"(for {RESERVE_ENV})")
    reserve.add_argument("--records", type=Path, nargs="*", default=[], help="stage records, as for `workers`")
    pids = commands.add_parser("queue-workers", help="print the pids of the DVC queue workers running here, a line each "
                               "(scripts/comparison.sh's reader where there is no /proc)")
    pids.add_argument("--cwd", type=Path, help="only those whose working directory is this one")
    args = parser.parse_args(argv)
    if args.command == "queue-workers":
        if found := queue_worker_pids(cwd=args.cwd):
            print(*found, sep="\n")
        return
    if args.command == "gpu-reserve":
        print(f"{worker_gpu_gb(args.records)[0]:.2f}")
        return
    if args.experiments < 0:  # (none to run: one worker, for what other sweeps left queued)
        raise InputError(f"--experiments must be a whole number >= 0, got {args.experiments}")
    if args.threads_per_worker < 1:
        raise InputError(f"--threads-per-worker must be a whole number >= 1, got {args.threads_per_worker}")
    gpu, gpu_source = worker_gpu_gb(args.records, args.peak_gb)
    rss, rss_source = worker_memory(args.records, "peak_rss_gb", args.rss_gb, "--rss-gb", DEFAULT_RSS_GB, "stage")
    free, host = gpu_free_gb(), host_available_gb()
    chosen, lines = choose_workers(cores(), args.threads_per_worker, free, gpu, args.experiments, host, rss)
    print(f"{chosen} queue worker(s), the least of:", file=sys.stderr)
    for line in lines:
        print(f"  {line}", file=sys.stderr)
    if host is not None:
        print(f"  (a worker's host memory, {rss:.2f} GB: {rss_source})", file=sys.stderr)
    if free:
        print(f"  (a worker's GPU memory, {gpu:.2f} GB: {gpu_source})", file=sys.stderr)
    print(chosen)


if __name__ == "__main__":
    try:  # (not storyrewrite.io.run_stage: io imports this module)
        main()
    except InputError as error:
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
