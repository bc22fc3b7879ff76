"""LightningModule: the generator, the objective's loss and the optimiser. Nothing else."""
from __future__ import annotations

import lightning as L
import torch
from transformers import PreTrainedModel

from storyrewrite.metrics.lm_scorer import LMScorer
from storyrewrite.models.encoding import target_logits
from storyrewrite.objectives import LossFn
from storyrewrite.objectives.nll import nll_loss

VALIDATION_NOISE_OFFSET = 10**9  # validation draws its own Gumbel noise, the same every time


class RewriteModule(L.LightningModule):
    """`scorer` (DTO) is a plain attribute, not a submodule: it is frozen, gets no optimiser
    state and is not saved in checkpoints (it is reloaded from its source)."""

    def __init__(self, generator: PreTrainedModel, loss: LossFn, lr: float, weight_decay: float,
                 warmup_steps: int, seed: int = 0, scorer: LMScorer | None = None):
        super().__init__()
        # from_pretrained returns a model in eval mode; Lightning keeps module modes as they
        # are, so switch dropout on for training here.
        self.generator = generator.train()
        self.loss = loss
        self.scorer = scorer
        self.lr, self.weight_decay, self.warmup_steps = lr, weight_decay, warmup_steps
        self.noise_seed = seed * 1_000_003

    def on_fit_start(self) -> None:
        if self.scorer is not None:
            self.scorer.model.to(self.device)

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        loss = self.loss(self.generator, batch, self.noise_seed + self.global_step)
        self.log("train_loss", loss, prog_bar=True, batch_size=len(batch["ids"]))
        return loss

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        size = len(batch["ids"])
        loss = self.loss(self.generator, batch, self.noise_seed + VALIDATION_NOISE_OFFSET + batch_idx)
        self.log("val_loss", loss, prog_bar=True, batch_size=size, sync_dist=True)
        # NLL on validation whatever the objective: comparable across objectives.
        nll = nll_loss(target_logits(self.generator, batch), batch["target_ids"], batch["target_mask"])
        self.log("val_nll", nll, batch_size=size, sync_dist=True)

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(
            [p for p in self.generator.parameters() if p.requires_grad], lr=self.lr, weight_decay=self.weight_decay
        )
        warmup = self.warmup_steps
        # Linear warm-up to lr, then constant (the paper trains at a constant lr).
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / warmup) if warmup else 1.0)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}
