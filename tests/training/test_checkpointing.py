"""Checkpoints that survive a crash during their save, a clear stop on one that cannot be read,
and the free-space check."""
import io
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from storyrewrite.curves import read_curves
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
    # Saved after every step but the last: a finished run is never resumed.
    assert torch.load(tmp_path / "whole" / "ckpt" / "last.ckpt", weights_only=False, mmap=True)["global_step"] == 3

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
    # The torn write went to a temporary file, removed; last.ckpt is the step-2 checkpoint, whole
    # (plan.json: the training's plan, written as it started).
    assert sorted(p.name for p in directory.iterdir()) == ["curves", "fingerprint.txt", "last.ckpt", "plan.json"]
    assert torch.load(directory / "last.ckpt", weights_only=False)["global_step"] == 2
    summary = _fit(tmp_path / "torn", run)
    assert summary["resumed_from_step"] == 2 and summary["global_step"] == 4
    whole, resumed = (load_file(tmp_path / name / "out" / "model.safetensors") for name in ("whole", "torn"))
    assert whole.keys() == resumed.keys() and all(torch.equal(whole[k], resumed[k]) for k in whole)


class Crash(Exception):
    pass


def _crash_at(step: int):
    from lightning.pytorch.callbacks import Callback

    class CrashAt(Callback):
        def on_train_batch_end(self, trainer, *args):
            if trainer.global_step == step:
                raise Crash()

    return CrashAt()


def test_a_truncated_last_checkpoint_is_set_aside_and_stops_the_stage_with_one_line(tmp_path, tiny_model_dirs, small_prepared,
                                                                                    capsys):
    run = tiny_run(tiny_model_dirs["llama"], small_prepared, max_steps=4, checkpoint_every_n_steps=1, val_check_interval=4)
    with pytest.raises(Crash):
        fit(run, tmp_path / "out", tmp_path / "ckpt", tmp_path / "logs", callbacks=(_crash_at(2),))
    last = tmp_path / "ckpt" / "last.ckpt"
    last.write_bytes(last.read_bytes()[: last.stat().st_size // 2])  # what an old, non-atomic save could leave
    with pytest.raises(SystemExit) as stopped:
        run_stage(lambda: fit(run, tmp_path / "out", tmp_path / "ckpt", tmp_path / "logs"))
    assert stopped.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[-2].startswith(f"warning: {last}: cannot be read (") and "failed finding central directory" in lines[-2]
    assert lines[-2].endswith("moved aside as last.ckpt.corrupt")
    assert lines[-1] == (f"error: {tmp_path / 'ckpt'}: no checkpoint to resume train_nll from loads (set aside: "
                         f"last.ckpt.corrupt). To train from step 0 (the interrupted run's steps are lost): "
                         f"`rm -rf {tmp_path / 'ckpt'}` (this stage's checkpoints alone), or set `train_nll.resume: false` "
                         f"(`dvc exp run -S train_nll.resume=false`)")
    assert (tmp_path / "ckpt" / "last.ckpt.corrupt").exists() and not last.exists()
    # resume: false starts afresh (the unreadable file is not even opened).
    from dataclasses import replace

    summary = fit(replace(run, config=run.config.model_copy(update={"resume": False})), tmp_path / "out", tmp_path / "ckpt",
                  tmp_path / "logs")
    assert summary["resumed_from_step"] is None and summary["global_step"] == 4


def test_a_truncated_best_checkpoint_beside_a_whole_last_one_costs_no_step(tmp_path, tiny_model_dirs, small_prepared, capsys):
    """best.ckpt torn, last.ckpt whole: the run resumes from last.ckpt's step, best.ckpt is set
    aside with a warning, and the best is tracked afresh, so the export still happens."""
    run = tiny_run(tiny_model_dirs["llama"], small_prepared, max_steps=6, checkpoint_every_n_steps=1, val_check_interval=2)
    with pytest.raises(Crash):  # in step 4's end, before its checkpoint and validation
        fit(run, tmp_path / "out", tmp_path / "ckpt", tmp_path / "logs", callbacks=(_crash_at(4),))
    best, last = tmp_path / "ckpt" / "best.ckpt", tmp_path / "ckpt" / "last.ckpt"
    assert torch.load(best, weights_only=False)["global_step"] == 2 and torch.load(last, weights_only=False)["global_step"] == 3
    last_bytes = last.read_bytes()
    best.write_bytes(best.read_bytes()[: best.stat().st_size // 2])
    summary = fit(run, tmp_path / "out", tmp_path / "ckpt", tmp_path / "logs")
    assert summary["resumed_from_step"] == 3 and summary["global_step"] == 6
    assert f"warning: {best}: cannot be read (" in capsys.readouterr().err
    assert (tmp_path / "ckpt" / "best.ckpt.corrupt").exists() and last.read_bytes() != last_bytes  # kept, then saved on
    # The best of the validations after the resume (steps 4 and 6) is exported.
    assert summary["best_step"] in (4, 6) and torch.load(best, weights_only=False)["global_step"] == summary["best_step"]
    assert (tmp_path / "out" / "model.safetensors").exists()


def test_the_best_tracked_afresh_survives_a_second_interruption(tmp_path, tiny_model_dirs, small_prepared, recwarn):
    """After a resume that set a torn best.ckpt aside, last.ckpt keeps the new best's score under
    the key the best checkpoint's callback reads: a second resume restores it (without it, the
    next validation would replace best.ckpt whatever its loss), and Lightning finds every
    callback's state (no warning that one is missing)."""
    from lightning.pytorch.callbacks import Callback

    run = tiny_run(tiny_model_dirs["llama"], small_prepared, max_steps=8, checkpoint_every_n_steps=1, val_check_interval=2)
    with pytest.raises(Crash):
        fit(run, tmp_path / "out", tmp_path / "ckpt", tmp_path / "logs", callbacks=(_crash_at(4),))
    best, last = tmp_path / "ckpt" / "best.ckpt", tmp_path / "ckpt" / "last.ckpt"
    best.write_bytes(best.read_bytes()[: best.stat().st_size // 2])
    with pytest.raises(Crash):  # resumed from step 3, best tracked afresh from step 4's validation
        fit(run, tmp_path / "out", tmp_path / "ckpt", tmp_path / "logs", callbacks=(_crash_at(6),))
    saved = torch.load(last, weights_only=False)
    assert saved["global_step"] == 5 and torch.load(best, weights_only=False)["global_step"] == 4
    [score] = [state["best_model_score"] for key, state in saved["callbacks"].items() if "'monitor': 'val_loss'" in key]

    restored = []

    class Restored(Callback):
        def on_train_start(self, trainer, module):
            restored.append(trainer.checkpoint_callback.best_model_score)

    summary = fit(run, tmp_path / "out", tmp_path / "ckpt", tmp_path / "logs", callbacks=(Restored(),))
    assert summary["resumed_from_step"] == 5 and summary["global_step"] == 8
    assert restored[0] is not None and float(restored[0]) == float(score)
    assert not [w for w in recwarn if "callbacks used to create the checkpoint" in str(w.message)]


def _crash_in_validation_at(step: int):
    from lightning.pytorch.callbacks import Callback

    class CrashInValidation(Callback):
        def on_validation_start(self, trainer, *args):
            if trainer.global_step == step and trainer.state.fn == "fit":
                raise Crash()

    return CrashInValidation()


@pytest.mark.parametrize("crash", ["during the validation", "after it"])
def test_a_run_killed_around_a_validation_resumes_with_every_validation_of_an_uninterrupted_run(
        tmp_path, tiny_model_dirs, small_prepared, crash):
    """Killed during step 4's validation, the run resumes from step 3's last.ckpt (not from a
    save before that validation, past which Lightning would resume without it) and validates at
    step 4; killed after it, from the save made once it ended, without validating twice. Either
    way the curves, the best step and the exported weights are the uninterrupted run's."""
    run = tiny_run(tiny_model_dirs["llama"], small_prepared, max_steps=6, checkpoint_every_n_steps=1, val_check_interval=2)
    whole = _fit(tmp_path / "whole", run)
    killer, saved_at = (_crash_in_validation_at(4), 3) if crash == "during the validation" else (_crash_at(5), 4)
    with pytest.raises(Crash):
        fit(run, tmp_path / "out", tmp_path / "ckpt", tmp_path / "logs", callbacks=(killer,))
    assert torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=False)["global_step"] == saved_at
    resumed = fit(run, tmp_path / "out", tmp_path / "ckpt", tmp_path / "logs")
    assert resumed["resumed_from_step"] == saved_at
    expected, got = read_curves(tmp_path / "whole" / "logs")["val_loss"], read_curves(tmp_path / "logs")["val_loss"]
    assert [row["step"] for row in got] == [row["step"] for row in expected] == [0, 2, 4, 6]
    assert [row["value"] for row in got] == pytest.approx([row["value"] for row in expected], rel=1e-5)
    assert resumed["best_step"] == whole["best_step"]
    weights, expected_weights = load_file(tmp_path / "out" / "model.safetensors"), load_file(tmp_path / "whole" / "out" / "model.safetensors")
    assert all(torch.allclose(weights[name], expected_weights[name], atol=1e-6) for name in expected_weights)


def test_with_accumulation_a_validation_after_a_saved_step_adds_no_save(tmp_path, tiny_model_dirs, small_prepared):
    """Two batches a step, a validation every 3 batches, last.ckpt every 2 steps: the validation
    after batch 9 shares step 4 with the save after batch 8, so nothing waits for it, and no
    last.ckpt is written at max_steps (step 6, after batch 12's validation)."""
    run = tiny_run(tiny_model_dirs["llama"], small_prepared, max_steps=6, checkpoint_every_n_steps=2, val_check_interval=3,
                   accumulate_grad_batches=2)
    summary = _fit(tmp_path, run)
    assert summary["global_step"] == 6
    assert torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=False)["global_step"] == 4
    assert [row["step"] for row in read_curves(tmp_path / "logs")["val_loss"]] == [0, 1, 3, 4, 6]


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


def test_unreadable_checkpoints_of_other_kinds_are_set_aside_too(tmp_path):
    for content in (b"", b"not a checkpoint\n"):
        folder = tmp_path / str(len(content))
        folder.mkdir()
        (folder / "last.ckpt").write_bytes(content)
        with pytest.raises(UnreadableCheckpoint, match=r"no checkpoint to resume train from loads \(set aside: last.ckpt.corrupt\)"):
            checkpointing.resume_point(folder, "train")
        assert [p.name for p in folder.iterdir()] == ["last.ckpt.corrupt"]
