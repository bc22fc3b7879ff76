"""Checkpoints that survive a crash at any moment, and a resume that sets aside those that cannot be read.

`AtomicCheckpointIO` is Lightning's `CheckpointIO` plugin for every checkpoint the Trainer
writes (`last.ckpt`, `best.ckpt`): the checkpoint is serialised straight into a temporary file
beside its destination, flushed to the disk, and renamed over the old one only when complete, so
the directory holds the previous complete checkpoint or the new one, never a torn file.
Lightning's own `TorchCheckpointIO` serialises into memory (a second copy of the whole state)
and, for a local path, writes it through fsspec's transaction, which stages the file in the
system's temporary directory and moves it: a copy, not a rename, wherever that directory is
another file system (a tmpfs /tmp, a container), so a kill during the copy tears the file.
Before writing, the free space of the directory is checked against the checkpoint's tensors.
"""
from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO

from storyrewrite.io import InputError

# Above the tensors' bytes: the pickled structure, optimiser bookkeeping, the zip's headers.
SPACE_MARGIN = 1.05
SPACE_SLACK = 16 * 2**20


class CheckpointSpaceError(InputError):
    """Not enough free disk space for a checkpoint beside the previous one."""


class UnreadableCheckpoint(InputError):
    """A checkpoint to resume from that cannot be loaded."""


def tensor_bytes(obj: Any) -> int:
    """The bytes of every tensor in a nested checkpoint structure (each storage once)."""
    seen: set[int] = set()

    def walk(value: Any) -> int:
        if isinstance(value, torch.Tensor):
            storage = value.untyped_storage()
            key = storage.data_ptr()
            if key in seen:
                return 0
            seen.add(key)
            return storage.nbytes()
        if isinstance(value, dict):
            return sum(walk(v) for v in value.values())
        if isinstance(value, (list, tuple)):
            return sum(walk(v) for v in value)
        return 0

    return walk(obj)


def check_free_space(directory: Path, needed: int, name: str) -> None:
    free = shutil.disk_usage(directory).free
    if free < needed:
        raise CheckpointSpaceError(
            f"{directory}: {needed / 2**30:.2f} GB needed to write {name} beside the previous checkpoint, "
            f"{free / 2**30:.2f} GB free; free some space (`make clean-checkpoints` removes every run's checkpoints) "
            "and run the stage again: it resumes from the last complete checkpoint")


class AtomicCheckpointIO(TorchCheckpointIO):
    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any = None) -> None:
        if storage_options is not None:
            raise TypeError("AtomicCheckpointIO takes no storage_options")
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        check_free_space(path.parent, int(tensor_bytes(checkpoint) * SPACE_MARGIN) + SPACE_SLACK, path.name)
        fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        tmp = Path(name)
        try:
            with os.fdopen(fd, "wb") as f:
                torch.save(checkpoint, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise


def _reason(error: Exception) -> str:
    return " ".join(str(error).split()) or type(error).__name__


def checkpoint_step(path: Path) -> int:
    """The global step of the checkpoint `path` (memory-mapped: its tensors are not read)."""
    checkpoint = torch.load(path, map_location="cpu", weights_only=False, mmap=True)
    return int(checkpoint["global_step"])


def resume_point(checkpoint_dir: Path, section: str, resume_from: str = "last.ckpt") -> tuple[int, list[str]]:
    """The step an interrupted run resumes from (`resume_from`, the full checkpoint: weights,
    optimiser, loop state), after every checkpoint of `checkpoint_dir` that does not load has been
    moved aside as `NAME.corrupt`, each named in a warning; returns the step and the names set
    aside. A checkpoint that loads is never touched: a torn `best.ckpt` costs none of the steps
    `last.ckpt` holds. Only where `resume_from` itself does not load does the stage stop, giving
    the command that discards this stage's checkpoints alone."""
    steps: dict[str, int] = {}
    set_aside: list[str] = []
    for path in sorted(checkpoint_dir.glob("*.ckpt")):
        try:
            steps[path.name] = checkpoint_step(path)
        except Exception as error:  # a torn zip, another format, a pickle of something else: all unreadable
            corrupt = path.with_name(path.name + ".corrupt")
            os.replace(path, corrupt)
            set_aside.append(path.name)
            print(f"warning: {path}: cannot be read ({_reason(error)}); moved aside as {corrupt.name}", file=sys.stderr,
                  flush=True)
    if resume_from not in steps:
        aside = f" (set aside: {', '.join(name + '.corrupt' for name in set_aside)})" if set_aside else ""
        raise UnreadableCheckpoint(
            f"{checkpoint_dir}: no checkpoint to resume {section} from loads{aside}. To train from step 0 (the interrupted "
            f"run's steps are lost): `rm -rf {checkpoint_dir}` (this stage's checkpoints alone), or set `{section}.resume: "
            f"false` (`dvc exp run -S {section}.resume=false`)")
    return steps[resume_from], set_aside
