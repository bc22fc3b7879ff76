"""Where a stage runs its models: the params' `device`, resolved against the machine.

Importable without transformers (generation, metrics, the LLM backends and the bench scripts
use it without loading any model code).
"""
from __future__ import annotations

import torch

from storyrewrite.io import InputError
from storyrewrite.parallel import assigned_gpu


def resolve_device(spec: str) -> torch.device:
    """The params' `device`: `auto` is a CUDA GPU if there is one (the first; with several
    concurrent workers and several GPUs, the one this process holds: storyrewrite.parallel),
    else the CPU; `cpu`, `cuda` and `cuda:N` are taken as they are (a GPU that is not there is
    an error)."""
    if spec == "auto":
        if not torch.cuda.is_available():
            return torch.device("cpu")
        index = assigned_gpu(torch.cuda.device_count())
        return torch.device("cuda" if index is None else f"cuda:{index}")
    device = torch.device(spec)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise InputError(f"params: `device` = {spec!r}, but CUDA is not available here; valid values: auto, cpu")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise InputError(f"params: `device` = {spec!r}, but there are {torch.cuda.device_count()} GPU(s)")
    return device
