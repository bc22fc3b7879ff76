"""The bench scripts' shared inputs (bench/common.py): what they build is built once."""
import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import ROOT, bench_profile, bench_records, tiny_bench
from storyrewrite.io import InputError, read_jsonl

sys.path.insert(0, str(ROOT / "bench"))
import common  # noqa: E402  (bench/ is a folder of scripts, not a package)


def test_a_cached_input_is_built_once_per_setting_and_never_taken_half_built(tmp_path, monkeypatch):
    monkeypatch.setattr(common, "CACHE", tmp_path)
    code = common.prepare_module.__file__
    built = []

    def build(out):
        built.append(out)
        (out / "table.txt").write_text("rows")

    first = common.cached("data", {"max_train": 60}, code, build)
    assert common.cached("data", {"max_train": 60}, code, build) == first and len(built) == 1
    assert (first / "table.txt").read_text() == "rows"
    other = common.cached("data", {"max_train": None}, code, build)
    assert other != first and len(built) == 2

    def fails(out):
        (out / "half.txt").write_text("half")
        raise RuntimeError("killed")

    with pytest.raises(RuntimeError):
        common.cached("data", {"max_train": 1}, code, fails)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([first.name, other.name])  # no staging left
    assert common.cached("data", {"max_train": 1}, code, build).joinpath("table.txt").exists() and len(built) == 3


def test_a_cpu_record_is_kept_per_cpu_features_and_replaces_one_whose_features_are_unknown(tmp_path, monkeypatch):
    """Two machines of one CPU name with other vector units keep a record each; a run replaces
    its own features' record and the record of its CPU name written before features were
    recorded; a record keyed by name but holding its features is filed under them."""
    from storyrewrite.io import read_json, write_json_atomic
    from storyrewrite.records import describe_device

    monkeypatch.setattr(common, "ROOT", tmp_path)
    (tmp_path / "reports" / "bench").mkdir(parents=True)
    name = describe_device("cpu")["device_name"]
    cpu = {"device": "cpu", "device_name": name}
    write_json_atomic(tmp_path / "reports" / "bench" / "x.json", {
        f"cpu: {name}": {**cpu, "figures": {"s": 1}},  # features unknown
        "cpu: Other CPU (2 cores)": {"device": "cpu", "device_name": "Other CPU (2 cores)", "cpu_capability": "AVX2",
                                     "cpu_bf16": False, "figures": {"s": 2}},
        "NVIDIA X100": {"device": "cuda:0", "device_name": "NVIDIA X100", "figures": {"s": 3}}})
    monkeypatch.setattr(common, "cpu_facts", lambda: {"cpu_capability": "AVX512", "cpu_bf16": True})
    common.write_result("x", common.torch.device("cpu"), {"s": 4}, {})
    runs = read_json(tmp_path / "reports" / "bench" / "x.json")
    record = runs[f"cpu: {name}, AVX512, bf16 instructions"]  # the script that ran, and as it was called
    script = f"bench/{Path(sys.argv[0]).name}"
    assert (record["script"], record["command"]) == (script, " ".join(["python", script, *sys.argv[1:]]))
    assert record["torch_threads"] == common.torch.get_num_threads() and record["targets"] == {}
    assert {key: run["figures"]["s"] for key, run in runs.items()} == {
        "cpu: Other CPU (2 cores), AVX2, no bf16 instructions": 2, "NVIDIA X100": 3,
        f"cpu: {name}, AVX512, bf16 instructions": 4}
    monkeypatch.setattr(common, "cpu_facts", lambda: {"cpu_capability": "AVX2", "cpu_bf16": False})
    common.write_result("x", common.torch.device("cpu"), {"s": 5}, {})
    common.write_result("x", common.torch.device("cpu"), {"s": 6}, {})
    runs = read_json(tmp_path / "reports" / "bench" / "x.json")
    assert runs[f"cpu: {name}, AVX2, no bf16 instructions"]["figures"] == {"s": 6}
    assert runs[f"cpu: {name}, AVX512, bf16 instructions"]["figures"] == {"s": 4} and len(runs) == 4


def test_a_cached_input_is_built_anew_when_the_code_that_builds_it_changes(tmp_path, monkeypatch):
    monkeypatch.setattr(common, "CACHE", tmp_path)
    version = ["a"]
    monkeypatch.setattr(common.closure, "digest", lambda files: version[0])
    built = []
    first = common.cached("data", {"max_train": 60}, common.prepare_module.__file__, built.append)
    version[0] = "b"
    assert common.cached("data", {"max_train": 60}, common.prepare_module.__file__, built.append) != first and len(built) == 2


def test_a_bench_takes_the_pipelines_models_and_data_only_where_its_params_made_them(tmp_path, monkeypatch):
    """bench/common.inputs and evaluators_dir take `dvc repro`'s outputs where the stage that made
    them had the bench's params (models: the models and the seed; data: the data, download and
    seed settings), else what .cache/bench/ builds for those params."""
    import shutil

    shutil.copy(ROOT / "params.yaml", tmp_path / "params.yaml")
    for made in ("models/pretrained/index.json", "models/evaluators/index.json", "data/prepared/timetravel/train.jsonl"):
        (tmp_path / made).parent.mkdir(parents=True)
        (tmp_path / made).write_text("{}")
    built = []
    monkeypatch.setattr(common, "ROOT", tmp_path)
    monkeypatch.setattr(common, "cached", lambda kind, key, code, build: built.append((kind, key[-1])) or tmp_path / kind)

    def taken(*sets: str) -> tuple:
        built.clear()
        params, pretrained, prepared = common.inputs(sets=list(sets))
        where = (pretrained, prepared, common.evaluators_dir(params))
        return tuple(str(path.relative_to(tmp_path)) for path in where), built

    assert taken() == (("models/pretrained", "data/prepared", "models/evaluators"), [])
    assert taken("seed=7") == (("models", "data/prepared", "evaluators"), [("models", 7), ("data", 7), ("evaluators", 7)])
    assert taken("data.max_train=30") == (("models/pretrained", "data/prepared", "models/evaluators"), [("data", 0)])
    assert taken("models.generator=tiny:llama", "models.scorer=tiny:llama") == (
        ("models", "data/prepared", "evaluators"), [("models", 0), ("evaluators", 0)])
    (tmp_path / "models" / "pretrained" / "index.json").unlink()  # `dvc repro` not run (or not to its end)
    assert taken() == (("models", "data/prepared", "models/evaluators"), [("models", 0)])


def test_a_bench_runs_this_interpreters_dvc_and_a_failed_command_ends_it_with_its_name(tmp_path, monkeypatch):
    """bench/common.dvc: DVC of this interpreter, in the repository, with its code first
    (workspace_env: this interpreter's folder first on PATH too); a command that fails ends the
    bench naming it, with the end of its output; clone_with_cache's clone uses this repository's
    DVC cache."""
    from pathlib import Path

    env = common.workspace_env(tmp_path)
    assert env["PATH"].split(os.pathsep)[0] == str(Path(sys.executable).parent)
    subprocess.run(["git", "init", "-q", str(tmp_path / "repo")], check=True)
    common.dvc(tmp_path / "repo", "init", "-q")
    assert (tmp_path / "repo" / ".dvc" / "config").exists()
    with pytest.raises(SystemExit) as failed:
        common.dvc(tmp_path / "repo", "exp", "show", "--no-such-flag")
    assert str(failed.value).startswith(f"error: dvc exp show --no-such-flag failed in {tmp_path / 'repo'}:\n")
    assert "--no-such-flag" in str(failed.value).split("\n", 1)[1]
    with pytest.raises(SystemExit) as quiet:
        common.dvc(tmp_path / "repo", "exp", "show", "--no-such-flag", output=False)
    assert str(quiet.value) == f"error: dvc exp show --no-such-flag failed in {tmp_path / 'repo'}"
    # A clone of a repository whose DVC cache is elsewhere (here: this one's, under ROOT).
    origin = tmp_path / "origin"
    subprocess.run(["git", "init", "-q", str(origin)], check=True)
    common.dvc(origin, "init", "-q")
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "dvc"], cwd=origin, check=True)
    monkeypatch.setattr(common, "ROOT", origin)
    clone = common.clone_with_cache(tmp_path / "clone")
    assert common.dvc(clone, "cache", "dir").strip() == str(origin / ".dvc" / "cache")


def test_the_sync_count_is_the_warnings_of_torchs_sync_debug_mode_while_the_work_ran(monkeypatch):
    """bench/common.count_syncs on a stand-in for torch's CUDA sync debug mode: the mode is "warn"
    while the work runs, and back to "default" after it, even when the work fails; only its
    warnings of a synchronizing operation count."""
    import warnings

    modes = []
    monkeypatch.setattr(common.torch.cuda, "set_sync_debug_mode", modes.append)

    def work():
        warnings.warn("called a synchronizing CUDA operation", UserWarning, stacklevel=1)  # torch's text
        warnings.warn("called a synchronizing CUDA operation", UserWarning, stacklevel=1)  # (each one, "always")
        warnings.warn("something else", UserWarning, stacklevel=1)
        assert modes == ["warn"]

    assert common.count_syncs(work) == 2 and modes == ["warn", "default"]
    with pytest.raises(ZeroDivisionError):
        common.count_syncs(lambda: 1 / 0)
    assert modes[-1] == "default"


def test_the_nan_fill_flag_is_on_only_with_deterministic_algorithms_that_fill_memory():
    torch = common.torch
    before = (torch.are_deterministic_algorithms_enabled(), torch.utils.deterministic.fill_uninitialized_memory)
    try:
        for deterministic, fill in ((False, True), (True, False), (True, True)):
            torch.use_deterministic_algorithms(deterministic)
            torch.utils.deterministic.fill_uninitialized_memory = fill
            assert common.nan_fill() is (deterministic and fill)
    finally:
        torch.use_deterministic_algorithms(before[0])
        torch.utils.deterministic.fill_uninitialized_memory = before[1]
    assert f"{torch.get_num_threads()} torch threads" in common.describe(torch.device("cpu"))


def test_the_commit_of_a_copy_without_git_is_the_one_named(monkeypatch):
    """A figure names the commit that measured it: git's (this checkout), or STORYREWRITE_COMMIT
    where the tree was copied without its .git."""
    import subprocess

    from commit_name import commit_name

    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    monkeypatch.delenv("STORYREWRITE_COMMIT", raising=False)
    assert commit_name(ROOT).removesuffix("+changes") == head
    monkeypatch.setenv("STORYREWRITE_COMMIT", "0123abc")
    assert commit_name(ROOT) == "0123abc"


def test_the_step_bench_runs_under_the_torch_flags_of_the_train_stage(monkeypatch):
    """bench/objective_step_time.py times a step as the train stage trains it: the flags that the
    stage's Trainer sets (deterministic algorithms, which on CUDA rule out cuDNN's attention;
    cuBLAS's workspace; cuDNN's benchmark mode), and its fit beside them (new tensors left without
    NaN: tests/training/test_training.py runs fit for that), are the ones the bench sets."""
    import os

    import lightning as L
    import objective_step_time
    import torch

    from storyrewrite.params import Params
    from storyrewrite.training.run import trainer_kwargs, without_nan_fill

    def flags() -> tuple:
        return (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
                torch.backends.cudnn.benchmark, os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
                torch.utils.deterministic.fill_uninitialized_memory)

    def unset() -> None:  # the opposite of what the stage sets
        torch.use_deterministic_algorithms(False)
        torch.backends.cudnn.benchmark = True
        torch.utils.deterministic.fill_uninitialized_memory = True
        monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)

    before = flags()
    config = Params.load(ROOT / "params.yaml").train
    try:
        unset()
        L.Trainer(**trainer_kwargs(config))
        without_nan_fill()
        stage = flags()
        unset()
        assert objective_step_time.stage_flags(config) is True
        assert flags() == stage and stage[0] is True and stage[3] is not None and stage[4] is False
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
        torch.backends.cudnn.benchmark = before[2]
        torch.utils.deterministic.fill_uninitialized_memory = before[4]


def test_the_step_benchs_operator_count_agrees_with_the_profiler_and_leaves_views_out(tiny_model_dirs):
    """bench/objective_step_time.py's `ops/step`: the operators a forward and backward dispatch,
    counted by name, against torch.profiler's count of the same operators in the same work."""
    import objective_step_time
    import torch

    from storyrewrite.models.store import load_model, resolve_model_dir

    model = load_model(resolve_model_dir(tiny_model_dirs["llama"], "generator")).train()
    ids = torch.randint(0, model.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))

    def work() -> None:
        model(input_ids=ids, labels=ids).loss.backward()
        model.zero_grad(set_to_none=True)

    work()
    with objective_step_time.OpCounter() as counter:
        work()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profiler:
        work()
    profiled = {event.key: event.count for event in profiler.key_averages()}
    # Operators that are kernels of their own: the profiler also lists those that others call inside
    # (a slice_backward's zero fill), which reach no dispatch mode, and the two differ there.
    for name in ("mm", "mul", "pow", "cat", "mean", "silu_backward"):
        assert counter.counts[f"aten.{name}"] == profiled[f"aten::{name}"] > 0, name
    assert profiled["aten::view"] > 0 and profiled["aten::t"] > 0  # views were dispatched, and are not counted
    assert not {"aten.view", "aten.t", "aten.transpose", "aten.detach"} & set(counter.counts)
    assert counter.ops == sum(counter.counts.values())


def test_the_step_benchs_flop_count_takes_the_cpus_attention_as_the_math_path_computes_it(tiny_model_dirs):
    """`GFLOP/step`: torch's counter has no formula for the CPU's fused attention. With ours, a
    tiny Llama's forward counts what the same forward on the math path (attention as matrix
    products, which torch counts) does; its backward also recomputes the attention scores, one
    product of queries and keys per layer more than the math path's backward."""
    import objective_step_time
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    from storyrewrite.models.store import load_model, resolve_model_dir

    model = load_model(resolve_model_dir(tiny_model_dirs["llama"], "generator")).train()
    config = model.config
    batch, length = 2, 12
    ids = torch.randint(0, config.vocab_size, (batch, length), generator=torch.Generator().manual_seed(0))

    def forward() -> None:
        model(input_ids=ids)

    def step() -> None:
        model(input_ids=ids, labels=ids).loss.backward()
        model.zero_grad(set_to_none=True)

    fused_forward, fused_step = objective_step_time.count_flops(forward), objective_step_time.count_flops(step)
    with sdpa_kernel(SDPBackend.MATH):
        math_forward, math_step = objective_step_time.count_flops(forward), objective_step_time.count_flops(step)
    with FlopCounterMode(display=False) as torch_own:
        forward()
    head_dim = config.hidden_size // config.num_attention_heads
    scores = 2 * batch * config.num_attention_heads * length * length * head_dim  # one product of queries and keys
    assert fused_forward == math_forward == torch_own.get_total_flops() + 2 * scores * config.num_hidden_layers
    assert fused_step - math_step == scores * config.num_hidden_layers


def test_the_training_check_trains_each_objective_in_a_process_of_its_own_and_names_those_that_failed(tmp_path, monkeypatch, capsys):
    """bench/training_paths.py (the GPU bench's first check), here on the CPU: an objective's
    process (`--one`) trains a DTO objective 2 steps through `fit`, validated at the start and
    after, its weights exported, and prints what it did as JSON; the parent runs one such process
    per objective, prints a line each, the end of a failed one's error, and exits naming those
    that failed."""
    import json

    import training_paths

    monkeypatch.setattr(common, "CACHE", tmp_path)
    trained, train = [], training_paths.train
    monkeypatch.setattr(training_paths, "train", lambda objective, args: (trained.append(objective), train(objective, args))[1])
    monkeypatch.setattr(sys, "argv", ["training_paths.py", "--one", "score", "--device", "cpu", "--steps", "2", "--tiny"])
    training_paths.main()
    printed = capsys.readouterr().out
    result = json.loads(printed.splitlines()[-1])  # (after Lightning's progress and summary)
    assert trained == ["score"]
    assert (result["device"], result["steps"], result["precision"]) == ("cpu", 2, "32-true") and result["seconds"] > 0

    commands, error = [], "\nRuntimeError: no deterministic kernel\n"

    def run(command, **kwargs):  # the processes: score's prints what the one above did; nll's fails
        commands.append(command)
        if command[3] == "score":
            return subprocess.CompletedProcess(command, 0, printed, "")
        return subprocess.CompletedProcess(command, 3, "", "Traceback ...\n" + "x" * 3000 + error)

    monkeypatch.setattr(training_paths.subprocess, "run", run)
    profile = tmp_path / "overlay.yaml"
    monkeypatch.setattr(sys, "argv", ["training_paths.py", "--device", "cuda", "--profile", str(profile), "--tiny",
                                      "--objectives", "score", "nll", "--steps", "3"])
    with pytest.raises(SystemExit, match=r"these objectives failed to train \(their errors above\): nll$"):
        training_paths.main()
    assert commands == [[sys.executable, training_paths.__file__, "--one", objective, "--device", "cuda", "--steps", "3",
                         "--profile", str(profile), "--tiny"] for objective in ("score", "nll")]
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"score        ok: 2 steps on cpu in 32-true, validated at the start and after, best weights "
                               f"exported (fit {result['seconds']} s, process ")
    # The end of nll's error, its last 3,000 characters as they were (the final newline an empty line).
    assert lines[1:] == ["nll          FAILED (exit 3):", "x" * (3000 - len(error)), "RuntimeError: no deterministic kernel", ""]


def test_the_benchs_device_seconds_add_up_the_work_a_profiler_recorded():
    """The benches' GPU busy (bench/common.py) reads the profiler's raw events (key_averages()
    parses them all in Python first, seconds a step): summed for one kind of device, two timed
    regions on the CPU give the seconds a wall clock measured around them, a device that did no
    work none. (Not key_averages()'s sum: it drops an operator nested in one of the same name.)"""
    import time

    import torch
    from torch.autograd import DeviceType

    spans = []
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profiler:
        for seconds in (0.02, 0.03):
            with torch.profiler.record_function(f"wait {seconds}"):
                started = time.perf_counter()
                time.sleep(seconds)
                spans.append(time.perf_counter() - started)
    events = profiler.profiler.kineto_results.events()
    assert sum(spans) <= common.device_seconds(events, DeviceType.CPU) < 1.5 * sum(spans)
    assert common.device_seconds(events, DeviceType.CUDA) == 0


def test_the_step_benchs_phases_cover_the_steps_they_time(tmp_path, monkeypatch):
    """bench/objective_step_time.py's per-process line: the `steps` phase spans the untimed first
    step and every timed one (it is the interval around them), the others are there and positive."""
    import objective_step_time

    profile = bench_profile(tmp_path, monkeypatch)
    args = objective_step_time.arguments().parse_args(["--device", "cpu", "--steps", "2", "--batch-size", "2",
                                                       "--profile", str(profile)])
    result = objective_step_time.measure("score", args)
    phases = result["phases"]
    assert set(phases) == {"build_s", "steps_s", "ops_s", "flops_s"} and min(phases.values()) > 0
    # Two timed steps: their median is their mean, so the two together take twice it.
    assert phases["steps_s"] >= result["first"] + 2 * result["with"]
    assert result["ops"] > 0 and result["flops"] > 0 and result["batch_size"] == 2


def test_interleaved_timing_rotates_the_first_and_pairs_the_runs_of_a_round(monkeypatch):
    """bench/common.alternating: a warm-up round untimed, then each callable first in turn, each
    run timed alone; paired_ratio sets the runs of one round against each other. A clock that
    advances by what each callable says it took, and drifts by round, checks both."""
    now, calls = [0.0], []
    monkeypatch.setattr(common, "clock", lambda device: now[0])

    def work(name: str, cost: float):
        def run() -> None:
            calls.append(name)
            now[0] += cost * (1 + (len(calls) - 1) // 3)  # the machine slows down round by round
        return run
    seconds = common.alternating({"a": work("a", 1.0), "b": work("b", 2.0), "c": work("c", 3.0)}, 3, None)
    assert calls == ["a", "b", "c", "b", "c", "a", "c", "a", "b", "a", "b", "c"]  # the first round is the warm-up
    assert seconds == {"a": [2.0, 3.0, 4.0], "b": [4.0, 6.0, 8.0], "c": [6.0, 9.0, 12.0]}
    # Each round's own ratio, whatever the drift: c costs 3 a's however slow the machine has become.
    assert common.paired_ratio(seconds["c"], seconds["a"]) == (3.0, [3.0, 3.0])
    assert common.paired_ratio([2.0, 3.0, 9.0, 4.0], [1.0, 1.0, 3.0, 1.0]) == (3.0, [2.25, 3.75])
    assert common.paired_ratio([2.0], [1.0]) == (2.0, [2.0, 2.0])


def test_the_paired_step_bench_times_each_objective_against_nll_in_one_process(tmp_path, monkeypatch):
    """bench/objective_pairs.py with tiny models: every objective's step timed in the same rounds,
    the ratio each round's own, NLL's 1; its record carries the targets."""
    import objective_pairs

    profile = bench_profile(tmp_path, monkeypatch)
    args = objective_pairs.arguments().parse_args(["--device", "cpu", "--steps", "3", "--batch-size", "2",
                                                   "--profile", str(profile), "--objectives", "nll", "score"])
    steps = []
    real_step = objective_pairs.step
    monkeypatch.setattr(objective_pairs, "step", lambda module, *rest, **kw: (steps.append(module.loss), real_step(module, *rest, **kw)))
    figures, shape = objective_pairs.measure(args, objective_pairs.resolve_device("cpu"))
    assert len(steps) == 8 and steps[0] is not steps[1] and steps[2] is steps[1]  # 4 rounds of 2, the first of each in turn
    assert figures["nll"]["ratio"] == 1.0 and figures["nll"]["ratio_quartiles"] == [1.0, 1.0]
    assert figures["score"]["s_per_step"] > 0 and figures["score"]["ratio"] > 0 and shape["batch_size"] == 2
    low, high = figures["score"]["ratio_quartiles"]
    assert low <= figures["score"]["ratio"] <= high


def test_the_step_bench_names_its_figures_file_by_precision_and_compilation_or_as_told():
    """A run of other objectives (scripts/gpu_bench.sh's `steps-others`) names a file of its own,
    so that it does not replace the targets' run of the same device and precision."""
    import objective_step_time

    name = lambda *argv: objective_step_time.result_name(objective_step_time.arguments().parse_args(list(argv)))  # noqa: E731
    assert name() == "objective_step_time"
    assert name("--precision", "bf16-mixed") == "objective_step_time-bf16-mixed"
    assert name("--precision", "bf16-mixed", "--compile") == "objective_step_time-bf16-mixed-compiled"
    assert name("--precision", "bf16-mixed", "--compile", "reduce-overhead") == "objective_step_time-bf16-mixed-compiled-reduce-overhead"
    assert name("--precision", "bf16-mixed", "--name", "objective_step_time-bf16-mixed-others") == \
        "objective_step_time-bf16-mixed-others"


def test_the_queue_bench_forces_the_stages_after_train_and_compares_only_rounds_of_the_same_work(tmp_path, monkeypatch, capsys):
    """bench/queue_workers.py queues its experiments with DVC's --force-downstream, so that no
    stage after `train` is restored from the run cache (predictions an earlier run made once
    spared the second round its score and significance stages); each round's workers start the
    queue, which is stopped after it, and its wall time (on a clock of set ticks) runs from the
    start to the last experiment's end. Rounds that ran other stages all the same are not
    compared, and nothing is written; an experiment that ends without a result is named."""
    import types

    import queue_workers

    (tmp_path / ".dvc" / "cache" / "runs").mkdir(parents=True)
    monkeypatch.setattr(queue_workers, "ROOT", tmp_path)
    monkeypatch.setattr(queue_workers, "clone_with_cache", lambda into: into)  # the clone
    monkeypatch.setattr(queue_workers, "check_cache_holds_head", lambda: None)  # tested below
    full = ["generate@finetuned", "report", "score@finetuned", "significance", "train"]
    stages = {"lr-0-j1": full, "lr-1-j1": full, "lr-0-j2": full, "lr-1-j2": full}
    queued, written, calls, failing = [], [], [], set()
    # -j 1 from 0 s to 10 s; -j 2 from 20 s to 26 s. A poll finds one more experiment done.
    ticks = iter([0, 10, 20, 26])
    polls = []

    def sleep(seconds):  # between polls: a bench that never stops polling fails here, not by hanging
        polls.append(seconds)
        if len(polls) > 100:
            pytest.fail("the bench polled the queue 100 times after it stopped running anything")

    monkeypatch.setattr(queue_workers, "time", types.SimpleNamespace(perf_counter=lambda: next(ticks), sleep=sleep))

    def dvc(repo, *args, output=True):
        calls.append(" ".join(args[:4]))
        if args[:3] == ("exp", "run", "--queue"):
            queued.append(args)
        if args[:2] == ("exp", "list"):
            done = [name for *_, name, _, _ in queued if name not in failing]
            return " ".join(done[: sum(call.startswith("exp list") for call in calls)])
        if args[:2] == ("queue", "status"):
            return "Running" if len(calls) < 40 else "Failed"
        if args[:2] == ("queue", "logs"):
            return "".join(f"Running stage '{stage}':\n> python ...\n" for stage in stages[args[2]])
        return ""

    monkeypatch.setattr(queue_workers, "dvc", dvc)
    monkeypatch.setattr(queue_workers, "write_result", lambda *args: written.append(args))
    monkeypatch.setattr(sys, "argv", ["queue_workers.py"])
    queue_workers.main()
    assert len(queued) == 4 and all("--force-downstream" in args for args in queued)
    lrs = [float(args[-1].split("=")[1]) for args in queued]
    assert len(set(lrs)) == 4  # every experiment's learning rate its own: none restored whole
    assert all(1.0001 <= lr / base <= 1.001 for lr, base in zip(lrs, [2e-5, 3e-5, 2e-5, 3e-5], strict=True))
    rounds = [[call for call in calls if call.startswith(("queue start", "queue stop"))][i::2] for i in (0, 1)]
    assert rounds == [["queue start -j 1", "queue start -j 2"], ["queue stop --kill", "queue stop --kill"]]
    figures, settings, targets = written[0][2:]
    assert [r["ran"] for r in figures["rounds"]] == [{"lr-0-j1": full, "lr-1-j1": full}, {"lr-0-j2": full, "lr-1-j2": full}]
    assert [(r["jobs"], r["wall_s"], r["failed"]) for r in figures["rounds"]] == [(1, 10, []), (2, 6, [])]
    assert figures["two_workers_over_one"] == 0.6 and settings["lrs"] == ["2e-5", "3e-5"] and targets == {"two_workers_over_one": {"max": 1.0}}
    assert "-j 2 / -j 1 wall time: 0.60 (target <= 1)" in capsys.readouterr().out

    # The second round's score and significance restored: its time is not that of the same work.
    queued.clear(), written.clear(), calls.clear()
    ticks = iter([0, 10, 20, 26])
    restored = ["generate@finetuned", "report", "train"]
    stages.update({"lr-0-j2": restored, "lr-1-j2": restored})
    with pytest.raises(SystemExit, match="the rounds ran different stages") as stopped:
        queue_workers.main()
    assert "-j 2: generate@finetuned, report, train | generate@finetuned, report, train" in str(stopped.value)
    assert written == []

    # An experiment that failed: the queue no longer runs anything, and the round names it.
    queued.clear(), calls.clear()
    ticks = iter([0, 10])
    failing.add("lr-1-j1")
    monkeypatch.setattr(sys, "argv", ["queue_workers.py", "--jobs", "1"])
    queue_workers.main()
    [round_] = written[0][2]["rounds"]
    assert round_["failed"] == ["lr-1-j1"] and "two_workers_over_one" not in written[0][2]
    assert "-j 1: 10 s for 2 experiments; FAILED: lr-1-j1" in capsys.readouterr().out


def test_the_queue_bench_refuses_a_cache_that_lacks_heads_stages(tmp_path, monkeypatch):
    """bench/queue_workers.py's clones restore HEAD's stages from this cache: it stops, naming
    why, where dvc.lock is not HEAD's or `dvc status` lists a changed stage (an output this cache
    does not hold), and passes a repository that `dvc repro` left as committed. A real git and DVC
    repository with one stage."""
    import subprocess

    import queue_workers

    def run(*command):
        subprocess.run(command, cwd=tmp_path, check=True, capture_output=True, env=common.workspace_env(tmp_path))

    run("git", "init", "-q")
    run(sys.executable, "-m", "dvc", "init", "-q")
    (tmp_path / "dvc.yaml").write_text("stages:\n  make:\n    cmd: echo made > out.txt\n    outs: [out.txt]\n")
    run(sys.executable, "-m", "dvc", "repro", "-q")
    run("git", "add", "-A")
    run("git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "repro")
    monkeypatch.setattr(queue_workers, "ROOT", tmp_path)
    queue_workers.check_cache_holds_head()  # as `dvc repro` left it and committed: no error

    (tmp_path / "out.txt").write_text("changed\n")
    with pytest.raises(SystemExit, match="`dvc status` lists changed stages"):
        queue_workers.check_cache_holds_head()
    run(sys.executable, "-m", "dvc", "checkout", "-q", "--force")
    queue_workers.check_cache_holds_head()

    lock = tmp_path / "dvc.lock"
    lock.write_text(lock.read_text() + "# another machine's\n")
    with pytest.raises(SystemExit, match="dvc.lock differs from HEAD's"):
        queue_workers.check_cache_holds_head()


def test_the_step_bench_hands_its_profiled_steps_to_each_process_and_records_them(monkeypatch):
    """`--profile-steps` (scripts/gpu_bench.sh's steps-others profiles one RLOO step, not four)
    reaches every objective's process and the figures' settings; below 1 it is refused. The
    processes are stubs that answer as a CUDA process would, with a GPU busy share."""
    import json
    import subprocess
    import types

    import objective_step_time

    commands, written = [], {}

    def process(command, **kwargs):
        commands.append(command)
        row = {"with": 0.2, "without": 0.19, "first": 1.0, "sample_share": None, "sample_read_share": None, "peak_memory_gb": 1.0,
               "device": "cuda:0 (stub)", "batch_size": 16, "tokens": 1898, "deterministic": True, "nan_fill": False,
               "gpu_busy": 0.1, "syncs": 3 if command[command.index("--one") + 1] == "rloo" else 0, "phases": {"build_s": 1.0}}
        if command[command.index("--one") + 1] == "rloo":
            row["decoding_graphs"] = 2.0
        return types.SimpleNamespace(returncode=0, communicate=lambda: (json.dumps(row) + "\n", ""))

    monkeypatch.setattr(subprocess, "Popen", process)
    monkeypatch.setattr(objective_step_time, "write_result",
                        lambda name, device, figures, settings, targets: written.update(settings, figures=figures, targets=targets))
    monkeypatch.setattr(sys, "argv", ["objective_step_time.py", "--device", "cpu", "--objectives", "nll", "rloo",
                                      "--repeats", "1", "--profile-steps", "1", "--set", "rl.cache=static"])
    objective_step_time.main()
    assert len(commands) == 2
    assert all(command[command.index("--profile-steps") + 1] == "1" for command in commands)
    assert all(command[command.index("--set") + 1] == "rl.cache=static" for command in commands)
    assert written["profile_steps"] == 1 and written["set"] == ["rl.cache=static"]
    # The syncs a step makes: a target of none for every objective but RLOO, whose rewards are the host's.
    assert written["figures"]["rloo"]["syncs_per_step"] == 3 and written["figures"]["nll"]["syncs_per_step"] == 0
    assert written["targets"]["nll.syncs_per_step"] == {"max": 0} and "rloo.syncs_per_step" not in written["targets"]
    # The graphs RLOO's static-cache samplings compiled, where it reports them.
    assert written["figures"]["rloo"]["decoding_graphs"] == 2 and "decoding_graphs" not in written["figures"]["nll"]
    monkeypatch.setattr(sys, "argv", ["objective_step_time.py", "--profile-steps", "0"])
    with pytest.raises(SystemExit, match="--profile-steps must be at least 1, not 0"):
        objective_step_time.main()


def test_the_step_bench_profiles_and_reads_the_decoding_graphs_before_it_counts_operators(monkeypatch):
    """On CUDA the profiled steps and the `decoding_graphs` read come before the operator and FLOP
    counts: those run the step under torch dispatch modes, after which a compiled decoding step
    decodes eagerly (tests/objectives/test_rloo.py). The step and its tools are stubs that log
    the order."""
    import types

    import objective_step_time
    import torch

    events = []

    class Logs(dict):
        def __getitem__(self, key):
            events.append(f"read {key}")
            return super().__getitem__(key)

    module = types.SimpleNamespace(step_logs=Logs(sample_seconds=0.5, sample_read_seconds=0.25, decoding_graphs=1.0))
    batch = {"ids": [0, 1], "num_tokens": 10}

    class Counter:
        ops = 7

        def __enter__(self):
            events.append("ops")
            return self

        def __exit__(self, *exc):
            return False

    def profile(work, device, steps):
        events.append("profile")
        work()
        return 0.5, None

    diagnostics = iter([0.2, 0.4, 1.2])  # the instrumented steps' diagnostics seconds: median 0.4, mean 0.6

    def step(*args, timed=None, optimise=True, **kwargs):
        events.append("step" if optimise else "step, parameters kept")
        if timed is not None:  # (the diagnostics' own seconds)
            timed.append(next(diagnostics))

    ticks = iter(range(0, 2000, 2))  # (two seconds a clock read: each step takes 2 s)
    stubs = {"resolve_device": lambda name: torch.device("cuda"), "build": lambda objective, args, device: (module, None, batch),
             "step": step, "clock": lambda device: next(ticks),
             "peak_memory_gb": lambda device: 1.0, "describe": lambda device: "cuda:0 (stub)", "nan_fill": lambda: False,
             "gpu_busy": profile, "count_syncs": lambda work: events.append("syncs") or 0, "OpCounter": Counter,
             "count_flops": lambda work: events.append("flops") or 100}
    for name, stub in stubs.items():
        monkeypatch.setattr(objective_step_time, name, stub)
    args = objective_step_time.arguments().parse_args(["--device", "cuda", "--steps", "3", "--profile-steps", "1"])
    result = objective_step_time.measure("rloo", args)
    order = [event for event in events if event != "step" and not event.startswith("read sample")]
    assert order == ["profile", "syncs", "read decoding_graphs", "ops", "step, parameters kept", "flops"], events
    assert result["decoding_graphs"] == 1.0 and result["gpu_busy"] == 0.5 and result["ops"] == 7 and result["flops"] == 100
    # A step's 2 s; without the diagnostics, less their median's seconds; sampling's and its read's shares of a step.
    assert (result["with"], result["without"], result["first"]) == (2, 1.6, 2)
    assert (result["sample_share"], result["sample_read_share"]) == (0.25, 0.125)
    # Compiled steps are not counted: a dispatch mode would change how a compiled body runs.
    events.clear()
    diagnostics = iter([0.2, 0.4, 1.2])
    compiled = objective_step_time.measure("rloo", objective_step_time.arguments().parse_args(
        ["--device", "cuda", "--steps", "3", "--compile"]))
    assert not {"ops", "flops"} & compiled.keys() and not {"ops", "flops"} & set(events)


def test_the_step_benchs_figures_are_means_over_repeats_of_each_process_and_a_failure_is_named(monkeypatch):
    """bench/objective_step_time.py's figures from its processes' rows (stubs that answer as CUDA
    processes would, other numbers each repeat), against the figures worked out by hand: means
    over the repeats, the ratios to the first objective's, the peak memory and syncs at their
    most, RLOO's decoding graphs at their fewest; only the first repeat writes a trace. A failed
    objective is left out of the record and named; the base's failure ends the bench."""
    import json
    import subprocess
    import types

    import objective_step_time

    base = {"first": 1.0, "sample_share": None, "sample_read_share": None, "device": "cuda:0 (stub)", "batch_size": 16,
            "tokens": 1898, "deterministic": True, "nan_fill": False, "syncs": 0, "phases": {"build_s": 1.0}}
    rows = {  # objective -> its process's row in each repeat
        "nll": [{"with": 0.2, "without": 0.19, "first": 1.0, "peak_memory_gb": 1.0, "gpu_busy": 0.1, "ops": 100, "flops": 1e9},
                {"with": 0.22, "without": 0.2, "first": 1.2, "peak_memory_gb": 1.5, "gpu_busy": 0.3, "ops": 100, "flops": 1e9}],
        "score": [{"with": 0.4, "without": 0.38, "first": 2.0, "peak_memory_gb": 2.0, "gpu_busy": 0.2, "ops": 250, "flops": 1.6e9},
                  {"with": 0.48, "without": 0.44, "first": 3.0, "peak_memory_gb": 1.5, "gpu_busy": 0.4, "ops": 250, "flops": 1.6e9}],
        "rloo": [{"with": 1.0, "without": 1.0, "peak_memory_gb": 3.0, "gpu_busy": 0.5, "ops": 2000, "flops": 2e9, "syncs": 3,
                  "sample_share": 0.5, "sample_read_share": 0.1, "decoding_graphs": 2.0},
                 {"with": 1.2, "without": 1.2, "peak_memory_gb": 3.0, "gpu_busy": 0.5, "ops": 2000, "flops": 2e9, "syncs": 5,
                  "sample_share": 0.7, "sample_read_share": 0.3, "decoding_graphs": 1.0}],
    }
    commands, written, failing = [], {}, set()

    def process(command, **kwargs):
        commands.append(command)
        objective = command[command.index("--one") + 1]
        if objective in failing:
            return types.SimpleNamespace(returncode=1, communicate=lambda: ("", "Traceback ...\nRuntimeError: boom"))
        row = base | rows[objective][sum(objective in c for c in commands) - 1]
        return types.SimpleNamespace(returncode=0, communicate=lambda: (json.dumps(row) + "\n", ""))

    monkeypatch.setattr(subprocess, "Popen", process)
    monkeypatch.setattr(objective_step_time, "write_result",
                        lambda name, device, figures, settings, targets: written.update(settings, figures=figures, targets=targets))
    argv = ["objective_step_time.py", "--device", "cpu", "--objectives", "nll", "score", "rloo", "--repeats", "2",
            "--batch-size", "16", "--trace", "traces"]
    monkeypatch.setattr(sys, "argv", argv)
    objective_step_time.main()
    assert [("--trace" in command, command[command.index("--batch-size") + 1]) for command in commands] == [(True, "16")] * 3 + [(False, "16")] * 3
    figures = written["figures"]
    assert figures["nll"] == {"s_per_step": 0.21, "ratio": 1.0, "ratio_per_repeat": [1.0, 1.0], "peak_memory_gb": 1.5,
                              "diagnostics_ratio": 1.077, "first_step_s": 1.1, "gpu_busy": 0.2, "syncs_per_step": 0,
                              "ops_per_step": 100, "ops_ratio": 1.0, "gflop_per_step": 1.0, "tflop_per_s": 0.0048, "flop_ratio": 1.0}
    # score: 0.44 s / 0.21 s; 0.44 s with the diagnostics / 0.41 s without; 1.6 GFLOP in 0.44 s.
    assert figures["score"] == {"s_per_step": 0.44, "ratio": 2.095, "ratio_per_repeat": [2.0, 2.182], "peak_memory_gb": 2.0,
                                "diagnostics_ratio": 1.073, "first_step_s": 2.5, "gpu_busy": 0.3, "syncs_per_step": 0,
                                "ops_per_step": 250, "ops_ratio": 2.5, "gflop_per_step": 1.6, "tflop_per_s": 0.0036, "flop_ratio": 1.6}
    assert {key: figures["rloo"][key] for key in ("ratio", "sample_share", "sample_read_share", "syncs_per_step", "decoding_graphs",
                                                  "tflop_per_s")} == {"ratio": 5.238, "sample_share": 0.6, "sample_read_share": 0.2,
                                                                      "syncs_per_step": 5, "decoding_graphs": 1, "tflop_per_s": 0.0018}
    assert written["targets"] == {"score.ratio": {"max": 1.5}, **{f"{o}.diagnostics_ratio": {"max": 1.05} for o in rows},
                                  **{f"{o}.gpu_busy": {"min": common.GPU_BUSY_TARGET} for o in rows},
                                  "nll.syncs_per_step": {"max": 0}, "score.syncs_per_step": {"max": 0}}
    assert "failed" not in written
    # One objective fails: the others measured and recorded, it named; the base fails: nothing to set them against.
    written.clear(), commands.clear()
    failing.add("score")
    with pytest.raises(SystemExit, match=r"^error: these objectives failed \(their errors above\): score$"):
        objective_step_time.main()
    assert written["failed"] == ["score"] and set(written["figures"]) == {"nll", "rloo"}
    assert sum("score" in command for command in commands) == 1  # (not tried again in the next repeat)
    written.clear()
    failing.add("nll")
    with pytest.raises(SystemExit, match=r"^error: nll, the base of every ratio, failed$"):
        objective_step_time.main()
    assert not written


def test_a_timed_step_trains_as_the_stage_does_and_leaves_the_module_as_it_was(tmp_path, monkeypatch):
    """bench/objective_step_time.step on a tiny model: `optimise: False` leaves the parameters as
    they were (a counted step), a step with them moves them; timing the diagnostics puts the
    objective's loss back; `read: False` leaves the logged values unread (the sync count)."""
    import objective_step_time
    import torch

    profile = bench_profile(tmp_path, monkeypatch)
    args = objective_step_time.arguments().parse_args(["--device", "cpu", "--batch-size", "2", "--profile", str(profile)])
    device = torch.device("cpu")
    module, optimizer, batch = objective_step_time.build("score", args, device)
    reads = []
    monkeypatch.setattr(objective_step_time, "read_logs", lambda logs: reads.append(dict(logs)))

    def weights():
        return [p.detach().clone() for p in module.parameters() if p.requires_grad]

    before, loss = weights(), module.loss
    timed = []
    objective_step_time.step(module, optimizer, batch, device, "32-true", True, timed=timed, optimise=False)
    assert all(torch.equal(a, b) for a, b in zip(before, weights(), strict=True)) and len(reads) == 1
    assert module.loss is not loss and module.loss.compute is loss.compute and len(timed) == 1 and timed[0] > 0
    objective_step_time.step(module, optimizer, batch, device, "32-true", True, read=False)
    assert not all(torch.equal(a, b) for a, b in zip(before, weights(), strict=True)) and len(reads) == 1


def test_a_set_key_overlays_the_params_a_bench_trains_with():
    """`--set rl.cache=static` reaches the run a step bench builds, applied as `dvc exp run -S`
    applies it (a YAML value under its dotted key); a pair without `=`, a key params.yaml lacks
    and a sweep are refused, naming them."""
    from common import inputs, train_run

    params = inputs([], sets=["rl.cache=static", "train.batch_size=4", "dto.hard=true"])[0]
    assert (params.rl.cache, params.train.batch_size, params.dto.hard) == ("static", 4, True)
    assert train_run([], "rloo", sets=["rl.cache=static"]).settings.cache == "static"
    with pytest.raises(InputError, match="Error parsing override 'rl.cache'"):
        inputs([], sets=["rl.cache"])
    with pytest.raises(InputError, match="unknown key `rl.cach`; valid keys in `rl`: .*cache"):
        train_run([], "rloo", sets=["rl.cach=static"])
    with pytest.raises(InputError, match="--set rl.cache=static,dynamic: a sweep"):
        inputs([], sets=["rl.cache=static,dynamic"])


def test_a_bench_script_refuses_bad_input_in_one_line():
    """Every bench script runs its main as the stages do (storyrewrite.io.run_cli): bad input ends
    it with one line and exit status 2, not a traceback. One of them run for it: a key params.yaml
    lacks."""
    scripts = sorted(path.name for path in (ROOT / "bench").glob("*.py") if "def main(" in path.read_text())
    assert scripts and [name for name in scripts if "\n    run_cli(main)" not in (ROOT / "bench" / name).read_text()] == []
    result = subprocess.run([sys.executable, "bench/objective_pairs.py", "--set", "rl.cach=static"], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and result.stderr.splitlines() == [
        "error: -S rl.cach=static: unknown key `rl.cach`; valid keys in `rl`: samples, temperature, max_new_tokens, reward, "
        "kl_beta, baseline, cache, early_stop, sample_dtype"]


def test_the_compiled_step_bench_sets_each_step_against_the_eager_one_and_dto_against_its_flops():
    """Speed-ups over the same objective's eager tokens/s, a DTO step over NLL's at the same
    batch size against their FLOP ratio, and the GPU targets only where a GPU was measured."""
    import compiled_steps

    def run(eager_s, rows):
        return {"eager": {"batch_size": 16, "s_per_step": eager_s, "tokens_per_s": 1600 / eager_s, "first_step_s": 1.0},
                **{f"b{size}": {"tokens": 100 * size, "flops": flops, "s_per_step": s, "tokens_per_s": 100 * size / s,
                                "first_step_s": 30.0, "gpu_busy": 0.7, "syncs_per_step": 0} for size, (s, flops) in rows.items()}}
    runs = {"nll": run(0.2, {16: (0.04, 2e12), 32: (0.05, 4e12)}), "score": run(0.4, {16: (0.1, 3e12), 32: (0.08, 6e12)})}
    figures, targets = compiled_steps.figures_of(runs, [16, 32])
    assert figures["nll"]["b16"]["speedup"] == pytest.approx(5.0) and figures["nll"]["b32"]["speedup"] == pytest.approx(8.0)
    assert figures["nll"]["best_speedup"] == pytest.approx(8.0) and "ratio" not in figures["nll"]["b16"]
    # score at 16: 0.1 / 0.04 = 2.5 against a FLOP ratio of 1.5
    assert figures["score"]["b16"]["ratio"] == pytest.approx(2.5) and figures["score"]["b16"]["flop_ratio"] == pytest.approx(1.5)
    assert figures["score"]["b16"]["ratio_over_flop_ratio"] == pytest.approx(2.5 / 1.5, abs=1e-3)
    assert targets["nll.best_speedup"] == {"min": 5.0} and targets["score.b32.ratio_over_flop_ratio"] == {"max": 1.15}
    assert targets["score.b16.gpu_busy"] == {"min": 0.6} and targets["nll.b32.syncs_per_step"] == {"max": 0}
    for rows in runs.values():  # a CPU run: no GPU figures, no GPU targets
        for size in (16, 32):
            del rows[f"b{size}"]["gpu_busy"], rows[f"b{size}"]["syncs_per_step"]
    assert not any("gpu_busy" in name or "syncs" in name for name in compiled_steps.figures_of(runs, [16, 32])[1])


def test_the_compiled_step_bench_compiles_both_models_and_times_each_batch_size_on_its_own_rows(tmp_path, monkeypatch):
    """bench/compiled_steps.py's measurement of one objective, on the CPU with aot_eager (the same
    tracing, no generated kernels): the eager step at the first batch size, then the generator's
    and the scorer's bodies compiled, and each batch size timed on as many training rows."""
    import compiled_steps
    import torch
    from torch._dynamo.utils import counters

    profile = bench_profile(tmp_path, monkeypatch)
    args = compiled_steps.arguments().parse_args(["--device", "cpu", "--precision", "32-true", "--profile", str(profile),
                                                  "--backend", "aot_eager", "--mode", "default", "--batch-sizes", "2", "4",
                                                  "--steps", "1"])
    args.mode = None  # (as main() passes `default` on)
    compiled, compile_body = [], compiled_steps.compile_body
    monkeypatch.setattr(compiled_steps, "compile_body", lambda model, *rest: (compiled.append(model), compile_body(model, *rest)))
    timed_sizes, timed = [], compiled_steps.timed
    monkeypatch.setattr(compiled_steps, "timed", lambda module, optimizer, batch, *rest: (
        timed_sizes.append((len(batch["ids"]), len(compiled))), timed(module, optimizer, batch, *rest))[1])
    torch._dynamo.reset()
    counters.clear()
    try:
        result = compiled_steps.measure("score", args)
        graphs = counters["stats"]["unique_graphs"]
    finally:
        torch._dynamo.reset()
    assert len(compiled) == 2 and compiled[0] is not compiled[1] and graphs >= 2  # the generator and the scorer
    assert timed_sizes == [(2, 0), (2, 2), (4, 2)]  # (rows, bodies compiled): eager at the first size, then each compiled
    eager = result["eager"]
    assert eager["batch_size"] == 2 and eager["tokens_per_s"] * eager["s_per_step"] == pytest.approx(result["b2"]["tokens"])
    assert result["b4"]["tokens"] > result["b2"]["tokens"] and result["b4"]["flops"] > result["b2"]["flops"] > 0
    for size in (2, 4):
        row = result[f"b{size}"]
        assert row["s_per_step"] > 0 and row["tokens_per_s"] == pytest.approx(row["tokens"] / row["s_per_step"])
        assert "gpu_busy" not in row  # (a GPU's figure)


def test_the_throughput_bench_trains_and_generates_as_the_stages_do_and_records_each_batch_size(tmp_path, monkeypatch, capsys):
    """bench/nll_throughput.py end to end on the CPU with tiny models: the timed NLL steps after a
    warm-up step, generation for test instances of distinct inputs (a TimeTravel story's three
    rewrites share one), after a warm-up of two batches, and another batch size set against the
    run's; the figures, on a clock of set ticks, agree with the printed table and the predictions."""
    import nll_throughput

    profile, written = tiny_bench(nll_throughput, "generate:\n  max_new_tokens: 8\n", tmp_path, monkeypatch)
    generated = []
    generate = nll_throughput.generate_predictions

    def generate_and_count(model_dir, rows, task, config, models, out, *rest):  # (batch size, stories, words of each prediction)
        generate(model_dir, rows, task, config, models, out, *rest)
        generated.append((config.batch_size, [row["story_id"] for row in rows], [len(row["prediction"].split()) for _, row in read_jsonl(out)]))
        folders.add(out.parent)

    folders = set()
    monkeypatch.setattr(nll_throughput, "generate_predictions", generate_and_count)
    # A clock read before and after each step, warm-up, generation: the warm-up step takes 10 s, the
    # two timed steps 1 s each; each generation's warm-up 1 s; batch 1's generation 1 s, batch 2's 2 s.
    ticks = iter([0, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 23])
    monkeypatch.setattr(nll_throughput, "clock", lambda device: next(ticks))
    monkeypatch.setattr(sys, "argv", ["nll_throughput.py", "--device", "cpu", "--profile", str(profile), "--steps", "2",
                                      "--generate", "4", "--batch-size", "1", "--compare-batch-sizes", "1", "2", "--dtype", "float32"])
    nll_throughput.main()
    [(name, figures, settings, targets)] = written
    assert name == "nll_throughput-float32" and targets is None  # (a CPU record holds no target)
    assert len(set(generated[1][1])) == 4  # one instance of each of 4 stories
    # The run's batch size (a warm-up of two batches, then the rows), then the other one (batch 1, the run's, not again).
    assert [(size, len(ids)) for size, ids, _ in generated] == [(1, 2), (1, 4), (2, 4), (2, 4)]
    assert settings["generate_instances"] == 4 and settings["warmup_instances"] == 2 and settings["generate_batch_size"] == 1
    assert settings["train_batch_size"] == 2 and settings["max_new_tokens"] == 8 and settings["deterministic"] is True
    # Two timed steps of 1 s each (the warm-up's 10 s left out) of 2 instances; each generation 1 s for 4 instances.
    assert (figures["train_s_per_step"], figures["train_instances_per_s"]) == (1.0, 2.0)
    assert (figures["generate_predictions_per_s"], figures["warmup_s"]) == (4.0, 1.0)
    assert figures["other_batch_sizes"] == {"2": {"predictions_per_s": 2.0, "ratio": 0.5}}
    assert figures["words_per_prediction"] == round(sum(generated[1][2]) / 4, 1) and figures["peak_memory_gb"] > 0
    assert len(folders) == 1 and not folders.pop().exists()  # (the predictions' scratch folder removed)
    printed = capsys.readouterr().out
    assert "NLL training:  1.000 s/step = 2.0 instances/s (batch 2, 32-true; mean of 2 steps after a warm-up step)" in printed
    assert "generation:    4.0 predictions/s (4 test instances of distinct inputs, batch 1, float32, dynamic cache, <= 8 new tokens" in printed


def test_the_llm_batching_bench_sends_both_orders_alike_and_takes_the_median_of_each(tmp_path, monkeypatch, capsys):
    """bench/llm_batching.py end to end on the CPU with a tiny chat model: one prompt per distinct
    training story, a warm-up batch, then both orders each repeat, which goes first alternating; a
    clock of set ticks gives the medians the rates come from. The padding share is counted per
    batch padded to its longest prompt."""
    import llm_batching

    assert llm_batching.padding_share([3, 1, 3, 1], 2) == (12 - 8) / 12  # batches [3, 1] and [3, 1]: 6 positions each
    assert llm_batching.padding_share([3, 3, 1, 1], 2) == 0 and llm_batching.padding_share([3, 1, 1], 2) == (6 + 1 - 5) / 7
    profile, written = tiny_bench(llm_batching, "llm:\n  max_new_tokens: 4\n", tmp_path, monkeypatch)
    sent = []
    run_mode = llm_batching.run_mode
    monkeypatch.setattr(llm_batching, "run_mode", lambda mode, queries, source, backend, cache, *rest: (
        sent.append((len({query["story_id"] for query in queries}), *rest)),
        run_mode(mode, queries, source, backend, cache, *rest))[1])
    encoded = []  # each call's prompts and their lengths in the backend's tokens

    class Backend(llm_batching.LocalBackend):
        def encode(self, chats):
            tokens = super().encode(chats)
            encoded.append((chats, tokens["attention_mask"].sum(dim=1).tolist()))
            return tokens

    monkeypatch.setattr(llm_batching, "LocalBackend", Backend)
    # Two clock reads a timed run, in the order run: longest first 1 s, instance order 2 s; then instance
    # order 3 s, longest first 1 s; then longest first 2 s, instance order 2 s.
    ticks = iter([0, 1, 1, 3, 3, 6, 6, 7, 7, 9, 9, 11])
    monkeypatch.setattr(llm_batching, "clock", lambda device: next(ticks))
    monkeypatch.setattr(sys, "argv", ["llm_batching.py", "--device", "cpu", "--profile", str(profile), "--prompts", "6",
                                      "--batch-size", "3", "--dtype", "float32"])
    llm_batching.main()
    [(name, figures, settings, targets)] = written
    # Stories, each asked about once (a warm-up batch of 3 first), and the order each run sends them in.
    assert sent == [(3,), (6, True), (6, False), (6, False), (6, True), (6, True), (6, False)]
    # Medians: longest first 1 s, instance order 2 s, for 6 prompts.
    assert (figures["length_sorted_prompts_per_s"], figures["instance_order_prompts_per_s"], figures["speedup"]) == (6.0, 3.0, 2.0)
    chats, lengths = encoded[0]  # (the padding counted before anything is generated)
    assert figures["padding_instance_order"] == round(llm_batching.padding_share(lengths, 3), 4)
    assert figures["padding_length_sorted"] == round(llm_batching.padding_share([lengths[i] for i in llm_batching.longest_first(chats)], 3), 4)
    assert 0 <= figures["replies_alike"] <= 6
    assert settings["generator"] == "tiny:llama" and settings["prompts"] == 6 and settings["batch_size"] == 3 and settings["max_new_tokens"] == 4 and targets == {"speedup": {"min": 1.0}}
    printed = capsys.readouterr().out
    assert "speed-up 2.00x (medians of 3)" in printed and "longest first:  6.00 prompts/s" in printed


def test_the_compiled_step_bench_measures_each_objective_in_a_process_of_its_own_and_records_it(tmp_path, monkeypatch):
    """main(): the objective's process is this script with `--one` and the same arguments; its
    last line of output is the measurement, which the record keeps with the run's settings."""
    import compiled_steps

    profile, written = tiny_bench(compiled_steps, "", tmp_path, monkeypatch)
    monkeypatch.setattr(sys, "argv", ["compiled_steps.py", "--device", "cpu", "--precision", "32-true", "--profile", str(profile),
                                      "--backend", "aot_eager", "--mode", "default", "--batch-sizes", "2", "3", "--steps", "1",
                                      "--objectives", "nll", "--name", "compiled_steps-check"])
    compiled_steps.main()
    [(name, figures, settings, targets)] = written
    assert name == "compiled_steps-check" and set(figures) == {"nll"} and set(figures["nll"]) == {"eager", "b2", "b3", "best_speedup"}
    assert figures["nll"]["best_speedup"] == max(figures["nll"]["b2"]["speedup"], figures["nll"]["b3"]["speedup"]) > 0
    assert settings == {"precision": "32-true", "mode": "default", "backend": "aot_eager", "batch_sizes": [2, 3],
                        "eager_batch_size": 2, "steps": 1, "profile_steps": 4, "profiles": [str(profile)]}
    assert targets == {"nll.best_speedup": {"min": 5.0}}
    for bad in (["--batch-sizes", "16", "0"], ["--steps", "0"], ["--profile-steps", "0"]):
        monkeypatch.setattr(sys, "argv", ["compiled_steps.py", *bad])
        with pytest.raises(SystemExit, match="must be at least 1"):
            compiled_steps.main()
    assert len(written) == 1


def test_the_workspace_env_keeps_the_packages_pythonpath_holds(tmp_path, monkeypatch):
    """An offline machine's packages are installed with --target and found through PYTHONPATH: the
    benches that run a clone's commands put its src/ first and keep them (the comparison bench once
    dropped them, and its first command failed to import pydantic)."""
    import subprocess

    site, repo = tmp_path / "site", tmp_path / "clone"
    (site / "installed_elsewhere").mkdir(parents=True)
    (site / "installed_elsewhere" / "__init__.py").write_text("WHERE = 'site'\n")
    (repo / "src" / "installed_elsewhere").mkdir(parents=True)  # the clone's own code wins
    (repo / "src" / "installed_elsewhere" / "__init__.py").write_text("WHERE = 'clone'\n")
    monkeypatch.setenv("PYTHONPATH", str(site))
    env = common.workspace_env(repo)
    code = "import installed_elsewhere, json; print(installed_elsewhere.WHERE)"
    assert subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          check=True).stdout.strip() == "clone"
    (repo / "src" / "installed_elsewhere" / "__init__.py").unlink()
    (repo / "src" / "installed_elsewhere").rmdir()
    assert subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          check=True).stdout.strip() == "site"
    monkeypatch.delenv("PYTHONPATH")
    assert common.workspace_env(repo)["PYTHONPATH"] == str(repo / "src")


def test_the_step_bench_side_by_side_runs_n_processes_at_once_and_keeps_the_median_one(monkeypatch):
    """`--side-by-side N` (the queue workers' sharing of a GPU, measured on steps): each objective's
    measurement runs in N processes started together; the step time is the median process's, the
    trace is the first process's alone, and the figures go to a file of their own."""
    import json

    import objective_step_time

    started, written = [], []
    times = iter([0.30, 0.10, 0.20, 0.90, 0.70, 0.80])  # nll's three processes, then rloo's

    class Process:
        def __init__(self, command, **kwargs):
            started.append(command)
            self.returncode, self.objective, self.seconds = 0, command[command.index("--one") + 1], next(times)

        def communicate(self):
            row = {"with": self.seconds, "without": self.seconds, "first": 1.0, "phases": {}, "peak_memory_gb": 1.0,
                   "sample_share": 0.5 if self.objective == "rloo" else None,
                   "sample_read_share": 0.125 if self.objective == "rloo" else None, "device": "cpu", "batch_size": 16,
                   "tokens": 100, "deterministic": True, "nan_fill": False}
            return json.dumps(row) + "\n", ""

    monkeypatch.setattr(objective_step_time.subprocess, "Popen", Process)
    monkeypatch.setattr(objective_step_time, "write_result", lambda *args: written.append(args))
    monkeypatch.setattr(sys, "argv", ["objective_step_time.py", "--objectives", "nll", "rloo", "--repeats", "1",
                                      "--side-by-side", "3", "--trace", "traces"])
    objective_step_time.main()
    assert [c[c.index("--one") + 1] for c in started] == ["nll"] * 3 + ["rloo"] * 3
    assert [("--trace" in c) for c in started] == [True, False, False] * 2
    name, _, figures, settings, _ = written[0]
    assert name == "objective_step_time-side-by-side3" and settings["side_by_side"] == 3
    assert figures["nll"]["s_per_step"] == 0.2 and figures["rloo"]["s_per_step"] == 0.8
    assert figures["rloo"]["ratio"] == 4.0 and figures["rloo"]["sample_read_share"] == 0.125
    monkeypatch.setattr(sys, "argv", ["objective_step_time.py", "--side-by-side", "0"])
    with pytest.raises(SystemExit, match="--side-by-side must be at least 1, not 0"):
        objective_step_time.main()


def test_the_startup_bench_sums_the_outermost_imports_and_each_packages_own_time():
    """`python -X importtime`'s report: the imports' total is the outermost ones' cumulative times
    (a nested import is inside its parent's), a package's time the sum of its modules' own; on a
    real report, the total holds the imported module's time and less than the process's."""
    import subprocess
    import time

    import stage_startup

    report = ("import time: self [us] | cumulative | imported package\n"
              "import time:    100000 |     100000 | zipimport\n"
              "import time:    300000 |    1300000 | torch\n"
              "import time:    700000 |     700000 |   torch._C\n"
              "import time:    200000 |     200000 |   numpy\n"
              "import time:     50000 |     250000 | storyrewrite.io\n"
              "import time:    200000 |     200000 |   storyrewrite\n"
              "not a report line\n")
    total, packages = stage_startup.import_times(report)
    assert total == pytest.approx(0.1 + 1.3 + 0.25)
    assert packages == {"torch": 1.0, "storyrewrite": 0.25, "numpy": 0.2, "zipimport": 0.1}

    started = time.perf_counter()
    real = subprocess.run([sys.executable, "-X", "importtime", "-c", "import json"], capture_output=True, text=True, check=True)
    wall = time.perf_counter() - started
    total, packages = stage_startup.import_times(real.stderr)
    json_line = next(line for line in real.stderr.splitlines() if line.endswith("| json"))
    assert int(json_line.split("|")[1]) / 1e6 <= total < wall and packages["json"] > 0


def test_the_stages_dvc_ran_are_its_running_stage_lines_in_order():
    """`dvc queue logs` as DVC prints it: a stage's own output (stderr's carriage returns as new
    lines, one without a newline at its end) between DVC's lines; a stage restored from the run
    cache is not one that ran, and a stage's text naming a stage is not DVC's line."""
    log = ("Reproducing experiment 'q1'\n"
           "Running stage 'train':\n> python stages/train.py\n\nbar 0\nbar 1\nbar 2x\n"
           "echo: Running stage 'fake'\n"
           "Generating lock file 'dvc.lock'\nUpdating lock file 'dvc.lock'\n\n"
           "Stage 'score@nll' is cached - skipping run, checking out outputs\nUpdating lock file 'dvc.lock'\n\n"
           "Running stage 'generate@finetuned':\n> python stages/generate.py\nUpdating lock file 'dvc.lock'\n\n"
           "Running stage 'report':\n")
    assert common.stages_ran(log) == ["train", "generate@finetuned", "report"]
    assert common.stages_ran("Stage 'train' didn't change, skipping\n") == []


def test_the_step_bench_runs_its_side_by_side_processes_through_mps_and_stops_it(monkeypatch, tmp_path):
    """`--mps`: the processes of each objective get the variables of an MPS daemon started for the
    bench, stopped at the end, even when a measurement fails; where it cannot start, the bench
    fails naming why, measuring nothing; without --side-by-side, --mps is refused."""
    import objective_step_time
    from storyrewrite import mps

    started, stopped, measured = [], [], []
    monkeypatch.setattr(mps, "start", lambda folder: started.append(folder))
    monkeypatch.setattr(mps, "stop", lambda folder: stopped.append(folder))
    monkeypatch.setattr(objective_step_time, "measure_all", lambda args, env: measured.append(env))
    argv = ["objective_step_time.py", "--device", "cpu", "--objectives", "nll", "rloo", "--side-by-side", "4", "--mps"]
    monkeypatch.setattr(sys, "argv", argv)
    objective_step_time.main()
    assert len(started) == 1 and stopped == started
    assert measured[0]["CUDA_MPS_PIPE_DIRECTORY"] == f"{started[0]}/pipe"
    assert objective_step_time.result_name(objective_step_time.arguments().parse_args(argv[1:])) == (
        "objective_step_time-side-by-side4-mps")
    monkeypatch.setattr(objective_step_time, "measure_all", lambda args, env: (_ for _ in ()).throw(RuntimeError("a step failed")))
    with pytest.raises(RuntimeError):
        objective_step_time.main()
    assert len(stopped) == 2
    monkeypatch.setattr(mps, "start", lambda folder: "nvidia-cuda-mps-control not found on PATH")
    with pytest.raises(SystemExit, match="--mps: NVIDIA's MPS did not start: nvidia-cuda-mps-control not found on PATH"):
        objective_step_time.main()
    monkeypatch.setattr(sys, "argv", argv[:-3] + ["--mps"])
    with pytest.raises(SystemExit, match="give --side-by-side 2 or more"):
        objective_step_time.main()
    # Without --mps: the processes get this environment as it is.
    measured.clear()
    monkeypatch.setattr(objective_step_time, "measure_all", lambda args, env: measured.append(env))
    monkeypatch.setattr(sys, "argv", argv[:-1])
    objective_step_time.main()
    assert "CUDA_MPS_PIPE_DIRECTORY" not in measured[0]


def test_the_step_bench_keeps_each_warning_its_processes_print_once():
    """What a measured process says it did instead of what was asked (`warning: ` lines on its
    stderr: RLOO's static cache falling back to the dynamic one) is printed and recorded once, in
    order, across its side-by-side processes and repeats; the rest of stderr is not."""
    import objective_step_time

    fallback = "warning: rl.cache static: compiling the decoding step failed (RuntimeError: x); this run samples with ..."
    stderrs = [f"Loading weights\n{fallback}\n", f"  {fallback}\nwarning: another\nwarnings: not one\n", ""]
    assert objective_step_time.warnings_of(stderrs, []) == [fallback, "warning: another"]
    assert objective_step_time.warnings_of(stderrs, [fallback]) == ["warning: another"]
    assert objective_step_time.warnings_of(["all quiet\n"], []) == []


@pytest.mark.parametrize("script, flag, good", [("objective_step_time", "--name", "objective_step_time-rloo-static"),
                                                ("compiled_steps", "--name", "compiled_steps"),
                                                ("comparison", "--variant", "smoke-core")])
def test_a_record_name_that_is_a_path_is_refused_before_anything_runs(script, flag, good, capsys):
    """`--name` / `--variant` name a file in reports/bench/: a path (which put the record elsewhere,
    and then failed on printing where) is refused as the options are read, naming the flag."""
    bench = importlib.import_module(script)
    assert getattr(bench.arguments().parse_args([flag, good]), flag.removeprefix("--")) == good
    for bad in ("/tmp/figures", "../figures", "a b"):
        with pytest.raises(SystemExit) as stopped:
            bench.arguments().parse_args([flag, bad])
        assert stopped.value.code == 2
        assert f"argument {flag}: {bad!r} is not a name for a file in reports/bench/" in capsys.readouterr().err


@pytest.mark.slow
def test_the_memory_share_bench_waits_for_no_process_that_died(monkeypatch):
    """Each process of bench/gpu_memory_share.py holds its memory until all are done; one that
    dies before it says so is marked done by the parent, so the others stop waiting then, not at
    BARRIER_S. Here (no CUDA) every process fails: the first dies outside the measured work, the
    second records its error; the setting ends within seconds and counts both."""
    import os
    import time

    import gpu_memory_share

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
           "CUDA_VISIBLE_DEVICES": ""}
    started = time.perf_counter()
    figures = gpu_memory_share.run_setting("shared", 2, 1, env)
    assert time.perf_counter() - started < gpu_memory_share.BARRIER_S / 2
    assert figures["processes"] == 2 and figures["failed"] == 2 and figures["out_of_memory"] == 0
    died, recorded = figures["each"]
    assert died["failed"].startswith("exit 1: ")
    assert recorded["error"] and recorded["allocator"] == "expandable_segments:True"  # the stages' share, set before CUDA


class _StepClock:
    """A clock that moves only when a step ends: each step takes the next of `durations` seconds."""

    def __init__(self, durations: list[float]):
        self.now, self.durations = 0.0, iter(durations)

    def read(self, device=None) -> float:
        return self.now

    def timed(self, work):
        """`work`, after which the clock has moved by the next duration."""
        def run(*args, **kwargs):
            result = work(*args, **kwargs)
            self.now += next(self.durations)
            return result
        return run


def test_the_nan_fill_bench_alternates_the_fill_step_by_step_and_leaves_it_off(tmp_path, monkeypatch, capsys):
    """bench/nan_fill.py end to end with tiny models: each objective's step with the fill on and
    off in turn (a warm-up round, then each way first in turn), on a clock of set ticks; the ratio
    is without over with, round by round; the stage's setting (off) is back at the end."""
    import torch

    import nan_fill

    profile, written = tiny_bench(nan_fill, "", tmp_path, monkeypatch)
    # Each step's seconds in the order run: (on, off) unmeasured, then (off, on), (on, off), (off, on).
    clock = _StepClock([9, 9, 1, 4, 2, 1, 2, 4] + [9, 9, 3, 3, 6, 2, 2, 3])
    monkeypatch.setattr(common, "clock", clock.read)
    monkeypatch.setattr(torch.utils.deterministic, "fill_uninitialized_memory", True)  # (torch's default; put back after)
    steps, batches, objectives = [], {}, {}
    real_step, real_build = nan_fill.step, nan_fill.build

    def step(module, *args, **kwargs):
        steps.append((objectives[id(module)], torch.utils.deterministic.fill_uninitialized_memory, kwargs["diagnostics"]))
        return real_step(module, *args, **kwargs)

    def build(objective, *args):
        built = real_build(objective, *args)
        objectives[id(built[0])] = objective
        batches[objective] = (len(built[2]["ids"]), built[2]["num_tokens"])
        return built

    monkeypatch.setattr(nan_fill, "step", clock.timed(step))
    monkeypatch.setattr(nan_fill, "build", build)
    monkeypatch.setattr(sys, "argv", ["nan_fill.py", "--device", "cpu", "--profile", str(profile), "--steps", "3",
                                      "--batch-size", "2", "--objectives", "nll", "score"])
    nan_fill.main()
    order = [True, False, False, True, True, False, False, True]
    assert steps == [("nll", fill, False) for fill in order] + [("score", fill, False) for fill in order]
    assert torch.utils.deterministic.fill_uninitialized_memory is False  # (the last step ran with it on)
    [(name, figures, settings, targets)] = written
    # nll: on 4, 2, 4 s; off 1, 1, 2 s; off over on 0.25, 0.5, 0.5. score: on 3, 6, 3; off 3, 2, 2; 1, 1/3, 2/3.
    assert figures == {"nll": {"fill_s_per_step": 4.0, "no_fill_s_per_step": 1.0, "ratio": 0.5, "ratio_quartiles": [0.25, 0.5]},
                       "score": {"fill_s_per_step": 3.0, "no_fill_s_per_step": 2.0, "ratio": 0.667, "ratio_quartiles": [0.333, 1.0]}}
    batch_size, tokens = batches["nll"]
    assert name == "nan_fill" and targets is None and batch_size == 2
    assert settings == {"precision": "32-true", "batch_size": 2, "tokens": tokens, "steps": 3, "deterministic": True,
                        "profiles": [str(profile)]}
    printed = capsys.readouterr().out
    assert "nll: 4.0000 s/step with the fill, 1.0000 without; paired ratio 0.500x (quartiles 0.250-0.500)" in printed
    assert f"batch of 2 ({tokens} tokens for nll); medians of 3 steps each way, alternating" in printed


def test_the_paired_step_bench_records_each_objectives_median_step_and_ratio_against_its_targets(tmp_path, monkeypatch, capsys):
    """bench/objective_pairs.py's main() with tiny models under bf16-mixed, on a clock of set ticks:
    the steps go round (a warm-up round, then each objective first in turn), each ratio the median
    of a round's step over NLL's of the same round; the record is named by its precision and
    carries the targets. An objective named twice is refused."""
    import objective_pairs

    profile, written = tiny_bench(objective_pairs, "", tmp_path, monkeypatch)
    # The rounds' steps in the order run: (nll, score) unmeasured, then (score, nll), (nll, score), (score, nll).
    clock = _StepClock([9, 9, 3, 1, 2, 2, 6, 2])
    monkeypatch.setattr(common, "clock", clock.read)
    diagnostics = []
    real_step = objective_pairs.step
    monkeypatch.setattr(objective_pairs, "step", clock.timed(lambda *args: (diagnostics.append(args[5]), real_step(*args))[1]))
    monkeypatch.setattr(sys, "argv", ["objective_pairs.py", "--device", "cpu", "--profile", str(profile), "--steps", "3",
                                      "--batch-size", "2", "--precision", "bf16-mixed", "--objectives", "nll", "score"])
    objective_pairs.main()
    [(name, figures, settings, targets)] = written
    assert diagnostics == [True] * 8  # (the train stage's step: its diagnostics computed)
    # nll 1, 2, 2 s; score 3, 2, 6 s; score over nll round by round 3, 1, 3.
    assert figures == {"nll": {"s_per_step": 2.0, "ratio": 1.0, "ratio_quartiles": [1.0, 1.0]},
                       "score": {"s_per_step": 3.0, "ratio": 3.0, "ratio_quartiles": [1.0, 3.0]}}
    assert name == "objective_pairs-bf16-mixed" and targets == {"score.ratio": {"max": 1.5}}
    assert {key: settings[key] for key in ("precision", "deterministic", "base", "batch_size", "steps", "profiles")} == {
        "precision": "bf16-mixed", "deterministic": True, "base": "nll", "batch_size": 2, "steps": 3, "profiles": [str(profile)]}
    assert settings["tokens"] > 0 and settings["peak_memory_gb"] > 0
    printed = capsys.readouterr().out
    assert f"the same batch of 2 ({settings['tokens']} tokens for nll) every step; 3 rounds" in printed
    assert "score          3.0000  3.000x   1.000-3.000  <= 1.5x" in printed and "nll            2.0000  1.000x" in printed
    monkeypatch.setattr(sys, "argv", ["objective_pairs.py", "--objectives", "nll", "score", "nll"])
    with pytest.raises(SystemExit, match="--objectives names one twice: nll score nll"):
        objective_pairs.main()
    assert len(written) == 1


@pytest.mark.slow
def test_the_startup_bench_times_each_stage_alone_then_side_by_side_and_refuses_a_stage_it_lacks(monkeypatch, capsys):
    """bench/stage_startup.py's main() on a real stage: its imports from a run under `-X
    importtime`, then the medians, on a clock of set ticks, of the runs alone and of the processes
    started together."""
    import types

    import stage_startup

    written = bench_records(stage_startup, monkeypatch)
    # Alone: started at 0, 10, 20, ended 2, 3, 7 s later; then three at once from 30, ended at 34, 35 and 39.
    ticks = iter([0, 2, 10, 13, 20, 27, 30, 34, 35, 39])
    monkeypatch.setattr(stage_startup, "time", types.SimpleNamespace(perf_counter=lambda: next(ticks)))
    monkeypatch.setattr(sys, "argv", ["stage_startup.py", "--stages", "significance", "--repeats", "3", "--side-by-side", "3"])
    stage_startup.main()
    [(name, figures, settings, targets)] = written
    assert (name, targets) == ("stage_startup", None) and settings == {"stages": ["significance"], "repeats": 3, "side_by_side": 3}
    [(stage, row)] = figures.items()
    packages = row.pop("top_packages")
    assert stage == "significance" and row.pop("imports_s") > 0
    assert row == {"alone_s": 3.0, "side_by_side_s": 5.0, "side_by_side_ratio": 1.67}
    assert 0 < len(packages) <= stage_startup.TOP_PACKAGES and list(packages.values()) == sorted(packages.values(), reverse=True)
    assert "significance   alone   3.00 s   3 at once   5.00 s (1.67x)   imports " in capsys.readouterr().out
    for bad, error in ((["--stages", "significance", "nope"], "--stages: no stage nope; valid: .* significance .*"),
                       (["--repeats", "0"], "--repeats and --side-by-side must be at least 1"),
                       (["--side-by-side", "0"], "--repeats and --side-by-side must be at least 1")):
        monkeypatch.setattr(sys, "argv", ["stage_startup.py", *bad])
        with pytest.raises(SystemExit, match=error):
            stage_startup.main()
    assert len(written) == 1


@pytest.mark.parametrize("mps_fails", [None, "nvidia-cuda-mps-control not found on PATH"])
def test_the_memory_share_bench_runs_each_setting_without_the_callers_allocator_and_through_mps_when_asked(
        mps_fails, tmp_path, monkeypatch, capsys):
    """bench/gpu_memory_share.py's main() (the GPU's parts stubbed): each setting's processes get
    the caller's environment less its allocator settings (the shared setting sets its own), with
    src/ on PYTHONPATH and, under --mps, the MPS client's variables where the server started; the
    server is stopped and its folder removed; a server that did not start is said in the record."""
    import types

    import gpu_memory_share

    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:128")
    monkeypatch.setenv("PYTORCH_ALLOC_CONF", "max_split_size_mb:64")
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    monkeypatch.setattr(gpu_memory_share.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(gpu_memory_share.torch.cuda, "get_device_properties", lambda index: types.SimpleNamespace(total_memory=80 * 2**30))
    folders, stopped = [], []

    def start(directory):
        folders.append(directory)
        return mps_fails

    monkeypatch.setattr(gpu_memory_share.nvidia_mps, "start", start)
    monkeypatch.setattr(gpu_memory_share.nvidia_mps, "stop", stopped.append)
    ran = []

    def run_setting(setting, processes, steps, env):
        ran.append((setting, processes, steps, env))
        each = [{"graphs": {"captured_graph": True}}] if setting == "shared" else [{}]
        return {"processes": processes, "out_of_memory": 0, "failed": 0, "peak_allocated_gb_max": 1.0,
                "peak_reserved_gb_max": 2.0, "peak_reserved_gb_sum": 4.0, "wall_s": 3.0, "each": each}

    monkeypatch.setattr(gpu_memory_share, "run_setting", run_setting)
    written = bench_records(gpu_memory_share, monkeypatch)
    monkeypatch.setattr(sys, "argv", ["gpu_memory_share.py", "--processes", "2", "--steps", "5", "--mps"])
    gpu_memory_share.main()
    [folder] = folders
    assert [(setting, processes, steps) for setting, processes, steps, _ in ran] == [("torch-default", 2, 5), ("shared", 2, 5)]
    env = ran[0][3]
    assert ran[1][3] == env and "PYTORCH_CUDA_ALLOC_CONF" not in env and "PYTORCH_ALLOC_CONF" not in env
    assert env["PYTHONPATH"] == os.pathsep.join([str(ROOT / "src"), "/elsewhere"])
    client = gpu_memory_share.nvidia_mps.client_env(folder)
    assert all(env.get(key) == (value if mps_fails is None else None) for key, value in client.items())
    assert stopped == ([folder] if mps_fails is None else []) and not folder.exists()
    [(name, figures, settings, targets)] = written
    assert (name, targets) == ("gpu_memory_share-mps", None) and figures["graphs"] == {"captured_graph": True} and figures["gpu_total_gb"] == 80.0
    assert settings["mps"] == ("on" if mps_fails is None else f"off: {mps_fails}") and (settings["processes"], settings["steps"]) == (2, 5)
    assert "shared: 2 processes, 0 out of memory, 0 failed; peak per process 1.0 GB handed out, 2.0 GB held" in capsys.readouterr().out
    monkeypatch.setattr(gpu_memory_share.torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(sys, "argv", ["gpu_memory_share.py"])
    with pytest.raises(InputError, match="needs a CUDA GPU"):
        gpu_memory_share.main()
    monkeypatch.setattr(sys, "argv", ["gpu_memory_share.py", "--processes", "0"])
    with pytest.raises(InputError, match="--processes and --steps must be whole numbers >= 1, got 0 and 200"):
        gpu_memory_share.main()


def test_the_lexical_bench_times_both_ways_on_the_same_pairs_and_refuses_values_that_differ(tmp_path, monkeypatch, capsys):
    """bench/lexical_metrics.py end to end on the first test instances, on a clock of set ticks:
    the libraries' plain calls and storyrewrite.metrics.lexical alternate each repeat, the medians
    are recorded with their ratio; values that differ from the libraries' end the bench."""
    import types

    import lexical_metrics

    monkeypatch.setattr(common, "CACHE", tmp_path)  # (the prepared data, where no `dvc repro` made it)
    written = bench_records(lexical_metrics, monkeypatch)
    # Each repeat: the plain calls, then the kept ones; plain 4, 7, 5 s; kept 1, 3, 2 s.
    ticks = iter([0, 4, 4, 5, 5, 12, 12, 15, 15, 20, 20, 22])
    monkeypatch.setattr(lexical_metrics, "time", types.SimpleNamespace(perf_counter=lambda: next(ticks)))
    monkeypatch.setattr(sys, "argv", ["lexical_metrics.py", "--instances", "9", "--repeats", "3"])
    lexical_metrics.main()
    [(name, figures, settings, targets)] = written
    assert (name, targets) == ("lexical_metrics", None) and settings == {"instances": 9, "repeats": 3, "profiles": []}
    assert figures == {"plain_s": 5.0, "kept_s": 2.0, "speedup": 2.5, "equal_values": True}
    assert "storyrewrite.metrics.lexical:       2.00 s (2.50x faster), the same values" in capsys.readouterr().out

    rouge_l = lexical_metrics.lexical.rouge_l
    monkeypatch.setattr(lexical_metrics.lexical, "rouge_l", lambda predictions, references: [v + 1e-9 for v in rouge_l(predictions, references)])
    monkeypatch.setattr(lexical_metrics, "time", types.SimpleNamespace(perf_counter=lambda: 0.0))
    monkeypatch.setattr(sys, "argv", ["lexical_metrics.py", "--instances", "3", "--repeats", "1"])
    with pytest.raises(SystemExit, match="lexical's values differ from the libraries' plain calls"):
        lexical_metrics.main()
    monkeypatch.setattr(sys, "argv", ["lexical_metrics.py", "--repeats", "0"])
    with pytest.raises(SystemExit, match="--repeats and --instances must be at least 1"):
        lexical_metrics.main()
    assert len(written) == 1


def test_the_validity_page_renders_each_runs_figures_as_on_file(tmp_path, monkeypatch):
    """`bench/metric_validity.py --render`: the page from the figures on file is the one committed
    (reports/metric_validity.md), written whole, in a folder of its own here, not the repository's;
    a second machine's run adds a section of its own."""
    import json

    import metric_validity

    (tmp_path / "reports" / "bench").mkdir(parents=True)
    figures = tmp_path / "reports" / "bench" / "metric_validity.json"
    runs = json.loads((ROOT / "reports" / "bench" / "metric_validity.json").read_text())
    figures.write_text(json.dumps(runs))
    monkeypatch.setattr(metric_validity, "ROOT", tmp_path)
    monkeypatch.setattr(sys, "argv", ["metric_validity.py", "--render"])
    metric_validity.main()
    page = (tmp_path / "reports" / "metric_validity.md").read_text(encoding="utf-8")
    assert page == (ROOT / "reports" / "metric_validity.md").read_text(encoding="utf-8")

    [run] = runs.values()
    gpu = {key: value for key, value in run.items() if not key.startswith("cpu_")} | {"device": "cuda:0", "device_name": "NVIDIA H200"}
    figures.write_text(json.dumps({**runs, "NVIDIA H200": gpu}))
    metric_validity.main()
    two = (tmp_path / "reports" / "metric_validity.md").read_text(encoding="utf-8")
    assert two.startswith(page.rstrip("\n")) and two.count("\n## ") == 2 and "\n## cuda:0 (NVIDIA H200)\n" in two


@pytest.mark.slow
def test_the_checkpoint_bench_saves_three_ways_then_kills_saves_and_finds_the_atomic_ones_readable(tmp_path, monkeypatch, capsys):
    """bench/checkpoint_save.py end to end with a tiny model: the training state after a step,
    each way of saving it timed, then processes killed while they save; every `last.ckpt` an
    atomic save left loads. Its scratch folder is gone afterwards."""
    import time
    import types

    import checkpoint_save

    profile = bench_profile(tmp_path, monkeypatch)
    monkeypatch.setattr(checkpoint_save, "inputs", lambda: common.inputs([profile]))
    monkeypatch.setattr(checkpoint_save, "WORK", tmp_path / "work")
    written = bench_records(checkpoint_save, monkeypatch)
    # Two clock reads a step, then a save: steps of 0.01 and 0.02 s; saves in the order run, the
    # second repeat's reversed: plain 0.02, Lightning's 0.03, atomic 0.025; atomic 0.035, Lightning's 0.03, plain 0.02.
    ticks = iter([0, 0.01, 0.01, 0.03, 0.03, 0.05, 0.05, 0.08, 0.08, 0.105, 0.105, 0.14, 0.14, 0.17, 0.17, 0.19])
    monkeypatch.setattr(checkpoint_save, "time", types.SimpleNamespace(perf_counter=lambda: next(ticks), sleep=time.sleep))
    monkeypatch.setattr(sys, "argv", ["checkpoint_save.py", "--repeats", "2", "--tries", "2", "--steps", "2"])
    checkpoint_save.main()
    [(name, figures, settings, targets)] = written
    assert name == "checkpoint_save" and settings == {"repeats": 2, "steps": 2} and not (tmp_path / "work").exists()
    assert set(figures["save_s"]) == {"plain torch.save", "Lightning TorchCheckpointIO", "AtomicCheckpointIO"}
    assert figures["kills"] == 2 and figures["unreadable_after_kill"]["atomic"] == 0
    # The medians: a step 0.015 s; plain 0.02, Lightning's 0.03, atomic 0.03 s; (0.03 - 0.02) / (0.015 + 0.02) = 2/7.
    assert figures["step_s"] == 0.015 and figures["save_s"] == {"plain torch.save": 0.02, "Lightning TorchCheckpointIO": 0.03,
                                                               "AtomicCheckpointIO": 0.03}
    assert figures["atomic_overhead_of_a_checkpointing_step"] == round(2 / 7, 4)
    assert targets == {"atomic_overhead_of_a_checkpointing_step": {"max": 0.05}, "unreadable_after_kill.atomic": {"max": 0}}
    printed = capsys.readouterr().out
    assert "atomic save overhead: +28.6 % of a checkpointing step" in printed and "kills during a save: atomic 0 of 2 unreadable" in printed


def test_the_coherence_bench_checks_the_batched_judge_and_times_the_score_stage_both_ways(tmp_path, monkeypatch, capsys):
    """bench/coherence.py end to end with tiny models, on a clock of set ticks: the batched CF-PMI
    agrees with one context at a time; the score stage's work alternates without and with the
    evaluators (the copy of the original ending where the pipeline made no such predictions); the
    ratio is the medians'. A judge whose batched values differ ends the bench."""
    import itertools

    import coherence

    profile, written = tiny_bench(coherence, "  judge: tiny:llama\n  embedder: tiny:roberta\n  nli: tiny:roberta-nli\n",
                                   tmp_path, monkeypatch)
    loads = []
    stage_work = coherence.stage_work
    monkeypatch.setattr(coherence, "stage_work", lambda params, pretrained, evaluators, *rest: (
        loads.append(evaluators is not None), stage_work(params, pretrained, evaluators, *rest))[1])
    # Two reads a timed pass: the batched judge 1 s, the loop 4 s; then the score stage without the
    # evaluators 2 s, with them 3 s; with them 5 s, without 2 s; without 4 s, with them 4 s.
    ticks = iter([0, 1, 1, 5, 5, 7, 7, 10, 10, 15, 15, 17, 17, 21, 21, 25])
    monkeypatch.setattr(coherence, "clock", lambda device: next(ticks))
    monkeypatch.setattr(sys, "argv", ["coherence.py", "--device", "cpu", "--instances", "6", "--system", "no-such-system",
                                      "--repeats", "3", "--profile", str(profile)])
    coherence.main()
    [(name, figures, settings, targets)] = written
    assert loads == [False, True, True, False, False, True]
    assert name == "coherence" and figures["judge_largest_difference"] <= 1e-5
    assert targets == {"score_stage_ratio": {"max": 1.6}, "judge_largest_difference": {"max": 1e-5}}  # (the bench's own check)
    # 12 pairs in 1 s and in 4 s; the stage without the evaluators 2, 2, 4 s, with them 3, 5, 4 s.
    assert {key: value for key, value in figures.items() if key != "judge_largest_difference"} == {
        "judge_batched_pairs_per_s": 12.0, "judge_loop_pairs_per_s": 3.0, "judge_speedup": 4.0,
        "score_stage_without_s": 2.0, "score_stage_with_s": 4.0, "score_stage_ratio": 2.0}
    assert {key: settings[key] for key in ("judge", "embedder", "nli", "judge_instances", "predictions", "repeats")} == {
        "judge": "tiny:llama", "embedder": "tiny:roberta", "nli": "tiny:roberta-nli", "judge_instances": 6,
        "predictions": "copy_original", "repeats": 3}
    assert "without the evaluators 2.00 s, with them 4.00 s (medians of 3): 2.00x (target <= 1.6x)" in capsys.readouterr().out

    cf_pmi = coherence.cf_pmi
    monkeypatch.setattr(coherence, "cf_pmi", lambda judge, rows, endings, *rest: [v + 1e-4 for v in cf_pmi(judge, rows, endings, *rest)])
    seconds = itertools.count()
    monkeypatch.setattr(coherence, "clock", lambda device: next(seconds))
    with pytest.raises(SystemExit, match=r"batched and one-at-a-time CF-PMI differ by \S+ > 1e-05") as ended:
        coherence.main()
    # The shift plus the judge's own batched-against-loop difference, which depends on the CPU's kernels.
    assert float(re.search(r"differ by (\S+)", str(ended.value)).group(1)) == pytest.approx(1e-4, abs=1e-5)
    assert len(written) == 1


def test_the_setup_bench_alternates_the_link_types_and_takes_dvcs_shares_from_a_profile(tmp_path, monkeypatch, capsys):
    """bench/experiment_setup.py's main() with DVC stubbed, on a clock of set ticks: the clone's
    dvc.lock removed, `cache.type` set before each experiment, copies and hardlinks alternating,
    their medians and ratio; the profiled run's shares are its cProfile file's cumulative times
    of DVC's lock rewrite and checkout over its wall time. Link types that ran other stages are
    not compared. Its scratch folder is removed."""
    import cProfile
    import importlib.util
    import types

    import experiment_setup

    (tmp_path / ".dvc" / "cache" / "runs").mkdir(parents=True)
    (tmp_path / ".cache").mkdir()
    monkeypatch.setattr(experiment_setup, "ROOT", tmp_path)
    clones = []

    def clone(into):
        into.mkdir(parents=True)
        (into / "dvc.lock").write_text("schema: '2.0'\n")
        clones.append(into)
        return into

    monkeypatch.setattr(experiment_setup, "clone_with_cache", clone)
    # DVC's own functions, as the profile names them (a file ending dvc/dvcfile.py and dvc/output.py),
    # and another package's function of the same name, which is not DVC's checkout.
    functions = {}
    for folder, module, source in (("dvc", "dvcfile", "import time\ndef _dump_lockfile():\n    time.sleep(0.4)\n"),
                                   ("dvc", "output", "import time\ndef checkout():\n    time.sleep(0.2)\n"),
                                   ("elsewhere", "elsewhere", "import time\ndef checkout():\n    time.sleep(0.2)\n")):
        path = tmp_path / folder / f"{module}.py"
        path.parent.mkdir(exist_ok=True)
        path.write_text(source)
        spec = importlib.util.spec_from_file_location(f"_fake_dvc_{module}", path)
        functions[module] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(functions[module])
    calls, ran = [], {"copy": "Running stage 'train':\n", "hardlink,copy": "Running stage 'train':\n"}

    def dvc(repo, *args, interpreter=()):
        calls.append((args, (repo / "dvc.lock").exists()))
        if args[:2] == ("config", "--local"):
            dvc.link = args[3]
        if args[:2] == ("exp", "run") and interpreter:
            profiler = cProfile.Profile()
            profiler.runcall(lambda: [function() for function in (functions["dvcfile"]._dump_lockfile, functions["output"].checkout,
                                                                  functions["elsewhere"].checkout)])
            profiler.dump_stats(interpreter[-1])
        return ran[dvc.link] if args[:2] == ("exp", "run") else ""

    monkeypatch.setattr(experiment_setup, "dvc", dvc)
    written = bench_records(experiment_setup, monkeypatch)
    # Two reads an experiment, each repeat copies then hardlinks: 10 s, 4 s; 12 s, 6 s; 20 s, 5 s; profiled 2 s.
    ticks = iter(map(float, [0, 10, 10, 14, 14, 26, 26, 32, 32, 52, 52, 57, 57, 59]))
    monkeypatch.setattr(experiment_setup, "time", types.SimpleNamespace(perf_counter=lambda: next(ticks)))
    monkeypatch.setattr(sys, "argv", ["experiment_setup.py", "--repeats", "3"])
    experiment_setup.main()
    [(name, figures, settings, targets)] = written
    links = [args[3] for args, _ in calls if args[:2] == ("config", "--local")]
    assert links == ["copy", "hardlink,copy"] * 3 + ["copy"]
    runs = [(args[4], lock) for args, lock in calls if args[:2] == ("exp", "run")]
    assert runs == [(f"setup-{link}-{repeat}", False) for repeat in range(3) for link in ("copy", "hardlink")] + [("setup-profiled", False)]
    assert figures["wall_s"] == {"copy": 12.0, "hardlink": 5.0} and figures["hardlink_over_copy"] == round(5 / 12, 3)
    assert figures["stages_run"] == ["train"] and figures["profiled"]["wall_s"] == 2.0 and settings["repeats"] == 3
    assert figures["profiled"]["lock_dump_share"] == pytest.approx(0.4 / 2, abs=0.04)
    assert figures["profiled"]["checkout_share"] == pytest.approx(0.2 / 2, abs=0.04)
    assert not clones[0].parent.exists() and (name, targets) == ("experiment_setup", None)
    assert "copies 12.0 s, hardlinks 5.0 s (0.42x)" in capsys.readouterr().out

    written.clear()
    ran["hardlink,copy"] = ""  # restored whole with hardlinks: other work than with copies
    ticks = iter(map(float, range(0, 100, 2)))
    with pytest.raises(SystemExit, match="the link types ran different stages"):
        experiment_setup.main()
    assert written == [] and not clones[1].parent.exists()
