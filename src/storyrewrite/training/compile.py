"""torch.compile of the models a training step runs (`compile: true` in a training section)."""
from __future__ import annotations

from typing import Any

import torch
from transformers import PreTrainedModel


def compile_body(model: PreTrainedModel, backend: Any = "inductor", mode: str | None = None) -> None:
    """torch.compile, in place, the parts of `model` that this package calls: a seq2seq LM whole
    and its encoder (which a DTO scorer runs on its own); a causal LM's transformer body
    (`base_model`), whose output projection our code applies to the positions it needs
    (encoding.causal_tail_logits). Dynamic shapes, so that a batch of another length reuses the
    compiled code (a batch of one compiles its own). `nn.Module.compile` wraps the call, not the
    module: parameter names, checkpoints and `save_pretrained` stay those of the plain model.
    Compiling happens at the first call in each mode (training, validation).

    `mode` is inductor's (`reduce-overhead`: the compiled kernels captured and replayed as CUDA
    graphs, one graph per input shape, hence length buckets); another backend takes none."""
    # The graphs of every compiled model, mode and input kind (token ids, or a DTO scorer's soft
    # embeddings) are cached under one code object, transformers' forward wrapper. A tiny
    # DTO-Score+Delta run with validation compiled 8 times, the default limit per code object,
    # past which a new graph would run eagerly.
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    bodies = (model, model.get_encoder()) if model.config.is_encoder_decoder else (model.base_model,)
    for body in bodies:
        body.compile(dynamic=True, backend=backend, **({"mode": mode} if mode and backend == "inductor" else {}))
