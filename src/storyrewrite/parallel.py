"""Sharing the machine between stages that run at the same time (`dvc queue start -j N`): each
stage process takes its share of the CPU cores and, where there are several GPUs, a GPU of its
own.

- Workers: `STORYREWRITE_WORKERS` if set, else the number of DVC queue workers running on the
  machine (`dvc exp queue-worker` processes), at least 1.
- CPU threads: the cores this process may use, divided by the workers (at least 1), for torch's
  intra-op pool. Two processes with two threads each on two cores run several times slower than
  one after the other; with one thread each they share the machine.
- GPUs: with several workers and several GPUs, each process takes the first free one, holding an
  exclusive lock on `<repo>/.dvc/tmp/storyrewrite/gpu-<index>.lock` for its whole life (the
  system releases it when the process ends, a kill included). `device: auto` and the training
  sections' `accelerator`/`devices: auto` honour it; otherwise they mean what they always meant
  (the first GPU; Lightning: every GPU). Stages of a queued experiment run in DVC's temporary
  copy of the repository, under `<repo>/.dvc/tmp/exps/`: the lock files live in the outermost
  repository, which every worker shares.

No torch import at module level: `run_stage` applies the share in every stage, torch or not.
"""
from __future__ import annotations

import fcntl
import os
import sys
from pathlib import Path

from storyrewrite.errors import InputError

WORKERS_ENV = "STORYREWRITE_WORKERS"
_held: dict[int, int] = {}  # GPU index -> the file descriptor whose lock this process holds


def queue_workers(proc: Path = Path("/proc")) -> int:
    """The DVC queue workers running on this machine (0 where /proc cannot tell)."""
    count = 0
    for cmdline in proc.glob("[0-9]*/cmdline"):
        try:
            if b"exp\0queue-worker\0" in cmdline.read_bytes():
                count += 1
        except OSError:
            continue  # a process that ended while we looked
    return count


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
    if torch is not None:
        torch.set_num_threads(threads)
    else:
        os.environ["OMP_NUM_THREADS"] = str(threads)
    return threads
