"""LightningModule: the generator, the objective's loss and the optimiser. Nothing else."""
from __future__ import annotations

import lightning as L
import torch
from transformers import PreTrainedModel

from storyrewrite.models.encoding import target_logits
from storyrewrite.objectives import Objective
from storyrewrite.objectives.nll import nll_loss


class RewriteModule(L.LightningModule):
    def __init__(self, generator: PreTrainedModel, objective: Objective, lr: float, weight_decay: float, warmup_steps: int):
        super().__init__()
        # from_pretrained returns a model in eval mode; Lightning keeps module modes as they
        # are, so switch dropout on for training here.
        self.generator = generator.train()
        self.objective = objective
        self.lr, self.weight_decay, self.warmup_steps = lr, weight_decay, warmup_steps

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        loss = self.objective.loss(self.generator, batch)
        self.log("train_loss", loss, prog_bar=True, batch_size=len(batch["ids"]))
        return loss

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        size = len(batch["ids"])
        self.log("val_loss", self.objective.loss(self.generator, batch), prog_bar=True, batch_size=size, sync_dist=True)
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
