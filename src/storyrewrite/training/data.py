"""LightningDataModule: prepared instances -> (source, target) text pairs -> token batches."""
from __future__ import annotations

import lightning as L
import torch
from torch.utils.data import DataLoader

from storyrewrite.data.formatting import model_source, model_target
from storyrewrite.data.prepare import load_instances
from storyrewrite.models.encoding import Encoder


class Collate:
    """Turns a list of instances into the batch layout of `storyrewrite.models.encoding`, with
    the instance ids and the texts objectives may need (e.g. the original ending)."""

    def __init__(self, encoder: Encoder, task: str):
        self.encoder, self.task = encoder, task

    def __call__(self, instances: list[dict]) -> dict:
        tokenizer, seq2seq = self.encoder.tokenizer, self.encoder.seq2seq
        sources = [model_source(row, self.task, tokenizer, seq2seq) for row in instances]
        targets = [model_target(row["target"], seq2seq) for row in instances]
        batch = self.encoder.batch(sources, targets)
        batch["ids"] = [row["id"] for row in instances]
        batch["sources"] = sources
        return batch


class RewriteDataModule(L.LightningDataModule):
    def __init__(self, prepared_dir: str, task: str, encoder: Encoder, batch_size: int, seed: int, num_workers: int = 0):
        super().__init__()
        self.prepared_dir, self.task, self.encoder = prepared_dir, task, encoder
        self.batch_size, self.seed, self.num_workers = batch_size, seed, num_workers
        self.collate = Collate(encoder, task)

    def setup(self, stage: str | None = None) -> None:
        self.train_rows = load_instances(self.prepared_dir, self.task, "train")
        self.val_rows = load_instances(self.prepared_dir, self.task, "val")

    def train_dataloader(self) -> DataLoader:
        return DataLoader(
            self.train_rows, batch_size=self.batch_size, shuffle=True, collate_fn=self.collate,
            generator=torch.Generator().manual_seed(self.seed), num_workers=self.num_workers,
        )

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_rows, batch_size=self.batch_size, shuffle=False,
                          collate_fn=self.collate, num_workers=self.num_workers)
