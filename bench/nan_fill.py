"""What torch's NaN fill costs a training step, measured in one process per objective.

Under deterministic algorithms (the train stage's Trainer runs them) torch fills the memory of
every tensor it allocates with NaN unless `torch.utils.deterministic.fill_uninitialized_memory` is
off; the stage turns it off (storyrewrite.training.run.without_nan_fill). This bench builds each
objective's module as bench/objective_step_time.py does, under the stage's flags, and times the
same training step with the fill on and off, alternating step by step in the same process, so that
the host's drift, which moves a launch-bound GPU step by more than the fill costs (docs/gpu.md),
falls on both alike. `ratio`: the median over the pairs of adjacent steps of the one without the
fill over the one with it, `ratio_quartiles` their spread; and each way's median step.

    python bench/nan_fill.py --device cuda --precision bf16-mixed --profile params/gpu.yaml --batch-size 16
"""
from __future__ import annotations

import argparse
import statistics

import torch
from common import alternating, describe, paired_ratio, write_result
from objective_step_time import build, check_steps, interleaved_arguments, overlay_settings, step

from storyrewrite.io import run_cli
from storyrewrite.models.device import resolve_device


def measure(objective: str, args: argparse.Namespace, device: torch.device) -> dict:
    """Medians of `args.steps` steps each way, after a warm-up step each way (optimiser state)."""
    torch.manual_seed(0)
    module, optimizer, batch = build(objective, args, device)

    def filled(fill: bool):
        def run() -> None:
            torch.utils.deterministic.fill_uninitialized_memory = fill
            step(module, optimizer, batch, device, args.precision, diagnostics=False)
        return run
    try:
        seconds = alternating({True: filled(True), False: filled(False)}, args.steps, device)
    finally:
        torch.utils.deterministic.fill_uninitialized_memory = False  # as the stage runs
    with_fill, without = statistics.median(seconds[True]), statistics.median(seconds[False])
    ratio, quartiles = paired_ratio(seconds[False], seconds[True])  # adjacent steps: without the fill over with it
    print(f"{objective}: {with_fill:.4f} s/step with the fill, {without:.4f} without; paired ratio {ratio:.3f}x "
          f"(quartiles {quartiles[0]:.3f}-{quartiles[1]:.3f})", flush=True)
    return {"fill_s_per_step": round(with_fill, 4), "no_fill_s_per_step": round(without, 4), "ratio": round(ratio, 3),
            "ratio_quartiles": [round(q, 3) for q in quartiles],
            "batch_size": len(batch["ids"]), "tokens": batch["num_tokens"]}


def arguments() -> argparse.ArgumentParser:
    return interleaved_arguments(__doc__, "timed steps each way, per objective", ["nll", "score"],
                                 "default: nll score (the first is the one the printed batch describes)")


def main() -> None:
    args = arguments().parse_args()
    check_steps(args)
    device = resolve_device(args.device)
    figures = {}
    for objective in args.objectives:
        result = measure(objective, args, device)
        shape = result.pop("batch_size"), result.pop("tokens")
        figures[objective] = result
        if device.type == "cuda":
            torch.cuda.empty_cache()
        if objective == args.objectives[0]:
            batch_size, tokens = shape
    print(f"{describe(device)}; precision {args.precision}; deterministic algorithms; batch of {batch_size} "
          f"({tokens} tokens for {args.objectives[0]}); medians of {args.steps} steps each way, alternating")
    write_result("nan_fill", device, figures,
                 {"precision": args.precision, "batch_size": batch_size, "tokens": tokens, "steps": args.steps,
                  "deterministic": torch.are_deterministic_algorithms_enabled(),
                  **overlay_settings(args)})


if __name__ == "__main__":
    run_cli(main)
