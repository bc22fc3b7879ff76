"""Checkpoint saves on the default profile: what the atomic save costs, and whether a kill at a
random moment during a save can leave an unreadable `last.ckpt`, in one run of this script.

1. Cost: the NLL run's full training state (generator weights and AdamW's two moments after a
   few steps: what `last.ckpt` holds) saved with a plain `torch.save` to its final path,
   Lightning's own `TorchCheckpointIO`, and `AtomicCheckpointIO` (temporary file beside it,
   fsync, rename), alternating, `--repeats` times; against the time of a training step. The
   overhead is (atomic − plain) / (step + plain): the share of a checkpointing step.
2. Kills: a child process saves the state again and again to one `last.ckpt`; the parent kills it
   (SIGKILL) at a random moment while a save is under way (`--tries` times), then loads
   `last.ckpt`. Done for the atomic save and, to show that the test can fail, for the plain one.

    python bench/checkpoint_save.py [--repeats 3] [--tries 10] [--steps 3]

Targets: the atomic save's overhead <= 5 % of a checkpointing step; no kill leaves an
unreadable `last.ckpt`. Figures go to reports/bench/checkpoint_save.json.
"""
from __future__ import annotations

import argparse
import random
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from common import ROOT, describe, inputs, write_result
from lightning.pytorch.plugins.io import TorchCheckpointIO

from storyrewrite.io import run_cli
from storyrewrite.models.store import resolve_model_dir
from storyrewrite.objectives.base import NLL
from storyrewrite.training.checkpointing import AtomicCheckpointIO
from storyrewrite.training.run import Run, assemble

WORK = ROOT / ".cache" / "bench" / "checkpoint_save"  # on the file system the checkpoints live on
CHILD = """
import sys, torch
from pathlib import Path
from storyrewrite.training.checkpointing import AtomicCheckpointIO
state = torch.load(sys.argv[1], weights_only=False)
target, atomic = Path(sys.argv[2]), sys.argv[3] == "atomic"
save = AtomicCheckpointIO().save_checkpoint if atomic else torch.save
while True:
    print("saving", flush=True)
    save(state, target)
    print("saved", flush=True)
"""


def training_state(steps: int) -> tuple[dict, float]:
    """The state `last.ckpt` holds after `steps` NLL steps of the default profile, and the median
    seconds of a training step."""
    params, pretrained, prepared = inputs()
    run = Run.from_params(params, "train_nll", NLL, resolve_model_dir(pretrained), prepared)
    module, datamodule = assemble(run)
    datamodule.setup()
    optimizer = module.configure_optimizers()["optimizer"]
    batch = datamodule.collate(datamodule.train_rows[: run.config.batch_size])
    seconds = []
    for _ in range(steps):
        started = time.perf_counter()
        loss = module.step_loss(batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        seconds.append(time.perf_counter() - started)
    state = {"epoch": 0, "global_step": steps, "state_dict": module.state_dict(),
             "optimizer_states": [optimizer.state_dict()], "lr_schedulers": [], "loops": {}, "callbacks": {}}
    return state, statistics.median(seconds)


def timed(save, state: dict, path: Path) -> float:
    started = time.perf_counter()
    save(state, path)
    return time.perf_counter() - started


def kills(source: Path, target: Path, atomic: bool, tries: int, save_seconds: float, rng: random.Random) -> int:
    """How many of `tries` kills during a save left `target` unreadable."""
    unreadable = 0
    for _ in range(tries):
        shutil.copyfile(source, target)  # a whole checkpoint to start from
        child = subprocess.Popen([sys.executable, "-c", CHILD, str(source), str(target), "atomic" if atomic else "plain"],
                                 stdout=subprocess.PIPE, text=True)
        assert child.stdout.readline().strip() == "saving"
        time.sleep(rng.uniform(0, save_seconds))
        child.send_signal(signal.SIGKILL)
        child.wait()
        try:
            torch.load(target, map_location="cpu", weights_only=False, mmap=True)
        except Exception:  # noqa: BLE001 (any failure to load is what is counted)
            unreadable += 1
        for stale in target.parent.glob(f".{target.name}.*.tmp"):
            stale.unlink()
    return unreadable


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tries", type=int, default=10)
    parser.add_argument("--steps", type=int, default=3, help="training steps before the state is saved (a median step time)")
    args = parser.parse_args()
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    try:
        state, step = training_state(args.steps)
        ways = {"plain torch.save": lambda s, p: torch.save(s, p), "Lightning TorchCheckpointIO": TorchCheckpointIO().save_checkpoint,
                "AtomicCheckpointIO": AtomicCheckpointIO().save_checkpoint}
        seconds: dict[str, list[float]] = {name: [] for name in ways}
        for repeat in range(args.repeats):
            for name in (list(ways) if repeat % 2 == 0 else list(ways)[::-1]):
                seconds[name].append(timed(ways[name], state, WORK / "last.ckpt"))
        size = (WORK / "last.ckpt").stat().st_size
        median = {name: statistics.median(values) for name, values in seconds.items()}
        overhead = (median["AtomicCheckpointIO"] - median["plain torch.save"]) / (step + median["plain torch.save"])
        print(f"{describe(torch.device('cpu'))}; last.ckpt {size / 2**30:.2f} GB; a training step {step:.2f} s")
        for name, value in median.items():
            print(f"  {name:<28} {value:.2f} s (median of {args.repeats})")
        print(f"atomic save overhead: {100 * overhead:+.1f} % of a checkpointing step (target <= 5 %)")
        del state
        rng = random.Random(0)
        source = WORK / "source.ckpt"
        (WORK / "last.ckpt").rename(source)
        torn = {kind: kills(source, WORK / "last.ckpt", kind == "atomic", args.tries, median["AtomicCheckpointIO"], rng)
                for kind in ("atomic", "plain")}
        print(f"kills during a save: atomic {torn['atomic']} of {args.tries} unreadable (target 0); "
              f"plain torch.save {torn['plain']} of {args.tries}")
    finally:
        shutil.rmtree(WORK, ignore_errors=True)
    write_result("checkpoint_save", torch.device("cpu"), {
        "checkpoint_gb": round(size / 2**30, 3), "step_s": round(step, 3),
        "save_s": {name: round(value, 3) for name, value in median.items()},
        "atomic_overhead_of_a_checkpointing_step": round(overhead, 4),
        "kills": args.tries, "unreadable_after_kill": torn}, {"repeats": args.repeats, "steps": args.steps},
        {"atomic_overhead_of_a_checkpointing_step": {"max": 0.05}, "unreadable_after_kill.atomic": {"max": 0}})


if __name__ == "__main__":
    run_cli(main)
