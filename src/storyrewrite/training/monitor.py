"""Watching a training run: every logged quantity as a DVCLive curve, and a stop on divergence.

DVCLive (DVC's own logger) writes the stage's log directory (`reports/train/<system>/`, declared
in dvc.yaml): one `plots/metrics/<name>.tsv` per quantity (`dvc plots show` draws each, whatever
the objective logs) and `metrics.json`, the latest value of each (live in `dvc exp show` while an
experiment runs; at the end the run's summary, storyrewrite.training.run). The quantities:
`train_loss`, `lr`, `grad_norm`, `tokens_per_s`, the objective's terms and diagnostics (TRL's
names for CPO: `rewards/chosen`, …), and the same averaged over validation, prefixed `val_` (at
step 0 the starting weights', with `validate_at_start`). A step's tensors are read in one
device-to-host copy, one step late: reading them waits for the GPU to finish the step, so at the
end of the next step's launches, not before them; before a validation, a checkpoint and the end
of training every step is read. The progress bar shows the loss so read. Wall-time quantities
(`tokens_per_s`; a diagnostic in seconds, logged as its share of the step,
`<name>_time_share`; the step's thread on a CPU, `cpu_time_share`, and ready but waiting for
one, `cpu_wait_time_share`: storyrewrite.threadclock) are curves only, never in the summary:
`dvc metrics diff` between two runs of the same code lists what the code changed, not the clock.

Exact resume: DVC deletes a stage's outputs before it runs it again, so the curves are copied
beside the checkpoints (`<checkpoints>/curves/`) at every checkpoint save and every validation;
a resumed run starts from that copy with the rows after the resumed step dropped (they were
logged after the last checkpoint, before the interruption, and are logged again), so its curves
equal an uninterrupted run's: no step missing, none twice.

A non-finite loss or loss term, or a non-finite gradient norm that is not fp16 loss scaling at
work, stops the run at once (before that step's checkpoint is written) with one message naming
the step, the values and the learning rate.
"""
from __future__ import annotations

import math
import shutil
import time
from pathlib import Path

import torch
from dvclive import Live
from lightning.pytorch.callbacks import Callback

from storyrewrite.curves import curve_files, read_curve
from storyrewrite.io import InputError, atomic_dir, atomic_path, write_json_atomic
from storyrewrite.threadclock import ThreadTimes, thread_times


def wall_time(name: str) -> bool:
    """Whether a curve measures the clock (throughput, a share of the step's time): a curve,
    never a summary metric."""
    return name == "tokens_per_s" or name.endswith("_time_share")


class TrainingDiverged(InputError):
    """A non-finite loss or gradient: the settings (lr, precision) do not train this model."""


def read_logs(logs: dict[str, torch.Tensor]) -> dict[str, float]:
    """A step's logged scalars as numbers, in one copy per device they lie on (one sync on a GPU):
    an objective may log values it computed on the host (RLOO's rewards, in float64 on the CPU)
    beside the GPU's, and one stack cannot hold tensors of two devices."""
    by_device: dict[torch.device, list[str]] = {}
    for name, value in logs.items():
        by_device.setdefault(value.device, []).append(name)
    values: dict[str, float] = {}
    for names in by_device.values():
        values |= zip(names, torch.stack([logs[n].float().reshape(()) for n in names]).tolist(), strict=True)
    return {name: values[name] for name in logs}


def step_mean(batches: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """One optimiser step's logged tensors from those of its batches (one each, or several with
    accumulate_grad_batches): each the mean over the batches that logged it (the gradient norm,
    logged before the optimiser steps, is the last batch's alone), on its device, unread."""
    if len(batches) == 1:
        return batches[0]
    names = dict.fromkeys(name for logs in batches for name in logs)
    return {name: torch.stack([logs[name].float().reshape(()) for logs in batches if name in logs]).mean() for name in names}


def truncate_after(directory: Path, step: int) -> None:
    """Drop every curve row after `step` (logged after the last checkpoint)."""
    for path in curve_files(directory).values():
        rows = [row for row in read_curve(path) if row["step"] <= step]
        with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8", newline="") as f:
            f.write(f"step\t{path.stem}\n" + "".join(f"{row['step']}\t{row['value']!r}\n" for row in rows))


class TrainingPlan(Callback):
    """Writes `path` (JSON) as fitting starts: `steps`, the optimiser steps the run takes (Lightning's
    `estimated_stepping_batches`: max_steps, or the epochs' batches over the devices and the gradient
    accumulation), `from_step`, the step it starts from (a resumed run's last checkpoint), and
    `started_at`, the time (seconds since the epoch). `python -m storyrewrite.queue --running` reads
    it to say how far a training under way has got, at what pace, and how long it has to go. Kept
    beside the checkpoints, in no stage's outputs."""

    def __init__(self, path: Path):
        self.path = Path(path)

    def on_train_start(self, trainer, pl_module) -> None:
        if not trainer.is_global_zero:
            return
        steps = trainer.estimated_stepping_batches
        write_json_atomic(self.path, {"steps": int(steps) if math.isfinite(steps) else None, "from_step": trainer.global_step,
                                      "started_at": time.time()})


class TrainingMonitor(Callback):
    """Logs one row per quantity per optimiser step (with accumulate_grad_batches, the mean over
    its batches) and per validation with DVCLive into `log_dir`, copies the curves to
    `snapshot_dir` at every checkpoint and validation, and stops the run on divergence.
    `resumed_step`: the step of the checkpoint a resumed run starts from."""

    def __init__(self, log_dir: Path, snapshot_dir: Path, section: str, objective: str, resumed_step: int | None = None):
        self.log_dir, self.snapshot_dir = Path(log_dir), Path(snapshot_dir)
        self.section, self.objective, self.resumed_step = section, objective, resumed_step
        self.live: Live | None = None
        self._started: ThreadTimes | None = None
        # The last step's logged tensors, not yet read: (step, tensors, terms, lr, tokens, times)
        self._pending: tuple[int, dict[str, torch.Tensor], tuple[str, ...], float, int, ThreadTimes] | None = None
        # The batches of the optimiser step under way (several with accumulate_grad_batches): their
        # logged tensors and tokens, and the step before the first of them.
        self._batches: list[tuple[dict[str, torch.Tensor], int]] = []
        self._step_before: int | None = None
        self.last_loss: float | None = None  # the latest step's loss read, for the progress bar
        # Seconds spent validating (the starting weights' validation and Lightning's sanity check
        # included): from the start of each validation, after the last step's read waited for the
        # device, to its end, after its values were read.
        self.validate_seconds, self._validation_started = 0.0, None

    def setup(self, trainer, pl_module, stage: str) -> None:
        """The logger, on the first process only (under DDP every process runs the stage: a
        second Live would start the directory afresh under the first one's feet)."""
        if self.live is not None or not trainer.is_global_zero:
            return
        resumed = self.resumed_step is not None
        if resumed:
            shutil.rmtree(self.log_dir, ignore_errors=True)
            if self.snapshot_dir.exists():
                shutil.copytree(self.snapshot_dir, self.log_dir)
                truncate_after(self.log_dir, self.resumed_step)
        self.live = Live(dir=str(self.log_dir), resume=resumed, save_dvc_exp=False, dvcyaml=None, report=None)

    def latest(self) -> dict:
        """DVCLive's summary: the latest value of every curve but the wall-time ones."""
        return {name: value for name, value in (self.live.summary if self.live else {}).items() if not wall_time(name)}

    def _log(self, step: int, values: dict[str, float], seconds: float | None = None) -> None:
        # A diagnostic in seconds (`<name>_seconds`) is logged as its share of the step's wall time.
        for name in [n for n in values if n.endswith("_seconds")]:
            value = values.pop(name)
            if seconds:
                values[name.removesuffix("_seconds") + "_time_share"] = value / seconds
        self.live.step = step
        for name, value in values.items():
            self.live.log_metric(name, value)
        for name in [n for n in self.live.summary if wall_time(n)]:
            self.live.summary.pop(name)
        self.live.make_summary()

    def snapshot(self) -> None:
        with atomic_dir(self.snapshot_dir) as staging:
            shutil.copytree(self.log_dir, staging, dirs_exist_ok=True)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if not self._batches:  # the first batch of an optimiser step
            self._started, self._step_before = thread_times(), trainer.global_step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._batches.append((dict(pl_module.step_logs), batch["num_tokens"]))
        if trainer.global_step == self._step_before:
            return  # accumulate_grad_batches: the optimiser steps after a later batch
        spent = thread_times() - self._started  # the step's wall time, and its thread's time on and waiting for a CPU
        self._read(trainer)
        batches, self._batches = self._batches, []
        lr = trainer.optimizers[0].param_groups[0]["lr"]
        self._pending = (trainer.global_step, step_mean([logs for logs, _ in batches]), pl_module.step_terms, lr,
                         sum(tokens for _, tokens in batches), spent)

    def _read(self, trainer) -> None:
        """Read, check and log the pending step, if any."""
        if self._pending is None:
            return
        step, logs, terms, lr, tokens, spent = self._pending
        self._pending = None
        values = read_logs(logs)
        self.last_loss = values["train_loss"]
        self._check(trainer, {n: values[n] for n in terms}, values.get("grad_norm"), lr, step)
        if trainer.is_global_zero:
            values |= {"lr": lr, "tokens_per_s": tokens / spent.wall if spent.wall > 0 else float("nan"),
                       "cpu_seconds": spent.on_cpu, **({"cpu_wait_seconds": spent.cpu_wait} if spent.cpu_wait is not None else {})}
            self._log(step, values, spent.wall)

    def on_validation_start(self, trainer, pl_module) -> None:
        self._read(trainer)
        self._validation_started = time.perf_counter()

    def on_train_end(self, trainer, pl_module) -> None:
        self._read(trainer)

    def on_validation_end(self, trainer, pl_module) -> None:
        values = {name: float(value) for name, value in trainer.callback_metrics.items() if name.startswith("val_")}
        if self._validation_started is not None:
            self.validate_seconds += time.perf_counter() - self._validation_started
            self._validation_started = None
        if trainer.sanity_checking:
            return
        # The validation of the starting weights (Trainer.validate, before fit) has no optimiser yet.
        lr = trainer.optimizers[0].param_groups[0]["lr"] if trainer.optimizers else None
        self._check(trainer, {"val_loss": values["val_loss"]}, None, lr)
        if trainer.is_global_zero:
            self._log(trainer.global_step, values)
            self.snapshot()

    def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        self._read(trainer)  # (a diverged step stops the run before its checkpoint is written)
        if trainer.is_global_zero:
            self.snapshot()

    def _check(self, trainer, terms: dict[str, float], grad_norm: float | None, lr: float | None,
               step: int | None = None) -> None:
        """`lr` None: the validation of the starting weights, before training; `step`: the
        training step the values are of (default: the trainer's)."""
        bad_terms = any(not math.isfinite(v) for v in terms.values())
        # With fp16 a GradScaler skips steps whose gradients overflow and lowers its scale: normal.
        scaling = getattr(trainer.precision_plugin, "scaler", None) is not None
        bad_grad = grad_norm is not None and not math.isfinite(grad_norm) and not scaling
        if not (bad_terms or bad_grad):
            return
        shown = ", ".join(f"{name} = {value:.6g}" for name, value in
                          {**terms, **({"grad_norm": grad_norm} if grad_norm is not None else {})}.items())
        if lr is None:
            raise TrainingDiverged(
                f"the starting weights give non-finite values before training ({self.section}, objective "
                f"{self.objective}, validation): {shown}. Check the model given to the stage, or change "
                f"`{self.section}.precision` (now {trainer.precision}); nothing was trained or exported")
        last = Path(trainer.default_root_dir) / "last.ckpt"
        kept = f"{last} keeps the last finite checkpoint" if last.exists() else "no checkpoint had been written yet"
        raise TrainingDiverged(
            f"training diverged at step {trainer.global_step if step is None else step} ({self.section}, objective {self.objective}): {shown}; "
            f"lr = {lr:g}. Lower `{self.section}.lr` or change `{self.section}.precision` (now {trainer.precision}); "
            f"no model was exported, and {kept}"
        )
