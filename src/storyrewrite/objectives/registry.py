"""The objective registry: every training objective by name, with what it needs, without its code.

An entry says which module holds the objective's code (its loss, a pure function of tensors with
its formula in the docstring, and the builder that gets those tensors from the generator and a
batch), which params section it reads (typed), what it needs (a scorer, the original ending,
chosen/rejected pairs), which tasks it serves and how reports name it. The module is imported
only when the objective is built: the NLL baseline (`train_nll`) runs, and depends on, the NLL
code alone, so an edit to a DTO loss reruns `train`, not the NLL model every system starts from.
A built objective returns the loss with its terms and its diagnostics (logged with the training
curves). The training code calls it and never branches on the name: a new objective is one module
(loss + `build`) and one entry in `OBJECTIVES`.
"""
from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Generic, TypeVar

from storyrewrite.data.schema import TASK_COLUMNS
from storyrewrite.io import InputError
from storyrewrite.params import CPOConfig, DTOConfig, RLConfig, Section

if TYPE_CHECKING:  # the registry names objectives without loading torch: `params check` reads it
    import torch
    from transformers import PreTrainedModel

S = TypeVar("S", bound=Section)


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
LossFn = Callable[["PreTrainedModel", dict, int, bool], LossOutput]


@dataclass(frozen=True)
class ObjectiveContext(Generic[S]):
    """What an objective is built from: its own params section (typed: `Objective.settings`)."""

    settings: S | None = None
    scorer_dir: Path | None = None  # the frozen scorer's model directory (`needs_scorer`)
    max_input_tokens: int = 1024
    max_output_tokens: int = 250
    init_dir: Path | None = None  # the starting weights (a reference model for a KL term)
    pad_to_multiple_of: int | None = None  # the training section's length buckets (models.encoding.Encoder)


@dataclass(frozen=True)
class Loss:
    """A built objective, and the frozen scorer it runs, if any (the training code moves it to
    the training device; it is never trained, and never saved in checkpoints)."""

    compute: LossFn
    scorer: object | None = None  # storyrewrite.metrics.lm_scorer.LMScorer, for the objectives that need one
    frozen: tuple[torch.nn.Module, ...] = ()  # other frozen models it runs (RLOO's reference model)
    # Host work on a batch that the step would otherwise do (tokenising its texts for the
    # scorer): the data loader runs it on the batch it made, in its workers where there are
    # some, and adds what it returns. Picklable (it travels to worker processes): no model in it.
    prepare: Callable[[dict], dict] | None = None

    def frozen_models(self) -> tuple[torch.nn.Module, ...]:
        """Every frozen model the loss runs, to be placed on the training device."""
        return ((self.scorer.model,) if self.scorer is not None else ()) + self.frozen

    def __call__(self, generator: PreTrainedModel, batch: dict, noise_seed: int, validation: bool = False) -> LossOutput:
        return self.compute(generator, batch, noise_seed, validation)


@dataclass(frozen=True)
class Objective:
    name: str
    label: str  # how reports name it
    description: str
    module: str  # storyrewrite.objectives.<module> holds its loss and its builder
    builder: str = "build"  # the builder's name there: (ObjectiveContext) -> Loss
    settings: str | None = None  # the params section it reads (the stage reads no other)
    settings_type: type[Section] | None = None  # that section's type
    needs_scorer: bool = False
    needs_original_ending: bool = False
    pairs: bool = False  # the batch carries chosen (edited) and rejected (original) endings
    main_diagnostics: tuple[str, ...] = ()  # what the report's training section shows, first → last
    # A setting whose values make different systems (RLOO's reward): value -> the system's label,
    # and value -> the objective it is compared with head to head (the DTO objective of that reward).
    variant: str | None = None
    variant_labels: dict[str, str] = field(default_factory=dict)
    counterparts: dict[str, str] = field(default_factory=dict)

    def system_label(self, settings: Section | None) -> str:
        """How reports name a run of this objective with `settings`."""
        return self.variant_labels[getattr(settings, self.variant)] if self.variant else self.label

    def counterpart_label(self, settings: Section | None) -> str | None:
        """The label of the system this run is tested against head to head, if any."""
        name = self.counterparts.get(getattr(settings, self.variant)) if self.variant else None
        return OBJECTIVES[name].label if name else None

    def serves(self, task: str, variant: str | None = None) -> bool:
        """Whether `task` has what this objective needs, in `variant` as its counterpart needs it
        (RLOO on the delta reward, as DTO-Delta): the original ending, where it needs one."""
        counterpart = OBJECTIVES.get(self.counterparts.get(variant, "")) if variant is not None else None
        needs = self.needs_original_ending or (counterpart is not None and counterpart.needs_original_ending)
        return not needs or "original_ending" in TASK_COLUMNS[task]

    @property
    def module_name(self) -> str:
        return f"storyrewrite.objectives.{self.module}"

    def build(self, context: ObjectiveContext) -> Loss:
        """Import the objective's code and build it."""
        if self.settings_type is not None and not isinstance(context.settings, self.settings_type):
            raise TypeError(f"objective {self.name!r} takes {self.settings_type.__name__} settings, "
                            f"got {type(context.settings).__name__}")
        return getattr(importlib.import_module(self.module_name), self.builder)(context)


_DTO_MAIN = ("m_target", "m_original", "delta", "gumbel_max_prob", "nll_target")

# What each training curve tells (docs/training.md's table is made from these): every objective
# logs COMMON_CURVES; each objective logs its own terms and diagnostics, `CURVES[objective]`. A
# validation curve is the training curve's name prefixed `val_` (not every one has both).
COMMON_CURVES: dict[str, str] = {
    "train_loss": "the objective itself, per training step",
    "val_loss": "the objective on validation; picks the exported checkpoint",
    "val_nll": "NLL of Y_EE on validation: comparable across objectives (selects the CPO grid's best run)",
    "lr": "the learning rate of the step (warm-up visible)",
    "grad_norm": "the gradient norm before clipping: spikes precede divergence",
    "tokens_per_s": "real tokens the generator read per second of the step (a wall-time curve: not in the DVC metrics)",
    "cpu_time_share": "share of the step's wall time its thread ran on a CPU (on a GPU, a wait for it spins: counted here; "
                      "a wall-time curve)",
    "cpu_wait_time_share": "share of the step's wall time its thread was ready but waited for a CPU that other processes "
                           "held (Linux only; a wall-time curve)",
}
_DTO_CURVES = {
    "m_target": "M(Ŷ, Y_EE), the scorer's mean log-probability of the edited ending given the relaxed Ŷ: should rise",
    "m_original": "M(Ŷ, X_OE): with `delta`, whether a rising delta comes from approaching the edit or only from leaving "
                  "the original (DTO-Score: validation only, it needs an extra scorer pass)",
    "delta": "M(Ŷ, Y_EE) − M(Ŷ, X_OE) (DTO-Score: validation only)",
    "gumbel_entropy": "mean entropy of the Gumbel-softmax samples",
    "gumbel_max_prob": "mean largest probability of the samples: → 1.0 means the relaxation has collapsed to one-hot",
    "nll_target": "the generator's teacher-forced NLL of Y_EE: a rise in m_target bought with a worse NLL shows here",
}
CURVES: dict[str, dict[str, str]] = {
    "nll": {"token_accuracy": "share of target tokens that are the generator's argmax (teacher-forced)"},
    "cpo": {
        "preference": "the preference term −log σ(β·Δ)",
        "nll_term": "the NLL of the edit, before λ",
        "rewards/chosen": "β·log π of the edited (chosen) ending (TRL's name)",
        "rewards/rejected": "β·log π of the original (rejected) ending",
        "rewards/margins": "their mean difference: should grow",
        "rewards/accuracies": "share of instances where the edit is preferred: should grow",
        "logps/chosen": "log π(Y_EE | x): a falling value means the margin is bought by unlearning the edit",
        "logps/rejected": "log π(X_OE | x)",
    },
    "score": _DTO_CURVES, "delta": _DTO_CURVES, "score_delta": _DTO_CURVES,
    "rloo": {
        "reward": "the metric reward of the samples, M as `rl.reward` combines it, without the KL term (TRL's name)",
        "reward_std": "standard deviation of the reward (KL term included) among an instance's samples: 0 leaves no signal",
        "kl": "Σ_t log π − log π_ref over a sample, against the NLL model (0 with `rl.kl_beta: 0`)",
        "advantage_abs": "mean |A_k|: the size of the policy-gradient weights",
        "completions/mean_length": "mean sampled length in tokens, end token included",
        "completions/clipped_ratio": "share of samples that hit `rl.max_new_tokens` without ending",
        "sample_time_share": "share of the step's wall time spent sampling (a wall-time curve: not in the DVC metrics)",
        "sample_read_time_share": "the part of it spent reading the samples: with `rl.early_stop: false`, waiting for the "
                                  "device to decode what the host had queued (a wall-time curve)",
        "static_cache": "with `rl.cache: static` alone: 1 while its caches sample, 0 once compiling the decoding step "
                        "failed and the run went on with the dynamic cache (the same samples, eager)",
        "decoding_graphs": "with `rl.cache: static` alone: the graphs torch compiled while sampling so far (1 where "
                           "the decoding step compiled as planned; 0 on a GPU: it runs eagerly, a launch per operator)",
    },
}

OBJECTIVES: dict[str, Objective] = {
    "nll": Objective("nll", "NLL", "negative log-likelihood of the edited ending", "nll", main_diagnostics=("token_accuracy",)),
    "cpo": Objective("cpo", "CPO", "CPO: edited ending preferred to the original ending", "cpo", settings="cpo",
                     settings_type=CPOConfig, needs_original_ending=True, pairs=True,
                     main_diagnostics=("rewards/margins", "rewards/accuracies", "nll_term")),
    "score": Objective("score", "DTO-Score", "DTO: −M(Ŷ, Y_EE)", "dto", "build_score", settings="dto",
                       settings_type=DTOConfig, needs_scorer=True, main_diagnostics=_DTO_MAIN),
    "delta": Objective("delta", "DTO-Delta", "DTO: −[M(Ŷ, Y_EE) − M(Ŷ, X_OE)]", "dto", "build_delta", settings="dto",
                       settings_type=DTOConfig, needs_scorer=True, needs_original_ending=True, main_diagnostics=_DTO_MAIN),
    "score_delta": Objective("score_delta", "DTO-Score+Delta", "DTO: −[2·M(Ŷ, Y_EE) − M(Ŷ, X_OE)]", "dto",
                             "build_score_delta", settings="dto", settings_type=DTOConfig, needs_scorer=True,
                             needs_original_ending=True, main_diagnostics=_DTO_MAIN),
    # The original ending is needed by `rl.reward` delta and score_delta only: the loss says so
    # where a task has none.
    "rloo": Objective("rloo", "RLOO", "REINFORCE, leave-one-out baseline, on the reward `rl.reward`", "rloo",
                      settings="rl", settings_type=RLConfig, needs_scorer=True,
                      main_diagnostics=("reward", "reward_std", "kl", "completions/mean_length", "completions/clipped_ratio"),
                      variant="reward", variant_labels={"score": "RLOO-Score", "delta": "RLOO-Delta", "score_delta": "RLOO-Score+Delta"},
                      counterparts={"score": "score", "delta": "delta", "score_delta": "score_delta"}),
}


def reads_section(objective: str | None, section: str) -> bool:
    """Whether a run of `objective` reads the params section `section`: every section but the
    settings of other objectives (`rl` for a DTO run), which only the train stage reads, its own
    objective's alone. A run of an objective not registered here reads them all."""
    own = OBJECTIVES.get(objective)
    return own is None or section == own.settings or all(o.settings != section for o in OBJECTIVES.values())


def get_objective(name: str, task: str) -> Objective:
    """The objective `name`, checked against the task: one that needs the original ending is
    refused where the task has none, naming the objectives that work there."""
    if name not in OBJECTIVES:
        raise InputError(f"params: `objective` = {name!r} is not valid; valid values: {', '.join(OBJECTIVES)}", key="objective")
    objective = OBJECTIVES[name]
    if not objective.serves(task):
        usable = [n for n, o in OBJECTIVES.items() if o.serves(task)]
        raise InputError(f"params: `objective` = {name!r} needs the original ending, which task {task!r} does not have; "
                         f"objectives for this task: {', '.join(usable)}", key="objective")
    return objective
