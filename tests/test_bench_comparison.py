"""The whole-comparison bench's account of the time between stages and of the load (bench/comparison.py)."""
import json
import os
import shutil
import sys
import time
from datetime import datetime
from itertools import pairwise
from pathlib import Path

import pytest
from helpers import ROOT

from storyrewrite.report.collect import Run

sys.path.insert(0, str(ROOT / "bench"))
import comparison  # noqa: E402  (bench/ is a folder of scripts, not a package)


def record(experiment, started_at, wall_s, startup_s=2.0, stage="train"):
    return {"stage": stage, "experiment": experiment, "started_at": started_at, "wall_s": wall_s, "startup_s": startup_s}


def test_the_time_between_stages_is_split_into_their_start_up_and_what_runs_outside_them():
    """Worked by hand: in experiment a, train ends at 00:01:40.000 and generate's process starts
    at 00:01:47.500 - 3.5 s = 00:01:44.000 (4.0 s outside the stages), generate ends at
    00:01:57.500 and score's process starts at 00:02:03.250 - 4.25 s = 00:01:59.000 (1.5 s);
    experiment b ran one stage, which has no stage before it."""
    records = [
        record("a", "2026-11-29T00:02:03.250+00:00", 20.0, 4.25, "score-finetuned"),  # out of order: sorted by start
        record("a", "2026-11-29T00:00:00.000+00:00", 100.0, 1.0),
        record("a", "2026-11-29T00:01:47.500+00:00", 10.0, 3.5, "generate-finetuned"),
        record("b", "2026-11-29T00:00:30.000+00:00", 50.0, 2.25),
        # A record without startup_s (written before it existed) counts for neither figure.
        {"stage": "train", "experiment": "c", "started_at": "2026-11-29T00:00:00+00:00", "wall_s": 5.0},
        {"stage": "train", "experiment": "c", "started_at": "2026-11-29T00:00:09+00:00", "wall_s": 5.0},
    ]
    assert comparison.between_stages(records) == {"startup_s": 1.0 + 3.5 + 4.25 + 2.25, "between_s": 4.0 + 1.5}


def test_each_experiment_ends_with_its_last_stage_and_core_within_all_ends_with_its_last_experiment():
    """Worked by hand: experiment a's stages end at 00:01:40 (train) and 00:02:23.250 (score: its
    start 00:02:03.250 plus 20 s); b, restoring a's train, ends with its own generate at 00:03:00;
    c, a CPO run, at 00:05:00; d has no record with a start. `all` began at 00:00:10: core (a, b)
    ended 170 s after it, whatever the CPO run."""
    records = {
        "a": [record("a", "2026-11-29T00:02:03.250+00:00", 20.0), record("a", "2026-11-29T00:00:00.000+00:00", 100.0)],
        "b": [record("a", "2026-11-29T00:00:00.000+00:00", 100.0), record("b", "2026-11-29T00:02:50+00:00", 10.0)],
        "c": [record("c", "2026-11-29T00:04:00+00:00", 60.0)],
        "d": [{"stage": "train", "wall_s": 5.0}],
    }
    midnight = 1795910400.0  # 2026-11-29T00:00:00+00:00
    ends = comparison.experiment_ends(records)
    assert ends == {"a": midnight + 143.25, "b": midnight + 180.0, "c": midnight + 300.0}
    assert comparison.core_in_all(ends, {"a", "b", "d"}, midnight + 10) == 170.0
    assert comparison.core_in_all(ends, {"d"}, midnight + 10) is None


def test_each_part_says_how_long_it_ran_before_its_first_stage_and_after_its_last():
    """Worked by hand: core runs 00:00:00 to 00:05:00. Its first stage's process started at
    00:00:40 - 5 s (35 s in), its last stage ended at 00:04:20 + 10 s (30 s before the end). cpo
    runs 00:05:00 to 00:08:00: a record restored from core's run (started 00:00:40) is no stage
    of it; its one stage starts at 00:06:00 - 2 s (58 s in) and ends at 00:07:00 (60 s before its
    end). A part with no stage started in it is left out."""
    midnight = 1795910400.0  # 2026-11-29T00:00:00+00:00
    records = [record("a", "2026-11-29T00:00:40+00:00", 30.0, 5.0, "train_nll"),
               record("a", "2026-11-29T00:04:20+00:00", 10.0, 3.0, "score-finetuned"),
               record("b", "2026-11-29T00:02:00+00:00", 100.0, 2.0),
               record("c", "2026-11-29T00:06:00+00:00", 60.0, 2.0),
               {"stage": "report", "experiment": "a", "wall_s": 1.0}]  # (no start: not placed)
    spans = {"core": (midnight, midnight + 300), "cpo": (midnight + 300, midnight + 480),
             "seeds": (midnight + 480, midnight + 500)}
    assert comparison.part_edges(records, spans) == {
        "core": {"to_first_stage_s": 35.0, "after_last_stage_s": 30.0},
        "cpo": {"to_first_stage_s": 58.0, "after_last_stage_s": 60.0}}
    assert comparison.part_edges(records, {}) == {}


def test_a_parts_steps_are_kept_with_when_they_came_and_its_output_passed_on(tmp_path, capsys):
    """A stand-in script prints two steps 0.6 s apart, a line that is no step, and a last step
    without a newline, then leaves a child behind that holds its output open: the part ends with
    the script, its lines are passed on, and each step is kept with when it came."""
    script = tmp_path / "part.sh"
    long = "queued: " + " ".join(f"-S key{i}=value" for i in range(20))
    script.write_text(f'echo "== planned (12:00:00)"; sleep 0.6; echo "a line of a table"; echo "== {long}"\n'
                      '(sleep 30 &) ; printf "== collected"; exit 3\n')
    steps = []
    started = time.perf_counter()
    assert comparison.run_part(["bash", str(script)], tmp_path, dict(os.environ), steps, interval=0.05) == 3
    assert time.perf_counter() - started < 10  # (not held by the child until it ends)
    cut = long[:comparison.STEP_CHARS - 1] + "…"
    assert [step["step"] for step in steps] == ["planned (12:00:00)", cut, "collected"] and len(cut) == comparison.STEP_CHARS
    at = [step["at_s"] for step in steps]
    assert 0 <= at[0] < 0.5 and 0.5 <= at[1] - at[0] and at[1] <= at[2]
    assert capsys.readouterr().out.splitlines() == ["== planned (12:00:00)", "a line of a table", f"== {long}", "== collected"]


def test_what_torch_compile_did_is_summed_by_stage_and_objective_with_the_first_reason_for_a_skip():
    records = [
        {**record("a", None, 1.0), "objective": "rloo", "compiled_graphs": 3, "graph_breaks": 0, "cudagraph_skips": 1,
         "cudagraph_skip_reason": "skipping cudagraphs due to mutated inputs"},
        {**record("b", None, 1.0), "objective": "rloo", "compiled_graphs": 2, "graph_breaks": 1, "cudagraph_skips": 0},
        {**record("c", None, 1.0, stage="generate-finetuned"), "compiled_graphs": 1, "graph_breaks": 0, "cudagraph_skips": 0},
        {**record("d", None, 1.0), "objective": "score"},  # compiled nothing
        {**record("e", None, 1.0), "objective": "rloo", "compiled_graphs": 1, "graph_breaks": 0, "cudagraph_skips": 1,
         "cudagraph_skip_reason": "skipping cudagraphs due to cpu device"},  # a later reason: the first is kept
    ]
    assert comparison.compiled(records) == {
        "generate-finetuned": {"runs": 1, "compiled_graphs": 1, "graph_breaks": 0, "cudagraph_skips": 0},
        "train (rloo)": {"runs": 3, "compiled_graphs": 6, "graph_breaks": 1, "cudagraph_skips": 2,
                         "cudagraph_skip_reason": "skipping cudagraphs due to mutated inputs"}}


def test_the_load_holds_the_hosts_cpus_beside_the_gpus_nvidia_smi(tmp_path, monkeypatch):
    """With nvidia-smi on the PATH (here a script that answers as it does), the GPU's busy share
    and peak memory come beside the host CPUs' busy share; without it, the CPUs' alone."""
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir()
    smi.write_text("#!/bin/sh\necho '37, 2048'\n")
    smi.chmod(0o755)
    for path, gpu in ((f"{smi.parent}{os.pathsep}{os.environ['PATH']}", True), (str(tmp_path / "none"), False)):
        monkeypatch.setenv("PATH", path)
        monkeypatch.setattr(comparison, "TIMELINE_EVERY", 2)
        timeline = tmp_path / "out" / f"timeline-{gpu}.csv"
        with comparison.Sampler(interval=0.05, timeline=timeline) as sampler:
            end = time.perf_counter() + 0.5
            while time.perf_counter() < end:  # a busy host
                pass
            # A sample that runs nvidia-smi waits for the GIL the busy loop holds: the half second
            # may end with fewer than three, so the run goes on until it has them.
            while (not timeline.exists() or len(sampler.samples) < 3) and time.perf_counter() < end + 5:
                time.sleep(0.01)
            assert timeline.exists()  # written while the run goes on, not only at its end
        figures = sampler.figures()
        assert figures["samples"] >= 3 and 0 < figures["cpu_busy_pct_mean"] <= 100
        if gpu:
            assert figures["gpu_busy_pct_mean"] == 37.0 and figures["gpu_memory_gb_peak"] == round(2048 * 2**20 / 1e9, 2)
            assert figures["gpu_idle_s"] == 0 and figures["gpu_idle_windows"] == []
            header, *rows = timeline.read_text().splitlines()  # the whole run's, at its end
            assert header == "utc,seconds,cpu_busy_pct,gpu_busy_pct,gpu_memory_gb" and len(rows) == figures["samples"]
            seconds = [float(row.split(",")[1]) for row in rows]
            assert seconds == sorted(seconds) and 0 < seconds[0] < seconds[-1] < 5
            utc = [datetime.fromisoformat(row.split(",")[0]).timestamp() for row in rows]
            assert [round(b - a, 2) for a, b in pairwise(utc)] == [round(b - a, 2) for a, b in pairwise(seconds)]
            assert abs(utc[-1] - time.time()) < 5
            assert {row.split(",", 3)[3] for row in rows} == {f"37.00,{2048 * 2**20 / 1e9:.2f}"}
        else:
            assert not {"gpu_busy_pct_mean", "gpu_memory_gb_peak", "gpu_idle_s"} & figures.keys()


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_the_cpus_busy_share_while_a_process_spins_on_each_core_is_at_least_the_spinners_own_cpu_time():
    """A process spinning on each of the host's cores for 1.2 s: the samples taken inside that time
    read the CPUs at least as busy as the spinners' own CPU time says (its share of every core's
    time, less 20 % for their start and the sampler's reads), all of it where nothing caps this
    process's cores, less where a container's quota does."""
    import multiprocessing

    cores, seconds = os.cpu_count(), 1.2
    spinners = [multiprocessing.get_context("fork").Process(target=_spin, args=(seconds,)) for _ in range(cores)]
    with comparison.Sampler(interval=0.1) as sampler:
        time.sleep(0.15)
        before, started = os.times(), time.perf_counter() - sampler._started
        for spinner in spinners:
            spinner.start()
        for spinner in spinners:
            spinner.join()
        after = os.times()
    spun = after.children_user + after.children_system - before.children_user - before.children_system
    share = 100 * spun / (seconds * cores)  # (the spinners' alone: other work only adds to the host's)
    inside = [cpu for at, cpu, *_ in sampler.samples if started + 0.2 <= at <= started + seconds - 0.1]
    assert share >= 50 / cores  # (at least half a core spun: the comparison means something)
    assert len(inside) >= 5 and sum(inside) / len(inside) >= 0.8 * share, (share, sampler.samples)


def test_an_idle_gpu_is_named_where_it_waited_ten_seconds_or_more():
    """Stretches of samples below 5 % lasting 10 s or more, each from the start of the period its
    first sample speaks for; shorter dips, and samples without a reading, are not idle windows."""
    busy = [(t / 2, 90.0) for t in range(1, 21)]  # 0.5 .. 10 s
    idle = [(t / 2, 0.0) for t in range(21, 45)]  # 10.5 .. 22 s: from 10 s, 12 s long
    dip = [(22.5, 50.0), (23.0, 1.0), (23.5, 2.0), (24.0, 80.0)]
    unread = [(24.5 + t / 2, None) for t in range(30)]  # nvidia-smi gave nothing: not idle
    tail = [(40.0 + t / 2, 3.0) for t in range(1, 22)]  # 40.5 .. 50.5: from 40 s, 10.5 s long, the run's end
    assert comparison.idle_windows(busy + idle + dip + unread + tail, 0.5) == [
        {"from_s": 10.0, "s": 12.0}, {"from_s": 40.0, "s": 10.5}]
    assert comparison.idle_windows([(t / 2, 0.0) for t in range(1, 20)], 0.5) == []  # 9.5 s
    assert comparison.idle_windows([(t / 2, 0.0) for t in range(1, 21)], 0.5) == [{"from_s": 0.0, "s": 10.0}]  # 10 s: one
    at_five = [(t / 2, 0.0) for t in range(1, 11)] + [(5.5, 5.0)] + [(t / 2, 4.9) for t in range(12, 32)]
    assert comparison.idle_windows(at_five, 0.5) == [{"from_s": 5.5, "s": 10.0}]  # 5 % is not idle, 4.9 % is


def test_the_load_is_the_mean_of_its_samples_with_the_peak_memory_and_the_longest_idle_windows_in_time_order():
    """Worked by hand on samples 0.5 s apart (seconds, CPU %, GPU %, GPU GB): the means of the
    samples that have a reading, the largest memory, and of seven idle windows the five longest,
    in the order they came."""
    samples, windows = [], []
    for idle_s in (11, 16, 10, 14, 12, 10.5, 13):  # each after 3 s of work
        samples += [(len(samples) / 2 + 0.5 * k, 60.0, 80.0, 4.0) for k in range(1, 7)]
        windows.append((samples[-1][0], idle_s))
        samples += [(len(samples) / 2 + 0.5 * k, 20.0, 0.0, 2.0) for k in range(1, int(2 * idle_s) + 1)]
    samples[5] = (samples[5][0], None, 80.0, 9.5)  # a CPU sample that read nothing, at the peak of memory
    sampler = comparison.Sampler(interval=0.5)
    sampler.samples = samples
    longest = sorted(sorted(windows, key=lambda w: -w[1])[:5])  # 16, 14, 13, 12, 11 s, by their start
    cpu = [s[1] for s in samples if s[1] is not None]
    figures = sampler.figures()
    assert figures == {"samples": len(samples), "cpu_busy_pct_mean": round(sum(cpu) / len(cpu), 1),
                       "gpu_busy_pct_mean": round(sum(s[2] for s in samples) / len(samples), 1), "gpu_memory_gb_peak": 9.5,
                       "gpu_idle_s": 11 + 16 + 10 + 14 + 12 + 10.5 + 13,
                       "gpu_idle_windows": [{"from_s": start, "s": seconds} for start, seconds in longest]}
    assert [w["s"] for w in figures["gpu_idle_windows"]] == [11, 16, 14, 12, 13]


class _Run:
    """A gathered run's files, as storyrewrite.report.collect.Run serves them; its curves by Run's own code."""

    def __init__(self, name, files):
        self.name, self.files, self.root = name, files, Path("runs/test")

    curves = Run.curves

    def has(self, path):
        return path in self.files

    def text(self, path):
        return self.files[path]


def test_each_fine_tuning_says_where_its_steps_time_went():
    """The means over the steps of each wall-time curve the run holds; a run without any (its
    training logged none) is left out."""
    curves = "reports/train/finetuned/plots/metrics/"
    rloo = _Run("rloo-a", {curves + "sample_time_share.tsv": "step\tsample_time_share\n1\t0.8\n2\t0.7\n3\t0.75\n",
                           curves + "cpu_wait_time_share.tsv": "step\tcpu_wait_time_share\n1\t0.1\n2\t0.3\n",
                           curves + "train_loss.tsv": "step\ttrain_loss\n1\t2.0\n"})
    older = _Run("older", {curves + "train_loss.tsv": "step\ttrain_loss\n1\t2.0\n"})
    assert comparison.step_time([rloo, older]) == {"rloo-a": {"cpu_wait_time_share": 0.2, "sample_time_share": 0.75}}


def test_the_scoring_stages_time_is_summed_by_part_over_the_stages_that_ran():
    records = [
        {**record("a", None, 30.0, stage="score-finetuned"), "seconds": {"load_models": 2.0, "bartscore": 10.5, "rouge_l": 1.5}},
        {**record("b", None, 40.0, stage="validity"), "seconds": {"load_models": 3.0, "bartscore": 20.0, "cf_pmi": 12.0}},
        record("c", None, 9.0),  # a stage without the breakdown
    ]
    assert comparison.scoring_seconds(records) == {"bartscore": 30.5, "cf_pmi": 12.0, "load_models": 5.0, "rouge_l": 1.5}
    assert list(comparison.scoring_seconds(records)) == ["bartscore", "cf_pmi", "load_models", "rouge_l"]


def test_the_time_each_training_spent_validating_is_kept_beside_its_training_time():
    records = {"rloo-a": [{**record("a", None, 130.0, stage="train"), "train_s": 120.0, "validate_s": 55.5},
                          {**record("b", None, 90.0, stage="train_nll"), "train_s": 80.0, "validate_s": 20.0},
                          record("c", None, 9.0, stage="generate-finetuned")],
               "older": [{**record("d", None, 130.0, stage="train"), "train_s": 120.0}]}  # a record from before validate_s
    assert comparison.validating_seconds(records) == {"rloo-a": {"train": {"train_s": 120.0, "validate_s": 55.5},
                                                                 "train_nll": {"train_s": 80.0, "validate_s": 20.0}}}


def test_a_resumed_comparison_names_the_runs_gathered_before(tmp_path):
    """The runs of runs/NAME and runs/NAME.<n> at the start (here the four that one H200 ran,
    committed in runs/gpu.2), one per params; a folder of records only (runs/gpu.1), an empty one
    and another comparison's whose name starts the same count for nothing."""
    runs = tmp_path / "runs"
    shutil.copytree(ROOT / "runs" / "gpu.2", runs / "gpu.2")
    shutil.copytree(ROOT / "runs" / "gpu.1", runs / "gpu.1")
    shutil.copytree(ROOT / "runs" / "gpu.2", runs / "gpux")
    (runs / "gpu").mkdir()
    names = sorted(json.loads(path.read_text())["name"] for path in (ROOT / "runs" / "gpu.2").glob("*.json"))
    assert len(names) == 4
    assert comparison.gathered_before(tmp_path, "gpu") == names
    assert comparison.gathered_before(tmp_path, "smoke") == []


def test_a_record_is_held_to_the_targets_of_the_parts_it_ran_and_a_resumed_one_to_none():
    core, all_ = comparison.TARGETS_S["core"], comparison.TARGETS_S["all"]
    both = {"all": 700.0, "core_in_all": 300.0}
    assert comparison.targets_for(both, gpu=True, resumed=False) == {"wall_s.core_in_all": {"max": core},
                                                                     "wall_s.total": {"max": all_}}
    assert comparison.targets_for({"core": 1.0, "cpo": 2.0}, gpu=True, resumed=False) == {
        "wall_s.core": {"max": core}, "wall_s.total": {"max": all_}}
    assert comparison.targets_for({"cpo": 2.0}, gpu=True, resumed=False) == {}
    assert comparison.targets_for(both, gpu=True, resumed=True) == {}
    assert comparison.targets_for(both, gpu=False, resumed=False) == {}
    # An interim record: only a target its time so far already misses.
    interim = lambda parts, elapsed, part, resumed=False: comparison.targets_for(  # noqa: E731
        parts, gpu=True, resumed=resumed, elapsed=elapsed, part_now=part)
    assert interim({}, all_ - 1.0, ("all", 0.0)) == {}
    assert interim({}, all_ + 1.0, ("all", 0.0)) == {"elapsed_s": {"max": all_}}
    assert interim({}, core + 1.0, ("core", 0.0)) == {"elapsed_s": {"max": core}}
    assert interim({"core": 300.0}, core + 1.0, ("cpo", 300.0)) == {}
    assert interim({"core": 300.0}, all_ + 1.0, ("cpo", 300.0)) == {"elapsed_s": {"max": all_}}
    assert interim({}, all_ + 1.0, ("cpo", 0.0)) == {}  # the CPO grid alone has no target
    assert interim({}, all_ + 1.0, ("all", 0.0), resumed=True) == {}


def test_interim_records_are_written_while_the_block_runs_and_a_failed_one_is_reported(capsys):
    calls = []

    def write():
        calls.append(time.perf_counter())
        if len(calls) == 1:
            raise ValueError("a manifest read while it was written")

    with comparison.Interim(0.05, write) as interim:
        while len(calls) < 3:
            time.sleep(0.01)
    count = len(calls)
    time.sleep(0.2)
    assert len(calls) == count and interim.written == count - 1  # none after the block
    assert "warning: interim record not written: ValueError: a manifest read while it was written" in capsys.readouterr().err
    with comparison.Interim(0, write):
        time.sleep(0.1)
    assert len(calls) == count


def test_the_bench_writes_interim_records_then_the_whole_runs_which_a_resumed_run_holds_to_no_target(tmp_path, monkeypatch):
    """main() in a workspace whose scripts/comparison.sh (a stand-in) takes a second: records with
    complete false while it runs, then the whole run's, held to core's target on a GPU; with the
    runs of runs/gpu.2 gathered before, named and held to none; with --max-runs (comparison.sh's
    -n), held to none either."""
    written = []
    monkeypatch.setattr(comparison, "write_result", lambda name, device, figures, settings, targets, quiet=False:
                        written.append((name, figures, settings, targets, quiet)))
    monkeypatch.setattr(comparison.torch.cuda, "is_available", lambda: True)
    for case in ("whole", "resumed", "limited"):
        resumed, limited = case == "resumed", case == "limited"
        repo = tmp_path / f"repo-{case}"
        (repo / "scripts").mkdir(parents=True)
        (repo / "scripts" / "comparison.sh").write_text("echo \"$*\" > args.txt; echo '== planned'; sleep 1; echo '== collected'\n")
        if resumed:
            shutil.copytree(ROOT / "runs" / "gpu.2", repo / "runs" / "gpu.2")
        monkeypatch.setattr(comparison, "workspace", lambda into, repo=repo: repo)
        monkeypatch.setattr(sys, "argv", ["comparison.py", "--name", "gpu", "--parts", "core", "--interim-every", "0.2",
                                          *(["--max-runs", "2"] if limited else [])])
        written.clear()
        comparison.main()
        *interim, (name, figures, settings, targets, quiet) = written
        assert name == "comparison" and not quiet and figures["complete"] is True and 1 <= figures["wall_s"]["core"] < 5
        assert [step["step"] for step in figures["steps_s"]["core"]] == ["planned", "collected"]
        assert interim and all(record[1]["complete"] is False and record[4] for record in interim)
        # Each names the part running when it was written; one written after the part ended (before
        # the whole run's record, on a slow machine) names none, and has the part's wall time.
        named = [record[1].get("part_running", {}).get("part") for record in interim]
        assert named[0] == "core" and set(named) <= {"core", None} and named == sorted(named, key=lambda part: part is None)
        assert all("core" in record[1]["wall_s"] for record in interim if "part_running" not in record[1])
        assert all(record[3] == {} for record in interim)  # less than core's target so far
        before = sorted(json.loads(path.read_text())["name"] for path in (ROOT / "runs" / "gpu.2").glob("*.json"))
        assert settings.get("gathered_before") == (before if resumed else None)
        assert (repo / "args.txt").read_text() == f"-j auto {'-n 2 ' if limited else ''}gpu core\n"
        assert settings.get("max_runs") == (2 if limited else None)
        assert targets == ({} if resumed or limited else {"wall_s.core": {"max": comparison.TARGETS_S["core"]}})


def test_with_mps_the_bench_asks_the_comparison_for_it_and_records_part_by_part_whether_it_ran(tmp_path, monkeypatch):
    """--mps: each part runs with COMPARISON_MPS=1, and the record says what its comparison.sh wrote
    of MPS (on, or off and why), or `not started` where it wrote nothing (one worker, nothing queued)."""
    written = []
    monkeypatch.setattr(comparison, "write_result", lambda name, device, figures, settings, targets, quiet=False:
                        written.append(settings))
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    # A stand-in: core's says MPS was on; cpo's (a part after one that ran the shared stages) writes nothing.
    (repo / "scripts" / "comparison.sh").write_text(
        'echo "$COMPARISON_MPS" >> asked.log\n[ "$4" != core ] || [ -z "$COMPARISON_MPS_STATE" ] || echo "on, for this comparison\'s workers (/tmp/x)" > "$COMPARISON_MPS_STATE"\n')
    monkeypatch.setattr(comparison, "workspace", lambda into: repo)
    monkeypatch.setattr(sys, "argv", ["comparison.py", "--name", "gpu", "--jobs", "2", "--parts", "core", "cpo", "--mps",
                                      "--interim-every", "0"])
    comparison.main()
    assert (repo / "asked.log").read_text() == "1\n1\n"
    assert written[-1]["mps"] == {"core": "on, for this comparison's workers (/tmp/x)", "cpo": "not started"}
    # Without --mps: not asked, and no such setting.
    (repo / "asked.log").unlink()
    monkeypatch.setattr(sys, "argv", ["comparison.py", "--name", "gpu", "--parts", "core", "--interim-every", "0"])
    comparison.main()
    assert (repo / "asked.log").read_text() == "\n" and "mps" not in written[-1]


def test_an_interim_record_says_whether_mps_runs_in_the_part_under_way(tmp_path, monkeypatch):
    """With --parts all (one part, as offline/job.sh runs it), the record written while it runs
    already says what comparison.sh wrote of MPS as it started it."""
    written = []
    monkeypatch.setattr(comparison, "write_result", lambda name, device, figures, settings, targets, quiet=False:
                        written.append((figures["complete"], json.loads(json.dumps(settings)))))
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    (repo / "scripts" / "comparison.sh").write_text('echo "off: MPS not started: no daemon" > "$COMPARISON_MPS_STATE"\nsleep 1\n')
    monkeypatch.setattr(comparison, "workspace", lambda into: repo)
    monkeypatch.setattr(sys, "argv", ["comparison.py", "--name", "gpu", "--jobs", "8", "--parts", "all", "--mps",
                                      "--interim-every", "0.2"])
    comparison.main()
    interim = [settings["mps"] for complete, settings in written if not complete]
    assert {"all": "off: MPS not started: no daemon"} in interim
    assert written[-1] == (True, {**written[-1][1], "mps": {"all": "off: MPS not started: no daemon"}})


def test_the_stage_walls_count_each_stage_once_however_many_runs_restored_it_and_core_leaves_cpo_out(tmp_path):
    """The runs of two machines (runs/gpu.2: NLL continued and DTO; runs/gpu.3: the CPO grid),
    gathered as one comparison: each run restored its machine's shared stages (NLL, the LLM modes,
    the copy baselines), whose time counts once per machine, and ran its own; core is every run
    but CPO's."""
    runs = tmp_path / "runs" / "gpu"
    for folder in ("gpu.2", "gpu.3"):
        shutil.copytree(ROOT / "runs" / folder, runs, dirs_exist_ok=True)
    loaded = comparison.gathered_runs([runs], tmp_path)
    figures, ends, core = comparison.stage_walls(tmp_path, "gpu")
    assert core == {run.name for run in loaded if run.params["objective"] != "cpo"} and len(core) == 4
    assert len(loaded) == 16 and figures["experiment_wall_s"] == {
        run.name: round(sum(r["wall_s"] for r in run.records), 1) for run in loaded}
    for stage in ("train_nll", "generate-nll", "llm-rag"):  # shared: one run per machine
        machines = {(r["started_at"], r["wall_s"]) for run in loaded for r in run.records if r["stage"] == stage}
        assert len(machines) == 2 and figures["stage_wall_s"][stage] == round(sum(wall for _, wall in machines), 1)
    own = [r["wall_s"] for run in loaded for r in run.records if r["stage"] == "train"]  # each run's own
    assert len(own) == 16 and figures["stage_wall_s"]["train"] == round(sum(own), 1)
    assert set(ends) == {run.name for run in loaded}


def test_a_part_after_one_that_failed_runs_the_shared_stages_again(tmp_path, monkeypatch):
    """COMPARISON_SHARED=0 (restore the shared stages from the run cache) only after a part that
    succeeded: where core failed, its shared stages may not be in the run cache, and cpo runs
    them; the part after cpo restores them."""
    monkeypatch.setattr(comparison, "write_result", lambda *args, **kwargs: None)
    monkeypatch.delenv("COMPARISON_SHARED", raising=False)
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    (repo / "scripts" / "comparison.sh").write_text(
        'echo "$4 ${COMPARISON_SHARED:-unset}" >> parts.log\n[ "$4" != "$FAIL" ]\n')
    monkeypatch.setattr(comparison, "workspace", lambda into: repo)
    for fail, expected in (("core", "core unset\ncpo unset\nseeds 0\n"), ("none", "core unset\ncpo 0\nseeds 0\n")):
        monkeypatch.setenv("FAIL", fail)
        monkeypatch.setattr(sys, "argv", ["comparison.py", "--parts", "core", "cpo", "seeds", "--interim-every", "0"])
        (repo / "parts.log").unlink(missing_ok=True)
        if fail == "core":
            with pytest.raises(SystemExit, match="part.s. failed: core"):
                comparison.main()
        else:
            comparison.main()
        assert (repo / "parts.log").read_text() == expected


def test_with_parts_all_the_record_holds_when_core_ended_within_it(tmp_path, monkeypatch):
    """--parts all: `core_in_all` is from the part's start to the end of its last core
    experiment (a CPO run that ends later is not core's), held to core's target on a GPU."""
    written = []
    monkeypatch.setattr(comparison, "write_result", lambda name, device, figures, settings, targets, quiet=False:
                        written.append((figures, targets)))
    monkeypatch.setattr(comparison.torch.cuda, "is_available", lambda: True)
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    (repo / "scripts" / "comparison.sh").write_text("sleep 1\n")
    monkeypatch.setattr(comparison, "workspace", lambda into: repo)
    walls = {"stage_wall_s": {}, "experiment_wall_s": {}, "between_stages": {"startup_s": 0.0, "between_s": 0.0},
             "compiled": {}, "step_time": {}, "scoring_s": {}, "validating_s": {}, "part_edges_s": {}}
    # When the stage records are read (the part has ended): a core run ended 0.5 s before, a CPO run 100 s later.
    monkeypatch.setattr(comparison, "stage_walls", lambda repo, name, spans=None: (
        walls, {"dto": time.time() - 0.5, "cpo-run": time.time() + 100}, {"dto"}))
    monkeypatch.setattr(sys, "argv", ["comparison.py", "--parts", "all", "--interim-every", "0"])
    comparison.main()
    figures, targets = written[-1]
    within, whole = figures["wall_s"]["core_in_all"], figures["wall_s"]["all"]
    assert 0 < within < whole and abs(within - (whole - 0.5)) < 0.3
    assert targets == {"wall_s.core_in_all": {"max": comparison.TARGETS_S["core"]},
                       "wall_s.total": {"max": comparison.TARGETS_S["all"]}}
