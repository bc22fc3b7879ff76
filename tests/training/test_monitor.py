"""The training monitor's read of a step's logged values."""
import torch

from storyrewrite.training import monitor


def test_logs_on_two_devices_are_read_with_one_stack_per_device(monkeypatch):
    """RLOO logs rewards it computed on the CPU beside the GPU's loss; CUDA refuses to stack tensors
    of two devices. The `meta` device stands in for the GPU here: the stack refuses a mix as CUDA
    does, and gives the meta group stand-in values, since a meta tensor holds none."""
    stack, groups = torch.stack, []

    def one_device_stack(tensors):
        devices = {t.device.type for t in tensors}
        assert len(devices) == 1, f"one stack over devices {devices}"
        groups.append(len(tensors))
        if devices == {"meta"}:
            return torch.arange(len(tensors), dtype=torch.float32) + 100
        return stack(tensors)

    monkeypatch.setattr(torch, "stack", one_device_stack)
    logs = {"loss": torch.empty((), device="meta"), "reward": torch.tensor(-2.5, dtype=torch.float64),
            "grad_norm": torch.empty(1, device="meta"), "sample_seconds": torch.tensor(0.25)}
    values = monitor.read_logs(logs)
    assert list(values) == list(logs)  # the logged order, whatever the devices
    assert values == {"loss": 100.0, "reward": -2.5, "grad_norm": 101.0, "sample_seconds": 0.25}
    assert sorted(groups) == [2, 2]
    groups.clear()
    assert monitor.read_logs({"a": torch.tensor(1.0), "b": torch.tensor([2.0])}) == {"a": 1.0, "b": 2.0} and groups == [2]


def test_the_seconds_spent_validating_add_up_each_validation_and_nothing_between(tmp_path):
    """`validate_seconds` (the train stage's record's `validate_s`): from each validation's start
    to its end, Lightning's sanity check included; the time between two validations, where
    training steps run, is not. A trainer stand-in on a process that logs nothing."""
    import time
    import types

    watched = monitor.TrainingMonitor(tmp_path / "logs", tmp_path / "snapshot", "train", "nll")
    trainer = types.SimpleNamespace(sanity_checking=True, callback_metrics={"val_loss": torch.tensor(2.5)}, optimizers=[],
                                    is_global_zero=False, global_step=0, precision_plugin=None)
    started = time.perf_counter()
    for sanity in (True, False, False):
        trainer.sanity_checking = sanity
        watched.on_validation_start(trainer, None)
        time.sleep(0.1)
        watched.on_validation_end(trainer, None)
        time.sleep(0.3)  # training steps
    elapsed = time.perf_counter() - started
    assert 0.3 <= watched.validate_seconds <= elapsed - 0.9
    watched.on_validation_end(trainer, None)  # an end without its start (never seen) adds nothing
    assert watched.validate_seconds <= elapsed - 0.9
