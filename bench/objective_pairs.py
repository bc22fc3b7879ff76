"""Each objective's training step against NLL's, the steps interleaved in one process: the step
time ratios of the targets (DTO-Score <= 1.5x, DTO-Score+Delta <= 1.8x an NLL step) with their
spread, from one run.

    python bench/objective_pairs.py --device cuda --precision bf16-mixed --profile params/gpu.yaml --batch-size 16

bench/objective_step_time.py runs each objective in a process of its own, one after the other,
and sets the means of their medians against each other: on a GPU whose steps wait on the host's
kernel launches, the host's speed moves from one process to the next by more than the margins of
the targets (an NLL step of 0.200 s in one process, 0.162 s in the next, on an H200). Here every
objective's module is built in this process, as that bench builds it (the train stage's torch
flags, the same batch), and the steps go round: one step of each objective a round, each first
in turn, so that whatever the host's speed does falls on all of them alike. `ratio`: the median
over the rounds of an objective's step over the NLL step of the same round, `ratio_quartiles`
their spread, `s_per_step` each objective's median step. A step is the train stage's, its
diagnostics and the logged values' copy to the host included (objective_step_time's `step`).
The models of every objective are resident together, so the peak memory is theirs together, not
a training run's (objective_step_time gives each objective's). Figures go to
reports/bench/objective_pairs.json (`-PRECISION` added where not 32-true).
"""
from __future__ import annotations

import argparse
import statistics

import torch
from common import alternating, describe, paired_ratio, peak_memory_gb, write_result
from objective_step_time import build, check_steps, interleaved_arguments, overlay_settings, step

from storyrewrite.io import run_cli
from storyrewrite.models.device import resolve_device

TARGETS = {"score": 1.5, "score_delta": 1.8}  # the step time ratio against NLL's (issue 10)


def measure(args: argparse.Namespace, device: torch.device) -> tuple[dict, dict]:
    """({objective: figures}, the batch's shape) for `args.objectives`, the first the base of
    every ratio, over `args.steps` rounds after a warm-up round."""
    torch.manual_seed(0)
    built = {objective: build(objective, args, device) for objective in args.objectives}

    def one_step(objective: str):
        module, optimizer, batch = built[objective]
        return lambda: step(module, optimizer, batch, device, args.precision, True)
    seconds = alternating({objective: one_step(objective) for objective in args.objectives}, args.steps, device)
    base = args.objectives[0]
    figures = {}
    for objective in args.objectives:
        ratio, quartiles = paired_ratio(seconds[objective], seconds[base])
        figures[objective] = {"s_per_step": round(statistics.median(seconds[objective]), 4), "ratio": round(ratio, 3),
                              "ratio_quartiles": [round(q, 3) for q in quartiles]}
    batch = built[base][2]
    return figures, {"batch_size": len(batch["ids"]), "tokens": batch["num_tokens"]}


def arguments() -> argparse.ArgumentParser:
    return interleaved_arguments(__doc__, "timed rounds (one step of each objective a round)", ["nll", "score", "score_delta"],
                                 "the first is the base of every ratio")


def main() -> None:
    args = arguments().parse_args()
    check_steps(args)
    if len(set(args.objectives)) != len(args.objectives):
        raise SystemExit(f"error: --objectives names one twice: {' '.join(args.objectives)}")
    device = resolve_device(args.device)
    figures, shape = measure(args, device)
    base = args.objectives[0]
    print(f"{describe(device)}; precision {args.precision}; deterministic algorithms; the same batch of "
          f"{shape['batch_size']} ({shape['tokens']} tokens for {base}) every step; {args.steps} round{'s' if args.steps > 1 else ''}, one step of "
          f"each objective a round, each first in turn")
    print(f"{'objective':<12}{'s/step':>9}{'ratio':>8}{'quartiles':>14}{'target':>9}")
    for objective, v in figures.items():
        target = f"<= {TARGETS[objective]}x" if objective in TARGETS else "-"
        print(f"{objective:<12}{v['s_per_step']:>9.4f}{v['ratio']:>7.3f}x"
              f"{v['ratio_quartiles'][0]:>8.3f}-{v['ratio_quartiles'][1]:.3f}{target:>9}")
    print(f"s/step: the median step; ratio: the median over the rounds of the step over {base}'s of the same round; "
          f"quartiles: those ratios' first and third")
    name = "objective_pairs" + ("" if args.precision == "32-true" else f"-{args.precision}")
    write_result(name, device, figures,
                 {"precision": args.precision, "deterministic": torch.are_deterministic_algorithms_enabled(),
                  "base": base, **shape, "steps": args.steps, "peak_memory_gb": round(peak_memory_gb(device), 2),
                  **overlay_settings(args)},
                 {f"{o}.ratio": {"max": TARGETS[o]} for o in figures if o in TARGETS})


if __name__ == "__main__":
    run_cli(main)
