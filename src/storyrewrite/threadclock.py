"""Where the calling thread's wall time goes: running on a CPU, or ready to run and waiting for one.

With several experiments side by side, a training step can be slow because its thread waits for
a core that other processes hold. Linux counts both times per thread in
`/proc/thread-self/schedstat` (time on a CPU, time runnable in the run queue, in nanoseconds;
Documentation/scheduler/sched-stats.rst). The rest of the wall time the thread slept: blocked on
I/O, a lock, or a device that makes it wait without spinning. CUDA's default wait spins while
the process has fewer GPU contexts than the machine has cores, so a host read of the GPU counts
as time on a CPU. Python has the first of the two times only (`time.thread_time`) and no library
reads the second, hence this reader. Where the kernel gives no schedstat, the waiting time is
None and the time on a CPU comes from `time.thread_time`.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

SCHEDSTAT = Path("/proc/thread-self/schedstat")


@dataclass(frozen=True)
class ThreadTimes:
    """Seconds: `wall` (a monotonic clock), `on_cpu` (this thread ran), `cpu_wait` (it was ready
    and waited for a CPU; None where the kernel does not count it)."""
    wall: float
    on_cpu: float
    cpu_wait: float | None

    def __sub__(self, earlier: ThreadTimes) -> ThreadTimes:
        waited = None if self.cpu_wait is None or earlier.cpu_wait is None else self.cpu_wait - earlier.cpu_wait
        return ThreadTimes(self.wall - earlier.wall, self.on_cpu - earlier.on_cpu, waited)


def parse_schedstat(text: str) -> tuple[float, float]:
    """(seconds on a CPU, seconds waiting in the run queue) from a schedstat line:
    'run_ns wait_ns timeslices'."""
    run_ns, wait_ns, _ = (int(field) for field in text.split())
    return run_ns / 1e9, wait_ns / 1e9


def thread_times(schedstat: Path = SCHEDSTAT) -> ThreadTimes:
    """The calling thread's times so far (subtract two readings for an interval)."""
    wall = time.perf_counter()
    try:
        on_cpu, cpu_wait = parse_schedstat(schedstat.read_text())
    except (OSError, ValueError):  # no schedstat (not Linux, or a kernel built without it)
        return ThreadTimes(wall, time.thread_time(), None)
    return ThreadTimes(wall, on_cpu, cpu_wait)
