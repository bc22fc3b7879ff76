"""Each objective trained for a few steps through the train stage's own `fit` (Lightning's
Trainer with the stage's flags: deterministic algorithms, the section's precision), on the device:
the validation of the starting weights, training steps, a validation, checkpoints and the export
of the best weights. Not a benchmark: a quick check of the code paths that only the device shows
(a frozen model placed on the GPU by a validation hook, which Lightning runs in inference mode;
an operator without a deterministic CUDA kernel), before a long run commits the
machine to them.

    python bench/training_paths.py [--device auto] [--profile params/gpu.yaml] [--tiny]
        [--objectives nll score delta score_delta cpo rloo] [--steps 2]

Each objective runs in a process of its own (a CUDA error leaves the others their device), with
the train section of the params and profiles, the batch size cut to 2 and validation to 2
batches; `--tiny` trains tiny random-init Llama models instead of the profile's. Prints one line
per objective (ok, with the fit's wall time and its process's, or the end of its error) and
exits 1 if any failed.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import train_run

from storyrewrite.io import run_cli
from storyrewrite.objectives.registry import OBJECTIVES

TINY = {"models": {"generator": "tiny:llama", "scorer": "tiny:llama"}}


def train(objective: str, args) -> dict:
    """`fit` of the train section with `objective` for `args.steps` steps on `args.device`; what it reports."""
    import dataclasses

    from storyrewrite.training.run import fit

    run = train_run(args.profile, objective, TINY if args.tiny else None, max_steps=args.steps, val_check_interval=args.steps,
                    checkpoint_every_n_steps=1, validate_at_start=True, batch_size=2, limit_val_batches=2)
    accelerator = {"auto": run.config.accelerator, "cpu": "cpu"}.get(args.device, "gpu")
    devices = 1 if accelerator != "auto" else run.config.devices
    run = dataclasses.replace(run, config=run.config.model_copy(update={"accelerator": accelerator, "devices": devices}))
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch)
        started = time.perf_counter()
        summary = fit(run, out / "model", out / "checkpoints", out / "logs")
        exported = (out / "model" / "model.safetensors").is_file()
    if summary["start_val_loss"] is None or summary["best_val_loss"] is None or not exported:
        raise SystemExit(f"error: {objective} trained, but validation or the export is missing: {summary}")
    return {"seconds": round(time.perf_counter() - started, 1), "device": summary["device"], "steps": summary["global_step"],
            "precision": summary["precision"]}


def arguments() -> argparse.ArgumentParser:
    """The command line (scripts/gpu_bench.sh's calls are parsed by it in the tests)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"),
                        help="auto: the train section's accelerator (a GPU where there is one)")
    parser.add_argument("--profile", type=Path, action="append", default=[], help="params overlay(s), e.g. params/gpu.yaml")
    parser.add_argument("--tiny", action="store_true", help="tiny random-init Llama generator and scorer")
    parser.add_argument("--objectives", nargs="+", default=list(OBJECTIVES), choices=sorted(OBJECTIVES), metavar="OBJECTIVE",
                        help=f"valid: {', '.join(OBJECTIVES)}")
    parser.add_argument("--steps", type=int, default=2, help="training steps of each objective")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # internal: train one objective, print JSON
    return parser


def main() -> None:
    args = arguments().parse_args()
    if args.one:
        print(json.dumps(train(args.one, args)))
        return

    failed = []
    for objective in args.objectives:
        command = [sys.executable, __file__, "--one", objective, "--device", args.device, "--steps", str(args.steps),
                   *sum((["--profile", str(p)] for p in args.profile), []), *(["--tiny"] if args.tiny else [])]
        started = time.perf_counter()
        output = subprocess.run(command, capture_output=True, text=True)
        seconds = time.perf_counter() - started  # the process's: its start (imports, the device) beside the fit
        if output.returncode != 0:
            failed.append(objective)
            print(f"{objective:<12} FAILED (exit {output.returncode}):\n{output.stderr[-3000:]}", flush=True)
            continue
        result = json.loads(output.stdout.strip().splitlines()[-1])
        print(f"{objective:<12} ok: {result['steps']} steps on {result['device']} in {result['precision']}, validated at "
              f"the start and after, best weights exported (fit {result['seconds']} s, process {seconds:.0f} s)", flush=True)
    if failed:
        raise SystemExit(f"error: these objectives failed to train (their errors above): {', '.join(failed)}")


if __name__ == "__main__":
    run_cli(main)
