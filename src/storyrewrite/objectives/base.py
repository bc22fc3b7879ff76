"""What every objective is made of, and the NLL baseline's entry.

An objective is an `Objective` entry (what it reads, needs and is called) and a module with its
loss and its builder, which returns a `Loss`. Every entry is in storyrewrite.objectives.registry,
with the params sections the objectives read; NLL's entry is here too. NLL is the baseline every
pipeline trains (`train_nll`), and that stage depends on this module and `nll.py` alone, not on
the registry or on params.py's other sections: adding an objective, or editing another one's
settings, reruns `train` and what follows it, never the NLL model every system starts from.
"""
from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Generic, TypeVar

from storyrewrite.data.schema import TASK_COLUMNS
from storyrewrite.params import Section

if TYPE_CHECKING:  # entries name objectives without loading torch: `profiles check` reads them
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
    counterparts: dict[str, Objective] = field(default_factory=dict)

    def system_label(self, settings: Section | None) -> str:
        """How reports name a run of this objective with `settings`."""
        return self.variant_labels[getattr(settings, self.variant)] if self.variant else self.label

    def counterpart_label(self, settings: Section | None) -> str | None:
        """The label of the system this run is tested against head to head, if any."""
        counterpart = self.counterparts.get(getattr(settings, self.variant)) if self.variant else None
        return counterpart.label if counterpart else None

    def serves(self, task: str, variant: str | None = None) -> bool:
        """Whether `task` has what this objective needs, in `variant` as its counterpart needs it
        (RLOO on the delta reward, as DTO-Delta): the original ending, where it needs one."""
        counterpart = self.counterparts.get(variant) if variant is not None else None
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


NLL = Objective("nll", "NLL", "negative log-likelihood of the edited ending", "nll", main_diagnostics=("token_accuracy",))
