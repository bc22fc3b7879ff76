"""Where a stage runs its models, and what a CUDA device sets for them."""
import pytest
import torch

from storyrewrite.io import InputError
from storyrewrite.models import device as device_module
from storyrewrite.models.device import attention_off_cudnn, resolve_device, set_fp32_matmul


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


def test_tf32_products_are_set_on_a_cuda_device_only_and_named_in_the_record():
    """`score.fp32_matmul`: on CUDA torch's flag is set (either way) and the stage record names TF32
    where it applies to float32 weights; a CPU has no TF32 and its setting is left as it is."""
    before = torch.backends.cuda.matmul.fp32_precision
    assert set_fp32_matmul(torch.device("cpu"), "float32", "tf32") == "float32"
    assert torch.backends.cuda.matmul.fp32_precision == before
    assert set_fp32_matmul(torch.device("cuda:0"), "float32", "tf32") == "float32 (tf32 matmul)"
    assert torch.backends.cuda.matmul.fp32_precision == "tf32"
    assert set_fp32_matmul(torch.device("cuda:0"), "bfloat16", "tf32") == "bfloat16"  # no float32 weights to round
    assert set_fp32_matmul(torch.device("cuda"), "float32", "ieee") == "float32"
    assert torch.backends.cuda.matmul.fp32_precision == "ieee"


def test_a_named_gpu_that_is_not_there_is_refused_naming_the_param(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(InputError, match=r"^params: `device` = 'cuda', but CUDA is not available here; valid values: auto, cpu$"):
        resolve_device("cuda")
    assert resolve_device("auto") == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(device_module, "attention_off_cudnn", lambda device: None)  # (nothing process-wide here)
    monkeypatch.setattr(device_module, "share_gpu_memory", lambda device: None)
    assert resolve_device("cuda:1") == torch.device("cuda:1")  # the second of two
    with pytest.raises(InputError, match=r"^params: `device` = 'cuda:2', but there are 2 GPU\(s\)$"):
        resolve_device("cuda:2")
