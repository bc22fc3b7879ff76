"""Training step time and peak memory of each objective against NLL, and the cost of the logged
diagnostics. The same model and the same batch every step, steps run by Lightning as the train
stage runs them (module, monitor, optimiser, precision), each objective in its own process (so
each peak memory is its own), all measured in one run of this script.

    python bench/objective_step_time.py [--device auto] [--precision 32-true] [--batch-size N]
        [--steps 6] [--objectives nll score score_delta] [--profile params/gpu.yaml] [--trace DIR]

Targets: DTO-Score / NLL <= 1.5x and DTO-Score+Delta / NLL <= 1.8x (CPU; GPU in bf16-mixed);
diagnostics <= 5 % of a step. The diagnostics' cost is measured inside each objective's process:
steps alternate with and without them (curves, the monitor's sync, grad norm, the objective's
diagnostics), and the ratio of the medians is printed. On CUDA the torch profiler gives the share
of the timed steps' wall time during which GPU kernels ran ("GPU busy"); --trace writes its
operator table and a Chrome trace per objective.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from lightning.pytorch.callbacks import Callback


class Alternate(Callback):
    """After `warmup` steps, times every step (synchronised on a GPU) and, with `alternate`,
    switches the diagnostics off on every other step; optionally profiles the timed steps."""

    def __init__(self, device, monitor, warmup: int, alternate: bool, profile: bool):
        self.device, self.monitor, self.warmup = device, monitor, warmup
        self.alternate, self.profile = alternate, profile
        self.times: dict[bool, list[float]] = {True: [], False: []}
        self.profiler = None

    def _on(self, step: int) -> bool:
        return not self.alternate or step % 2 == 0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        from common import clock

        pl_module.diagnostics = self._on(trainer.global_step)
        if trainer.global_step == self.warmup and self.profile:
            import torch

            self.profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                               torch.profiler.ProfilerActivity.CUDA])
            self.profiler.__enter__()
        if pl_module.diagnostics:
            self.monitor.on_train_batch_start(trainer, pl_module, batch, batch_idx)
        self._started = clock(self.device)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        from common import clock

        step = trainer.global_step - 1  # the step that just ran
        if pl_module.diagnostics:
            self.monitor.on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        else:
            pl_module.step_logs.clear()
        if step >= self.warmup:
            self.times[pl_module.diagnostics].append(clock(self.device) - self._started)

    def on_train_end(self, trainer, pl_module) -> None:
        if self.profiler is not None:
            self.profiler.__exit__(None, None, None)


def measure(objective: str, args) -> dict:
    import lightning as L
    from torch.utils.data import DataLoader

    from common import describe, device_of, inputs, peak_memory_gb

    from storyrewrite.models.loading import resolve_model_dir
    from storyrewrite.objectives import get_objective
    from storyrewrite.training.monitor import TrainingMonitor
    from storyrewrite.training.run import Run, assemble

    params, pretrained, prepared = inputs(args.profile)
    device = device_of(args.device)
    found = get_objective(objective, params.task)
    config = dataclasses.replace(params.train, batch_size=args.batch_size or params.train.batch_size)
    run = Run(section="train", config=config, models=params.models, task=params.task, seed=params.seed,
              objective=objective, settings=params.section(found.settings) if found.settings else None,
              init_dir=resolve_model_dir(pretrained), prepared_dir=prepared,
              scorer_dir=resolve_model_dir(pretrained, "scorer") if found.needs_scorer else None)
    module, datamodule = assemble(run)
    datamodule.setup()
    rows = datamodule.train_rows[: config.batch_size]  # the same batch every step, for every objective
    warmup = 2
    total = warmup + 2 * args.steps
    datamodule.train_dataloader = lambda: DataLoader([rows] * total, batch_size=None, collate_fn=datamodule.collate)
    monitor = TrainingMonitor(Path(tempfile.mkdtemp()), "train", objective)
    timer = Alternate(device, monitor, warmup, alternate=True, profile=device.type == "cuda")
    trainer = L.Trainer(
        max_steps=total, accelerator="gpu" if device.type == "cuda" else "cpu",
        devices=[device.index or 0] if device.type == "cuda" else 1, precision=args.precision, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
        num_sanity_val_steps=0, callbacks=[timer],
    )
    trainer.fit(module, datamodule=datamodule)
    with_diagnostics, without = statistics.median(timer.times[True]), statistics.median(timer.times[False])
    result = {"seconds_per_step": with_diagnostics, "without_diagnostics": without, "peak_memory_gb": peak_memory_gb(device),
              "device": describe(device), "batch_size": config.batch_size,
              "tokens": datamodule.collate(rows)["num_tokens"]}
    if timer.profiler is not None:
        averages = timer.profiler.key_averages()
        kernel_us = sum(getattr(e, "self_device_time_total", 0) for e in averages)
        result["gpu_busy"] = kernel_us / 1e6 / sum(timer.times[True] + timer.times[False])
        if args.trace:
            Path(args.trace).mkdir(parents=True, exist_ok=True)
            (Path(args.trace) / f"{objective}.txt").write_text(averages.table(sort_by="self_device_time_total", row_limit=30))
            timer.profiler.export_chrome_trace(str(Path(args.trace) / f"{objective}.json"))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    parser.add_argument("--precision", default="32-true", help="Lightning precision, e.g. bf16-mixed on a GPU")
    parser.add_argument("--batch-size", type=int, help="default: the params' train.batch_size")
    parser.add_argument("--steps", type=int, default=6, help="timed steps with diagnostics (as many without), after 2 warm-up steps")
    parser.add_argument("--objectives", nargs="+", default=["nll", "score", "score_delta"])
    parser.add_argument("--profile", type=Path, action="append", default=[], help="params overlay(s), e.g. params/gpu.yaml")
    parser.add_argument("--trace", help="write the profiler's operator table and trace per objective here (CUDA)")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # internal: measure one objective, print JSON
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(args.one, args)))
        return
    results = {}
    for objective in args.objectives:
        command = [sys.executable, __file__, "--one", objective, "--steps", str(args.steps), "--device", args.device,
                   "--precision", args.precision, *sum((["--profile", str(p)] for p in args.profile), [])]
        command += (["--batch-size", str(args.batch_size)] if args.batch_size else []) + (["--trace", args.trace] if args.trace else [])
        output = subprocess.run(command, capture_output=True, text=True)
        if output.returncode != 0:
            raise SystemExit(output.stderr[-3000:])
        results[objective] = json.loads(output.stdout.strip().splitlines()[-1])
    first = results[args.objectives[0]]
    base = first["seconds_per_step"]
    busy = "gpu_busy" in first
    print(f"{first['device']}; precision {args.precision}; the same batch of {first['batch_size']} "
          f"({first['tokens']} tokens for NLL) every step; medians of {args.steps} steps")
    print(f"{'objective':<12}{'s/step':>9}{'ratio':>8}{'peak mem GB':>13}{'diagnostics':>13}" + (f"{'GPU busy':>10}" if busy else ""))
    for objective, r in results.items():
        print(f"{objective:<12}{r['seconds_per_step']:>9.3f}{r['seconds_per_step'] / base:>7.2f}x{r['peak_memory_gb']:>13.2f}"
              f"{r['seconds_per_step'] / r['without_diagnostics']:>12.3f}x" + (f"{r['gpu_busy']:>9.0%}" if busy else ""))
    print("ratio: s/step against the first objective's; diagnostics: s/step with them / without them, same process")


if __name__ == "__main__":
    main()
