"""Watching a training run: curves of every logged quantity, and a stop on divergence.

Curves are tidy CSV files, one per quantity (`step,epoch,<name>`), in one directory, so that
`dvc plots show` draws each (its y is the file's last column) whatever the objective logs:
`train_loss`, `lr`, `grad_norm`, `tokens_per_s`, the objective's terms and diagnostics, and the
same averaged over validation, prefixed `val_` (at step 0 the starting weights', with
`validate_at_start`). A non-finite loss or loss term, or a non-finite
gradient norm that is not fp16 loss scaling at work, stops the run at once (before that step's
checkpoint is written) with one message naming the step, the values and the learning rate.
"""
from __future__ import annotations

import csv
import math
import time
from pathlib import Path

import torch
from lightning.pytorch.callbacks import Callback

from storyrewrite.io import InputError, atomic_path


class TrainingDiverged(InputError):
    """A non-finite loss or gradient: the settings (lr, precision) do not train this model."""


def curve_file(directory: Path, name: str) -> Path:
    return directory / f"{name.replace('/', '_')}.csv"


def read_curve(path: Path) -> tuple[str, list[dict]]:
    """(the quantity's name: the last column, the rows)."""
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        rows = list(reader)
    return reader.fieldnames[-1], rows


def write_curve(path: Path, name: str, rows: list[dict]) -> None:
    with atomic_path(path) as tmp, open(tmp, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=("step", "epoch", name))
        writer.writeheader()
        writer.writerows(rows)


def read_logs(logs: dict[str, torch.Tensor]) -> dict[str, float]:
    """A step's logged scalars as numbers, in one device-to-host copy (one sync on a GPU)."""
    names = list(logs)
    return dict(zip(names, torch.stack([logs[n].float().reshape(()) for n in names]).tolist()))


def _number(value: float) -> str:
    return f"{value:.6g}"


class TrainingMonitor(Callback):
    """Appends one row per quantity per training step (and per validation) to `directory`,
    reading the step's tensors in one device-to-host copy; stops the run on divergence.

    On resume, rows after the resumed step (written after the last checkpoint, before an
    interruption) are dropped first (`truncate_after`)."""

    def __init__(self, directory: Path, section: str, objective: str):
        self.directory, self.section, self.objective = directory, section, objective
        self.directory.mkdir(parents=True, exist_ok=True)
        self._started = 0.0

    def truncate_after(self, step: int) -> None:
        for path in sorted(self.directory.glob("*.csv")):
            name, rows = read_curve(path)
            write_curve(path, name, [row for row in rows if int(row["step"]) <= step])

    def _append(self, step: int, epoch: int, values: dict[str, float]) -> None:
        for name, value in values.items():
            path = curve_file(self.directory, name)
            new = not path.exists()
            with open(path, "a", newline="", encoding="utf-8") as f:
                writer = csv.DictWriter(f, fieldnames=("step", "epoch", name))
                if new:
                    writer.writeheader()
                writer.writerow({"step": step, "epoch": epoch, name: _number(value)})

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._started = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        values = read_logs(pl_module.step_logs)
        seconds = time.perf_counter() - self._started
        lr = trainer.optimizers[0].param_groups[0]["lr"]
        self._check(trainer, {n: values[n] for n in pl_module.step_terms}, values.get("grad_norm"), lr)
        if trainer.is_global_zero:
            values |= {"lr": lr, "tokens_per_s": batch["num_tokens"] / seconds if seconds > 0 else float("nan")}
            self._append(trainer.global_step, trainer.current_epoch, values)

    def on_validation_end(self, trainer, pl_module) -> None:
        if trainer.sanity_checking:
            return
        values = {name: float(value) for name, value in trainer.callback_metrics.items() if name.startswith("val_")}
        # The validation of the starting weights (Trainer.validate, before fit) has no optimiser yet.
        lr = trainer.optimizers[0].param_groups[0]["lr"] if trainer.optimizers else None
        self._check(trainer, {"val_loss": values["val_loss"]}, None, lr)
        if trainer.is_global_zero:
            self._append(trainer.global_step, trainer.current_epoch, values)

    def _check(self, trainer, terms: dict[str, float], grad_norm: float | None, lr: float | None) -> None:
        """`lr` None: the validation of the starting weights, before training."""
        bad_terms = any(not math.isfinite(v) for v in terms.values())
        # With fp16 a GradScaler skips steps whose gradients overflow and lowers its scale: normal.
        scaling = getattr(trainer.precision_plugin, "scaler", None) is not None
        bad_grad = grad_norm is not None and not math.isfinite(grad_norm) and not scaling
        if not (bad_terms or bad_grad):
            return
        shown = ", ".join(f"{name} = {_number(v)}" for name, v in {**terms, **({"grad_norm": grad_norm} if grad_norm is not None else {})}.items())
        if lr is None:
            raise TrainingDiverged(
                f"the starting weights give non-finite values before training ({self.section}, objective "
                f"{self.objective}, validation): {shown}. Check the model given to the stage, or change "
                f"`{self.section}.precision` (now {trainer.precision}); nothing was trained or exported")
        last = Path(trainer.default_root_dir) / "last.ckpt"
        kept = f"{last} keeps the last finite checkpoint" if last.exists() else "no checkpoint had been written yet"
        raise TrainingDiverged(
            f"training diverged at step {trainer.global_step} ({self.section}, objective {self.objective}): {shown}; "
            f"lr = {lr:g}. Lower `{self.section}.lr` or change `{self.section}.precision` (now {trainer.precision}); "
            f"no model was exported, and {kept}"
        )
