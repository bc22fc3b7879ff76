"""train_nll: the NLL baseline, trained from the pretrained generator."""
import storyrewrite.objectives.nll  # noqa: F401  the one objective this stage runs: its code is a dep, no other's
from storyrewrite.io import run_stage
from storyrewrite.training.stage import main

if __name__ == "__main__":
    run_stage(lambda: main("train_nll", __doc__, objective="nll"))
