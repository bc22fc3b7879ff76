"""The thread's time on a CPU and waiting for one, checked against Python's own clock and against
two busy processes made to share one core."""
import multiprocessing
import os
import time

import pytest

from storyrewrite.threadclock import SCHEDSTAT, ThreadTimes, parse_schedstat, thread_times

needs_schedstat = pytest.mark.skipif(not SCHEDSTAT.exists() or not hasattr(os, "sched_setaffinity"),
                                     reason="the kernel gives no per-thread schedstat")


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_schedstat_is_read_as_seconds_and_intervals_subtract():
    assert parse_schedstat("1500000000 250000000 42\n") == (1.5, 0.25)
    later, earlier = ThreadTimes(10.0, 3.0, 1.0), ThreadTimes(4.0, 2.5, 0.5)
    assert later - earlier == ThreadTimes(6.0, 0.5, 0.5)
    assert later - ThreadTimes(4.0, 2.5, None) == ThreadTimes(6.0, 0.5, None)


def test_without_schedstat_the_time_on_a_cpu_is_pythons_and_the_wait_unknown(tmp_path):
    """Checked against time.thread_time read around the interval, not against the wall time: on a
    loaded machine a busy thread runs a share of it only."""
    python_start = time.thread_time()
    start = thread_times(tmp_path / "missing")
    _spin(0.2)
    spent = thread_times(tmp_path / "missing") - start
    python_spent = time.thread_time() - python_start
    assert spent.cpu_wait is None
    assert 0.01 < spent.on_cpu <= python_spent < spent.on_cpu + 0.005
    assert spent.on_cpu <= spent.wall + 0.005  # (the thread clock counts in ticks)


@needs_schedstat
def test_the_time_on_a_cpu_is_the_threads_own_as_python_counts_it():
    """A busy loop then a sleep: the kernel's count of the thread's time on a CPU is
    time.thread_time's, and the sleep adds wall time only."""
    start, python_start = thread_times(), time.thread_time()
    _spin(0.3)
    time.sleep(0.2)
    spent, python_spent = thread_times() - start, time.thread_time() - python_start
    assert spent.on_cpu == pytest.approx(python_spent, rel=0.02, abs=0.005)
    assert spent.on_cpu + spent.cpu_wait <= spent.wall - 0.18  # the sleep: neither on a CPU nor waiting for one


@needs_schedstat
def test_a_thread_sharing_its_core_with_a_busy_process_waits_for_it():
    """Pinned to one core beside a process that spins there, a busy thread runs about half the
    time and waits for the core the other half: it never sleeps, so the two add up to its wall time."""
    core = sorted(os.sched_getaffinity(0))[0]
    saved = os.sched_getaffinity(0)
    rival = multiprocessing.get_context("fork").Process(target=_pinned_spin, args=(core, 3.0), daemon=True)
    os.sched_setaffinity(0, {core})
    try:
        rival.start()
        time.sleep(0.2)  # the rival is spinning
        start = thread_times()
        _spin(1.0)
        spent = thread_times() - start
    finally:
        os.sched_setaffinity(0, saved)
        rival.terminate()
        rival.join()
    assert spent.on_cpu + spent.cpu_wait == pytest.approx(spent.wall, rel=0.05)
    assert 0.25 < spent.cpu_wait / spent.wall < 0.85, spent  # a fair share is 0.5; other processes may take more


def _pinned_spin(core: int, seconds: float) -> None:
    os.sched_setaffinity(0, {core})
    _spin(seconds)
