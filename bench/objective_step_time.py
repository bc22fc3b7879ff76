"""Training step time of each objective against NLL, the cost of the logged diagnostics, peak
memory and (CUDA) how busy the GPU is: the same model and the same batch every step, measured in
one run of this script.

    python bench/objective_step_time.py [--device auto] [--precision 32-true] [--batch-size N]
        [--steps 4] [--repeats 2] [--objectives nll score score_delta] [--profile params/gpu.yaml] [--trace DIR]
        [--profile-steps 4]
        [--compile] [--side-by-side N] [--name NAME]

Targets: DTO-Score / NLL <= 1.5x and DTO-Score+Delta / NLL <= 1.8x (CPU; GPU in bf16-mixed);
diagnostics <= 5 % of a step; on CUDA, the GPU busy >= 60 % of a step (common.GPU_BUSY_TARGET). RLOO (`--objectives nll score score_delta rloo`: the params' `rl`
section, its reward `rl.reward`) has no target: its ratio and the share of its step spent
sampling (`sample share`: the sampling's time over the step's, steps with diagnostics) are the
result; with `rl.cache=static`, `decoding graphs` is how many graphs its samplings compiled (0:
the timed and profiled steps decoded eagerly). Figures go to reports/bench/objective_step_time.json (`-bf16-mixed`, `-compiled` added
for those runs; `--name` names another file, so that a run of other objectives keeps the
targets' run beside it).

A step is what the train stage's step does, under the stage's torch flags (its Trainer's
`deterministic`: deterministic algorithms only, cuBLAS's fixed workspace): the loss with its terms
and diagnostics, backward, the gradient norm, AdamW (fused on CUDA), and one device-to-host copy of
the logged values; `--precision bf16-mixed` runs the forward under autocast as Lightning does. Each objective runs
in a process of its own (as in training, only its models are resident; its peak memory is its
own), the objectives one after the other, the whole sequence `--repeats` times so that a machine
whose speed drifts slows them alike; a step time is the mean over the repeats of each process's
median, and each repeat's own ratios are printed beside it. The diagnostics' cost is timed on
their own work rather than as the difference of two step times (steps drift by more than the 5 %
to be resolved): inside a process every other step is instrumented, the device synchronised
around the objective's diagnostics, the gradient norm and the logged values' copy to the host,
and the time they take is set against the plain steps' median (`diagnostics`: a step with them
over the same step without them). On CUDA the torch profiler then runs a few more
steps (`--profile-steps`) and gives the share of their wall time during which GPU kernels ran ("GPU busy"); --trace
writes the first repeat's operator table and Chrome trace. A line as each process ends gives its
step time and where its time went (building the models, the steps, counting the operators, the
profiler; the rest is the process's start), so that a run cut short keeps what it measured.
Every eager run counts the aten operators of one step but the optimiser's (`ops/step`, views left
out): about one GPU kernel launch each (the count varies with the device, the objectives' ratios
of it much less), so that a CPU shows the ratio a launch-bound GPU step follows; and the
floating-point operations of the same step's matrix products and attention (`GFLOP/step`, torch's
FlopCounterMode): the ratio a step whose GPU is never idle tends to, where the arithmetic, not
the launches, sets the time. `--compile` runs the steps as `compile: true` trains (torch.compile
of the transformer bodies); the first step, which the timings leave out, then includes the
compilation, and its time is printed. `--side-by-side N` starts N processes of each objective at
once, as N queue workers share one GPU, and takes the median one's figures (a file of its own,
`-side-by-sideN`): what a step costs a worker when the device is shared. `--mps` runs those N
processes through NVIDIA's Multi-Process Service (storyrewrite.mps, as `COMPARISON_MPS=1` runs a
comparison's workers; a file of its own, `-mps`): set against the same run without it, what MPS
changes.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from common import GPU_BUSY_TARGET, clock, count_syncs, describe, gpu_busy, nan_fill, peak_memory_gb, record_name, train_run, write_result
from lightning.fabric.utilities.apply_func import move_data_to_device
from lightning.pytorch.trainer.connectors.accelerator_connector import _set_torch_flags
from torch.utils import flop_counter
from torch.utils._python_dispatch import TorchDispatchMode

from storyrewrite import mps
from storyrewrite.io import run_cli
from storyrewrite.models.device import resolve_device
from storyrewrite.objectives.registry import OBJECTIVES
from storyrewrite.params import TrainConfig
from storyrewrite.training.monitor import read_logs
from storyrewrite.training.run import assemble, trainer_kwargs, without_nan_fill


def stage_flags(config: TrainConfig) -> bool:
    """Set torch's flags as the train stage's Trainer sets them, through the same Lightning
    function, from the same `deterministic` (training.run.trainer_kwargs); return it. With it
    torch runs deterministic algorithms only (on CUDA: never cuDNN's attention; deterministic
    backward kernels) and cuBLAS a fixed workspace, which a step's time depends on."""
    deterministic = trainer_kwargs(config)["deterministic"]
    _set_torch_flags(deterministic=deterministic)
    without_nan_fill()  # as the stage's fit: deterministic algorithms, new tensors left unfilled
    return deterministic


def build(objective: str, args, device: torch.device):
    """(module on the device, its optimiser, the fixed batch on the device), under the train
    stage's torch flags (set before any model touches the device: cuBLAS reads its workspace
    setting when it starts)."""
    # The precision too, as the stage's module reads it (under bf16-mixed, frozen models hold their linear weights in bf16).
    run = train_run(args.profile, objective, sets=args.set, compile=args.compile, precision=args.precision,
                    **({"batch_size": args.batch_size} if args.batch_size else {}))
    stage_flags(run.config)
    module, datamodule = assemble(run)
    datamodule.setup()
    # The same batch for every objective, on the device as Lightning would move it.
    batch = move_data_to_device(datamodule.collate(datamodule.train_rows[: run.config.batch_size]), device)
    module.to(device)
    module.on_fit_start()  # the frozen scorer to the device
    return module, module.configure_optimizers()["optimizer"], batch


class OpCounter(TorchDispatchMode):
    """Counts the aten operators dispatched while active, by name, views left out (they launch no
    kernel): on a GPU each of the others launches one kernel or a few, so that a step whose host
    cannot keep the GPU busy takes time in proportion to their number. An operator that calls
    others inside its own kernel (a slice_backward's zero fill and copy) counts once. torch has no
    such counter short of the profiler, whose events also list those inner calls, and the
    wrappers that launch nothing (`aten::to`, `aten::linear`)."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not func.is_view:
            self.counts[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))

    @property
    def ops(self) -> int:
        return sum(self.counts.values())


# torch's FlopCounterMode has formulas for the GPU's attention kernels (flash, memory-efficient,
# cuDNN) but not for the CPU's (torch 2.13): theirs, so that a step counts the same on any device.
# Like torch's, they count attention in full, a causal mask's skipped half included.
CPU_ATTENTION_FLOPS = {
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu:
        lambda query, key, value, *args, out_shape=None, **kwargs: flop_counter.sdpa_flop_count(query, key, value),
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward:
        lambda grad_out, query, key, value, *args, out_shape=None, **kwargs:
            flop_counter.sdpa_backward_flop_count(grad_out, query, key, value),
}


def count_flops(work) -> int:
    """The floating-point operations of the matrix products (and attention) that `work()`
    dispatches, by torch's FlopCounterMode (2 a multiply-add; elementwise work is not counted):
    the arithmetic a step would take if the GPU were never idle, against which the launch-bound
    time of an eager step can be set."""
    with flop_counter.FlopCounterMode(display=False, custom_mapping=CPU_ATTENTION_FLOPS) as counter:
        work()
    return counter.get_total_flops()


def step(module, optimizer, batch, device: torch.device, precision: str, diagnostics: bool, timed: list | None = None,
         optimise: bool = True, read: bool = True) -> None:
    """One training step; with `timed`, the seconds of the diagnostics' own work are appended to it
    (the device synchronised around each part, so only an instrumented step pays for that);
    `optimise: False` leaves the parameters as they were (the gradients are dropped); `read:
    False` leaves the logged values on the device (the monitor reads them a step later)."""
    module.diagnostics = diagnostics
    autocast = (torch.autocast(device.type, dtype=torch.bfloat16) if precision == "bf16-mixed"
                else contextlib.nullcontext())
    spent = [0.0]

    def part(work):
        if timed is None:
            return work()
        started = clock(device)
        result = work()
        spent[0] += clock(device) - started
        return result
    if timed is not None:
        compute = module.loss.compute

        def instrumented(*args):  # the objective's diagnostics closure, timed where step_loss calls it
            out = compute(*args)
            return dataclasses.replace(out, diagnostics=lambda: part(out.diagnostics))
        module.loss = dataclasses.replace(module.loss, compute=instrumented)
    try:
        with autocast:
            loss = module.step_loss(batch)
    finally:
        if timed is not None:
            module.loss = dataclasses.replace(module.loss, compute=compute)
    loss.backward()
    part(lambda: module.on_before_optimizer_step(optimizer))  # the gradient norm, with diagnostics
    if optimise:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if diagnostics and read:  # the monitor's one device-to-host copy per step
        part(lambda: read_logs(module.step_logs))
    if timed is not None:
        timed.append(spent[0])


def measure(objective: str, args) -> dict:
    """One objective in this process: medians with and without diagnostics, peak memory, GPU busy."""
    device = resolve_device(args.device)
    torch.manual_seed(0)
    started = time.perf_counter()
    module, optimizer, batch = build(objective, args, device)
    phases = {"build_s": time.perf_counter() - started}  # where a process's time goes, beside its imports
    stepping = started = clock(device)
    step(module, optimizer, batch, device, args.precision, True)  # allocates the optimiser state (and compiles)
    first_step = clock(device) - started
    times, diagnostics_seconds = [], []
    sample_shares, read_shares = [], []  # an objective that samples (RLOO): its sampling's share of the step, and its read's
    for _ in range(args.steps):
        started = clock(device)
        step(module, optimizer, batch, device, args.precision, True)
        times.append(clock(device) - started)
        if "sample_seconds" in module.step_logs:
            sample_shares.append(float(module.step_logs["sample_seconds"]) / times[-1])
            read_shares.append(float(module.step_logs["sample_read_seconds"]) / times[-1])
        step(module, optimizer, batch, device, args.precision, True, timed=diagnostics_seconds)
    phases["steps_s"] = clock(device) - stepping  # the first step, the timed ones and the instrumented ones
    median = statistics.median(times)
    result = {"with": median, "without": median - statistics.median(diagnostics_seconds), "first": first_step,
              "sample_share": statistics.median(sample_shares) if sample_shares else None,
              "sample_read_share": statistics.median(read_shares) if read_shares else None,
              "peak_memory_gb": peak_memory_gb(device), "device": describe(device),
              "batch_size": len(batch["ids"]), "tokens": batch["num_tokens"],
              "deterministic": torch.are_deterministic_algorithms_enabled(),
              "nan_fill": nan_fill()}
    if device.type == "cuda":
        profiling = time.perf_counter()  # the profiler's own start and post-processing included
        result["gpu_busy"], profiler = gpu_busy(lambda: step(module, optimizer, batch, device, args.precision, True),
                                                device, args.profile_steps)
        # Inside a step: the monitor's read of its values comes after the next step's launches.
        result["syncs"] = count_syncs(lambda: step(module, optimizer, batch, device, args.precision, True, read=False))
        if args.trace:
            averages = profiler.key_averages()
            Path(args.trace).mkdir(parents=True, exist_ok=True)
            (Path(args.trace) / f"{objective}.txt").write_text(averages.table(sort_by="self_device_time_total", row_limit=30))
            profiler.export_chrome_trace(str(Path(args.trace) / f"{objective}.json"))
        phases["profile_s"] = time.perf_counter() - profiling
    # RLOO with `rl.cache: static`: the graphs its samplings compiled so far (0 where the timed and
    # profiled steps decoded eagerly).
    result["decoding_graphs"] = float(module.step_logs["decoding_graphs"]) if "decoding_graphs" in module.step_logs else None
    # The counts last: they dispatch the step under torch dispatch modes, and dynamo skips a
    # compiled function's code for the rest of the process once it was called under one (torch
    # 2.13: "non-infra torch dispatch mode present", applied to the code). RLOO's decoding step,
    # which transformers compiles on a GPU with `rl.cache: static`, would run eagerly in the
    # profiled steps after them.
    if not args.compile:  # (a compiled body's kernels are its own, and a dispatch mode would change how it runs)
        # The operators of one step but the optimiser's (the same for every objective, and fused
        # into a few kernels on CUDA, where a CPU's AdamW runs a dozen per parameter tensor).
        started = time.perf_counter()
        with OpCounter() as counter:
            step(module, optimizer, batch, device, args.precision, True, optimise=False)
        result["ops"] = counter.ops
        phases["ops_s"] = time.perf_counter() - started
        started = time.perf_counter()  # (a pass of its own: the FLOP counter decomposes operators it has no formula for)
        result["flops"] = count_flops(lambda: step(module, optimizer, batch, device, args.precision, True, optimise=False))
        phases["flops_s"] = time.perf_counter() - started
    return result | {"phases": phases}


def result_name(args: argparse.Namespace) -> str:
    """The figures' file in reports/bench/ (without .json): `--name`, else one per precision and
    compilation, each a run of its own."""
    return args.name or ("objective_step_time" + ("" if args.precision == "32-true" else f"-{args.precision}")
                         + ("-compiled" if args.compile else "") + ("-reduce-overhead" if args.compile == "reduce-overhead" else "")
                         + (f"-side-by-side{args.side_by_side}" if args.side_by_side > 1 else "") + ("-mps" if args.mps else ""))


def add_build_arguments(parser: argparse.ArgumentParser) -> None:
    """The options `build` reads (--compile apart), for this bench and those that build as it does."""
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    parser.add_argument("--precision", default="32-true", choices=("32-true", "bf16-mixed"))
    parser.add_argument("--batch-size", type=int, help="default: the params' train.batch_size")
    parser.add_argument("--profile", type=Path, action="append", default=[], help="params overlay(s), e.g. params/gpu.yaml")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a params key set after the overlays, as `-S` sets it (e.g. rl.cache=static)")


def overlay_settings(args: argparse.Namespace) -> dict:
    """The params a bench built with `add_build_arguments` ran on, for its figures' settings."""
    return {"profiles": [str(p) for p in args.profile], **({"set": args.set} if args.set else {})}


def add_objectives_argument(parser: argparse.ArgumentParser, default: list[str], meaning: str) -> None:
    parser.add_argument("--objectives", nargs="+", default=default, choices=sorted(OBJECTIVES), metavar="OBJECTIVE",
                        help=f"{meaning}; valid: {', '.join(OBJECTIVES)}")


def interleaved_arguments(doc: str, steps_help: str, objectives: list[str], objectives_help: str) -> argparse.ArgumentParser:
    """The command line of a bench that builds eager steps as `build` does and times them
    interleaved in one process (bench/nan_fill.py, bench/objective_pairs.py); `check_steps`
    refuses a --steps below 1."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_build_arguments(parser)
    parser.add_argument("--steps", type=int, default=12, help=steps_help)
    add_objectives_argument(parser, objectives, objectives_help)
    parser.set_defaults(compile=False)  # what `build` reads
    return parser


def check_steps(args: argparse.Namespace) -> None:
    if args.steps < 1:
        raise SystemExit(f"error: --steps must be at least 1, not {args.steps}")


def arguments() -> argparse.ArgumentParser:
    """The command line (scripts/gpu_bench.sh's calls are parsed by it in the tests)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_build_arguments(parser)
    parser.add_argument("--steps", type=int, default=4, help="timed steps per process (and as many with the diagnostics' parts timed)")
    parser.add_argument("--repeats", type=int, default=2, help="times the whole sequence of objectives is measured")
    add_objectives_argument(parser, ["nll", "score", "score_delta"], "the first is the base of every ratio")
    parser.add_argument("--trace", help="write the profiler's operator table and trace per objective here (CUDA)")
    # The profiler's cost grows with a step's operators, not its time: a RLOO step (decoded a token
    # at a time) dispatches ~20x an NLL step's, and four of them under the profiler gave 1.5 million
    # events whose operator table took 87 s to build on the 2-core CPU (NLL's: 8 s).
    parser.add_argument("--profile-steps", type=int, default=4,
                        help="steps run under the profiler for the GPU busy share and the --trace tables (CUDA)")
    parser.add_argument("--compile", nargs="?", const=True, default=False, choices=(True, "reduce-overhead"),
                        help="torch.compile the transformer bodies, as `compile: true` trains (`--compile reduce-overhead`: "
                             "as `compile: reduce-overhead`, CUDA graphs)")
    parser.add_argument("--side-by-side", type=int, default=1, metavar="N",
                        help="run N processes of each objective at once, as N queue workers share a GPU: a step time is "
                             "the median of theirs")
    parser.add_argument("--mps", action="store_true", help="run the --side-by-side processes through NVIDIA's MPS "
                        "(storyrewrite.mps): the bench fails where it cannot start")
    parser.add_argument("--name", type=record_name, help="the figures' file in reports/bench/ (default: objective_step_time, with -PRECISION "
                        "and -compiled where not 32-true and eager): a run of its own there, each device's last")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # internal: measure one objective, print JSON
    return parser


def main() -> None:
    args = arguments().parse_args()
    if args.profile_steps < 1:
        raise SystemExit(f"error: --profile-steps must be at least 1, not {args.profile_steps}")
    if args.side_by_side < 1:
        raise SystemExit(f"error: --side-by-side must be at least 1, not {args.side_by_side}")
    if args.mps and args.side_by_side < 2:
        raise SystemExit("error: --mps shares the device between --side-by-side processes: give --side-by-side 2 or more")
    if args.one:
        print(json.dumps(measure(args.one, args)))
        return
    if not args.mps:
        measure_all(args, dict(os.environ))
        return
    with tempfile.TemporaryDirectory(prefix="mps-") as folder:
        if (why := mps.start(Path(folder))) is not None:
            raise SystemExit(f"error: --mps: NVIDIA's MPS did not start: {why}")
        try:
            measure_all(args, {**os.environ, **mps.client_env(Path(folder))})
        finally:
            mps.stop(Path(folder))


def warnings_of(stderrs: list[str], known: list[str]) -> list[str]:
    """The `warning: ` lines of processes' error outputs that `known` does not hold yet, in order, once
    each: what a process said it did instead of what was asked (RLOO's static cache falling back
    to the dynamic one, say), which the figures then measure."""
    found = []
    for line in (line.strip() for err in stderrs for line in err.splitlines()):
        if line.startswith("warning: ") and line not in known and line not in found:
            found.append(line)
    return found


def measure_all(args: argparse.Namespace, env: dict[str, str]) -> None:
    """Every objective's processes (`--side-by-side` at once) with the environment `env`, and the figures."""
    runs: dict[str, list[dict]] = {objective: [] for objective in args.objectives}
    failed: dict[str, str] = {}  # an objective whose process failed -> the end of its error output
    warned: dict[str, list[str]] = {}  # an objective -> its processes' warnings (warnings_of), kept in the record
    for repeat in range(args.repeats):
        for objective in [o for o in args.objectives if o not in failed]:
            command = [sys.executable, __file__, "--one", objective, "--device", args.device, "--precision", args.precision,
                       "--steps", str(args.steps), "--profile-steps", str(args.profile_steps), *sum((["--profile", str(p)] for p in args.profile), []),
                       *sum((["--set", pair] for pair in args.set), [])]
            command += ["--batch-size", str(args.batch_size)] if args.batch_size else []
            command += ["--compile"] + ([args.compile] if isinstance(args.compile, str) else []) if args.compile else []
            # The first repeat's profile is the one written: a Chrome trace of a GPU step is tens of
            # MB, and writing it again costs each later process seconds for the same table.
            trace = ["--trace", args.trace] if args.trace and repeat == 0 else []
            started = time.perf_counter()
            # --side-by-side N: N processes at once (the first alone writes the trace), each a
            # worker's share of the device; the row is the median process by step time.
            processes = [subprocess.Popen(command + (trace if n == 0 else []), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                          text=True, env=env) for n in range(args.side_by_side)]
            outputs = [(p, *p.communicate()) for p in processes]
            seconds = time.perf_counter() - started
            if bad := next(((p, err) for p, _, err in outputs if p.returncode != 0), None):
                # The others are still measured (a GPU's time is not spent for nothing);
                # without the base objective there is no ratio to give.
                failed[objective] = bad[1][-3000:]
                print(f"{objective}: its process failed (exit {bad[0].returncode}):\n{failed[objective]}", file=sys.stderr)
                if objective == args.objectives[0]:
                    raise SystemExit(f"error: {objective}, the base of every ratio, failed")
                continue
            for line in warnings_of([err for _, _, err in outputs], warned.get(objective, [])):
                warned.setdefault(objective, []).append(line)
                print(f"{objective}: {line}", file=sys.stderr, flush=True)
            rows = sorted((json.loads(out.strip().splitlines()[-1]) for _, out, _ in outputs), key=lambda r: r["with"])
            runs[objective].append(rows[len(rows) // 2])
            # A line as each process ends: a run cut short keeps what it
            # measured, and the phases show where a process's time goes (the rest is its start:
            # imports, the device's initialisation).
            row = runs[objective][-1]
            print(f"{objective} (repeat {repeat + 1}/{args.repeats}): {row['with']:.4f} s/step"
                  + (f", {row['ops']} ops/step" if "ops" in row else "") + f"; process {seconds:.0f} s: "
                  + ", ".join(f"{name.removesuffix('_s')} {value:.1f} s" for name, value in row["phases"].items()), flush=True)
    objectives = [o for o in args.objectives if o not in failed]
    runs = {objective: runs[objective] for objective in objectives}

    def mean(objective: str, key: str) -> float:
        return statistics.mean(r[key] for r in runs[objective])

    base, first = objectives[0], runs[objectives[0]][0]
    busy = "gpu_busy" in first
    print(f"{first['device']}; precision {args.precision}; {'compiled' if args.compile else 'eager'}; the same batch of {first['batch_size']} ({first['tokens']} tokens "
          f"for {base}) every step; means over {args.repeats} repeats of per-process medians of {args.steps} steps"
          + (f"; {args.side_by_side} processes of each objective at once (the median one's)" if args.side_by_side > 1 else ""))
    sampling = any(r["sample_share"] is not None for rows in runs.values() for r in rows)
    width = max(18, 5 * args.repeats + 3)  # the per-repeat column: 5 characters a repeat
    counted = "ops" in first
    print(f"{'objective':<12}{'s/step':>9}{'ratio':>8}{'per repeat':>{width}}{'peak mem GB':>13}{'diagnostics':>13}{'first step':>12}"
          + (f"{'sample share':>14}{'read share':>12}" if sampling else "") + (f"{'GPU busy':>10}" if busy else "")
          + (f"{'ops/step':>10}{'ops ratio':>11}{'GFLOP/step':>12}{'FLOP ratio':>12}{'TFLOP/s':>9}" if counted else ""))
    # Each figure once, unrounded: the record rounds it to its digits (None: to an integer), the
    # table formats the same value.
    digits = {"s_per_step": 4, "ratio": 3, "ratio_per_repeat": 3, "peak_memory_gb": 2, "diagnostics_ratio": 3,
              "first_step_s": 2, "sample_share": 3, "sample_read_share": 3, "gpu_busy": 3, "syncs_per_step": None, "ops_per_step": None, "ops_ratio": 3,
              "gflop_per_step": 3, "tflop_per_s": 4, "flop_ratio": 3, "decoding_graphs": None}
    figures = {}
    for objective in objectives:
        share = statistics.mean(r["sample_share"] for r in runs[objective]) if runs[objective][0]["sample_share"] is not None else None
        # (the time the sampling's last read waited: without early stop, for the decoding the host had queued)
        read = statistics.mean(r["sample_read_share"] for r in runs[objective]) if share is not None else None
        v = {
            "s_per_step": mean(objective, "with"), "ratio": mean(objective, "with") / mean(base, "with"),
            "ratio_per_repeat": [r["with"] / b["with"] for r, b in zip(runs[objective], runs[base], strict=True)],
            "peak_memory_gb": max(r["peak_memory_gb"] for r in runs[objective]),
            "diagnostics_ratio": mean(objective, "with") / mean(objective, "without"),
            "first_step_s": mean(objective, "first"),
            **({"sample_share": share, "sample_read_share": read} if share is not None else {}),
            **({"gpu_busy": mean(objective, "gpu_busy"), "syncs_per_step": max(r["syncs"] for r in runs[objective])} if busy else {}),
            # (RLOO with a static cache: the fewest graphs a run's samplings compiled; 0, it decoded eagerly)
            **({"decoding_graphs": min(r["decoding_graphs"] for r in runs[objective])}
               if runs[objective][0].get("decoding_graphs") is not None else {}),
            **({"ops_per_step": mean(objective, "ops"), "ops_ratio": mean(objective, "ops") / mean(base, "ops"),
                "gflop_per_step": mean(objective, "flops") / 1e9,
                # the arithmetic's rate: far below the device's matrix units', the step waits on something else
                "tflop_per_s": mean(objective, "flops") / mean(objective, "with") / 1e12,
                "flop_ratio": mean(objective, "flops") / mean(base, "flops")} if counted else {}),
        }
        figures[objective] = {name: [round(x, digits[name]) for x in value] if isinstance(value, list) else round(value, digits[name])
                              for name, value in v.items()}
        print(f"{objective:<12}{v['s_per_step']:>9.3f}{v['ratio']:>7.2f}x"
              f"{' '.join(f'{r:.2f}' for r in v['ratio_per_repeat']):>{width}}{v['peak_memory_gb']:>13.2f}"
              f"{v['diagnostics_ratio']:>12.3f}x{v['first_step_s']:>11.1f}s"
              + ((f"{share:>13.0%}{read:>11.0%}" if share is not None else f"{'-':>14}{'-':>12}") if sampling else "")
              + (f"{v['gpu_busy']:>9.0%}" if busy else "")
              + (f"{v['ops_per_step']:>10.0f}{v['ops_ratio']:>10.2f}x{v['gflop_per_step']:>12.2f}{v['flop_ratio']:>11.2f}x"
                 f"{v['tflop_per_s']:>9.3f}" if counted else "")
              + (f"  decoding graphs {v['decoding_graphs']:.0f}" if "decoding_graphs" in v else ""))
    print(f"ratio: s/step against {base}'s; per repeat: the same within each repeat of the sequence (its spread is the "
          f"machine's drift); diagnostics: s/step with them / without them (their own work timed); peak memory: "
          f"{'allocated by torch on the GPU' if busy else 'the process RSS'}; first step: the untimed step before them "
          f"(optimiser state{', compilation' if args.compile else ''})"
          + ("; ops/step: aten operators of a step but the optimiser's, views left out (about one GPU kernel launch "
             "each: a step the host cannot keep the GPU busy for takes time in proportion); GFLOP/step: the same work's "
             "matrix products and attention (the arithmetic a step never left waiting on its launches would take in "
             "proportion); TFLOP/s: that arithmetic over the step time, the rate the step ran it at" if counted else ""))
    targets = {f"{o}.ratio": {"max": {"score": 1.5, "score_delta": 1.8}[o]} for o in figures if o in ("score", "score_delta")}
    targets |= {f"{o}.diagnostics_ratio": {"max": 1.05} for o in figures}
    if busy:  # the GPU's share of a training step's wall time
        targets |= {f"{o}.gpu_busy": {"min": GPU_BUSY_TARGET} for o in figures}
        targets |= {f"{o}.syncs_per_step": {"max": 0} for o in figures if o != "rloo"}  # (RLOO's rewards are the host's)
    write_result(result_name(args), resolve_device(args.device), figures,
                 {"precision": args.precision, "compile": args.compile, "deterministic": first["deterministic"],
                  "nan_fill": first["nan_fill"], "batch_size": first["batch_size"],
                  "tokens": first["tokens"], "steps": args.steps, "repeats": args.repeats, "base": base,
                  **({"profile_steps": args.profile_steps} if busy else {}),
                  **({"side_by_side": args.side_by_side} if args.side_by_side > 1 else {}), **({"mps": True} if args.mps else {}),
                  **overlay_settings(args), **({"failed": sorted(failed)} if failed else {}),
                  **({"warnings": {o: warned[o] for o in objectives if o in warned}} if any(o in warned for o in objectives) else {})},
                 targets)
    if failed:
        raise SystemExit(f"error: these objectives failed (their errors above): {', '.join(failed)}")


if __name__ == "__main__":
    run_cli(main)
