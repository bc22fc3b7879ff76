"""Compiled training steps against the eager step, at several batch sizes: what `compile: true`
or `compile: reduce-overhead` (CUDA graphs) gives a step of each objective.

    python bench/compiled_steps.py [--device auto] [--precision bf16-mixed] [--profile params/gpu.yaml]
        [--mode reduce-overhead] [--batch-sizes 16 32 64] [--objectives nll score score_delta]
        [--steps 8] [--profile-steps 4] [--backend inductor]

Each objective runs in a process of its own. Its eager step at the first batch size is timed;
the FLOPs of its matrix products and attention are counted at every batch size. Then its
transformer bodies are compiled in place, as the train stage compiles them, and every batch size
is timed. A timing is the mean of `--steps` steps run back to back, each step's logged values read
after the next step's launches (as the train stage's monitor reads them). On CUDA the profiler
gives the share of compiled steps' wall time during which kernels ran (GPU busy), and torch's
sync debug mode counts the times a step makes the host wait (`syncs_per_step`).

Targets on CUDA: NLL's tokens/s compiled at least 5x its eager tokens/s, at its best batch size;
at every batch size, a DTO step's time over NLL's within 1.15x of their FLOP ratio; GPU busy at
least 60 %; no sync inside a step. The learning rate changes no step's time: whether a larger
batch trains as well with its lr scaled is a sweep's question (docs/gpu.md). Figures go to
reports/bench/compiled_steps.json (`--name` names another file).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import torch
from common import GPU_BUSY_TARGET, clock, count_syncs, describe, gpu_busy, peak_memory_gb, record_name, train_run, write_result
from lightning.fabric.utilities.apply_func import move_data_to_device
from objective_step_time import add_build_arguments, add_objectives_argument, count_flops, overlay_settings, stage_flags, step

from storyrewrite.io import run_cli
from storyrewrite.models.device import resolve_device
from storyrewrite.training.compile import compile_body
from storyrewrite.training.monitor import read_logs
from storyrewrite.training.run import assemble

DTO_OBJECTIVES = ("score", "delta", "score_delta")


def timed(module, optimizer, batch, device: torch.device, precision: str, steps: int) -> tuple[float, float]:
    """(seconds per step over `steps` back-to-back steps, the seconds of the untimed first step
    before them: optimiser state, compilation, a CUDA graph's recording)."""
    started = clock(device)
    step(module, optimizer, batch, device, precision, True)
    first = clock(device) - started
    started = clock(device)
    for _ in range(steps):
        logs = module.step_logs
        step(module, optimizer, batch, device, precision, True, read=False)
        read_logs(logs)  # the previous step's, after this one's launches: the monitor's order
    read_logs(module.step_logs)
    return (clock(device) - started) / steps, first


def measure(objective: str, args) -> dict:
    device = resolve_device(args.device)
    torch.manual_seed(0)
    run = train_run(args.profile, objective, sets=args.set, precision=args.precision, batch_size=max(args.batch_sizes))
    stage_flags(run.config)
    module, datamodule = assemble(run)
    datamodule.setup()
    module.to(device)
    module.on_fit_start()
    optimizer = module.configure_optimizers()["optimizer"]
    batches = {size: move_data_to_device(datamodule.collate(datamodule.train_rows[:size]), device) for size in args.batch_sizes}
    base = args.batch_sizes[0]
    seconds, first = timed(module, optimizer, batches[base], device, args.precision, args.steps)
    result = {"eager": {"batch_size": base, "s_per_step": seconds, "tokens_per_s": batches[base]["num_tokens"] / seconds,
                        "first_step_s": first}, "device": describe(device)}
    for size, batch in batches.items():
        result[f"b{size}"] = {"tokens": batch["num_tokens"], "flops": count_flops(
            lambda batch=batch: step(module, optimizer, batch, device, args.precision, True, optimise=False))}
    for model in (module.generator, *([module.loss.scorer.model] if module.loss.scorer is not None else [])):
        compile_body(model, args.backend, args.mode)
    module.cuda_graphs = args.mode == "reduce-overhead"
    for size, batch in batches.items():
        seconds, first = timed(module, optimizer, batch, device, args.precision, args.steps)
        figures = result[f"b{size}"] | {"s_per_step": seconds, "tokens_per_s": batch["num_tokens"] / seconds, "first_step_s": first}
        if device.type == "cuda":
            def one_step(batch=batch):
                step(module, optimizer, batch, device, args.precision, True, read=False)
            figures["gpu_busy"] = gpu_busy(one_step, device, args.profile_steps)[0]
            figures["syncs_per_step"] = count_syncs(one_step)
        result[f"b{size}"] = figures
    return result | {"peak_memory_gb": peak_memory_gb(device)}


def figures_of(runs: dict[str, dict], sizes: list[int]) -> tuple[dict, dict]:
    """(figures, targets) from each objective's process output: speed-ups over the eager step,
    and a DTO step's time over NLL's against their FLOP ratio."""
    figures: dict[str, dict] = {}
    for objective, run in runs.items():
        figures[objective] = {"eager": {k: round(v, 4) for k, v in run["eager"].items() if k != "batch_size"}}
        for size in sizes:
            got = run[f"b{size}"]
            row = {"s_per_step": round(got["s_per_step"], 4), "tokens_per_s": round(got["tokens_per_s"]),
                   "speedup": round(got["tokens_per_s"] / run["eager"]["tokens_per_s"], 3),
                   "first_step_s": round(got["first_step_s"], 1), "gflop": round(got["flops"] / 1e9, 1)}
            row |= {k: round(got[k], 3) for k in ("gpu_busy", "syncs_per_step") if k in got}
            if objective in DTO_OBJECTIVES and "nll" in runs:
                nll = runs["nll"][f"b{size}"]
                ratio, flop_ratio = got["s_per_step"] / nll["s_per_step"], got["flops"] / nll["flops"]
                row |= {"ratio": round(ratio, 3), "flop_ratio": round(flop_ratio, 3), "ratio_over_flop_ratio": round(ratio / flop_ratio, 3)}
            figures[objective][f"b{size}"] = row
        figures[objective]["best_speedup"] = max(figures[objective][f"b{size}"]["speedup"] for size in sizes)
    targets = {"nll.best_speedup": {"min": 5.0}} if "nll" in runs else {}
    for objective in runs:
        for size in sizes:
            row = figures[objective][f"b{size}"]
            targets |= {f"{objective}.b{size}.ratio_over_flop_ratio": {"max": 1.15}} if "ratio" in row else {}
            targets |= {f"{objective}.b{size}.gpu_busy": {"min": GPU_BUSY_TARGET}, f"{objective}.b{size}.syncs_per_step": {"max": 0}} \
                if "gpu_busy" in row else {}
    return figures, targets


def arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_build_arguments(parser)
    parser.set_defaults(precision="bf16-mixed")
    parser.add_argument("--mode", default="reduce-overhead", choices=("default", "reduce-overhead"),
                        help="as `compile: true` (default) or `compile: reduce-overhead` (CUDA graphs) trains")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[16, 32, 64],
                        help="the first is also the eager step's (the GPU profile's train.batch_size)")
    add_objectives_argument(parser, ["nll", "score", "score_delta"], "NLL is the base of the DTO ratios")
    parser.add_argument("--steps", type=int, default=8, help="timed steps per batch size, back to back")
    parser.add_argument("--profile-steps", type=int, default=4, help="compiled steps under the profiler (CUDA)")
    parser.add_argument("--backend", default="inductor", help="torch.compile's backend (aot_eager: the same tracing, "
                        "no generated kernels, for a quick check of the path on a CPU)")
    parser.add_argument("--name", default="compiled_steps", type=record_name, help="the figures' file in reports/bench/")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # internal: measure one objective, print JSON
    return parser


def main() -> None:
    args = arguments().parse_args()
    if args.batch_size:
        raise SystemExit("error: give the batch sizes as --batch-sizes")
    if args.steps < 1 or args.profile_steps < 1 or min(args.batch_sizes) < 1:
        raise SystemExit("error: --steps, --profile-steps and every --batch-sizes value must be at least 1")
    args.mode = None if args.mode == "default" else args.mode
    if args.one:
        print(json.dumps(measure(args.one, args)))
        return
    runs = {}
    for objective in args.objectives:
        command = [sys.executable, __file__, "--one", objective, *sys.argv[1:]]
        started = time.perf_counter()
        output = subprocess.run(command, capture_output=True, text=True)
        if output.returncode != 0:
            raise SystemExit(f"error: {objective}'s process failed (exit {output.returncode}):\n{output.stderr[-3000:]}")
        runs[objective] = json.loads(output.stdout.strip().splitlines()[-1])
        row = runs[objective]
        print(f"{objective}: eager {row['eager']['s_per_step']:.4f} s/step; compiled "
              + ", ".join(f"b{size} {row[f'b{size}']['s_per_step']:.4f} s/step" for size in args.batch_sizes)
              + f"; process {time.perf_counter() - started:.0f} s", flush=True)
    figures, targets = figures_of(runs, args.batch_sizes)
    first = next(iter(runs.values()))
    print(f"{first['device']}; precision {args.precision}; compiled with {args.backend}, mode {args.mode or 'default'}")
    print(json.dumps(figures, indent=1))
    write_result(args.name, resolve_device(args.device), figures,
                 {"precision": args.precision, "mode": args.mode or "default", "backend": args.backend,
                  "batch_sizes": args.batch_sizes, "eager_batch_size": args.batch_sizes[0], "steps": args.steps,
                  "profile_steps": args.profile_steps, **overlay_settings(args)}, targets)


if __name__ == "__main__":
    run_cli(main)
