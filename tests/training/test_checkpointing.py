"""Checkpoints that survive a crash during their save, a clear stop on one that cannot be read,
and the free-space check."""
import io
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from storyrewrite.io import run_stage
from storyrewrite.training import checkpointing
from storyrewrite.training.checkpointing import AtomicCheckpointIO, CheckpointSpaceError, UnreadableCheckpoint, tensor_bytes
from storyrewrite.training.run import fit

from helpers import tiny_run


class TornWrite(io.RawIOBase):
    """A file that fails after `limit` bytes, as a full disk or a kill would stop a save."""

    def __init__(self, f, limit: int):
        self.f, self.limit, self.written = f, limit, 0

    def writable(self):
        return True

    def write(self, data):
        if self.written + len(data) > self.limit:
            self.f.write(bytes(data[: self.limit - self.written]))
            self.f.flush()
            raise OSError(28, "No space left on device (injected)")
        self.written += len(data)
        return self.f.write(data)

    def flush(self):
        self.f.flush()

    def fileno(self):
        return self.f.fileno()

    def close(self):
        self.f.close()


def _fit(directory: Path, run):
    return fit(run, directory / "out", directory / "ckpt", directory / "logs")


def test_a_save_killed_midway_keeps_the_previous_checkpoint_and_the_rerun_ends_where_an_uninterrupted_run_does(
        tmp_path, tiny_model_dirs, small_prepared, monkeypatch):
    run = tiny_run(tiny_model_dirs["llama"], small_prepared, max_steps=4, checkpoint_every_n_steps=1, val_check_interval=4)
    _fit(tmp_path / "whole", run)

    saves, fdopen = [], checkpointing.os.fdopen

    def torn_third_save(fd, *args, **kwargs):
        f = fdopen(fd, *args, **kwargs)
        if ".ckpt." not in os.readlink(f"/proc/self/fd/{fd}"):  # another file opened from a descriptor
            return f
        saves.append(fd)
        return TornWrite(f, limit=50_000) if len(saves) == 3 else f

    monkeypatch.setattr(checkpointing.os, "fdopen", torn_third_save)
    with pytest.raises((OSError, RuntimeError)):  # torch.save's writer reports the failed write its own way
        _fit(tmp_path / "torn", run)
    assert len(saves) == 3
    monkeypatch.undo()
    directory = tmp_path / "torn" / "ckpt"
    # The torn write went to a temporary file, removed; last.ckpt is the step-2 checkpoint, whole.
    assert sorted(p.name for p in directory.iterdir()) == ["curves", "fingerprint.txt", "last.ckpt"]
    assert torch.load(directory / "last.ckpt", weights_only=False)["global_step"] == 2
    summary = _fit(tmp_path / "torn", run)
    assert summary["resumed_from_step"] == 2 and summary["global_step"] == 4
    whole, resumed = (load_file(tmp_path / name / "out" / "model.safetensors") for name in ("whole", "torn"))
    assert whole.keys() == resumed.keys() and all(torch.equal(whole[k], resumed[k]) for k in whole)


def test_a_truncated_checkpoint_stops_the_stage_with_one_line_and_exit_2(tmp_path, tiny_model_dirs, small_prepared, capsys):
    run = tiny_run(tiny_model_dirs["llama"], small_prepared, max_steps=4, checkpoint_every_n_steps=1, val_check_interval=4)

    class Crash(Exception):
        pass

    from lightning.pytorch.callbacks import Callback

    class CrashAtStep2(Callback):
        def on_train_batch_end(self, trainer, *args):
            if trainer.global_step == 2:
                raise Crash()

    with pytest.raises(Crash):
        fit(run, tmp_path / "out", tmp_path / "ckpt", tmp_path / "logs", callbacks=(CrashAtStep2(),))
    last = tmp_path / "ckpt" / "last.ckpt"
    last.write_bytes(last.read_bytes()[: last.stat().st_size // 2])  # what an old, non-atomic save could leave
    with pytest.raises(SystemExit) as stopped:
        run_stage(lambda: fit(run, tmp_path / "out", tmp_path / "ckpt", tmp_path / "logs"))
    assert stopped.value.code == 2
    message = capsys.readouterr().err.strip().splitlines()[-1]
    assert message.startswith(f"error: {last}: cannot be read (") and "failed finding central directory" in message
    assert "`make clean-checkpoints`, or set `train_nll.resume: false` (`dvc exp run -S train_nll.resume=false`)" in message
    # resume: false starts afresh (the unreadable file is not even opened).
    from dataclasses import replace

    summary = fit(replace(run, config=run.config.model_copy(update={"resume": False})), tmp_path / "out", tmp_path / "ckpt",
                  tmp_path / "logs")
    assert summary["resumed_from_step"] is None and summary["global_step"] == 4


def test_the_free_space_check_names_the_directory_and_the_bytes(tmp_path, monkeypatch):
    checkpoint = {"state_dict": {"w": torch.zeros(1000, 1000), "tied": None}, "global_step": 3}
    checkpoint["state_dict"]["tied"] = checkpoint["state_dict"]["w"]  # one storage, counted once
    assert tensor_bytes(checkpoint) == 4_000_000

    class Usage:
        free = 1_000_000

    monkeypatch.setattr(checkpointing.shutil, "disk_usage", lambda path: Usage)
    with pytest.raises(CheckpointSpaceError, match=rf"{tmp_path}: 0.02 GB needed to write last.ckpt beside the previous "
                                                   r"checkpoint, 0.00 GB free"):
        AtomicCheckpointIO().save_checkpoint(checkpoint, tmp_path / "last.ckpt")
    assert list(tmp_path.iterdir()) == []


def test_unreadable_checkpoints_of_other_kinds_are_named_too(tmp_path):
    for name, content in (("empty.ckpt", b""), ("text.ckpt", b"not a checkpoint\n")):
        (tmp_path / name).write_bytes(content)
        with pytest.raises(UnreadableCheckpoint, match=rf"{name}: cannot be read \(.+\), so the interrupted run"):
            checkpointing.check_readable(tmp_path / name, "train")
