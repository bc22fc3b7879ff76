"""LightningDataModule: prepared instances -> (source, target) text pairs -> token batches."""
from __future__ import annotations

from collections.abc import Callable, Iterator

import lightning as L
import torch
from torch.utils.data import DataLoader, Sampler

from storyrewrite.data.formatting import model_source, model_target
from storyrewrite.data.prepare import load_instances
from storyrewrite.models.encoding import Encoder


class Collate:
    """Turns a list of instances into the batch layout of `storyrewrite.models.encoding`, with
    the instance ids and the texts objectives may need (e.g. the original ending)."""

    def __init__(self, encoder: Encoder, task: str, pairs: bool = False,
                 prepare: Callable[[dict], dict] | None = None):
        # prepare: the objective's own host work on the batch (objectives.base.Loss.prepare)
        self.encoder, self.task, self.pairs, self.prepare = encoder, task, pairs, prepare

    def __call__(self, instances: list[dict]) -> dict:
        tokenizer, seq2seq = self.encoder.tokenizer, self.encoder.seq2seq
        source_ids = self.encoder.source_ids([model_source(row, self.task, tokenizer, seq2seq) for row in instances])
        target_ids = self.encoder.target_ids([model_target(row["target"], seq2seq) for row in instances])
        batch = self.encoder.batch_ids(source_ids, target_ids)
        batch["ids"] = [row["id"] for row in instances]
        batch["targets"] = [row["target"] for row in instances]
        if all("original_ending" in row for row in instances):
            batch["original_endings"] = [row["original_ending"] for row in instances]
        if self.pairs:
            # Chosen (edited) and rejected (original) endings in one padded batch: one forward.
            rejected = self.encoder.target_ids([model_target(text, seq2seq) for text in batch["original_endings"]])
            batch["pair"] = self.encoder.batch_ids(source_ids + source_ids, target_ids + rejected)
        # Real tokens the generator reads (source and target; both rows of a pair), for tokens/s.
        read = batch["pair"] if self.pairs else batch
        batch["num_tokens"] = int(read["attention_mask"].sum()) + (int(read["target_mask"].sum()) if seq2seq else 0)
        if self.prepare is not None:
            batch |= self.prepare(batch)
        return batch


class ResumableRandomSampler(Sampler[int]):
    """A seeded permutation of the training set per epoch that can start part-way through.

    `position()` gives (epoch, instances already consumed in that epoch); it is read when an
    epoch's iteration starts, so a run resumed mid-epoch sees exactly the batches the
    interrupted run had not reached (Lightning would otherwise replay the epoch's start).
    """

    def __init__(self, size: int, seed: int, position: Callable[[], tuple[int, int]]):
        self.size, self.seed, self.position = size, seed, position

    def __len__(self) -> int:
        return self.size

    def __iter__(self) -> Iterator[int]:
        epoch, consumed = self.position()
        order = torch.randperm(self.size, generator=torch.Generator().manual_seed(self.seed + epoch)).tolist()
        return iter(order[consumed:])


class RewriteDataModule(L.LightningDataModule):
    def __init__(self, prepared_dir: str, task: str, encoder: Encoder, batch_size: int, seed: int,
                 num_workers: int = 0, pairs: bool = False, prepare: Callable[[dict], dict] | None = None,
                 val_batch_size: int | None = None):
        super().__init__()
        self.prepared_dir, self.task, self.encoder = prepared_dir, task, encoder
        self.batch_size, self.seed, self.num_workers = batch_size, seed, num_workers
        self.val_batch_size = val_batch_size or batch_size
        self.collate = Collate(encoder, task, pairs, prepare)

    def setup(self, stage: str | None = None) -> None:
        self.train_rows = load_instances(self.prepared_dir, self.task, "train")
        self.val_rows = load_instances(self.prepared_dir, self.task, "val")

    def _position(self) -> tuple[int, int]:
        trainer = self.trainer
        if trainer is None:
            return 0, 0
        # Batches completed in the current epoch: 0 at an epoch's start, restored on resume.
        completed = trainer.fit_loop.epoch_loop.batch_progress.current.completed
        return trainer.current_epoch, completed * self.batch_size * trainer.world_size

    def train_dataloader(self) -> DataLoader:
        sampler = ResumableRandomSampler(len(self.train_rows), self.seed, self._position)
        return DataLoader(self.train_rows, batch_size=self.batch_size, sampler=sampler,
                          collate_fn=self.collate, num_workers=self.num_workers)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_rows, batch_size=self.val_batch_size, shuffle=False,
                          collate_fn=self.collate, num_workers=self.num_workers)
