"""Where a stage runs its models, and what a CUDA device sets for them."""
import torch

from storyrewrite.models import device as device_module
from storyrewrite.models.device import attention_off_cudnn, resolve_device


def test_a_cuda_device_keeps_attention_off_cudnn_and_a_cpu_leaves_it(monkeypatch):
    """cuDNN builds an attention plan per new shape; on CUDA the project's attention runs on
    torch's other kernels. On a CPU torch's setting is left as it is."""
    assert torch.backends.cuda.cudnn_sdp_enabled()  # torch's default, restored after every test (conftest)
    assert resolve_device("cpu") == torch.device("cpu") and torch.backends.cuda.cudnn_sdp_enabled()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(device_module, "assigned_gpu", lambda count: None)
    assert resolve_device("auto") == torch.device("cuda") and not torch.backends.cuda.cudnn_sdp_enabled()
    torch.backends.cuda.enable_cudnn_sdp(True)
    attention_off_cudnn(torch.device("cuda:0"))
    assert not torch.backends.cuda.cudnn_sdp_enabled()
