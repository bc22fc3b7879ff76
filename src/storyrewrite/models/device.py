"""Where a stage runs its models: the params' `device`, resolved against the machine.

Importable without transformers (generation, metrics, the LLM backends and the bench scripts
use it without loading any model code).
"""
from __future__ import annotations

import torch

from storyrewrite.io import InputError
from storyrewrite.parallel import assigned_gpu, share_gpu_memory


def resolve_device(spec: str) -> torch.device:
    """The params' `device`: `auto` is a CUDA GPU if there is one (the first; with several
    concurrent workers and several GPUs, the one this process holds: storyrewrite.parallel),
    else the CPU; `cpu`, `cuda` and `cuda:N` are taken as they are (a GPU that is not there is
    an error). A CUDA device also keeps attention off cuDNN's kernels (`attention_off_cudnn`), and a
    GPU that several workers share gives this process its share of the memory (`share_gpu_memory`)."""
    device = _resolve(spec)
    attention_off_cudnn(device)
    share_gpu_memory(device)
    return device


def attention_off_cudnn(device: torch.device) -> None:
    """On a CUDA device, torch's scaled-dot-product attention runs on its flash or memory-efficient
    kernels, never cuDNN's (process-wide). On Hopper and newer GPUs with a recent cuDNN, torch tries
    cuDNN's first, and cuDNN builds an execution plan for every new shape it meets, a fraction of a
    second each, where generation's decoding steps and scoring's batches change shape all the time
    (docs/gpu.md, Status). The kernels differ in rounding only. Nothing changes on a CPU. Training
    needs no call: its Trainer runs torch's deterministic algorithms, which never choose cuDNN's
    attention."""
    if device.type == "cuda":
        torch.backends.cuda.enable_cudnn_sdp(False)


def set_fp32_matmul(device: torch.device, dtype: str, precision: str) -> str:
    """Process-wide, the precision of float32 matrix products on a CUDA `device` (torch's
    `backends.cuda.matmul.fp32_precision`): `ieee`, float32 throughout; `tf32`, TensorFloat-32
    tensor cores on Ampere and newer GPUs (inputs rounded to 10 mantissa bits, sums in float32).
    Returns the weights' precision as a stage record names it: `dtype`, or `float32 (tf32
    matmul)` where TF32 applies (float32 weights on a GPU); a CPU has no TF32 and is left as it is."""
    if device.type != "cuda":
        return dtype
    torch.backends.cuda.matmul.fp32_precision = precision
    return f"{dtype} (tf32 matmul)" if precision == "tf32" and dtype == "float32" else dtype


def _resolve(spec: str) -> torch.device:
    if spec == "auto":
        if not torch.cuda.is_available():
            return torch.device("cpu")
        index = assigned_gpu(torch.cuda.device_count())
        return torch.device("cuda" if index is None else f"cuda:{index}")
    device = torch.device(spec)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise InputError(f"params: `device` = {spec!r}, but CUDA is not available here; valid values: auto, cpu", key="device")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise InputError(f"params: `device` = {spec!r}, but there are {torch.cuda.device_count()} GPU(s)", key="device")
    return device
