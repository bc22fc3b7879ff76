"""Training objectives, registered by name.

Each objective is a pure function of tensors (its formula in its docstring: `nll.py`, `cpo.py`,
`dto.py`) plus a registry entry saying how to get those tensors from the generator and a batch,
what it needs (its params section, a scorer, the original ending, chosen/rejected pairs), which
tasks it serves and how reports name it. A built objective returns the loss with its terms and
its diagnostics (logged with the training curves). The training code calls it and never branches
on the name: a new objective is one function and one entry in `OBJECTIVES`.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel

from storyrewrite.data.schema import TASK_COLUMNS
from storyrewrite.io import InputError
from storyrewrite.metrics.lm_scorer import LMScorer
from storyrewrite.models.encoding import target_logits
from storyrewrite.models.logprobs import token_log_probs
from storyrewrite.objectives.cpo import cpo_diagnostics, cpo_loss
from storyrewrite.objectives.dto import delta_loss, gumbel_softmax, gumbel_statistics, score_delta_loss, score_loss
from storyrewrite.objectives.nll import nll_loss, token_accuracy


@dataclass
class LossOutput:
    loss: torch.Tensor  # the scalar that is optimised
    terms: dict[str, torch.Tensor]  # what the loss is made of (detached scalars): a non-finite one stops training
    # The teacher-forced NLL of Y_EE (detached), always given in validation: the validation NLL,
    # comparable across objectives.
    nll: torch.Tensor | None
    # Detached scalars for the training curves, computed only when called (under no_grad, from
    # tensors the step already has), so that a run without diagnostics pays nothing for them.
    diagnostics: Callable[[], dict[str, torch.Tensor]] = field(default=dict)


# (generator, batch, noise seed, validation) -> LossOutput. The batch layout is
# storyrewrite.models.encoding's, plus the texts `targets` and `original_endings`, and `pair`
# (chosen + rejected) for CPO. `validation` may compute more (e.g. M(Ŷ, X_OE) for DTO-Score).
LossFn = Callable[[PreTrainedModel, dict, int, bool], LossOutput]


@dataclass(frozen=True)
class ObjectiveContext:
    """What an objective may be built from."""

    settings: Any = None  # its params section (`Objective.settings`), e.g. DTOConfig
    scorer_dir: Path | None = None  # the frozen scorer's model directory (`needs_scorer`)
    max_input_tokens: int = 1024
    max_output_tokens: int = 250


@dataclass(frozen=True)
class Loss:
    """A built objective, and the frozen scorer it runs, if any (the training code moves it to
    the training device; it is never trained, and never saved in checkpoints)."""

    compute: LossFn
    scorer: LMScorer | None = None

    def __call__(self, generator: PreTrainedModel, batch: dict, noise_seed: int, validation: bool = False) -> LossOutput:
        return self.compute(generator, batch, noise_seed, validation)


@dataclass(frozen=True)
class Objective:
    name: str
    label: str  # how reports name it
    description: str
    build: Callable[[ObjectiveContext], Loss]
    settings: str | None = None  # the params section it reads (the stage reads no other)
    needs_scorer: bool = False
    needs_original_ending: bool = False
    pairs: bool = False  # the batch carries chosen (edited) and rejected (original) endings
    main_diagnostics: tuple[str, ...] = ()  # what the report's training section shows, first → last


def _nll(context: ObjectiveContext) -> Loss:
    def compute(generator: PreTrainedModel, batch: dict, noise_seed: int, validation: bool) -> LossOutput:
        logits = target_logits(generator, batch)  # B×T×V
        loss = nll_loss(logits, batch["target_ids"], batch["target_mask"])

        def diagnostics() -> dict[str, torch.Tensor]:
            return {"token_accuracy": token_accuracy(logits.detach(), batch["target_ids"], batch["target_mask"])}
        return LossOutput(loss, {}, loss.detach(), diagnostics)
    return Loss(compute)


def _cpo(context: ObjectiveContext) -> Loss:
    beta, lambda_ = context.settings.beta, context.settings.lambda_

    def compute(generator: PreTrainedModel, batch: dict, noise_seed: int, validation: bool) -> LossOutput:
        pair = batch["pair"]  # rows 0..B-1: x → edited ending (chosen); B..2B-1: x → original ending
        logits = target_logits(generator, pair)  # one forward for chosen and rejected: 2B×T×V
        mask = pair["target_mask"].to(torch.float32)
        sequence_logps = (token_log_probs(logits, pair["target_ids"]) * mask).sum(dim=1)  # 2B
        size = len(batch["ids"])
        chosen, rejected = sequence_logps[:size], sequence_logps[size:]
        chosen_nll = nll_loss(logits[:size], pair["target_ids"][:size], pair["target_mask"][:size])
        loss, terms = cpo_loss(chosen, rejected, chosen_nll, beta, lambda_)
        return LossOutput(loss, {k: v.detach() for k, v in terms.items()}, chosen_nll.detach(),
                          lambda: cpo_diagnostics(chosen.detach(), rejected.detach(), beta))
    return Loss(compute)


def _dto(combine: Callable[..., torch.Tensor], with_original: bool) -> Callable[[ObjectiveContext], Loss]:
    def build(context: ObjectiveContext) -> Loss:
        config = context.settings
        scorer = LMScorer.from_dir(context.scorer_dir, context.max_input_tokens, context.max_output_tokens,
                                   dtype=config.scorer_dtype)
        vocab = scorer.model.get_input_embeddings().weight.shape[0]

        def compute(generator: PreTrainedModel, batch: dict, noise_seed: int, validation: bool) -> LossOutput:
            # One teacher-forced generator forward: logits at each target position, B×T×V.
            logits = target_logits(generator, batch)
            if logits.shape[-1] < vocab:
                raise InputError(f"the generator has {logits.shape[-1]} output logits but the scorer {vocab} embeddings")
            # Rows beyond the tokenizer's vocabulary (padding of the embedding matrix) are dropped.
            probs = gumbel_softmax(logits[..., :vocab], config.tau, config.hard, noise_seed)  # B×T×V
            # Validation scores X_OE for every variant (for m_original and delta), where the task has it.
            score_original = with_original or (validation and "original_endings" in batch)
            target_sets = [batch["targets"]] + ([batch["original_endings"]] if score_original else [])
            # The soft ending Ŷ is the scorer's source; padding positions are masked out.
            scores = scorer.score_soft_many(probs, batch["target_mask"], target_sets)  # each B
            loss = combine(*scores[: 2 if with_original else 1])
            terms = {"m_target": scores[0].detach().mean()}
            if with_original:
                terms["m_original"] = scores[1].detach().mean()

            def target_nll() -> torch.Tensor:  # an extra log-softmax over B×T×V: only when asked for
                return nll_loss(logits.detach(), batch["target_ids"], batch["target_mask"])
            nll = target_nll() if validation else None

            def diagnostics() -> dict[str, torch.Tensor]:
                values = {**gumbel_statistics(probs.detach(), batch["target_mask"]),
                          "nll_target": nll if nll is not None else target_nll()}
                if score_original:
                    values["m_original"] = scores[1].detach().mean()
                    values["delta"] = (scores[0] - scores[1]).detach().mean()
                return values
            return LossOutput(loss, terms, nll, diagnostics)
        return Loss(compute, scorer)
    return build


_DTO_MAIN = ("m_target", "m_original", "delta", "gumbel_max_prob", "nll_target")

OBJECTIVES: dict[str, Objective] = {
    "nll": Objective("nll", "NLL", "negative log-likelihood of the edited ending", _nll,
                     main_diagnostics=("token_accuracy",)),
    "cpo": Objective("cpo", "CPO", "CPO: edited ending preferred to the original ending", _cpo, settings="cpo",
                     needs_original_ending=True, pairs=True,
                     main_diagnostics=("rewards/margins", "rewards/accuracies", "nll_term")),
    "score": Objective("score", "DTO-Score", "DTO: −M(Ŷ, Y_EE)", _dto(score_loss, False), settings="dto",
                       needs_scorer=True, main_diagnostics=_DTO_MAIN),
    "delta": Objective("delta", "DTO-Delta", "DTO: −[M(Ŷ, Y_EE) − M(Ŷ, X_OE)]", _dto(delta_loss, True), settings="dto",
                       needs_scorer=True, needs_original_ending=True, main_diagnostics=_DTO_MAIN),
    "score_delta": Objective("score_delta", "DTO-Score+Delta", "DTO: −[2·M(Ŷ, Y_EE) − M(Ŷ, X_OE)]",
                             _dto(score_delta_loss, True), settings="dto", needs_scorer=True,
                             needs_original_ending=True, main_diagnostics=_DTO_MAIN),
}


def get_objective(name: str, task: str) -> Objective:
    """The objective `name`, checked against the task: one that needs the original ending is
    refused where the task has none, naming the objectives that work there."""
    if name not in OBJECTIVES:
        raise InputError(f"params: `objective` = {name!r} is not valid; valid values: {', '.join(OBJECTIVES)}")
    objective = OBJECTIVES[name]
    if objective.needs_original_ending and "original_ending" not in TASK_COLUMNS[task]:
        usable = [n for n, o in OBJECTIVES.items() if not o.needs_original_ending]
        raise InputError(f"params: `objective` = {name!r} needs the original ending, which task {task!r} does not have; "
                         f"objectives for this task: {', '.join(usable)}")
    return objective
