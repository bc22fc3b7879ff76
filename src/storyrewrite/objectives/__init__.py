"""Training objectives, registered by name.

An objective is a pure function of tensors (formula in its docstring) plus a registry entry
saying how to get those tensors from the generator and a batch. The Lightning module looks the
objective up here and never branches on its name, so a new objective is one function and one
line in `OBJECTIVES`.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from storyrewrite.models.encoding import target_logits
from storyrewrite.objectives.nll import nll_loss
from storyrewrite.io import InputError


@dataclass(frozen=True)
class Objective:
    name: str
    # (generator, batch) -> scalar loss; the batch comes from `storyrewrite.models.encoding`.
    loss: Callable[[PreTrainedModel, dict], torch.Tensor]
    description: str


def _nll(generator: PreTrainedModel, batch: dict) -> torch.Tensor:
    return nll_loss(target_logits(generator, batch), batch["target_ids"], batch["target_mask"])


OBJECTIVES: dict[str, Objective] = {
    "nll": Objective("nll", _nll, "negative log-likelihood of the edited ending"),
}


def get_objective(name: str) -> Objective:
    if name not in OBJECTIVES:
        raise InputError(f"params: `objective` = {name!r} is not valid; valid values: {', '.join(OBJECTIVES)}")
    return OBJECTIVES[name]
