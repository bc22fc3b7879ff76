"""The objective registry: every training objective by name, with what it needs, without its code,
and the params section each one reads.

An entry (storyrewrite.objectives.base.Objective) says which module holds the objective's code
(its loss, a pure function of tensors with its formula in the docstring, and the builder that gets
those tensors from the generator and a batch), which params section it reads (typed: its settings
class is here), what it needs (a scorer, the original ending, chosen/rejected pairs), which tasks
it serves and how reports name it. The module is imported only when the objective is built. Only
the `train` stage depends on this file: the NLL baseline (`train_nll`) runs NLL's entry and code
alone (base.py, nll.py), and params.py, which every stage runs, knows none of these sections. So an
edit to a DTO loss, or a new objective, reruns `train`, not the NLL model every system starts from.
A built objective returns the loss with its terms and its diagnostics (logged with the training
curves). The training code calls it and never branches on the name: a new objective is one module
(loss + `build`), its settings class and one entry in `OBJECTIVES` here (docs/extending.md).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from pydantic import Field, ValidationError, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from storyrewrite.io import InputError
from storyrewrite.objectives.base import NLL, Loss, LossFn, LossOutput, Objective, ObjectiveContext  # noqa: F401  re-exported
from storyrewrite.params import Dtype, Positive, PositiveFloat, Section


class DTOConfig(Section):
    """`dto`: differentiable training objectives (objective score | delta | score_delta)."""
    tau: PositiveFloat  # Gumbel-softmax temperature (paper: 1.0, no annealing)
    hard: bool  # straight-through one-hot samples instead of soft ones (paper: soft)
    scorer_dtype: Dtype = "float32"


class CPOConfig(Section):
    """`cpo` (paper grid: beta ∈ {0.1, 0.5, 1, 2}, lambda ∈ {0.5, 1, 2})."""
    beta: PositiveFloat
    lambda_: float = Field(alias="lambda", ge=0)  # `lambda` is a Python keyword


class RLConfig(Section):
    """`rl`: policy-gradient training on the DTO reward (objective rloo)."""
    samples: Positive  # K samples per instance (the leave-one-out baseline needs two)
    temperature: PositiveFloat  # sampling temperature (no top-k / top-p)
    reward: Literal["score", "delta", "score_delta"]  # the metric reward, as DTO's objectives
    kl_beta: float = Field(ge=0)  # KL penalty against the starting model, in the reward (0: no reference model)
    max_new_tokens: Positive  # at most this many tokens per sample (TRL's max_completion_length)
    baseline: Literal["leave_one_out", "greedy"] = "leave_one_out"  # greedy: self-critical
    # The samples' KV cache: static (fixed-size) lets a GPU replay each decoding step as a CUDA
    # graph (transformers compiles it once a run, the row count symbolic); the same samples as dynamic
    cache: Literal["dynamic", "static"] = "dynamic"
    # Stop sampling once every sample has ended, which reads the device after each token (false:
    # always max_new_tokens steps, no read until the end; the same samples)
    early_stop: bool = True
    # The weights' dtype while sampling: null, the generator's own (float32 under a mixed
    # precision); bfloat16 or float16, a copy of it in that dtype, refreshed before each sampling
    sample_dtype: Dtype | None = None

    @model_validator(mode="after")
    def _enough_samples(self) -> "RLConfig":
        # Checked once both keys are read and laid on `samples`, the key a sweep changes: an error
        # from baseline's own check would name baseline's line for `-S rl.samples=1`. (pydantic
        # gives a model's check no key of its own; a ValidationError raised in it keeps its loc.)
        if self.baseline == "leave_one_out" and self.samples < 2:
            raise ValidationError.from_exception_data(type(self).__name__, [InitErrorDetails(
                type=PydanticCustomError("value_error", "the leave_one_out baseline needs >= 2 (or rl.baseline: greedy)"),
                loc=("samples",), input=self.samples)])
        return self



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

# DTO's objectives, by name (RLOO on each of their rewards is tested against them head to head)
_DTO: dict[str, Objective] = {
    "score": Objective("score", "DTO-Score", "DTO: −M(Ŷ, Y_EE)", "dto", "build_score", settings="dto",
                       settings_type=DTOConfig, needs_scorer=True, main_diagnostics=_DTO_MAIN),
    "delta": Objective("delta", "DTO-Delta", "DTO: −[M(Ŷ, Y_EE) − M(Ŷ, X_OE)]", "dto", "build_delta", settings="dto",
                       settings_type=DTOConfig, needs_scorer=True, needs_original_ending=True, main_diagnostics=_DTO_MAIN),
    "score_delta": Objective("score_delta", "DTO-Score+Delta", "DTO: −[2·M(Ŷ, Y_EE) − M(Ŷ, X_OE)]", "dto",
                             "build_score_delta", settings="dto", settings_type=DTOConfig, needs_scorer=True,
                             needs_original_ending=True, main_diagnostics=_DTO_MAIN),
}
OBJECTIVES: dict[str, Objective] = {
    "nll": NLL,
    "cpo": Objective("cpo", "CPO", "CPO: edited ending preferred to the original ending", "cpo", settings="cpo",
                     settings_type=CPOConfig, needs_original_ending=True, pairs=True,
                     main_diagnostics=("rewards/margins", "rewards/accuracies", "nll_term")),
    **_DTO,
    # The original ending is needed by `rl.reward` delta and score_delta only: the loss says so
    # where a task has none.
    "rloo": Objective("rloo", "RLOO", "REINFORCE, leave-one-out baseline, on the reward `rl.reward`", "rloo",
                      settings="rl", settings_type=RLConfig, needs_scorer=True,
                      main_diagnostics=("reward", "reward_std", "kl", "completions/mean_length", "completions/clipped_ratio"),
                      variant="reward", variant_labels={"score": "RLOO-Score", "delta": "RLOO-Delta", "score_delta": "RLOO-Score+Delta"},
                      counterparts=_DTO),
}

# The objectives' params sections, by name: the top-level keys of params.yaml that only the
# train stage reads (storyrewrite.params.Params takes them from the code that knows them).
SETTINGS: dict[str, type[Section]] = {o.settings: o.settings_type for o in OBJECTIVES.values() if o.settings}


def reads_section(objective: str | None, section: str) -> bool:
    """Whether a run of `objective` reads the params section `section`: every section but the
    settings of other objectives (`rl` for a DTO run), which only the train stage reads, its own
    objective's alone. A run of an objective not registered here reads them all."""
    own = OBJECTIVES.get(objective)
    return own is None or section == own.settings or all(o.settings != section for o in OBJECTIVES.values())


def get_objective(name: str, task: str, section: Callable[[str], Any] | None = None) -> Objective:
    """The objective `name`, checked against the task: one that needs the original ending is
    refused where the task has none, naming the objectives that work there. With `section` (a
    params section by name: Params.section), the setting that makes its variant (`rl.reward`) is
    checked too, before any model loads: RLOO on the delta reward needs the original ending (a
    section that `section` gives as None is not checked)."""
    if name not in OBJECTIVES:
        raise InputError(f"params: `objective` = {name!r} is not valid; valid values: {', '.join(OBJECTIVES)}", key="objective")
    objective = OBJECTIVES[name]
    if not objective.serves(task):
        usable = [n for n, o in OBJECTIVES.items() if o.serves(task)]
        raise InputError(f"params: `objective` = {name!r} needs the original ending, which task {task!r} does not have; "
                         f"objectives for this task: {', '.join(usable)}", key="objective")
    if objective.variant and objective.settings and section is not None \
            and (settings := section(objective.settings)) is not None:  # None: not valid, an error of its own
        value = getattr(settings, objective.variant)
        if not objective.serves(task, value):
            key = f"{objective.settings}.{objective.variant}"
            usable = [v for v in objective.variant_labels if objective.serves(task, v)]
            raise InputError(f"params: `{key}` = {value!r} needs the original ending, which task {task!r} does not have; "
                             f"valid values for this task: {', '.join(usable)}", key=key)
    return objective
