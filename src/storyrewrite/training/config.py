"""`train_nll` and `train` sections of params.yaml (the same shape: NLL warm-up, then the
chosen objective fine-tuning from it)."""
from __future__ import annotations

from dataclasses import dataclass

from storyrewrite.io import InputError
from storyrewrite.params import positive

# Keys that only say how long to train: changing them resumes from the last checkpoint instead
# of starting over (everything else changes the run and invalidates the checkpoints).
BUDGET_KEYS = ("max_steps", "max_epochs")


@dataclass(frozen=True)
class TrainConfig:
    batch_size: int
    max_steps: int  # -1: train for max_epochs
    max_epochs: int
    lr: float
    weight_decay: float
    warmup_steps: int
    val_check_interval: int  # validate every this many training batches
    checkpoint_every_n_steps: int  # save the resumable last.ckpt this often
    resume: bool  # continue from last.ckpt when it belongs to the same run
    accelerator: str  # Lightning Trainer arguments, passed through ("auto" picks a GPU)
    devices: int | str
    strategy: str
    precision: str
    num_nodes: int = 1
    accumulate_grad_batches: int = 1
    gradient_clip_val: float | None = None
    limit_val_batches: int | float | None = None
    num_workers: int = 0

    def check(self, where: str) -> None:
        positive(
            where, batch_size=self.batch_size, lr=self.lr, val_check_interval=self.val_check_interval,
            checkpoint_every_n_steps=self.checkpoint_every_n_steps, num_nodes=self.num_nodes,
            accumulate_grad_batches=self.accumulate_grad_batches,
        )
        if self.max_steps == -1 and self.max_epochs < 1:
            raise InputError(f"params: `{where}.max_steps` is -1, so `{where}.max_epochs` must be >= 1")
        if self.max_steps == 0 or self.max_steps < -1:
            raise InputError(f"params: `{where}.max_steps` = {self.max_steps} must be -1 or > 0")
