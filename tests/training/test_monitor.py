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
