"""train_nll: the NLL baseline, trained from the pretrained generator."""
import storyrewrite.objectives.nll  # noqa: F401  the one objective this stage runs: its code is a dep, no other's
from storyrewrite.io import run_stage
from storyrewrite.objectives.base import NLL
from storyrewrite.training.stage import main

if __name__ == "__main__":
    # NLL's entry, not the registry's look-up: this stage depends on no other objective's entry
    # or settings, so that adding one never retrains the NLL model.
    run_stage(lambda: main("train_nll", __doc__, lambda params: NLL))
